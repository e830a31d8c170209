"""Rankers and the faust-streaming aggregator against the project's real Kafka broker, in-process:
a snapshot through every enabled ranker to desired costs equal to ``rank`` + ``label_costs``, a
deadline decision flagged incomplete, dead letters that let everything go on, a ranker restarted
before its commit, an aggregator restarted mid-decision that finds its state in the faust
table's changelog, and the consumer-loop engine over Kafka. Every test has topics, consumer
groups and a faust app id of its own."""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from tests.support.pipeline import (
    AnswersReader,
    Reader,
    eventually,
    expected_costs,
    fresh_kafka_settings,
    running,
)
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator, ranker
from podcost.aggregator import AggregatorService, AggregatorSettings
from podcost.ranker import RankerService, group_of
from podcost.runtime.settings import ServiceSettings
from podcost_bus import KafkaBus, publish_message
from podcost_bus.faust_app import FaustKeyedApp
from podcost_bus.keyed import KeyedConsumerLoop
from podcost_contracts.messages import (
    TRACEPARENT,
    DeadLetter,
    DesiredCostsMessage,
    WorkloadGoneMessage,
    WorkloadSnapshotMessage,
)
from podcost_core.model import Snapshot
from podcost_core.policy import policy_from_annotations

pytestmark = pytest.mark.integration

SETTINGS = ServiceSettings(http_port=0)
CAP, AGE, SPREAD = "capacity-type", "age", "topology-spread"
ANNOTATIONS = {
    "podcost.dev/enabled": "true",
    "podcost.dev/strategies": f"{SPREAD} | {CAP}=3, {AGE}",
}
SNAPSHOT = replace(deployment(pods=6, nodes=6), annotations=ANNOTATIONS)
POLICY = policy_from_annotations(ANNOTATIONS)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACE = {TRACEPARENT: f"00-{TRACE_ID}-00f067aa0ba902b7-01"}


class Kafka:
    """One test's bus, with its own topics, ranker groups and aggregator app id."""

    def __init__(self, bus: KafkaBus, data_dir: Path) -> None:
        self.bus = bus
        self.settings = bus.settings
        self.topics = bus.settings.topics
        self.run = self.settings.client_id.rsplit("-", 1)[-1]
        self.data_dir = data_dir

    def ranker(self, strategy: str) -> RankerService:
        return ranker.bootstrap(SETTINGS, self.settings, strategy=strategy, bus=self.bus)

    def aggregator(self, deadline_s: float = 30.0, engine: str = "faust") -> AggregatorService:
        config = AggregatorSettings(
            deadline_seconds=deadline_s,
            tick_seconds=0.1,
            engine=engine,  # type: ignore[arg-type]
            app_id=f"test-{self.run}-aggregator",
            data_dir=self.data_dir,
            commit_interval_seconds=0.2,
        )
        return aggregator.bootstrap(SETTINGS, self.settings, config=config, bus=self.bus)

    async def publish(self, snapshot: Snapshot = SNAPSHOT, changed_at: float | None = None) -> None:
        message = WorkloadSnapshotMessage.of(
            snapshot, emitted_at=time.time(), changed_at=changed_at
        )
        await publish_message(self.bus, self.topics.workloads, message, trace=TRACE)

    async def gone(self, snapshot: Snapshot = SNAPSHOT) -> None:
        message = WorkloadGoneMessage(
            key=snapshot.workload.key,
            version=snapshot.version + 1,
            reason="deleted",
            emitted_at=time.time(),
        )
        await publish_message(self.bus, self.topics.workloads, message)


@pytest.fixture
async def kafka(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Kafka]:
    settings = fresh_kafka_settings(kafka_bootstrap, "test")
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
        yield Kafka(bus, tmp_path)


def consumed(service: AggregatorService, topic: str, outcome: str = "ok") -> float:
    labels = {"topic": topic, "outcome": outcome}
    return service.metrics.get_sample_value("podcost_messages_consumed_total", labels) or 0


async def test_a_snapshot_goes_through_kafka_rankers_and_the_faust_aggregator_to_the_costs(
    kafka: Kafka,
) -> None:
    combiner = kafka.aggregator()
    assert isinstance(combiner.transport, FaustKeyedApp)
    async with (
        running(kafka.ranker(CAP), kafka.ranker(AGE), kafka.ranker(SPREAD), combiner),
        Reader(kafka.bus, kafka.topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
    ):
        await kafka.publish()
        [decision] = await costs.take(1)
        # Over Kafka its heap keeper takes the collection over once settled ...
        await eventually(lambda: not gc.isenabled(), "the heap keeper's first tick")
    assert gc.isenabled()  # ... and gives it back when the service stops

    assert decision.complete
    assert decision.version == SNAPSHOT.version
    assert {pod.uid: pod.cost for pod in decision.costs} == expected_costs(SNAPSHOT, POLICY)
    assert all(set(pod.breakdown) == {SPREAD, CAP, AGE} for pod in decision.costs)
    [record] = costs.records
    assert record.headers[TRACEPARENT].decode().split("-")[1] == TRACE_ID


async def test_a_strategy_that_does_not_answer_gives_a_deadline_decision_flagged_incomplete(
    kafka: Kafka,
) -> None:
    async with (
        running(kafka.ranker(CAP), kafka.aggregator(deadline_s=1.0)),
        Reader(kafka.bus, kafka.topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
    ):
        started = time.time()
        await kafka.publish()
        [decision] = await costs.take(1)
    assert time.time() - started >= 1.0
    assert (decision.complete, decision.missing) == (False, (AGE,))
    assert all(set(pod.breakdown) == {SPREAD, CAP} for pod in decision.costs)


async def test_undecodable_records_are_dead_lettered_by_every_reader_and_processing_goes_on(
    kafka: Kafka,
) -> None:
    key = SNAPSHOT.workload.key
    rankers = [kafka.ranker(CAP), kafka.ranker(AGE)]
    async with (
        running(*rankers, kafka.aggregator()),
        Reader(kafka.bus, kafka.topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
        Reader(kafka.bus, kafka.topics.deadletter, DeadLetter) as dead,
    ):
        await kafka.bus.publish(kafka.topics.workloads, key, b"{not json")
        await kafka.bus.publish(kafka.topics.ranks, key, b"\xff\xfe")
        await kafka.publish()
        [decision] = await costs.take(1)
        letters = await dead.take(4)

    assert decision.complete
    app_id = f"test-{kafka.run}-aggregator"
    assert sorted((letter.topic, letter.group) for letter in letters) == sorted(
        [
            (kafka.topics.workloads, rankers[0].group),
            (kafka.topics.workloads, rankers[1].group),
            (kafka.topics.workloads, app_id),
            (kafka.topics.ranks, app_id),
        ]
    )
    assert all(letter.reason.startswith("bad JSON") for letter in letters)
    assert {letter.value for letter in letters} == {b"{not json", b"\xff\xfe"}


async def test_a_ranker_restarted_before_committing_ranks_again_and_the_decision_is_unchanged(
    kafka: Kafka,
) -> None:
    v2 = replace(SNAPSHOT, version=SNAPSHOT.version + 1)
    async with (
        running(kafka.ranker(AGE), kafka.aggregator()),
        Reader(kafka.bus, kafka.topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
        AnswersReader(kafka.bus, kafka.topics.ranks) as ranks,
    ):
        await kafka.publish()
        crashing = kafka.ranker(CAP)
        async with kafka.bus.consumer([kafka.topics.workloads], group=group_of(CAP)) as consumer:
            records = await consumer.poll(max_wait=20)
            assert len(records) == 1
            await crashing.process(records)  # published, not committed: then it "dies"
        [first] = await costs.take(1)

        async with running(kafka.ranker(CAP)):  # the restarted ranker reads it again
            answers = await ranks.take(3)
            await kafka.publish(v2)
            [second] = await costs.take(1)

    before, again = [answer for answer in answers if answer.strategy == CAP]
    assert (again.version, again.scores) == (before.version, before.scores)
    assert (first.version, second.version) == (SNAPSHOT.version, v2.version)
    assert {pod.uid: pod.cost for pod in first.costs} == expected_costs(SNAPSHOT, POLICY)


async def test_an_aggregator_restarted_mid_decision_finds_its_state_in_the_faust_changelog(
    kafka: Kafka,
) -> None:
    async with Reader(kafka.bus, kafka.topics.costs_for(CLUSTER), DesiredCostsMessage) as costs:
        first = kafka.aggregator()
        async with running(kafka.ranker(CAP), first):
            await kafka.publish()
            await eventually(
                lambda: consumed(first, kafka.topics.ranks) == 1,
                "the first aggregator to read the capacity-type answer",
            )
        # Stopped with the snapshot and one answer in its table, both in the changelog (a batch
        # is done only once its changelog records are delivered); the second finds them there.
        # Whether the stop also committed the source offsets is another matter: at least once, a
        # clean stop may leave its last batch to be read again (seen in about 3 runs of 8 of
        # this test alone), which the recovered state then takes as a duplicate.
        key = SNAPSHOT.workload.key.encode()
        assert await _changelog_keys(kafka, first) == {key}
        # The last answer comes once it is ready: one arriving during faust's table recovery can
        # be skipped until the next restart (podcost_bus.faust_app, "Skipped records").
        second = kafka.aggregator()
        async with running(second):
            assert key in _stored_keys(second)  # recovered before the last answer exists
            async with running(kafka.ranker(AGE)):
                [decision] = await costs.take(1)
    assert decision.complete
    assert {pod.uid: pod.cost for pod in decision.costs} == expected_costs(SNAPSHOT, POLICY)


async def test_the_consumer_loop_engine_over_kafka_decides_the_same(kafka: Kafka) -> None:
    combiner = kafka.aggregator(engine="consumer")
    assert isinstance(combiner.transport, KeyedConsumerLoop)
    async with (
        running(kafka.ranker(CAP), kafka.ranker(AGE), combiner),
        Reader(kafka.bus, kafka.topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
    ):
        await kafka.publish()
        [decision] = await costs.take(1)
    assert decision.complete
    assert {pod.uid: pod.cost for pod in decision.costs} == expected_costs(SNAPSHOT, POLICY)


async def _changelog_keys(kafka: Kafka, service: AggregatorService) -> set[bytes]:
    """The keys of the records in every changelog topic of ``service``'s tables (each must
    hold the same keys: a state's parts)."""
    transport = service.transport
    assert isinstance(transport, FaustKeyedApp)
    found: list[set[bytes]] = []
    for topic in transport.changelog_topics():
        async with kafka.bus.consumer([topic], group=f"test-{kafka.run}-{topic}") as consumer:
            records = await consumer.poll(max_wait=20)
        found.append({record.key for record in records if record.key is not None})
    assert all(keys == found[0] for keys in found), found
    return found[0]


def _stored_keys(service: AggregatorService) -> set[bytes]:
    transport = service.transport
    assert isinstance(transport, FaustKeyedApp)
    return {key for table in transport.tables.values() for key in table}


async def test_a_workload_gone_leaves_the_faust_tables_and_their_changelog_and_rankers_skip_it(
    kafka: Kafka,
) -> None:
    key = SNAPSHOT.workload.key.encode()
    changed_at = time.time() - 3.0
    rankers = [kafka.ranker(CAP), kafka.ranker(AGE)]
    first = kafka.aggregator()
    async with (
        Reader(kafka.bus, kafka.topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
        AnswersReader(kafka.bus, kafka.topics.ranks) as ranks,
        Reader(kafka.bus, kafka.topics.deadletter, DeadLetter) as dead,
    ):
        async with running(*rankers, first):
            await kafka.publish(changed_at=changed_at)
            [decision] = await costs.take(1)
            await ranks.take(2)
            # The state is stored once the costs are acknowledged, so a reader may see them a
            # moment before the table holds it (failed once so under `make test`).
            await eventually(lambda: key in _stored_keys(first), "the state to be stored")
            await kafka.gone()
            await eventually(lambda: key not in _stored_keys(first), "the state to be dropped")
            await ranks.nothing_more(1.0)  # the rankers read it and answer nothing
            await dead.nothing_more(0.1)  # ... and do not dead-letter it either
            assert consumed(first, kafka.topics.workloads) == 2
        # Restarted, the aggregator recovers its tables from the changelog: the tombstones
        # there keep the workload forgotten.
        second = kafka.aggregator()
        async with running(second):
            assert _stored_keys(second) == set()
            assert consumed(second, kafka.topics.workloads) == 0
    assert decision.changed_at == changed_at
    for ranker_service in rankers:
        labels = {"topic": kafka.topics.workloads, "outcome": "ok"}
        registry = ranker_service.metrics
        assert registry.get_sample_value("podcost_messages_consumed_total", labels) == 2
