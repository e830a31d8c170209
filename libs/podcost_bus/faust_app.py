"""The faust-streaming transport of a keyed-state consumer: what the aggregator runs over Kafka.

``FaustKeyedApp`` runs a :class:`~podcost_bus.keyed.KeyedProcessor` as a faust app: one agent
reads the source topics (the aggregator's: workloads and ranks) in batches, one table per state
part, keyed by the record key, holds the states (restored from the tables' changelog topics after
a restart or a rebalance), and a timer lets the processor act on deadlines (and forget a state,
as a record can: a tombstone in every part's changelog, its wake-up forgotten). The aggregator
service builds it in Kafka mode; its tests start it in-process against the real broker.
Where podcost repairs faust (its consumer, flow control, producer metadata, stop, recovery) is
``podcost_bus.faust_adaptations``, one class or function per defect; this module is podcost's
use of faust:

- **Batches, acked when the next one is asked for** (``Stream.take_events``): up to
  :data:`BATCH_MAX` records, or what came within :data:`BATCH_WITHIN_S`. The agent runs
  ``podcost_bus.keyed.process_batch`` on one (decide every record, then the processor's flush
  sends every output and awaits the acknowledgements), writes the changed states and awaits
  their delivery, and only then asks for the next batch, which is when faust acks the previous
  one's records: at least once, never lost, one round of acknowledgements per batch, and each
  key's states written once per batch.
- **Nothing raises into faust**, which would ack the record: the processor dead-letters what
  cannot be decoded and retries transient publish errors itself; anything else stops the whole
  app before the batch is acked (:meth:`FaustKeyedApp.run` raises), and the restart reads it
  again. Sources are raw bytes (``raw`` serializers), so faust decodes nothing that could fail.
- **States are written and read around the tables**: into and from the tables' memory stores
  (``memory://``: rebuilt from the changelogs on start, no RocksDB), their changelog records
  sent with faust's producer (``ChangelogWrites``), rather than through ``Table.__setitem__``
  and ``Table.get``, whose buffer and sensors cost as much as the rest of the transport. The
  records are what the tables would send, so faust recovers, keeps standbys and compacts from
  them as from its own; the tables use the producer's partitioner (states are also written
  outside any stream event, by the timer), which puts a key's changelog record in the partition
  number of its source records, as faust's co-partitioned recovery assumes. Each key's decoded
  state is kept with the stored values it came from and its next wake-up, so a tick decodes
  nothing that did not change and looks only at keys with a wake-up. The stores are scanned
  again once the recovery after a rebalance is complete, to find the wake-ups of what it
  restored, in slices of :data:`SCAN_SLICE_S` that let records through in between: a record's
  own state is decoded when it comes. A processor that can tell a wake-up from the stored parts
  (``StoredWakeup``, the aggregator's) is asked that instead, and a restored state is decoded
  only once due or read. Decoding every restored state during the recovery, on every tick, held
  the event loop for most of it (``tests/bench/bench_failover.py``).
- **One lock** serialises the agent and the timer: a batch awaits its acknowledgements between
  reading its keys' states and writing them, and a tick in between would decide from, and then
  overwrite, the states the batch is about to replace.
- **Skipped records stop the app** (:class:`SkippedRecords`), should faust still skip one:
  source topics have contiguous offsets (no compaction, no transactions), so a batch with an
  offset beyond the next expected one stops the app before anything of it is processed or acked,
  and it or the member that took its partitions reads them again from the committed offset. The
  next expected offset is kept per consumer-group generation: the records processed since the
  rebalance, and the offset each partition was sought to, so a skip of a partition's first
  records is caught too.
- **A consumer that stops making progress exits** (:meth:`FaustKeyedApp._watch`, the decision in
  ``podcost_core.progress``): faust was seen to stop consuming for good after a broker outage
  (still assigned, so still ready) and to hang in its start, neither of which raises. Every
  second the watchdog checks that the app moves forward (a record decided, a changelog record
  applied in a recovery): with records to process on its source partitions and none processed
  for :data:`PROGRESS_STALL_S`, or a start or a time unable to process (a rebalance, a recovery,
  the changelogs' metadata missing) without progress for :data:`START_TIMEOUT_S`, the app is not
  ready from half that time and then :meth:`FaustKeyedApp.run` raises :class:`Stalled`. A
  consumer that stopped fetching sees no new highwaters, so while idle the broker's end offsets
  are asked. The same watchdog seeks a stalled recovery again and fetches missing changelog
  metadata (both in ``podcost_bus.faust_adaptations``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import faust
from aiokafka.helpers import create_ssl_context

from podcost_bus.faust_adaptations import (
    App,
    ChangelogMetadata,
    ChangelogWrites,
    RecoveryStalls,
    hold_failed,
    seek_stalled_recovery,
    stop_bounded,
)
from podcost_bus.faust_adaptations import Store as MemoryStore
from podcost_bus.kafka import key_partition, partition_by_key
from podcost_bus.keyed import (
    DROP,
    MAX_STATE_RECORD_BYTES,
    UNKNOWN,
    Batch,
    KeyedProcessor,
    StoredWakeup,
    process_batch,
    tick_batch,
)
from podcost_bus.protocol import Record, TopicPartition
from podcost_bus.settings import BusSettings
from podcost_core.progress import Progress, progress_verdict

log = logging.getLogger(__name__)

S = TypeVar("S")


class FaustAppFailed(RuntimeError):
    """The faust app stopped processing: a processor error, or faust itself crashed. The
    service exits so that its supervisor restarts it; unacknowledged records are read again."""


class Stalled(FaustAppFailed):
    """The app stopped making progress, or did not start (see the module docstring)."""


class SkippedRecords(FaustAppFailed):
    """faust delivered a record past offsets it never delivered (see the module docstring)."""


#: How long :meth:`FaustKeyedApp.run` waits for faust to stop before it leaves it (logged).
STOP_TIMEOUT_S = 15.0

#: The most records one batch holds, and how long the agent waits for a batch to fill: a batch is
#: taken once full, or after that wait with what there is (the latency it adds at a low rate).
BATCH_MAX = 250
BATCH_WITHIN_S = 0.02

#: The longest the scan of the stores after a recovery holds the event loop at a time (a
#: 25-pod state takes about a millisecond to decode).
SCAN_SLICE_S = 0.02

#: How long a changelog partition may stay behind its highwater, during a recovery, without
#: one more record applied before it is sought again to the next offset it needs
#: (``faust_adaptations.seek_stalled_recovery``), and how often that is checked.
RECOVERY_STALL_S = 10.0
RECOVERY_CHECK_S = 1.0

#: The progress watchdog's bounds (see the module docstring): how long the app may have records
#: to process on its source partitions without processing one, and how long its start may go on
#: without progress, before it exits (not ready from half that time).
PROGRESS_STALL_S = 60.0
START_TIMEOUT_S = 120.0


def _credentials(settings: BusSettings) -> Any:
    ssl_context = None
    if settings.uses_tls:
        ssl_context = create_ssl_context(
            cafile=settings.ssl_cafile,
            certfile=settings.ssl_certfile,
            keyfile=settings.ssl_keyfile,
            password=settings.ssl_password.get_secret_value() if settings.ssl_password else None,
        )
    if settings.sasl_mechanism is not None:
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password.get_secret_value() if settings.sasl_password else None,
            ssl_context=ssl_context,
            mechanism=settings.sasl_mechanism,
        )
    return None if ssl_context is None else faust.SSLCredentials(ssl_context)


@dataclass(frozen=True, slots=True)
class _Decoded(Generic[S]):
    """A key's state as decoded from its stored parts (which it keeps, to tell whether they
    changed since), and when it is next due (:meth:`KeyedProcessor.wakeup`)."""

    stored: tuple[bytes | None, ...]
    state: S
    wakeup: float | None


class FaustKeyedApp(Generic[S]):
    """A :class:`KeyedProcessor` run by faust-streaming (see the module docstring).

    ``on_recovery_read`` is told, as the tables' recovery takes changelog records, how many it
    took of partitions of each role (``active``: read before this member decides for them;
    ``standby``: a copy of another member's): with a standby, a takeover reads only what the
    standby did not have yet."""

    def __init__(
        self,
        settings: BusSettings,
        processor: KeyedProcessor[S],
        *,
        app_id: str,
        topics: Sequence[str],
        data_dir: Path,
        tick_s: float = 0.25,
        batch_max: int = BATCH_MAX,
        batch_within_s: float = BATCH_WITHIN_S,
        commit_interval_s: float = 1.0,
        standby_replicas: int = 0,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        stall_s: float = PROGRESS_STALL_S,
        start_timeout_s: float = START_TIMEOUT_S,
        on_recovery_read: Callable[[str, int], None] | None = None,
    ) -> None:
        if not settings.bootstrap_servers:
            raise ValueError("the faust app needs Kafka bootstrap servers (PODCOST_KAFKA)")
        if not topics:
            raise ValueError("the faust app needs at least one source topic")
        self.settings = settings
        self.processor = processor
        self.app_id = app_id
        self.topics = tuple(topics)
        self.data_dir = data_dir
        self._partitions = settings.partitions
        self._stop_timeout_s = stop_timeout_s
        self._stall_s = stall_s
        self._start_timeout_s = start_timeout_s
        self._last_progress: float | None = None
        """When a batch was last processed or a changelog record last applied (monotonic)."""
        self._stalled = False
        self._unsettled_since: float | None = None
        """When the app last became unable to process (``recovering_for``)."""
        """Whether the progress watchdog says the app is stalled (not ready, exiting soon)."""
        self._ends: dict[TopicPartition, int] = {}
        """The source partitions' end offsets the watchdog last asked of the broker."""
        self._in_flight = 0
        """The records of the batch being processed (taken but not done yet)."""
        self._batch_max = batch_max
        self._batch_within_s = batch_within_s
        self._lock = asyncio.Lock()
        self._failure: asyncio.Future[BaseException] | None = None
        self._started = False
        self._decoded: dict[bytes, _Decoded[S]] = {}
        """Decoded states by key, with the stored part values they were decoded from: the memory
        store hands back the very bytes objects it was given, so an identity check tells whether
        a part changed (after a recovery it did) without decoding it again."""
        self._wakeups: dict[bytes, float] = {}
        """The keys of ``_decoded`` that have a wake-up, and when (what a tick looks at)."""
        self._rescan = True
        """Whether the stores may hold states not decoded yet (a recovery or a rebalance since the
        last full scan): once no recovery is going on, a tick scans every stored key."""
        self._unscanned: list[bytes] = []
        """The keys the scan has still to look at."""
        self._told = processor if isinstance(processor, StoredWakeup) else None
        """The processor, if it tells a stored state's wake-up (checked once: a protocol's
        ``isinstance`` costs as much as the answer)."""
        self._next_offset: dict[TopicPartition, int] = {}
        """Per source partition, the offset after the last record processed since the last
        rebalance (or the offset sought to, if that is further): the next one must not be
        beyond it."""
        self._generation = -1
        """The consumer group generation :attr:`_next_offset` belongs to."""

        self.app: Any = App(
            app_id,
            broker=[f"kafka://{host.strip()}" for host in settings.bootstrap_servers.split(",")],
            broker_client_id=settings.client_id,
            broker_credentials=_credentials(settings),
            broker_session_timeout=settings.session_timeout_ms / 1000,
            # A sixth of the session rather than faust's 3 s: a survivor learns of a crashed
            # member's expiry at its next heartbeat, and starts taking its partitions then.
            broker_heartbeat_interval=settings.session_timeout_ms / 6000,
            broker_request_timeout=settings.request_timeout_ms / 1000,
            broker_commit_interval=commit_interval_s,
            consumer_auto_offset_reset="earliest",
            producer_acks=-1,
            # The changelog's large parts are gzipped one by one by the processor (a state
            # part above 16 KB): gzipping the batches again (aiokafka does it at level 9)
            # took a twelfth of the process's CPU for a few percent of the bytes.
            producer_compression_type=None,
            # murmur2's, each key's partition remembered: 3.6 keyed records a decision.
            producer_partitioner=partition_by_key,
            producer_linger=settings.linger_ms / 1000,
            # The bus's batch size rather than faust's 16 KB: a batch's changelog records go in
            # a few produce requests instead of one per 16 KB of each partition.
            producer_max_batch_size=settings.max_batch_bytes,
            # Kafka's default rather than faust's 1,000,000, under which a snapshot part (a
            # record's value of up to a million bytes, and its header) did not fit: the refused
            # state write stopped the app, and it stopped again on the same records after every
            # restart. What a processor stores stays below this.
            producer_max_request_size=MAX_STATE_RECORD_BYTES,
            topic_partitions=settings.partitions,
            topic_replication_factor=settings.replication_factor,
            table_standby_replicas=standby_replicas,
            store="memory://",
            datadir=str(data_dir),
            web_enabled=False,
            autodiscover=False,
        )
        self.app.source_topics = frozenset(self.topics)
        self.app.bus_settings = settings
        self.app.on_source_seek = self._on_source_seek
        # Told how many changelog records each recovery step took, by the role of their
        # partition (``faust_adaptations.ACTIVE`` or ``STANDBY``).
        self.app.on_recovery_read = on_recovery_read
        self.tables = {
            part: self.app.Table(
                part,
                partitions=settings.partitions,
                key_type=bytes,
                value_type=bytes,
                use_partitioner=True,
                help=f"The {part} part of each key's state.",
            )
            for part in processor.parts
        }
        source = self.app.topic(
            *self.topics,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )
        self._changelogs = ChangelogMetadata(app_id, self._producer, self.changelog_topics)
        self.app.agent(source, name=f"{app_id}.process")(self._agent)
        self.app.timer(tick_s, name=f"{app_id}.tick")(self._tick)
        self.app.on_partitions_revoked.connect(self._on_revoked)

    def changelog_topics(self) -> list[str]:
        """The tables' changelog topics, in the order of the processor's parts."""
        return [table.changelog_topic.get_topic_name() for table in self.tables.values()]

    def assignor_topic(self) -> str:
        """faust's partition assignor leader topic (``<app id>-__assignor-__leader``)."""
        return f"{self.app_id}-__assignor-__leader"

    def recovering_for(self) -> float:
        """Seconds the app has been unable to process since its start or a rebalance (a
        recovery of the tables from their changelogs, a rebalance, the changelogs' metadata
        missing), as the watchdog last saw it; 0 once it processes."""
        since = self._unsettled_since
        return 0.0 if since is None else time.monotonic() - since

    def stalled(self) -> bool:
        """Whether the progress watchdog holds the app not ready (it exits at the stall bound)."""
        return self._stalled

    def ready(self) -> bool:
        """Started, partitions assigned and tables recovered: records are being processed."""
        return (
            self._started
            and not self._stalled
            and self._settled()
            and bool(self.app.consumer.assignment())
        )

    def _settled(self) -> bool:
        """Able to process: no rebalance or recovery going on, the changelogs' metadata known."""
        app = self.app
        return (
            self._changelogs.known()
            and not app.rebalancing
            and not app.in_recovery
            and app.tables.recovery.completed.is_set()
        )

    async def run(self) -> None:
        """Start the app and run until cancelled; raises :class:`FaustAppFailed` if it stops
        processing."""
        failure: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self._failure = failure
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Started first: faust's start waits for the first recovery, which can stall too, and
        # can hang in itself (see the module docstring).
        watchdog = asyncio.create_task(self._watch(), name=f"{self.app_id}.watchdog")
        starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.wait({starting, watchdog}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                starting.result()
                await self.app.wait_first(failure, watchdog)
            if watchdog.done() and not watchdog.cancelled():
                raise Stalled(f"{self.app_id} stalled: {watchdog.result()}; exiting to restart")
            if failure.done() and not failure.cancelled():
                raise FaustAppFailed(f"{self.app_id} stopped processing") from failure.result()
            if self.app.crashed:
                reason = self.app.crash_reason
                raise FaustAppFailed(f"faust crashed: {reason!r}") from reason
            raise FaustAppFailed("faust stopped by itself")
        finally:
            starting.cancel()
            watchdog.cancel()
            self._started = False
            await self._stop(failed=failure.done() or watchdog.done())

    async def _start(self) -> None:
        await self.app.start()
        await self._changelogs.wait()
        self._started = True

    async def _stop(self, *, failed: bool) -> None:
        await stop_bounded(
            self.app, failed=failed, timeout_s=self._stop_timeout_s, name=self.app_id
        )

    async def _watch(self) -> str:
        """The watchdog: seeks a stalled recovery again, and returns why the app must exit when
        it makes no progress (see the module docstring)."""
        recovery = self.app.tables.recovery
        stalls: RecoveryStalls[Any] = RecoveryStalls(RECOVERY_STALL_S)
        began = time.monotonic()
        applied: tuple[Any, ...] = ()
        asked = began  # when the broker was last asked for the end offsets
        behind_since: float | None = None
        unsettled_since: float | None = None
        while True:
            await asyncio.sleep(RECOVERY_CHECK_S)
            now = time.monotonic()
            if recovery.in_recovery:
                # Each changelog record applied is progress: a long recovery is no stall.
                progressed = tuple(sorted(dict(recovery.active_offsets).items()))
                if progressed != applied:
                    applied = progressed
                    self._last_progress = now
            lag = self._lag()
            idle = now - max(began, self._last_progress or began)
            if self._started and not lag and min(idle, now - asked) >= self._stall_s / 2:
                # The highwaters are the last fetch's, and a consumer that stopped fetching
                # never sees new ones: while idle, the broker is asked now and then.
                asked = now
                await self._ask_ends()
                lag = self._lag()
            if not lag:
                behind_since = None
            elif behind_since is None:
                behind_since = now
            if self._started and not self._changelogs.known():
                await self._changelogs.refresh(self.settings.request_timeout_ms / 1000)
            if not self._started or self._settled():
                unsettled_since = None
            elif unsettled_since is None:
                unsettled_since = now
            # A start counts too (its first recovery): what podcost_aggregator_recovering_seconds
            # shows.
            self._unsettled_since = (
                None if self._started and self._settled() else unsettled_since or began
            )
            verdict = progress_verdict(
                now,
                began=began,
                started=self._started,
                last_progress=self._last_progress,
                lag=lag,
                behind_since=behind_since,
                unsettled_since=unsettled_since,
                stall_s=self._stall_s,
                start_s=self._start_timeout_s,
            )
            if verdict.progress is Progress.EXIT:
                self._stalled = True
                return verdict.reason
            if verdict.progress is Progress.NOT_READY and not self._stalled:
                log.warning("%s: %s; not ready", self.app_id, verdict.reason)
            self._stalled = verdict.progress is Progress.NOT_READY
            await seek_stalled_recovery(self.app, stalls, now, self.app_id)

    def _lag(self) -> int | None:
        """The records taken but not processed yet (a batch stuck in its flush), and those
        after them (:meth:`_partition_lag`); None: unknown."""
        behind = self._partition_lag()
        return behind if not self._in_flight else (behind or 0) + self._in_flight

    def _partition_lag(self) -> int | None:
        """Records on the assigned source partitions past the ones processed (None: unknown),
        from the highwaters the consumer's fetches saw, or the broker's end offsets last asked
        (:meth:`_ask_ends`) if larger: no request."""
        if self._generation != self.app.consumer_generation_id:
            return None  # rebalanced since the last seek: nothing known yet
        consumer = self.app.consumer
        lag = None
        try:
            for tp in consumer.assignment():
                key = TopicPartition(tp.topic, tp.partition)
                following = self._next_offset.get(key)
                if tp.topic not in self.app.source_topics or following is None:
                    continue
                ends = [consumer.highwater(tp), self._ends.get(key)]
                known = [end for end in ends if end is not None]
                if known:
                    lag = (lag or 0) + max(0, max(known) - following)
        except Exception:  # not started yet, or the assignment changed meanwhile
            return None
        return lag

    async def _ask_ends(self) -> None:
        """Ask the broker for the end offsets of the assigned source partitions (kept in
        :attr:`_ends`; a failure, the broker away, leaves them as they were)."""
        consumer = self.app.consumer
        try:
            tps = [tp for tp in consumer.assignment() if tp.topic in self.app.source_topics]
            async with asyncio.timeout(self.settings.request_timeout_ms / 1000):
                ends = await consumer.highwaters(*tps) if tps else {}
        except Exception as error:
            log.debug("%s: end offsets unavailable: %r", self.app_id, error)
            return
        self._ends = {
            TopicPartition(tp.topic, tp.partition): end
            for tp, end in ends.items()
            if end is not None
        }

    async def lag(self) -> dict[TopicPartition, int]:
        """Per source partition read here: records published but not processed yet, as faust's
        monitor last saw the partition's end (partitions not seen yet are left out)."""
        monitor = self.app.monitor
        lags = {}
        for tp, end in dict(monitor.tp_end_offsets).items():
            if tp.topic in self.topics:
                read = monitor.tp_read_offsets.get(tp, -1)
                lags[TopicPartition(tp.topic, tp.partition)] = max(0, end - read - 1)
        return lags

    # --- called by faust ----------------------------------------------------------------------

    async def _agent(self, stream: Any) -> None:
        # A batch's events are acked by faust when this asks for the next batch, that is once
        # the batch is decided, its outputs acknowledged and its states written.
        async for events in stream.take_events(self._batch_max, self._batch_within_s):
            self._in_flight = len(events)  # to process: lag the highwaters no longer show
            async with self._lock:
                try:
                    records = [_record(event) for event in events]
                    self._check_offsets(records)
                    batch = await process_batch(
                        self.processor, records, self._state, decided=self._record_decided,
                        keys=self._keys,
                    )  # fmt: skip
                    await self._store_batch(batch)
                    self._last_progress = time.monotonic()
                    self._in_flight = 0
                except Exception as error:  # escalated: see the module docstring
                    await self._fail(error, [event.message for event in events])

    def _record_decided(self) -> None:
        # Progress is judged per record, not per batch: a batch of records that are slow to
        # decide may take longer than the stall bound as a whole, and killed for it, it would
        # be read again and take as long after every restart.
        self._last_progress = time.monotonic()

    def _check_offsets(self, records: Sequence[Record]) -> None:
        """Raise :class:`SkippedRecords` if a record is past one faust never delivered (see the
        module docstring); nothing of the batch is processed then."""
        expected = self._expected()
        for record in records:
            tp = record.tp
            following = expected.get(tp)
            if following is not None and record.offset > following:
                skipped = (
                    f"{record.topic}[{record.partition}] offsets {following}..{record.offset - 1}"
                )
                raise SkippedRecords(f"faust skipped {skipped}; restart to read them")
            if following is None or record.offset >= following:
                expected[tp] = record.offset + 1

    async def _on_revoked(self, sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # After a rebalance a partition resumes from its committed offset, which another member
        # may have moved on: only gaps between records seen since then are faust's.
        self._next_offset.clear()
        self._rescan = True

    def _on_source_seek(self, positions: Mapping[TopicPartition, int]) -> None:
        # Where each partition reads next after the seek (its committed offset, or its
        # beginning): the first record delivered after it must not be beyond (a skip at the
        # start of a partition, offset 0 included, is caught too). Records already processed
        # since the rebalance may be ahead of it: they are read again, and are not a gap.
        expected = self._expected()
        for tp, offset in positions.items():
            expected[tp] = max(offset, expected.get(tp, offset))

    def _expected(self) -> dict[TopicPartition, int]:
        """:attr:`_next_offset`, emptied when the consumer group's generation changed since it
        was last used: what was delivered or sought before that rebalance says nothing of the
        partitions now (someone else may have moved them on)."""
        generation: int = self.app.consumer_generation_id
        if generation != self._generation:
            self._generation = generation
            self._next_offset.clear()
        return self._next_offset

    async def _tick(self) -> None:
        try:
            await self._scan()
        except Exception as error:  # escalated: see the module docstring
            await self._fail(error)
            return
        async with self._lock:
            try:
                now = self.processor.now()
                due = []
                for key in [key for key, wakeup in self._wakeups.items() if wakeup <= now]:
                    entry = self._entry(key)  # the stored values may have changed since
                    if entry is not None and entry.wakeup is not None and entry.wakeup <= now:
                        due.append((key, entry.state))
                if not due:
                    return
                owned = {
                    tp.partition
                    for tp in self.app.assignor.assigned_actives()
                    if tp.topic == self.topics[0]
                }
                # Standby and revoked partitions are someone else's to act on.
                mine = [item for item in due if key_partition(item[0], self._partitions) in owned]
                changed = await tick_batch(self.processor, mine)
                # A state the tick dropped leaves every part's store and changelog (tombstones)
                # and its wake-up, as a record's DROP does.
                await self._store_batch(Batch(states=dict(changed)))
            except Exception as error:  # escalated: see the module docstring
                await self._fail(error)

    async def _scan(self) -> None:
        """Learn every stored state's wake-up once a recovery is complete (:meth:`_scan_key`), a
        slice at a time; a rebalance meanwhile starts it again after its recovery."""
        if self._rescan and self._settled():
            self._rescan = False
            self._unscanned = list(self._keys())
        while self._unscanned and not self._rescan:
            async with self._lock:
                until = time.monotonic() + SCAN_SLICE_S
                self._scan_key(self._unscanned.pop())
                while self._unscanned and time.monotonic() < until:
                    self._scan_key(self._unscanned.pop())
            await asyncio.sleep(0)  # the agent's batches and the HTTP server in between

    def _scan_key(self, key: bytes) -> None:
        """Learn ``key``'s wake-up: from its stored parts where the processor can tell
        (:class:`StoredWakeup`), the state then decoded only once due or read; else by decoding
        it."""
        processor = self._told
        if processor is None:
            self._entry(key)
            return
        stored = tuple(store.get(key) for store in self._stores())
        cached = self._decoded.get(key)
        if cached is not None and all(a is b for a, b in zip(cached.stored, stored, strict=True)):
            return
        if all(value is None for value in stored):
            self._forget(key)
            return
        wakeup = processor.stored_wakeup(key, dict(zip(self.processor.parts, stored, strict=True)))
        if wakeup is UNKNOWN:
            self._entry(key)
            return
        self._decoded.pop(key, None)  # decoded from parts since replaced
        if wakeup is None:
            self._wakeups.pop(key, None)
        else:
            self._wakeups[key] = wakeup

    # --- state --------------------------------------------------------------------------------

    # The tables' in-memory stores are read and written directly (``_stores``): a ``Table.get``
    # also goes through faust's sensors, which cost more than the lookup, on every record and
    # for every key on every tick; for the writes, see ``_store_batch``.

    def _stores(self) -> list[dict[bytes, bytes]]:
        """Per part, the dict the table's memory store keeps (``store="memory://"``)."""
        tables: list[Any] = [self.tables[part] for part in self.processor.parts]
        return [table.data.data for table in tables]

    def _keys(self) -> set[bytes]:
        keys: set[bytes] = set()
        for store in self._stores():
            keys.update(store)
        return keys

    def state_count(self) -> int:
        """How many keys have a state in the tables' stores (standby partitions included)."""
        return len(self._keys())

    def _state(self, key: bytes | None) -> S | None:
        entry = self._entry(key)
        return None if entry is None else entry.state

    def _entry(self, key: bytes | None) -> _Decoded[S] | None:
        if key is None:
            return None
        stored = tuple(store.get(key) for store in self._stores())
        cached = self._decoded.get(key)
        if cached is not None and all(a is b for a, b in zip(cached.stored, stored, strict=True)):
            return cached
        if all(value is None for value in stored):
            self._forget(key)
            return None
        state = self.processor.load(key, dict(zip(self.processor.parts, stored, strict=True)))
        return self._remember(key, _Decoded(stored, state, self.processor.wakeup(state)))

    def _remember(self, key: bytes, entry: _Decoded[S]) -> _Decoded[S]:
        self._decoded[key] = entry
        if entry.wakeup is None:
            self._wakeups.pop(key, None)
        else:
            self._wakeups[key] = entry.wakeup
        return entry

    def _forget(self, key: bytes) -> None:
        self._decoded.pop(key, None)
        self._wakeups.pop(key, None)

    def _producer(self) -> Any:
        """faust's aiokafka producer, which writes the changelogs (faust keeps it private)."""
        producer = self.app.producer._producer
        if producer is None:
            raise RuntimeError(f"{self.app_id}: faust's producer is not started")
        return producer

    async def _store_batch(self, batch: Batch[S]) -> None:
        """Write the batch's changed states to the tables' stores and their changelog records
        (one per changed part, :class:`~podcost_bus.faust_adaptations.ChangelogWrites`); called
        once its outputs are acknowledged, done once the broker has the records.

        What ``Table.__setitem__`` does, without the path its changelog record takes in faust
        (``Table.send_changelog`` → ``Topic.send_soon`` → the ``ProducerBuffer`` → aiokafka, with
        faust's sensors on the way), which took half of what the transport costs a decision
        (``bench_aggregator.py --processor floor``: 850–935 decisions/s through it, 1,880–2,113
        with this) and let a commit pass states not delivered yet."""
        if not batch.states:
            return
        stores = dict(zip(self.processor.parts, self._stores(), strict=True))
        topics = dict(zip(self.processor.parts, self.changelog_topics(), strict=True))
        writes = ChangelogWrites(self._producer())
        for key, new in batch.states.items():
            if key is None:
                continue  # a record without a key has no state to keep
            replaced = key in batch.replaced
            if new is DROP or replaced:
                for part, store in stores.items():
                    if key in store:
                        del store[key]
                        # A tombstone: compaction forgets the key.
                        await writes.send(topics[part], key, None)
                self._forget(key)
                if new is DROP:
                    continue
            cached = self._decoded.get(key)
            old = cached.state if cached is not None else None
            for part, value in self.processor.dump(old, new).items():
                stores[part][key] = value
                await writes.send(topics[part], key, value)
            stored = tuple(store.get(key) for store in stores.values())
            self._remember(key, _Decoded(stored, new, self.processor.wakeup(new)))
        # A failed delivery raises, and the batch is withheld like any failure's.
        written = await writes.delivered()
        tables = dict(zip(self.changelog_topics(), self.tables.values(), strict=True))
        for tp, offset in written.items():
            kept = tables[tp[0]].data
            if isinstance(kept, MemoryStore):  # what a recovery need not read again
                kept.written(tp, offset)

    async def _fail(self, error: BaseException, messages: Sequence[Any] = ()) -> None:
        log.error("%s stops: %r", self.app_id, error, exc_info=error)
        if self._failure is not None and not self._failure.done():
            self._failure.set_result(error)
        # Never return to faust, which would ack and go on with the next batch.
        await hold_failed(messages)


def _record(event: Any) -> Record:
    """A faust event as the bus's ``Record``."""
    message = event.message
    return Record(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=event.key,
        value=event.value if event.value is not None else b"",
        headers={name: value or b"" for name, value in dict(event.headers).items()},
        timestamp=message.timestamp or 0.0,
    )
