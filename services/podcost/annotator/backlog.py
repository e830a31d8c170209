"""The annotator's write queue and its guards: what is under way between consuming a record and
committing its offset.

:class:`Backlog` is the state ``AnnotatorService`` (``podcost.annotator.service``) keeps while it
runs, fed by ``intake`` (which queues the writes of each record it accepts) and drained by the
service's writer tasks (``writer`` makes each write). The pure pieces it holds are in ``plan``
(:class:`~podcost.annotator.plan.WriteQueue`, :class:`~podcost.annotator.plan.Ledger`,
:class:`~podcost.annotator.plan.VersionGuard`) and ``pacing``
(:class:`~podcost.annotator.pacing.WaterMarks`); this module only keeps them together and records
what becomes of each write (metrics, the decision log, spans, the workload's Events):

- the pending writes, one slot per pod uid: a newer desired cost for a pod supersedes (coalesces
  with) a queued older one, and they wait for the writer tasks in the line of their decision's
  urgency (``plan.write_priority``);
- the version guard: the newest decision accepted per workload, and per workload the newest
  version whose every write is done (a duplicate of it has nothing left to write); both
  forgotten once the workload is gone (deleted as the view saw it, or found missing from the
  view when a decision about it is done), and what is kept per pod (its last write taken, its
  decision) once the pod is (deleted, or found gone by its write): what the annotator keeps
  follows the live workloads and pods, not every one it ever wrote;
- the ledger of consumed records, so offsets are committed only after the writes (at least
  once): a restart re-reads what was not committed, and re-reading finds the costs already
  written, so nothing is written twice;
- the water marks: consumption pauses when the queue passes the high-water mark and resumes
  below the low one;
- when built with ``catch_up``, whether every decision of that pass is written (readiness).

Rebalances (another annotator of the cluster joins or leaves): every record is tracked under
the assignment its partition was owned under when it was read (``Consumer.epoch``). Once that
assignment is gone its queued writes are purged (``Result.REVOKED``), a write under way makes
no further request, its offset is never committed here, and the partition's new owner reads it
again; so an older cost never lands after the newer one the new owner writes (a PATCH already
sent tests the value it read, so one racing the new owner's write is refused).

When a decision's writes are all done its workload is told with an Event: the costs written,
and the costs someone else set that were kept (``Result.FOREIGN``: ``plan.decide`` leaves a
cost podcost did not write unless ``PODCOST_ANNOTATOR_OVERWRITE_FOREIGN`` says otherwise).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from opentelemetry import trace

from podcost.annotator.decisions import DecisionLog, Written
from podcost.annotator.pacing import Clock, Flow, WaterMarks
from podcost.annotator.plan import (
    NOT_URGENT,
    Ledger,
    Result,
    Ticket,
    VersionGuard,
    Want,
    WriteQueue,
    write_priority,
)
from podcost.annotator.settings import AnnotatorSettings
from podcost.annotator.view import ClusterView
from podcost.runtime.metrics import Metrics
from podcost.runtime.telemetry import ATTR_RESULT, ATTR_WRITES
from podcost_bus import Consumer, Record, TopicPartition
from podcost_contracts.messages import DesiredCostsMessage, ReleaseCostsMessage
from podcost_core.model import PodUID
from podcost_kube.events import EventRecorder, ObjectRef

log = logging.getLogger("podcost.annotator")

CatchUp = Callable[[], Mapping[str, int] | None]
"""The decisions to write before the costs are current again after a start: per workload key,
the snapshot version (``None`` while they are not all known yet)."""


@dataclass(eq=False)
class Batch:
    """One consumed record while its writes are under way."""

    record: Record
    message: DesiredCostsMessage | None
    span: trace.Span | None
    results: Counter[Result] = field(default_factory=Counter)
    release: ReleaseCostsMessage | None = None
    """The release whose removals these are (``message`` is then ``None``)."""
    trace_id: str | None = None
    """The trace of ``message`` (its record's ``traceparent``): one string for all its pods."""
    accepted_at: float = 0.0
    """When (POSIX seconds) it was consumed: a refusal that may change waits for the view at
    most ``view_grace_seconds`` from then (or from its ``emitted_at``, if earlier)."""
    unknown_reads: int = 0
    """Pods the view did not show that were read to verify them (``unknown_pod_budget``)."""
    epoch: int | None = None
    """The assignment its partition was owned under when it was read (``Consumer.epoch``): its
    writes are made, and its offset committed, only while that assignment holds."""


@dataclass
class Running:
    """What the annotator holds while it runs, shared by the backlog, ``intake`` and ``writer``
    (one instance, so the three always see the same)."""

    view: ClusterView | None = None
    """Its own view of its cluster (built over the connected ``Kube`` when not given)."""
    events: EventRecorder | None = None
    """Its Kubernetes Events (over the connected ``Kube``; ``PODCOST_EVENTS``)."""
    consumer: Consumer | None = None
    """The consumer of its costs topic, while it consumes."""


class Backlog:
    """The pending writes, the ledger, the version guard and the water marks (see the module
    docstring); one per annotator, emptied by :meth:`restart` when a run starts."""

    def __init__(
        self,
        *,
        config: AnnotatorSettings,
        metrics: Metrics,
        clock: Clock,
        decisions: DecisionLog,
        running: Running,
        catch_up: CatchUp | None = None,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._decisions = decisions
        self._running = running
        self.marks = WaterMarks(config.high_water, config.low_water)
        """Whether consumption is paused now, how often it was, and the deepest queue seen."""
        self.writes: WriteQueue[Ticket[Batch]] = WriteQueue()
        self.ledger: Ledger[Batch] = Ledger()
        self.open: set[Batch] = set()
        """The records whose writes are under way (their spans end when they are done)."""
        # (write_priority, arrival, uid): the most urgent decision's pods first, then in order.
        self.ready: asyncio.PriorityQueue[tuple[int, int, PodUID]] = asyncio.PriorityQueue()
        self._arrivals = itertools.count()
        self.progress = asyncio.Event()
        """Set when a record may have become committable."""
        self.read_under: dict[TopicPartition, int | None] = {}
        """Per owned partition, the assignment the last records polled were read under."""
        self.guard = VersionGuard()
        """The newest decision accepted per workload (stale and duplicate ones are skipped)."""
        self._catch_up = catch_up
        self.caught_up = catch_up is None
        """Every decision of the catch-up pass is written (always, without a ``catch_up``)."""
        self._started_at: float | None = None
        self.done: dict[str, int] = {}
        """Per workload key, the newest version whose every write is done."""

    @property
    def depth(self) -> int:
        """Pod writes queued or in flight."""
        return self.writes.depth

    def restart(self) -> None:
        """Empty it for a new run: a fresh start forgets what a previous run had in flight (it
        is read again from the bus)."""
        self.writes, self.ledger, self.open = WriteQueue(), Ledger(), set()
        self.ready, self.progress = asyncio.PriorityQueue(), asyncio.Event()
        self.guard, self.done = VersionGuard(), {}
        self._started_at = self._clock.now()
        self.marks = WaterMarks(self._config.high_water, self._config.low_water)

    def interrupt(self) -> None:
        """The run stopped mid-way: end the spans of the records still under way (they will be
        read again)."""
        for batch in self.open:
            if batch.span is not None:
                batch.span.set_attribute(ATTR_RESULT, "interrupted")
                batch.span.end()
        self.open.clear()

    def committable(self) -> list[Batch]:
        """The records whose offsets may be committed now, in partition order: every write done,
        and still read under an assignment this annotator holds."""
        return [batch for batch in self.ledger.committable() if self.owned(batch)]

    def track(self, batch: Batch, writes: int) -> Ticket[Batch]:
        """Open ``batch``'s record in the ledger under the assignment it was read under: each
        assignment of a partition has its own line of records to commit."""
        record = batch.record
        batch.epoch = self.read_under.get(record.tp)
        return self.ledger.open((record.tp, batch.epoch), record.offset, writes, batch)

    def owned(self, batch: Batch) -> bool:
        """Whether this annotator still owns ``batch``'s partition under the assignment it was
        read under: only then are its writes made and its offset committed."""
        consumer = self._running.consumer
        return (
            consumer is not None
            and batch.epoch is not None
            and consumer.epoch(batch.record.tp) == batch.epoch
        )

    def purge_revoked(self) -> None:
        """After a rebalance took partitions away: forget their records (never committed here;
        their new owner reads them again) and settle their queued writes as revoked, so that
        no older cost lands after the one the new owner writes."""
        consumer = self._running.consumer
        if consumer is None:
            return
        for key in self.ledger.partitions():
            tp, epoch = cast(tuple[TopicPartition, int | None], key)
            if consumer.epoch(tp) != epoch:
                self.ledger.forget(key)
        purged = self.writes.purge(lambda want: self.owned(want.origin.item))
        for want in purged:
            self.settle(want, Result.REVOKED)
        if purged:
            log.info("a rebalance took partitions away: %d queued writes of theirs purged, "
                     "left to their new owner", len(purged))  # fmt: skip
            self.observe_depth()

    def queue(self, want: Want[Ticket[Batch]]) -> None:
        """Offer one pod's write to the queue: settle what it supersedes, and hand it to the
        writers if it is not waiting behind a write to the same pod."""
        offer = self.writes.offer(want)
        for settled in offer.settled:
            self.settle(settled.want, settled.result)
        if offer.ready:
            self.announce(want.uid)

    def announce(self, uid: PodUID) -> None:
        """Hand ``uid``'s queued write to the writers, in the line of its decision's urgency."""
        queued = self.writes.queued(uid)
        priority = NOT_URGENT
        if queued is not None:
            # The controller reads a missing or invalid cost as 0.
            rising = queued.cost > (queued.previous or 0)
            priority = write_priority(queued.first_wrong, queued.position, rising=rising)
        self.ready.put_nowait((priority, next(self._arrivals), uid))

    def nothing_to_write(self, record: Record, message: DesiredCostsMessage | None) -> None:
        batch = Batch(record, message, None)
        self.track(batch, 0)
        self.progress.set()

    def settle(self, want: Want[Ticket[Batch]], result: Result) -> None:
        self._metrics.patches.labels(result.value).inc()
        ticket = want.origin
        ticket.item.results[result] += 1
        self._explain(want, result)
        if result is Result.GONE:
            # Nothing of a pod found gone is kept: no snapshot of it is to come.
            self.writes.forget(want.uid)
            self._decisions.forget(want.namespace, want.name, want.uid)
        if self.ledger.settle(ticket):
            self.finish(ticket.item)

    def forget_pod(self, namespace: str, name: str, uid: PodUID) -> None:
        """The view saw the pod deleted: forget its last write taken and its decision."""
        self.writes.forget(uid)
        self._decisions.forget(namespace, name, uid)

    def forget_workload(self, key: str) -> None:
        """The workload ``key`` is gone: forget its newest decision, and the newest version
        whose writes are done (kept until the catch-up pass is written: it reads them)."""
        self.guard.forget(key)
        if self.caught_up:
            self.done.pop(key, None)

    def _explain(self, want: Want[Ticket[Batch]], result: Result) -> None:
        """Tell the decision log what became of one pod's cost (and who wrote it)."""
        batch = want.origin.item
        if batch.message is None:
            return
        version = batch.message.version
        written = None
        if result is Result.OK:
            written = Written(cost=want.cost, version=version, trace_id=batch.trace_id)
        self._decisions.settle(
            want.namespace, want.name, want.uid, version=version, result=result.value,
            written=written,
        )  # fmt: skip

    def finish(self, batch: Batch) -> None:
        """Every write of ``batch`` is done: end its span and let the commit task look."""
        self.open.discard(batch)
        if batch.span is not None:
            batch.span.set_attribute(ATTR_WRITES, batch.results[Result.OK])
            batch.span.end()
        message = batch.message
        if message is not None and self.owned(batch):
            key = message.key
            self.done[key] = max(self.done.get(key, message.version), message.version)
            self.check_caught_up()
            self._tell_workload(message, batch.results)
            if not self._workload_lives(message):
                # A decision read after its workload was deleted (made before): the deletion
                # went by, so nothing else would forget what this one brought back.
                self.forget_workload(key)
        self.progress.set()

    def _workload_lives(self, message: DesiredCostsMessage) -> bool:
        """Whether the view holds the workload ``message`` is about (``True`` while it has not
        listed everything: it cannot tell)."""
        view = self._running.view
        if view is None or not view.synced():
            return True
        workload = message.workload
        return view.store.get(workload.kind, workload.namespace, workload.name) is not None

    def _tell_workload(self, message: DesiredCostsMessage, results: Counter[Result]) -> None:
        """One event per decision on its workload: the costs written, the costs someone else
        set that were kept (``kubectl describe deployment/...`` shows them)."""
        events = self._running.events
        if events is None:
            return
        workload = message.workload
        view = self._running.view
        known = (
            view.store.get(workload.kind, workload.namespace, workload.name)
            if view is not None
            else None
        )
        uid = str(((known or {}).get("metadata") or {}).get("uid") or "")
        ref = ObjectRef("apps/v1", workload.kind, workload.namespace, workload.name, uid)
        written, kept = results[Result.OK], results[Result.FOREIGN]
        if written:
            unchanged = results[Result.UNCHANGED]
            events.record(
                ref, type="Normal", reason="CostsWritten", action="WriteCosts",
                note=f"wrote {written} pod deletion costs for decision {message.version}"
                f"{f' ({unchanged} already right)' if unchanged else ''}",
            )  # fmt: skip
        if kept:
            events.record(
                ref, type="Normal", reason="ForeignCostKept", action="WriteCosts",
                note=f"kept {kept} pod deletion costs someone else set (decision "
                f"{message.version}); PODCOST_ANNOTATOR_OVERWRITE_FOREIGN would take them over",
            )  # fmt: skip

    def check_caught_up(self) -> None:
        """Latch ``caught_up`` once every decision ``catch_up`` names is written (or a newer
        one of the same workload is)."""
        if self.caught_up or self._catch_up is None:
            return
        expected = self._catch_up()
        if expected is None:
            return
        done = self.done
        if all(done.get(key, -1) >= version for key, version in expected.items()):
            self.caught_up = True
            took = self._clock.now() - (self._started_at or 0.0)
            log.info("caught up: the costs of %d workloads are current, %.2fs after start",
                     len(expected), took)  # fmt: skip

    def observe_depth(self) -> None:
        depth = self.writes.depth
        self._metrics.queue_depth.set(depth)
        flow = self.marks.observe(depth)
        consumer = self._running.consumer
        if flow is None or consumer is None:
            return
        if flow is Flow.PAUSE:
            consumer.pause()
            log.info(
                "paused consuming: %d pod writes pending (high water %d)", depth, self.marks.high
            )
        else:
            consumer.resume()
            log.info(
                "resumed consuming: %d pod writes pending (low water %d)", depth, self.marks.low
            )
