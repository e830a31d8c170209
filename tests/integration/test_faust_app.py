"""``FaustKeyedApp`` against the project's real Kafka broker, in-process, with a processor of the
test's own: a table write while faust's producer knows nothing of the changelog topic, and an
app whose processor fails, which must stop (bounded) without committing the failed record.
Every test has its topics and faust app id of its own."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support.pipeline import eventually

from podcost_bus import BusSettings, KafkaBus
from podcost_bus.faust_app import FaustAppFailed, FaustKeyedApp
from podcost_bus.keyed import Drop
from podcost_bus.protocol import Record

pytestmark = pytest.mark.integration

PART = "value"


class Remember:
    """Keeps each key's last value; raises on a record whose value is ``fail_on``."""

    parts = (PART,)

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.fail_on = fail_on
        self.seen: list[bytes] = []

    def on_record(self, record: Record, state: bytes | None) -> bytes | Drop | None:
        self.seen.append(record.value)
        if record.value == self.fail_on:
            raise RuntimeError(f"cannot process {record.value!r}")
        return record.value

    def on_tick(self, key: bytes | None, state: bytes) -> bytes | None:
        return None

    async def flush(self) -> None:
        pass

    def wakeup(self, state: bytes) -> float | None:
        return None

    def now(self) -> float:
        return 0.0

    def waiting(self, state: bytes) -> bool:
        return False

    def dump(self, old: bytes | None, new: bytes) -> Mapping[str, bytes]:
        return {PART: new}

    def load(self, key: bytes | None, parts: Mapping[str, bytes | None]) -> bytes:
        return parts[PART] or b""


@dataclass
class Kafka:
    bus: KafkaBus
    source: str
    app_id: str
    data_dir: Path

    def app(self, processor: Remember, stop_timeout_s: float = 15.0) -> FaustKeyedApp[bytes]:
        return FaustKeyedApp(
            self.bus.settings,
            processor,
            app_id=self.app_id,
            topics=[self.source],
            data_dir=self.data_dir,
            commit_interval_s=0.2,
            stop_timeout_s=stop_timeout_s,
        )


@pytest.fixture
async def kafka(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Kafka]:
    run = uuid.uuid4().hex[:8]
    settings = BusSettings(
        bootstrap_servers=kafka_bootstrap,
        client_id=f"podcost-test-{run}",
        partitions=1,
        session_timeout_ms=6000,
    )
    source = f"test-{run}.source"
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([source])
        yield Kafka(bus, source, f"test-{run}-faust", tmp_path)


async def started(app: FaustKeyedApp[bytes]) -> asyncio.Task[None]:
    """``app`` running as a task, once it is ready (or has stopped: the caller's test fails)."""
    task = asyncio.create_task(app.run(), name=app.app_id)
    await eventually(lambda: task.done() or app.ready(), f"{app.app_id} ready", timeout=30.0)
    return task


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def changelog_client(app: FaustKeyedApp[bytes]) -> Any:
    """The aiokafka client of faust's producer, whose metadata faust partitions table keys by."""
    return app.app.producer._producer.client


async def test_a_table_write_waits_until_faust_s_producer_knows_the_changelog_topic(
    kafka: Kafka,
) -> None:
    processor = Remember()
    app = kafka.app(processor)
    task = await started(app)
    try:
        # The race seen in the end-to-end test, made certain: faust's producer has no metadata
        # for the changelog topic when the agent writes the table (the changelog topic was
        # created after the producer last refreshed its metadata).
        client = changelog_client(app)
        await client.set_topics([kafka.source])
        changelogs = app.changelog_topics()
        assert [client.cluster.partitions_for_topic(topic) for topic in changelogs] == [None]
        assert not app.ready()

        await kafka.bus.publish(kafka.source, b"key", b"first")
        await eventually(
            lambda: task.done() or app.tables[PART].get(b"key") == b"first",
            "the table to hold the value",
        )
        assert not task.done(), task.exception()
        assert client.cluster.partitions_for_topic(changelogs[0]) == {0}
        assert app.ready()
    finally:
        await stopped(task)


async def test_a_failing_processor_stops_the_app_promptly_and_its_record_is_read_again(
    kafka: Kafka,
) -> None:
    failing = Remember(fail_on=b"boom")
    app = kafka.app(failing, stop_timeout_s=20.0)
    task = await started(app)
    await kafka.bus.publish(kafka.source, b"key", b"fine")
    # In a batch of its own: a failure withholds its whole batch.
    await eventually(lambda: app.tables[PART].get(b"key") == b"fine", "fine to be stored")
    await kafka.bus.publish(kafka.source, b"key", b"boom")
    started_at = time.monotonic()
    with pytest.raises(FaustAppFailed, match="stopped processing"):
        await asyncio.wait_for(task, timeout=30.0)
    # Failed on "boom", then stopped by itself: well before the stop timeout would cut it short.
    assert time.monotonic() - started_at < 10.0
    assert failing.seen == [b"fine", b"boom"]

    # The failed record was not committed: the restarted app reads it again.
    again = Remember()
    app = kafka.app(again)
    task = await started(app)
    try:
        await eventually(lambda: b"boom" in again.seen, "the failed record to be read again")
        assert again.seen == [b"boom"]
        assert app.tables[PART].get(b"key") == b"boom"
    finally:
        await stopped(task)
