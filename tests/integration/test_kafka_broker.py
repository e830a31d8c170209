"""Proof that the project's own Kafka broker is real: aiokafka produces and consumes keyed
messages with headers through a topic, and a consumer group resumes from its committed offset."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

pytestmark = pytest.mark.integration


async def _create_topic(bootstrap: str, partitions: int = 1) -> str:
    topic = f"proof-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
        )
    finally:
        await admin.close()
    return topic


async def _consume(
    consumer: AIOKafkaConsumer, count: int
) -> list[tuple[bytes, bytes, dict[str, bytes]]]:
    received = []
    while len(received) < count:
        batch = await consumer.getmany(timeout_ms=10_000, max_records=count - len(received))
        if not batch:
            raise AssertionError(f"got {len(received)} of {count} messages before the timeout")
        for records in batch.values():
            for record in records:
                received.append((record.key, record.value, dict(record.headers)))
    return received


async def test_messages_keep_their_keys_and_headers_through_a_real_topic(
    kafka_bootstrap: str,
) -> None:
    topic = await _create_topic(kafka_bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for index in range(5):
            await producer.send_and_wait(
                topic,
                key=f"local/default/Deployment/web-{index}".encode(),
                value=f"snapshot-{index}".encode(),
                headers=[("traceparent", f"00-{index:032x}-{index + 1:016x}-01".encode())],
            )
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        received = await _consume(consumer, 5)
    finally:
        await consumer.stop()
    assert [key for key, _, _ in received] == [
        f"local/default/Deployment/web-{i}".encode() for i in range(5)
    ]
    assert [value for _, value, _ in received] == [f"snapshot-{i}".encode() for i in range(5)]
    assert received[3][2] == {"traceparent": f"00-{3:032x}-{4:016x}-01".encode()}


async def test_a_consumer_group_resumes_from_its_committed_offset(kafka_bootstrap: str) -> None:
    topic = await _create_topic(kafka_bootstrap)
    group = f"proof-group-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for index in range(10):
            await producer.send_and_wait(topic, key=b"k", value=str(index).encode())
    finally:
        await producer.stop()

    def group_consumer() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )

    first = group_consumer()
    await first.start()
    try:
        head = await _consume(first, 4)
        await first.commit({TopicPartition(topic, 0): 4})
    finally:
        await first.stop()
    assert [value for _, value, _ in head] == [b"0", b"1", b"2", b"3"]

    second = group_consumer()
    await second.start()
    try:
        tail = await _consume(second, 6)
        committed = await second.committed(TopicPartition(topic, 0))
    finally:
        await second.stop()
    assert [value for _, value, _ in tail] == [str(i).encode() for i in range(4, 10)]
    assert committed == 4
