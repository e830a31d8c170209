"""``FaustKeyedApp`` against the project's real Kafka broker, in-process, with processors of the
test's own: a table write while faust's producer knows nothing of the changelog topic, an app
whose processor fails, which must stop (bounded) without committing the failed record, per-key
order within a batch, and an app stopped in the middle of a batch whose outputs are not all
delivered: nothing of that batch is committed or stored, and the restart publishes them all; a
batch committed while faust's producer still buffers its states (they must be delivered
first); and a recovery whose changelog records are fetched but never reach it (as seen after a
consumer-group rebalance) is sought again and ends; a recovery restores every value and
removal written and says how far it applied the changelog (its own writes included), which is
where a standby that takes over starts reading; the progress watchdog: an app with a batch
stuck for good, one whose consumer stopped fetching, and one that does not start within its
bound exit (``Stalled``), and a batch longer than the stall bound whose every record is
quick enough does not. Every test has its topics and faust app id of its own."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from faust.types import TP
from tests.support.pipeline import eventually

from podcost_bus import BusSettings, Delivery, KafkaBus, faust_adaptations, faust_app
from podcost_bus.faust_app import FaustAppFailed, FaustKeyedApp
from podcost_bus.keyed import DROP, Drop
from podcost_bus.protocol import Record

pytestmark = pytest.mark.integration

PART = "value"


class Remember:
    """Keeps each key's last value; raises on a record whose value is ``fail_on``."""

    parts = (PART,)

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.fail_on = fail_on
        self.seen: list[bytes] = []

    def split(self, record: Record) -> list[tuple[bytes | None, Record]]:
        return [(record.key, record)]

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


class Relay(Remember):
    """Keeps each key's values joined by ``|`` and publishes every record's value to ``out``
    in :meth:`flush`; a batch holding ``hold`` gets the outputs of the records before it
    acknowledged, then never finishes (as if the process died there)."""

    def __init__(self, bus: KafkaBus, out: str, hold: bytes | None = None) -> None:
        super().__init__()
        self.bus = bus
        self.out = out
        self.hold = hold
        self.queued: list[Record] = []
        self.batches: list[list[bytes]] = []

    def split(self, record: Record) -> list[tuple[bytes | None, Record]]:
        return [(record.key, record)]

    def on_record(self, record: Record, state: bytes | None) -> bytes | Drop | None:
        self.seen.append(record.value)
        self.queued.append(record)
        return record.value if state is None else state + b"|" + record.value

    async def flush(self) -> None:
        queued, self.queued = self.queued, []
        self.batches.append([record.value for record in queued])
        values = [record.value for record in queued]
        delivered = values[: values.index(self.hold)] if self.hold in values else values
        acks = [await self.bus.send(self.out, b"key", value) for value in delivered]
        await asyncio.gather(*acks)
        if len(delivered) < len(values):
            await asyncio.Event().wait()  # "dies" here: the rest is never sent


class Writes(Remember):
    """Keeps each key's last value; a record whose value is ``-`` removes the key's state."""

    def on_record(self, record: Record, state: bytes | None) -> bytes | Drop | None:
        self.seen.append(record.value)
        return DROP if record.value == b"-" else record.value


class DueAt(Remember):
    """Each key's state is the time it is due (the record's value); a tick marks a due state
    ``done`` and remembers its key. Its clock starts at 0 (nothing is ever due) until
    ``clock`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = 0.0
        self.ticked: set[bytes] = set()

    def on_tick(self, key: bytes | None, state: bytes) -> bytes | None:
        assert key is not None
        self.ticked.add(key)
        return b"done"

    def wakeup(self, state: bytes) -> float | None:
        return None if state == b"done" else float(state)

    def now(self) -> float:
        return self.clock


class DueAtTold(DueAt):
    """:class:`DueAt` that tells a stored state's wake-up from its parts; counts its decodes."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[bytes] = []

    def stored_wakeup(self, key: bytes | None, parts: Mapping[str, bytes | None]) -> float | None:
        return self.wakeup(parts[PART] or b"")

    def load(self, key: bytes | None, parts: Mapping[str, bytes | None]) -> bytes:
        assert key is not None
        self.loaded.append(key)
        return super().load(key, parts)


@dataclass
class Kafka:
    bus: KafkaBus
    source: str
    app_id: str
    data_dir: Path

    def app(
        self, processor: Remember, stop_timeout_s: float = 15.0, **watchdog: float
    ) -> FaustKeyedApp[bytes]:
        return FaustKeyedApp(
            self.bus.settings,
            processor,
            app_id=self.app_id,
            topics=[self.source],
            data_dir=self.data_dir,
            commit_interval_s=0.2,
            stop_timeout_s=stop_timeout_s,
            **watchdog,
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
        # Plain faust's table write partitions eagerly from that metadata, and fails on it.
        with pytest.raises(TypeError):
            app.app.producer.key_partition(changelogs[0], b"key")

        await kafka.bus.publish(kafka.source, b"key", b"first")
        await eventually(
            lambda: task.done() or (app.ready() and app.tables[PART].get(b"key") == b"first"),
            "the table to hold the value, and the app ready",
        )
        assert not task.done(), task.exception()
        assert client.cluster.partitions_for_topic(changelogs[0]) == {0}
        # The write's changelog record is on the broker: what a recovery reads.
        assert await read_all(kafka.bus, changelogs[0], 1) == [b"first"]
    finally:
        await stopped(task)


async def test_an_idle_app_whose_producer_lost_the_changelog_metadata_gets_it_back_by_itself(
    kafka: Kafka,
) -> None:
    # Seen in tests/e2e/test_sigkill.py: after the start faust's producer knew one changelog
    # topic of two, nothing was published, and the app was never ready again.
    app = kafka.app(Remember())
    task = await started(app)
    try:
        await changelog_client(app).set_topics([kafka.source])
        assert not app.ready()
        await eventually(lambda: task.done() or app.ready(), "ready again", timeout=15.0)
        assert not task.done(), task.exception()
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


async def published(bus: KafkaBus, topic: str, values: list[bytes]) -> list[Delivery]:
    """Publish ``values`` under one key, all queued before any acknowledgement is awaited (so
    they are read together, in batches of more than one)."""
    acks = [await bus.send(topic, b"key", value) for value in values]
    return list(await asyncio.gather(*acks))


async def read_all(bus: KafkaBus, topic: str, count: int) -> list[bytes]:
    """The values of the first ``count`` records of ``topic`` (one partition)."""
    consumer = bus.consumer([topic], group=f"test-reader-{uuid.uuid4().hex}")
    values: list[bytes] = []
    async with consumer:
        deadline = time.monotonic() + 30.0
        while len(values) < count and time.monotonic() < deadline:
            values.extend(record.value for record in await consumer.poll(max_wait=1.0))
    return values


async def committed(kafka: Kafka) -> int | None:
    """The faust app's committed offset on the source partition (``None``: none yet)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bus.settings.bootstrap_servers)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(kafka.app_id)
    finally:
        await admin.close()
    found = [meta.offset for tp, meta in offsets.items() if tp.topic == kafka.source]
    return found[0] if found and found[0] >= 0 else None


async def test_records_of_one_key_in_one_batch_see_each_other_s_state_in_order(
    kafka: Kafka,
) -> None:
    out = f"{kafka.source}.out"
    await kafka.bus.ensure_topics([out])
    relay = Relay(kafka.bus, out)
    app = kafka.app(relay)
    task = await started(app)
    values = [f"v{index}".encode() for index in range(40)]
    try:
        await published(kafka.bus, kafka.source, values)
        whole = b"|".join(values)
        await eventually(lambda: app.tables[PART].get(b"key") == whole, "every value stored")
    finally:
        await stopped(task)
    assert relay.seen == values
    assert max(len(batch) for batch in relay.batches) > 1  # batched, and still in order


async def test_a_stop_in_the_middle_of_a_batch_commits_and_stores_nothing_of_it_and_loses_nothing(
    kafka: Kafka,
) -> None:
    out = f"{kafka.source}.out"
    await kafka.bus.ensure_topics([out])
    first = [b"a", b"b", b"c"]
    held = [b"d", b"e", b"hold", b"f"]
    relay = Relay(kafka.bus, out, hold=b"hold")
    app = kafka.app(relay, stop_timeout_s=3.0)
    task = await started(app)
    try:
        deliveries = await published(kafka.bus, kafka.source, first)
        await eventually(lambda: app.tables[PART].get(b"key") == b"a|b|c", "the first batch")

        async def committed_all() -> bool:
            return await committed(kafka) == deliveries[-1].offset + 1

        deadline = time.monotonic() + 20.0
        while not await committed_all():
            assert time.monotonic() < deadline, "the first records were never committed"
            await asyncio.sleep(0.1)
        held_deliveries = await published(kafka.bus, kafka.source, held)
        await eventually(lambda: b"hold" in relay.seen, "the held batch to be decided")
    finally:
        await stopped(task)  # a crash-stop: the held batch never finishes

    batch = relay.batches[-1]  # the one with "hold" (the records before it may have had theirs)
    start = held.index(batch[0])
    # Outputs were delivered up to "hold", the rest never: nothing of the held batch is
    # committed (so nothing beyond the delivered outputs) nor stored.
    assert await committed(kafka) == held_deliveries[start].offset
    assert app.tables[PART].get(b"key") == b"|".join([*first, *held[:start]])

    again = Relay(kafka.bus, out)
    app = kafka.app(again)
    task = await started(app)
    try:
        whole = b"|".join([*first, *held])
        await eventually(
            lambda: task.done() or app.tables[PART].get(b"key") == whole,
            "the state to go on",
            timeout=60.0,
        )
        assert not task.done(), task.exception()
    finally:
        await stopped(task)
    assert again.seen == held[start:]  # what was committed is not read again; the rest all is
    # Every record's output at least once: those of the held batch before "hold" twice
    # (delivered, not committed), the others once.
    delivered = batch[: batch.index(b"hold")]
    expected = [*first, *held[:start], *delivered, *held[start:]]
    assert await read_all(kafka.bus, out, len(expected)) == expected


async def test_a_commit_never_passes_records_whose_states_faust_has_not_sent_yet(
    kafka: Kafka,
) -> None:
    # faust flushes its producer before it commits offsets, but the flush of the buffer that
    # table writes go through gives up once 0.1 s pass without a message sent
    # (``ProducerBuffer.flush_atmost``), and a stop drops what the buffer still holds. The
    # app's state writes are slowed here (0.3 s before each changelog record is handed to the
    # producer), in the test's own process: a stand-in for an event loop that a loaded machine
    # starves, which no server produces on demand. The batch must not be committed before its
    # states are delivered, or the states a restart recovers lack records nobody reads again.
    app = kafka.app(Remember())
    task = await started(app)
    producer = app._producer()
    send = producer.send
    changelogs = set(app.changelog_topics())
    slowed: list[str] = []

    async def slow_send(topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic in changelogs:
            slowed.append(topic)
            await asyncio.sleep(0.3)
        return await send(topic, *args, **kwargs)

    producer.send = slow_send  # looked up for every batch's writes
    keys = [b"k1", b"k2", b"k3", b"k4"]
    try:
        acks = [await kafka.bus.send(kafka.source, key, b"v-" + key) for key in keys]
        deliveries = await asyncio.gather(*acks)
        end = max(delivery.offset for delivery in deliveries) + 1
        deadline = time.monotonic() + 30.0
        while await committed(kafka) != end:
            assert not task.done(), task.exception()
            assert time.monotonic() < deadline, "the records were never committed"
            await asyncio.sleep(0.05)
    finally:
        await stopped(task)  # at once, once committed: what faust still buffered is dropped
    assert len(slowed) >= len(keys)  # every state write was slowed

    again = kafka.app(Remember())
    task = await started(again)
    try:
        recovered = {key: again.tables[PART].get(key) for key in keys}
    finally:
        await stopped(task)
    assert recovered == {key: b"v-" + key for key in keys}


async def test_an_app_that_stops_making_progress_turns_not_ready_then_exits_stalled(
    kafka: Kafka,
) -> None:
    # A batch stuck for good (its flush never returns): nothing raises, faust goes on fetching
    # and the app stays assigned, so only the progress watchdog can tell its supervisor.
    out = f"{kafka.source}.out"
    await kafka.bus.ensure_topics([out])
    relay = Relay(kafka.bus, out, hold=b"hold")
    app = kafka.app(relay, stop_timeout_s=3.0, stall_s=4.0)
    task = await started(app)
    await published(kafka.bus, kafka.source, [b"a", b"hold"])
    held_at = time.monotonic()
    await eventually(lambda: task.done() or not app.ready(), "not ready", timeout=15.0)
    assert not task.done(), task.exception()
    with pytest.raises(faust_app.Stalled, match="to process and none processed"):
        await asyncio.wait_for(task, timeout=30.0)
    assert time.monotonic() - held_at < 20.0
    assert b"hold" in relay.seen


class Slow(Remember):
    """Takes ``seconds`` of the event loop to decide each record (as a large snapshot does)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_record(self, record: Record, state: bytes | None) -> bytes | Drop | None:
        time.sleep(self.seconds)  # the decision's own work, which holds the loop
        return super().on_record(record, state)


async def test_a_batch_longer_than_the_stall_bound_whose_records_each_progress_is_no_stall(
    kafka: Kafka,
) -> None:
    # 16 records of 0.5 s in one batch: 8 s, twice the stall bound, each record well within it.
    values = [f"v{index}".encode() for index in range(16)]
    await published(kafka.bus, kafka.source, values)
    processor = Slow(0.5)
    app = kafka.app(processor, stop_timeout_s=3.0, stall_s=4.0)
    task = asyncio.create_task(app.run(), name=app.app_id)
    try:
        store = app.tables[PART].data.data  # the table's memory store: written once done
        await eventually(
            lambda: task.done() or store.get(b"key") == values[-1], "the batch done", 60.0
        )
        assert not task.done(), task.exception()
        assert processor.seen == values
    finally:
        await stopped(task)


async def test_an_app_whose_consumer_stops_fetching_sees_its_lag_from_the_broker_and_exits(
    kafka: Kafka,
) -> None:
    # As after a broker outage that stalled the consumer: it fetches nothing any more, so the
    # highwaters it knows never move; the watchdog asks the broker for the end offsets.
    processor = Remember()
    app = kafka.app(processor, stop_timeout_s=3.0, stall_s=4.0)
    task = await started(app)
    await kafka.bus.publish(kafka.source, b"key", b"a")
    await eventually(lambda: task.done() or processor.seen == [b"a"], "a to be processed")
    thread = app.app.consumer._thread
    consumer = thread._ensure_consumer()
    sources = [tp for tp in consumer.assignment() if tp.topic == kafka.source]
    await thread.call_thread(lambda: consumer.pause(*sources))
    await kafka.bus.publish(kafka.source, b"key", b"b")
    with pytest.raises(faust_app.Stalled, match="1 records to process and none processed"):
        await asyncio.wait_for(task, timeout=30.0)
    assert processor.seen == [b"a"]


async def test_an_app_that_does_not_start_within_its_bound_exits_stalled(kafka: Kafka) -> None:
    # Joining the group alone takes longer than this bound: the start counts as hung.
    app = kafka.app(Remember(), stop_timeout_s=5.0, start_timeout_s=0.5)
    with pytest.raises(faust_app.Stalled, match="not started"):
        await asyncio.wait_for(app.run(), timeout=60.0)
    # Whether faust stopped or not, its consumer thread never keeps the process from exiting,
    # nor goes on consuming in a process that goes on.
    worker = app.app.consumer._thread._thread
    assert worker.daemon
    assert not worker.is_alive()


async def test_a_stop_faust_never_ends_still_ends_its_consumer_thread(
    kafka: Kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = kafka.app(Remember(), stop_timeout_s=1.0)
    task = await started(app)
    worker = app.app.consumer._thread._thread
    assert worker.is_alive()
    stop = app.app.stop
    never = asyncio.Event()
    monkeypatch.setattr(app.app, "stop", never.wait)  # faust's stop hangs for good
    await stopped(task)
    # The app gave up on faust, and its consumer thread does not go on fetching in this process.
    assert not worker.is_alive()
    await asyncio.wait_for(stop(), timeout=30.0)  # the rest of faust, for this test's end


async def test_a_recovery_that_gets_none_of_its_changelog_records_seeks_them_again_and_ends(
    kafka: Kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = kafka.app(Remember())
    task = await started(first)
    try:
        for index in range(5):
            await published(kafka.bus, kafka.source, [f"v{index}".encode()])
            await eventually(
                lambda index=index: first.tables[PART].get(b"key") == f"v{index}".encode(),
                f"v{index} stored",
            )
    finally:
        await stopped(task)

    # The next app's recovery drops every changelog record the first time it is delivered, as
    # faust was seen to (fetched, the position past them, and never applied): the recovery
    # would wait for them forever.
    monkeypatch.setattr(faust_app, "RECOVERY_STALL_S", 2.0)
    second = kafka.app(Remember())
    queue = second.app.tables.changelog_queue
    get = queue.get
    dropped: set[int] = set()

    async def drop_once() -> Any:
        while True:
            event = await get()
            if event.message.offset not in dropped:
                dropped.add(event.message.offset)
                continue
            return event

    get_nowait = queue.get_nowait

    def drop_once_nowait() -> Any:
        # The recovery takes what is already queued without waiting.
        while True:
            event = get_nowait()
            if event.message.offset not in dropped:
                dropped.add(event.message.offset)
                continue
            return event

    monkeypatch.setattr(queue, "get", drop_once)
    monkeypatch.setattr(queue, "get_nowait", drop_once_nowait)
    task = await started(second)
    try:
        assert second.ready()
        assert dropped
        assert second.tables[PART].get(b"key") == b"v4"
    finally:
        await stopped(task)


@pytest.mark.parametrize("told", [False, True], ids=["decoded", "told-from-parts"])
async def test_the_states_a_recovery_restores_are_scanned_after_it_and_their_wake_ups_kept(
    kafka: Kafka, monkeypatch: pytest.MonkeyPatch, told: bool
) -> None:
    due = [f"due{index}".encode() for index in range(100)]
    later = [f"later{index}".encode() for index in range(100)]
    first = kafka.app(DueAt())
    task = await started(first)
    try:
        acks = [await kafka.bus.send(kafka.source, key, b"1.0") for key in due]
        acks += [await kafka.bus.send(kafka.source, key, b"100.0") for key in later]
        end = max(delivery.offset for delivery in await asyncio.gather(*acks)) + 1
        deadline = time.monotonic() + 30.0
        while await committed(kafka) != end:  # so that the next app reads none of them again
            assert not task.done(), task.exception()
            assert time.monotonic() < deadline, "the records were never committed"
            await asyncio.sleep(0.1)
    finally:
        await stopped(task)

    # The next app restores them and scans them a slice of one state at a time, with its clock
    # past the wake-ups of ``due``: each of those is ticked once. A processor that tells the
    # wake-ups from the stored parts has none of the others decoded.
    monkeypatch.setattr(faust_app, "SCAN_SLICE_S", 0.0)
    processor = DueAtTold() if told else DueAt()
    processor.clock = 2.0
    second = kafka.app(processor)
    task = await started(second)
    try:
        await eventually(
            lambda: task.done() or processor.ticked == set(due), "every due state ticked"
        )
        assert not task.done(), task.exception()
        await eventually(
            lambda: all(second.tables[PART].get(key) == b"done" for key in due),
            "every ticked state stored",
        )
        assert all(second.tables[PART].get(key) == b"100.0" for key in later)
        if isinstance(processor, DueAtTold):
            assert set(processor.loaded) == set(due)
    finally:
        await stopped(task)


async def end_offset(kafka: Kafka, topic: str) -> int:
    """The end offset of ``topic``'s partition 0 (the offset its next record gets)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bus.settings.bootstrap_servers)
    await consumer.start()
    try:
        tp = KafkaTopicPartition(topic, 0)
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()


async def test_a_recovery_restores_every_value_and_removal_and_says_how_far_it_applied(
    kafka: Kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [f"k{index}".encode() for index in range(60)]
    first = kafka.app(Writes())
    task = await started(first)
    try:
        acks = [await kafka.bus.send(kafka.source, key, b"1") for key in keys]
        acks += [await kafka.bus.send(kafka.source, key, b"-") for key in keys[:20]]
        acks += [await kafka.bus.send(kafka.source, key, b"2") for key in keys[20:40]]
        # Written again after its removal, then removed again.
        acks += [await kafka.bus.send(kafka.source, keys[0], value) for value in (b"3", b"-")]
        end = max(delivery.offset for delivery in await asyncio.gather(*acks)) + 1
        deadline = time.monotonic() + 30.0
        while await committed(kafka) != end:  # every state written and delivered
            assert not task.done(), task.exception()
            assert time.monotonic() < deadline, "the records were never committed"
            await asyncio.sleep(0.1)
        written = dict(first.tables[PART].data.data)
    finally:
        await stopped(task)
    assert written == {key: b"2" for key in keys[20:40]} | {key: b"1" for key in keys[40:]}

    # The next app restores the same from the changelog, its tombstones included, taking a
    # few queued records at a time and applying its table's buffer whenever it is full.
    monkeypatch.setattr(faust_adaptations, "RECOVERY_DRAIN_MAX", 7)
    second = kafka.app(Remember())
    second.tables[PART].recovery_buffer_size = 10
    taken: dict[str, int] = {}
    second.app.on_recovery_read = lambda role, count: taken.update(
        {role: taken.get(role, 0) + count}
    )
    task = await started(second)
    try:
        store = second.tables[PART].data
        assert dict(store.data) == written
        # Every changelog record was taken once, into a partition of its own (active).
        changelog_end = await end_offset(kafka, second.changelog_topics()[0])
        assert taken == {faust_adaptations.ACTIVE: changelog_end}
        # And it says the last changelog offset it applied: a recovery of this partition by
        # this member (a standby taking over) reads only the records after it.
        tp = TP(second.changelog_topics()[0], 0)
        recovered = store.persisted_offset(tp)
        assert recovered == await end_offset(kafka, tp.topic) - 1
        # Its own writes count too, once the broker has them: a partition it keeps through a
        # rebalance is not read again.
        await published(kafka.bus, kafka.source, [b"4"])
        await eventually(lambda: store.persisted_offset(tp) != recovered, "the write counted")
        assert store.data.get(b"key") == b"4"
        assert store.persisted_offset(tp) == await end_offset(kafka, tp.topic) - 1
    finally:
        await stopped(task)
