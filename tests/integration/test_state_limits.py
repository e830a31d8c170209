"""The aggregator's stored state against the limits of the real broker (Kafka's default record
size) and of faust's producer: a snapshot as large as the watcher may publish (its value just
under ``MAX_MESSAGE_BYTES``) is decided and its state stored, with faust and with the consumer
loop; one larger than a stored state may hold is dead-lettered with its reason, and the service
goes on. The state's snapshot part is the record's value plus a bounded header
(``podcost.aggregator.processor``)."""

from __future__ import annotations

import base64
import random
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from tests.support.pipeline import Reader, fresh_kafka_settings, running
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator, ranker
from podcost.aggregator import AggregatorSettings
from podcost.aggregator.processor import MAX_STORED_SNAPSHOT_VALUE_BYTES
from podcost.runtime.settings import ServiceSettings
from podcost_bus import KafkaBus, publish_message
from podcost_contracts.messages import (
    MAX_MESSAGE_BYTES,
    DeadLetter,
    DesiredCostsMessage,
    Encoded,
    WorkloadSnapshotMessage,
    encode,
)
from podcost_core.model import Snapshot

pytestmark = pytest.mark.integration

SETTINGS = ServiceSettings(http_port=0)
CAP, AGE = "capacity-type", "age"
ANNOTATIONS = {"podcost.dev/enabled": "true", "podcost.dev/strategies": f"{CAP}, {AGE}"}
GOOD = replace(deployment(pods=4, nodes=4), annotations=ANNOTATIONS)


def with_value_of(name: str, low: int, high: int) -> Encoded:
    """A valid snapshot of workload ``name`` whose encoded value is ``low`` to ``high`` bytes:
    its pods carry an annotation of random text (which gzip cannot shrink much)."""

    def encoded(size: int) -> Encoded:
        rng = random.Random(7)
        pods = tuple(
            replace(pod, annotations={"note": base64.b64encode(rng.randbytes(size)).decode()})
            for pod in GOOD.pods
        )
        big: Snapshot = replace(GOOD, workload=replace(GOOD.workload, name=name), pods=pods)
        message = WorkloadSnapshotMessage.of(big, emitted_at=time.time())
        return encode(message, max_bytes=10**9)

    smallest, largest = 1, 400_000
    while True:
        size = (smallest + largest) // 2
        found = encoded(size)
        if len(found.value) < low:
            smallest = size + 1
        elif len(found.value) > high:
            largest = size - 1
        else:
            return found


@pytest.fixture
async def bus(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "state-limits")
    async with KafkaBus(settings) as started:
        await started.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
        yield started


@pytest.mark.parametrize("engine", ["faust", "consumer"])
async def test_a_snapshot_as_large_as_a_record_may_be_is_decided_and_a_larger_dead_lettered(
    bus: KafkaBus, tmp_path: Path, engine: str
) -> None:
    settings, topics = bus.settings, bus.settings.topics
    run = settings.client_id.rsplit("-", 1)[-1]
    largest = with_value_of("largest", MAX_MESSAGE_BYTES - 100, MAX_MESSAGE_BYTES)
    # Larger than any podcost producer writes, yet inside the broker's limit.
    over = MAX_STORED_SNAPSHOT_VALUE_BYTES
    too_large = with_value_of("too-large", over + 1, over + 5_000)
    rankers = [ranker.bootstrap(SETTINGS, settings, strategy=name, bus=bus) for name in (CAP, AGE)]
    config = AggregatorSettings(
        deadline_s=30.0, tick_s=0.1, app_id=f"limits-{run}-aggregator", data_dir=tmp_path,
        commit_interval_s=0.2, engine=engine,  # type: ignore[arg-type]
    )  # fmt: skip
    combiner = aggregator.bootstrap(SETTINGS, settings, config=config, bus=bus)
    services = [*rankers, combiner]
    async with (
        running(*services),
        Reader(bus, topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
        Reader(bus, topics.deadletter, DeadLetter) as dead,
    ):
        producer = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap_servers, max_request_size=2 * over
        )
        await producer.start()
        try:
            for encoded in (largest, too_large):
                await producer.send_and_wait(
                    topics.workloads, encoded.value, key=encoded.key,
                    headers=list(encoded.headers.items()),
                )  # fmt: skip
        finally:
            await producer.stop()
        good = WorkloadSnapshotMessage.of(GOOD, emitted_at=time.time())
        await publish_message(bus, topics.workloads, good)
        decided = {decision.key for decision in await costs.take(2, timeout=90)}
        [letter] = await dead.take(1, timeout=30)
        await dead.nothing_more(1.0)
        assert all(service.ready() for service in services)
    assert decided == {GOOD.workload.key, largest.key.decode() if largest.key else ""}
    assert letter.key == (too_large.key or b"").decode()
    assert letter.reason.startswith("the snapshot's record is")
