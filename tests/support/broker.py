"""What the real broker itself says about a test's topics (not what the services report): the
records its consumer groups have not committed yet, and how many records a topic holds. Used by
the broker outage tests (``tests/e2e/test_broker_outage.py``,
``tests/e2e/test_broker_outage_fleet.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError


@asynccontextmanager
async def _clients(bootstrap: str) -> AsyncIterator[tuple[AIOKafkaAdminClient, AIOKafkaConsumer]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    # aiokafka 0.14 stops a consumer whose coordinator task never ran with that task's
    # CancelledError: let it run once.
    await asyncio.sleep(0)
    try:
        yield admin, consumer
    finally:
        await consumer.stop()
        await admin.close()


def _partitions(consumer: AIOKafkaConsumer, topics: Collection[str]) -> list[TopicPartition]:
    return [
        TopicPartition(topic, p)
        for topic in topics
        for p in (consumer.partitions_for_topic(topic) or set())
    ]


async def consumer_lag(bootstrap: str, topics: Collection[str]) -> int | None:
    """Records of ``topics`` any consumer group has committed offsets on but not up to the end;
    ``None`` while the broker cannot tell (a retriable error: just back, it is still loading its
    groups, ``GroupLoadInProgressError``)."""
    try:
        return await _lag(bootstrap, topics)
    except KafkaError as error:
        if not error.retriable:
            raise
        return None


async def _lag(bootstrap: str, topics: Collection[str]) -> int:
    async with _clients(bootstrap) as (admin, consumer):
        ends = await consumer.end_offsets(_partitions(consumer, topics))
        total = 0
        for group, _ in await admin.list_consumer_groups():
            committed = await admin.list_consumer_group_offsets(group)
            for tp, meta in committed.items():
                if tp.topic in topics:
                    total += max(0, ends.get(tp, meta.offset) - meta.offset)
        return total


async def records_on(bootstrap: str, topics: Collection[str]) -> int:
    """The records ``topics`` hold (end minus beginning offsets; 0 for a topic that does not
    exist)."""
    async with _clients(bootstrap) as (_, consumer):
        partitions = _partitions(consumer, topics)
        if not partitions:
            return 0
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        return sum(ends[tp] - starts[tp] for tp in partitions)
