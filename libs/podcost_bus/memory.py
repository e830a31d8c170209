"""The in-process bus: Kafka's semantics without a broker, for embedded mode and unit tests.

``podcost run`` without Kafka wires every service to one ``MemoryBus``; unit tests of the
services do the same. It keeps what the services rely on: topics split into partitions by a
hash of the key (so one workload's messages stay in order), consumer groups whose members share
the partitions and whose committed offsets survive a member's restart, explicit commits only,
pause/resume, lag, and the same record-size limit as a default Kafka producer so an oversized
message fails here too, not first in production.

Memory stays bounded: a record is dropped once every group reading its topic has committed past
it and it is older than ``keep_committed_s`` (the grace lets a group that joins a little later,
such as a ranker started after the others, still read it; the drop happens on the next send or
commit to its partition, or when a member's poll of it waits in vain). A partition keeps at most
``retention`` records that a group with members has not committed: a send beyond waits until
one of them is committed (backpressure: the producer slows to the pace of its slowest reader,
say an annotator paused at its high-water mark, rather than its records being lost), and
``waits`` counts those sends. Records only a group without members has not committed (it may
never come back) are dropped past ``retention`` as Kafka's retention would, counted in
``dropped`` and logged.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from podcost_bus.protocol import (
    BusError,
    Delivery,
    Lifecycle,
    OffsetReset,
    PollingConsumer,
    Record,
    TopicPartition,
)
from podcost_contracts.topic_contract import TopicDrift
from podcost_contracts.topics import check_topic_name

logger = logging.getLogger(__name__)

#: A default Kafka producer's ``max.request.size``: the largest record it sends.
KAFKA_MAX_REQUEST_BYTES: Final = 1_048_576
#: Most records one ``poll`` returns unless the consumer is made with another limit.
DEFAULT_MAX_POLL_RECORDS: Final = 500


@dataclass(slots=True)
class _PartitionLog:
    records: list[Record] = field(default_factory=list)
    base: int = 0
    """Offset of ``records[0]``: everything before it has been dropped."""

    @property
    def end(self) -> int:
        """The offset the next record will get (Kafka's high-water mark)."""
        return self.base + len(self.records)

    def read(self, offset: int, limit: int) -> list[Record]:
        start = max(offset, self.base) - self.base
        return self.records[start : start + limit]

    def drop_before(self, offset: int) -> None:
        offset = min(offset, self.end)
        if offset > self.base:
            del self.records[: offset - self.base]
            self.base = offset


@dataclass(slots=True)
class _Group:
    members: list[MemoryConsumer] = field(default_factory=list)
    """In join order; partitions go round-robin over them."""
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    topics: set[str] = field(default_factory=set)
    """Every topic a member ever read: the group holds back their trimming until it commits."""


class MemoryBus(Lifecycle):
    """An in-process bus (see the module docstring). All methods run on one event loop."""

    def __init__(
        self,
        *,
        partitions: int = 3,
        max_record_bytes: int = KAFKA_MAX_REQUEST_BYTES,
        retention: int = 10_000,
        keep_committed_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if partitions < 1 or retention < 1:
            raise ValueError("partitions and retention must be at least 1")
        self._partitions = partitions
        self._max_record_bytes = max_record_bytes
        self._retention = retention
        self._keep_committed_s = keep_committed_s
        self._clock = clock
        self._logs: dict[str, list[_PartitionLog]] = {}
        self._groups: dict[str, _Group] = {}
        self._unkeyed = itertools.count()
        # Replaced on every change: a waiter holds the old one, which gets set (a broadcast
        # that, unlike a Condition, can be fired from synchronous code such as ``resume``).
        self._changed = asyncio.Event()
        self.waits = 0
        """Sends that waited for a reader to commit (see the module docstring)."""
        self.on_wait: Callable[[str], None] | None = None
        """Told the topic of each send that waits (a metric's counter)."""
        self.dropped = 0
        """Records dropped that a group without members had not committed."""

    # --- Bus ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Nothing to connect to; here so that both buses are used alike."""

    async def stop(self) -> None:
        """Nothing to flush: every record is stored when ``send`` returns."""

    def partition_of(self, key: bytes) -> int:
        """The partition a record keyed ``key`` goes to, in every topic (all have as many)."""
        # crc32, not hash(): stable across processes, like Kafka's murmur2 partitioner.
        return zlib.crc32(key) % self._partitions

    async def ensure_topics(self, topics: Iterable[str]) -> None:
        for topic in topics:
            self._log(topic)

    def topic_drift(self) -> Mapping[str, tuple[TopicDrift, ...]]:
        return {}  # in-process topics have no settings to differ

    async def send(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Awaitable[Delivery]:
        delivery = await self._append_with_room(topic, key, value, headers or {})
        done: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        done.set_result(delivery)
        return done

    async def publish(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Delivery:
        return await self._append_with_room(topic, key, value, headers or {})

    async def broadcast(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> list[Delivery]:
        return [
            await self._append_with_room(topic, key, value, headers or {}, partition=partition)
            for partition in range(len(self._log(topic)))
        ]

    def consumer(
        self,
        topics: Sequence[str],
        *,
        group: str,
        offset_reset: OffsetReset = "earliest",
        max_poll_records: int | None = None,
    ) -> MemoryConsumer:
        if not topics:
            raise ValueError("a consumer needs at least one topic")
        for topic in topics:
            self._log(topic)
        return MemoryConsumer(
            self, tuple(topics), group, offset_reset, max_poll_records or DEFAULT_MAX_POLL_RECORDS
        )

    # --- inspection (tests, demos) ------------------------------------------------------------

    def records(self, topic: str) -> list[Record]:
        """Every record still kept in ``topic``, partition by partition, in offset order."""
        return [record for log in self._logs.get(topic, []) for record in log.records]

    def committed(self, group: str) -> dict[TopicPartition, int]:
        """The offsets ``group`` has committed."""
        return dict(self._groups[group].committed) if group in self._groups else {}

    def end_offsets(self, topic: str) -> dict[TopicPartition, int]:
        """Per partition of ``topic``, the offset its next record will get."""
        return {TopicPartition(topic, p): log.end for p, log in enumerate(self._logs[topic])}

    # --- internals shared with MemoryConsumer --------------------------------------------------

    def _log(self, topic: str) -> list[_PartitionLog]:
        logs = self._logs.get(topic)
        if logs is None:
            try:
                check_topic_name(topic)
            except ValueError as error:
                raise BusError(str(error), retriable=False) from None
            logs = self._logs[topic] = [_PartitionLog() for _ in range(self._partitions)]
        return logs

    async def _append_with_room(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes],
        *,
        partition: int | None = None,
    ) -> Delivery:
        """Append the record once its partition (``partition``, or the key's) has room for it
        (see the module docstring)."""
        key_bytes = key.encode() if isinstance(key, str) else key
        size = len(key_bytes or b"") + len(value) + sum(len(n) + len(v) for n, v in headers.items())
        if size > self._max_record_bytes:
            raise BusError(
                f"a record of {size} bytes for {topic!r} is larger than the limit of "
                f"{self._max_record_bytes}",
                retriable=False,
            )
        logs = self._log(topic)
        if partition is None:
            partition = (
                self.partition_of(key_bytes)
                if key_bytes is not None
                else next(self._unkeyed) % len(logs)
            )
        tp = TopicPartition(topic, partition)
        waited = False
        while self._uncommitted(tp) >= self._retention:
            if not waited:
                waited = True
                self.waits += 1
                if self.on_wait is not None:
                    self.on_wait(topic)
            await self._changed.wait()  # a commit, a member leaving, a rebalance
        return self._append(tp, key_bytes, value, headers)

    def _uncommitted(self, tp: TopicPartition) -> int:
        """The records of ``tp`` that a group with members has not committed."""
        floor = min(
            (
                group.committed.get(tp, 0)
                for group in self._groups.values()
                if group.members and tp.topic in group.topics
            ),
            default=None,
        )
        log = self._partition(tp)
        return 0 if floor is None else log.end - max(floor, log.base)

    def _append(
        self,
        tp: TopicPartition,
        key_bytes: bytes | None,
        value: bytes,
        headers: Mapping[str, bytes],
    ) -> Delivery:
        topic, partition = tp.topic, tp.partition
        log = self._partition(tp)
        log.records.append(
            Record(
                topic=topic,
                partition=partition,
                offset=log.end,
                key=key_bytes,
                value=value,
                headers=dict(headers),
                timestamp=self._clock(),
            )
        )
        if len(log.records) > self._retention:
            self._retire(tp, log.end - self._retention)
        self._trim(tp)
        self._notify()
        return Delivery(topic, partition, log.end - 1)

    def _retire(self, tp: TopicPartition, cut: int) -> None:
        """Drop the records of ``tp`` before ``cut`` that every group with members has
        committed; those only a group without members still lacks are counted and logged."""
        groups = [group for group in self._groups.values() if tp.topic in group.topics]
        live = [group.committed.get(tp, 0) for group in groups if group.members]
        cut = min(cut, *live) if live else cut
        log = self._partition(tp)
        away = min((group.committed.get(tp, 0) for group in groups), default=cut)
        lost = max(0, cut - max(away, log.base))
        if lost:
            self.dropped += lost
            logger.warning(
                "%s[%d]: dropped %d records a consumer group without members had not committed "
                "(more than %d kept)", tp.topic, tp.partition, lost, self._retention,
            )  # fmt: skip
        log.drop_before(cut)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _join(self, member: MemoryConsumer) -> None:
        group = self._groups.setdefault(member.group, _Group())
        group.members.append(member)
        group.topics.update(member.topics)
        self._rebalance(group)

    def _leave(self, member: MemoryConsumer) -> None:
        group = self._groups[member.group]
        if member in group.members:
            group.members.remove(member)
            member._assign(frozenset(), {})
            self._rebalance(group)

    def _rebalance(self, group: _Group) -> None:
        shares: dict[int, set[TopicPartition]] = {id(m): set() for m in group.members}
        for topic in sorted(group.topics):
            readers = [m for m in group.members if topic in m.topics]
            for partition in range(len(self._logs[topic])) if readers else ():
                owner = readers[partition % len(readers)]
                shares[id(owner)].add(TopicPartition(topic, partition))
        for member in group.members:
            member._assign(frozenset(shares[id(member)]), group.committed)
        self._notify()

    def _commit(self, group_name: str, offsets: Mapping[TopicPartition, int]) -> None:
        self._groups[group_name].committed.update(offsets)
        for tp in offsets:
            self._trim(tp)
        self._notify()  # a send may be waiting for room

    def _trim(self, tp: TopicPartition) -> None:
        """Drop the records of ``tp`` that every group reading it has committed, once old."""
        floor = min(
            (g.committed.get(tp, 0) for g in self._groups.values() if tp.topic in g.topics),
            default=0,
        )
        log = self._partition(tp)
        old = self._clock() - self._keep_committed_s
        cut = log.base
        for record in log.records:
            if record.offset >= floor or record.timestamp > old:
                break
            cut = record.offset + 1
        log.drop_before(cut)

    def _partition(self, tp: TopicPartition) -> _PartitionLog:
        return self._logs[tp.topic][tp.partition]


class MemoryConsumer(PollingConsumer):
    """A member of a consumer group of a :class:`MemoryBus` (the ``Consumer`` protocol)."""

    def __init__(
        self,
        bus: MemoryBus,
        topics: tuple[str, ...],
        group: str,
        offset_reset: OffsetReset,
        max_poll_records: int,
    ) -> None:
        if max_poll_records < 1:
            raise ValueError("max_poll_records must be at least 1")
        self._bus = bus
        self.topics = topics
        self._group = group
        self._offset_reset = offset_reset
        self._max_poll_records = max_poll_records
        self._positions: dict[TopicPartition, int] = {}
        """Next offset to deliver, per owned partition."""
        self._delivered: dict[TopicPartition, int] = {}
        """Offset past the last record delivered, per owned partition (what ``commit()``
        stores)."""
        self._turn = 0
        self._paused = False
        self._running = False
        self._epochs: dict[TopicPartition, int] = {}
        """Per owned partition, the assignment it was given under (``epoch``)."""
        self._assignments = itertools.count(1)

    @property
    def group(self) -> str:
        return self._group

    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._bus._join(self)

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        self._bus._leave(self)

    async def poll(
        self, *, max_wait: float | None = None, max_records: int | None = None
    ) -> list[Record]:
        limit = max_records or self._max_poll_records
        deadline = None if max_wait is None else asyncio.get_running_loop().time() + max_wait
        while self._running:
            changed = self._bus._changed  # taken before looking, so no change is missed
            records = self._take(limit)
            if records:
                return records
            try:
                async with asyncio.timeout_at(deadline):
                    await changed.wait()
            except TimeoutError:
                # Idle: drop what every group has committed and is old enough by now. Trimming
                # on send and commit alone kept a quiet cluster's last records for good.
                for tp in self._positions:
                    self._bus._trim(tp)
                return []
        return []

    async def commit(self, records: Iterable[Record] | None = None) -> dict[TopicPartition, int]:
        if records is None:
            wanted = dict(self._delivered)
        else:
            wanted = {}
            for record in records:
                wanted[record.tp] = max(wanted.get(record.tp, 0), record.offset + 1)
        committed = self._bus.committed(self._group)
        offsets = {
            tp: offset
            for tp, offset in wanted.items()
            if tp in self._positions and committed.get(tp) != offset
        }
        if offsets:
            self._bus._commit(self._group, offsets)
        return offsets

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._bus._notify()

    @property
    def paused(self) -> bool:
        return self._paused

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._positions)

    def epoch(self, tp: TopicPartition) -> int | None:
        return self._epochs.get(tp)

    async def lag(self) -> dict[TopicPartition, int]:
        lags = {}
        for tp, position in self._positions.items():
            log = self._bus._partition(tp)
            lags[tp] = log.end - max(position, log.base)
        return lags

    # --- called by the bus --------------------------------------------------------------------

    def _assign(
        self, partitions: frozenset[TopicPartition], committed: Mapping[TopicPartition, int]
    ) -> None:
        for tp in set(self._positions) - partitions:
            del self._positions[tp]
            self._delivered.pop(tp, None)
            self._epochs.pop(tp, None)
        for tp in partitions - set(self._positions):
            self._epochs[tp] = next(self._assignments)
            log = self._bus._partition(tp)
            start = log.base if self._offset_reset == "earliest" else log.end
            self._positions[tp] = committed.get(tp, start)

    def _take(self, limit: int) -> list[Record]:
        if self._paused or not self._positions:
            return []
        owned = sorted(self._positions)
        # Start one partition further each time, so a busy partition cannot starve the others.
        self._turn = (self._turn + 1) % len(owned)
        taken: list[Record] = []
        for tp in owned[self._turn :] + owned[: self._turn]:
            records = self._bus._partition(tp).read(self._positions[tp], limit - len(taken))
            if records:
                self._positions[tp] = self._delivered[tp] = records[-1].offset + 1
                taken.extend(records)
            if len(taken) == limit:
                break
        return taken
