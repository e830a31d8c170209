"""The in-process bus keeps the Kafka semantics the services rely on: order per key, consumer
groups, explicit commits that a restarted member resumes from, pause/resume, lag, bounded
memory, and dead-lettering of what cannot be decoded."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from tests.support.clock import FakeClock
from tests.support.snapshots import snapshot

from podcost_bus import (
    BusError,
    BusSettings,
    KafkaBus,
    MemoryBus,
    Record,
    TopicPartition,
    decode_or_dead_letter,
    open_bus,
    publish_message,
)
from podcost_bus.memory import MemoryConsumer
from podcost_contracts.messages import (
    SCHEMA_HEADER,
    TRACEPARENT,
    DeadLetter,
    WorkloadSnapshotMessage,
    decode,
)

TOPIC = "podcost.workloads"
KEYS = [f"prod/shop/Deployment/web-{index}" for index in range(12)]


async def publish_numbered(bus: MemoryBus, count: int, keys: list[str] = KEYS) -> list[str]:
    """``count`` records, keys taken in turn, each value ``key#n`` (n counts per key); returns
    the values."""
    sent: dict[str, int] = defaultdict(int)
    published = []
    for index in range(count):
        key = keys[index % len(keys)]
        published.append(f"{key}#{sent[key]}")
        await bus.publish(TOPIC, key, published[-1].encode())
        sent[key] += 1
    return published


def values(records: list[Record]) -> list[str]:
    return [record.value.decode() for record in records]


async def drain(consumer: MemoryConsumer) -> list[Record]:
    """Everything available now, without waiting."""
    return await consumer.poll(max_wait=0, max_records=10_000)


async def test_records_with_the_same_key_arrive_in_the_order_they_were_published() -> None:
    bus = MemoryBus(partitions=4)
    await publish_numbered(bus, 240)
    async with bus.consumer([TOPIC], group="ranker") as consumer:
        received = await drain(consumer)
    by_key: dict[bytes | None, list[str]] = defaultdict(list)
    for record in received:
        by_key[record.key].append(record.value.decode())
    assert len(received) == 240
    for key in KEYS:
        assert by_key[key.encode()] == [f"{key}#{n}" for n in range(20)]


async def test_a_key_always_lands_in_the_same_partition_and_keys_spread_over_all() -> None:
    bus = MemoryBus(partitions=3)
    await publish_numbered(bus, 120)
    partitions_of: dict[bytes | None, set[int]] = defaultdict(set)
    for record in bus.records(TOPIC):
        partitions_of[record.key].add(record.partition)
    assert all(len(used) == 1 for used in partitions_of.values())
    assert set().union(*partitions_of.values()) == {0, 1, 2}


async def test_each_consumer_group_reads_every_record() -> None:
    bus = MemoryBus()
    await publish_numbered(bus, 30)
    async with (
        bus.consumer([TOPIC], group="ranker-age") as age,
        bus.consumer([TOPIC], group="ranker-spread") as spread,
    ):
        assert sorted(values(await drain(age))) == sorted(values(await drain(spread)))
        assert len(bus.records(TOPIC)) == 30


async def test_members_of_one_group_share_the_partitions_and_each_record_goes_to_one() -> None:
    bus = MemoryBus(partitions=4)
    await publish_numbered(bus, 100)
    async with (
        bus.consumer([TOPIC], group="ranker") as first,
        bus.consumer([TOPIC], group="ranker") as second,
    ):
        assert first.assignment() | second.assignment() == {
            TopicPartition(TOPIC, p) for p in range(4)
        }
        assert not first.assignment() & second.assignment()
        from_first, from_second = await drain(first), await drain(second)
    assert sorted(values(from_first + from_second)) == sorted(values(bus.records(TOPIC)))
    assert from_first
    assert from_second


async def test_a_restarted_consumer_resumes_after_its_last_commit() -> None:
    bus = MemoryBus(partitions=1)
    await publish_numbered(bus, 5, keys=["c/ns/Deployment/web"])
    async with bus.consumer([TOPIC], group="annotator") as consumer:
        head = await consumer.poll(max_wait=0, max_records=3)
        assert await consumer.commit() == {TopicPartition(TOPIC, 0): 3}
    async with bus.consumer([TOPIC], group="annotator") as restarted:
        tail = await drain(restarted)
    assert values(head) == [f"c/ns/Deployment/web#{n}" for n in range(3)]
    assert values(tail) == [f"c/ns/Deployment/web#{n}" for n in range(3, 5)]


async def test_a_consumer_that_stops_before_committing_reads_the_same_records_again() -> None:
    bus = MemoryBus(partitions=1)
    await publish_numbered(bus, 3)
    async with bus.consumer([TOPIC], group="annotator") as crashing:
        first_time = await drain(crashing)
    async with bus.consumer([TOPIC], group="annotator") as restarted:
        second_time = await drain(restarted)
    assert values(first_time) == values(second_time) == values(bus.records(TOPIC))


async def test_committing_given_records_stores_the_offset_past_the_last_one_per_partition() -> None:
    bus = MemoryBus(partitions=1)
    await publish_numbered(bus, 6)
    async with bus.consumer([TOPIC], group="annotator") as consumer:
        received = await drain(consumer)
        committed = await consumer.commit([received[1], received[3], received[0]])
        assert committed == {TopicPartition(TOPIC, 0): 4}
        assert await consumer.commit([received[3]]) == {}  # nothing new to store
    assert bus.committed("annotator") == {TopicPartition(TOPIC, 0): 4}


async def test_when_a_member_leaves_the_others_take_over_its_partitions_from_the_commit() -> None:
    bus = MemoryBus(partitions=2)
    published = await publish_numbered(bus, 40)
    staying = bus.consumer([TOPIC], group="ranker")
    leaving = bus.consumer([TOPIC], group="ranker")
    await staying.start()
    await leaving.start()
    taken_over = leaving.assignment()
    processed = await leaving.poll(max_wait=0, max_records=5)
    await leaving.commit()
    await leaving.stop()
    assert staying.assignment() == {TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)}
    rest = await drain(staying)
    await staying.stop()
    from_taken_over = [record for record in rest if record.tp in taken_over]
    assert from_taken_over[0].offset == processed[-1].offset + 1
    assert sorted(values(processed + rest)) == sorted(published)


async def test_a_paused_consumer_delivers_nothing_until_it_is_resumed() -> None:
    bus = MemoryBus()
    async with bus.consumer([TOPIC], group="annotator") as consumer:
        consumer.pause()
        await publish_numbered(bus, 4)
        assert consumer.paused
        assert await drain(consumer) == []
        assert sum((await consumer.lag()).values()) == 4
        consumer.resume()
        assert len(await drain(consumer)) == 4


async def test_a_consumer_waiting_while_paused_wakes_up_when_resumed() -> None:
    bus = MemoryBus()
    await publish_numbered(bus, 1)
    async with bus.consumer([TOPIC], group="annotator") as consumer:
        consumer.pause()
        waiting = asyncio.create_task(anext(consumer))
        await asyncio.sleep(0)  # let it reach its wait
        assert not waiting.done()
        consumer.resume()
        record = await asyncio.wait_for(waiting, timeout=5)
    assert record.value == f"{KEYS[0]}#0".encode()


async def test_a_waiting_consumer_wakes_up_when_a_record_is_published() -> None:
    bus = MemoryBus()
    async with bus.consumer([TOPIC], group="ranker") as consumer:
        waiting = asyncio.create_task(consumer.poll())
        await asyncio.sleep(0)
        assert not waiting.done()
        await bus.publish(TOPIC, KEYS[0], b"hello")
        assert values(await asyncio.wait_for(waiting, timeout=5)) == ["hello"]


async def test_stopping_a_consumer_ends_its_iteration() -> None:
    bus = MemoryBus()
    await publish_numbered(bus, 2)
    consumer = bus.consumer([TOPIC], group="ranker")
    await consumer.start()
    seen: list[Record] = []

    async def read_all() -> None:
        async for record in consumer:
            seen.append(record)
            if len(seen) == 2:
                await consumer.stop()

    await asyncio.wait_for(read_all(), timeout=5)
    assert len(seen) == 2
    assert await consumer.poll(max_wait=0) == []


async def test_a_poll_with_a_deadline_returns_nothing_when_nothing_comes() -> None:
    bus = MemoryBus()
    async with bus.consumer([TOPIC], group="ranker") as consumer:
        assert await consumer.poll(max_wait=0.01) == []


async def test_lag_counts_the_records_not_yet_delivered_per_partition() -> None:
    bus = MemoryBus(partitions=1)
    await publish_numbered(bus, 5)
    async with bus.consumer([TOPIC], group="annotator") as consumer:
        assert await consumer.lag() == {TopicPartition(TOPIC, 0): 5}
        await consumer.poll(max_wait=0, max_records=2)
        assert await consumer.lag() == {TopicPartition(TOPIC, 0): 3}


async def test_a_new_group_reading_from_the_latest_offset_sees_only_new_records() -> None:
    bus = MemoryBus()
    await publish_numbered(bus, 5)
    async with bus.consumer([TOPIC], group="late", offset_reset="latest") as consumer:
        assert await drain(consumer) == []
        await bus.publish(TOPIC, KEYS[0], b"new")
        assert values(await drain(consumer)) == ["new"]


async def test_one_poll_returns_at_most_max_records() -> None:
    bus = MemoryBus()
    await publish_numbered(bus, 50)
    async with bus.consumer([TOPIC], group="ranker", max_poll_records=7) as consumer:
        assert len(await consumer.poll(max_wait=0)) == 7
        assert len(await consumer.poll(max_wait=0, max_records=3)) == 3


async def test_a_record_larger_than_kafka_allows_is_refused_and_not_worth_retrying() -> None:
    bus = MemoryBus(max_record_bytes=1000)
    with pytest.raises(BusError, match="larger than the limit of 1000") as raised:
        await bus.publish(TOPIC, KEYS[0], b"x" * 1000)
    assert raised.value.retriable is False
    assert bus.records(TOPIC) == []


async def test_an_illegal_topic_name_is_refused() -> None:
    with pytest.raises(BusError, match="not a legal Kafka topic name"):
        await MemoryBus().publish("no spaces please", None, b"x")


async def test_records_every_group_has_committed_are_dropped_once_old() -> None:
    clock = FakeClock(start=1_714_564_800.0)
    bus = MemoryBus(partitions=1, keep_committed_s=60, clock=clock.now)
    await publish_numbered(bus, 10)
    async with (
        bus.consumer([TOPIC], group="fast") as fast,
        bus.consumer([TOPIC], group="slow") as slow,
    ):
        await drain(fast)
        await fast.commit()
        await slow.poll(max_wait=0, max_records=4)
        await slow.commit()
        assert len(bus.records(TOPIC)) == 10  # committed by both, but not a minute old
        await clock.advance(61)
        await bus.publish(TOPIC, KEYS[0], b"later")
        assert [record.offset for record in bus.records(TOPIC)] == list(range(4, 11))
        assert len(await drain(slow)) == 7


async def test_committed_records_are_dropped_once_old_even_when_nothing_more_comes() -> None:
    clock = FakeClock(start=1_714_564_800.0)
    bus = MemoryBus(partitions=1, keep_committed_s=60, clock=clock.now)
    await publish_numbered(bus, 10)
    async with bus.consumer([TOPIC], group="only") as consumer:
        await drain(consumer)
        await consumer.commit()
        assert await consumer.poll(max_wait=0) == []
        assert len(bus.records(TOPIC)) == 10  # not a minute old yet
        await clock.advance(61)
        assert await consumer.poll(max_wait=0) == []  # an idle poll trims: no send, no commit
        assert bus.records(TOPIC) == []
        assert bus.end_offsets(TOPIC) == {TopicPartition(TOPIC, 0): 10}


async def test_a_group_joining_shortly_after_others_committed_still_reads_everything() -> None:
    clock = FakeClock(start=1_714_564_800.0)
    bus = MemoryBus(partitions=1, keep_committed_s=60, clock=clock.now)
    published = await publish_numbered(bus, 10)
    async with bus.consumer([TOPIC], group="ranker-age") as early:
        await drain(early)
        await early.commit()
    await clock.advance(30)
    async with bus.consumer([TOPIC], group="ranker-spread") as late:
        assert values(await drain(late)) == published


async def test_a_send_past_retention_records_a_reader_has_not_committed_waits_for_its_commit() -> (
    None
):
    # As an annotator paused at its high-water mark: the records it has not committed are kept,
    # and the producer waits (embedded mode dropped the oldest of them, silently).
    bus = MemoryBus(partitions=1, retention=5)
    told: list[str] = []
    bus.on_wait = told.append  # the embedded pipeline counts them in a metric
    async with bus.consumer([TOPIC], group="annotator") as consumer:
        await publish_numbered(bus, 5)
        sixth = asyncio.create_task(bus.publish(TOPIC, KEYS[0], b"5"))
        await asyncio.sleep(0)  # one turn of the loop: the send runs until it waits
        assert bus.waits == 1
        assert not sixth.done()
        first = await consumer.poll(max_wait=0, max_records=2)
        await consumer.commit(first)
        delivered = await sixth
        assert delivered.offset == 5
        read = first + await drain(consumer)
        assert [record.offset for record in read] == list(range(6))
        assert bus.waits == 1
        assert told == [TOPIC]
        assert bus.dropped == 0


async def test_records_only_a_group_without_members_lacks_are_dropped_past_retention_counted() -> (
    None
):
    bus = MemoryBus(partitions=1, retention=5)
    async with bus.consumer([TOPIC], group="gone"):
        pass
    await publish_numbered(bus, 12)
    assert [record.offset for record in bus.records(TOPIC)] == list(range(7, 12))
    assert bus.dropped == 7
    assert bus.waits == 0


async def test_send_queues_in_order_and_its_awaitable_says_where_the_record_landed() -> None:
    bus = MemoryBus(partitions=1)
    pending = [await bus.send(TOPIC, KEYS[0], str(n).encode()) for n in range(3)]
    deliveries = [await acked for acked in pending]
    assert [delivery.offset for delivery in deliveries] == [0, 1, 2]
    assert values(bus.records(TOPIC)) == ["0", "1", "2"]


async def test_publish_message_encodes_a_contract_message_under_its_key() -> None:
    bus = MemoryBus()
    message = WorkloadSnapshotMessage.of(snapshot(), emitted_at=0.0)
    trace = {TRACEPARENT: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    await publish_message(bus, TOPIC, message, trace=trace)
    [record] = bus.records(TOPIC)
    assert record.key == message.key.encode()
    assert record.headers[TRACEPARENT] == trace[TRACEPARENT].encode()
    assert decode(WorkloadSnapshotMessage, record.value, record.headers) == message


async def test_an_undecodable_record_is_dead_lettered_and_the_next_one_is_decoded() -> None:
    bus = MemoryBus(partitions=1)
    good = WorkloadSnapshotMessage.of(snapshot(), emitted_at=0.0)
    trace = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await bus.publish(
        TOPIC,
        good.key,
        b'{"schema_version": 1, "key": "broken',
        {SCHEMA_HEADER: b"workload-snapshot/1", TRACEPARENT: trace},
    )
    await publish_message(bus, TOPIC, good)
    decoded: list[WorkloadSnapshotMessage] = []
    async with bus.consumer([TOPIC], group="ranker-age") as consumer:
        for record in await drain(consumer):
            message = await decode_or_dead_letter(
                bus, record, WorkloadSnapshotMessage, topic="podcost.dl", group="ranker-age"
            )
            if message is not None:
                decoded.append(message)
        await consumer.commit()
    assert decoded == [good]
    [dead] = bus.records("podcost.dl")
    letter = decode(DeadLetter, dead.value, dead.headers)
    assert letter.reason.startswith("bad JSON: Invalid JSON: EOF while parsing a string")
    assert letter.error == "DecodeError"
    assert (letter.topic, letter.partition, letter.offset) == (TOPIC, 0, 0)
    assert letter.value == b'{"schema_version": 1, "key": "broken'
    assert letter.group == "ranker-age"
    assert dead.key == good.key.encode()
    assert dead.headers[TRACEPARENT] == trace
    assert bus.committed("ranker-age") == {TopicPartition(TOPIC, 0): 2}


async def test_a_huge_bad_record_is_dead_lettered_with_its_value_cut_short() -> None:
    bus = MemoryBus(partitions=1, max_record_bytes=2_000_000)
    await bus.publish(TOPIC, KEYS[0], bytes(range(256)) * 4096)  # 1 MiB of noise
    async with bus.consumer([TOPIC], group="ranker") as consumer:
        [record] = await drain(consumer)
        assert await decode_or_dead_letter(bus, record, WorkloadSnapshotMessage) is None
    [dead] = bus.records("podcost.deadletter")
    letter = decode(DeadLetter, dead.value, dead.headers)
    assert letter.truncated
    assert letter.value_size == 1_048_576
    assert letter.value == record.value[: len(letter.value)]
    assert len(dead.value) < 1_000_000


# --- settings --------------------------------------------------------------------------------


def test_without_kafka_configured_the_bus_is_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PODCOST_KAFKA", raising=False)
    assert isinstance(open_bus(BusSettings()), MemoryBus)


def test_settings_come_from_the_documented_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODCOST_KAFKA", "kafka-0:9092,kafka-1:9092")
    monkeypatch.setenv("PODCOST_KAFKA_CLIENT_ID", "podcost-annotator")
    monkeypatch.setenv("PODCOST_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("PODCOST_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("PODCOST_KAFKA_SASL_USERNAME", "podcost")
    monkeypatch.setenv("PODCOST_KAFKA_SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("PODCOST_KAFKA_LINGER_MS", "20")
    monkeypatch.setenv("PODCOST_TOPIC_COSTS", "team-a.podcost.costs")
    settings = BusSettings()
    assert settings.bootstrap_servers == "kafka-0:9092,kafka-1:9092"
    assert settings.client_id == "podcost-annotator"
    assert settings.sasl_password is not None
    assert settings.sasl_password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    assert settings.linger_ms == 20
    assert settings.topics.costs == "team-a.podcost.costs"
    assert settings.topics.ranks == "podcost.ranks"
    assert isinstance(open_bus(settings), KafkaBus)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PODCOST_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs PODCOST_KAFKA_SASL_MECHANISM"),
        ({"PODCOST_KAFKA_SASL_MECHANISM": "PLAIN"}, "PODCOST_KAFKA_SECURITY_PROTOCOL is PLAINTEXT"),
        (
            {
                "PODCOST_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "PODCOST_KAFKA_SASL_MECHANISM": "PLAIN",
            },
            "needs PODCOST_KAFKA_SASL_USERNAME and PODCOST_KAFKA_SASL_PASSWORD",
        ),
        ({"PODCOST_KAFKA_COMPRESSION": "lz4"}, "Input should be 'zstd', 'gzip' or 'none'"),
        ({"PODCOST_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"}, "Path does not point to a file"),
        ({"PODCOST_TOPIC_RANKS": "podcost.costs"}, "must name four distinct topics"),
        ({"PODCOST_TOPIC_RANKS": "bad name"}, "not a legal Kafka topic name"),
    ],
)
def test_inconsistent_settings_fail_at_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        BusSettings()
