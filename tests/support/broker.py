"""What the real broker itself says about a test's topics (not what the services report): the
records its consumer groups have not committed yet, and how many records a topic holds. Used by
the broker outage tests (``tests/e2e/test_broker_outage.py``,
``tests/e2e/test_broker_outage_fleet.py``) and the soak (``tests/bench/bench_soak.py``)."""

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


async def _partitions(admin: AIOKafkaAdminClient, topics: Collection[str]) -> list[TopicPartition]:
    """Every partition of those of ``topics`` that exist, as the broker describes them (a
    consumer that subscribes to nothing knows no topic's partitions: its
    ``partitions_for_topic`` says ``None``). Only existing topics are described: a metadata
    request for a missing one would create it on a broker that creates topics on demand."""
    existing = sorted(set(await admin.list_topics()) & set(topics))
    if not existing:
        return []
    return [
        TopicPartition(described["topic"], partition["partition"])
        for described in await admin.describe_topics(existing)
        for partition in described["partitions"]
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
    return sum((await _lag_by_group(bootstrap, topics)).values())


async def lag_by_group(bootstrap: str, topics: Collection[str]) -> dict[str, int] | None:
    """``consumer_lag`` per consumer group: each group that has committed offsets on
    ``topics``, and the records of ``topics`` it has not committed yet; ``None`` while the
    broker cannot tell."""
    try:
        return await _lag_by_group(bootstrap, topics)
    except KafkaError as error:
        if not error.retriable:
            raise
        return None


async def _lag_by_group(bootstrap: str, topics: Collection[str]) -> dict[str, int]:
    async with _clients(bootstrap) as (admin, consumer):
        ends = await consumer.end_offsets(await _partitions(admin, topics))
        lags: dict[str, int] = {}
        for group, _ in await admin.list_consumer_groups():
            committed = await admin.list_consumer_group_offsets(group)
            for tp, meta in committed.items():
                if tp.topic in topics:
                    lag = max(0, ends.get(tp, meta.offset) - meta.offset)
                    lags[group] = lags.get(group, 0) + lag
        return lags


async def written_to(bootstrap: str, topics: Collection[str]) -> int:
    """The records ever written to ``topics``: their end offsets, summed (0 for a topic that
    does not exist). Unchanged between two calls: nothing was written in between."""
    async with _clients(bootstrap) as (admin, consumer):
        partitions = await _partitions(admin, topics)
        if not partitions:
            return 0
        ends = await consumer.end_offsets(partitions)
        return sum(ends[tp] for tp in partitions)


async def records_on(bootstrap: str, topics: Collection[str]) -> int:
    """The records ``topics`` hold (end minus beginning offsets; 0 for a topic that does not
    exist)."""
    async with _clients(bootstrap) as (admin, consumer):
        partitions = await _partitions(admin, topics)
        if not partitions:
            return 0
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        return sum(ends[tp] - starts[tp] for tp in partitions)


async def last_records(
    bootstrap: str, topics: Collection[str]
) -> dict[str, dict[bytes, tuple[bytes, dict[str, bytes]]]]:
    """Per topic, each key's last record (value, headers) as the broker holds it now: every
    partition read from its beginning up to its end offset at the call. Records without a key
    or a value are left out."""
    found: dict[str, dict[bytes, tuple[bytes, dict[str, bytes]]]] = {t: {} for t in topics}
    async with _clients(bootstrap) as (admin, consumer):
        partitions = await _partitions(admin, topics)
        if not partitions:
            return found
        ends = await consumer.end_offsets(partitions)
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        left = {tp for tp in partitions if ends[tp] > 0}
        while left:
            batches = await consumer.getmany(*left, timeout_ms=1000)
            for tp, records in batches.items():
                for record in records:
                    if record.key is not None and record.value is not None:
                        found[tp.topic][record.key] = (record.value, dict(record.headers))
            for tp in list(left):
                if await consumer.position(tp) >= ends[tp]:
                    left.discard(tp)
    return found
