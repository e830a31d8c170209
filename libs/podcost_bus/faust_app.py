"""The faust-streaming transport of a keyed-state consumer: what the aggregator runs over Kafka.

``FaustKeyedApp`` runs a :class:`~podcost_bus.keyed.KeyedProcessor` as a faust app: one agent
reads the source topics (the aggregator's: workloads and ranks) in batches, one table per state
part, keyed by the record key, holds the states (restored from the tables' changelog topics after
a restart or a rebalance), and a timer lets the processor act on deadlines. The aggregator
service builds it in Kafka mode; its tests start it in-process against the real broker.

What podcost relies on, and why it is arranged so:

- **Batches, acked when the next one is asked for** (``Stream.take_events``): up to
  :data:`BATCH_MAX` records, or what came within :data:`BATCH_WITHIN_S`. The agent runs
  ``podcost_bus.keyed.process_batch`` on one (decide every record, then the processor's flush
  sends every output and awaits all the acknowledgements), writes the changed states, and only
  then asks for the next batch, which is when faust acks the previous one's records. A batch
  is one round of acknowledgements instead of one per decision, and its states are written once
  per key however many of its records a key had.
- **faust acks a message when an agent raises** (and restarts the agent): the records would be
  committed unprocessed. So nothing here lets an exception reach faust: the processor
  dead-letters what cannot be decoded and retries transient publish errors itself; anything else
  stops the whole app *before* the batch is acked (the agent blocks until stopped, and
  :meth:`FaustKeyedApp.run` raises), so its records are read again after the restart. They are
  *withheld* from faust (marked acked without their offsets being recorded), or faust's stop
  would wait for their acks forever; stopping is bounded by a timeout besides (a batch stuck in
  its flush is withheld then too).
- **Sources are raw bytes** (``key_serializer``/``value_serializer`` ``raw``): faust's own JSON
  decoding would crash the agent on a bad record before our code saw it, and would ack it.
- **States are written after the outputs are acknowledged, and the batch is done once they
  are acknowledged too**: the state writes (changelog records) follow the flush, and the agent
  awaits their delivery before it asks for the next batch. A crash in between processes the
  batch again (its offsets are not committed) and publishes again: at least once, never lost.
  faust's own guard would not be enough: it flushes its producer before it commits offsets, but
  the flush of the buffer a table write's record goes through gives up once 0.1 s pass without
  a message sent (``ProducerBuffer.flush_atmost``, ``faust/transport/producer.py`` line 89), so
  on a busy machine a commit could pass source records whose states were still in that buffer,
  and a stop then dropped them (the buffer's task ends with the app): the state another member
  recovered lacked answers whose records nobody would read again, and the workload waited for
  them forever. The changelog producer does not compress batches: the large state parts are
  gzipped one by one already, and aiokafka's level-9 gzip over them took a twelfth of the
  process's CPU.
- **States are written around the tables** (:meth:`FaustKeyedApp._store_batch`): into the
  tables' memory stores, and their changelog records sent with faust's own producer, rather
  than through ``Table.__setitem__``, whose record takes a path through faust's producer buffer
  that cost as much as the rest of the transport together. The records are what the tables
  would send; faust recovers, keeps standbys and compacts from them as from its own.
- **Tables use the producer's partitioner** (``use_partitioner``): states are written outside
  of any stream event (by the timer, and by the agent for a whole batch), where faust cannot
  tell the partition from the current event. The table key is the record key itself, so murmur2
  puts a key's changelog record in the same partition number as its source records, which is
  what faust's co-partitioned recovery assumes. The app is not ready before faust's producer has
  the changelog topics' metadata.
- **Reads bypass the tables** too: states are read from the memory stores' dicts, not through
  ``Table.get``, which also runs faust's sensors, at a cost larger than the lookup's, for every
  record and for every key on every tick. Each key's decoded state is kept with the stored
  values it came from and its next wake-up, so a tick decodes nothing that did not change; and
  a tick looks only at the keys with a wake-up (an index kept with the decoded states), not at
  every stored key: the full scan of the stores, 4 times a second, took 3 % of the process's
  CPU with 3,000 workloads in the aggregator benchmark, and grows with the fleet. The stores are
  scanned again only after a rebalance, until the recovery that fills them from the changelogs
  is complete.
- **One lock** serialises the agent and the timer: a batch awaits its acknowledgements between
  reading its keys' states and writing them, and a tick in between would decide from, and then
  overwrite, the states the batch is about to replace.
- **The in-memory store** (``memory://``): state is rebuilt from the changelog on start; no
  RocksDB to install or keep on disk.
- **Records buffered during a recovery are kept** (``_FlowControl``): faust clears every
  stream buffer whenever its flow control resumes, and a recovery resumes it twice (to read the
  changelogs, then once the source partitions are resumed and sought); source records fetched
  and buffered between the two were thrown away by the second resume, after the seek and with
  the fetch position past them, so nobody read them again. That was the skip seen around
  consumer-group rebalances (``tests/integration/test_core_replicas.py``). Here a resume clears
  the buffers only when the flow was suspended (a rebalance's revocation), as it is meant to.
- **A message of an earlier generation is never acked** (``_Consumer.ack``): faust's streams
  ack what they skip, including messages fetched before a rebalance and delivered after it,
  and the next commit of their partition could then pass them unprocessed (the likely cause of
  a decision lost once in the core-replicas test, when another member took the partition
  over). They are withheld, and read again after the seek.
- **Skipped records stop the app**, in case faust still skips one: source topics have
  contiguous offsets (no compaction, no transactions), so a batch with an offset beyond the
  next expected one stops the app before anything of it is processed or acked (the service
  exits non-zero; its Deployment restarts it), and it or the member that took its partitions
  reads them again from the committed offset, which never passed them. The next expected
  offset is kept per consumer-group generation: the records processed since the rebalance,
  and the offset each partition was sought to (its committed offset, or its beginning when
  nobody committed), so a skip of a partition's first records is caught too. faust-streaming
  0.15.3 was also seen skipping a record that arrived while a restarted app recovered its
  tables (2 runs in about 35 of the restart test), likely the same clear of the buffers.
  What let faust skip them on a partition nobody had committed yet (aiokafka's seek to the
  committed offset does nothing there) is repaired by the consumer thread's seek.
- **A stalled recovery is sought again** (:meth:`FaustKeyedApp._watch`): after a
  rebalance, a changelog partition newly assigned was seen never to deliver a record to the
  recovery although it was behind its highwater and aiokafka kept fetching it (faust's log:
  "No event received for active tp ... since recovery start", for minutes): the records were
  fetched and dropped somewhere between aiokafka and the recovery, with the fetch position past
  them, so the recovery never ended, the app never processed a record again and never became
  ready (a lost decision in ``tests/integration/test_core_replicas.py`` after the SIGKILL of an
  aggregator; likely its start-up ``/readyz`` time-out too). A partition that got nothing for
  :data:`RECOVERY_STALL_S` while behind is sought to the offset after the last one applied;
  applying a changelog record again is harmless (the same value for the same key). The watch
  starts before faust does, whose start waits for the first recovery
  (``tests/integration/test_faust_app.py`` drops a recovery's records to check it ends).
- **A consumer that stops making progress exits** (:meth:`FaustKeyedApp._watch`, the decision
  in ``podcost_core.progress``): faust was seen to stop consuming for good after a broker
  outage ("Heartbeat session expired - marking coordinator dead", then nothing, still assigned
  and so still ready), and to hang in its start (``Creating topic`` never ``created``). Neither
  raises, so the service never exited and its supervisor never restarted it. The watchdog that
  seeks stalled recoveries also checks, every second, that the app moves forward (a batch
  processed, a changelog record applied in a recovery): with records to process on its source
  partitions (the consumer's highwaters beyond the records processed, or a batch taken and not
  done) and none processed for :data:`PROGRESS_STALL_S` (a record decided is progress, so a
  batch of slow records is not taken for a stall), or a start, or a time unable to
  process once started (a rebalance, a recovery, the changelogs' metadata missing), without
  progress for :data:`START_TIMEOUT_S`, the app is not ready from half that time and then
  :meth:`FaustKeyedApp.run` raises :class:`Stalled` (the service exits non-zero; what was not
  committed is read again after the restart). A consumer that stopped fetching sees no new
  highwaters, so while it has processed nothing for half the bound the broker's end offsets
  are asked, at most that often. The changelogs' metadata, which faust's producer was seen to
  lose for good after the start (``tests/e2e/test_sigkill.py``: never ready, and idle, so
  nothing written that would fetch it again), is fetched again whenever it is missing.
- **A short fetch wait**: faust's aiokafka driver hard-codes ``fetch_max_wait_ms=1500``, and
  aiokafka keeps one fetch in flight per broker, so a record for a partition that was drained
  after that fetch was sent waits for it to come back, up to 1.5 s. Measured on one broker at 20
  snapshots/s: snapshot-to-costs p50 0.3 to 2 s with it, 50 to 80 ms with 100 ms, which the
  consumer thread here sets (``FETCH_MAX_WAIT_MS``) unless the bus settings name a wait; it
  also gives the consumer the settings' fetch minimum, as every podcost consumer has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import faust
from aiokafka.helpers import create_ssl_context
from faust.transport.drivers import aiokafka as faust_aiokafka
from mode.threads import WorkerThread
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

from podcost_bus.kafka import key_partition, partition_by_key
from podcost_bus.keyed import (
    DROP,
    MAX_STATE_RECORD_BYTES,
    Batch,
    KeyedProcessor,
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

#: How long the broker may hold a fetch of the faust consumer that has nothing new (see above),
#: unless the bus settings say.
FETCH_MAX_WAIT_MS = 100

#: The most records one batch holds, and how long the agent waits for a batch to fill: a batch is
#: taken once full, or after that wait with what there is (the latency it adds at a low rate).
BATCH_MAX = 250
BATCH_WITHIN_S = 0.02

#: How long a changelog partition may stay behind its highwater, during a recovery, without
#: one more record applied before it is sought again to the next offset it needs (see the
#: module docstring), and how often that is checked.
RECOVERY_STALL_S = 10.0
RECOVERY_CHECK_S = 1.0

#: The progress watchdog's bounds (see the module docstring): how long the app may have records
#: to process on its source partitions without processing one, and how long its start may go on
#: without progress, before it exits (not ready from half that time).
PROGRESS_STALL_S = 60.0
START_TIMEOUT_S = 120.0


class _DaemonWorker(WorkerThread):
    """mode's worker thread, but a daemon: when faust does not stop (:meth:`FaustKeyedApp._stop`
    gives up on it, say in a start hung in its consumer thread), the process must still exit for
    its supervisor to restart it, and the interpreter waits for every thread that is not one."""

    def __init__(self, service: Any, **kwargs: Any) -> None:
        super().__init__(service, **kwargs)
        self.daemon = True


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    Worker = _DaemonWorker

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start(); faust's driver takes neither from its settings.
        for name in ("_fetch_max_wait_ms", "_fetch_min_bytes"):
            if not hasattr(consumer, name):
                raise RuntimeError(f"this aiokafka has no {name}: revisit _create_worker_consumer")
        settings = cast(_App, self.app).bus_settings
        if settings is None:
            raise RuntimeError("the faust app's bus settings were not set before it started")
        wait = settings.fetch_max_wait_ms
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS if wait is None else wait
        consumer._fetch_min_bytes = settings.fetch_min_bytes
        return consumer

    async def seek_to_committed(self) -> Mapping[Any, int]:
        # faust drops fetched records it does not deliver around a rebalance (a generation
        # change mid-batch, a partition not active yet) although the fetch position moved past
        # them, and relies on this seek to read them again. aiokafka's seek skips a partition
        # whose committed offset is none or 0, so a source partition nobody has committed yet
        # kept the moved position and lost those records (seen after a consumer-group
        # rebalance: tests/integration/test_core_replicas.py). Such a partition goes back to its
        # beginning, which is what the group's offset reset (earliest) means.
        committed: Mapping[Any, int] = await super().seek_to_committed()
        app = cast(_App, self.app)
        sources = {tp: offset for tp, offset in committed.items() if tp.topic in app.source_topics}
        fresh = [tp for tp, offset in sources.items() if not offset]
        if fresh:
            consumer = self._ensure_consumer()
            await self.call_thread(consumer.seek_to_beginning, *fresh)
            beginnings = await self.call_thread(consumer.beginning_offsets, fresh)
            sources.update({tp: beginnings[tp] for tp in fresh})
        if app.on_source_seek is not None:
            app.on_source_seek(
                {TopicPartition(tp.topic, tp.partition): o for tp, o in sources.items()}
            )
        return committed


class _Consumer(faust_aiokafka.Consumer):
    def ack(self, message: Any) -> bool:
        # faust's streams skip a message fetched before the last rebalance (its generation is
        # not the consumer's any more) and ack it, which records its offset for the commit:
        # after the rebalance, the next commit of that partition could pass it although nobody
        # processed it (the member that takes the partition next starts after it). A message of
        # another generation is withheld instead; the seek to the committed offset reads it
        # again. Messages the agent processed are acked within their generation: a rebalance
        # waits for their acks before it assigns.
        if message.generation_id != self.app.consumer_generation_id:
            _withhold(message)
            return False
        acked: bool = super().ack(message)
        return acked

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class _FlowControl(FlowControlEvent):
    """faust's flow control, except that resuming clears the stream buffers only when the flow
    was suspended.

    faust clears every stream buffer when the flow resumes (``clear_on_resume``): what was
    buffered before a rebalance suspended it must not be processed after. But a recovery resumes
    the flow twice, once to read the changelogs and again once the source partitions are
    resumed and sought to their committed offsets, and source records are fetched and buffered
    in between; the second resume threw them away although the fetch position had moved past
    them and the seek was already done, so nothing read them again (seen as ``SkippedRecords``
    in ``tests/integration/test_core_replicas.py``; found with a log of every record fetched,
    buffered and processed). Those records are current: they are kept.
    """

    def resume(self) -> None:
        if self.is_active():
            return
        super().resume()


class _App(faust.App):
    """``faust.App`` with the consumer and the flow control above."""

    source_topics: frozenset[str] = frozenset()
    """The topics the agent reads (the consumer thread's seek needs them)."""
    bus_settings: BusSettings | None = None
    """The fetch settings the consumer thread gives its consumer (set before the app starts)."""
    on_source_seek: Callable[[Mapping[TopicPartition, int]], None] | None = None
    """Told, after the source partitions were sought, the offset each one reads next."""

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        return _FlowControl(loop=self.loop)


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


K = TypeVar("K")


class RecoveryStalls(Generic[K]):
    """Which changelog partitions a recovery has applied nothing of for ``after_s`` seconds
    although they are behind their highwater (see :meth:`FaustKeyedApp._watch`)."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._since: dict[K, tuple[int, float]] = {}
        """Per partition behind: the last offset applied, and since when it has not moved."""

    def check(self, now: float, behind: Mapping[K, int]) -> dict[K, int]:
        """``behind``: the partitions behind their highwater, with the last offset applied
        (-1: none). Returns the stalled ones, each with the offset to seek to (the next one);
        a partition is said stalled again only after ``after_s`` more seconds."""
        for tp in [tp for tp in self._since if tp not in behind]:
            del self._since[tp]
        stalled = {}
        for tp, offset in behind.items():
            before = self._since.get(tp)
            if before is None or before[0] != offset:
                self._since[tp] = (offset, now)
            elif now - before[1] >= self.after_s:
                stalled[tp] = max(offset + 1, 0)
                self._since[tp] = (offset, now)
        return stalled


@dataclass(frozen=True, slots=True)
class _Decoded(Generic[S]):
    """A key's state as decoded from its stored parts (which it keeps, to tell whether they
    changed since), and when it is next due (:meth:`KeyedProcessor.wakeup`)."""

    stored: tuple[bytes | None, ...]
    state: S
    wakeup: float | None


class FaustKeyedApp(Generic[S]):
    """A :class:`KeyedProcessor` run by faust-streaming (see the module docstring)."""

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
        last full scan): the next tick scans every stored key."""
        self._next_offset: dict[TopicPartition, int] = {}
        """Per source partition, the offset after the last record processed since the last
        rebalance (or the offset sought to, if that is further): the next one must not be
        beyond it."""
        self._generation = -1
        """The consumer group generation :attr:`_next_offset` belongs to."""

        self.app: Any = _App(
            app_id,
            broker=[f"kafka://{host.strip()}" for host in settings.bootstrap_servers.split(",")],
            broker_client_id=settings.client_id,
            broker_credentials=_credentials(settings),
            broker_session_timeout=settings.session_timeout_ms / 1000,
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
            self._changelogs_known()
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
        await self._await_changelogs()
        self._started = True

    async def _stop(self, *, failed: bool) -> None:
        # On stop faust waits until every record its streams took is acked ("Wait for
        # streams..."): after a failure the agent never acks its record (nor one it waits for
        # the timer's lock with), so faust would wait forever. Those records are withheld
        # instead: faust stops waiting for them and never commits them; the restart reads them.
        if failed:
            self._withhold_unacked()
        # Bounded in any case, by waiting for a task rather than cancelling the stop: faust's
        # wait for acks swallows CancelledError, so ``asyncio.timeout`` would never fire.
        stopping = asyncio.ensure_future(self.app.stop())
        done, _ = await asyncio.wait({stopping}, timeout=self._stop_timeout_s)
        if stopping not in done:
            # Whatever faust still waits for (a batch stuck in its flush), the service must
            # exit for its restart to happen: what faust waits for is withheld, so that the
            # stop can go on and end (its consumer leaving the group: the partitions move on at
            # once rather than after the session timeout).
            log.error(
                "%s: faust did not stop within %ss; withholding what it waits for",
                self.app_id,
                self._stop_timeout_s,
            )
            self._withhold_unacked()
            done, _ = await asyncio.wait({stopping}, timeout=self._stop_timeout_s)
        if stopping in done:
            stopping.result()
        else:
            log.error("%s: faust still did not stop; exiting without it", self.app_id)
            stopping.cancel()
        await self._end_consumer_thread()

    async def _end_consumer_thread(self) -> None:
        """Ends faust's consumer thread if faust's stop left it running (a stop that gave up, a
        start that hung in the thread): a service exits then and the thread with it, but in a
        process that goes on (an app run in-process) it would go on fetching for good, and
        aiokafka shuffles with the process's global ``random`` at every fetch."""
        consumer = self.app._consumer
        service: Any = getattr(consumer, "_thread", None) if consumer is not None else None
        worker = getattr(service, "_thread", None)
        if service is None or worker is None or not worker.is_alive():
            return
        log.error("%s: faust's consumer thread outlived its stop; ending it", self.app_id)
        with contextlib.suppress(RuntimeError):  # its loop already closed: it is ending
            service._stopped_set()
        await asyncio.to_thread(worker.join, self._stop_timeout_s)
        if worker.is_alive():
            log.error("%s: faust's consumer thread did not end", self.app_id)

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
            if self._started and not self._changelogs_known():
                await self._refresh_changelogs()
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
            await self._seek_stalled_recovery(stalls, now)

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

    async def _seek_stalled_recovery(self, stalls: RecoveryStalls[Any], now: float) -> None:
        """Seek a changelog partition whose recovery stalled to the next offset it needs."""
        recovery = self.app.tables.recovery
        behind = {}
        if recovery.in_recovery:
            offsets = recovery.active_offsets
            behind = {
                tp: offsets[tp]
                for tp, left in list(recovery.active_remaining().items())
                if left > 0 and offsets.get(tp) is not None
            }
        stalled = stalls.check(now, behind)
        if not stalled:
            return
        log.warning(
            "%s: the recovery of %s got nothing for %ss although behind the highwater; "
            "seeking them again",
            self.app_id,
            ", ".join(f"{tp.topic}[{tp.partition}] from {o}" for tp, o in stalled.items()),
            RECOVERY_STALL_S,
        )
        try:
            await self.app.consumer.seek_wait(stalled)
        except Exception as error:  # tried again after the next stall
            log.warning("%s: seeking the changelogs failed: %r", self.app_id, error)

    def _withhold_unacked(self) -> None:
        for message in list(self.app.consumer.unacked):
            _withhold(message)

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
        async with self._lock:
            try:
                now = self.processor.now()
                if self._rescan:
                    # Settled once the recovery is over: what it restored is decoded by now.
                    recovered = self.app.tables.recovery.completed.is_set()
                    self._rescan = self.app.in_recovery or not recovered
                    for key in self._keys():
                        self._entry(key)
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
                await self._store_batch(Batch(states=dict(changed)))
            except Exception as error:  # escalated: see the module docstring
                await self._fail(error)

    # --- state --------------------------------------------------------------------------------

    # The tables' in-memory stores are read and written directly (``_stores``): a ``Table.get``
    # also goes through faust's sensors, which cost more than the lookup, on every record and
    # for every key on every tick; a table write's changelog record goes through faust's
    # producer buffer (see ``_store_batch``).

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

    def _changelogs_known(self) -> bool:
        """Whether faust's producer has metadata for every changelog topic (see
        :meth:`_await_changelogs`)."""
        cluster = self._producer().client.cluster
        return all(cluster.partitions_for_topic(topic) for topic in self.changelog_topics())

    async def _await_changelogs(self) -> None:
        # The app is not ready before faust's producer has every changelog topic's metadata
        # (``_settled``). The changelog topics are created after that producer started, and its
        # refresh right after creating one can miss it; it can also go missing again on a later
        # refresh. (A state write itself waits for it: aiokafka's ``send`` does.)
        if self._changelogs_known():
            return
        producer = self._producer()
        for topic in self.changelog_topics():
            await producer.partitions_for(topic)  # raises after the request timeout

    async def _refresh_changelogs(self) -> None:
        """:meth:`_await_changelogs` for the watchdog: the metadata faust's producer has can
        lose a changelog topic after the start (seen in ``tests/e2e/test_sigkill.py``: ready
        never again, nothing to write that would fetch it again); bounded, failures logged."""
        try:
            async with asyncio.timeout(self.settings.request_timeout_ms / 1000):
                await self._await_changelogs()
        except Exception as error:
            log.warning("%s: the changelogs' metadata is missing: %r", self.app_id, error)

    def _producer(self) -> Any:
        """faust's aiokafka producer, which writes the changelogs (faust keeps it private)."""
        producer = self.app.producer._producer
        if producer is None:
            raise RuntimeError(f"{self.app_id}: faust's producer is not started")
        return producer

    async def _store_batch(self, batch: Batch[S]) -> None:
        """Write the batch's changed states to the tables' stores and their changelog records
        (one per changed part) with faust's producer; called once its outputs are
        acknowledged, done once the broker has the records.

        What ``Table.__setitem__`` does, without the path its changelog record takes in faust:
        ``Table.send_changelog`` → ``Topic.send_soon`` → a ``FutureMessage`` in the
        ``ProducerBuffer``, whose own task hands it to ``Topic.publish_message`` and then to
        aiokafka, with faust's sensors on the way (``faust/tables/base.py`` line 266,
        ``faust/topics.py`` lines 202 and 390, ``faust/transport/producer.py`` line 119). That
        path took half of what the transport costs a decision (``bench_aggregator.py
        --processor floor``: 850–935 decisions/s through it, 1,880–2,113 with this). The records
        are the same: a key's value (``None``, a tombstone, for a removed key) in the part's
        changelog topic, partitioned by the producer's partitioner from the key as the tables'
        ``use_partitioner`` has faust do, so recovery, standbys and compaction read them as
        faust's own."""
        if not batch.states:
            return
        stores = dict(zip(self.processor.parts, self._stores(), strict=True))
        topics = dict(zip(self.processor.parts, self.changelog_topics(), strict=True))
        send = self._producer().send
        sent: list[asyncio.Future[Any]] = []
        for key, new in batch.states.items():
            if key is None:
                continue  # a record without a key has no state to keep
            replaced = key in batch.replaced
            if new is DROP or replaced:
                for part, store in stores.items():
                    if key in store:
                        del store[key]
                        # A tombstone: compaction forgets the key.
                        sent.append(await send(topics[part], None, key=key))
                self._forget(key)
                if new is DROP:
                    continue
            cached = self._decoded.get(key)
            old = cached.state if cached is not None else None
            for part, value in self.processor.dump(old, new).items():
                stores[part][key] = value
                sent.append(await send(topics[part], value, key=key))
            stored = tuple(store.get(key) for store in stores.values())
            self._remember(key, _Decoded(stored, new, self.processor.wakeup(new)))
        # Done once the broker has the changelog records (see the module docstring); a failed
        # delivery raises, and the batch is withheld like any failure's.
        if sent:
            await asyncio.gather(*sent)

    async def _fail(self, error: BaseException, messages: Sequence[Any] = ()) -> None:
        log.error("%s stops: %r", self.app_id, error, exc_info=error)
        for message in messages:
            _withhold(message)
        if self._failure is not None and not self._failure.done():
            self._failure.set_result(error)
        # Never return to faust, which would go on with the next batch: wait to be stopped.
        await asyncio.Event().wait()


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


def _withhold(message: Any) -> None:
    """Keep faust from ever committing ``message``, and from waiting for its ack (see
    :meth:`FaustKeyedApp._stop`)."""
    # faust's ``Consumer.ack`` records an offset for committing only when the message is not
    # ``acked`` yet, and its wait for unacked messages forgets the ``acked`` ones: set here, the
    # flag ends the wait and makes any later ack (the stream acks its event when the agent is
    # cancelled) a no-op. Offsets are committed up to the first one not recorded.
    message.acked = True
