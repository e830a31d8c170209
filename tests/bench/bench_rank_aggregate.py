"""Benchmark of the ranking half of the pipeline: snapshots in, desired costs out.

Run with ``uv run python tests/bench/bench_rank_aggregate.py [--kafka HOST:PORT] [--workloads N
--pods P --versions V]``; prints numbers, asserts nothing. One ranker per strategy of the default
policy (six processes' worth of work, here in one event loop) and the aggregator read the
snapshots of ``N`` workloads of ``P`` pods, ``V`` versions each, published as fast as the bus
takes them; it reports the decisions per second and the latency from a snapshot's emission to
its desired costs being read back (p50/p99). Without ``--kafka`` it runs over the in-memory bus
(embedded mode); with it, over that broker with the faust aggregator.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.record import record
from tests.support.pipeline import Reader, running
from tests.support.snapshots import CLUSTER, snapshot

from podcost import aggregator, ranker
from podcost.aggregator import AggregatorSettings
from podcost.runtime.settings import ServiceSettings
from podcost_bus import Bus, BusSettings, KafkaBus, MemoryBus
from podcost_contracts.messages import DesiredCostsMessage, WorkloadSnapshotMessage, encode
from podcost_core.combine import answers_needed
from podcost_core.policy import DEFAULT_POLICY


async def bench(
    kafka: str | None, workloads: int, pods: int, versions: int, engine: str, rate: float
) -> None:
    run = uuid.uuid4().hex[:8]
    settings = BusSettings(
        bootstrap_servers=kafka,
        client_id=f"bench-{run}",
        topic_workloads=f"bench-{run}.workloads",
        topic_ranks=f"bench-{run}.ranks",
        topic_costs=f"bench-{run}.costs",
        topic_deadletter=f"bench-{run}.deadletter",
    )
    bus: Bus = KafkaBus(settings) if kafka else MemoryBus(retention=10_000_000)
    service_settings = ServiceSettings(http_port=0)
    strategies = answers_needed(DEFAULT_POLICY)
    data_dir = tempfile.TemporaryDirectory(prefix="podcost-bench-")
    config = AggregatorSettings(
        data_dir=Path(data_dir.name),
        app_id=f"bench-{run}-aggregator",
        commit_interval_seconds=0.5,
        engine=engine,  # type: ignore[arg-type]
    )
    templates = [
        snapshot(f"app-{index}", pods=pods, nodes=max(3, pods // 4), seed=index)
        for index in range(workloads)
    ]
    async with bus:
        await bus.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
        services = [
            ranker.bootstrap(service_settings, settings, strategy=name, bus=bus)
            for name in strategies
        ]
        services.append(aggregator.bootstrap(service_settings, settings, config=config, bus=bus))
        emitted: dict[tuple[str, int], float] = {}
        async with (
            running(*services),
            Reader(bus, settings.topics.costs_for(CLUSTER), DesiredCostsMessage) as out,
        ):
            started = time.perf_counter()

            async def publish() -> float:
                acks = []
                for index, (version, template) in enumerate(
                    (version, template)
                    for version in range(1, versions + 1)
                    for template in templates
                ):
                    if rate:  # paced: the index-th snapshot leaves at index / rate
                        await asyncio.sleep(max(0.0, started + index / rate - time.perf_counter()))
                    message = WorkloadSnapshotMessage.of(
                        replace(template, version=version), emitted_at=time.time()
                    )
                    emitted[(message.key, version)] = message.emitted_at
                    encoded = encode(message)
                    topic = settings.topics.workloads
                    acks.append(await bus.send(topic, encoded.key, encoded.value, encoded.headers))
                await asyncio.gather(*acks)
                return time.perf_counter() - started

            publisher = asyncio.create_task(publish())
            latencies = []
            complete = 0
            total = workloads * versions
            finished: set[str] = set()
            # Not every version gets a decision (a newer snapshot may supersede one first):
            # done when every workload's last version is decided.
            while len(finished) < workloads:
                [decision] = await out.take(1, timeout=60)
                latencies.append(time.time() - emitted[(decision.key, decision.version)])
                complete += decision.complete
                if decision.version == versions:
                    finished.add(decision.key)
            elapsed = time.perf_counter() - started
            published = await publisher
    data_dir.cleanup()
    latencies.sort()
    mode = f"kafka {kafka} ({engine} aggregator)" if kafka else "in-memory bus"
    pace = f"{rate:g} snapshots/s" if rate else "all at once"
    print(f"{mode}: {workloads} workloads x {pods} pods x {versions} versions ({pace}), "
          f"{len(strategies)} rankers")  # fmt: skip
    print(f"  published {total} snapshots in {published:.2f}s")
    print(f"  {len(latencies)} decisions ({complete} complete) in {elapsed:.2f}s: "
          f"{len(latencies) / elapsed:.0f} decisions/s, {len(latencies) * pods / elapsed:.0f} pod "
          f"costs/s")  # fmt: skip
    if latencies:
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(f"  snapshot emitted -> costs read back: p50 {p50 * 1000:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms")  # fmt: skip
        record(
            "bench_rank_aggregate",
            f"{mode}: {len(strategies)} rankers and the aggregator in one process, {workloads} "
            f"workloads x {pods} pods x {versions} versions ({pace})",
            [
                f"{len(latencies) / elapsed:,.0f} decisions/s, "
                f"{len(latencies) * pods / elapsed:,.0f} pod costs/s",
                f"snapshot -> costs p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms",
            ],
            variant=f"kafka-{engine}" if kafka else "",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kafka", default=None, help="bootstrap servers; default: in-memory")
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--engine", choices=("faust", "consumer"), default="faust")
    parser.add_argument("--rate", type=float, default=0, help="snapshots/s; 0: all at once")
    args = parser.parse_args()
    asyncio.run(bench(args.kafka, args.workloads, args.pods, args.versions, args.engine, args.rate))


if __name__ == "__main__":
    main()
