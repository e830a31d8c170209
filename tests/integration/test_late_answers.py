"""A ranker's answer that arrives after its workload's gone message, on the real Kafka broker and
the faust aggregator: the state it starts leaves the tables once the early-answer horizon passes
with no snapshot, with a tombstone in every part's changelog; an answer that comes before its
snapshot, which then comes within the horizon, is decided with it. The same over the in-memory
bus with a fake clock is ``tests/unit/test_late_answers_memory.py``."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from tests.support.pipeline import Reader, eventually, fresh_kafka_settings, running
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.aggregator import AggregatorService, AggregatorSettings
from podcost.runtime.settings import ServiceSettings
from podcost_bus import KafkaBus, publish_message
from podcost_bus.faust_app import FaustKeyedApp
from podcost_contracts.messages import (
    DesiredCostsMessage,
    StrategyRanksMessage,
    WorkloadGoneMessage,
    WorkloadSnapshotMessage,
)
from podcost_core.model import Snapshot
from podcost_core.policy import policy_from_annotations

pytestmark = pytest.mark.integration

AGE = "age"
ANNOTATIONS = {"podcost.dev/enabled": "true", "podcost.dev/strategies": AGE}
SNAPSHOT = replace(deployment(pods=4, nodes=4), annotations=ANNOTATIONS)
KEY = SNAPSHOT.workload.key.encode()


@dataclass
class Kafka:
    bus: KafkaBus
    data_dir: Path

    def aggregator(self, horizon: float) -> AggregatorService:
        run = self.bus.settings.client_id.rsplit("-", 1)[-1]
        config = AggregatorSettings(
            deadline_seconds=30.0, early_answer_seconds=horizon, tick_seconds=0.1,
            app_id=f"test-{run}-aggregator", data_dir=self.data_dir, commit_interval_seconds=0.2,
        )  # fmt: skip
        return aggregator.bootstrap(
            ServiceSettings(http_port=0), self.bus.settings, config=config, bus=self.bus
        )

    async def snapshot(self) -> None:
        message = WorkloadSnapshotMessage.of(SNAPSHOT, emitted_at=time.time())
        await publish_message(self.bus, self.bus.settings.topics.workloads, message)

    async def answer(self, snapshot: Snapshot = SNAPSHOT) -> None:
        """The age strategy's answer for ``snapshot``, as its ranker publishes it."""
        [bound] = policy_from_annotations(snapshot.annotations).bound
        message = StrategyRanksMessage(
            key=snapshot.workload.key, version=snapshot.version, strategy=AGE,
            scores=bound.strategy.score(snapshot, bound.args), duration_seconds=0.0,
            emitted_at=time.time(),
        )  # fmt: skip
        await publish_message(self.bus, self.bus.settings.topics.ranks, message)


@pytest.fixture
async def kafka(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Kafka]:
    settings = fresh_kafka_settings(kafka_bootstrap, "late")
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
        yield Kafka(bus, tmp_path)


def stored(service: AggregatorService) -> set[bytes]:
    transport = service.transport
    assert isinstance(transport, FaustKeyedApp)
    return {key for table in transport.tables.values() for key in table}


def forgotten(service: AggregatorService, reason: str) -> float:
    labels = {"reason": reason}
    value = service.metrics.get_sample_value("podcost_aggregator_states_forgotten_total", labels)
    return value or 0.0


async def changelog(bus: KafkaBus, topic: str, key: bytes) -> list[bytes | None]:
    """The values of ``key``'s records in the changelog ``topic``, in order (``None``: a
    tombstone, which the bus reads as an empty value: no stored state part is empty)."""
    values: list[bytes | None] = []
    deadline = time.monotonic() + 30.0
    async with bus.consumer([topic], group=f"test-reader-{uuid.uuid4().hex}") as consumer:
        while True:
            records = await consumer.poll(max_wait=0.5)
            values += [record.value or None for record in records if record.key == key]
            lags = await consumer.lag()
            owned = consumer.assignment()
            if not records and owned and set(lags) == owned and not any(lags.values()):
                return values
            assert time.monotonic() < deadline, f"{topic} was not read to its end"


async def test_an_answer_after_its_workload_is_gone_leaves_no_state_once_the_horizon_passed(
    kafka: Kafka,
) -> None:
    horizon = 2.0
    core = kafka.aggregator(horizon)
    topics = kafka.bus.settings.topics
    async with running(core):
        await kafka.snapshot()
        await eventually(lambda: KEY in stored(core), "the snapshot's state")
        gone = WorkloadGoneMessage(
            key=SNAPSHOT.workload.key, version=SNAPSHOT.version + 1, reason="deleted",
            emitted_at=time.time(),
        )  # fmt: skip
        await publish_message(kafka.bus, topics.workloads, gone)
        await eventually(lambda: KEY not in stored(core), "the gone workload's state to go")
        # A ranker that lagged behind the watcher answers the snapshot now.
        answered = time.monotonic()
        await kafka.answer()
        await eventually(lambda: forgotten(core, "expired") == 1, "the late answer's state to go")
        assert time.monotonic() - answered >= horizon  # it waited as an early answer would
        assert KEY not in stored(core)
        assert forgotten(core, "gone") == 1
        transport = core.transport
        assert isinstance(transport, FaustKeyedApp)
        parts = dict(zip(core.processor.parts, transport.changelog_topics(), strict=True))
    # The progress part ends with the late answer's and its tombstone (the snapshot's own was
    # implied by the snapshot part, so never written).
    progress = await changelog(kafka.bus, parts["progress"], KEY)
    assert [value is None for value in progress[-2:]] == [False, True]
    # The snapshot part: written once, then its tombstone (the late answer's state had none).
    snapshots = await changelog(kafka.bus, parts["snapshot"], KEY)
    assert [value is None for value in snapshots] == [False, True]


async def test_an_answer_whose_snapshot_comes_within_the_horizon_is_decided_with_it(
    kafka: Kafka,
) -> None:
    core = kafka.aggregator(horizon=60.0)
    async with (
        running(core),
        Reader(
            kafka.bus, kafka.bus.settings.topics.costs_for(CLUSTER), DesiredCostsMessage
        ) as costs,
    ):
        await kafka.answer()
        await eventually(lambda: KEY in stored(core), "the early answer's state")
        await kafka.snapshot()
        [decision] = await costs.take(1)
        assert KEY in stored(core)
    assert (decision.version, decision.complete, decision.missing) == (SNAPSHOT.version, True, ())
    assert forgotten(core, "expired") == 0
