"""Keyed-state consumers: the contract between a stateful consumer and the transport that runs
it, the batch step both transports share, and the transport that runs one over any ``Bus``.

A :class:`KeyedProcessor` holds one state per record key (the aggregator: one per workload) and
decides what each record and the passing of time do to it; a transport reads the records, hands
them to the processor with their keys' states, persists the new states and commits offsets. It
works in batches, in two phases (:func:`process_batch`, :func:`tick_batch`):

1. *decide*: each record of the batch, in order, split into its steps (one per key whose state
   it changes: a ranker's batch of answers changes many), each with the state its key has so
   far (the one the previous step of the same key left, so per-key order holds within a batch);
   the processor queues what it must publish without waiting for it;
2. *flush*: :meth:`KeyedProcessor.flush` sends everything queued and returns once all of it is
   acknowledged (a publish refused for good dead-letters its record, transient errors are
   retried).

Only then does the transport persist the new states and commit (ack) the batch: nothing is
committed before its output is delivered (at least once), and the bus batches the
acknowledgements instead of one round trip per decision. Two transports run the same processor
with the same steps:

- :class:`KeyedConsumerLoop` (here): a consumer-group loop over any ``Bus``; states live in a dict.
  It is what embedded mode runs over the ``MemoryBus``. Offsets are committed up to the oldest
  record a still-waiting state was built from, so after a restart the records are read again and
  the states rebuilt.
- ``podcost_bus.faust_app.FaustKeyedApp``: faust-streaming over Kafka, one table per state part,
  restored from its changelog after a restart or a rebalance.

The aggregator service (``podcost.aggregator``) builds its processor and picks the transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Generic, Protocol, TypeVar, runtime_checkable

from podcost_bus.protocol import Bus, BusError, Consumer, Record, TopicPartition

log = logging.getLogger(__name__)

S = TypeVar("S")


#: The largest state part a transport stores as one record (a faust table's changelog record):
#: Kafka's default producer ``max.request.size``, within the broker's default record limit
#: (``message.max.bytes``, 1,048,588 a batch). A processor keeps its parts below it.
MAX_STATE_RECORD_BYTES: Final = 1_048_576


class Unknown(Enum):
    """The type of :data:`UNKNOWN`."""

    UNKNOWN = "unknown"


UNKNOWN: Final = Unknown.UNKNOWN
"""What :meth:`StoredWakeup.stored_wakeup` answers when only the decoded state can tell."""


class Drop(Enum):
    """The type of :data:`DROP`."""

    DROP = "drop"


DROP: Final = Drop.DROP
"""What :meth:`KeyedProcessor.on_record` or :meth:`KeyedProcessor.on_tick` returns to forget its
key's state altogether (the key's workload is gone, or the state describes nothing any more): the
transport removes it, a faust table with a changelog tombstone in every part's table."""


@dataclass(frozen=True, slots=True)
class EveryKey:
    """A step's key (from :meth:`KeyedProcessor.split`) that stands for every key with a state
    that ``select`` picks: the transport gives the step to each of them in turn (a watcher's
    live set, which forgets the workloads it leaves out)."""

    select: Callable[[bytes], bool]


class KeyedProcessor(Protocol[S]):
    """What a keyed-state transport drives (see the module docstring for the order of calls).
    Transports call it from one task at a time."""

    @property
    def parts(self) -> tuple[str, ...]:
        """The names of the parts a state is stored in (one faust table each)."""
        ...

    def split(self, record: Record) -> Sequence[tuple[bytes | EveryKey | None, Any]]:
        """The steps ``record`` makes, in order: per step, the key whose state it changes and
        what :meth:`on_record` is given for it. A record of one key is one step (often
        ``(record.key, record)``); one that carries several keys' data (a ranker's batch of
        answers) is one step per key, every key one of the record's partition; one about every
        state it selects is one step with an :class:`EveryKey` (of keys of the record's
        partition only). A record that
        cannot be decoded is the processor's to dead-letter: no step. Raising means the record
        cannot be processed and stops the transport."""
        ...

    def on_record(self, step: Any, state: S | None) -> S | Drop | None:
        """Decide what ``step`` (from :meth:`split`) does; ``state`` is its key's (``None``:
        none yet). Returns the new state, ``None`` when the state is unchanged, or
        :data:`DROP` to forget it. What must be published is queued for :meth:`flush`;
        raising stops the transport."""
        ...

    def on_tick(self, key: bytes | None, state: S) -> S | Drop | None:
        """Time passed and ``state`` is due (its :meth:`wakeup` is not after :meth:`now`): the
        new state, ``None`` if unchanged, or :data:`DROP` to forget it (what must be published
        is queued for :meth:`flush`)."""
        ...

    async def flush(self) -> None:
        """Publish everything queued since the last flush; return once all of it is
        acknowledged (or, refused for good, dead-lettered). Raising stops the transport before
        anything decided since the last flush is persisted or committed."""
        ...

    def wakeup(self, state: S) -> float | None:
        """When :meth:`on_tick` may next have something to do for ``state`` (``None``: not
        before another record of its key). It depends on the state alone, so a transport may
        keep it with the state."""
        ...

    def now(self) -> float:
        """The processor's clock, which :meth:`wakeup` times are in."""
        ...

    def waiting(self, state: S) -> bool:
        """Whether ``state`` still needs the records it was built from (a transport without a
        changelog reads them again after a restart)."""
        ...

    def dump(self, old: S | None, new: S) -> Mapping[str, bytes]:
        """The parts of ``new`` that differ from ``old``, serialised."""
        ...

    def load(self, key: bytes | None, parts: Mapping[str, bytes | None]) -> S:
        """A state from its stored parts (a missing part is ``None``)."""
        ...


@runtime_checkable
class StoredWakeup(Protocol):
    """A :class:`KeyedProcessor` that can tell a stored state's wake-up from its parts without
    decoding the state: after a recovery the transport then decodes only the states that are due,
    as they come due, rather than every state it restored (``FaustKeyedApp``)."""

    def stored_wakeup(
        self, key: bytes | None, parts: Mapping[str, bytes | None]
    ) -> float | Unknown | None:
        """:meth:`KeyedProcessor.wakeup` of ``load(key, parts)``, or :data:`UNKNOWN` when it
        cannot be told without decoding (then the transport decodes the state)."""
        ...


#: How long a batch step may keep the event loop before it lets other tasks run (embedded mode
#: runs every service in one loop; a batch decided in one go would hold them all up).
YIELD_EVERY_S: Final = 0.02


@dataclass
class Batch(Generic[S]):
    """What a batch of records did, once its outputs are acknowledged."""

    states: dict[bytes | None, S | Drop] = field(default_factory=dict)
    """Per key whose state changed: its state after the batch's last record of it, or
    :data:`DROP`; persist these (once per key, however many records it had)."""
    replaced: set[bytes | None] = field(default_factory=set)
    """Keys dropped during the batch: what is stored for them must be replaced as a whole by
    their entry in ``states``, not patched."""
    outcomes: list[tuple[Record, bytes | None, S | Drop | None]] = field(default_factory=list)
    """Per step, in order: its record, its key and what :meth:`KeyedProcessor.on_record`
    returned."""


class _Pacer:
    """Lets the event loop turn every :data:`YIELD_EVERY_S` of work."""

    def __init__(self) -> None:
        self._since = time.monotonic()

    async def pace(self) -> None:
        now = time.monotonic()
        if now - self._since >= YIELD_EVERY_S:
            await asyncio.sleep(0)
            self._since = time.monotonic()


async def process_batch(
    processor: KeyedProcessor[S],
    records: Sequence[Record],
    stored: Callable[[bytes | None], S | None],
    *,
    decided: Callable[[], None] | None = None,
    keys: Callable[[], Iterable[bytes | None]] = tuple,
) -> Batch[S]:
    """Decide every record in order (each with the state the previous record of its key left;
    ``stored`` gives a key's state before the batch), then flush: returns once every output is
    acknowledged. Persist ``Batch.states`` and commit the records only after it returns.
    ``decided`` is called after each record is decided: a batch of slow records is progress
    record by record, not one long silence (the faust transport's watchdog). ``keys`` gives
    every key with a stored state: an :class:`EveryKey` step goes to those it selects."""
    batch: Batch[S] = Batch()
    states = batch.states
    pacer = _Pacer()
    for record in records:
        steps: Sequence[tuple[Any, Any]] = processor.split(record)
        if steps and isinstance(steps[0][0], EveryKey):
            steps = _every(steps[0][0], steps[0][1], keys, states)
        for key, step in steps:
            await pacer.pace()  # per step: a ranker's batch is up to 100 of them
            if key in states:
                current = states[key]
                state = None if current is DROP else current
            else:
                state = stored(key)
            new = processor.on_record(step, state)
            batch.outcomes.append((record, key, new))
            if new is DROP:
                if state is None and key not in states:
                    continue  # nothing was kept for it: nothing to forget
                batch.replaced.add(key)
            if new is not None:
                states[key] = new
        if decided is not None:
            decided()
    await processor.flush()
    return batch


def _every(
    every: EveryKey,
    step: Any,
    keys: Callable[[], Iterable[bytes | None]],
    states: Mapping[Any, Any],
) -> list[tuple[bytes | None, Any]]:
    """The steps an :class:`EveryKey` step stands for: one per key stored or changed in the
    batch so far that it selects, in key order."""
    picked = {key for key in (*keys(), *states) if key is not None and every.select(key)}
    return [(key, step) for key in sorted(picked)]


async def tick_batch(
    processor: KeyedProcessor[S], due: Iterable[tuple[bytes | None, S]]
) -> dict[bytes | None, S | Drop]:
    """:meth:`KeyedProcessor.on_tick` for every state that is ``due``, then flush: the changed
    states (or :data:`DROP`, to forget), once their outputs are acknowledged (persist them only
    then)."""
    changed: dict[bytes | None, S | Drop] = {}
    pacer = _Pacer()
    for key, state in due:
        new = processor.on_tick(key, state)
        if new is not None:
            changed[key] = new
        await pacer.pace()
    await processor.flush()
    return changed


def is_due(processor: KeyedProcessor[S], state: S, now: float) -> bool:
    """Whether ``state`` is due at ``now`` (the processor's clock)."""
    wakeup = processor.wakeup(state)
    return wakeup is not None and wakeup <= now


class KeyedConsumerLoop(Generic[S]):
    """Runs a :class:`KeyedProcessor` as a member of a consumer group of any ``Bus``."""

    def __init__(
        self,
        bus: Bus,
        topics: Sequence[str],
        group: str,
        processor: KeyedProcessor[S],
        *,
        tick_s: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        poll_s: float = 1.0,
    ) -> None:
        if tick_s <= 0 or poll_s <= 0:
            raise ValueError("tick_s and poll_s must be positive")
        self.bus = bus
        self.topics = tuple(topics)
        self.group = group
        self.processor = processor
        self._tick_s = tick_s
        self._sleep = sleep
        self._poll_s = poll_s
        self._states: dict[bytes | None, S] = {}
        self._where: dict[bytes | None, TopicPartition] = {}
        """The partition each key's last record came from (to drop states revoked from us)."""
        self._held: dict[bytes | None, list[Record]] = {}
        """Per key whose state is waiting: the records it was built from."""
        self._uncommitted: dict[TopicPartition, deque[Record]] = {}
        self._lock = asyncio.Lock()
        self._consumer: Consumer | None = None

    @property
    def states(self) -> Mapping[bytes | None, S]:
        """The states by key (read-only view for tests and diagnostics)."""
        return self._states

    def ready(self) -> bool:
        """Joined the group and given partitions to read."""
        return self._consumer is not None and bool(self._consumer.assignment())

    async def lag(self) -> dict[TopicPartition, int]:
        return {} if self._consumer is None else await self._consumer.lag()

    async def run(self) -> None:
        """Read, process and commit until cancelled; the first error of either task stops it."""
        async with self.bus.consumer(self.topics, group=self.group) as consumer:
            self._consumer = consumer
            tasks = [
                asyncio.create_task(self._read(consumer), name=f"{self.group}.read"),
                asyncio.create_task(self._tick(consumer), name=f"{self.group}.tick"),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # re-raises what stopped it
            finally:
                self._consumer = None
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(self, consumer: Consumer) -> None:
        while True:
            records = await consumer.poll(max_wait=self._poll_s)
            if not records:
                continue
            async with self._lock:
                batch = await process_batch(
                    self.processor, records, self._states.get, keys=self._states.keys
                )
                # Delivered: keep the states, then commit what no waiting state needs.
                for record in records:
                    self._uncommitted.setdefault(record.tp, deque()).append(record)
                for record, key, new in batch.outcomes:
                    self._where[key] = record.tp
                    if new is DROP:
                        self._forget(key)
                    elif new is not None:
                        self._keep(key, new, record)
                await self._commit(consumer)

    async def _tick(self, consumer: Consumer) -> None:
        while True:
            await self._sleep(self._tick_s)
            async with self._lock:
                owned = consumer.assignment()
                for key in [key for key, tp in self._where.items() if tp not in owned]:
                    # Revoked in a rebalance: the new owner rebuilds the state from the records.
                    self._states.pop(key, None)
                    self._held.pop(key, None)
                    del self._where[key]
                now = self.processor.now()
                due = [
                    (key, state)
                    for key, state in self._states.items()
                    if is_due(self.processor, state, now)
                ]
                changed = await tick_batch(self.processor, due)
                for key, new in changed.items():
                    if new is DROP:
                        self._forget(key)  # its held records too: the commit may pass them
                    else:
                        self._keep(key, new, None)
                if changed:
                    await self._commit(consumer)

    def _forget(self, key: bytes | None) -> None:
        self._states.pop(key, None)
        self._held.pop(key, None)  # its records are needed no more: the commit may pass them
        self._where.pop(key, None)

    def _keep(self, key: bytes | None, state: S, record: Record | None) -> None:
        self._states[key] = state
        if not self.processor.waiting(state):
            self._held.pop(key, None)
        elif record is not None:
            self._held.setdefault(key, []).append(record)

    async def _commit(self, consumer: Consumer) -> None:
        """Commit, per partition, past every record no waiting state needs again."""
        floors: dict[TopicPartition, int] = {}
        for records in self._held.values():
            for record in records:
                floors[record.tp] = min(floors.get(record.tp, record.offset), record.offset)
        points: list[Record] = []
        for tp, pending in self._uncommitted.items():
            floor = floors.get(tp)
            last = None
            while pending and (floor is None or pending[0].offset < floor):
                last = pending.popleft()
            if last is not None:
                points.append(last)
        if not points:
            return
        try:
            await consumer.commit(points)
        except BusError as error:
            if not error.retriable:
                raise
            # The next commit covers these offsets; a restart before it reads them again.
            log.warning("commit for group %s failed, will retry: %s", self.group, error)
