"""The faust transport's own guard, without a broker: a record that faust skips stops the app
before anything of its batch is processed (and acked), so the restart reads it again; a skip right
after the seek to the committed offset is caught too; and resuming a flow that was not suspended
keeps the records the streams buffered (faust would clear them); a changelog partition whose
recovery stalls is found, to be sought again. The transport
against the real broker is ``tests/integration/test_ranker_aggregator.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import SimpleNamespace

from aiokafka.partitioner import DefaultPartitioner

from podcost_bus import BusSettings, Record, TopicPartition
from podcost_bus.faust_adaptations import RecoveryStalls
from podcost_bus.faust_app import FaustKeyedApp, SkippedRecords
from podcost_bus.kafka import key_partition, partition_by_key


class Offsets:
    """A processor that only notes the offsets it is given."""

    parts = ("state",)

    def __init__(self) -> None:
        self.offsets: list[int] = []

    def split(self, record: Record) -> list[tuple[bytes | None, Record]]:
        return [(record.key, record)]

    def on_record(self, record: Record, state: int | None) -> int | None:
        self.offsets.append(record.offset)
        return None

    def on_tick(self, key: bytes | None, state: int) -> int | None:
        return None

    async def flush(self) -> None:
        pass

    def wakeup(self, state: int) -> float | None:
        return None

    def now(self) -> float:
        return 0.0

    def waiting(self, state: int) -> bool:
        return False

    def dump(self, old: int | None, new: int) -> Mapping[str, bytes]:
        return {"state": str(new).encode()}

    def load(self, key: bytes | None, parts: Mapping[str, bytes | None]) -> int:
        return int(parts["state"] or b"0")


class Stream:
    """What the agent reads from faust: batches of events of one partition at the given
    offsets."""

    def __init__(self, *batches: tuple[int, ...]) -> None:
        self._batches = batches

    async def take_events(self, max_: int, within: float) -> AsyncIterator[list[SimpleNamespace]]:
        for offsets in self._batches:
            yield [
                SimpleNamespace(
                    message=SimpleNamespace(
                        topic="t.ranks", partition=0, offset=offset, timestamp=1.0
                    ),
                    key=b"c/ns/Deployment/web",
                    value=b"{}",
                    headers={},
                )
                for offset in offsets
            ]


async def test_a_record_faust_skips_stops_the_app_before_anything_of_its_batch_is_processed(
    tmp_path: Path,
) -> None:
    processor = Offsets()
    settings = BusSettings(bootstrap_servers="127.0.0.1:1", partitions=2)
    transport = FaustKeyedApp(
        settings, processor, app_id="test-skips", topics=["t.workloads", "t.ranks"],
        data_dir=tmp_path,
    )  # fmt: skip
    failure: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
    transport._failure = failure  # what run() arms before starting faust
    agent = asyncio.create_task(transport._agent(Stream((4, 5), (7, 8))))
    try:
        reason = await asyncio.wait_for(failure, timeout=5)
    finally:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
    assert isinstance(reason, SkippedRecords)
    assert str(reason) == "faust skipped t.ranks[0] offsets 6..6; restart to read them"
    assert processor.offsets == [4, 5]  # the first batch; of the second, nothing


async def test_a_skip_of_the_first_records_after_the_seek_to_the_committed_offset_stops_the_app(
    tmp_path: Path,
) -> None:
    processor = Offsets()
    settings = BusSettings(bootstrap_servers="127.0.0.1:1", partitions=2)
    transport = FaustKeyedApp(
        settings, processor, app_id="test-skips", topics=["t.workloads", "t.ranks"],
        data_dir=tmp_path,
    )  # fmt: skip
    failure: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
    transport._failure = failure
    # After a rebalance the consumer thread seeks partition 0 to offset 0 (nobody committed).
    transport.app.on_source_seek({TopicPartition("t.ranks", 0): 0})
    agent = asyncio.create_task(transport._agent(Stream((1, 2))))
    try:
        reason = await asyncio.wait_for(failure, timeout=5)
    finally:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
    assert str(reason) == "faust skipped t.ranks[0] offsets 0..0; restart to read them"
    assert processor.offsets == []


async def test_resuming_a_flow_that_was_not_suspended_keeps_what_the_streams_buffered(
    tmp_path: Path,
) -> None:
    settings = BusSettings(bootstrap_servers="127.0.0.1:1", partitions=2)
    transport = FaustKeyedApp(
        settings, Offsets(), app_id="test-flow", topics=["t.workloads"], data_dir=tmp_path
    )
    flow = transport.app.flow_control
    buffer = transport.app.FlowControlQueue(maxsize=10, clear_on_resume=True)
    flow.resume()  # the first resume of a recovery: the changelogs are read
    buffer.put_nowait("fetched after the seek")
    flow.resume()  # the second, once the source partitions are sought
    assert buffer.qsize() == 1
    flow.suspend()  # a rebalance: what is buffered now is stale
    flow.resume()
    assert buffer.qsize() == 0


def test_a_key_goes_to_the_partition_the_kafka_producers_give_it() -> None:
    # The timer finds a table key's partition this way; the producers put its records there.
    partitions = list(range(6))
    for index in range(200):
        key = f"prod-eu-1/ns-{index}/Deployment/web-{index % 7}".encode()
        assert key_partition(key, 6) == DefaultPartitioner()(key, partitions, partitions)


def test_podcosts_producers_partition_as_the_kafka_producers_do() -> None:
    # Every producer podcost makes (its own, faust's) partitions with partition_by_key: the
    # default partitioner, each key's partition remembered.
    default = DefaultPartitioner()
    for count in (1, 3, 6):
        partitions = list(range(count))
        for index in range(300):
            key = f"prod-eu-{index % 3}/ns-{index}/Deployment/web-{index % 7}".encode()
            wanted = default(key, partitions, partitions)
            assert partition_by_key(key, partitions, partitions) == wanted
            assert partition_by_key(key, partitions, partitions[:1]) == wanted  # asked again
    # Without a key: a random partition, of the available ones when there are any.
    assert {partition_by_key(None, [0, 1, 2], [2]) for _ in range(20)} == {2}
    assert {partition_by_key(None, [0, 1, 2], []) for _ in range(200)} == {0, 1, 2}


def test_a_changelog_partition_the_recovery_applies_nothing_of_for_a_while_is_stalled() -> None:
    stalls: RecoveryStalls[str] = RecoveryStalls(10.0)
    assert stalls.check(0.0, {"a": -1, "b": 5}) == {}
    assert stalls.check(6.0, {"a": -1, "b": 7}) == {}  # b moves on
    assert stalls.check(10.0, {"a": -1, "b": 7}) == {"a": 0}  # nothing applied yet: from 0
    assert stalls.check(16.0, {"a": -1, "b": 7}) == {"b": 8}  # a: again 10 s after its seek
    assert stalls.check(20.0, {"a": -1}) == {"a": 0}
    assert stalls.check(25.0, {}) == {}  # caught up, or the recovery is over
    assert stalls.check(40.0, {"a": 3}) == {}  # behind again: counted afresh
    assert stalls.check(50.0, {"a": 3}) == {"a": 4}
