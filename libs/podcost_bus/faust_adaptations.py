"""Where podcost departs from faust-streaming: one class or function per faust defect it repairs.

``podcost_bus.faust_app`` runs the aggregator's keyed state on faust; what faust does there that
podcost cannot accept is repaired here, each repair with what faust does and where (file and line
of the installed faust-streaming, aiokafka and mode-streaming, versions in :data:`READ_AGAINST`),
what podcost needs instead, and the tests that prove it. :data:`ADAPTATIONS` lists them in one
place: after a faust upgrade, ``tests/unit/test_faust_adaptations.py`` fails until every cited
place has been read again, and its "plain faust still ..." tests fail when an upgrade fixed a
defect, which says that the repair may go.

The repairs are wired into faust by :class:`App` (its transport, consumer, consumer thread and
flow control); the others are called by ``FaustKeyedApp``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, NoReturn, TypeVar, cast

import faust
import faust.tables as faust_tables
from faust.stores import memory as faust_memory
from faust.tables import recovery as faust_recovery
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.utils.tracing import finish_span
from mode import Service
from mode.threads import WorkerThread
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

from podcost_bus.protocol import TopicPartition
from podcost_bus.settings import BusSettings

log = logging.getLogger(__name__)

#: How long the broker may hold a fetch of the faust consumer that has nothing new, unless the
#: bus settings say (see :class:`FetchSettings`).
FETCH_MAX_WAIT_MS = 100


# --- the registry ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Upstream:
    """A line of an installed package's source that an adaptation answers."""

    package: str
    """The import name of the package: ``faust``, ``aiokafka`` or ``mode``."""
    path: str
    """The file, relative to the package's directory."""
    line: int
    """The line number in the version of :data:`READ_AGAINST`."""
    text: str
    """What that line holds (a part of it), so that an upgrade that moves it is noticed."""


@dataclass(frozen=True, slots=True)
class Adaptation:
    """One faust defect and podcost's repair of it."""

    defect: str
    """What faust does, in a line."""
    repair: tuple[str, ...]
    """The dotted names of what holds the repair (the first one's docstring tells it whole)."""
    upstream: tuple[Upstream, ...]
    """Where faust (or the aiokafka or mode it runs on) does it."""
    proofs: tuple[str, ...]
    """The tests that prove the repair (``path::name``); a "plain faust" one fails once an
    upgrade fixed the defect."""


#: The distributions the citations were read against (``importlib.metadata`` names).
READ_AGAINST = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0", "mode-streaming": "0.7.1"}

_UNIT = "tests/unit/test_faust_adaptations.py"
_APP = "tests/integration/test_faust_app.py"
_REPLICAS = "tests/integration/test_core_replicas.py"
_AIOKAFKA = "transport/drivers/aiokafka.py"
_M = "podcost_bus.faust_adaptations"
_REPLICAS_TEST = (
    f"{_REPLICAS}::test_replicas_share_the_partitions_and_rebalances_lose_no_decision_and_change_"
    "no_cost"
)

ADAPTATIONS: tuple[Adaptation, ...] = (
    Adaptation(
        "mode's worker thread, which runs faust's consumer, is not a daemon",
        (f"{_M}.DaemonWorker",),
        (Upstream("mode", "threads.py", 57, "self.daemon = False"),),
        (
            f"{_UNIT}::test_plain_mode_runs_the_consumer_in_a_thread_that_keeps_a_process_alive",
            f"{_APP}::test_an_app_that_does_not_start_within_its_bound_exits_stalled",
        ),
    ),
    Adaptation(
        "faust's consumer waits up to 1.5 s per fetch and ignores the fetch minimum",
        (f"{_M}.FetchSettings",),
        (
            Upstream("faust", _AIOKAFKA, 568, "def _create_worker_consumer"),
            Upstream("faust", _AIOKAFKA, 615, "fetch_max_wait_ms=1500"),
        ),
        (f"{_UNIT}::test_plain_faust_fetches_with_a_wait_of_one_and_a_half_seconds",),
    ),
    Adaptation(
        "the seek to the committed offsets leaves a partition nobody committed where it was",
        (f"{_M}.SeekUncommittedToBeginning", f"{_M}.seek_uncommitted_to_beginning"),
        (
            Upstream("faust", "transport/consumer.py", 568, "self.seek_to_committed()"),
            Upstream("faust", _AIOKAFKA, 786, "async def seek_to_committed"),
            Upstream("aiokafka", "consumer/consumer.py", 901, "if offset and offset > 0:"),
        ),
        (
            "tests/integration/test_faust_repairs_on_the_broker.py::"
            "test_plain_aiokafka_s_seek_to_committed_leaves_an_uncommitted_partition_past_its_records",
            _REPLICAS_TEST,
        ),
    ),
    Adaptation(
        "faust's streams ack a message of an earlier consumer-group generation they skip",
        (f"{_M}.AckWithinGeneration",),
        (
            Upstream("faust", "streams.py", 1289, "message.generation_id !="),
            Upstream("faust", "streams.py", 1344, "last_stream_to_ack = event.ack()"),
            Upstream("faust", "transport/consumer.py", 825, "def ack"),
        ),
        (
            f"{_UNIT}::test_plain_faust_records_for_its_commit_a_message_of_an_earlier_generation",
            _REPLICAS_TEST,
        ),
    ),
    Adaptation(
        "every resume of faust's flow control clears the stream buffers, a recovery's second too",
        (f"{_M}.ResumeKeepsCurrentBuffers",),
        (
            Upstream("mode", "utils/queues.py", 97, "def resume"),
            Upstream("mode", "utils/queues.py", 101, "self.clear()"),
            Upstream("faust", "channels.py", 145, "clear_on_resume=True"),
            Upstream("faust", "tables/recovery.py", 451, "flow_control.resume"),
            Upstream("faust", "tables/recovery.py", 328, "flow_control.resume()"),
        ),
        (
            f"{_UNIT}::test_plain_faust_clears_the_stream_buffers_on_every_resume",
            "tests/unit/test_faust_transport.py::"
            "test_resuming_a_flow_that_was_not_suspended_keeps_what_the_streams_buffered",
            _REPLICAS_TEST,
        ),
    ),
    Adaptation(
        "faust's producer can lack a changelog topic's metadata, which a table write needs",
        (f"{_M}.ChangelogMetadata",),
        (
            Upstream("faust", _AIOKAFKA, 1374, "force_metadata_update()  # Fixes #499"),
            Upstream("aiokafka", "client.py", 257, "topics = self._topics"),
            Upstream("faust", "tables/base.py", 287, "eager_partitioning=True"),
            Upstream("aiokafka", "producer/producer.py", 422, "partitions_for_topic(topic))"),
        ),
        (
            f"{_APP}::test_a_table_write_waits_until_faust_s_producer_knows_the_changelog_topic",
            f"{_APP}::"
            "test_an_idle_app_whose_producer_lost_the_changelog_metadata_gets_it_back_by_itself",
        ),
    ),
    Adaptation(
        "a commit can pass records whose table writes faust's producer buffer still holds",
        (f"{_M}.ChangelogWrites", "podcost_bus.faust_app.FaustKeyedApp._store_batch"),
        (
            Upstream("faust", "tables/base.py", 279, "self.changelog_topic.send_soon("),
            Upstream("faust", "transport/producer.py", 89, "timeout=0.1"),
            Upstream("faust", "transport/producer.py", 71, "async def on_stop"),
            Upstream("faust", "transport/consumer.py", 1073, "await self.app.producer.flush()"),
        ),
        (
            f"{_UNIT}::test_plain_faust_s_producer_flush_returns_with_messages_still_buffered",
            f"{_UNIT}::test_changelog_writes_are_done_once_every_record_is_delivered",
            f"{_APP}::test_a_commit_never_passes_records_whose_states_faust_has_not_sent_yet",
        ),
    ),
    Adaptation(
        "faust acks the message an agent raised on, and restarts the agent",
        (f"{_M}.hold_failed", "podcost_bus.faust_app.FaustKeyedApp._fail"),
        (
            Upstream("faust", "agents/agent.py", 707, "except Exception as exc:"),
            Upstream("faust", "agents/agent.py", 713, "await aref.crash(exc)"),
            Upstream("faust", "streams.py", 1344, "last_stream_to_ack = event.ack()"),
        ),
        (f"{_APP}::test_a_failing_processor_stops_the_app_promptly_and_its_record_is_read_again",),
    ),
    Adaptation(
        "faust's stop waits for every unacked message without bound, and cannot be cancelled",
        (
            f"{_M}.stop_bounded",
            f"{_M}.withhold",
            f"{_M}.withhold_unacked",
            f"{_M}.end_consumer_thread",
        ),
        (
            Upstream("faust", "transport/consumer.py", 904, "stream_wait_empty"),
            Upstream("faust", "transport/consumer.py", 867, "async def wait_empty"),
            Upstream("faust", "transport/consumer.py", 861, "asyncio.CancelledError"),
            Upstream("mode", "threads.py", 227, "def _stopped_set"),
        ),
        (
            f"{_UNIT}::test_plain_faust_s_wait_for_acks_swallows_its_cancellation",
            f"{_APP}::test_a_stop_faust_never_ends_still_ends_its_consumer_thread",
            f"{_UNIT}::test_a_withheld_message_is_never_recorded_for_a_commit_nor_waited_for",
            f"{_APP}::test_a_stop_in_the_middle_of_a_batch_commits_and_stores_nothing_of_it_and_"
            "loses_nothing",
            f"{_APP}::test_an_app_that_stops_making_progress_turns_not_ready_then_exits_stalled",
        ),
    ),
    Adaptation(
        "a recovery can get none of a changelog partition's records, and waits for them forever",
        (f"{_M}.seek_stalled_recovery", f"{_M}.RecoveryStalls"),
        (Upstream("faust", "tables/recovery.py", 1093, "No event received for active tp"),),
        (
            "tests/unit/test_faust_transport.py::"
            "test_a_changelog_partition_the_recovery_applies_nothing_of_for_a_while_is_stalled",
            f"{_APP}::test_a_recovery_that_gets_none_of_its_changelog_records_seeks_them_again_"
            "and_ends",
        ),
    ),
    Adaptation(
        "the memory store persists no offset and drops its standby records: standbys buy nothing",
        (f"{_M}.Store", f"{_M}.Table"),
        (
            Upstream("faust", "stores/memory.py", 72, "def persisted_offset"),
            Upstream("faust", "stores/memory.py", 60, "partitions = {partition for _, partition"),
            Upstream("faust", "tables/recovery.py", 230, "persisted_offset = table.persisted_off"),
            Upstream("faust", "tables/recovery.py", 740, "destination[tp] = max(last_value,"),
        ),
        (
            f"{_UNIT}::test_plain_faust_s_memory_store_persists_no_offset_and_drops_its_standby_"
            "records",
            f"{_APP}::test_a_recovery_restores_every_value_and_removal_and_says_how_far_it_applied",
            "tests/integration/test_aggregator_standby.py::test_after_a_crash_the_survivor_"
            "decides_as_the_core_does_reading_what_its_standby_lacked",
        ),
    ),
    Adaptation(
        "the recovery takes changelog records one at a time, with a task and a timer each",
        (f"{_M}.Recovery", f"{_M}.TableManager"),
        (
            Upstream("faust", "tables/recovery.py", 835, "changelog_queue.get(), timeout=5.0"),
            Upstream("faust", "tables/recovery.py", 850, 'logger.debug(f"Recovery message'),
            Upstream("faust", "tables/recovery.py", 904, "await _maybe_signal_recovery_end()"),
            Upstream("faust", "tables/recovery.py", 927, "return any(v > 0 for v in self"),
            Upstream("faust", "tables/recovery.py", 881, "# active nor standby reaches here"),
        ),
        (f"{_APP}::test_a_recovery_restores_every_value_and_removal_and_says_how_far_it_applied",),
    ),
)


# --- the consumer thread ----------------------------------------------------------------------


class DaemonWorker(WorkerThread):
    """mode's worker thread, but a daemon.

    faust runs its aiokafka consumer in a thread of mode's ``WorkerThread``, which is not a
    daemon (``mode/threads.py`` line 57). When faust does not stop (``FaustKeyedApp`` gives up on
    it, say in a start hung in its consumer thread), the process must still exit for its
    supervisor to restart it, and the interpreter waits for every thread that is not a daemon.
    Proof: ``test_plain_mode_runs_the_consumer_in_a_thread_that_keeps_a_process_alive`` (unit)
    and ``test_an_app_that_does_not_start_within_its_bound_exits_stalled`` (integration).
    """

    def __init__(self, service: Any, **kwargs: Any) -> None:
        super().__init__(service, **kwargs)
        self.daemon = True


class FetchSettings(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's consumer thread, with the bus settings' fetch wait and minimum.

    faust's aiokafka driver hard-codes ``fetch_max_wait_ms=1500`` and takes no fetch minimum
    (``faust/transport/drivers/aiokafka.py`` lines 568 and 615). aiokafka keeps one fetch in
    flight per broker, so a record for a partition drained after that fetch was sent waits for
    it to come back, up to 1.5 s: measured on one broker at 20 snapshots/s, snapshot-to-costs p50
    0.3 to 2 s with it, 50 to 80 ms with 100 ms. podcost gives the consumer the bus settings'
    wait (:data:`FETCH_MAX_WAIT_MS` unless they name one) and minimum, as every podcost consumer
    has them. Proof: ``test_plain_faust_fetches_with_a_wait_of_one_and_a_half_seconds`` (unit).
    """

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start().
        for name in ("_fetch_max_wait_ms", "_fetch_min_bytes"):
            if not hasattr(consumer, name):
                raise RuntimeError(f"this aiokafka has no {name}: revisit FetchSettings")
        settings = cast(App, self.app).bus_settings
        if settings is None:
            raise RuntimeError("the faust app's bus settings were not set before it started")
        wait = settings.fetch_max_wait_ms
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS if wait is None else wait
        consumer._fetch_min_bytes = settings.fetch_min_bytes
        return consumer


TP = TypeVar("TP")


async def seek_uncommitted_to_beginning(
    consumer: Any, committed: Mapping[TP, int]
) -> dict[TP, int]:
    """Seek those of ``committed``'s partitions that have no committed offset (none or 0) to
    their beginning; returns every partition's next offset (run in the consumer's thread)."""
    positions = dict(committed)
    fresh = [tp for tp, offset in committed.items() if not offset]
    if fresh:
        await consumer.seek_to_beginning(*fresh)
        beginnings: Mapping[TP, int] = await consumer.beginning_offsets(fresh)
        positions.update({tp: beginnings[tp] for tp in fresh})
    return positions


class SeekUncommittedToBeginning(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's seek to the committed offsets, which seeks a partition nobody committed to its
    beginning too.

    faust drops fetched records it does not deliver around a rebalance (a generation change
    mid-batch, a partition not active yet) although the fetch position moved past them, and
    relies on the seek to the committed offsets to read them again (``perform_seek``,
    ``faust/transport/consumer.py`` line 568; ``faust/transport/drivers/aiokafka.py`` line 786).
    aiokafka's seek skips a partition whose committed offset is none or 0
    (``aiokafka/consumer/consumer.py`` line 901), so a source partition nobody had committed yet
    kept the moved position and lost those records (seen after a consumer-group rebalance in
    ``tests/integration/test_core_replicas.py``). podcost seeks such a source partition to its
    beginning, which is what the group's offset reset (earliest) means, with
    :func:`seek_uncommitted_to_beginning`, and tells ``App.on_source_seek`` where each source
    partition reads next. Proof:
    ``test_plain_aiokafka_s_seek_to_committed_leaves_an_uncommitted_partition_past_its_records``
    (integration, the aiokafka consumer alone) and ``test_core_replicas.py``.
    """

    async def seek_to_committed(self) -> Mapping[Any, int]:
        committed: Mapping[Any, int] = await super().seek_to_committed()
        app = cast(App, self.app)
        sources = {tp: offset for tp, offset in committed.items() if tp.topic in app.source_topics}
        positions = await self.call_thread(
            seek_uncommitted_to_beginning, self._ensure_consumer(), sources
        )
        if app.on_source_seek is not None:
            app.on_source_seek(
                {TopicPartition(tp.topic, tp.partition): o for tp, o in positions.items()}
            )
        return committed


class ConsumerThread(FetchSettings, SeekUncommittedToBeginning):
    """faust's consumer thread with the repairs above, in a daemon thread."""

    Worker = DaemonWorker


# --- the consumer -----------------------------------------------------------------------------


def withhold(message: Any) -> None:
    """Keep faust from ever committing ``message``, and from waiting for its ack.

    faust's ``Consumer.ack`` records an offset for committing only when the message is not
    ``acked`` yet, and its wait for unacked messages forgets the ``acked`` ones
    (``faust/transport/consumer.py`` lines 825 and 867): set here, the flag ends the wait and
    makes any later ack (the stream acks its event when the agent is cancelled) a no-op. Offsets
    are committed up to the first one not recorded, so the message is read again after a
    restart or a seek. Proof:
    ``test_a_withheld_message_is_never_recorded_for_a_commit_nor_waited_for`` (unit)."""
    message.acked = True


def withhold_unacked(consumer: Any) -> None:
    """:func:`withhold` every message faust's ``consumer`` waits for an ack of."""
    for message in list(consumer.unacked):
        withhold(message)


class AckWithinGeneration(faust_aiokafka.Consumer):
    """faust's consumer, whose ``ack`` withholds a message of an earlier generation.

    faust's streams skip a message fetched before the last rebalance (its generation is not the
    consumer's any more) and ack it (``faust/streams.py`` lines 1289 and 1344), which records its
    offset for the commit (``faust/transport/consumer.py`` line 825): after the rebalance, the
    next commit of that partition could pass it although nobody processed it, and the member that
    takes the partition next starts after it (the likely cause of a decision lost once in
    ``tests/integration/test_core_replicas.py``). podcost withholds such a message instead
    (:func:`withhold`); the seek to the committed offset reads it again. Messages the agent
    processed are acked within their generation: a rebalance waits for their acks before it
    assigns. Proof: ``test_plain_faust_records_for_its_commit_a_message_of_an_earlier_generation``
    (unit) and ``test_core_replicas.py``.
    """

    def ack(self, message: Any) -> bool:
        if message.generation_id != self.app.consumer_generation_id:
            withhold(message)
            return False
        acked: bool = super().ack(message)
        return acked


class Consumer(AckWithinGeneration):
    """faust's aiokafka consumer with the repairs above, and :class:`ConsumerThread`'s."""

    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    """faust's aiokafka transport, with :class:`Consumer`."""

    Consumer = Consumer


# --- flow control -----------------------------------------------------------------------------


class ResumeKeepsCurrentBuffers(FlowControlEvent):
    """faust's flow control, except that resuming clears the stream buffers only when the flow
    was suspended.

    faust clears every stream buffer whenever the flow resumes (mode's ``FlowControlEvent.resume``
    clears the queues made with ``clear_on_resume``, ``mode/utils/queues.py`` lines 97 and 101;
    faust's channels are, ``faust/channels.py`` line 145): what was buffered before a rebalance
    suspended it must not be processed after. But a recovery resumes the flow twice, once to
    read the changelogs and again once the source partitions are resumed and sought to their
    committed offsets (``faust/tables/recovery.py`` lines 451 and 328), and source records are
    fetched and buffered in between; the second resume threw them away although the fetch
    position had moved past them and the seek was done, so nothing read them again (seen as
    ``SkippedRecords`` in ``tests/integration/test_core_replicas.py``). Those records are current:
    podcost keeps them. Proof: ``test_plain_faust_clears_the_stream_buffers_on_every_resume``
    next to ``test_resuming_a_flow_that_was_not_suspended_keeps_what_the_streams_buffered``
    (unit), and ``test_core_replicas.py``.
    """

    def resume(self) -> None:
        if self.is_active():
            return
        super().resume()


# --- the app ----------------------------------------------------------------------------------


class App(faust.App):
    """``faust.App`` with :class:`Transport`, :class:`ResumeKeepsCurrentBuffers` and the tables'
    :class:`TableManager` and :class:`Table`, and what they need to know of podcost's app."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("TableManager", TableManager)
        kwargs.setdefault("Table", Table)
        super().__init__(*args, **kwargs)

    source_topics: frozenset[str] = frozenset()
    """The topics the agent reads (the consumer thread's seek needs them)."""
    bus_settings: BusSettings | None = None
    """The fetch settings the consumer thread gives its consumer (set before the app starts)."""
    on_source_seek: Callable[[Mapping[TopicPartition, int]], None] | None = None
    """Told, after the source partitions were sought, the offset each one reads next."""
    on_recovery_read: Callable[[str, int], None] | None = None
    """Told, as :class:`Recovery` takes changelog records into the tables, how many it took of
    partitions of each role (:data:`ACTIVE`, :data:`STANDBY`): what a takeover read."""

    def _new_transport(self) -> Any:
        return Transport(self.conf.broker_consumer, self)

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        return ResumeKeepsCurrentBuffers(loop=self.loop)


# --- the tables' recovery ---------------------------------------------------------------------


#: The most changelog records :class:`Recovery` takes off faust's changelog queue at once.
RECOVERY_DRAIN_MAX = 2000

#: The roles of a changelog partition a recovery reads (``App.on_recovery_read``): one whose
#: states this member decides for (read before it decides), or a standby copy of another's.
ACTIVE: Final = "active"
STANDBY: Final = "standby"


class Store(faust_memory.Store[Any, Any]):
    """faust's memory store, which keeps its standby partitions' records and says up to which
    offset it applied each changelog partition, and applies a changelog batch in one pass.

    faust's memory store says it persisted no offset (``persisted_offset`` returns None,
    ``faust/stores/memory.py`` line 72), so the recovery of a partition starts from the
    changelog's beginning (``faust/tables/recovery.py`` line 230 takes no offset from it, and
    line 740 then starts at the earliest one), and once a recovery is complete it drops every
    key of a partition that is not active (``faust/stores/memory.py`` line 60), a standby's too.
    With standby replicas, the member that took over a dead one's partitions thus read their
    whole changelogs again although its standby had followed them: standbys bought nothing
    (``tests/bench/bench_failover.py``). This store remembers, per changelog partition, the
    offset of the last record it applied (:meth:`persisted_offset`, after which faust's recovery
    reads), and keeps the records of its active and standby partitions
    (:meth:`on_recovery_completed` drops the others' and forgets their offsets), so a standby
    that becomes active reads only what it had not applied yet. Reading a changelog again from
    an earlier offset is harmless (each record sets its key's value again, in order), and this
    store never says an offset it has not applied. The app's own writes (``ChangelogWrites``)
    are counted too once the broker has them (:meth:`written`): the records it wrote itself in a
    partition it kept are not read again after a rebalance, as faust reads them from the offset
    its last recovery ended at.
    :meth:`apply_changelog_batch` applies the records in their order (a tombstone removes its
    key) in one pass, without faust's generator and second pass over the removed keys. Proof:
    ``test_plain_faust_s_memory_store_persists_no_offset_and_drops_its_standby_records`` (unit),
    ``test_a_recovery_restores_every_value_and_removal_and_says_how_far_it_applied``
    (integration), and ``test_aggregator_standby.py`` (two aggregator processes, one SIGKILLed:
    with a standby the survivor's takeover reads none of the dead one's changelog, without one
    all of it).
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self._applied: dict[Any, int] = {}
        """Per changelog partition, the offset of the last record applied."""

    def apply_changelog_batch(
        self,
        batch: Iterable[Any],
        to_key: Callable[[Any], Any],
        to_value: Callable[[Any], Any],
    ) -> None:
        data = self.data
        partitions = self._key_partition
        applied = self._applied
        for event in batch:
            message = event.message
            key = to_key(event.key)
            if message.value is None:  # a tombstone
                data.pop(key, None)
                partitions.pop(key, None)
            else:
                data[key] = to_value(event.value)
                partitions[key] = message.partition
            tp = message.tp
            if message.offset > applied.get(tp, -1):
                applied[tp] = message.offset

    def persisted_offset(self, tp: Any) -> int | None:
        return self._applied.get(tp)

    def written(self, tp: tuple[str, int], offset: int) -> None:
        """The app put a record's value in this store itself and the broker has the record at
        ``offset`` of changelog partition ``tp``: everything before it in that partition is in
        the store too (the partition is the app's own, read to its end before it wrote)."""
        if offset > self._applied.get(tp, -1):
            self._applied[faust.types.TP(*tp)] = offset

    async def on_recovery_completed(self, active_tps: set[Any], standby_tps: set[Any]) -> None:
        kept = {tp.partition for tp in active_tps | standby_tps}
        for tp in [tp for tp in self._applied if tp.partition not in kept]:
            del self._applied[tp]
        gone = [key for key, partition in self._key_partition.items() if partition not in kept]
        for key in gone:
            self.data.pop(key, None)
            del self._key_partition[key]


class Table(faust.Table[Any, Any]):
    """faust's table, with :class:`Store` for ``memory://``."""

    def _new_store_by_url(self, url: Any) -> Any:
        if not str(url).startswith("memory:"):
            return super()._new_store_by_url(url)
        return Store(
            url,
            self.app,
            self,
            table_name=self.name,
            key_type=self.key_type,
            key_serializer=self.key_serializer,
            value_serializer=self.value_serializer,
            value_type=self.value_type,
            loop=self.loop,
            options=self.options,
        )


class Recovery(faust_recovery.Recovery):
    """faust's recovery, which applies the changelog records it finds queued in bulk.

    faust's recovery takes the changelog records off its queue one at a time
    (``_slurp_changelogs``), each with an ``asyncio.wait_for`` (a task and a timer per record,
    ``faust/tables/recovery.py`` line 835), two debug lines formatted whether or not they are
    logged (line 850), and a check whether the recovery is done (line 904) that sums the
    remaining records of every partition (line 927); at 50,000 states of 25 pods that cost per
    record was most of what the survivor's event loop did while it took over a dead member's
    partitions (``tests/bench/bench_failover.py``). This recovery waits for a record only when
    none is queued, then takes what is queued (up to :data:`RECOVERY_DRAIN_MAX`), buffers each
    record as faust does (an offset applied once, the table's buffer applied when full), and
    checks once per drain whether the recovery is done and the standbys are ready. A record of
    a changelog partition that is neither active nor standby here (left from before a
    rebalance) is skipped, where faust applies it to the previous record's table (line 881).
    It tells ``App.on_recovery_read`` how many records it took, per role of their partition (the
    aggregator's ``podcost_aggregator_recovery_records_total``). Proof:
    ``test_a_recovery_restores_every_value_and_removal_and_says_how_far_it_applied``
    (integration) and ``tests/bench/bench_failover.py``.
    """

    @Service.task
    async def _slurp_changelogs(self) -> None:
        queue = self.tables.changelog_queue
        timeouts = 0
        while not self.should_stop:
            try:
                self.signal_recovery_end.clear()
                if queue.empty():
                    try:
                        first = await asyncio.wait_for(queue.get(), timeout=5.0)
                    except TimeoutError:
                        timeouts += 1
                        if self.should_stop:
                            return
                        await self._end_if_done(timeouts)
                        continue
                else:
                    first = queue.get_nowait()
                timeouts = 0
                events = [first]
                while len(events) < RECOVERY_DRAIN_MAX and not queue.empty():
                    events.append(queue.get_nowait())
                await self._apply(events)
                await self._end_if_done(0)
                if not (self._standbys_span is None and self.tables.standbys_ready) and not (
                    self.standby_remaining_total()
                ):
                    if self._standbys_span:
                        finish_span(self._standbys_span)
                        self._standbys_span = None
                    self.tables.on_standbys_ready()
            except Exception as error:  # as faust's: a recovery goes on
                log.warning("error in the recovery: %r", error)

    async def _apply(self, events: list[Any]) -> None:
        """Buffer each record not applied yet in its table's buffer, applied when full (what
        faust does per record)."""
        now = time.monotonic()
        active_tps, standby_tps = self.active_tps, self.standby_tps
        buffers, sizes = self.buffers, self.buffer_sizes
        taken = {ACTIVE: 0, STANDBY: 0}
        for event in events:
            message = event.message
            tp = message.tp
            table: Any = self.tp_to_table.get(tp)
            if tp in active_tps:
                offsets, role = self.active_offsets, ACTIVE
                self._active_events_received_at[tp] = now
                size = sizes.get(tp) or sizes.setdefault(tp, table.recovery_buffer_size)
            elif tp in standby_tps:
                offsets, role = self.standby_offsets, STANDBY
                self._standby_events_received_at[tp] = now
                size = sizes.get(tp) or sizes.setdefault(tp, table.standby_buffer_size)
            else:
                log.debug("recovery: skipped a record of %s, not assigned here", tp)
                continue
            seen = offsets.get(tp)
            if seen is not None and message.offset <= seen:
                continue
            offsets[tp] = message.offset
            taken[role] += 1
            buffer = buffers[table]
            buffer.append(event)
            if table._on_changelog_event is not None:
                await table.on_changelog_event(event)
            if len(buffer) >= size:
                table.apply_changelog_batch(buffer)
                buffer.clear()
                self._last_flush_at = now
        if self.in_recovery:
            self._last_active_event_processed_at = time.monotonic()
        told = cast(App, self.app).on_recovery_read
        if told is not None:
            for role, count in taken.items():
                if count:
                    told(role, count)

    async def _end_if_done(self, timeouts: int) -> None:
        """faust's end of a recovery: once every active partition is at its highwater, apply
        what the buffers hold and signal the end (after a second timeout in a row, within a
        transaction, look for aborted transactions first, as faust does)."""
        if timeouts > 1 and self.app.in_transaction:
            await self._skip_aborted()
        if self.in_recovery and not self.need_recovery():
            self.flush_buffers()
            self._set_recovery_ended()
            if self._actives_span is not None:
                self._actives_span.set_tag("Actives-Ready", True)
            self.signal_recovery_end.set()

    async def _skip_aborted(self) -> None:
        offsets = self.active_offsets
        for tp, highwater in self.active_highwaters.items():
            if highwater is not None and offsets[tp] is not None and offsets[tp] < highwater:
                position = await self.app.consumer.position(tp)
                if position is not None and position >= highwater:
                    offsets[tp] = highwater


class TableManager(faust_tables.TableManager):
    """faust's table manager, with :class:`Recovery`."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = Recovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return cast(Recovery, self._recovery)


# --- the tables' changelogs -------------------------------------------------------------------


class ChangelogMetadata:
    """Whether faust's producer knows every changelog topic, and its metadata fetched when not.

    faust refreshes its producer's metadata once, right after it created a topic
    (``faust/transport/drivers/aiokafka.py`` line 1374), and that refresh can miss a topic just
    created; aiokafka's client then refreshes only the topics it was given or has sent to
    (``aiokafka/client.py`` line 257), so a changelog topic not written yet can also drop out of
    the metadata later. A table write partitions eagerly from that metadata
    (``faust/tables/base.py`` line 287; ``aiokafka/producer/producer.py`` line 422, which raises
    when the topic is unknown), and nothing in faust fetches it again. podcost's app is not ready
    before its producer knows every changelog topic (:meth:`wait`), and its watchdog fetches the
    metadata again whenever one is missing (:meth:`refresh`; seen in
    ``tests/e2e/test_sigkill.py``: never ready again, and idle, so nothing written that would
    fetch it). Proof: ``test_a_table_write_waits_until_faust_s_producer_knows_the_changelog_topic``
    and ``test_an_idle_app_whose_producer_lost_the_changelog_metadata_gets_it_back_by_itself``
    (integration).
    """

    def __init__(
        self, name: str, producer: Callable[[], Any], topics: Callable[[], Sequence[str]]
    ) -> None:
        self._name = name
        self._producer = producer
        """faust's aiokafka producer (started with the app: asked each time)."""
        self._topics = topics

    def known(self) -> bool:
        """Whether faust's producer has metadata for every changelog topic."""
        cluster = self._producer().client.cluster
        return all(cluster.partitions_for_topic(topic) for topic in self._topics())

    async def wait(self) -> None:
        """Until faust's producer knows every changelog topic (raises after the request
        timeout)."""
        if self.known():
            return
        producer = self._producer()
        for topic in self._topics():
            await producer.partitions_for(topic)

    async def refresh(self, timeout_s: float) -> None:
        """:meth:`wait`, bounded by ``timeout_s``, a failure logged."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.wait()
        except Exception as error:
            log.warning("%s: the changelogs' metadata is missing: %r", self._name, error)


class ChangelogWrites:
    """Table writes' changelog records sent with faust's aiokafka producer, and done once the
    broker has them all.

    A table write's changelog record goes through faust's producer buffer
    (``Table.send_changelog``, ``faust/tables/base.py`` line 279), whose flush before a commit
    (``faust/transport/consumer.py`` line 1073) gives up once 0.1 s pass without a message sent
    (``faust/transport/producer.py`` line 89), and whose stop drops what it still holds (line
    71): on a busy machine a commit could pass source records whose states were still in that
    buffer, and a stop then lost them, so the state another member recovered lacked answers
    whose records nobody would read again. podcost sends the records with the producer itself
    (:meth:`send`, what the table would send: a key's value, ``None`` for a removed key, in the
    part's changelog topic, partitioned by the producer's partitioner) and its batch is done once
    they are delivered (:meth:`delivered`), before faust may ack its records; the path through
    faust's buffer also cost as much as the rest of the transport. Used by
    ``FaustKeyedApp._store_batch``. Proof:
    ``test_plain_faust_s_producer_flush_returns_with_messages_still_buffered`` next to
    ``test_changelog_writes_are_done_once_every_record_is_delivered`` (unit), and
    ``test_a_commit_never_passes_records_whose_states_faust_has_not_sent_yet`` (integration).
    """

    def __init__(self, producer: Any) -> None:
        self._send = producer.send
        self._sent: list[asyncio.Future[Any]] = []

    async def send(self, topic: str, key: bytes, value: bytes | None) -> None:
        """Queue ``key``'s record (``value``, a tombstone when ``None``) on ``topic``."""
        self._sent.append(await self._send(topic, value, key=key))

    async def delivered(self) -> dict[tuple[str, int], int]:
        """Until the broker has every record sent (a failed delivery raises); returns, per
        changelog partition written, the offset of the last record."""
        last: dict[tuple[str, int], int] = {}
        if self._sent:
            for meta in await asyncio.gather(*self._sent):
                tp = (meta.topic, meta.partition)
                last[tp] = max(meta.offset, last.get(tp, -1))
        return last


# --- failing and stopping ---------------------------------------------------------------------


async def hold_failed(messages: Iterable[Any]) -> NoReturn:
    """Withhold ``messages`` and never return: what an agent does when it cannot process them.

    When an agent raises, faust acks the message it was processing and restarts the agent
    (``faust/agents/agent.py`` lines 707 and 713; the stream acks its event on the way out,
    ``faust/streams.py`` line 1344): the records would be committed unprocessed, and the next
    batch processed after them. It is faust's documented behaviour, not a bug, but podcost needs
    at least once. So no exception reaches faust: ``FaustKeyedApp._fail`` stops the whole app,
    and its agent waits here to be stopped; the messages are withheld (:func:`withhold`), so
    faust neither commits them nor waits for their acks, and they are read again after the
    restart. Proof: ``test_a_failing_processor_stops_the_app_promptly_and_its_record_is_read_
    again`` (integration)."""
    for message in messages:
        withhold(message)
    await asyncio.Event().wait()
    raise AssertionError("unreachable: the event is never set")


async def stop_bounded(app: Any, *, failed: bool, timeout_s: float, name: str) -> None:
    """Stop the faust ``app`` within about twice ``timeout_s``, whatever it waits for.

    On stop faust's consumer waits until every message its streams took is acked
    (``faust/transport/consumer.py`` lines 904 and 867), with no bound, and a cancelled wait
    swallows its cancellation (line 861), so ``asyncio.timeout`` around the stop never fires.
    After a failure the agent never acks its messages (nor one it waits for the timer's lock
    with): they are withheld (:func:`withhold_unacked`) before the stop. The stop is bounded in
    any case by waiting for it as a task: past ``timeout_s`` what faust still waits for (a batch
    stuck in its flush) is withheld, so the stop can go on and end (its consumer leaving the
    group: the partitions move on at once rather than after the session timeout); past another
    ``timeout_s`` it is left (logged), and the process exits without it (:class:`DaemonWorker`);
    the consumer thread it left running is ended (:func:`end_consumer_thread`, through mode's
    ``threads.py`` line 227), so an app run in a process that goes on does not go on consuming.
    Proof: ``test_plain_faust_s_wait_for_acks_swallows_its_cancellation`` and
    ``test_a_withheld_message_is_never_recorded_for_a_commit_nor_waited_for`` (unit),
    ``test_a_stop_in_the_middle_of_a_batch_commits_and_stores_nothing_of_it_and_loses_nothing``,
    ``test_an_app_that_stops_making_progress_turns_not_ready_then_exits_stalled`` and
    ``test_a_stop_faust_never_ends_still_ends_its_consumer_thread`` (integration)."""
    if failed:
        withhold_unacked(app.consumer)
    stopping = asyncio.ensure_future(app.stop())
    done, _ = await asyncio.wait({stopping}, timeout=timeout_s)
    if stopping not in done:
        log.error(
            "%s: faust did not stop within %ss; withholding what it waits for", name, timeout_s
        )
        withhold_unacked(app.consumer)
        done, _ = await asyncio.wait({stopping}, timeout=timeout_s)
    if stopping in done:
        stopping.result()
    else:
        log.error("%s: faust still did not stop; exiting without it", name)
        stopping.cancel()
    await end_consumer_thread(app, timeout_s=timeout_s, name=name)


async def end_consumer_thread(app: Any, *, timeout_s: float, name: str) -> None:
    """End faust's consumer thread if the stop left it running (a stop given up, a start hung
    in the thread): a service exits then and the thread with it, but in a process that goes on
    (an app run in-process) the thread would go on fetching for good, and aiokafka's fetcher
    shuffles with the process's global ``random`` at every fetch
    (``aiokafka/consumer/fetcher.py`` line 654)."""
    consumer = app._consumer
    service: Any = getattr(consumer, "_thread", None) if consumer is not None else None
    worker = getattr(service, "_thread", None)
    if service is None or worker is None or not worker.is_alive():
        return
    log.error("%s: faust's consumer thread outlived its stop; ending it", name)
    with contextlib.suppress(RuntimeError):  # its loop already closed: it is ending
        service._stopped_set()
    await asyncio.to_thread(worker.join, timeout_s)
    if worker.is_alive():
        log.error("%s: faust's consumer thread did not end", name)


# --- recovery ---------------------------------------------------------------------------------

K = TypeVar("K")


class RecoveryStalls(Generic[K]):
    """Which changelog partitions a recovery has applied nothing of for ``after_s`` seconds
    although they are behind their highwater (see :func:`seek_stalled_recovery`)."""

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


async def seek_stalled_recovery(
    app: Any, stalls: RecoveryStalls[Any], now: float, name: str
) -> None:
    """Seek a changelog partition whose recovery stalled to the next offset it needs.

    After a rebalance, a changelog partition newly assigned was seen never to deliver a record to
    faust's recovery although it was behind its highwater and aiokafka kept fetching it: faust
    only logs "No event received for active tp ... since recovery start"
    (``faust/tables/recovery.py`` line 1093), for minutes. The records were fetched and dropped
    somewhere between aiokafka and the recovery (where is not found), with the fetch position
    past them, so the recovery never ended and the app never processed a record again (a lost
    decision in ``tests/integration/test_core_replicas.py`` after the SIGKILL of an aggregator).
    podcost's watchdog calls this every second: a partition that got nothing for
    ``stalls.after_s`` while behind is sought to the offset after the last one applied; applying
    a changelog record again is harmless (the same value for the same key). Proof:
    ``test_a_changelog_partition_the_recovery_applies_nothing_of_for_a_while_is_stalled`` (unit)
    and ``test_a_recovery_that_gets_none_of_its_changelog_records_seeks_them_again_and_ends``
    (integration, which drops a recovery's records)."""
    recovery = app.tables.recovery
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
        name,
        ", ".join(f"{tp.topic}[{tp.partition}] from {o}" for tp, o in stalled.items()),
        stalls.after_s,
    )
    try:
        await app.consumer.seek_wait(stalled)
    except Exception as error:  # tried again after the next stall
        log.warning("%s: seeking the changelogs failed: %r", name, error)
