"""Benchmark of the core's rankers alone over the real Kafka broker, at a trickle: CPU per snapshot
of every ranker process together, beside the rankers' floor.

A script, not a test (``python -m tests.bench.bench_rankers [--rate 150 --seconds 30
--rankers apart|shared|combined --replicas N --partitions P]``); it prints numbers and asserts
nothing. It starts its own Kafka broker (``podcost_localinfra``) unless ``PODCOST_KAFKA`` points
at a running one, and uses topics of its own.

The rankers run as the chart's core mode starts them (``procs.chart_core_specs``): a
``podcost ranker`` process per strategy of the default policy (``--rankers apart``), or one
process running them all, each strategy in its own consumer group (``--rankers shared``), and
their answers to the same snapshots in shared ``ranks-batch`` records with ``--rankers combined``
(the chart's ``rankers.combineAnswers``).
``--replicas N`` runs each of those Deployments as ``N`` processes (the chart's
``rankers.replicaCount``), which split the partitions of the run's topics (``--partitions P``,
3 by default) within each strategy's consumer group: what replicas give on this machine. This
process then publishes snapshots of ``--workloads`` Deployments of ``--pods`` pods (those of
``bench_aggregator``), encoded as the watcher encodes them, at ``--rate`` snapshots/s for
``--seconds``, one workload after another with growing versions: the trickle a core serving
many quiet clusters sees (``bench_fleet`` at N = 50 and 400 events/s made about 150 snapshots/s).
Measured: the ranker processes' CPU (``/proc``) from the first snapshot until every strategy has
consumed every snapshot, per snapshot, the records they published on the ranks topic per
snapshot, and the rate they ranked at (snapshots ranked by every
strategy per second, from the first snapshot offered to the last one ranked); beside it the
floor (``floors.core_floors``: each ranker's decode and strategy, in one process without Kafka)
and the ratio. The machine's load and what its cores did meanwhile are printed: the ratio, not
the rate, is the figure to compare between runs. ``--aggregator`` also runs the chart's
aggregator over what the rankers publish, waits until it has read every record of both topics,
and prints its CPU per snapshot: what the records the rankers publish cost it at a trickle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import procs
from tests.bench.bench_aggregator import workloads
from tests.bench.floors import core_floors, ratio
from tests.bench.record import record
from tests.support.services import processes

from podcost_bus import BusSettings, open_bus
from podcost_contracts.messages import WorkloadSnapshotMessage, encode
from podcost_localinfra import build, kafka


async def bench(brokers: str, args: argparse.Namespace) -> None:
    run = uuid.uuid4().hex[:8]
    core = procs.chart_core_specs(
        build.ensure_helm(), brokers, run, shared_rankers=args.rankers != "apart",
        combine_answers=args.rankers == "combined",
        partitions=args.partitions, replicas=args.replicas if args.replicas > 1 else None,
    )  # fmt: skip
    specs = [spec for spec in core if procs.strategies_in(spec)]
    # The aggregator reading what the rankers publish, as the chart's core runs it.
    deciding = (
        [spec for spec in core if spec.args[:1] == ("aggregator",)] if args.aggregator else []
    )
    # Each strategy's group consumes every snapshot once, whichever of its replicas reads it.
    groups = len({name for spec in specs for name in procs.strategy_names(spec)})
    names = {spec.name for spec in specs}
    env = specs[0].env
    settings = BusSettings(
        bootstrap_servers=brokers,
        client_id=f"bench-{run}",
        topic_workloads=env["PODCOST_TOPIC_WORKLOADS"],
        topic_ranks=env["PODCOST_TOPIC_RANKS"],
        topic_costs=env["PODCOST_TOPIC_COSTS"],
        topic_deadletter=env["PODCOST_TOPIC_DEADLETTER"],
        partitions=args.partitions,
    )
    items = workloads(args.workloads, args.pods)
    floors = core_floors(items[:50])
    ranker_floor = sum(floors.rankers.values())
    count = int(args.rate * args.seconds)
    bus = open_bus(settings)
    await bus.start()
    try:
        with tempfile.TemporaryDirectory(prefix="podcost-bench-rankers-") as tmp:
            async with processes(
                [*specs, *deciding], env={}, log_dir=Path(tmp), ready_timeout=600
            ) as running:
                cpu = procs.CpuWatch({name: p.pid for name, p in running.items()})
                load_before = os.getloadavg()[0]
                started = time.monotonic()
                cpu.start()
                for index in range(count):
                    due = started + index / args.rate
                    if (wait := due - time.monotonic()) > 0:
                        await asyncio.sleep(wait)
                    item = items[index % len(items)]
                    item = replace(item, version=item.version + 1 + index // len(items))
                    encoded = encode(WorkloadSnapshotMessage.of(item, emitted_at=time.time()))
                    await bus.send(
                        settings.topic_workloads, encoded.key, encoded.value, encoded.headers
                    )
                offered_s = time.monotonic() - started

                rankers = [running[spec.name] for spec in specs]
                aggregators = [running[spec.name] for spec in deciding]

                async def consumed() -> float:
                    got = 0.0
                    for process in rankers:
                        metrics = await process.metrics()
                        got += procs.consumed(metrics, settings.topic_workloads)
                    return got

                async def published() -> float:
                    """Records the rankers published on the ranks topic."""
                    got = 0.0
                    for process in rankers:
                        got += procs.produced(await process.metrics(), settings.topic_ranks)
                    return got

                async def read_by_aggregators() -> float:
                    """Records of both topics the aggregators consumed."""
                    got = 0.0
                    for process in aggregators:
                        metrics = await process.metrics()
                        for topic in (settings.topic_workloads, settings.topic_ranks):
                            got += procs.consumed(metrics, topic)
                    return got

                wanted = count * groups
                deadline = time.monotonic() + args.drain_seconds
                while (done := await consumed()) < wanted:
                    if time.monotonic() > deadline:
                        print(f"  not drained: {done:.0f} of {wanted} consumptions")
                        break
                    await asyncio.sleep(0.5)
                while aggregators and (read := await read_by_aggregators()) < (
                    count + await published()
                ):
                    if time.monotonic() > deadline:
                        print(f"  the aggregator did not drain: {read:.0f} records read")
                        break
                    await asyncio.sleep(0.5)
                elapsed = time.monotonic() - started
                used = cpu.stop(elapsed)
                records = await published()
    finally:
        await bus.stop()
    aggregator_seconds = sum(used[spec.name][0] for spec in deciding if spec.name in used) * elapsed
    seconds = sum(share for name, (share, _) in used.items() if name in names) * elapsed
    # Per snapshot ranked: on a loaded machine the backlog may not drain within the wait.
    ranked = done / groups
    per_snapshot = seconds / max(ranked, 1.0)
    print(
        f"rankers {args.rankers} ({len(specs)} process(es), {groups} strategies, "
        f"{args.partitions} partitions): {count} snapshots of {args.pods} pods offered at "
        f"{args.rate:,.0f}/s over {offered_s:.1f}s, {ranked:,.0f} ranked by every strategy "
        f"{elapsed - offered_s:.1f}s after: {ranked / elapsed:,.0f} snapshots/s; load average "
        f"{load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"  ranks records {records:,.0f}: {records / max(ranked, 1.0):.3f} per snapshot ranked "
        f"(what the aggregator fetches and steps through)"
    )
    if deciding:
        print(
            f"  aggregator's CPU per snapshot {aggregator_seconds / max(ranked, 1.0) * 1e3:.3f} ms "
            f"(reading the snapshots and the rankers' records, deciding)"
        )
    print(procs.describe_usage(used, indent="    "))
    if cpu.machine is not None:
        print(procs.describe_machine(cpu.machine, indent="    "))
    print(
        f"  rankers' CPU per snapshot {per_snapshot * 1e3:.3f} ms; floor (each ranker's decode "
        f"and strategy, one process, no Kafka) {ranker_floor * 1e3:.3f} ms: "
        f"{ratio(per_snapshot, ranker_floor)} the floor; one decode and every strategy "
        f"{(floors.decode_whole + floors.scoring) * 1e3:.3f} ms: "
        f"{ratio(per_snapshot, floors.decode_whole + floors.scoring)}"
    )
    figures = [
        f"rankers' CPU per snapshot {per_snapshot * 1e3:.2f} ms, "
        f"{ratio(per_snapshot, floors.decode_whole + floors.scoring)} one decode and every "
        f"strategy ({(floors.decode_whole + floors.scoring) * 1e3:.2f} ms)",
        f"{records / max(ranked, 1.0):.2f} ranks records a snapshot",
    ]
    if deciding:
        figures.append(
            f"aggregator's CPU per snapshot {aggregator_seconds / max(ranked, 1.0) * 1e3:.2f} ms"
        )
    record(
        "bench_rankers",
        f"the core's rankers ({args.rankers}, {len(specs)} process(es), {groups} strategies) over "
        f"the real broker at {args.rate:,.0f} snapshots/s of {args.pods}-pod workloads"
        + (", with the chart's aggregator reading what they publish" if deciding else ""),
        figures,
        variant=args.rankers,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rate", type=float, default=150.0, help="snapshots/s")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workloads", type=int, default=400)
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--drain-seconds", type=float, default=120.0)
    parser.add_argument(
        "--rankers", choices=("apart", "shared", "combined"), default="apart",
        help="a process per strategy; one for all; one for all, their answers in shared records",
    )  # fmt: skip
    parser.add_argument(
        "--replicas", type=int, default=1,
        help="processes of each ranker Deployment, splitting the partitions (docstring)",
    )  # fmt: skip
    parser.add_argument("--partitions", type=int, default=3, help="of every topic of the run")
    parser.add_argument(
        "--aggregator", action="store_true",
        help="also run the chart's aggregator on what the rankers publish, and print its CPU",
    )  # fmt: skip
    args = parser.parse_args()
    if args.replicas < 1 or args.partitions < 1:
        parser.error("--replicas and --partitions are at least 1")
    with contextlib.ExitStack() as stack:
        brokers = os.environ.get("PODCOST_KAFKA")
        if not brokers:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            broker = kafka.start(run_dir / "kafka")
            stack.callback(broker.stop)
            brokers = broker.bootstrap
        asyncio.run(bench(brokers, args))


if __name__ == "__main__":
    main()
