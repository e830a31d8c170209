"""What a service sees of the bus: records, deliveries, errors and the ``Bus`` / ``Consumer`` types.

Every service's composition root takes a ``Bus`` (``MemoryBus`` in embedded mode and unit tests,
``KafkaBus`` over a real broker) and its loops use only what is declared here, so no
client-library object (``ConsumerRecord``, ``RecordMetadata``) ever reaches service code.

Delivery is at least once: a consumer never commits by itself. The caller processes what it
got, publishes or writes the outcome, then calls ``commit``; a consumer that stops (or crashes)
before that hands the same records to whoever reads the partitions next.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, NamedTuple, Protocol, Self

from podcost_contracts.topic_contract import TopicDrift

OffsetReset = Literal["earliest", "latest"]
"""Where a consumer group starts on a partition it has never committed: its first record, or
only records published from now on."""


class TopicPartition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Record:
    """One record as read from the bus."""

    topic: str
    partition: int
    offset: int
    """Position in the partition; ``offset + 1`` is what committing this record stores."""
    key: bytes | None
    """The record key (podcost's keys are ``cluster/namespace/kind/name`` in UTF-8)."""
    value: bytes
    """The value exactly as published (possibly gzip; see its ``content-encoding`` header)."""
    headers: Mapping[str, bytes] = field(default_factory=dict)
    """Header name to value; if a name repeats, the last value wins."""
    timestamp: float = 0.0
    """When the record was published (POSIX seconds)."""

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where a published record landed, once the bus acknowledged it."""

    topic: str
    partition: int
    offset: int


class BusError(Exception):
    """The bus could not do what was asked.

    ``retriable``: the same call may succeed later (broker unreachable, leader moving, timeout),
    so retry with backoff; otherwise retrying cannot help (message too large, authorisation,
    bad configuration) and the caller must dead-letter, skip or stop.
    """

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


class Consumer(Protocol):
    """A member of a consumer group reading some topics.

    Use as ``async with bus.consumer([...], group=...) as consumer:`` and then either
    ``async for record in consumer`` or ``await consumer.poll(...)``. Records of one partition
    come in offset order; records with the same key are in the same partition.
    """

    @property
    def group(self) -> str:
        """The consumer group: members share the partitions and the committed offsets."""
        ...

    async def start(self) -> None:
        """Join the group; partitions are assigned and reading starts at the committed offsets."""
        ...

    async def stop(self) -> None:
        """Leave the group **without committing**: uncommitted records will be read again."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    def __aiter__(self) -> Self: ...

    async def __anext__(self) -> Record:
        """The next record, waiting as long as it takes; ends when the consumer is stopped."""
        ...

    async def poll(
        self, *, max_wait: float | None = None, max_records: int | None = None
    ) -> list[Record]:
        """The records available now (up to ``max_records``), waiting up to ``max_wait`` seconds
        (``None``: until there are some) for the first; ``[]`` on timeout, while paused, or once
        stopped."""
        ...

    async def commit(self, records: Iterable[Record] | None = None) -> dict[TopicPartition, int]:
        """Store the group's offsets past ``records`` (default: past every record delivered so
        far). Returns what was committed; partitions this member no longer owns after a
        rebalance are left out, and their new owner reads those records again."""
        ...

    def pause(self) -> None:
        """Stop delivering records (backpressure); the member stays in the group."""
        ...

    def resume(self) -> None:
        """Deliver records again after :meth:`pause`."""
        ...

    @property
    def paused(self) -> bool: ...

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member owns now."""
        ...

    def epoch(self, tp: TopicPartition) -> int | None:
        """The assignment under which this member owns ``tp`` now: a number that changes every
        time the partition is given to it again; ``None`` while it does not own it. What a
        record read under one epoch asks for may be done only while that epoch holds: after a
        rebalance, the partition's new owner reads the uncommitted records again."""
        ...

    async def lag(self) -> dict[TopicPartition, int]:
        """Per owned partition, how many records are published but not yet delivered here
        (partitions whose end is not known yet are left out)."""
        ...


class Bus(Protocol):
    """Publishes records and makes consumers. Start it before use; stop it to flush."""

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Wait for every queued record to be acknowledged, then release the connections."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    async def ensure_topics(self, topics: Iterable[str]) -> None:
        """Create the topics that do not exist yet (existing ones are left as they are)."""
        ...

    def topic_drift(self) -> Mapping[str, tuple[TopicDrift, ...]]:
        """The topics :meth:`ensure_topics` found existing with settings other than the topic
        contract's, and how they differ (empty: none, or a bus without topic settings)."""
        ...

    async def send(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Awaitable[Delivery]:
        """Queue a record and return the awaitable of its acknowledgement.

        Records queued one after the other keep that order in their partition, and queueing
        many before awaiting lets the bus batch them. Await every returned value before
        committing what they answer. Raises :class:`BusError`; so does the awaitable.
        """
        ...

    async def publish(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Delivery:
        """Publish one record and wait until the bus has it (``send`` then await)."""
        ...

    async def broadcast(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> list[Delivery]:
        """Publish the record once to every partition of ``topic`` and wait until the bus has
        them all: a marker every reader of the topic sees, after the records queued before it
        on the same partition (a watcher's full set of its cluster's workloads)."""
        ...

    def consumer(
        self,
        topics: Sequence[str],
        *,
        group: str,
        offset_reset: OffsetReset = "earliest",
        max_poll_records: int | None = None,
    ) -> Consumer:
        """A new, not yet started member of ``group`` reading ``topics``
        (``max_poll_records``: most records one ``poll`` returns; ``None``: the bus default)."""
        ...


class Lifecycle:
    """``async with`` over ``start``/``stop``: the one implementation the buses and consumers
    share (a subclass defines ``start`` and ``stop``)."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()


class PollingConsumer(Lifecycle):
    """``async for`` over ``poll``, one record at a time, for the consumers (a subclass defines
    ``poll``); iteration ends when a poll without a deadline returns nothing (stopped)."""

    async def poll(
        self, *, max_wait: float | None = None, max_records: int | None = None
    ) -> list[Record]:
        raise NotImplementedError

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Record:
        records = await self.poll(max_records=1)
        if not records:
            raise StopAsyncIteration
        return records[0]
