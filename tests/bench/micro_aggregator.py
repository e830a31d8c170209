"""Micro-benchmark of the aggregator's processor alone: CPU per decision, no bus at all.

A script, not a test (``python -m tests.bench.micro_aggregator [N] [--nogc] [--prof
[tottime|cumulative]]``). It builds ``bench_aggregator``'s ``N`` workloads (25 pods) and every
ranked strategy's answer as records (in rankers' batches of 100 answers, as ``bench_aggregator``
publishes them), then runs ``AggregationProcessor.split`` and ``on_record`` on each (snapshots
first, then answers), so every workload is decided once, completely: decoding, the core's
transitions and decision, the span and the encoded costs. The queued costs are dropped, never sent.
``--nogc`` disables the garbage collector (steadier numbers); ``--prof`` prints cProfile stats.

On a loaded machine CPU time varies by 10 % and more from run to run; instructions do not. The
records are processed inside ``functools.reduce``, so that callgrind can count the processing
alone: ``valgrind --tool=callgrind --collect-atstart=no --toggle-collect=functools_reduce python
-m tests.bench.micro_aggregator 300`` (7-8 M instructions a decision; two runs of the same code
over the same records differed by 0.1 %).
"""

from __future__ import annotations

import cProfile
import functools
import gc
import pstats
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_aggregator import answers, batched, workloads

from podcost.aggregator.processor import AggregationProcessor
from podcost.runtime.clock import WallClock
from podcost.runtime.metrics import Metrics
from podcost.runtime.telemetry import setup_tracing, tracer
from podcost_bus import BusSettings, MemoryBus, Record
from podcost_contracts.messages import TRACEPARENT, WorkloadSnapshotMessage, encode
from podcost_core.aggregate import AggregationConfig, Aggregator, PolicyResolver, WorkloadState
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.strategies.registry import default_registry


def records(count: int) -> list[Record]:
    """The snapshot records of ``count`` workloads, then the rankers' records of their
    answers."""
    topics = BusSettings().topics
    snapshots = workloads(count, 25)
    out: list[Record] = []
    for item in snapshots:
        message = WorkloadSnapshotMessage.of(item, emitted_at=time.time(), changed_at=time.time())
        trace = {TRACEPARENT: f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"}
        encoded = encode(message, trace=trace)
        out.append(Record(topics.workloads, 0, len(out), encoded.key, encoded.value,
                          encoded.headers))  # fmt: skip
    for batch in batched(answers(snapshots), 100, 1):
        encoded = encode(batch)
        out.append(Record(topics.ranks, 0, len(out), encoded.key, encoded.value,
                          encoded.headers))  # fmt: skip
    return out


def main() -> None:
    args = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    count = int(args[0]) if args and args[0].isdigit() else 2000
    sort = "tottime" if "tottime" in args else "cumulative"
    backlog = records(count)
    setup_tracing("podcost-aggregator")
    policies = PolicyResolver(DEFAULT_POLICY, registry=default_registry())
    processor = AggregationProcessor(
        Aggregator(AggregationConfig(deadline_s=3600), policies),
        bus=MemoryBus(), topics=BusSettings().topics, group="micro",
        metrics=Metrics("aggregator"), tracer=tracer(), clock=WallClock(),
    )  # fmt: skip
    states: dict[bytes | None, WorkloadState] = {}
    if "--nogc" in sys.argv:
        gc.disable()
    profile = cProfile.Profile() if "--prof" in sys.argv else None
    started = time.process_time()
    if profile is not None:
        profile.enable()

    def process(count: int, record: Record) -> int:
        for key, step in processor.split(record):
            new = processor.on_record(step, states.get(key))
            if isinstance(new, WorkloadState):
                states[key] = new
        return count + 1

    functools.reduce(process, backlog, 0)  # what callgrind counts (module docstring)
    if profile is not None:
        profile.disable()
    used = time.process_time() - started
    print(f"{count} decisions: {used:.2f}s CPU, {used / count * 1e3:.3f} ms/decision, "
          f"{count / used:.0f}/CPU-s")  # fmt: skip
    if profile is not None:
        pstats.Stats(profile).sort_stats(sort).print_stats(45)


if __name__ == "__main__":
    main()
