"""A standby replica makes an aggregator's takeover read none of the dead member's changelog again.

Two ``podcost aggregator`` processes run as the Helm chart's core mode starts them
(``tests.support.services.chart_specs``; no rankers: the test publishes every answer itself), on
the real broker, with topics of four partitions and the chart's ``aggregator.standbyReplicas``
set to 1 or 0. Every partition gets the states of several workloads:

1. version 1 of each workload and every strategy's answer, partition by partition, so that the
   member whose ``podcost_messages_consumed_total`` grows is known to own that partition;
2. version 2 of each workload and every answer but one (:data:`WITHHELD`): each state waits for
   that answer, far from its deadline, and the group commits every source record, so nothing
   after the crash reads those records again: what is decided next can only come from the state
   the changelogs hold.

Then one member is SIGKILLed, the withheld answers are published, and the survivor decides
version 2 of every workload, its partitions and the dead member's. The oracle is the pure core
(``podcost_core.aggregate.Aggregator`` with the chart's policy) given the same decoded snapshots
and answers: every decision on the costs topic must equal its decision.

How much the survivor's takeover read is ``podcost_aggregator_recovery_records_total`` (the
changelog records its recovery took, by role of their partition), against the records the
dead member's changelog partitions hold (their end offsets on the broker):

- with a standby, the survivor followed those partitions all along (its ``standby`` count is
  every one of their records) and its recovery of them as ``active`` took none;
- with none, the same takeover took every record of those partitions: the contrast shows that
  the count measures the standby's effect, not an artefact of the scenario.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from tests.support.pipeline import fresh_kafka_bus
from tests.support.services import ServiceProcess, chart_policy, chart_specs, processes
from tests.support.snapshots import reshuffled
from tests.support.snapshots import snapshot as deployment
from tests.support.tools import require_helm

from podcost_bus import Consumer, KafkaBus
from podcost_bus.admin import FleetAdmin
from podcost_bus.faust_adaptations import ACTIVE, STANDBY
from podcost_bus.kafka import key_partition
from podcost_contracts.messages import (
    DesiredCostsMessage,
    StrategyRanksMessage,
    WorkloadSnapshotMessage,
    decode,
    encode,
)
from podcost_core.aggregate import (
    STATE_PARTS,
    AggregationConfig,
    Aggregator,
    PolicyResolver,
    WorkloadState,
)
from podcost_core.model import PodUID, Snapshot
from podcost_core.strategies.registry import default_registry

pytestmark = pytest.mark.integration

PARTITIONS = 4
PER_PARTITION = 6
"""Workloads whose key falls in each partition of the workloads topic."""
PODS = 12
NODES = 6
DEADLINE_S = 900
"""The aggregator's deadline: beyond the test, so nothing is decided without every answer."""
READY_TIMEOUT_S = 240
"""Starting a process on a loaded 2-core machine (imports, joining the group) is slow."""
WAIT_S = 120.0
"""How long any one awaited condition may take (the crash's session timeout included)."""
CLUSTER = "prod-eu-1"

POLICY = chart_policy()
RESOLVER = PolicyResolver(POLICY, registry=default_registry())
WITHHELD = POLICY.ranked[-1]
"""The strategy whose answer for version 2 is published only after the crash."""

Essence = tuple[int, bool, tuple[str, ...], dict[PodUID, tuple[int, int | None, Any]]]


# --- the workloads and the oracle --------------------------------------------------------------


def workload_names() -> dict[int, list[str]]:
    """:data:`PER_PARTITION` workload names per partition of the workloads topic."""
    found: dict[int, list[str]] = defaultdict(list)
    index = 0
    while any(len(found[p]) < PER_PARTITION for p in range(PARTITIONS)):
        name = f"web-{index:03d}"
        key = version_of(name, 1).workload.key.encode()
        partition = key_partition(key, PARTITIONS)
        if len(found[partition]) < PER_PARTITION:
            found[partition].append(name)
        index += 1
    return dict(found)


def version_of(name: str, version: int) -> Snapshot:
    """Version ``version`` of workload ``name``: the same pods each time, on other nodes, with
    other priorities, restarts and current costs, so that each version decides otherwise."""
    base = deployment(name, pods=PODS, nodes=NODES, version=version, seed=int(name.split("-")[1]))
    base = replace(base, workload=replace(base.workload, cluster=CLUSTER))
    return reshuffled(base, random.Random(f"{name}/{version}"))


@dataclass(frozen=True)
class Published:
    """One version of one workload as it went on the bus, decoded as a reader decodes it."""

    snapshot: Snapshot
    answers: dict[str, StrategyRanksMessage]


def messages(name: str, version: int) -> tuple[WorkloadSnapshotMessage, list[StrategyRanksMessage]]:
    """The snapshot message of a version and every ranked strategy's answer to it."""
    snapshot = version_of(name, version)
    answers = [
        StrategyRanksMessage(
            key=snapshot.workload.key,
            version=version,
            strategy=bound.name,
            scores=dict(bound.strategy.score(snapshot, bound.args)),
            duration_seconds=0.0,
            emitted_at=time.time(),
        )
        for bound in RESOLVER.of(snapshot).bound
        if not bound.strategy.spread
    ]
    return WorkloadSnapshotMessage.of(snapshot, emitted_at=time.time()), answers


def oracle(published: Published) -> Essence:
    """What the pure core decides for ``published`` once every answer is in."""
    aggregator = Aggregator(AggregationConfig(deadline_s=DEADLINE_S), RESOLVER)
    snapshot = published.snapshot
    state = aggregator.on_snapshot(
        WorkloadState(snapshot.workload.key), snapshot, emitted_at=1.0, now=1.0
    ).state
    for name, answer in published.answers.items():
        state = aggregator.on_ranks(
            state, strategy=name, version=snapshot.version, scores=answer.scores, now=1.0
        ).state
    _, decision = aggregator.due(state, 1.0)
    assert decision is not None, f"the core decides nothing for {snapshot.workload.key}"
    pods = {
        pod.pod.uid: (
            pod.cost,
            pod.previous,
            sorted((t.strategy, t.normalized, t.weight, t.tier, t.raw) for t in pod.breakdown),
        )
        for pod in decision.pods()
    }
    return decision.version, decision.complete, decision.missing, pods


def essence(decision: DesiredCostsMessage) -> Essence:
    """What a decision on the costs topic decides, as :func:`oracle` says it."""
    pods = {
        pod.uid: (
            pod.cost,
            pod.previous,
            sorted(
                (name, term.normalized, term.weight, term.tier, term.raw)
                for name, term in pod.breakdown.items()
            ),
        )
        for pod in decision.costs
    }
    return decision.version, decision.complete, decision.missing, pods


# --- the bus -----------------------------------------------------------------------------------


class Costs:
    """Every decision on the costs topic, by workload and version."""

    def __init__(self) -> None:
        self.decisions: dict[tuple[str, int], list[DesiredCostsMessage]] = defaultdict(list)
        self._arrived = asyncio.Event()

    async def read(self, consumer: Consumer) -> None:
        while True:
            for record in await consumer.poll(max_wait=0.5):
                decision = decode(DesiredCostsMessage, record.value, record.headers, key=record.key)
                self.decisions[decision.key, decision.version].append(decision)
                self._arrived.set()

    async def wait(self, wanted: Iterable[tuple[str, int]], what: str) -> None:
        """Until every one of ``wanted`` (key, version) is decided."""
        wanted = set(wanted)
        deadline = time.monotonic() + WAIT_S
        while missing := wanted - set(self.decisions):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{what}: no decision for {sorted(missing)} in {WAIT_S}s")
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                continue


class Publisher:
    """Publishes snapshots and answers, keeping what was published decoded as the aggregator
    reads it, and the next offset of every source partition written."""

    def __init__(self, bus: KafkaBus) -> None:
        self.bus = bus
        self.published: dict[tuple[str, int], Published] = {}
        self.ends: dict[tuple[str, int], int] = {}

    async def send(self, topic: str, message: Any) -> None:
        encoded = encode(message)
        delivery = await self.bus.publish(topic, encoded.key, encoded.value, encoded.headers)
        tp = (delivery.topic, delivery.partition)
        self.ends[tp] = max(self.ends.get(tp, 0), delivery.offset + 1)
        decoded = decode(type(message), encoded.value, encoded.headers, key=encoded.key)
        if isinstance(decoded, WorkloadSnapshotMessage):
            key = (decoded.key, decoded.snapshot.version)
            self.published[key] = Published(decoded.snapshot, {})
        else:
            assert isinstance(decoded, StrategyRanksMessage)
            self.published[decoded.key, decoded.version].answers[decoded.strategy] = decoded

    async def version(self, name: str, version: int, *, withhold: str | None = None) -> str:
        """A workload's version and its answers but ``withhold``'s; returns the key."""
        snapshot, answers = messages(name, version)
        topics = self.bus.settings.topics
        await self.send(topics.workloads, snapshot)
        for answer in answers:
            if answer.strategy != withhold:
                await self.send(topics.ranks, answer)
        return snapshot.key


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Return once ``check()`` holds; fail naming ``what`` after :data:`WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_S}s waiting for {what}")
        await asyncio.sleep(0.25)


async def end_offsets(bootstrap: str, topics: Iterable[str]) -> dict[tuple[str, int], int]:
    """The end offset of every partition of ``topics``, as the broker says now."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [KafkaTopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def taken(process: ServiceProcess, role: str) -> float:
    """The changelog records ``process``'s recovery took of partitions of ``role``."""
    return await process.sample("podcost_aggregator_recovery_records_total", role=role)


# --- the scenario ------------------------------------------------------------------------------


@dataclass
class Takeover:
    """What one run saw."""

    standbys: int
    victim_partitions: set[int]
    victim_records: int
    """The records of the dead member's changelog partitions (all parts)."""
    all_records: int
    """The records of every changelog partition."""
    standby_before: float
    """The survivor's standby records at the crash."""
    active_read: float
    """The records the survivor's recovery took as active, from the crash on."""
    wrong: list[tuple[str, int]]
    decided_again: int
    """Workloads of the dead member's partitions decided again after the crash."""
    ready_s: float
    """From the start of the run until both members were ready."""
    takeover_s: float
    """From the crash until every workload's version 2 was decided."""
    seconds: float


async def take_over(bootstrap: str, log_dir: Path, standbys: int) -> Takeover:
    """The scenario of the module docstring with ``standbys`` standby replicas, on topics and
    an app id of its own."""
    async with fresh_kafka_bus(
        bootstrap, "standby", partitions=PARTITIONS, clusters=(CLUSTER,)
    ) as kafka:
        return await _take_over(kafka, bootstrap, log_dir, standbys)


async def _take_over(kafka: KafkaBus, bootstrap: str, log_dir: Path, standbys: int) -> Takeover:
    started = time.monotonic()
    settings = kafka.settings
    topics = settings.topics
    values = {
        "mode": "core",
        "kafka": {
            "bootstrapServers": bootstrap,
            "partitions": PARTITIONS,
            "topics": {
                "workloads": settings.topic_workloads,
                "ranks": settings.topic_ranks,
                "costs": settings.topic_costs,
                "deadletter": settings.topic_deadletter,
            },
        },
        "aggregator": {
            "replicaCount": 2,
            "deadlineSeconds": DEADLINE_S,
            "standbyReplicas": standbys,
        },
    }
    specs = [s for s in chart_specs(require_helm(), values) if s.args[0] == "aggregator"]
    # A faust app id of this run's own: it names the consumer group and the changelog topics.
    app_id = f"standby-{uuid.uuid4().hex[:8]}-aggregator"
    changelogs = [f"{app_id}-{part}-changelog" for part in STATE_PARTS]
    names = workload_names()
    publisher = Publisher(kafka)
    costs = Costs()
    async with (
        processes(
            specs, env={"PODCOST_AGGREGATOR_APP_ID": app_id}, log_dir=log_dir,
            ready_timeout=READY_TIMEOUT_S,
        ) as running,
        kafka.consumer([topics.costs_for(CLUSTER)], group=f"test-{uuid.uuid4().hex}") as reader,
        FleetAdmin(settings) as admin,
    ):  # fmt: skip
        members = [running["aggregator#1"], running["aggregator#2"]]
        ready_s = time.monotonic() - started
        reading = asyncio.create_task(costs.read(reader))
        try:
            # 1. Version 1 everywhere, a partition at a time: whose consumption grows owns it.
            owner: dict[int, ServiceProcess] = {}
            for partition, workloads in sorted(names.items()):
                before = [await m.sample("podcost_messages_consumed_total",
                                         topic=topics.workloads) for m in members]  # fmt: skip
                keys = [await publisher.version(name, 1) for name in workloads]
                await costs.wait([(key, 1) for key in keys], f"version 1 of partition {partition}")
                after = [await m.sample("podcost_messages_consumed_total",
                                        topic=topics.workloads) for m in members]  # fmt: skip
                grew = [m for m, b, a in zip(members, before, after, strict=True) if a > b]
                assert len(grew) == 1, f"partition {partition} read by {grew}"
                owner[partition] = grew[0]
            assert {*owner.values()} == {*members}, "one member owns every partition"

            # 2. Version 2 everywhere, one answer withheld: every state waits, far from its
            #    deadline, and its source records are committed, never to be read again.
            keys_by_partition = {
                partition: [await publisher.version(name, 2, withhold=WITHHELD)
                            for name in workloads]
                for partition, workloads in names.items()
            }  # fmt: skip

            async def committed() -> bool:
                for topic in (topics.workloads, topics.ranks):
                    done = await admin.committed(app_id, topic)
                    ends = {p: end for (t, p), end in publisher.ends.items() if t == topic}
                    if any(done.get(p, -1) < end for p, end in ends.items()):
                        return False
                return True

            await until(committed, "the aggregators to commit every record published")
            assert not any(version == 2 for _, version in costs.decisions)

            # 3. The standby copies hold every changelog record (the states, version 2's
            #    included, went to the changelogs before their source records were committed).
            ends = await end_offsets(bootstrap, changelogs)
            all_records = sum(ends.values())
            victim, survivor = members[1], members[0]
            victim_partitions = {p for p, member in owner.items() if member is victim}
            victim_records = sum(end for (_, p), end in ends.items() if p in victim_partitions)
            if standbys:

                async def copied() -> bool:
                    copies = [await taken(m, STANDBY) for m in members]
                    return sum(copies) >= all_records

                await until(copied, "the standbys to follow every changelog record")
            standby_before = await taken(survivor, STANDBY)
            active_before = await taken(survivor, ACTIVE)

            # 4. The crash, then the withheld answers: version 2 is decided everywhere, from the
            #    states the survivor holds or recovered for the dead member's partitions.
            killed_at = time.monotonic()
            victim.kill()
            await victim.stop()
            for name in (name for workloads in names.values() for name in workloads):
                _, answers = messages(name, 2)
                [last] = [answer for answer in answers if answer.strategy == WITHHELD]
                await publisher.send(topics.ranks, last)
            every = [(key, 2) for keys in keys_by_partition.values() for key in keys]
            await costs.wait(every, "version 2 after the crash")
            takeover_s = time.monotonic() - killed_at
            await survivor.wait_ready(WAIT_S)
            active_read = await taken(survivor, ACTIVE) - active_before
            assert survivor.alive, survivor.log_tail()
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)

    wrong = [
        (key, version)
        for (key, version), decisions in costs.decisions.items()
        for decision in decisions
        if essence(decision) != oracle(publisher.published[key, version])
    ]
    assert set(costs.decisions) == set(publisher.published), "every version, nothing else"
    return Takeover(
        standbys=standbys,
        victim_partitions=victim_partitions,
        victim_records=victim_records,
        all_records=all_records,
        standby_before=standby_before,
        active_read=active_read,
        wrong=wrong,
        decided_again=sum(len(keys_by_partition[p]) for p in victim_partitions),
        ready_s=ready_s,
        takeover_s=takeover_s,
        seconds=time.monotonic() - started,
    )


def report(run: Takeover) -> str:
    return (
        f"\nstandby replicas {run.standbys}: the dead member held partitions "
        f"{sorted(run.victim_partitions)} ({run.victim_records} of {run.all_records} changelog "
        f"records); the survivor had followed {run.standby_before:.0f} as a standby and its "
        f"takeover read {run.active_read:.0f}; {run.decided_again} workloads of those "
        f"partitions decided again {run.takeover_s:.1f}s after the crash; members ready after "
        f"{run.ready_s:.1f}s; {run.seconds:.1f}s in all"
    )


async def test_after_a_crash_the_survivor_decides_as_the_core_does_reading_what_its_standby_lacked(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # The two runs at once: most of each is waiting (processes starting, the session timeout).
    standby, alone = await asyncio.gather(
        take_over(kafka_bootstrap, tmp_path / "standby", standbys=1),
        take_over(kafka_bootstrap, tmp_path / "alone", standbys=0),
    )
    print(report(standby), report(alone))
    for run in (standby, alone):
        assert run.victim_partitions, "the dead member owned partitions"
        assert run.decided_again >= PER_PARTITION
        assert run.wrong == [], f"decisions that differ from the pure core's: {run.wrong}"
        assert run.victim_records > 0
    # With a standby, the survivor had taken every record of the dead member's partitions, and
    # its takeover took none of them again.
    assert standby.standby_before == standby.victim_records
    assert standby.active_read == 0
    # Without, the same takeover took every one of them.
    assert alone.standby_before == 0
    assert alone.active_read == alone.victim_records
