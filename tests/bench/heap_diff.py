"""What grew between two heap dumps of a podcost process (where its memory per pod goes).

A script (``uv run python -m tests.bench.heap_diff BEFORE AFTER [--pods N] [--by lineno]``):
``BEFORE`` and ``AFTER`` are the ``heap-<n>.tracemalloc`` files a process started with
``PODCOST_HEAP_DUMP=DIR`` writes on SIGUSR1 (``podcost.runtime.heap.heap_dumps_on_signal``;
``bench_scale.py --heap-dump DIR`` sends them at sync and once every cost is written). It prints
the traced total of each, then the allocation sites (``--by lineno``, ``filename`` or
``traceback``) by how many bytes they grew, largest first, in bytes per pod with ``--pods``.
"""

from __future__ import annotations

import argparse
import tracemalloc
from typing import Literal, cast

Key = Literal["lineno", "filename", "traceback"]


def diff(before: str, after: str, *, by: Key, top: int, pods: int, frames: int) -> list[str]:
    """The report's lines (see the module docstring)."""
    old = tracemalloc.Snapshot.load(before)
    new = tracemalloc.Snapshot.load(after)
    total_old = sum(t.size for t in old.traces)
    total_new = sum(t.size for t in new.traces)
    per = max(1, pods)
    lines = [
        f"traced: {total_old:,} → {total_new:,} bytes ({(total_new - total_old) / per:,.0f} "
        f"bytes per pod over {pods:,} pods)" if pods else
        f"traced: {total_old:,} → {total_new:,} bytes",
    ]  # fmt: skip
    for stat in new.compare_to(old, by)[:top]:
        where = stat.traceback.format(
            limit=frames if by == "traceback" else 1, most_recent_first=True
        )
        lines.append(
            f"{stat.size_diff / per:>10,.0f} B/pod  {stat.size_diff:>12,} B  "
            f"{stat.count_diff:>+9,} blocks  now {stat.size:>12,} B  {where[0].strip()}"
        )
        lines += [f"{'':>60}{line.strip()}" for line in where[1:] if line.strip()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--by", choices=["lineno", "filename", "traceback"], default="lineno")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--pods", type=int, default=0, help="divide by this many pods")
    parser.add_argument("--frames", type=int, default=8, help="frames shown with --by traceback")
    args = parser.parse_args()
    for line in diff(args.before, args.after, by=cast(Key, args.by), top=args.top,
                     pods=args.pods, frames=args.frames):  # fmt: skip
        print(line)


if __name__ == "__main__":
    main()
