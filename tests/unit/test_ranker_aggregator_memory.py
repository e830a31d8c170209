"""Rankers and the aggregator over the in-memory bus with a fake clock (embedded mode's transport):
a snapshot through every enabled ranker to desired costs, the deadline, dead letters, a ranker
restarted before its commit, a plugin strategy, start-up errors, and the trace of a decision.
The same flow over the real broker is ``tests/integration/test_ranker_aggregator.py``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.support.clock import FakeClock
from tests.support.pipeline import (
    AnswersReader,
    Reader,
    answers_of,
    eventually,
    expected_costs,
    running,
)
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment
from tests.support.tasks import leak_check

from podcost import aggregator, ranker
from podcost.aggregator import AggregatorService, AggregatorSettings
from podcost.ranker import RankerService, RankerSettings, group_of
from podcost.ranker import outbox as ranker_outbox
from podcost.ranker.outbox import BATCH_MAX_ANSWERS, RanksOutbox
from podcost.runtime.metrics import Families
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import (
    ATTR_COMPLETE,
    ATTR_COST,
    ATTR_MISSING,
    ATTR_POD,
    ATTR_RANK,
    ATTR_STRATEGY,
    ATTR_VERSION,
    ATTR_WORKLOAD,
    SPAN_COMBINE,
    SPAN_STRATEGY,
)
from podcost_bus import BusSettings, MemoryBus, Record, publish_message
from podcost_bus.keyed import KeyedConsumerLoop
from podcost_contracts import messages
from podcost_contracts.messages import (
    GONE_UNLISTED,
    TRACEPARENT,
    DeadLetter,
    DesiredCostsMessage,
    Encoded,
    MessageTooLarge,
    RankedWorkload,
    RanksBatchMessage,
    ReleaseCostsMessage,
    StrategyAnswer,
    StrategyRanksBatchMessage,
    WorkloadGoneMessage,
    WorkloadSnapshotMessage,
    decode,
    decode_costs_record,
    decode_ranks_record,
    encode,
    keep_decoded_snapshots,
    live_set_key,
)
from podcost_core.aggregate import WorkloadState
from podcost_core.model import PodUID, Snapshot
from podcost_core.policy import PolicyError, policy_from_annotations
from podcost_core.strategies.base import Strategy
from podcost_core.strategies.registry import Registry, UnknownStrategyError, build_registry

SETTINGS = ServiceSettings(http_port=0)
BUS = BusSettings()
TOPICS = BUS.topics
COSTS = TOPICS.costs_for(CLUSTER)  # every snapshot here is of the fixtures' one cluster
CAP, AGE, SPREAD = "capacity-type", "age", "topology-spread"
POLICY_TEXT = f"{SPREAD} | {CAP}=3, {AGE}"
ANNOTATIONS = {"podcost.dev/enabled": "true", "podcost.dev/strategies": POLICY_TEXT}
SNAPSHOT = replace(deployment(pods=6, nodes=6), annotations=ANNOTATIONS)
POLICY = policy_from_annotations(ANNOTATIONS)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACE = {TRACEPARENT: f"00-{TRACE_ID}-{PARENT_ID}-01"}
START = 1_714_568_400.0


@dataclass
class World:
    """One in-memory bus, a fake clock and an in-memory span exporter, shared by the services."""

    bus: MemoryBus
    clock: FakeClock
    spans: InMemorySpanExporter
    provider: TracerProvider
    registry: Registry | None = None

    def ranker(
        self,
        strategy: str,
        settings: ServiceSettings = SETTINGS,
        outbox: RanksOutbox | None = None,
        families: Families | None = None,
    ) -> RankerService:
        return ranker.bootstrap(
            settings, BUS, strategy=strategy, bus=self.bus, clock=self.clock,
            registry=self.registry, tracer_provider=self.provider, outbox=outbox,
            families=families,
        )  # fmt: skip

    def aggregator(self, deadline_s: float = 5.0) -> AggregatorService:
        return aggregator.bootstrap(
            SETTINGS, BUS, config=AggregatorSettings(deadline_seconds=deadline_s), bus=self.bus,
            clock=self.clock, registry=self.registry, tracer_provider=self.provider,
        )  # fmt: skip

    async def publish(
        self,
        snapshot: Snapshot = SNAPSHOT,
        trace: dict[str, str] = TRACE,
        changed_at: float | None = None,
    ) -> None:
        message = WorkloadSnapshotMessage.of(
            snapshot, emitted_at=self.clock.now(), changed_at=changed_at
        )
        await publish_message(self.bus, TOPICS.workloads, message, trace=trace)

    async def gone(self, version: int, emitted_at: float, reason: str = "deleted") -> None:
        message = WorkloadGoneMessage(
            key=SNAPSHOT.workload.key, version=version, reason=reason, emitted_at=emitted_at
        )
        await publish_message(self.bus, TOPICS.workloads, message)


@pytest.fixture
def world() -> Iterator[World]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield World(MemoryBus(clock=lambda: START), FakeClock(START), spans, provider)
    provider.shutdown()


def counted(service: RankerService | AggregatorService, name: str, **labels: str) -> float:
    return service.metrics.get_sample_value(name, labels) or 0.0


async def test_a_snapshot_goes_through_every_enabled_ranker_to_the_costs_rank_would_give(
    world: World,
) -> None:
    rankers = [world.ranker(name) for name in (CAP, AGE, SPREAD, "priority-qos")]
    combiner = world.aggregator()
    async with (
        leak_check(),
        running(*rankers, combiner),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        AnswersReader(world.bus, TOPICS.ranks) as ranks,
    ):
        await world.publish()
        [decision] = await costs.take(1)
        answers = await ranks.take(2)
        await ranks.nothing_more(0.2)  # not enabled (priority-qos) or levelled by the aggregator

    assert sorted(answer.strategy for answer in answers) == [AGE, CAP]
    assert decision.key == SNAPSHOT.workload.key
    assert decision.version == SNAPSHOT.version
    assert decision.complete
    assert decision.missing == ()
    assert {pod.uid: pod.cost for pod in decision.costs} == expected_costs(SNAPSHOT, POLICY)
    assert {pod.uid: pod.previous for pod in decision.costs} == {
        pod.uid: pod.deletion_cost for pod in SNAPSHOT.pods
    }
    assert all(set(pod.breakdown) == {SPREAD, CAP, AGE} for pod in decision.costs)
    assert counted(combiner, "podcost_combinations_total", completeness="complete") == 1
    assert counted(rankers[0], "podcost_snapshots_ranked_total", strategy=CAP) == 1
    assert counted(rankers[0], "podcost_strategy_duration_seconds_count", strategy=CAP) == 1
    assert counted(rankers[3], "podcost_snapshots_ranked_total", strategy="priority-qos") == 0


async def test_rankers_sharing_a_process_answer_in_one_record_and_decide_as_rank_would(
    world: World,
) -> None:
    families = Families()
    outbox = ranker.shared_outbox(SETTINGS, BUS, bus=world.bus, families=families)
    rankers = [world.ranker(name, outbox=outbox, families=families) for name in (CAP, AGE, SPREAD)]
    combiner = world.aggregator()
    async with (
        leak_check(),
        running(*rankers, combiner),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
    ):
        await world.publish()
        [decision] = await costs.take(1)

    [record] = world.bus.records(TOPICS.ranks)
    message = decode_ranks_record(record.value, record.headers, key=record.key)
    assert isinstance(message, RanksBatchMessage)
    assert sorted(answer.strategy for answer in message.answers) == [AGE, CAP]
    assert decision.complete
    assert {pod.uid: pod.cost for pod in decision.costs} == expected_costs(SNAPSHOT, POLICY)
    # The record is counted once, as the process's; each strategy counts what it ranked.
    produced = "podcost_messages_produced_total"
    assert counted(rankers[0], produced, component="rankers", topic=TOPICS.ranks) == 1
    assert counted(rankers[0], produced, topic=TOPICS.ranks) == 0  # none as one strategy's
    for service, name in zip(rankers, (CAP, AGE), strict=False):
        assert counted(service, "podcost_snapshots_ranked_total", strategy=name) == 1


async def test_the_costs_published_are_counted_by_the_costs_topic_of_their_cluster(
    world: World,
) -> None:
    other = replace(SNAPSHOT, workload=replace(SNAPSHOT.workload, cluster="eu-2"))
    rankers = [world.ranker(name) for name in (CAP, AGE, SPREAD)]
    combiner = world.aggregator()
    async with (
        leak_check(),
        running(*rankers, combiner),
        Reader(world.bus, COSTS, DesiredCostsMessage) as ours,
        Reader(world.bus, TOPICS.costs_for("eu-2"), DesiredCostsMessage) as theirs,
    ):
        await world.publish()
        await world.publish(other)
        await ours.take(1)
        await theirs.take(1)

    produced = "podcost_messages_produced_total"
    assert counted(combiner, produced, topic=COSTS) == 1
    assert counted(combiner, produced, topic=TOPICS.costs_for("eu-2")) == 1
    assert counted(combiner, produced, topic=TOPICS.costs) == 0  # the prefix is no topic


async def test_every_step_of_a_decision_is_a_span_of_the_snapshot_trace(world: World) -> None:
    async with (
        running(world.ranker(CAP), world.ranker(AGE), world.aggregator()),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        AnswersReader(world.bus, TOPICS.ranks) as ranks,
    ):
        await world.publish()
        await costs.take(1)
        await ranks.take(2)

    spans = world.spans.get_finished_spans()
    strategies = [span for span in spans if span.name == SPAN_STRATEGY]
    [combined] = [span for span in spans if span.name == SPAN_COMBINE]
    for span in [*strategies, combined]:
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert span.parent is not None
        assert format(span.parent.span_id, "016x") == PARENT_ID
        assert span.attributes is not None
        assert span.attributes[ATTR_WORKLOAD] == SNAPSHOT.workload.key
        assert span.attributes[ATTR_VERSION] == SNAPSHOT.version
    assert sorted(str((span.attributes or {})[ATTR_STRATEGY]) for span in strategies) == [AGE, CAP]
    assert (combined.attributes or {})[ATTR_COMPLETE] is True
    # Every pod's rank and cost, aligned arrays (a pod's name is namespace/name).
    attributes = combined.attributes or {}
    names = [f"{pod.namespace}/{pod.name}" for pod in SNAPSHOT.pods]
    assert sorted(attributes[ATTR_POD]) == sorted(names)  # type: ignore[arg-type]
    assert len(attributes[ATTR_RANK]) == len(attributes[ATTR_COST]) == len(names)  # type: ignore[arg-type]
    # The published costs carry the context of the span that made them, and so does each answer
    # in the rankers' batches.
    own = {span.context.span_id: span for span in spans}
    carriers = [(SPAN_COMBINE, record.headers[TRACEPARENT].decode()) for record in costs.records]
    for record in ranks.records:
        batch = decode(StrategyRanksBatchMessage, record.value, record.headers, key=record.key)
        carriers.extend((SPAN_STRATEGY, answer.trace[TRACEPARENT]) for answer in batch.answers)
    assert len(carriers) == len(costs.records) + 2
    for name, traceparent in carriers:
        _, trace_id, span_id, _ = traceparent.split("-")
        assert trace_id == TRACE_ID
        assert own[int(span_id, 16)].name == name


async def test_a_strategy_that_does_not_answer_gives_a_deadline_decision_flagged_incomplete(
    world: World,
) -> None:
    combiner = world.aggregator(deadline_s=5.0)
    async with (
        leak_check(),
        running(world.ranker(CAP), combiner),  # no age ranker
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
    ):
        await world.publish()
        await eventually(
            lambda: counted(combiner, "podcost_messages_consumed_total", topic=TOPICS.ranks,
                            outcome="ok") == 1,
            "the aggregator to read the capacity-type answer",
        )  # fmt: skip
        await world.clock.advance(4.5)
        await costs.nothing_more(0.1)
        await world.clock.advance(0.5)
        [decision] = await costs.take(1)

    assert not decision.complete
    assert decision.missing == (AGE,)
    assert all(set(pod.breakdown) == {SPREAD, CAP} for pod in decision.costs)
    assert len(decision.costs) == len(SNAPSHOT.pods)
    assert counted(combiner, "podcost_combinations_total", completeness="deadline") == 1
    spans = world.spans.get_finished_spans()
    [combined] = [span for span in spans if span.name == SPAN_COMBINE]
    assert (combined.attributes or {})[ATTR_COMPLETE] is False
    assert (combined.attributes or {})[ATTR_MISSING] == (AGE,)


async def test_every_reader_s_dead_letter_series_is_exported_at_zero_before_the_first(
    world: World,
) -> None:
    """An alert reads ``increase()`` of the dead letters: a series born at 1 shows none."""
    ranker, combiner = world.ranker(AGE), world.aggregator()
    async with running(ranker, combiner):
        dead = {"outcome": "dead_letter"}
        assert (
            ranker.metrics.get_sample_value(
                "podcost_messages_consumed_total", {"topic": TOPICS.workloads, **dead}
            )
            == 0.0
        )
        for topic in (TOPICS.workloads, TOPICS.ranks):
            assert (
                combiner.metrics.get_sample_value(
                    "podcost_messages_consumed_total", {"topic": topic, **dead}
                )
                == 0.0
            )


async def test_undecodable_records_are_dead_lettered_and_the_pipeline_goes_on(
    world: World,
) -> None:
    rankers = [world.ranker(CAP), world.ranker(AGE)]
    combiner = world.aggregator()
    key = SNAPSHOT.workload.key
    async with (
        running(*rankers, combiner),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        Reader(world.bus, TOPICS.deadletter, DeadLetter) as dead,
    ):
        await world.bus.publish(TOPICS.workloads, key, b"{not json")
        await world.bus.publish(TOPICS.ranks, key, b'{"schema_version": 1}')
        await world.publish()
        [decision] = await costs.take(1)
        letters = await dead.take(4)

    assert decision.complete
    assert sorted(letter.group for letter in letters) == sorted(
        [group_of(CAP), group_of(AGE), "podcost-aggregator", "podcost-aggregator"]
    )
    bad_json = [letter for letter in letters if letter.topic == TOPICS.workloads]
    assert all(letter.reason.startswith("bad JSON") for letter in bad_json)
    [bad_ranks] = [letter for letter in letters if letter.topic == TOPICS.ranks]
    assert bad_ranks.reason.startswith("invalid strategy-ranks")
    assert counted(combiner, "podcost_messages_consumed_total", topic=TOPICS.workloads,
                   outcome="dead_letter") == 1  # fmt: skip


async def test_a_ranker_answers_many_workloads_in_a_record_per_partition_and_each_is_decided(
    world: World,
) -> None:
    # 150 workloads: more answers than a record holds (BATCH_MAX_ANSWERS) in some partition.
    snapshots = [
        replace(deployment(f"app-{index}", pods=3, nodes=3, seed=index), annotations=ANNOTATIONS)
        for index in range(150)
    ]
    partition_of = {item.workload.key: world.bus.partition_of(item.workload.key.encode())
                    for item in snapshots}  # fmt: skip
    async with (
        leak_check(),
        running(world.ranker(CAP), world.ranker(AGE), world.aggregator()),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        AnswersReader(world.bus, TOPICS.ranks) as ranks,
    ):
        for item in snapshots:
            await world.publish(item)
        decisions = await costs.take(len(snapshots), timeout=60)
        await ranks.take(2 * len(snapshots))
        await ranks.nothing_more(0.2)

    assert {decision.key for decision in decisions} == set(partition_of)
    for decision in decisions:
        item = next(s for s in snapshots if s.workload.key == decision.key)
        assert decision.complete
        assert {pod.uid: pod.cost for pod in decision.costs} == expected_costs(item, POLICY)
    # Fewer records than answers: per strategy, a record per partition read (and per
    # BATCH_MAX_ANSWERS), each holding only workloads of the partition it is on.
    assert len(ranks.records) < 2 * len(snapshots) / 10
    for record in ranks.records:
        batch = decode(StrategyRanksBatchMessage, record.value, record.headers, key=record.key)
        assert len(batch.answers) <= BATCH_MAX_ANSWERS
        assert {partition_of[answer.key] for answer in batch.answers} == {record.partition}
    assert max(partition_of.values()) > 0  # the workloads are spread over the partitions


async def test_the_answer_to_a_misrouted_snapshot_goes_to_its_workloads_partition(
    world: World,
) -> None:
    # A snapshot on a partition its key does not hash to (not what the watcher publishes): its
    # answer goes where its workload's state is, and does not take the partition's other
    # answers there with it.
    other = replace(deployment("neighbour", pods=3, nodes=3), annotations=ANNOTATIONS)
    home = world.bus.partition_of(SNAPSHOT.workload.key.encode())
    there = world.bus.partition_of(other.workload.key.encode())
    wrong = next(partition for partition in range(3) if partition != home)
    records = []
    for item, partition in ((other, there), (SNAPSHOT, wrong)):
        encoded = encode(WorkloadSnapshotMessage.of(item, emitted_at=START))
        records.append(Record(TOPICS.workloads, partition, 0, encoded.key, encoded.value,
                              encoded.headers))  # fmt: skip
    await world.ranker(AGE).process(records)

    landed = {
        answer.key: record.partition
        for record in world.bus.records(TOPICS.ranks)
        for answer in answers_of(record)
    }
    assert landed == {SNAPSHOT.workload.key: home, other.workload.key: there}


async def test_a_batch_that_does_not_fit_is_halved_and_an_answer_too_large_alone_dead_lettered(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Records of any size would take huge workloads to make: the encoding stands in for it,
    # refusing a batch of more than two answers and any holding the "huge" workload's.
    items = [
        replace(deployment(name, pods=2, nodes=2), annotations=ANNOTATIONS)
        for name in ("a", "b", "huge", "c", "d")
    ]
    huge = items[2].workload.key

    def sized(message: Any, **kwargs: Any) -> Encoded:
        answers = message.answers
        if len(answers) > 2 or any(answer.key == huge for answer in answers):
            raise MessageTooLarge(message.KIND, 2_000_000, 1_000_000)
        return encode(message, **kwargs)

    monkeypatch.setattr(ranker_outbox, "encode", sized)
    records = []
    for item in items:
        encoded = encode(WorkloadSnapshotMessage.of(item, emitted_at=START))
        partition = world.bus.partition_of(encoded.key or b"")
        records.append(Record(TOPICS.workloads, partition, 0, encoded.key, encoded.value,
                              encoded.headers))  # fmt: skip
    async with Reader(world.bus, TOPICS.deadletter, DeadLetter) as dead:
        await world.ranker(AGE).process(records)
        [letter] = await dead.take(1)
    answered = [answer.key for record in world.bus.records(TOPICS.ranks)
                for answer in answers_of(record)]  # fmt: skip
    assert sorted(answered) == sorted(
        item.workload.key for item in items if item.workload.key != huge
    )
    assert all(len(answers_of(record)) <= 2 for record in world.bus.records(TOPICS.ranks))
    assert letter.key == huge
    assert letter.reason.startswith("the ranks do not fit in a record")


@pytest.mark.parametrize("several", [False, True], ids=["one strategy", "several strategies"])
async def test_a_batch_of_answers_with_a_workload_of_another_partition_is_dead_lettered(
    world: World, several: bool
) -> None:
    here = world.bus.partition_of(SNAPSHOT.workload.key.encode())
    other = next(  # a workload the bus puts in another partition
        item
        for item in (
            replace(deployment(f"elsewhere-{index}", pods=3, nodes=3), annotations=ANNOTATIONS)
            for index in range(100)
        )
        if world.bus.partition_of(item.workload.key.encode()) != here
    )
    answers = tuple(
        RankedWorkload(key=item.workload.key, version=item.version,
                       scores={pod.uid: 1.0 for pod in item.pods}, duration_seconds=0.0)
        for item in (SNAPSHOT, other)
    )  # fmt: skip
    forged: StrategyRanksBatchMessage | RanksBatchMessage = (
        RanksBatchMessage(
            answers=tuple(
                StrategyAnswer(strategy=strategy, **answer.model_dump())
                for strategy, answer in zip((CAP, AGE), answers, strict=True)
            ),
            emitted_at=START,
        )
        if several
        else StrategyRanksBatchMessage(strategy=AGE, answers=answers, emitted_at=START)
    )
    combiner = world.aggregator()
    async with (
        running(world.ranker(CAP), world.ranker(AGE), combiner),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        Reader(world.bus, TOPICS.deadletter, DeadLetter) as dead,
    ):
        await world.publish()
        [decision] = await costs.take(1)
        # Keyed by its first workload: it lands in that workload's partition.
        await publish_message(world.bus, TOPICS.ranks, forged)
        [letter] = await dead.take(1)
        await costs.nothing_more(0.3)  # the batch's answer for SNAPSHOT changed nothing

    assert decision.complete
    assert letter.topic == TOPICS.ranks
    assert letter.partition == here
    assert f"answers {other.workload.key!r}, a workload of partition" in letter.reason
    assert counted(combiner, "podcost_messages_consumed_total", topic=TOPICS.ranks,
                   outcome="dead_letter") == 1  # fmt: skip


async def test_a_workload_whose_policy_is_invalid_is_dead_lettered_with_the_culprit(
    world: World,
) -> None:
    bad = replace(SNAPSHOT, annotations={"podcost.dev/strategies": "age=0"})
    combiner = world.aggregator()
    async with (
        running(world.ranker(AGE), combiner),
        Reader(world.bus, TOPICS.deadletter, DeadLetter) as dead,
    ):
        await world.publish(bad)
        letters = await dead.take(2)
    assert {letter.error for letter in letters} == {"PolicyError"}
    assert all("weight must be an integer >= 1" in letter.reason for letter in letters)
    # Counted once, as dead-lettered (the lag a benchmark derives from the counts stays true).
    outcomes = {
        outcome: counted(combiner, "podcost_messages_consumed_total", topic=TOPICS.workloads,
                         outcome=outcome)
        for outcome in ("ok", "dead_letter")
    }  # fmt: skip
    assert outcomes == {"ok": 0, "dead_letter": 1}


async def test_a_ranker_restarted_before_committing_ranks_again_and_the_decision_is_unchanged(
    world: World,
) -> None:
    v2 = replace(SNAPSHOT, version=SNAPSHOT.version + 1)
    async with (
        running(world.ranker(AGE), world.aggregator()),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        AnswersReader(world.bus, TOPICS.ranks) as ranks,
    ):
        await world.publish()
        crashing = world.ranker(CAP)
        async with world.bus.consumer([TOPICS.workloads], group=group_of(CAP)) as consumer:
            records = await consumer.poll(max_wait=5)
            await crashing.process(records)  # published, never committed: then it "dies"
        [first] = await costs.take(1)

        async with running(world.ranker(CAP)):  # the restarted ranker
            answers = await ranks.take(3)
            await world.publish(v2)
            [second] = await costs.take(1)

            def both_committed() -> bool:  # once the restarted ranker's answers are acknowledged
                return sum(world.bus.committed(group_of(CAP)).values()) == 2

            await eventually(both_committed, "the restarted ranker committed both snapshots", 5)

    assert sorted(answer.strategy for answer in answers) == [AGE, CAP, CAP]
    before, again = [answer for answer in answers if answer.strategy == CAP]
    assert (again.version, again.scores) == (before.version, before.scores)
    assert (first.version, second.version) == (SNAPSHOT.version, v2.version)
    assert {pod.uid: pod.cost for pod in first.costs} == expected_costs(SNAPSHOT, POLICY)


async def test_rankers_given_a_group_prefix_commit_in_their_own_group_not_the_default_one(
    world: World,
) -> None:
    config = RankerSettings(group="bench-7")
    prefixed = ranker.bootstrap(
        SETTINGS, BUS, strategy=AGE, config=config, bus=world.bus, clock=world.clock,
        registry=world.registry, tracer_provider=world.provider,
    )  # fmt: skip
    async with (
        running(prefixed, world.ranker(CAP), world.aggregator()),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
    ):
        await world.publish()
        [decision] = await costs.take(1)
        await eventually(
            lambda: sum(world.bus.committed("bench-7-age").values()) == 1, "bench-7-age commits"
        )

    assert decision.complete
    assert prefixed.group == "bench-7-age"
    assert world.bus.committed(group_of(AGE)) == {}


def _explode(snapshot: Snapshot, args: object) -> dict[PodUID, float]:
    raise RuntimeError("boom")


@dataclass(frozen=True)
class _NoArgs:
    """No arguments."""


EXPLODING: Strategy[_NoArgs] = Strategy("exploding", _NoArgs, _explode, "Always fails.")


def _plugins() -> Registry:
    return build_registry(
        [
            EntryPoint("name-length", "tests.unit.plugin_fixture:STRATEGY", "podcost.strategies"),
            EntryPoint(
                "exploding",
                "tests.unit.test_ranker_aggregator_memory:EXPLODING",
                "podcost.strategies",
            ),
        ]
    )


async def test_a_plugin_strategy_runs_in_the_same_ranker_and_a_failing_one_is_dead_lettered(
    world: World,
) -> None:
    world.registry = _plugins()
    annotations = {"podcost.dev/enabled": "true", "podcost.dev/strategies": "name-length=2, age"}
    plugged = replace(SNAPSHOT, annotations=annotations)
    failing = replace(
        SNAPSHOT,
        version=SNAPSHOT.version + 1,
        annotations={**annotations, "podcost.dev/strategies": "exploding, name-length"},
    )
    policy = policy_from_annotations(annotations, registry=world.registry)
    async with (
        running(world.ranker("name-length"), world.ranker(AGE), world.ranker("exploding"),
                world.aggregator()),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        Reader(world.bus, TOPICS.deadletter, DeadLetter) as dead,
    ):  # fmt: skip
        await world.publish(plugged)
        [decision] = await costs.take(1)
        await world.publish(failing)
        [letter] = await dead.take(1)
        await world.clock.advance(5)
        [deadline] = await costs.take(1)

    assert decision.complete
    assert {pod.uid: pod.cost for pod in decision.costs} == expected_costs(plugged, policy)
    assert letter.group == group_of("exploding")
    assert letter.reason == "strategy 'exploding' failed: RuntimeError('boom')"
    assert (deadline.version, deadline.complete, deadline.missing) == (
        failing.version,
        False,
        ("exploding",),
    )


def test_a_ranker_for_an_unknown_strategy_does_not_start_and_lists_the_known_ones() -> None:
    with pytest.raises(UnknownStrategyError, match=r"unknown strategy 'nope' \(known: age, "):
        ranker.bootstrap(SETTINGS, BUS, strategy="nope", bus=MemoryBus())


def test_a_policy_file_with_bad_args_stops_the_ranker_and_the_aggregator_naming_them(
    tmp_path: Path,
) -> None:
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(
        '{"version": 1, "strategies": [{"name": "age", "args": {"direction": "sideways"}}]}'
    )
    settings = SETTINGS.model_copy(update={"policy_file": policy_file})
    with pytest.raises(PolicyError, match="strategy 'age', arg 'direction'"):
        ranker.bootstrap(settings, BUS, strategy=AGE, bus=MemoryBus())
    with pytest.raises(PolicyError, match="strategy 'age', arg 'direction'"):
        aggregator.bootstrap(settings, BUS, bus=MemoryBus())


async def test_the_cluster_default_policy_file_decides_which_rankers_answer(
    world: World, tmp_path: Path
) -> None:
    policy_file = tmp_path / "policy.json"
    policy_file.write_text('{"version": 1, "strategies": [{"name": "age"}]}')
    settings = SETTINGS.model_copy(update={"policy_file": policy_file})
    plain = replace(SNAPSHOT, annotations={"podcost.dev/enabled": "true"})
    combiner = aggregator.bootstrap(
        settings, BUS, bus=world.bus, clock=world.clock, tracer_provider=world.provider
    )
    async with (
        running(world.ranker(AGE, settings), world.ranker(CAP, settings), combiner),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        AnswersReader(world.bus, TOPICS.ranks) as ranks,
    ):
        await world.publish(plain)
        [decision] = await costs.take(1)
        [answer] = await ranks.take(1)
    assert answer.strategy == AGE
    assert decision.complete
    assert all(set(pod.breakdown) == {AGE} for pod in decision.costs)


async def test_a_restarted_consumer_loop_aggregator_reads_again_what_its_waiting_states_need(
    world: World,
) -> None:
    first = world.aggregator()
    async with Reader(world.bus, COSTS, DesiredCostsMessage) as costs:
        async with running(world.ranker(CAP), first):
            await world.publish()
            await eventually(
                lambda: counted(first, "podcost_messages_consumed_total", topic=TOPICS.ranks,
                                outcome="ok") == 1,
                "the first aggregator to read the capacity-type answer",
            )  # fmt: skip
        # Its state died with it; the snapshot and the answer were not committed past.
        assert world.bus.committed("podcost-aggregator") == {}
        second = world.aggregator()
        async with running(world.ranker(AGE), second):
            [decision] = await costs.take(1)
        assert decision.complete
        assert {pod.uid: pod.cost for pod in decision.costs} == expected_costs(SNAPSHOT, POLICY)
        # Decided: everything it read is committed now.
        assert sum(world.bus.committed("podcost-aggregator").values()) == 3


async def test_the_time_of_the_change_travels_from_the_snapshot_through_the_ranks_to_the_costs(
    world: World,
) -> None:
    changed_at = START - 2.5  # the watcher saw the change before it published
    async with (
        running(world.ranker(CAP), world.ranker(AGE), world.aggregator()),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        AnswersReader(world.bus, TOPICS.ranks) as ranks,
    ):
        await world.publish(changed_at=changed_at)
        [decision] = await costs.take(1)
        answers = await ranks.take(2)

    assert [answer.changed_at for answer in answers] == [changed_at, changed_at]
    assert decision.changed_at == changed_at
    assert decision.emitted_at == START  # its own hop's time stays its own


def _states(service: AggregatorService) -> dict[bytes | None, WorkloadState]:
    transport = service.transport
    assert isinstance(transport, KeyedConsumerLoop)  # the in-memory bus's transport
    return dict(transport.states)


async def test_a_workload_gone_is_skipped_by_the_rankers_and_forgotten_by_the_aggregator(
    world: World,
) -> None:
    key = SNAPSHOT.workload.key.encode()
    cap, combiner = world.ranker(CAP), world.aggregator()
    async with (
        running(cap, world.ranker(AGE), combiner),
        Reader(world.bus, COSTS, DesiredCostsMessage) as costs,
        AnswersReader(world.bus, TOPICS.ranks) as ranks,
        Reader(world.bus, TOPICS.deadletter, DeadLetter) as dead,
    ):
        await world.publish()
        await costs.take(1)
        await ranks.take(2)
        assert key in _states(combiner)

        # A gone older than the snapshot held (the workload came back since) changes nothing.
        await world.gone(version=SNAPSHOT.version - 1, emitted_at=START - 1)
        await eventually(
            lambda: counted(cap, "podcost_messages_consumed_total", topic=TOPICS.workloads,
                            outcome="ok") == 2,
            "the ranker to skip the stale gone message",
        )  # fmt: skip
        await eventually(
            lambda: counted(combiner, "podcost_messages_consumed_total", topic=TOPICS.workloads,
                            outcome="ok") == 2,
            "the aggregator to read the stale gone message",
        )  # fmt: skip
        assert key in _states(combiner)

        await world.gone(version=SNAPSHOT.version + 1, emitted_at=START + 1)
        await eventually(lambda: key not in _states(combiner), "the aggregator to forget it")
        await ranks.nothing_more(0.2)
        await costs.nothing_more(0.2)
        await dead.nothing_more(0.2)
    assert counted(cap, "podcost_snapshots_ranked_total", strategy=CAP) == 1


async def test_a_live_set_forgets_and_releases_only_the_workloads_it_leaves_out(
    world: World,
) -> None:
    kept = replace(SNAPSHOT, workload=replace(SNAPSHOT.workload, name="kept"))
    other = replace(SNAPSHOT, workload=replace(SNAPSHOT.workload, cluster="other"))
    combiner = world.aggregator()
    async with (
        running(combiner),
        Reader(world.bus, COSTS, DesiredCostsMessage, decoder=decode_costs_record) as costs,
    ):
        for item in (SNAPSHOT, kept, other):
            await world.publish(item)
        await eventually(lambda: len(_states(combiner)) == 3, "three states")
        listed = WorkloadGoneMessage(
            key=live_set_key(CLUSTER).text(), version=0, reason=GONE_UNLISTED,
            emitted_at=START + 1, live=(kept.workload.key,),
        )  # fmt: skip
        encoded = encode(listed)
        await world.bus.broadcast(TOPICS.workloads, encoded.key, encoded.value, encoded.headers)
        # The cluster's unlisted workload goes; the listed one and another cluster's stay.
        await eventually(
            lambda: set(_states(combiner)) == {kept.workload.key.encode(),
                                               other.workload.key.encode()},
            "the unlisted state to be forgotten",
        )  # fmt: skip
        [release] = await costs.take(1)  # no decision before the deadline: the release alone
        assert isinstance(release, ReleaseCostsMessage)
        assert (release.key, release.reason) == (SNAPSHOT.workload.key, GONE_UNLISTED)
        await costs.nothing_more(0.2)
    # Read once per partition, counted once each; every state of them a step.
    assert counted(combiner, "podcost_messages_consumed_total", topic=TOPICS.workloads,
                   outcome="ok") == 3 + len(world.bus.end_offsets(TOPICS.workloads))  # fmt: skip
    assert counted(combiner, "podcost_aggregator_states_forgotten_total", reason="unlisted") == 1
    assert counted(combiner, "podcost_aggregator_states") == 2


async def test_a_workload_that_opted_out_gets_a_release_of_its_pods_costs_a_deleted_one_not(
    world: World,
) -> None:
    combiner = world.aggregator()
    async with (
        running(world.ranker(CAP), world.ranker(AGE), combiner),
        Reader(world.bus, COSTS, DesiredCostsMessage, decoder=decode_costs_record) as costs,
    ):
        await world.publish()
        [decision] = await costs.take(1)
        assert isinstance(decision, DesiredCostsMessage)
        await world.gone(version=SNAPSHOT.version + 1, emitted_at=START + 1, reason="opted out")
        [release] = await costs.take(1)
        assert isinstance(release, ReleaseCostsMessage)
        assert (release.key, release.version, release.reason) == (
            SNAPSHOT.workload.key, SNAPSHOT.version + 1, "opted out",
        )  # fmt: skip
        assert {pod.uid for pod in release.pods} == {pod.uid for pod in SNAPSHOT.pods}
        # Forgotten now: a second word that it is gone has no snapshot to release.
        await world.gone(version=SNAPSHOT.version + 2, emitted_at=START + 2, reason="opted out")
        await costs.nothing_more(0.2)


async def test_rankers_together_decode_each_snapshot_once_and_each_group_dead_letters_a_poison(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three strategies' rankers in one process, as `podcost ranker --strategy A --strategy B`
    # runs them: whole snapshots, one registry of metrics, each record kept until all three
    # have read it.
    decodes: list[type] = []
    real_decode = messages.decode

    def counting(kind: type[Any], *args: Any, **kwargs: Any) -> Any:
        decodes.append(kind)
        return real_decode(kind, *args, **kwargs)

    monkeypatch.setattr(messages, "decode", counting)
    keep_decoded_snapshots(8 * BUS.max_poll_records + 64, readers=3)
    families = Families()
    rankers = [
        ranker.bootstrap(
            SETTINGS, BUS, strategy=name, bus=world.bus, clock=world.clock,
            tracer_provider=world.provider, whole_snapshots=True, families=families,
        )
        for name in (CAP, AGE, SPREAD)
    ]  # fmt: skip
    snapshots = [
        replace(deployment(f"app-{index}", pods=3, nodes=3, seed=index), annotations=ANNOTATIONS)
        for index in range(30)
    ]
    try:
        async with (
            running(*rankers),
            AnswersReader(world.bus, TOPICS.ranks) as answers,
            Reader(world.bus, TOPICS.deadletter, DeadLetter) as dead,
        ):
            await world.bus.publish(TOPICS.workloads, SNAPSHOT.workload.key, b"{not json")
            for item in snapshots:
                await world.publish(item)
            got = await answers.take(2 * len(snapshots))  # the spread strategy answers nothing
            letters = await dead.take(3)
    finally:
        keep_decoded_snapshots(64)
    keys = {item.workload.key for item in snapshots}
    assert {(a.strategy, a.key) for a in got} == {(s, k) for s in (CAP, AGE) for k in keys}
    # The poison once per strategy's group (each reader tries it: errors are not kept) ...
    assert sorted(letter.group for letter in letters) == sorted(map(group_of, (CAP, AGE, SPREAD)))
    # ... and every good snapshot decoded once for all three.
    snapshot_decodes = [kind for kind in decodes if kind is WorkloadSnapshotMessage]
    assert len(snapshot_decodes) == len(snapshots) + 3
