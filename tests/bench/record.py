"""The current benchmark results: one table, each row a benchmark's headline figures.

The rows live in ``docs/benchmarks/results.json``; ``docs/benchmarks/results.md`` is the table
rendered from them, which the docs site's Benchmarks page includes. A benchmark calls
:func:`record` with its headline figures at the end of a run: when ``PODCOST_BENCH_RECORD=1``
(``make bench`` sets it) that replaces the benchmark's row with this run's figures, the exact
command, the machine (cores, CPU model, Python) and the date, then re-renders the table;
otherwise it does nothing. ``PODCOST_BENCH_RESULTS`` points at another results file (a trial run
that must not touch the committed one).

``python -m tests.bench.record`` re-renders the table from the data file (``make bench`` runs it
last, ``make bench-table`` alone); ``--check`` only says whether the table is current
(``tests/unit/test_bench_results.py`` fails when it is not).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "benchmarks" / "results.json"
RECORD_ENV = "PODCOST_BENCH_RECORD"
RESULTS_ENV = "PODCOST_BENCH_RESULTS"

#: The order of ``make bench``: the table follows it; other benchmarks come after, by name.
ORDER = (
    "bench_core",
    "bench_labels",
    "bench_rank_aggregate",
    "bench_annotator",
    "bench_pipeline",
    "bench_fleet",
    "bench_aggregator",
    "bench_snapshot_decode",
    "bench_watch_path",
    "bench_watcher",
    "bench_rankers",
    "bench_compression",
    "bench_failover",
    "bench_karpenter",
    "bench_soak",
)

HEADER = """\
<!-- Generated from docs/benchmarks/results.json by `python -m tests.bench.record`
     (make bench, make bench-table): edit the data file or rerun the benchmark, not this table. -->

| benchmark | result | command | machine | date |
|---|---|---|---|---|
"""


def results_path() -> Path:
    """The data file: ``PODCOST_BENCH_RESULTS`` if set, else the committed one."""
    return Path(os.environ.get(RESULTS_ENV) or RESULTS)


def table_path(results: Path) -> Path:
    """The rendered table beside its data file (``results.json`` → ``results.md``)."""
    return results.with_suffix(".md")


def machine() -> dict[str, Any]:
    """What the figures depend on: the cores this process may use, the CPU model, Python."""
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = " ".join(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu": cpu or platform.processor() or None,
        "python": platform.python_version(),
    }


def command(argv: Sequence[str] | None = None) -> str:
    """The command line that ran this benchmark, as one would type it at the repository root."""
    argv = list(sys.argv if argv is None else argv)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        program = ["python", "-m", spec.name]
    else:
        script = Path(argv[0]).resolve()
        shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
        program = ["python", str(shown)]
    return "uv run " + shlex.join([*program, *argv[1:]])


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = json.loads(path.read_text())["rows"]
    return rows


def ordered(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows in ``make bench`` order, then by benchmark name, then by row id."""

    def key(row: Mapping[str, Any]) -> tuple[int, str, list[Any]]:
        name = row["benchmark"]
        # Numbers in ids in numeric order: n5 before n20.
        natural = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", row["id"])]
        return (ORDER.index(name) if name in ORDER else len(ORDER), name, natural)

    return [dict(row) for row in sorted(rows, key=key)]


def dump(rows: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps({"rows": ordered(rows)}, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: Sequence[Mapping[str, Any]]) -> str:
    """The Markdown table of ``rows``; deterministic, so a committed table can be checked."""
    lines = []
    for row in ordered(rows):
        host = row["machine"]
        where = f"{host['cores']} cores, {host.get('cpu') or 'CPU model not recorded'}"
        where += f", Python {host['python']}"
        what = f"`{row['benchmark']}`: {row['title']}"
        figures = "<br>".join(_cell(figure) for figure in row["figures"])
        cells = [_cell(what), figures, f"`{_cell(row['command'])}`", _cell(where), row["date"]]
        lines.append("| " + " | ".join(cells) + " |\n")
    return HEADER + "".join(lines)


def record(
    benchmark: str,
    title: str,
    figures: Sequence[str],
    *,
    variant: str = "",
    argv: Sequence[str] | None = None,
) -> bool:
    """Record this run's headline ``figures`` as ``benchmark``'s row (one row per ``variant``).

    Does nothing unless ``PODCOST_BENCH_RECORD=1``; returns whether it wrote. ``title`` says in a
    few words what was measured (the scale and mode: figures mean nothing without it).
    """
    if os.environ.get(RECORD_ENV) != "1":
        return False
    if not figures:
        raise ValueError(f"{benchmark}: no figures to record")
    path = results_path()
    row_id = f"{benchmark}:{variant}" if variant else benchmark
    row = {
        "id": row_id,
        "benchmark": benchmark,
        "title": title,
        "figures": list(figures),
        "command": command(argv),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
    }
    rows = [old for old in load(path) if old["id"] != row_id] + [row]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(rows))
    table_path(path).write_text(render(rows))
    print(f"recorded {row_id} in {path}", file=sys.stderr)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    options = parser.parse_args(argv)
    path = results_path()
    table = table_path(path)
    expected = render(load(path))
    if options.check:
        if not table.exists() or table.read_text() != expected:
            print(f"{table} is not rendered from {path}: run `make bench-table`", file=sys.stderr)
            return 1
        return 0
    table.write_text(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
