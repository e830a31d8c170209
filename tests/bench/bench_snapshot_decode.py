"""Benchmark of decoding one workload snapshot as each reader decodes it: whole, as the
aggregator reads it (``podcost_core.aggregate.DECISION_UNREAD``) and as each strategy's ranker
reads it (``Strategy.unread``).

A script, not a test (``python -m tests.bench.bench_snapshot_decode [--workloads N --pods P
--rounds R]``); it prints numbers and asserts nothing. The snapshots are ``bench_aggregator``'s
(25 pods by default, on nodes over three zones, spot and on-demand, some tainted), encoded as the
watcher encodes them and inflated once; what is timed is pydantic's validation of the JSON
(``validate_json``), the best of ``R`` passes over the ``N`` records, per record.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pydantic_core import SchemaValidator
from tests.bench.bench_aggregator import workloads
from tests.bench.record import record

from podcost_contracts.messages import (
    CONTENT_ENCODING,
    GZIP,
    WorkloadSnapshotMessage,
    encode,
    snapshot_validator,
)
from podcost_core.aggregate import DECISION_UNREAD
from podcost_core.strategies.registry import default_registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=50)
    parser.add_argument("--pods", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    payloads = []
    for snapshot in workloads(args.workloads, args.pods):
        encoded = encode(WorkloadSnapshotMessage.of(snapshot, emitted_at=1.0))
        compressed = encoded.headers.get(CONTENT_ENCODING) == GZIP.encode()
        payloads.append(zlib_inflate(encoded.value) if compressed else encoded.value)
    registry = default_registry()
    readers: dict[str, SchemaValidator] = {
        "whole": WorkloadSnapshotMessage.__pydantic_validator__,
        "aggregator": snapshot_validator(DECISION_UNREAD),
    }
    for name in sorted(registry):
        readers[f"ranker {name}"] = snapshot_validator(registry.get_strategy(name).unread)
    best = dict.fromkeys(readers, float("inf"))
    for _ in range(args.rounds):  # interleaved, so that a busy moment touches every reader
        for name, validator in readers.items():
            started = time.perf_counter()
            for payload in payloads:
                validator.validate_json(payload)
            best[name] = min(best[name], (time.perf_counter() - started) / len(payloads))
    size = sum(len(payload) for payload in payloads) // len(payloads)
    print(f"{args.workloads} snapshots of {args.pods} pods, {size:,} B of JSON each; "
          f"best of {args.rounds} passes")  # fmt: skip
    for name, seconds in best.items():
        print(f"  {name:28s} {seconds * 1e6:7.0f} us  {seconds / best['whole']:.2f} of whole")
    rankers = [seconds for name, seconds in best.items() if name.startswith("ranker ")]
    whole = best["whole"]
    record(
        "bench_snapshot_decode",
        f"one {args.pods}-pod snapshot ({size:,} B of JSON) validated whole, as the aggregator "
        f"reads it and as each strategy's ranker reads it; best of {args.rounds} passes over "
        f"{args.workloads} snapshots",
        [
            f"whole: {whole * 1e6:,.0f} µs",
            f"as the aggregator reads it: {best['aggregator'] * 1e6:,.0f} µs "
            f"({best['aggregator'] / whole:.2f})",
            f"as the built-in strategies' rankers read it: {min(rankers) * 1e6:,.0f}–"
            f"{max(rankers) * 1e6:,.0f} µs ({min(rankers) / whole:.2f}–{max(rankers) / whole:.2f})",
        ],
    )


def zlib_inflate(value: bytes) -> bytes:
    return zlib.decompress(value, 16 + zlib.MAX_WBITS)


if __name__ == "__main__":
    main()
