"""A ranker's answer that comes after its workload's gone message, through the aggregator over the
in-memory bus with a fake clock (the consumer-loop transport): the state it starts is forgotten
once the early-answer horizon passes with no snapshot, while an answer whose snapshot comes
within the horizon is decided; a state stored holding nothing (by a version that kept such
states) is forgotten at the first tick. The same over the real broker and the faust tables is
``tests/integration/test_late_answers.py``; the pure rule is in ``tests/unit/test_aggregate.py``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.support.clock import FakeClock
from tests.support.pipeline import Reader, eventually, running
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.aggregator import AggregatorService, AggregatorSettings
from podcost.runtime.settings import ServiceSettings
from podcost_bus import BusSettings, MemoryBus, publish_message
from podcost_bus.keyed import DROP, KeyedConsumerLoop
from podcost_contracts.messages import (
    DesiredCostsMessage,
    StrategyRanksMessage,
    WorkloadGoneMessage,
    WorkloadSnapshotMessage,
)
from podcost_core.aggregate import AT_ONCE, PROGRESS_PART, WorkloadState
from podcost_core.model import Snapshot
from podcost_core.policy import policy_from_annotations

BUS = BusSettings()
TOPICS = BUS.topics
AGE = "age"
ANNOTATIONS = {"podcost.dev/enabled": "true", "podcost.dev/strategies": AGE}
SNAPSHOT = replace(deployment(pods=4, nodes=4), annotations=ANNOTATIONS)
KEY = SNAPSHOT.workload.key
START = 1_714_568_400.0
HORIZON = 30.0


def answer(snapshot: Snapshot, emitted_at: float) -> StrategyRanksMessage:
    """The age strategy's answer for ``snapshot``, as its ranker publishes it."""
    [bound] = policy_from_annotations(snapshot.annotations).bound
    return StrategyRanksMessage(
        key=snapshot.workload.key, version=snapshot.version, strategy=AGE,
        scores=bound.strategy.score(snapshot, bound.args), duration_seconds=0.0,
        emitted_at=emitted_at,
    )  # fmt: skip


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def bus() -> MemoryBus:
    return MemoryBus(clock=lambda: START)


def combiner(bus: MemoryBus, clock: FakeClock) -> AggregatorService:
    config = AggregatorSettings(deadline_seconds=5.0, early_answer_seconds=HORIZON)
    return aggregator.bootstrap(
        ServiceSettings(http_port=0), BUS, config=config, bus=bus, clock=clock
    )


def states(service: AggregatorService) -> set[bytes | None]:
    transport = service.transport
    assert isinstance(transport, KeyedConsumerLoop)
    return set(transport.states)


def forgotten(service: AggregatorService, reason: str) -> float:
    labels = {"reason": reason}
    value = service.metrics.get_sample_value("podcost_aggregator_states_forgotten_total", labels)
    return value or 0.0


async def test_an_answer_after_its_workload_is_gone_leaves_no_state_once_the_horizon_passed(
    bus: MemoryBus, clock: FakeClock
) -> None:
    service = combiner(bus, clock)
    async with (
        running(service),
        Reader(bus, TOPICS.costs_for(CLUSTER), DesiredCostsMessage) as costs,
    ):
        await publish_message(bus, TOPICS.workloads,
                              WorkloadSnapshotMessage.of(SNAPSHOT, emitted_at=START))  # fmt: skip
        await eventually(lambda: KEY.encode() in states(service), "the snapshot's state")
        gone = WorkloadGoneMessage(
            key=KEY, version=SNAPSHOT.version + 1, reason="deleted", emitted_at=START + 1
        )
        await publish_message(bus, TOPICS.workloads, gone)
        await eventually(lambda: not states(service), "the gone workload to be forgotten")
        # A ranker that lagged behind the watcher answers the snapshot now.
        await publish_message(bus, TOPICS.ranks, answer(SNAPSHOT, START + 2))
        await eventually(lambda: KEY.encode() in states(service), "the late answer's state")
        await clock.advance(HORIZON - 1)
        assert KEY.encode() in states(service)  # it may still be an early answer
        await clock.advance(1.5)
        await eventually(lambda: not states(service), "the late answer's state to go")
        await costs.nothing_more(0.1)
    assert forgotten(service, "expired") == 1
    assert forgotten(service, "gone") == 1
    assert service.metrics.get_sample_value("podcost_aggregator_states") == 0


async def test_an_answer_whose_snapshot_comes_within_the_horizon_is_decided_with_it(
    bus: MemoryBus, clock: FakeClock
) -> None:
    service = combiner(bus, clock)
    async with (
        running(service),
        Reader(bus, TOPICS.costs_for(CLUSTER), DesiredCostsMessage) as costs,
    ):
        await publish_message(bus, TOPICS.ranks, answer(SNAPSHOT, START))
        await eventually(lambda: KEY.encode() in states(service), "the early answer's state")
        await clock.advance(HORIZON - 1)
        await publish_message(bus, TOPICS.workloads,
                              WorkloadSnapshotMessage.of(SNAPSHOT, emitted_at=START))  # fmt: skip
        [decision] = await costs.take(1)
        await clock.advance(2 * HORIZON)
        assert KEY.encode() in states(service)  # a decided state describes its workload
    assert (decision.version, decision.complete) == (SNAPSHOT.version, True)
    assert forgotten(service, "expired") == 0


def test_a_state_stored_holding_nothing_is_due_at_once_and_its_tick_drops_it(
    bus: MemoryBus, clock: FakeClock
) -> None:
    """As a version that kept such states left them: a progress part with no answer waiting and
    no snapshot part. Read back after a restart, it is forgotten at the first tick."""
    processor = combiner(bus, clock).processor
    parts = processor.dump(None, WorkloadState(KEY))
    assert set(parts) == {PROGRESS_PART}
    state = processor.load(KEY.encode(), parts)
    assert processor.stored_wakeup(KEY.encode(), parts) == processor.wakeup(state) == AT_ONCE
    assert processor.on_tick(KEY.encode(), state) is DROP
    assert (
        processor.metrics.get_sample_value(
            "podcost_aggregator_states_forgotten_total", {"reason": "expired"}
        )
        == 1
    )
