"""The repairs of faust that only a real broker shows (``podcost_bus.faust_adaptations``): the
defect as aiokafka, under faust, has it today, next to podcost's repair. When an upgrade fixes
the defect, the "plain" assertion fails, which says that the repair may go. The other repairs are
proven in ``tests/unit/test_faust_adaptations.py`` and ``test_faust_app.py``."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from podcost_bus import BusSettings, KafkaBus
from podcost_bus.faust_adaptations import seek_uncommitted_to_beginning

pytestmark = pytest.mark.integration


async def test_plain_aiokafka_s_seek_to_committed_leaves_an_uncommitted_partition_past_its_records(
    kafka_bootstrap: str,
) -> None:
    run = uuid.uuid4().hex[:8]
    topic = f"test-{run}.source"
    settings = BusSettings(bootstrap_servers=kafka_bootstrap, partitions=1)
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([topic])
        for value in (b"a", b"b", b"c"):
            await bus.publish(topic, b"key", value)
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        group_id=f"test-{run}-group",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        # Fetched (the position moved past them) and, as faust does around a rebalance, never
        # delivered: the seek to the committed offsets is what should read them again.
        fetched = await consumer.getmany(tp, timeout_ms=10_000)
        assert [record.value for record in fetched[tp]] == [b"a", b"b", b"c"]
        committed = await consumer.seek_to_committed()
        assert committed == {tp: None}  # nobody committed this partition
        assert await consumer.position(tp) == 3  # plain aiokafka: left past them

        positions = await seek_uncommitted_to_beginning(consumer, committed)
        assert positions == {tp: 0}
        assert await consumer.position(tp) == 0
        again = await consumer.getmany(tp, timeout_ms=10_000)
        assert [record.value for record in again[tp]] == [b"a", b"b", b"c"]
    finally:
        await consumer.stop()
