"""Benchmark of the aggregator alone over the real Kafka broker: decisions per second.

A script, not a test (``python -m tests.bench.bench_aggregator [--workloads N --pods P
--engine faust|consumer]``); it prints numbers and asserts nothing. It starts its own Kafka broker
in a temporary directory (``podcost_localinfra``) unless ``PODCOST_KAFKA`` points at a running
one, and uses topics of its own.

Before the aggregator starts, the topics are loaded with ``N`` workload snapshots (``P`` pods each
on several nodes over three zones, spot and on-demand, some tainted) and, for each, the answer of
every ranked strategy of the default policy, computed with the real strategies from the registry
and encoded as a ranker encodes them. The aggregator then starts as ``podcost aggregator`` starts
it (``setup_tracing``, ``podcost.aggregator.bootstrap`` with its own bus, ``serve``), in this
process, and reads the backlog; its deadline is set far beyond the run, so every decision waits
for every answer. Measured: from its first decision to the moment the ``N``-th
``DesiredCostsMessage`` is on the costs topic of the snapshots' cluster (its end offsets,
polled); the first decision's time is its record's timestamp, read back afterwards, so the
measurement reads nothing while the aggregator works. Also printed: this process's CPU time
meanwhile (decisions per CPU-second are less disturbed by other work on the machine) and, for
the faust engine, how many changelog records the tables wrote. Then it reads every decision back
and says how many workloads were decided, how many completely.

``--answers-per-record K`` puts each strategy's answers to ``K`` snapshots in a record (a
ranker's batch); with ``--combined``, every strategy's answers to those ``K`` snapshots share
one ``ranks-batch`` record, as rankers sharing a process publish them: what the aggregator
saves on records of the same answers.

``--profile FILE`` writes cProfile stats of the run (the aggregator's process is this one).

``--stages`` also prints where the process's CPU went per decision: the CPU of the processor's
stages (decoding the records, the core's decision, the costs record, the state parts; counted by
``stages.Stages``) and of the rest of the process around them (faust, aiokafka, the event loop).

``--replicas N`` runs the aggregator as ``N`` processes of its own instead, started as the chart
starts the core's aggregator Deployment with ``replicaCount: N`` (``helm template``, as
``bench_pipeline`` starts the core), over the same backlog on ``--partitions P`` partitions: they
split the partitions (a consumer group), and the bench prints the decisions per second of all of
them together, each process's share of a core and the whole machine's. What replicas give on
this machine's cores.

``--processor floor`` runs the same transport on the same backlog with ``floor_processor``'s
processor in place of the aggregator's: the same records read, produced and committed, the same
state parts written, and none of the decoding, deciding and encoding. Its decisions per second
are what the transport alone allows in this one process: a bound on any processor's.

``--trace-export-rounds K`` measures what tracing costs: ``2K`` runs of the same bench, each in a
process of its own over the same broker, alternately with trace export off (no OTLP endpoint: the
spans are not recorded) and on (``OTEL_EXPORTER_OTLP_ENDPOINT`` at a real Jaeger started for the
run, ``podcost_localinfra.jaeger``; the backlog's snapshots carry sampled trace contexts, so every
decision's spans are recorded and exported by the SDK's batch processor with its defaults, as
the chart configures a process). It prints each run's decisions per CPU-second, the median of
each side and their ratio: the CPU a decision costs with export on over off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from tests.bench import procs
from tests.bench.floor_processor import FloorProcessor
from tests.bench.floors import aggregator_floor, ratio
from tests.bench.record import record as record_row
from tests.bench.stages import Stages
from tests.support.services import processes
from tests.support.snapshots import snapshot

from podcost import aggregator
from podcost.aggregator import AggregatorSettings
from podcost.aggregator import processor as aggregator_processor
from podcost.aggregator import service as aggregator_service
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import setup_tracing
from podcost_bus import BusSettings, Delivery, KafkaBus
from podcost_bus.kafka import key_partition
from podcost_contracts.messages import (
    TRACEPARENT,
    DesiredCostsMessage,
    RankedWorkload,
    RanksBatchMessage,
    StrategyAnswer,
    StrategyRanksBatchMessage,
    StrategyRanksMessage,
    WorkloadSnapshotMessage,
    decode,
    encode,
)
from podcost_core.aggregate import Aggregator, PolicyResolver
from podcost_core.model import Snapshot
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.strategies.registry import default_registry
from podcost_localinfra import build, jaeger, kafka

POLL_S = 0.05
#: The line a run started by ``--trace-export-rounds`` prints its figures on (JSON after it).
RESULT_LINE = "bench-aggregator-result "
#: Far beyond the run: every decision is complete (a backlog read at the aggregator's own pace
#: would otherwise meet the default 5 s deadline between a snapshot and its last answer).
DEADLINE_S = 3600.0


def workloads(count: int, pods: int) -> list[Snapshot]:
    """``count`` Deployments of ``pods`` pods over a quarter as many nodes (three zones, half of
    them spot, one in seven tainted), in 20 namespaces."""
    return [
        replace(
            snapshot(
                f"app-{index}",
                pods=pods,
                nodes=max(3, pods // 3),
                namespace=f"ns-{index % 20}",
                seed=index,
            ),
            version=1 + index % 5,
        )
        for index in range(count)
    ]


def answers(snapshots: list[Snapshot]) -> list[StrategyRanksMessage]:
    """Every ranked strategy's answer for every snapshot, as the rankers compute them."""
    resolver = PolicyResolver(DEFAULT_POLICY, registry=default_registry())
    out = []
    for item in snapshots:
        for bound in resolver.of(item).bound:
            if bound.strategy.spread:
                continue  # the aggregator levels it; no ranker answers
            started = time.perf_counter()
            scores = bound.strategy.score(item, bound.args)
            out.append(
                StrategyRanksMessage(
                    key=item.workload.key,
                    version=item.version,
                    strategy=bound.name,
                    scores=dict(scores),
                    duration_seconds=time.perf_counter() - started,
                    emitted_at=time.time(),
                )
            )
    return out


def batched(
    ranks: list[StrategyRanksMessage], per_record: int, partitions: int, combined: bool = False
) -> list[StrategyRanksMessage | StrategyRanksBatchMessage | RanksBatchMessage]:
    """The records rankers publish for ``ranks``: per partition of the snapshots, each ranker
    answers the same ``per_record`` snapshots in a record of its own, and the rankers' records
    for those snapshots follow one another, as rankers reading the same backlog publish them
    (0: one ``StrategyRanksMessage`` per answer, as rankers published before batches).
    ``combined``: every ranker's answers to those snapshots in one ``RanksBatchMessage``, as
    rankers sharing a process publish them."""
    if per_record == 0:
        return list(ranks)
    by_partition: dict[int, dict[str, list[StrategyRanksMessage]]] = {}
    for answer in ranks:
        strategies = by_partition.setdefault(key_partition(answer.key.encode(), partitions), {})
        strategies.setdefault(answer.strategy, []).append(answer)
    out: list[StrategyRanksMessage | StrategyRanksBatchMessage | RanksBatchMessage] = []
    for strategies in by_partition.values():
        longest = max(len(group) for group in strategies.values())
        for start in range(0, longest, per_record):
            if combined:
                every = tuple(
                    StrategyAnswer(strategy=strategy, **RankedWorkload.of(answer).model_dump())
                    for strategy, group in strategies.items()
                    for answer in group[start : start + per_record]
                )
                out.append(RanksBatchMessage(answers=every, emitted_at=time.time()))
                continue
            for strategy, group in strategies.items():
                chunk = group[start : start + per_record]
                if not chunk:
                    continue
                ranked = tuple(RankedWorkload.of(answer) for answer in chunk)
                out.append(
                    StrategyRanksBatchMessage(
                        strategy=strategy, answers=ranked, emitted_at=time.time()
                    )
                )
    return out


async def preload(
    bus: KafkaBus,
    settings: BusSettings,
    snapshots: list[Snapshot],
    per_record: int,
    combined: bool = False,
) -> int:
    """Publish the snapshots and their answers (answers after their snapshot, the usual order);
    returns how many answers."""
    started = time.perf_counter()
    ranks = answers(snapshots)
    print(f"  computed {len(ranks)} answers in {time.perf_counter() - started:.1f}s")
    records = batched(ranks, per_record, settings.partitions, combined)
    print(f"  in {len(records)} ranks records ({per_record or 1} snapshots' answers a record"
          f"{', every strategy in one' if combined else ', one strategy each'})")  # fmt: skip
    topics = settings.topics
    acks: list[Awaitable[Delivery]] = []
    for index, item in enumerate(snapshots):
        trace = {TRACEPARENT: f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"}
        message = WorkloadSnapshotMessage.of(item, emitted_at=time.time(), changed_at=time.time())
        encoded = encode(message, trace=trace)
        acks.append(await bus.send(topics.workloads, encoded.key, encoded.value, encoded.headers))
        if len(acks) >= 2000 or index == len(snapshots) - 1:
            await asyncio.gather(*acks)
            acks.clear()
    for index, record in enumerate(records):
        encoded = encode(record)
        acks.append(await bus.send(topics.ranks, encoded.key, encoded.value, encoded.headers))
        if len(acks) >= 2000 or index == len(records) - 1:
            await asyncio.gather(*acks)
            acks.clear()
    return len(ranks)


async def read_all(bootstrap: str, topic: str, partitions: int) -> list[ConsumerRecord]:
    """Every record of ``topic``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
        group_id=None,
    )  # fmt: skip
    await consumer.start()
    try:
        tps = [TopicPartition(topic, partition) for partition in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        out = []
        for tp, end in ends.items():
            while await consumer.position(tp) < end:
                batches = await consumer.getmany(tp, timeout_ms=1000)
                out.extend(batches.get(tp, []))
        return out
    finally:
        await consumer.stop()


async def read_back(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[float, DesiredCostsMessage]]:
    """Every record of ``topic``: its timestamp and its decision."""
    return [
        (
            record.timestamp / 1000,
            decode(DesiredCostsMessage, record.value, dict(record.headers), key=record.key),
        )
        for record in await read_all(bootstrap, topic, partitions)
    ]


async def read_stamps(bootstrap: str, topic: str, partitions: int) -> list[tuple[float, str]]:
    """Every record of ``topic``: its timestamp and its key."""
    return [
        (record.timestamp / 1000, (record.key or b"").decode())
        for record in await read_all(bootstrap, topic, partitions)
    ]


async def bench(
    bootstrap: str,
    count: int,
    pods: int,
    engine: str,
    profile: str | None,
    per_record: int,
    floor: bool = False,
    stages: Stages | None = None,
    replicas: int = 0,
    partitions: int = 3,
    record_figures: bool = True,
    combined: bool = False,
) -> dict[str, float]:
    """Run the bench once; its figures (``decisions_per_cpu_second`` and ``decisions_per_second``
    from the aggregator's readiness, or from its first decision)."""
    run = uuid.uuid4().hex[:8]
    settings = BusSettings(
        bootstrap_servers=bootstrap,
        partitions=partitions,
        client_id=f"bench-{run}",
        topic_workloads=f"bench-{run}.workloads",
        topic_ranks=f"bench-{run}.ranks",
        topic_costs=f"bench-{run}.costs",
        topic_deadletter=f"bench-{run}.deadletter",
    )
    topics = settings.topics
    print(f"aggregator ({engine}{', floor processor' if floor else ''}) over Kafka {bootstrap}: "
          f"{count} workloads x {pods} pods, {settings.partitions} partitions")  # fmt: skip
    started = time.perf_counter()
    snapshots = workloads(count, pods)
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics(topics.shared())
        answered = await preload(bus, settings, snapshots, per_record, combined)
    print(f"  pre-loaded {count} snapshots and {answered} answers in "
          f"{time.perf_counter() - started:.1f}s")  # fmt: skip
    # The snapshots' cluster's costs topic; created below so that its end offsets can be asked.
    costs_topic = topics.costs_for(snapshots[0].workload.cluster)
    # The answers a workload needs (the floor processor decides once it has them all).
    policies = PolicyResolver(DEFAULT_POLICY, registry=default_registry())
    needed = len(policies.of(snapshots[0]).ranked)
    # What the bench built is not the aggregator's: an aggregator's process holds only what it
    # reads. Kept, the bench's snapshots (every pod of the backlog as objects) were walked by
    # the aggregator's first collection once ready (``settle_heap``): 5 % of the process's CPU
    # from its readiness to the last decision, at 8,000 workloads.
    del snapshots
    if replicas:
        await bench_replicas(settings, run, count, costs_topic, replicas)
        return {}

    data_dir = tempfile.TemporaryDirectory(prefix="podcost-bench-")
    service_settings = ServiceSettings(http_port=0)
    config = AggregatorSettings(
        app_id=f"bench-{run}-aggregator",
        data_dir=Path(data_dir.name),
        engine=engine,  # type: ignore[arg-type]
        deadline_seconds=DEADLINE_S,
    )
    # What ``podcost aggregator`` does, in this process.
    provider = setup_tracing("podcost-aggregator")
    if floor:
        # The composition root as it is, but for the processor it builds.
        def floor_processor(_aggregator: object, **wiring: Any) -> FloorProcessor:
            return FloorProcessor(wiring["bus"], wiring["topics"], needed=needed)

        with mock.patch.object(aggregator_service, "AggregationProcessor", floor_processor):
            service = aggregator.bootstrap(service_settings, settings, config=config)
    else:
        service = aggregator.bootstrap(service_settings, settings, config=config)
    ends = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await ends.start()
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([costs_topic])
    costs = [TopicPartition(costs_topic, p) for p in range(settings.partitions)]
    stop = asyncio.Event()
    profiler = cProfile.Profile() if profile else None
    launched = time.time()
    if profiler:
        profiler.enable()
    task = asyncio.create_task(serve([service], service_settings, bus=service.bus, stop=stop))
    counting = contextlib.ExitStack()
    if stages is not None:
        module, processor = aggregator_processor, aggregator_processor.AggregationProcessor
        counting.enter_context(stages.wrapped([
            ("split (a record into steps)", processor, "split", None),
            ("decode a snapshot", module, "decode_workload_record", "split (a record into steps)"),
            ("decode a ranks record", module, "decode_ranks_record", "split (a record into steps)"),
            ("on_record (a step)", processor, "on_record", None),
            ("a snapshot's transition", Aggregator, "on_snapshot", "on_record (a step)"),
            ("an answer's transition", Aggregator, "on_ranks", "on_record (a step)"),
            ("decide (the core)", Aggregator, "due", "on_record (a step)"),
            ("queue the costs record", processor, "_queue_costs", "on_record (a step)"),
            ("costs JSON", module, "desired_costs_json", "queue the costs record"),
            ("gzip and headers", module, "encode_json", "queue the costs record"),
            ("on_tick", processor, "on_tick", None),
            ("dump (a state's parts)", processor, "dump", None),
        ]))  # fmt: skip
        counting.enter_context(stages.collections())
    try:
        decided = 0
        cpu = [(time.time(), time.process_time())]  # when, and this process's CPU time then
        ready: tuple[float, float] | None = None  # the sample when the aggregator was ready
        while decided < count:
            if task.done():
                task.result()
                raise RuntimeError("the aggregator stopped by itself")
            await asyncio.sleep(POLL_S)
            decided = sum((await ends.end_offsets(costs)).values())
            cpu.append((time.time(), time.process_time()))
            if ready is None and service.ready():
                ready = cpu[-1]
        finished = time.time()
    finally:
        if profiler:
            profiler.disable()
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        counting.close()
        await ends.stop()
        provider.shutdown()
        data_dir.cleanup()
    if profiler and profile:
        profiler.dump_stats(profile)

    changelog = 0
    if engine == "faust":
        changelogs = service.transport.changelog_topics()  # type: ignore[attr-defined]
        tps = [TopicPartition(t, p) for t in changelogs for p in range(settings.partitions)]
        ends = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        await ends.start()
        changelog = sum((await ends.end_offsets(tps)).values())
        await ends.stop()
    if floor:  # its costs records are made-up bytes: only their keys and times say something
        stamps = await read_stamps(bootstrap, costs_topic, settings.partitions)
        decisions_count, first = len(stamps), min(stamp for stamp, _ in stamps)
        keys = complete = {key for _, key in stamps}
    else:
        decisions = await read_back(bootstrap, costs_topic, settings.partitions)
        decisions_count, first = len(decisions), min(stamp for stamp, _ in decisions)
        keys = {message.key for _, message in decisions}
        complete = {message.key for _, message in decisions if message.complete}
    elapsed = finished - first
    since = max((sample for sample in cpu if sample[0] <= first), default=cpu[0])
    used = cpu[-1][1] - since[1]
    print(f"  started -> first decision: {first - launched:.2f}s")
    print(f"  {decisions_count} decisions ({len(keys)} workloads, {len(complete)} complete) in "
          f"{elapsed:.2f}s from the first: {count / elapsed:.0f} decisions/s "
          f"({count / (finished - launched):.0f}/s counting the start)")  # fmt: skip
    if changelog:
        print(f"  {changelog} changelog records ({changelog / count:.1f} per workload)")
    if ready is not None:
        # Throughout: a decision waits for records that may come in the batch after, so the
        # time from the first decision alone flatters large batches.
        busy, spent = finished - ready[0], cpu[-1][1] - ready[1]
        print(f"  ready -> last decision: {busy:.2f}s, {count / busy:.0f} decisions/s; "
              f"CPU {spent:.2f}s, {count / spent:.0f} decisions per CPU-second")  # fmt: skip
    print(f"  this process's CPU meanwhile: {used:.2f}s ({used / (cpu[-1][0] - since[0]):.0%} of "
          f"one core), {count / used:.0f} decisions per CPU-second")  # fmt: skip
    # The floor, in this process now: the pure core's combine and labels of the same snapshots.
    floor_s = aggregator_floor(workloads(min(count, 200), pods))
    per_decision = (spent if ready is not None else used) / count
    print(f"  CPU per decision {per_decision * 1e3:.3f} ms; floor (combine + labels of the same "
          f"snapshots, no bus) {floor_s * 1e3:.3f} ms: {ratio(per_decision, floor_s)} the "
          "floor")  # fmt: skip
    figures = [
        f"{count / (busy if ready is not None else elapsed):,.0f} decisions/s"
        + (" from its readiness to the last decision" if ready is not None else "")
    ]
    if ready is not None:
        figures.append(f"{count / spent:,.0f} decisions per CPU-second")
    if changelog:
        figures.append(f"{changelog / count:.1f} changelog records per workload")
    result = {
        "decisions_per_second": count / (busy if ready is not None else elapsed),
        "decisions_per_cpu_second": count / (spent if ready is not None else used),
    }
    if stages is not None:
        print("  this process's CPU per decision (from its readiness), by stage:")
        for line in stages.report(count, spent if ready is not None else used):
            print(f"    {line}")
    if not record_figures:
        return result
    record_row(
        "bench_aggregator",
        f"the aggregator alone, one process over the real broker ({engine} engine"
        f"{', a processor that only keeps the books: what the transport allows' if floor else ''}"
        f"): a backlog of {count:,} workloads x {pods} pods with every answer of the default "
        "policy",
        figures,
        variant=f"{engine}-floor" if floor else ("" if engine == "faust" else engine),
    )  # fmt: skip
    return result


async def bench_replicas(
    settings: BusSettings, run: str, count: int, costs_topic: str, replicas: int
) -> None:
    """``--replicas``: the backlog decided by the chart's aggregator Deployment of ``replicas``
    processes (see the module docstring)."""
    core = procs.chart_core_specs(
        build.ensure_helm(), settings.bootstrap_servers, run, partitions=settings.partitions,
        aggregator={"replicaCount": replicas, "deadlineSeconds": DEADLINE_S},
    )  # fmt: skip
    # Not the rankers: their answers are in the backlog.
    specs = [spec for spec in core if spec.args[0] == "aggregator"]
    assert len(specs) == replicas, f"the chart rendered {len(specs)} aggregators"
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([costs_topic])
    costs = [TopicPartition(costs_topic, p) for p in range(settings.partitions)]
    async with contextlib.AsyncExitStack() as stack:
        ends = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=None)
        await ends.start()
        stack.push_async_callback(ends.stop)
        logs = stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-bench-"))
        launched = time.time()
        started = await stack.enter_async_context(processes(specs, env={}, log_dir=Path(logs)))
        # Every process ready (the first ones may have decided meanwhile, alone).
        ready = time.time()
        cpu = procs.CpuWatch({name: proc.pid for name, proc in started.items()})
        cpu.start()
        decided = before = sum((await ends.end_offsets(costs)).values())
        while decided < count:
            if dead := [name for name, proc in started.items() if not proc.alive]:
                raise RuntimeError(f"aggregator processes stopped by themselves: {dead}")
            await asyncio.sleep(POLL_S)
            decided = sum((await ends.end_offsets(costs)).values())
        finished = time.time()
        used = cpu.stop(finished - ready)
    decisions = await read_back(settings.bootstrap_servers, costs_topic, settings.partitions)
    first = min(stamp for stamp, _ in decisions)
    keys = {message.key for _, message in decisions}
    complete = {message.key for _, message in decisions if message.complete}
    print(f"  {replicas} aggregator processes, as the chart's core starts them: started -> all "
          f"ready {ready - launched:.2f}s, -> first decision {first - launched:.2f}s")  # fmt: skip
    after = count - before
    print(f"  {len(decisions)} decisions ({len(keys)} workloads, {len(complete)} complete) in "
          f"{finished - first:.2f}s from the first: {count / (finished - first):.0f} "
          f"decisions/s")  # fmt: skip
    total = sum(share for share, _ in used.values()) * (finished - ready)
    print(f"  all ready -> last decision: {finished - ready:.2f}s, {after} decisions, "
          f"{after / (finished - ready):.0f}/s; their CPU {total:.2f}s, {after / total:.0f} "
          f"decisions per CPU-second")  # fmt: skip
    print(procs.describe_usage(used, indent="    "))
    if cpu.machine is not None:
        print(procs.describe_machine(cpu.machine, indent="    "))
    record_row(
        "bench_aggregator",
        f"the chart's aggregator Deployment of {replicas} process{'es' * (replicas > 1)} over "
        "the real broker, "
        f"{settings.partitions} partitions: a backlog of {count:,} workloads with every answer of "
        "the default policy",
        [
            f"{after / (finished - ready):,.0f} decisions/s from all ready to the last decision",
            f"{after / total:,.0f} decisions per CPU-second",
        ],
        variant=f"replicas-{replicas}",
    )


def compare_trace_export(bootstrap: str, rounds: int, count: int, pods: int, run_dir: Path) -> None:
    """``--trace-export-rounds``: the bench with trace export off and on, alternated, each run
    a process of its own (see the module docstring)."""
    server = jaeger.start(run_dir / "jaeger")
    try:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("OTEL_", "PODCOST_BENCH_RECORD"))}  # fmt: skip
        base["PODCOST_KAFKA"] = bootstrap
        per_cpu: dict[str, list[float]] = {"off": [], "on": []}
        print(f"trace export off and on, alternated, {rounds} runs each: "
              f"{count} workloads x {pods} pods a run")  # fmt: skip
        for index in range(2 * rounds):
            side = ("off", "on")[index % 2]
            env = dict(base)
            if side == "on":
                env["OTEL_EXPORTER_OTLP_ENDPOINT"] = server.otlp_http
            argv = [sys.executable, "-m", "tests.bench.bench_aggregator", "--workloads",
                    str(count), "--pods", str(pods), "--result-line"]  # fmt: skip
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800,
                                  cwd=Path(__file__).resolve().parents[2])  # fmt: skip
            lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_LINE)]
            if done.returncode != 0 or not lines:
                raise RuntimeError(f"run {index + 1} (export {side}) failed:\n"
                                   f"{done.stdout[-2000:]}{done.stderr[-2000:]}")  # fmt: skip
            figures = json.loads(lines[-1].removeprefix(RESULT_LINE))
            per_cpu[side].append(figures["decisions_per_cpu_second"])
            print(f"  run {index + 1}, export {side:>3}: "
                  f"{figures['decisions_per_cpu_second']:,.0f} decisions per CPU-second, "
                  f"{figures['decisions_per_second']:,.0f} decisions/s")  # fmt: skip
        services = server.services()
    finally:
        server.stop()
    off, on = statistics.median(per_cpu["off"]), statistics.median(per_cpu["on"])
    ratio = off / on
    print(f"  median: off {off:,.0f}, on {on:,.0f} decisions per CPU-second; CPU per decision "
          f"with export on / off: {ratio:.2f}x ({1e6 / off:,.0f} us off, {1e6 / on:,.0f} us on); "
          f"services in Jaeger: {services}")  # fmt: skip
    record_row(
        "bench_aggregator",
        f"the aggregator alone, one process over the real broker (faust engine), trace export "
        f"off and on (OTLP to a real Jaeger) alternated, {rounds} runs each: a backlog of "
        f"{count:,} workloads x {pods} pods",
        [
            f"CPU per decision with export on / off: {ratio:.2f}x",
            f"{off:,.0f} decisions per CPU-second off, {on:,.0f} on (medians; runs off "
            f"{min(per_cpu['off']):,.0f}–{max(per_cpu['off']):,.0f}, on "
            f"{min(per_cpu['on']):,.0f}–{max(per_cpu['on']):,.0f})",
            f"load average {os.getloadavg()[1]:.0f} (5 min) at the end of the run",
        ],
        variant="trace-export",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=25)
    parser.add_argument("--engine", choices=("faust", "consumer"), default="faust")
    parser.add_argument("--profile", default=None, help="write cProfile stats to this file")
    parser.add_argument(
        "--processor", choices=("real", "floor"), default="real",
        help="floor: the transport alone, with floor_processor's processor (module docstring)",
    )  # fmt: skip
    parser.add_argument(
        "--stages", action="store_true",
        help="also print the CPU per decision of each stage of the processor (module docstring)",
    )  # fmt: skip
    parser.add_argument(
        "--answers-per-record", type=int, default=100,
        help="answers in a ranks record, as a ranker batches them (0: a record per answer)",
    )  # fmt: skip
    parser.add_argument(
        "--combined", action="store_true",
        help="every strategy's answers to the same snapshots in one ranks-batch record, as "
        "rankers sharing a process publish them (--answers-per-record: snapshots a record)",
    )  # fmt: skip
    parser.add_argument(
        "--replicas", type=int, default=0,
        help="run the aggregator as this many processes, as the chart starts them (docstring)",
    )  # fmt: skip
    parser.add_argument("--partitions", type=int, default=3, help="of every topic of the run")
    parser.add_argument(
        "--trace-export-rounds", type=int, default=0,
        help="runs with trace export off and on, alternated, this many each (docstring)",
    )  # fmt: skip
    parser.add_argument("--result-line", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stages and args.processor == "floor":
        parser.error("--stages counts the real processor's stages, not the floor's")
    if args.replicas and (args.stages or args.profile or args.processor == "floor"
                          or args.engine != "faust"):  # fmt: skip
        parser.error("--replicas runs `podcost aggregator` processes as the chart does: without "
                     "--stages, --profile, --processor floor or --engine consumer")  # fmt: skip
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("PODCOST_KAFKA")
        if not bootstrap:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            broker = kafka.start(run_dir / "kafka")
            stack.callback(broker.stop)
            bootstrap = broker.bootstrap
        if args.trace_export_rounds:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            compare_trace_export(
                bootstrap, args.trace_export_rounds, args.workloads, args.pods, scratch
            )
            return
        result = asyncio.run(
            bench(
                bootstrap,
                args.workloads,
                args.pods,
                args.engine,
                args.profile,
                args.answers_per_record,
                floor=args.processor == "floor",
                stages=Stages() if args.stages else None,
                replicas=args.replicas,
                partitions=args.partitions,
                record_figures=not args.result_line,
                combined=args.combined,
            )
        )
        if args.result_line:
            print(RESULT_LINE + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
