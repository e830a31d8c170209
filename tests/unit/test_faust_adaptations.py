"""podcost's repairs of faust, item by item (``podcost_bus.faust_adaptations``), without a broker.

The registry agrees with the module and with the installed faust: every cited line of faust,
aiokafka and mode still holds what it cites, in the versions it was read against, and every
proof named exists. Next to each repair that a unit can show, a "plain faust" test asserts the
defect as faust has it today: when a faust upgrade fixes it, that test fails, which says that the
repair may go (drop it from the module and the registry). The repairs that need a broker to show
are proven in ``tests/integration/test_faust_app.py``, ``test_faust_adaptations.py`` and
``test_core_replicas.py`` (the registry names each)."""

from __future__ import annotations

import ast
import asyncio
import importlib
import importlib.metadata
import inspect
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka.structs import RecordMetadata
from faust.transport.producer import ProducerBuffer
from faust.types.tuples import Message
from mode.threads import WorkerThread
from mode.utils.queues import FlowControlEvent, FlowControlQueue
from tests.unit.test_faust_transport import Offsets

from podcost_bus import BusSettings, faust_adaptations
from podcost_bus.faust_adaptations import (
    ADAPTATIONS,
    READ_AGAINST,
    ChangelogWrites,
    DaemonWorker,
    withhold,
    withhold_unacked,
)
from podcost_bus.faust_app import FaustKeyedApp

ROOT = Path(__file__).resolve().parents[2]

#: The distribution each cited package is installed from.
DISTRIBUTIONS = {"faust": "faust-streaming", "aiokafka": "aiokafka", "mode": "mode-streaming"}

#: What the module holds besides repairs: the wiring into faust, and the registry's types.
WIRING = {"App", "Transport", "Consumer", "ConsumerThread", "Upstream", "Adaptation"}


def _resolve(dotted: str) -> Any:
    """The object a dotted name (a module, then attributes) names."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:]:
            found = getattr(found, name)
        return found
    raise LookupError(dotted)


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def _flat(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_the_installed_faust_is_the_one_the_adaptations_were_read_against() -> None:
    # A failure here is an upgrade: read each adaptation's upstream lines again (the tests below
    # name the ones that moved), run the "plain faust" tests, then update READ_AGAINST.
    installed = {name: importlib.metadata.version(name) for name in READ_AGAINST}
    assert installed == READ_AGAINST
    assert set(DISTRIBUTIONS.values()) == set(READ_AGAINST)


def test_every_cited_line_of_faust_still_holds_what_the_adaptation_cites() -> None:
    moved = []
    for adaptation in ADAPTATIONS:
        for upstream in adaptation.upstream:
            distribution = importlib.metadata.distribution(DISTRIBUTIONS[upstream.package])
            path = Path(str(distribution.locate_file(upstream.package))) / upstream.path
            assert path.is_file(), f"{upstream.package}/{upstream.path} is gone"
            lines = path.read_text().splitlines()
            if upstream.text not in lines[upstream.line - 1]:
                moved.append(
                    f"{upstream.package}/{upstream.path}:{upstream.line} {upstream.text!r}"
                )
    assert moved == []


def test_every_repair_exists_and_its_docstring_cites_faust_and_names_its_proofs() -> None:
    for adaptation in ADAPTATIONS:
        first = _resolve(adaptation.repair[0])
        for dotted in adaptation.repair[1:]:
            _resolve(dotted)
        doc = _flat(inspect.getdoc(first) or "")
        for upstream in adaptation.upstream:
            assert _flat(upstream.path) in doc, (adaptation.repair[0], upstream.path)
            assert str(upstream.line) in doc, (adaptation.repair[0], upstream.line)
        for proof in adaptation.proofs:
            path, name = proof.split("::")
            assert name in _tests_in(ROOT / path), proof
            # Named by the test, or by its file for a test that proves much else besides.
            assert name in doc or Path(path).name in doc, (adaptation.repair[0], name)


def test_everything_the_module_defines_is_a_repair_of_the_registry_or_its_wiring() -> None:
    defined = {
        name
        for name, value in vars(faust_adaptations).items()
        if (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == faust_adaptations.__name__
    }
    repairs = {
        dotted.rsplit(".", 1)[1]
        for adaptation in ADAPTATIONS
        for dotted in adaptation.repair
        if dotted.startswith(faust_adaptations.__name__ + ".")
    }
    assert defined - WIRING == repairs


def test_the_docs_report_every_defect_with_its_repair_and_upstream_lines() -> None:
    page = (ROOT / "docs" / "reference" / "faust-defects.md").read_text()
    sections = re.split(r"^## ", page, flags=re.M)[1:]
    reports = [s for s in sections if re.match(r"\d+\. ", s)]
    assert len(reports) == len(ADAPTATIONS)
    for report, adaptation in zip(reports, ADAPTATIONS, strict=True):
        for dotted in adaptation.repair:
            assert dotted.rsplit(".", 1)[1] in report, (report.splitlines()[0], dotted)
        for upstream in adaptation.upstream:
            assert f"{upstream.path}:" in report, (report.splitlines()[0], upstream.path)
            assert str(upstream.line) in report, (report.splitlines()[0], upstream.line)
    for version in faust_adaptations.READ_AGAINST.values():
        assert version in page


# --- the repairs that a unit shows ----------------------------------------------------------


def test_plain_mode_runs_the_consumer_in_a_thread_that_keeps_a_process_alive() -> None:
    service = SimpleNamespace()
    assert not WorkerThread(service).daemon  # plain mode: the interpreter waits for it
    assert DaemonWorker(service).daemon


@pytest.fixture
async def keyed_app(tmp_path: Path) -> AsyncIterator[FaustKeyedApp[int]]:
    settings = BusSettings(bootstrap_servers="127.0.0.1:1", partitions=2, fetch_min_bytes=7)
    app = FaustKeyedApp(
        settings, Offsets(), app_id="test-adaptations", topics=["t.a"], data_dir=tmp_path
    )
    yield app
    close_consumer_thread_loop(app.app)


@pytest.fixture
async def plain() -> AsyncIterator[Any]:
    """A plain ``faust.App`` (never started)."""
    app = faust.App("test-plain-faust", broker="kafka://127.0.0.1:1", autodiscover=False)
    yield app
    close_consumer_thread_loop(app)


def close_consumer_thread_loop(app: Any) -> None:
    # faust's consumer, once made, has a thread of its own with its own event loop: an app that
    # is never started never closes it.
    app.consumer._thread.thread_loop.close()


async def test_plain_faust_fetches_with_a_wait_of_one_and_a_half_seconds(
    plain: Any, keyed_app: FaustKeyedApp[int]
) -> None:
    plain_consumer = plain.consumer._thread._create_worker_consumer(plain.transport)
    app = keyed_app.app
    adapted = app.consumer._thread._create_worker_consumer(app.transport)
    try:
        assert plain_consumer._fetch_max_wait_ms == 1500
        assert adapted._fetch_max_wait_ms == faust_adaptations.FETCH_MAX_WAIT_MS == 100
        assert adapted._fetch_min_bytes == 7  # the bus settings'
    finally:
        await plain_consumer.stop()
        await adapted.stop()


def _message(offset: int, generation: int) -> Message:
    return Message("t.a", 0, offset, 0.0, 0, {}, b"k", b"v", None, generation_id=generation)


async def test_plain_faust_records_for_its_commit_a_message_of_an_earlier_generation(
    plain: Any, keyed_app: FaustKeyedApp[int]
) -> None:
    for app in (plain, keyed_app.app):
        app.topics._acking_topics.add("t.a")  # what faust does for an agent's topic
        app.consumer_generation_id = 2  # after a rebalance
    # Plain faust: a stream skips a message fetched before the rebalance and acks it, and the
    # ack records its offset for the next commit, although nobody processed it.
    stale = _message(5, generation=1)
    assert plain.consumer.ack(stale)
    assert plain.consumer._acked[stale.tp] == [5]

    adapted = keyed_app.app.consumer
    stale = _message(5, generation=1)
    assert not adapted.ack(stale)  # withheld: never committed, read again after the seek
    assert stale.acked
    assert adapted._acked[stale.tp] == []
    assert adapted.ack(_message(5, generation=2))  # a message of this generation is acked
    assert adapted._acked[stale.tp] == [5]


async def test_plain_faust_clears_the_stream_buffers_on_every_resume(
    keyed_app: FaustKeyedApp[int],
) -> None:
    plain = FlowControlEvent(loop=asyncio.get_running_loop())
    buffer: FlowControlQueue[str] = FlowControlQueue(
        maxsize=10, flow_control=plain, clear_on_resume=True
    )
    plain.resume()  # a recovery's first resume: the changelogs are read
    buffer.put_nowait("fetched after the seek")
    plain.resume()  # its second, once the source partitions are sought
    assert buffer.qsize() == 0  # thrown away, past the fetch position: never read again
    # The adapted flow control keeps them (and clears after a suspension).
    flow = keyed_app.app.flow_control
    adapted = keyed_app.app.FlowControlQueue(maxsize=10, clear_on_resume=True)
    flow.resume()
    adapted.put_nowait("fetched after the seek")
    flow.resume()
    assert adapted.qsize() == 1


class SlowChannel:
    """Where faust's producer buffer hands a message: here, 0.5 s before it is sent."""

    async def publish_message(self, fut: Any, wait: bool = False) -> None:
        await asyncio.sleep(0.5)


async def test_plain_faust_s_producer_flush_returns_with_messages_still_buffered(
    plain: Any,
) -> None:
    # What faust awaits before it commits offsets: the flush gives up after 0.1 s without a
    # message sent, so a table write still buffered is not on the broker when its source
    # record is committed.
    buffer = ProducerBuffer(loop=asyncio.get_running_loop())
    buffer.app = plain
    await buffer.start()
    try:
        for _ in range(2):
            buffer.put(SimpleNamespace(message=SimpleNamespace(channel=SlowChannel())))
        began = time.monotonic()
        await buffer.flush()
        assert time.monotonic() - began < 0.5
        assert buffer.size == 1  # one message being sent, one still in the buffer
        while buffer.size:
            await buffer.flush()
    finally:
        await buffer.stop()


class Producer:
    """Stands for aiokafka's producer: ``send`` queues, the future resolves on delivery."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes]] = []
        self.deliveries: list[asyncio.Future[RecordMetadata]] = []

    async def send(
        self, topic: str, value: bytes | None, *, key: bytes
    ) -> asyncio.Future[RecordMetadata]:
        self.sent.append((topic, value, key))
        delivery: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery


async def test_changelog_writes_are_done_once_every_record_is_delivered() -> None:
    producer = Producer()
    writes = ChangelogWrites(producer)
    await writes.send("app-value-changelog", b"k1", b"v1")
    await writes.send("app-value-changelog", b"k2", None)  # a tombstone
    assert producer.sent == [
        ("app-value-changelog", b"v1", b"k1"),
        ("app-value-changelog", None, b"k2"),
    ]
    done = asyncio.ensure_future(writes.delivered())
    producer.deliveries[1].set_result(RecordMetadata("app-value-changelog", 0, None, 8, 0, 0, 0))
    await asyncio.sleep(0)  # one turn of the loop: not done with a record undelivered
    assert not done.done()
    producer.deliveries[0].set_result(RecordMetadata("app-value-changelog", 0, None, 7, 0, 0, 0))
    # Done, with the last offset written per changelog partition.
    assert await asyncio.wait_for(done, timeout=5) == {("app-value-changelog", 0): 8}


async def test_plain_faust_s_wait_for_acks_swallows_its_cancellation(plain: Any) -> None:
    # What faust's stop loops on while a message is unacked: cancelled, it returns as if an ack
    # came, so a time-out around the stop never ends it (hence stop_bounded).
    consumer = plain.consumer
    waiting = asyncio.ensure_future(consumer._wait_for_ack(timeout=1))
    await asyncio.sleep(0)  # it waits now
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert not waiting.cancelled()
    assert waiting.result() is None


async def test_a_withheld_message_is_never_recorded_for_a_commit_nor_waited_for(
    keyed_app: FaustKeyedApp[int],
) -> None:
    app = keyed_app.app
    app.topics._acking_topics.add("t.a")
    consumer = app.consumer
    held, other = _message(3, generation=0), _message(4, generation=0)
    consumer.track_message(held)
    consumer.track_message(other)
    withhold(held)
    assert not consumer.ack(held)  # the stream's ack when its agent is cancelled: a no-op
    consumer._clean_unacked_messages()  # what faust's wait for acks does each second
    assert set(consumer.unacked) == {other}
    withhold_unacked(consumer)
    consumer._clean_unacked_messages()
    assert set(consumer.unacked) == set()
    assert consumer._acked[held.tp] == []


def _changelog_event(partition: int, offset: int, key: bytes, value: bytes | None) -> Any:
    """A changelog record as faust's recovery hands it to a table (``value`` None: removed)."""
    message = Message("app-part-changelog", partition, offset, 0.0, 0, {}, key, value, None)
    return SimpleNamespace(key=key, value=value, message=message)


async def test_plain_faust_s_memory_store_persists_no_offset_and_drops_its_standby_records(
    plain: Any, keyed_app: FaustKeyedApp[int]
) -> None:
    active = _changelog_event(0, 0, b"mine", b"1").message.tp
    standby = _changelog_event(1, 0, b"theirs", b"1").message.tp
    stores = [plain.Table("part").data, next(iter(keyed_app.tables.values())).data]
    for store in stores:
        store.apply_changelog_batch(
            [
                _changelog_event(0, 3, b"mine", b"1"),
                _changelog_event(0, 4, b"gone", b"1"),
                _changelog_event(0, 5, b"gone", None),  # removed
                _changelog_event(1, 7, b"theirs", b"1"),
                _changelog_event(1, 8, b"theirs", b"2"),
            ],
            to_key=lambda key: key,
            to_value=lambda value: value,
        )
        assert dict(store.data) == {b"mine": b"1", b"theirs": b"2"}
    plain_store, store = stores
    # Plain faust: no offset, so a recovery of either partition reads its changelog from the
    # beginning; and once a recovery is complete, the standby partition's records are gone.
    assert plain_store.persisted_offset(active) is None
    assert plain_store.persisted_offset(standby) is None
    await plain_store.on_recovery_completed({active}, {standby})
    assert dict(plain_store.data) == {b"mine": b"1"}
    # The adapted store says how far it applied each partition and keeps the standby's records,
    # so a standby taking over reads only what follows; a partition that is neither is dropped
    # with its offset.
    assert store.persisted_offset(active) == 5
    assert store.persisted_offset(standby) == 8
    await store.on_recovery_completed({active}, {standby})
    assert dict(store.data) == {b"mine": b"1", b"theirs": b"2"}
    await store.on_recovery_completed({active}, set())
    assert dict(store.data) == {b"mine": b"1"}
    assert store.persisted_offset(standby) is None
    assert store.persisted_offset(active) == 5
