"""Failover benchmark: how long the aggregator takes to decide again after a crash or a new
member, by the size of its state and its standby replicas, over the real Kafka broker.

A script, not a test (``python -m tests.bench.bench_failover [--workloads 10000,50000,100000]
[--standbys 0,1] [--pods 25] [--partitions 6] [--session-timeout-ms MS]``); it prints a table
and asserts nothing. It starts its own Kafka broker (``podcost_localinfra``) unless
``PODCOST_KAFKA`` points at one.

For each state size N and standby count S (fresh topics and app id each time):

- The aggregator runs as the chart's core runs it (``procs.chart_core_specs``: ``podcost
  aggregator`` processes with the environment ``helm template`` renders; no rankers), two
  replicas with ``standbyReplicas: S``, its deadline far beyond the run.
- The workloads topic is filled with N snapshots of P pods (one workload each), and the bench
  waits until the replicas hold them all (``podcost_aggregator_states``, summed: N x (1 + S)
  with the standby copies).
- **kill**: one replica is SIGKILLed. Measured from the kill: until the survivor is not ready
  (the broker noticed: the session timeout, ``PODCOST_KAFKA_SESSION_TIMEOUT_MS``), until it is
  ready again (its recovery of the dead member's tables done), and until a probe workload on every
  partition is decided (a snapshot and every strategy's answer published each second from the
  kill on, for one workload per partition): *decides again*. The survivor's CPU (share of a
  core) and peak RSS over that time, and the peak of its ``podcost_aggregator_recovering_seconds``.
- **add**: the killed replica is started again (a member added to a group that has all the
  state): from its start (imports included) until it is ready (its share of the tables
  recovered), and until every partition decides a probe published after that.
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
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiokafka import AIOKafkaConsumer
from tests.bench import procs
from tests.bench.bench_aggregator import answers
from tests.bench.record import record as record_row
from tests.support.services import ServiceProcess, processes
from tests.support.snapshots import snapshot

from podcost_bus import BusSettings, KafkaBus
from podcost_bus.kafka import key_partition
from podcost_contracts.messages import DesiredCostsMessage, WorkloadSnapshotMessage, decode, encode
from podcost_core.model import Snapshot
from podcost_localinfra import build, kafka

DEADLINE_S = 3600.0
PROBE_EVERY_S = 1.0
POLL_S = 0.2
STABLE_S = 15.0
CLUSTER = "bench"


@dataclass
class Outcome:
    """One scenario's times (seconds from the kill, or from the new member's start)."""

    noticed_s: float | None
    ready_s: float | None
    decides_s: float | None
    recovering_peak_s: float
    cpu: float
    rss_mib: float


@dataclass
class Row:
    workloads: int
    standbys: int
    fill_s: float
    kill: Outcome
    add: Outcome
    load: float
    """The machine's load average (5 minutes) at the end of the scenario: the times are wall
    clock, so a busy machine lengthens them."""


def fill_snapshots(count: int, pods: int) -> list[Snapshot]:
    """``count`` Deployments of ``pods`` pods, as ``bench_aggregator`` makes them, in cluster
    ``bench`` (one snapshot made, the others the same pods under other names: filling 100,000
    workloads must not take the bench longer than the aggregator)."""
    base = snapshot("app", pods=pods, nodes=max(3, pods // 3), namespace="ns")
    return [
        replace(
            base,
            workload=replace(base.workload, cluster=CLUSTER, name=f"app-{index}"),
        )
        for index in range(count)
    ]


def probes(partitions: int) -> dict[int, Snapshot]:
    """One probe workload per partition of the workloads topic."""
    found: dict[int, Snapshot] = {}
    index = 0
    while len(found) < partitions:
        item = snapshot(f"probe-{index}", pods=5, nodes=3, namespace="probe")
        item = replace(item, workload=replace(item.workload, cluster=CLUSTER))
        found.setdefault(key_partition(item.workload.key.encode(), partitions), item)
        index += 1
    return found


async def publish_snapshots(bus: KafkaBus, topic: str, items: list[Snapshot]) -> None:
    acks = []
    for item in items:
        encoded = encode(WorkloadSnapshotMessage.of(item, emitted_at=time.time()))
        acks.append(await bus.send(topic, encoded.key, encoded.value, encoded.headers))
        if len(acks) >= 2000:
            await asyncio.gather(*acks)
            acks.clear()
    await asyncio.gather(*acks)


class Prober:
    """Publishes a new version of every probe workload, with every answer, each second, and
    says when each partition's probe was last decided."""

    def __init__(self, bus: KafkaBus, settings: BusSettings, partitions: int) -> None:
        self.bus, self.settings = bus, settings
        self.items = probes(partitions)
        self.version = 1
        self.decided: dict[str, float] = {}
        """Per probe key: when its latest decision was published (the record's timestamp)."""

    async def publish(self) -> None:
        self.version += 1
        topics = self.settings.topics
        items = [replace(item, version=self.version) for item in self.items.values()]
        await publish_snapshots(self.bus, topics.workloads, items)
        for answer in answers(items):
            encoded = encode(answer)
            await self.bus.publish(topics.ranks, encoded.key, encoded.value, encoded.headers)

    async def read(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    message = decode(DesiredCostsMessage, record.value, dict(record.headers))
                    if message.key.split("/")[1] == "probe":
                        self.decided[message.key] = record.timestamp / 1000

    def all_decided_since(self, since: float) -> bool:
        keys = [item.workload.key for item in self.items.values()]
        return all(self.decided.get(key, 0.0) >= since for key in keys)


async def observe(
    survivor: ServiceProcess, prober: Prober, since: float, *, within: float, joining: bool = False
) -> Outcome:
    """From ``since`` (wall clock): when ``survivor`` is not ready, ready again, and when every
    probe is decided after ``since`` (``joining``: a new member, decided after it is ready, so
    after the rebalance it causes); its CPU and RSS meanwhile."""
    started = time.monotonic()
    watch = procs.CpuWatch({"survivor": survivor.pid})
    watch.start()
    noticed = ready = decides = None
    was_ready = await survivor.is_ready()
    peak_recovering, peak_rss = 0.0, 0
    next_probe = 0.0
    while time.monotonic() - started < within:
        now = time.monotonic()
        if now >= next_probe:
            await prober.publish()
            next_probe = now + PROBE_EVERY_S
        is_ready = await survivor.is_ready()
        elapsed = time.time() - since
        if not is_ready and noticed is None and not joining:
            noticed = elapsed
        if is_ready and (noticed is not None or not was_ready) and ready is None:
            ready = elapsed
        with contextlib.suppress(AssertionError, OSError):
            metrics = await survivor.metrics()
            peak_recovering = max(
                peak_recovering, metrics.get("podcost_aggregator_recovering_seconds"
                                             '{component="aggregator"}', 0.0)
            )  # fmt: skip
            peak_rss = max(peak_rss, int(metrics.get("process_resident_memory_bytes", 0)))
        after = since if not joining else None if ready is None else since + ready
        if decides is None and after is not None and prober.all_decided_since(after):
            decides = max(prober.decided.values()) - since
        if decides is not None and ready is not None:
            break
        await asyncio.sleep(POLL_S)
    used = watch.stop(time.monotonic() - started)
    cpu = used.get("survivor", (0.0, 0))[0]
    return Outcome(noticed, ready, decides, peak_recovering, cpu, peak_rss / 2**20)


async def scenario(bootstrap: str, count: int, standbys: int, pods: int, partitions: int,
                   within: float, session_timeout_ms: int | None = None) -> Row:  # fmt: skip
    run = uuid.uuid4().hex[:8]
    specs = [
        spec for spec in procs.chart_core_specs(
            build.ensure_helm(), bootstrap, run, partitions=partitions,
            aggregator={"replicaCount": 2, "deadlineSeconds": DEADLINE_S,
                        "standbyReplicas": standbys},
        ) if spec.args[0] == "aggregator"
    ]  # fmt: skip
    env = specs[0].env
    settings = BusSettings(
        bootstrap_servers=bootstrap, partitions=partitions,
        topic_workloads=env["PODCOST_TOPIC_WORKLOADS"], topic_ranks=env["PODCOST_TOPIC_RANKS"],
        topic_costs=env["PODCOST_TOPIC_COSTS"], topic_deadletter=env["PODCOST_TOPIC_DEADLETTER"],
    )  # fmt: skip
    topics = settings.topics
    session = {} if session_timeout_ms is None else {
        "PODCOST_KAFKA_SESSION_TIMEOUT_MS": str(session_timeout_ms)
    }  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        bus = await stack.enter_async_context(KafkaBus(settings))
        await bus.ensure_topics([*topics.shared(), topics.costs_for(CLUSTER)])
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-failover-")))
        running = await stack.enter_async_context(
            processes(specs, env=session, log_dir=logs, ready_timeout=300)
        )
        members = list(running.values())
        started = time.monotonic()
        await publish_snapshots(bus, topics.workloads, fill_snapshots(count, pods))

        async def held() -> float:
            got = []
            for member in members:
                if not member.alive:
                    # Exited by itself (its watchdog, or faust's skip guard, stops it to be
                    # restarted): restarted, as its Deployment would.
                    print(f"    {member.spec.name} exited ({member.returncode}): restarted")
                    await member.stop()
                    await member.start()
                    await member.wait_ready(timeout=300)
                got.append(await member.sample("podcost_aggregator_states"))
            return sum(got)

        # Every active state held, then the standby copies as far as they go: the sum stops
        # growing for STABLE_S (faust keeps a standby only where another member can hold it).
        last, stable_since = -1.0, time.monotonic()
        while True:  # polled: the states are in the processes' /metrics
            now_held = await held()
            if now_held != last:
                last, stable_since = now_held, time.monotonic()
            if now_held >= count * (1 + standbys) or (
                now_held >= count and time.monotonic() - stable_since >= STABLE_S
            ):
                break
            if time.monotonic() - started > 3 * within:
                raise RuntimeError(f"the aggregators took in {now_held:.0f} of {count} states")
            await asyncio.sleep(1.0)
        fill = time.monotonic() - started
        print(f"  N = {count:,}, standbys {standbys}: filled in {fill:.1f}s ({last:.0f} states "
              "held, standby copies included)", flush=True)  # fmt: skip
        consumer = AIOKafkaConsumer(topics.costs_for(CLUSTER), bootstrap_servers=bootstrap,
                                    group_id=None, auto_offset_reset="latest")  # fmt: skip
        await consumer.start()
        stack.push_async_callback(consumer.stop)
        prober = Prober(bus, settings, partitions)
        reader = asyncio.create_task(prober.read(consumer))
        try:
            await prober.publish()
            while True:  # every probe decided once before the kill
                if prober.all_decided_since(0.0):
                    break
                await asyncio.sleep(POLL_S)
            victim, survivor = members
            killed_at = time.time()
            victim.kill()
            killed = await observe(survivor, prober, killed_at, within=within)
            print(f"    kill: {killed}", flush=True)
            await victim.stop()
            added_at = time.time()
            await victim.start()
            added = await observe(victim, prober, added_at, within=within, joining=True)
            print(f"    add: {added}", flush=True)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    return Row(count, standbys, fill, killed, added, os.getloadavg()[1])


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(rows: list[Row]) -> str:
    lines = [
        "| workloads | standbys | kill: noticed / ready / decides (s) | recovering peak (s) | "
        "survivor CPU, RSS | add: ready / decides (s) | load (5 min) |",
        "|---:|---:|---|---:|---|---|---:|",
    ]
    for row in rows:
        k, a = row.kill, row.add
        lines.append(
            f"| {row.workloads:,} | {row.standbys} | {seconds(k.noticed_s)} / "
            f"{seconds(k.ready_s)} / {seconds(k.decides_s)} | {k.recovering_peak_s:.0f} | "
            f"{k.cpu:.0%}, {k.rss_mib:.0f} MiB | {seconds(a.ready_s)} / {seconds(a.decides_s)} | "
            f"{row.load:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="10000,50000,100000",
                        help="state sizes, comma-separated")  # fmt: skip
    parser.add_argument("--standbys", default="0,1", help="standby replicas, comma-separated")
    parser.add_argument("--pods", type=int, default=25)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        default=None,
        help="the aggregators' consumer group session timeout (default: the settings' own)",
    )
    parser.add_argument(
        "--within",
        type=float,
        default=300.0,
        help="how long a scenario may take before it is reported unfinished",
    )
    args = parser.parse_args()
    sizes = [int(value) for value in args.workloads.split(",")]
    standbys = [int(value) for value in args.standbys.split(",")]
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("PODCOST_KAFKA")
        if not bootstrap:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            broker = kafka.start(run_dir / "kafka")
            stack.callback(broker.stop)
            bootstrap = broker.bootstrap
        for size in sizes:
            for standby in standbys:
                rows.append(asyncio.run(scenario(bootstrap, size, standby, args.pods,
                                                 args.partitions, args.within,
                                                 args.session_timeout_ms)))  # fmt: skip
    print()
    print(table(rows))
    session = "" if args.session_timeout_ms is None else (
        f", session timeout {args.session_timeout_ms / 1000:g} s"
    )  # fmt: skip
    for row in rows:
        record_row(
            "bench_failover",
            f"2 aggregator processes (the chart's), {row.workloads:,} workloads of {args.pods} "
            f"pods, {args.partitions} partitions, standby replicas {row.standbys}"
            f"{session}: one SIGKILLed, then started again",
            [
                f"kill -> every partition decides again {seconds(row.kill.decides_s)} s "
                f"(noticed {seconds(row.kill.noticed_s)} s, ready {seconds(row.kill.ready_s)} s)",
                f"member added -> decides {seconds(row.add.decides_s)} s",
                f"load average {row.load:.0f} (5 min) at the end of the run",
            ],
            variant=f"{row.workloads}-standby-{row.standbys}{session and '-session'}",
        )


if __name__ == "__main__":
    main()
