"""Where a process's rankers hand their answers to be published on the ranks topic.

``podcost.ranker.service.RankerService`` hands each poll's answers to a :class:`RanksOutbox` and
waits for their fate; ``podcost ranker`` gives every strategy of a process one outbox (several
``--strategy``), and a ranker alone in its process has one of its own. The outbox packs the
answers per partition of their workloads (where the bus puts their key: the partition their
snapshots are on) into as few records as fit (:data:`BATCH_MAX_ANSWERS`,
:data:`BATCH_MAX_BYTES`, and never more than one record may hold), keyed by each record's first
workload so it lands in the ranks topic's partition of that number, where the aggregator holding
those workloads reads it. A record of one strategy's answers is a ``StrategyRanksBatchMessage``
(what a ranker alone publishes, always), one of several strategies' a ``RanksBatchMessage``.

Shared by several strategies, it publishes what is pending once every strategy of the process
has handed over what it read since the last records went out, or a linger (:data:`LINGER_S`
by default) after the first pending answer, whichever comes first. The strategies read the same
records (each in its own consumer group) at about the same time, so one record then carries
every strategy's answers to them: each record costs its fixed price (encode, produce and
acknowledgement here; fetch, decode and faust's per-event path in the aggregator; a record on
the broker) once instead of once per strategy.

Every answer's fate goes back to the ranker that handed it: acknowledged, or refused for good
(it does not fit in a record alone, or the bus refuses its record after the transient errors
were retried), for that ranker to dead-letter the snapshot's record in its own group. A ranker
commits its offsets only once its answers are acknowledged: at least once, whatever the others
do. A ranker cancelled while it waits withdraws what was not sent yet; the others' answers go
out as they would have.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from podcost.runtime.clock import Clock
from podcost.runtime.metrics import Metrics
from podcost.runtime.retry import DEFAULT_BACKOFF, retry_transient
from podcost_bus import Bus, BusError, Delivery
from podcost_contracts.messages import (
    DEFAULT_GZIP_THRESHOLD,
    Encoded,
    EncodeError,
    Message,
    MessageTooLarge,
    RankedWorkload,
    RanksBatchMessage,
    StrategyAnswer,
    StrategyRanksBatchMessage,
    encode,
)
from podcost_core.backoff import Backoff

log = logging.getLogger("podcost.ranker")

#: The most answers one ranks record holds, and about the most bytes of JSON (estimated from the
#: pods scored): a record stays well below what a record may be (about 1 MB, compressed), and an
#: aggregator's step over one stays short.
BATCH_MAX_ANSWERS = 100
BATCH_MAX_BYTES = 256 * 1024
#: About what one pod's score takes in a batch's JSON (a uid of 36 characters and a float).
_BYTES_PER_SCORE = 64
#: How long a shared outbox holds the first pending answer for the other strategies' answers,
#: unless told otherwise (``PODCOST_RANKER_LINGER_MS``). At a trickle some strategy's consumer
#: is often still waiting for its next fetch when the others have answered, so this paces the
#: process's polls: at 150 snapshots/s over three partitions, 20 ms gave 0.4-0.5 ranks records
#: a snapshot, 50 ms 0.24, 100 ms 0.19 (``bench_rankers --rankers combined --aggregator``). Each
#: ranker waits this long at most per poll, before its commit: latency a trickle hardly feels
#: (the watcher debounces 0.2 s, the aggregator's deadline is seconds).
LINGER_S = 0.050

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an answer was not published and never will be: the ranker dead-letters its record."""

    reason: str
    error: BaseException | None


def pack(
    items: Sequence[T],
    answer_of: Callable[[T], tuple[str, RankedWorkload]],
    partition_of: Callable[[bytes], int],
    now: float,
    gzip_above: int = DEFAULT_GZIP_THRESHOLD,
) -> tuple[list[tuple[list[T], Encoded]], list[tuple[T, Refusal]]]:
    """The records that carry ``items`` (each a strategy's answer, by ``answer_of``): per
    partition of their workloads, in the order given, in as few records as fit, values gzipped
    above ``gzip_above`` bytes of JSON; and the items that cannot go (an answer that does not
    fit in a record by itself, or cannot be encoded)."""
    by_partition: dict[int, list[T]] = {}
    for item in items:
        partition = partition_of(answer_of(item)[1].key.encode())
        by_partition.setdefault(partition, []).append(item)
    records: list[tuple[list[T], Encoded]] = []
    refused: list[tuple[T, Refusal]] = []
    for group in by_partition.values():
        chunk: list[T] = []
        size = 0
        for item in group:
            estimate = len(answer_of(item)[1].scores) * _BYTES_PER_SCORE
            if chunk and (len(chunk) >= BATCH_MAX_ANSWERS or size + estimate > BATCH_MAX_BYTES):
                _encode_chunk(chunk, answer_of, now, gzip_above, records, refused)
                chunk, size = [], 0
            chunk.append(item)
            size += estimate
        if chunk:
            _encode_chunk(chunk, answer_of, now, gzip_above, records, refused)
    return records, refused


def _encode_chunk(
    chunk: list[T],
    answer_of: Callable[[T], tuple[str, RankedWorkload]],
    now: float,
    gzip_above: int,
    records: list[tuple[list[T], Encoded]],
    refused: list[tuple[T, Refusal]],
) -> None:
    """``chunk`` as one record, or halved until each part fits in one."""
    answers = [answer_of(item) for item in chunk]
    strategies = {strategy for strategy, _ in answers}
    message: Message
    if len(strategies) == 1:
        message = StrategyRanksBatchMessage.model_construct(
            schema_version=1,
            strategy=answers[0][0],
            answers=tuple(ranked for _, ranked in answers),
            emitted_at=now,
        )
    else:
        # Built without validation, as the answers were: each is a checked RankedWorkload.
        message = RanksBatchMessage.model_construct(
            schema_version=1,
            answers=tuple(
                StrategyAnswer.model_construct(strategy=strategy, **dict(ranked))
                for strategy, ranked in answers
            ),
            emitted_at=now,
        )
    try:
        records.append((chunk, encode(message, gzip_threshold=gzip_above)))
    except EncodeError as error:  # too large (MessageTooLarge), or text that is not Unicode
        if len(chunk) == 1:
            too_large = isinstance(error, MessageTooLarge)
            what = "do not fit in a record" if too_large else "cannot be encoded"
            refused.append((chunk[0], Refusal(f"the ranks {what}: {error}", error)))
            return
        half = len(chunk) // 2
        _encode_chunk(chunk[:half], answer_of, now, gzip_above, records, refused)
        _encode_chunk(chunk[half:], answer_of, now, gzip_above, records, refused)


@dataclass(eq=False, slots=True)
class _Entry:
    """An answer handed over, and where its fate goes."""

    strategy: str
    ranked: RankedWorkload
    fate: asyncio.Future[Refusal | None] = field(repr=False)


def _answer_of(entry: _Entry) -> tuple[str, RankedWorkload]:
    return entry.strategy, entry.ranked


class RanksOutbox:
    """The ranks records of one process's rankers (see the module docstring).

    ``metrics``: where the records published are counted (``podcost_messages_produced``);
    ``linger_s``: the most seconds the first pending answer waits for the other strategies';
    ``gzip_above``: values above this many bytes of JSON are gzipped one by one
    (``podcost_bus.gzip_threshold``)."""

    def __init__(
        self,
        bus: Bus,
        topic: str,
        *,
        metrics: Metrics,
        clock: Clock,
        partition_of: Callable[[bytes], int] | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        linger_s: float = LINGER_S,
        gzip_above: int = DEFAULT_GZIP_THRESHOLD,
    ) -> None:
        self.bus = bus
        self.topic = topic
        self.metrics = metrics
        self.clock = clock
        self.partition_of = partition_of if partition_of is not None else (lambda key: 0)
        """The partition the bus gives a workload's key (``podcost_bus.key_partitioner``). By
        default every answer in one record (a bus of one partition)."""
        self.backoff = backoff
        self.linger_s = linger_s
        self.gzip_above = gzip_above
        self._members: set[str] = set()
        """The strategies that hand answers over here, until they stop."""
        self._answered: set[str] = set()
        """Those that handed over what they read since the last records went out."""
        self._pending: list[_Entry] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def join(self, strategy: str) -> None:
        """``strategy``'s ranker hands its answers here from now on."""
        self._members.add(strategy)

    def leave(self, strategy: str) -> None:
        """``strategy``'s ranker stopped: the others no longer wait for it. Once none is left,
        what is still being sent is abandoned (its rankers are gone, and did not commit it)."""
        self._members.discard(strategy)
        self._answered.discard(strategy)
        if not self._members:
            self._cancel_timer()
            for task in self._sending:
                task.cancel()
        elif self._pending and self._answered >= self._members:
            self._flush()

    async def publish(
        self, strategy: str, answers: Sequence[RankedWorkload]
    ) -> list[Refusal | None]:
        """Publish ``strategy``'s ``answers`` (all it read since it last called, possibly none);
        returns once each is acknowledged (``None``) or refused for good (a :class:`Refusal`),
        in their order. Raises a ``BusError`` the bus raised that is not retriable."""
        loop = asyncio.get_running_loop()
        entries = [_Entry(strategy, ranked, loop.create_future()) for ranked in answers]
        self._pending.extend(entries)
        self._answered.add(strategy)
        if self._answered >= self._members:
            self._flush()
        elif self._pending and self._timer is None:
            self._timer = loop.call_later(self.linger_s, self._flush)
        if not entries:
            return []
        try:
            return list(await asyncio.gather(*(entry.fate for entry in entries)))
        except asyncio.CancelledError:
            # What was not sent yet is withdrawn: this ranker re-reads it (it did not commit).
            withdrawn = set(entries)
            self._pending = [entry for entry in self._pending if entry not in withdrawn]
            if not self._pending:
                self._cancel_timer()
            raise

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush(self) -> None:
        """Send everything pending, in a task of its own: a ranker cancelled meanwhile does
        not stop the others' answers."""
        self._cancel_timer()
        entries, self._pending = self._pending, []
        self._answered.clear()
        if not entries:
            return
        task = asyncio.create_task(self._send(entries), name="ranks-outbox")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, entries: list[_Entry]) -> None:
        queued: list[tuple[list[_Entry], Encoded, Awaitable[Delivery] | None]] = []
        try:
            records, refused = pack(
                entries, _answer_of, self.partition_of, self.clock.now(), self.gzip_above
            )
            for entry, refused_for_good in refused:
                _settle(entry, refused_for_good)
            for chunk, encoded in records:  # queued together, so the producer batches them
                try:
                    acked = await self.bus.send(
                        self.topic, encoded.key, encoded.value, encoded.headers
                    )
                except BusError as error:
                    if not error.retriable:
                        for entry in chunk:
                            if not entry.fate.done():
                                entry.fate.set_exception(error)
                        continue
                    queued.append((chunk, encoded, None))  # published again below, with backoff
                    continue
                queued.append((chunk, encoded, acked))
            while queued:
                chunk, encoded, ack = queued.pop(0)
                fate = await self._delivered(encoded, ack)
                for entry in chunk:
                    _settle(entry, fate)
        except asyncio.CancelledError:
            for _, _, ack in queued:  # never to be awaited now
                if inspect.iscoroutine(ack):
                    ack.close()
            for entry in entries:
                entry.fate.cancel()
            raise
        except Exception as error:  # a defect: each waiting ranker fails with it, none hangs
            for _, _, ack in queued:
                if inspect.iscoroutine(ack):
                    ack.close()
            for entry in entries:
                if not entry.fate.done():
                    entry.fate.set_exception(error)

    async def _delivered(self, encoded: Encoded, ack: Awaitable[Delivery] | None) -> Refusal | None:
        """Wait for a record's acknowledgement; publish it again while the error is transient;
        the refusal of its answers if the bus refuses it for good."""
        try:
            if ack is not None:
                try:
                    await ack
                except BusError as error:
                    if not error.retriable:
                        raise
                    ack = None
            if ack is None:

                async def publish() -> Delivery:
                    return await self.bus.publish(
                        self.topic, encoded.key, encoded.value, encoded.headers
                    )

                await retry_transient(
                    publish, what=f"publish to {self.topic}", sleep=self.clock.sleep,
                    backoff=self.backoff,
                )  # fmt: skip
        except BusError as error:
            return Refusal(f"cannot publish the ranks: {error}", error)
        self.metrics.produced.labels(self.topic).inc()
        return None


def _settle(entry: _Entry, fate: Refusal | None) -> None:
    if not entry.fate.done():  # its ranker may have been cancelled meanwhile
        entry.fate.set_result(fate)
