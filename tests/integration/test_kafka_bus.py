"""The Kafka bus against the project's real broker: contract messages through real topics,
at-least-once across a consumer crash, dead-lettering that lets the consumer go on, a 10,000-pod
snapshot in one record, pause/resume, and errors that say whether to retry."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from tests.support.pipeline import fresh_kafka_settings
from tests.support.snapshots import large_snapshot, snapshot

from podcost_bus import (
    BusError,
    BusSettings,
    KafkaBus,
    KafkaConsumer,
    Record,
    TopicPartition,
    decode_or_dead_letter,
    publish_message,
)
from podcost_contracts.messages import (
    CONTENT_ENCODING,
    TRACEPARENT,
    DeadLetter,
    WorkloadSnapshotMessage,
    decode,
)
from podcost_contracts.topics import Topics

pytestmark = pytest.mark.integration

TRACE = {TRACEPARENT: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
#: Generous: the first poll of a new group waits for the group to form.
WAIT_S = 20.0


@pytest.fixture
def settings(kafka_bootstrap: str) -> BusSettings:
    """Settings for fresh topics, so tests never see each other's records."""
    return fresh_kafka_settings(kafka_bootstrap, "test")


@pytest.fixture
async def bus(settings: BusSettings) -> AsyncIterator[KafkaBus]:
    async with KafkaBus(settings) as started:
        await started.ensure_topics(settings.topics.shared())
        yield started


def topics(bus: KafkaBus) -> Topics:
    return bus.settings.topics


async def take(consumer: KafkaConsumer, count: int) -> list[Record]:
    """Exactly ``count`` records, or a failure naming how many came before the deadline."""
    received: list[Record] = []
    while len(received) < count:
        batch = await consumer.poll(max_wait=WAIT_S, max_records=count - len(received))
        if not batch:
            raise AssertionError(f"got {len(received)} of {count} records in {WAIT_S}s")
        received.extend(batch)
    return received


async def joined(consumer: KafkaConsumer) -> None:
    """Return once the group has given ``consumer`` its partitions (polling is what joins)."""
    for _ in range(int(WAIT_S / 0.2)):
        if consumer.assignment():
            return
        assert await consumer.poll(max_wait=0.2) == []
    raise AssertionError(f"no partitions assigned in {WAIT_S}s")


async def test_snapshot_messages_go_through_real_topics_in_order_per_workload(
    bus: KafkaBus,
) -> None:
    sent = [
        WorkloadSnapshotMessage.of(snapshot(name, version=version), emitted_at=float(version))
        for version in range(1, 4)
        for name in ("web", "api", "cart")
    ]
    for message in sent:
        await publish_message(bus, topics(bus).workloads, message, trace=TRACE)
    async with bus.consumer([topics(bus).workloads], group="ranker-age") as consumer:
        records = await take(consumer, len(sent))
        assert await consumer.commit() == {
            tp: max(r.offset for r in records if r.tp == tp) + 1 for tp in {r.tp for r in records}
        }
    received = [decode(WorkloadSnapshotMessage, r.value, r.headers, key=r.key) for r in records]
    assert sorted(received, key=lambda m: (m.key, m.version)) == sorted(
        sent, key=lambda m: (m.key, m.version)
    )
    for name in ("web", "api", "cart"):
        versions = [m.version for m in received if m.snapshot.workload.name == name]
        assert versions == [1, 2, 3]
    assert all(record.headers[TRACEPARENT] == TRACE[TRACEPARENT].encode() for record in records)


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
async def test_every_offered_batch_compression_goes_through_the_broker(
    settings: BusSettings, compression: str
) -> None:
    # PODCOST_KAFKA_COMPRESSION: the producer compresses its batches so (the broker keeps the
    # producer's codec), and a consumer reads them back unchanged: a small snapshot sent as it
    # is, and a large one gzipped one by one.
    compressing = settings.model_copy(update={"compression": compression})
    async with KafkaBus(compressing) as bus:
        await bus.ensure_topics(compressing.topics.shared())
        producer = bus._producer  # the aiokafka producer: the setting reached it
        assert producer._compression_type == (None if compression == "none" else compression)
        sent = [
            WorkloadSnapshotMessage.of(snapshot("web", version=1), emitted_at=1.0),
            WorkloadSnapshotMessage.of(snapshot("web", version=2, pods=40), emitted_at=2.0),
        ]
        for message in sent:
            await publish_message(bus, topics(bus).workloads, message, trace=TRACE)
        async with bus.consumer([topics(bus).workloads], group="ranker-age") as consumer:
            records = await take(consumer, len(sent))
    assert [CONTENT_ENCODING in record.headers for record in records] == [False, True]
    assert [decode(WorkloadSnapshotMessage, r.value, r.headers) for r in records] == sent


async def test_a_consumer_told_to_batch_its_fetches_still_gets_a_lone_record(
    settings: BusSettings,
) -> None:
    # PODCOST_KAFKA_FETCH_MIN_BYTES far above what comes: each fetch returns after the wait
    # with what there is, a record that trickles in is not held until the minimum is reached.
    batching = settings.model_copy(update={"fetch_min_bytes": 1 << 20, "fetch_max_wait_ms": 100})
    async with KafkaBus(batching) as bus:
        await bus.ensure_topics(batching.topics.shared())
        async with bus.consumer([topics(bus).workloads], group="ranker-age") as consumer:
            client = consumer._consumer  # the aiokafka consumer: the settings reached it
            assert (client._fetch_min_bytes, client._fetch_max_wait_ms) == (1 << 20, 100)
            await joined(consumer)
            for version in (1, 2):
                message = WorkloadSnapshotMessage.of(snapshot("web", version=version), emitted_at=1)
                await publish_message(bus, topics(bus).workloads, message, trace=TRACE)
                [record] = await take(consumer, 1)
                assert (
                    decode(WorkloadSnapshotMessage, record.value, record.headers).version == version
                )


async def test_a_consumer_that_crashes_before_committing_reads_the_message_again(
    bus: KafkaBus,
) -> None:
    topic = topics(bus).workloads
    message = WorkloadSnapshotMessage.of(snapshot(version=5), emitted_at=0.0)
    await publish_message(bus, topic, message)

    async with bus.consumer([topic], group="annotator") as crashing:
        [first] = await take(crashing, 1)
    # Left without a commit, as a process killed mid-work would.
    async with bus.consumer([topic], group="annotator") as restarted:
        [again] = await take(restarted, 1)
        await restarted.commit()
    assert (again.partition, again.offset) == (first.partition, first.offset)
    assert decode(WorkloadSnapshotMessage, again.value, again.headers) == message

    # Committed now: a third start skips it and gets only what comes next.
    later = WorkloadSnapshotMessage.of(snapshot(version=6), emitted_at=1.0)
    await publish_message(bus, topic, later)
    async with bus.consumer([topic], group="annotator") as third:
        [next_record] = await take(third, 1)
    assert decode(WorkloadSnapshotMessage, next_record.value, next_record.headers) == later


async def test_an_undecodable_message_is_dead_lettered_and_the_consumer_goes_on(
    bus: KafkaBus,
) -> None:
    workloads, deadletter = topics(bus).workloads, topics(bus).deadletter
    before = WorkloadSnapshotMessage.of(snapshot(version=1), emitted_at=0.0)
    after = WorkloadSnapshotMessage.of(snapshot(version=2), emitted_at=1.0)
    await publish_message(bus, workloads, before)
    await bus.publish(
        workloads, before.key, b"\x1f\x8b\x08 not really gzip", {CONTENT_ENCODING: b"gzip"}
    )
    await publish_message(bus, workloads, after)

    decoded: list[WorkloadSnapshotMessage] = []
    async with bus.consumer([workloads], group="ranker-spread") as consumer:
        for record in await take(consumer, 3):
            message = await decode_or_dead_letter(
                bus, record, WorkloadSnapshotMessage, topic=deadletter, group="ranker-spread"
            )
            if message is not None:
                decoded.append(message)
        await consumer.commit()
    assert decoded == [before, after]

    async with bus.consumer([deadletter], group="operator") as reader:
        [dead] = await take(reader, 1)
    letter = decode(DeadLetter, dead.value, dead.headers)
    assert letter.reason.startswith("bad gzip: Error -3 while decompressing data")
    assert letter.error == "DecodeError"
    assert letter.group == "ranker-spread"
    assert letter.topic == workloads
    assert letter.value == b"\x1f\x8b\x08 not really gzip"
    assert dead.key == before.key.encode()


async def test_a_10000_pod_snapshot_goes_through_the_broker_in_one_record(bus: KafkaBus) -> None:
    message = WorkloadSnapshotMessage.of(large_snapshot(), emitted_at=0.0)
    delivery = await publish_message(bus, topics(bus).workloads, message)
    async with bus.consumer([topics(bus).workloads], group="ranker-age") as consumer:
        [record] = await take(consumer, 1)
    assert (record.partition, record.offset) == (delivery.partition, delivery.offset)
    assert record.headers[CONTENT_ENCODING] == b"gzip"
    assert len(record.value) < 1_048_576
    decoded = decode(WorkloadSnapshotMessage, record.value, record.headers)
    assert len(decoded.snapshot.pods) == 10_000
    assert decoded == message


async def test_a_paused_consumer_gets_nothing_until_resumed_and_reports_its_lag(
    bus: KafkaBus,
) -> None:
    topic = topics(bus).costs
    key = "prod-eu-1/shop/Deployment/web"
    async with bus.consumer([topic], group="annotator") as consumer:
        await bus.publish(topic, key, b"first")
        [first] = await take(consumer, 1)
        consumer.pause()
        for value in (b"second", b"third"):
            await bus.publish(topic, key, value)
        assert await consumer.poll(max_wait=0.5) == []  # absence takes a wait to show
        lag = await consumer.lag()
        consumer.resume()
        rest = await take(consumer, 2)
    assert lag[first.tp] == 2
    assert [record.value for record in rest] == [b"second", b"third"]


async def test_a_member_polling_through_rebalances_loses_no_record(bus: KafkaBus) -> None:
    """Each rebalance revokes a member's partitions while it waits in a fetch, and that fetch then
    returns the first records of the new assignment: those must be delivered (aiokafka has
    already moved its position past them, so a record dropped there is never read again and the
    next commit covers it). A stream flows throughout while a second member joins and leaves
    three times; every record published must be delivered to one member or the other."""
    topic = topics(bus).workloads
    group = f"rebalance-{uuid.uuid4().hex[:8]}"
    published: set[tuple[int, int]] = set()
    delivered: set[tuple[int, int]] = set()

    async def produce() -> None:
        for index in range(100_000):
            delivery = await bus.publish(topic, f"workload-{index}", b"snapshot")
            published.add((delivery.partition, delivery.offset))
            await asyncio.sleep(0.01)

    async def work(consumer: KafkaConsumer, stop: asyncio.Event) -> None:
        # The ranker's loop: poll, process, commit what was processed.
        while not stop.is_set():
            records = await consumer.poll(max_wait=1.0)
            delivered.update((record.partition, record.offset) for record in records)
            await consumer.commit(records)

    async def owns(consumer: KafkaConsumer, count: int) -> None:
        for _ in range(int(WAIT_S / 0.1)):
            if len(consumer.assignment()) == count:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{count} partitions not assigned in {WAIT_S}s")

    async with bus.consumer([topic], group=group) as first:
        await joined(first)
        first_done = asyncio.Event()
        workers = [asyncio.create_task(work(first, first_done))]
        producer = asyncio.create_task(produce())
        try:
            for _ in range(3):
                await asyncio.sleep(1.0)
                second_done = asyncio.Event()
                async with bus.consumer([topic], group=group) as second:
                    workers.append(asyncio.create_task(work(second, second_done)))
                    await owns(second, 1)
                    await owns(first, 1)
                    await asyncio.sleep(1.5)
                    second_done.set()
                    await workers.pop()
                await owns(first, 2)  # the second left: the first takes its partition over
            await asyncio.sleep(1.0)
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
            for _ in range(int(WAIT_S / 0.1)):
                if published <= delivered:
                    break
                await asyncio.sleep(0.1)
        finally:
            producer.cancel()
            first_done.set()
            await asyncio.gather(*workers, producer, return_exceptions=True)
    missing = sorted(published - delivered)
    assert missing == [], f"{len(missing)} of {len(published)} records never delivered: {missing}"


async def test_creating_topics_that_exist_is_a_no_op_and_uses_the_configured_partitions(
    bus: KafkaBus,
) -> None:
    await bus.ensure_topics(topics(bus).shared())
    async with bus.consumer([topics(bus).ranks], group="aggregator") as consumer:
        await joined(consumer)
        assert consumer.assignment() == {
            TopicPartition(topics(bus).ranks, 0),
            TopicPartition(topics(bus).ranks, 1),
        }


async def test_a_topic_the_cluster_cannot_hold_is_refused_as_not_retriable(
    settings: BusSettings,
) -> None:
    too_many = settings.model_copy(update={"replication_factor": 3})
    with pytest.raises(BusError, match="InvalidReplicationFactor") as raised:
        await KafkaBus(too_many).ensure_topics([f"{settings.topic_costs}-replicated"])
    assert raised.value.retriable is False


async def test_a_broker_that_cannot_be_reached_is_a_retriable_error() -> None:
    unreachable = BusSettings(bootstrap_servers="127.0.0.1:1", request_timeout_ms=2000)
    with pytest.raises(BusError, match=r"cannot reach Kafka at 127\.0\.0\.1:1") as raised:
        await KafkaBus(unreachable).start()
    assert raised.value.retriable is True


async def test_publishing_before_start_is_a_clear_error(settings: BusSettings) -> None:
    with pytest.raises(BusError, match="not started"):
        await KafkaBus(settings).publish(settings.topic_costs, None, b"x")
