"""The annotator service: desired costs from the bus, written onto the pods, gently.

Built by :func:`bootstrap` (the composition root ``podcost annotator``, ``podcost run`` and the
tests use) and run by ``podcost.runtime.runner.serve``. One consumer task reads its own
cluster's costs topic (``<costs>.<cluster>``, group ``podcost-annotator.<cluster>``: see
``podcost_contracts.topics`` for the routing), decodes each record (an undecodable one goes to
the dead-letter topic with its reason) and queues one write per pod; ``max_in_flight`` writer
tasks take pods off the queue and, for each, read the pod, decide (``plan.decide``), and write
its cost with one conditional PATCH; a commit task commits offsets past the records whose every
write is done. All the deciding is in ``plan`` and ``pacing``; this module only waits, talks and
records. It also keeps the last decision per pod and what became of its write (``decisions``),
served as ``GET /explain/{namespace}/{pod}`` for ``podcost explain``.

A write is a read and a compare-and-swap: the read gives the value on the pod now and who set
it; the PATCH (a JSON patch that tests the pod's uid and that one annotation) only lands if
neither changed since, so a cost someone sets between the two is never overwritten (the PATCH
is refused with ``CostChanged`` and the pod is read again), while status changes of a young pod
do not get in the way. Requests go through a token bucket; 404 means the pod is gone (skipped,
counted); a refused swap and 409 are retried with exponential backoff up to ``max_attempts``,
then counted as errors and logged; 429 (after its ``Retry-After``), 5xx, timeouts and refused
connections are retried with capped exponential backoff for as long as they last (``plan.
gives_up``), so an API server outage delays the writes and loses none; a permanent error (403,
422 ...) is counted as an error at once. Nothing is dropped silently. Consumption pauses when
the queue passes the high-water mark and resumes below the low one.

Stale and duplicate decisions (``plan.VersionGuard``): a record older than one already accepted
for its workload is skipped (``podcost_messages_consumed{outcome="stale"}``), even if the newer
one's writes are still under way, and the same decision again writes nothing
(``outcome="duplicate"``); both are committed in partition order like any other, so never
before the newer decision's writes are done (a duplicate read again while its first reading's
writes are under way is queued behind them, and finds nothing left to write). The guard lives
as long as one run (what a restart can and cannot refuse is in ``VersionGuard``'s docstring).
After a start, the records already on the topic past the committed offsets are read in full
before any is written, and a pod's cost is written only from the newest decision of its
workload among them that names it (an older decision whose every pod a newer one names is
stale: ``plan.superseded``): the run before may have written a newer decision of that tail and
been killed before it committed, and writing the tail in order would rewind those pods' costs
until the newer decision is read again.

Readiness (``ready``, served on ``/readyz``): consuming; not in an API server outage (every
request failing for ``unready_after_seconds``, logged when it begins to count and when the
server answers again); and, when built with ``catch_up`` (embedded mode: the watcher's first
pass after start), caught up: every decision of that pass written, i.e. the costs are current
again after a restart. A retriable bus error in the consume or commit loop is logged and
retried after a backoff; only a permanent one stops the annotator.

Verifying before writing (``plan.verify``): the annotator trusts nothing it reads on the bus. A
pod's cost is written only when its own view of its own cluster (``view.InformerView``: an
informer over the pods, ReplicaSets and Deployments of its scope) says the pod exists with the
uid the decision names, is owned by the workload the record's key names, and that workload is
opted in and in scope (the watcher's namespace and opt-in settings, through the same functions).
Anything else is refused before any request (what the view already contradicts when a record
is consumed is refused then, never queued, so a forged decision cannot supersede a genuine one
for the same pod): counted in ``podcost_refusals{reason}`` and
``podcost_patches{result="refused"}``, logged, and committed like any settled write (a refused
record is never retried). A pod the view saw deleted is ``gone`` at once. A pod the view does not
show (deleted before it started, or too new for it) is read, as every pod is before its write:
404 is ``gone``, and a pod found is verified like any other. Every pod read is verified again on
what the read returned (its owner must still be the workload), and the PATCH itself tests the
pod's uid: nothing is ever written blind. Owners the view does not show yet (a brand-new
ReplicaSet) may be ones it has not seen yet, and a workload it shows not opted in may have
opted in since (the watcher saw it first): the write waits for the view, polling it, until
``view_grace_seconds`` after the decision was published (or consumed, if earlier), then is
refused. A record naming more pods the view does not show than ``unknown_pod_budget`` has the
rest refused (``unknown_pod``) without the read each would cost.

Releases (``ReleaseCostsMessage``, for a workload that opted out): one removal per pod,
queued, paced and retried like a write and ordered with the workload's decisions by the same
guard; each reads the pod and removes the cost only where podcost's own field manager alone
owns it, with a PATCH that tests the value (``Kube.remove_deletion_cost_if_unchanged``), so a
cost someone set stays.

Offsets are committed only after the writes (at least once): a restart re-reads what was not
committed, and re-reading finds the costs already written, so nothing is written twice.

Rebalances (another annotator of the cluster joins or leaves): every record is tracked under
the assignment its partition was owned under when it was read (``Consumer.epoch``). Once that
assignment is gone its queued writes are purged (``Result.REVOKED``), a write under way makes
no further request, its offset is never committed here, and the partition's new owner reads it
again; so an older cost never lands after the newer one the new owner writes (a PATCH already
sent tests the value it read, so one racing the new owner's write is refused).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from opentelemetry import trace

from podcost.annotator.decisions import DecisionLog, Written, trace_id_of
from podcost.annotator.pacing import (
    Clock,
    Flow,
    LoopClock,
    Outage,
    TokenBucket,
    WaterMarks,
)
from podcost.annotator.plan import (
    NOT_URGENT,
    Decided,
    Freshness,
    Ledger,
    Refusal,
    Refused,
    Result,
    Retry,
    Scope,
    TailDecision,
    Ticket,
    Verdict,
    VersionGuard,
    Want,
    WriteQueue,
    decide,
    gives_up,
    pod_state,
    superseded,
    verify,
    verify_release,
    write_priority,
)
from podcost.annotator.settings import AnnotatorSettings
from podcost.annotator.view import ClusterView, InformerView
from podcost.runtime.events import recorder
from podcost.runtime.metrics import Families, Metrics
from podcost.runtime.retry import retry_transient
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import (
    ATTR_COMPLETE,
    ATTR_COST,
    ATTR_K8S_NAMESPACE,
    ATTR_K8S_POD,
    ATTR_MISSING,
    ATTR_POD,
    ATTR_PODS,
    ATTR_RESULT,
    ATTR_VERSION,
    ATTR_WORKLOAD,
    ATTR_WRITES,
    SPAN_ANNOTATE,
    SPAN_PATCH,
    extract,
    processing,
    tracer,
    workload_resource,
)
from podcost_bus import (
    Bus,
    BusError,
    BusSettings,
    Consumer,
    Record,
    TopicPartition,
    open_bus,
)
from podcost_bus.messaging import dead_letter, decode_or_dead_letter
from podcost_contracts.messages import (
    DecodeError,
    DesiredCostsMessage,
    PodCost,
    ReleaseCostsMessage,
    decode,
    decode_costs_record,
)
from podcost_contracts.stamps import future_stamp
from podcost_core.backoff import Random
from podcost_core.kubejson import ObjectMetaJSON
from podcost_core.model import DELETION_COST_ANNOTATION, PodUID
from podcost_core.tomodel import own_cost
from podcost_kube.client import CostChanged, Kube, KubeError, PodGone, connect
from podcost_kube.events import EventRecorder, ObjectRef

if TYPE_CHECKING:
    from fastapi import APIRouter

log = logging.getLogger("podcost.annotator")

R = TypeVar("R")

#: How long one poll waits for records before the loop looks around (lag, a stop) again.
POLL_WAIT_S = 0.5
#: How often the consumer lag gauge is refreshed (it asks the broker).
LAG_INTERVAL_S = 5.0
#: How often a write waiting for the view to show its pod looks again.
VIEW_POLL_S = 0.05
#: How many pods a dry run remembers having logged (:meth:`AnnotatorService._tell_dry_run`).
DRY_RUN_TOLD = 65536

CatchUp = Callable[[], Mapping[str, int] | None]
"""The decisions to write before the costs are current again after a start: per workload key,
the snapshot version (``None`` while they are not all known yet)."""


class PodAPI(Protocol):
    """What the annotator needs of the Kubernetes adapter (``podcost_kube.client.Kube``)."""

    async def read_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The pod's JSON; ``PodGone`` if it does not exist, ``KubeError`` otherwise."""
        ...

    async def patch_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, cost: int, *, seen: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        """Write the cost as podcost's field manager, only if the pod and its cost are still as
        in ``seen`` (else ``CostChanged``, nothing written)."""
        ...

    async def remove_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, *, seen: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        """Remove the cost, only if the pod and its cost are still as in ``seen`` (else
        ``CostChanged``, nothing removed)."""
        ...


@dataclass(eq=False)
class _Batch:
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


class _Revoked(Exception):
    """A write's record was read under an assignment this annotator no longer holds."""


class AnnotatorService:
    """Applies desired costs (see the module docstring); build it with :func:`bootstrap`."""

    name = "annotator"

    def __init__(
        self,
        *,
        settings: ServiceSettings,
        bus_settings: BusSettings,
        config: AnnotatorSettings,
        bus: Bus,
        kube: PodAPI | None,
        clock: Clock,
        metrics: Metrics,
        otel: trace.Tracer,
        wall: Callable[[], float] = time.time,
        catch_up: CatchUp | None = None,
        scope: Scope | None = None,
        view: ClusterView | None = None,
        rng: Random = random.random,
    ) -> None:
        self.settings = settings
        self.bus_settings = bus_settings
        self.config = config
        self.backoff = settings.backoff()
        """How long every retry waits: bus calls, and writes the API server turned away."""
        self._random = rng
        self.bus = bus
        self.metrics = metrics
        self._kube = kube
        self._clock = clock
        self._tracer = otel
        self._wall = wall
        self.marks = WaterMarks(config.high_water, config.low_water)
        """Whether consumption is paused now, how often it was, and the deepest queue seen."""
        self.committed: dict[TopicPartition, int] = {}
        """The offsets this instance committed, per partition."""
        self._writes: WriteQueue[Ticket[_Batch]] = WriteQueue()
        self._ledger: Ledger[_Batch] = Ledger()
        self._open: set[_Batch] = set()
        self._bucket: TokenBucket | None = None
        # (write_priority, arrival, uid): the most urgent decision's pods first, then in order.
        self._ready: asyncio.PriorityQueue[tuple[int, int, PodUID]] = asyncio.PriorityQueue()
        self._arrivals = itertools.count()
        self._progress = asyncio.Event()
        self._consumer: Consumer | None = None
        self._read_under: dict[TopicPartition, int | None] = {}
        """Per owned partition, the assignment the last records polled were read under."""
        self.decisions = DecisionLog()
        """The last decision per pod and what became of it, for ``GET /explain/...``."""
        self.guard = VersionGuard()
        """The newest decision accepted per workload (stale and duplicate ones are skipped)."""
        self.outage = Outage(config.unready_after_seconds)
        """Whether the API server has been failing long enough to be reported."""
        self._catch_up = catch_up
        self._caught_up = catch_up is None
        self._started_at: float | None = None
        self._done: dict[str, int] = {}
        """Per workload key, the newest version whose every write is done."""
        self._told: OrderedDict[PodUID, tuple[int, str | None]] = OrderedDict()
        """In a dry run, per pod, the cost it was last said to get and the cost it had then:
        a decision that repeats them is logged at debug, not again at info (the costs of a dry
        run are never written, so every later decision would repeat them for every pod)."""
        self.scope = scope if scope is not None else Scope()
        """The namespace and opt-in rules this annotator writes for."""
        self.view = view
        """Its own view of its cluster (built over the connected ``Kube`` when not given)."""
        self.events: EventRecorder | None = None
        """Its Kubernetes Events (over the connected ``Kube``; ``PODCOST_EVENTS``)."""

    @property
    def topic(self) -> str:
        """The costs topic of this annotator's cluster, the only one it reads."""
        return self.bus_settings.topics.costs_for(self.settings.cluster)

    @property
    def group(self) -> str:
        """The consumer group of this cluster's annotators."""
        return self.config.group_for(self.settings.cluster)

    @property
    def dry_run(self) -> bool:
        return self.settings.dry_run

    @property
    def depth(self) -> int:
        """Pod writes queued or in flight."""
        return self._writes.depth

    def ready(self) -> bool:
        """Consuming, not in an API server outage, and caught up (see the module docstring)."""
        return (
            self._consumer is not None
            and not self.outage.reported
            and self._caught_up
            and self.view is not None
            and self.view.synced()
        )

    @property
    def caught_up(self) -> bool:
        """Every decision of the catch-up pass is written (always, without a ``catch_up``)."""
        return self._caught_up

    def routes(self) -> APIRouter:
        """``GET /explain/{namespace}/{pod}``, served by the runner on the HTTP port."""
        return self.decisions.router()

    async def run(self) -> None:
        """Consume and write until cancelled; connects to the cluster if no ``kube`` was given."""
        if self._kube is not None:
            await self._run(self._kube, self._view_over(self._kube))
            return
        async with connect() as kube:
            await self._run(kube, self._view_over(kube))

    def _view_over(self, kube: PodAPI) -> ClusterView:
        if self.view is None:
            if not isinstance(kube, Kube):
                raise TypeError("an annotator over a pod API that is not Kube needs a view")
            self.view = InformerView(kube, self.scope, backoff=self.backoff)
        return self.view

    # --- the loops ------------------------------------------------------------------------

    async def _run(self, kube: PodAPI, view: ClusterView) -> None:
        topics = self.bus_settings.topics
        await self.bus.ensure_topics([self.topic, topics.deadletter])
        self.metrics.record_topic_drift(self.bus.topic_drift())
        # The series the alerts read, at 0 from the start: the first dead letter, refusal or
        # failed write is an increase (a series born at 1 has none).
        self.metrics.consumed.labels(self.topic, "dead_letter")
        for refusal in Refusal:
            self.metrics.refusals.labels(refusal.value)
        for result in (Result.ERROR.value, Retry.THROTTLED.value):
            self.metrics.patches.labels(result)
        # A fresh start forgets what a previous run had in flight: it is read again from the bus.
        self._writes, self._ledger, self._open = WriteQueue(), Ledger(), set()
        self._ready, self._progress = asyncio.PriorityQueue(), asyncio.Event()
        self.guard, self._done = VersionGuard(), {}
        self._started_at = self._clock.now()
        self.marks = WaterMarks(self.config.high_water, self.config.low_water)
        self._bucket = TokenBucket(self.config.qps, self.config.burst, now=self._clock.now())
        consumer = self.bus.consumer(
            [self.topic], group=self.group, max_poll_records=self.config.poll_records
        )
        if isinstance(kube, Kube):
            self.events = recorder(self.settings, kube, "annotator")
        async with consumer:
            self._consumer = consumer
            log.info(
                "annotator consuming %s as group %s%s",
                self.topic,
                self.group,
                " (dry run: nothing is written)" if self.dry_run else "",
            )
            try:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(view.run(), name="annotator-view")
                    if self.events is not None:
                        tasks.create_task(self.events.run(), name="annotator-events")
                    for index in range(self.config.max_in_flight):
                        tasks.create_task(self._write_loop(kube), name=f"annotator-write-{index}")
                    tasks.create_task(self._commit_loop(consumer), name="annotator-commit")
                    tasks.create_task(self._consume_loop(consumer), name="annotator-consume")
            finally:
                self._consumer = None
                for batch in self._open:  # stopped mid-way: these records will be read again
                    if batch.span is not None:
                        batch.span.set_attribute(ATTR_RESULT, "interrupted")
                        batch.span.end()
                self._open.clear()

    async def _consume_loop(self, consumer: Consumer) -> None:
        topic = self.topic
        loop = asyncio.get_running_loop()
        next_lag = loop.time()
        failures = 0
        replay = True  # until the first assignment: the tail a previous run left uncommitted
        while True:
            try:
                records = await consumer.poll(max_wait=POLL_WAIT_S)
                dropped: dict[int, frozenset[str]] = {}
                if replay and consumer.assignment():
                    replay = False
                    records, tail = await self._read_ahead(consumer, records)
                    dropped = superseded(tail)
                self._purge_revoked()
                self._read_under = {tp: consumer.epoch(tp) for tp in consumer.assignment()}
                for index, record in enumerate(records):
                    await self._accept(record, dropped=dropped.get(index, frozenset()))
                self._observe_depth()
                self._check_caught_up()
                if loop.time() >= next_lag:
                    lags = await consumer.lag()
                    self.metrics.consumer_lag.labels(topic).set(sum(lags.values()))
                    next_lag = loop.time() + LAG_INTERVAL_S
                failures = 0
            except BusError as error:
                if not error.retriable:
                    raise
                # The broker is away: what was polled is accepted (``_accept`` retries its own
                # bus calls), so polling again after a pause loses nothing.
                failures += 1
                delay = self.backoff.delay(failures, self._random)
                log.warning("consuming %s failed (%d in a row), again in %.1fs: %s", topic,
                            failures, delay, error)  # fmt: skip
                await self._clock.sleep(delay)

    async def _read_ahead(
        self, consumer: Consumer, records: list[Record]
    ) -> tuple[list[Record], list[TailDecision | None]]:
        """``records`` and every record already on the topic after them (until their pods reach
        the high-water mark), with the decisions they carry: after a start, the tail past the
        committed offsets, read in full so that a pod's cost is written only from the newest
        decision of its workload there that names it (``plan.superseded``)."""
        tail_decision = functools.partial(
            _tail_decision, now=self._wall(), allowance=self.settings.clock_skew_seconds
        )
        read, tail = list(records), [tail_decision(record) for record in records]

        def writes() -> int:  # at most what the high-water mark lets wait; a record naming no
            # pod (or undecodable) counts as one, so the tail held in memory is bounded too
            return sum(1 if decision is None else max(1, len(decision.pods)) for decision in tail)

        # Retried as every other read is: records polled here are delivered, and a failure that
        # left this method would lose them (the later commits pass their offsets).
        async def lag() -> int:
            return sum((await consumer.lag()).values())

        async def poll() -> list[Record]:
            return await consumer.poll(max_wait=POLL_WAIT_S)

        while writes() < self.marks.high:
            behind = await retry_transient(
                lag, what=f"reading the lag of {self.group}", sleep=self._clock.sleep
            )
            if not behind:
                break
            more = await retry_transient(
                poll, what=f"reading {self.topic}", sleep=self._clock.sleep
            )
            if not more:
                break
            read.extend(more)
            tail.extend(tail_decision(record) for record in more)
        return read, tail

    async def _write_loop(self, kube: PodAPI) -> None:
        while True:
            _, _, uid = await self._ready.get()
            want = self._writes.take(uid)
            if want is None:  # settled while waiting its turn (superseded by an unchanged cost)
                continue
            if self._owned(want.origin.item):
                result = await self._write(kube, want)
            else:
                result = Result.REVOKED
                self._purge_revoked()
            again = self._writes.finish(want.uid)
            self._settle(want, result)
            if again:
                self._announce(want.uid)
            self._observe_depth()

    async def _commit_loop(self, consumer: Consumer) -> None:
        while True:
            await self._progress.wait()
            self._progress.clear()
            done = [batch for batch in self._ledger.committable() if self._owned(batch)]
            if done:
                records = [batch.record for batch in done]
                committed = await retry_transient(
                    functools.partial(consumer.commit, records),
                    what=f"committing {self.group}'s offsets",
                    sleep=self._clock.sleep,
                    backoff=self.backoff,
                    rng=self._random,
                )
                self.committed.update(committed)

    # --- consuming ------------------------------------------------------------------------

    async def _accept(self, record: Record, *, dropped: frozenset[str] = frozenset()) -> None:
        """Queue the writes of one record (or dead-letter it); never waits for the writes.
        ``dropped``: the pods a newer decision of the same workload, read ahead after a start,
        names too; their costs here are not written (all of them: the record is stale)."""
        topics = self.bus_settings.topics
        message = await retry_transient(
            lambda: decode_or_dead_letter(
                self.bus, record, decode_costs_record, topic=topics.deadletter, group=self.group
            ),
            what=f"dead-lettering {record.topic}@{record.partition}:{record.offset}",
            sleep=self._clock.sleep,
            backoff=self.backoff,
            rng=self._random,
        )
        if message is None:
            self.metrics.consumed.labels(record.topic, "dead_letter").inc()
            self._nothing_to_write(record, None)
            return
        if message.workload.cluster != self.settings.cluster:
            # Only a misrouted or forged record gets here (the topic is this cluster's own):
            # another cluster's pods are never ours to write.
            self.metrics.consumed.labels(record.topic, "other_cluster").inc()
            log.warning(
                "ignoring %s on %s: not cluster %s", message.key, record.topic,
                self.settings.cluster,
            )  # fmt: skip
            self._nothing_to_write(
                record, message if isinstance(message, DesiredCostsMessage) else None
            )
            return
        if await self._from_the_future(record, message):
            return
        if isinstance(message, ReleaseCostsMessage):
            self._release(record, message)
            return
        decided = Decided(message.version, message.changed_at, message.complete)
        stale = bool(dropped) and all(pod.uid in dropped for pod in message.costs)
        if dropped and not stale:
            kept = tuple(pod for pod in message.costs if pod.uid not in dropped)
            message = message.model_copy(update={"costs": kept})
        # Verified before it is ordered: a decision none of whose pods the view backs is
        # refused whole and never admitted, so it cannot make the genuine ones stale.
        refusals = [self._refused_now(pod, message) for pod in message.costs]
        if message.costs and all(refusals):
            self._refuse_whole(record, message, refusals)
            return
        freshness = Freshness.STALE if stale else self.guard.admit(message.key, decided)
        if freshness is not Freshness.NEW:
            self.metrics.consumed.labels(record.topic, freshness.value).inc()
        if freshness is Freshness.STALE or (
            freshness is Freshness.DUPLICATE and self._done.get(message.key, -1) >= message.version
        ):
            # Older than a decision already accepted (whose writes may still be under way; this
            # record, later in the partition, is committed only after them): writing it would
            # rewind the costs. A duplicate whose writes are done has nothing left to write.
            newest = self.guard.latest(message.key)
            log.info(
                "skipping %s decision %d of %s: version %s accepted already",
                freshness.value, message.version, message.key,
                "newer, read ahead," if stale else newest.version if newest else "?",
                extra={"workload": message.key, "version": message.version,
                       "result": freshness.value},
            )  # fmt: skip
            self._nothing_to_write(record, message)
            return
        # New, or a duplicate read again while its writes are under way (a rebalance gave the
        # partition back): queued like any other, so its offset waits for those writes; the
        # writes coalesce with the ones in flight, which leave nothing to PATCH.
        if freshness is Freshness.NEW:
            self.metrics.consumed.labels(record.topic, "ok").inc()
        span = self._tracer.start_span(
            SPAN_ANNOTATE,
            context=extract(record.headers),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                ATTR_WORKLOAD: message.key,
                ATTR_VERSION: message.version,
                ATTR_PODS: len(message.costs),
                ATTR_COMPLETE: message.complete,
                ATTR_MISSING: list(message.missing),
                **processing(record.topic, record.partition, record.offset, record.key, self.group),
                **workload_resource(message.key),
            },
        )
        batch = _Batch(record, message, span, trace_id=trace_id_of(record.headers),
                       accepted_at=self._wall())  # fmt: skip
        self._open.add(batch)
        again = functools.partial(
            decode, DesiredCostsMessage, record.value, record.headers, key=record.key
        )
        self.decisions.record(message, batch.trace_id, again)
        ticket = self._track(batch, len(message.costs))
        if not message.costs:
            self._finish(batch)
        for position, pod in enumerate(message.costs):
            # Interned: what outlives the write (the queue's last cost per uid, the decision
            # log's keys) shares the watcher's strings instead of keeping this record's copies.
            uid, namespace, name = (
                PodUID(sys.intern(pod.uid)),
                sys.intern(pod.namespace),
                sys.intern(pod.name),
            )
            want = Want(uid, namespace, name, pod.cost, pod.previous, ticket,
                        first_wrong=message.first_wrong, position=position)  # fmt: skip
            refused = refusals[position]
            if refused is not None:
                # Never queued: a forged decision cannot supersede a genuine one for that pod.
                self._settle(want, self._count_refusal(want, message, refused))
                continue
            offer = self._writes.offer(want)
            for settled in offer.settled:
                self._settle(settled.want, settled.result)
            if offer.ready:
                self._announce(pod.uid)

    def _refuse_whole(
        self, record: Record, message: DesiredCostsMessage, refusals: list[Refused | None]
    ) -> None:
        """Settle a decision the view refuses for every pod it names, as refused, without
        admitting it to the version guard (``podcost_messages_consumed{outcome="refused"}``)."""
        self.metrics.consumed.labels(record.topic, "refused").inc()
        batch = _Batch(record, None, None)
        ticket = self._track(batch, len(message.costs))
        for position, (pod, refused) in enumerate(zip(message.costs, refusals, strict=True)):
            assert refused is not None
            want = Want(PodUID(pod.uid), pod.namespace, pod.name, pod.cost, pod.previous, ticket,
                        position=position)  # fmt: skip
            self._settle(want, self._count_refusal(want, message, refused))

    async def _from_the_future(
        self, record: Record, message: DesiredCostsMessage | ReleaseCostsMessage
    ) -> bool:
        """Whether ``message`` is stamped later than this annotator's clock allows
        (``PODCOST_CLOCK_SKEW_SECONDS``); if so it is dead-lettered with the reason, counted and
        committed, never admitted: the version guard orders a workload's decisions by their
        stamps, so one from the future would make every genuine one after it stale."""
        reason = future_stamp(message, now=self._wall(), allowance=self.settings.clock_skew_seconds)
        if reason is None:
            return False
        topics = self.bus_settings.topics
        letter = functools.partial(
            dead_letter, self.bus, record, reason, topic=topics.deadletter, group=self.group
        )
        await retry_transient(
            letter,
            what=f"dead-lettering {record.topic}@{record.partition}:{record.offset}",
            sleep=self._clock.sleep,
        )
        self.metrics.consumed.labels(record.topic, "future").inc()
        self._nothing_to_write(record, None)
        return True

    def _refused_now(self, pod: PodCost, message: DesiredCostsMessage) -> Refused | None:
        """What the view, once synced, refuses for good about ``pod`` now (a pod it does not
        show, or whose owners it does not, is left to the write, which may wait or read)."""
        view = self.view
        if view is None or not view.synced():
            return None
        known = view.pod(pod.namespace, pod.name)
        refused = verify(
            message.workload, pod.namespace, pod.name, pod.uid, known, view.store, self.scope
        )
        if refused is None or refused.reason.may_catch_up or refused.reason is Refusal.UNKNOWN_POD:
            return None
        return refused

    def _release(self, record: Record, message: ReleaseCostsMessage) -> None:
        """Queue the removal of podcost's costs from the pods of a workload no longer ranked;
        ordered with the workload's decisions (an older release is stale, a newer decision,
        should it opt in again, supersedes it)."""
        decided = Decided(message.version, message.changed_at, complete=True)
        freshness = self.guard.admit(message.key, decided)
        self.metrics.consumed.labels(record.topic, "ok" if freshness is Freshness.NEW
                                     else freshness.value).inc()  # fmt: skip
        if freshness is not Freshness.NEW and self._done.get(message.key, -1) >= message.version:
            self._nothing_to_write(record, None)
            return
        log.info("%s is no longer ranked (%s): removing podcost's costs from its %d pods",
                 message.key, message.reason, len(message.pods))  # fmt: skip
        batch = _Batch(record, None, None, release=message)
        self._open.add(batch)
        ticket = self._track(batch, len(message.pods))
        if not message.pods:
            self._finish(batch)
        for pod in message.pods:
            want = Want(pod.uid, pod.namespace, pod.name, 0, None, ticket, remove=True)
            offer = self._writes.offer(want)
            for settled in offer.settled:
                self._settle(settled.want, settled.result)
            if offer.ready:
                self._announce(pod.uid)

    def _track(self, batch: _Batch, writes: int) -> Ticket[_Batch]:
        """Open ``batch``'s record in the ledger under the assignment it was read under: each
        assignment of a partition has its own line of records to commit."""
        record = batch.record
        batch.epoch = self._read_under.get(record.tp)
        return self._ledger.open((record.tp, batch.epoch), record.offset, writes, batch)

    def _owned(self, batch: _Batch) -> bool:
        """Whether this annotator still owns ``batch``'s partition under the assignment it was
        read under: only then are its writes made and its offset committed."""
        consumer = self._consumer
        return (
            consumer is not None
            and batch.epoch is not None
            and consumer.epoch(batch.record.tp) == batch.epoch
        )

    def _purge_revoked(self) -> None:
        """After a rebalance took partitions away: forget their records (never committed here;
        their new owner reads them again) and settle their queued writes as revoked, so that
        no older cost lands after the one the new owner writes."""
        consumer = self._consumer
        if consumer is None:
            return
        for key in self._ledger.partitions():
            tp, epoch = cast(tuple[TopicPartition, int | None], key)
            if consumer.epoch(tp) != epoch:
                self._ledger.forget(key)
        purged = self._writes.purge(lambda want: self._owned(want.origin.item))
        for want in purged:
            self._settle(want, Result.REVOKED)
        if purged:
            log.info("a rebalance took partitions away: %d queued writes of theirs purged, "
                     "left to their new owner", len(purged))  # fmt: skip
            self._observe_depth()

    def _announce(self, uid: PodUID) -> None:
        """Hand ``uid``'s queued write to the writers, in the line of its decision's urgency."""
        queued = self._writes.queued(uid)
        priority = NOT_URGENT
        if queued is not None:
            # The controller reads a missing or invalid cost as 0.
            rising = queued.cost > (queued.previous or 0)
            priority = write_priority(queued.first_wrong, queued.position, rising=rising)
        self._ready.put_nowait((priority, next(self._arrivals), uid))

    def _nothing_to_write(self, record: Record, message: DesiredCostsMessage | None) -> None:
        batch = _Batch(record, message, None)
        self._track(batch, 0)
        self._progress.set()

    def _settle(self, want: Want[Ticket[_Batch]], result: Result) -> None:
        self.metrics.patches.labels(result.value).inc()
        ticket = want.origin
        ticket.item.results[result] += 1
        self._explain(want, result)
        if self._ledger.settle(ticket):
            self._finish(ticket.item)

    def _explain(self, want: Want[Ticket[_Batch]], result: Result) -> None:
        """Tell the decision log what became of one pod's cost (and who wrote it)."""
        batch = want.origin.item
        if batch.message is None:
            return
        version = batch.message.version
        written = None
        if result is Result.OK:
            written = Written(cost=want.cost, version=version, trace_id=batch.trace_id)
        self.decisions.settle(
            want.namespace, want.name, want.uid, version=version, result=result.value,
            written=written,
        )  # fmt: skip

    def _finish(self, batch: _Batch) -> None:
        """Every write of ``batch`` is done: end its span and let the commit task look."""
        self._open.discard(batch)
        if batch.span is not None:
            batch.span.set_attribute(ATTR_WRITES, batch.results[Result.OK])
            batch.span.end()
        message = batch.message
        if message is not None and self._owned(batch):
            key = message.key
            self._done[key] = max(self._done.get(key, message.version), message.version)
            self._check_caught_up()
            self._tell_workload(message, batch.results)
        self._progress.set()

    def _tell_workload(self, message: DesiredCostsMessage, results: Counter[Result]) -> None:
        """One event per decision on its workload: the costs written, the costs someone else
        set that were kept (``kubectl describe deployment/...`` shows them)."""
        if self.events is None:
            return
        workload = message.workload
        view = self.view
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
            self.events.record(
                ref, type="Normal", reason="CostsWritten", action="WriteCosts",
                note=f"wrote {written} pod deletion costs for decision {message.version}"
                f"{f' ({unchanged} already right)' if unchanged else ''}",
            )  # fmt: skip
        if kept:
            self.events.record(
                ref, type="Normal", reason="ForeignCostKept", action="WriteCosts",
                note=f"kept {kept} pod deletion costs someone else set (decision "
                f"{message.version}); PODCOST_ANNOTATOR_OVERWRITE_FOREIGN would take them over",
            )  # fmt: skip

    def _check_caught_up(self) -> None:
        """Latch ``caught_up`` once every decision ``catch_up`` names is written (or a newer
        one of the same workload is)."""
        if self._caught_up or self._catch_up is None:
            return
        expected = self._catch_up()
        if expected is None:
            return
        done = self._done
        if all(done.get(key, -1) >= version for key, version in expected.items()):
            self._caught_up = True
            took = self._clock.now() - (self._started_at or 0.0)
            log.info("caught up: the costs of %d workloads are current, %.2fs after start",
                     len(expected), took)  # fmt: skip

    def _observe_depth(self) -> None:
        depth = self._writes.depth
        self.metrics.queue_depth.set(depth)
        flow = self.marks.observe(depth)
        consumer = self._consumer
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

    # --- writing --------------------------------------------------------------------------

    async def _write(self, kube: PodAPI, want: Want[Ticket[_Batch]]) -> Result:
        """Read, decide and (maybe) write one pod, retrying within limits; never raises an API
        error (it becomes ``Result.ERROR``, logged)."""
        parent = want.origin.item.span
        context = trace.set_span_in_context(parent) if parent is not None else None
        with self._tracer.start_as_current_span(
            SPAN_PATCH,
            context=context,
            kind=trace.SpanKind.CLIENT,
            attributes={
                ATTR_POD: f"{want.namespace}/{want.name}",
                ATTR_COST: want.cost,
                ATTR_K8S_NAMESPACE: want.namespace,
                ATTR_K8S_POD: want.name,
            },
        ) as span:
            result = await self._attempts(kube, want, span)
            span.set_attribute(ATTR_RESULT, result.value)
            return result

    async def _attempts(self, kube: PodAPI, want: Want[Ticket[_Batch]], span: trace.Span) -> Result:
        pod = f"{want.namespace}/{want.name}"
        attempt = 1
        while True:
            try:
                return await self._attempt(kube, want)
            except _Revoked:
                return Result.REVOKED
            except PodGone:
                log.info(
                    "pod %s is gone: its cost %d is not written",
                    pod,
                    want.cost,
                    extra={"pod": pod, "cost": want.cost, "result": Result.GONE.value},
                )
                return Result.GONE
            except (KubeError, TimeoutError) as error:
                retriable = isinstance(error, TimeoutError) or error.retriable
                reason = _retry_reason(error)
                if not retriable or gives_up(reason, attempt, self.config.max_attempts):
                    log.error(
                        "giving up writing cost %d to pod %s after %d attempt(s): %s",
                        want.cost,
                        pod,
                        attempt,
                        _describe(error),
                        extra={"pod": pod, "cost": want.cost, "result": Result.ERROR.value},
                    )
                    return Result.ERROR
                retry_after = error.retry_after if isinstance(error, KubeError) else None
                delay = self.backoff.delay(attempt, self._random, at_least=retry_after)
                if reason is Retry.THROTTLED and retry_after and self._bucket is not None:
                    self._bucket.hold(self._clock.now() + retry_after)
                self.metrics.patches.labels(reason.value).inc()
                span.add_event(
                    "retry", {"attempt": attempt, "reason": reason.value, "delay_seconds": delay}
                )
                log.warning(
                    "retrying pod %s in %.2fs (attempt %d%s): %s",
                    pod,
                    delay,
                    attempt,
                    f" of {self.config.max_attempts}" if reason is Retry.CONFLICT else "",
                    _describe(error),
                    extra={"pod": pod, "cost": want.cost, "result": reason.value},
                )
                await self._clock.sleep(delay)
                attempt += 1

    async def _remove(self, kube: PodAPI, want: Want[Ticket[_Batch]]) -> Result:
        """Remove the cost podcost wrote on one pod of a workload no longer ranked: only when
        podcost's own field manager alone owns it, with a PATCH that tests the value first."""
        pod = f"{want.namespace}/{want.name}"
        release, view = want.origin.item.release, self.view
        if release is not None and view is not None:
            # Verified like a write: a forged release must not strip an opted-in workload.
            while not view.synced():
                await self._clock.sleep(VIEW_POLL_S)
            known = view.pod(want.namespace, want.name)
            refused = verify_release(release.workload, want.namespace, want.name, want.uid,
                                     known, view.store, self.scope)  # fmt: skip
            if refused is not None:
                self.metrics.refusals.labels(refused.reason.value).inc()
                log.warning(
                    "refusing to remove pod %s's cost for %s version %d: %s, %s", pod,
                    release.key, release.version, refused.reason.value, refused.detail,
                    extra={"pod": pod, "workload": release.key, "result": Result.REFUSED.value,
                           "reason": refused.reason.value},
                )  # fmt: skip
                return Result.REFUSED
        fence = want.origin.item
        seen = await self._request(lambda: kube.read_pod(want.namespace, want.name), fence)
        meta = seen.get("metadata") or {}
        if meta.get("uid") != want.uid or meta.get("deletionTimestamp") is not None:
            return Result.GONE
        if (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION) is None:
            return Result.UNCHANGED
        value = own_cost(cast(ObjectMetaJSON, meta))
        if value is None:
            log.info("pod %s carries a cost podcost did not write: left as it is", pod,
                     extra={"pod": pod, "result": Result.FOREIGN.value})  # fmt: skip
            return Result.FOREIGN
        if self.dry_run:
            log.info("dry run: would remove pod %s's cost %s", pod, value,
                     extra={"pod": pod, "result": Result.DRY_RUN.value})  # fmt: skip
            return Result.DRY_RUN
        await self._request(
            lambda: kube.remove_deletion_cost_if_unchanged(want.namespace, want.name, seen=seen),
            fence,
        )
        log.info("removed pod %s's cost %s: its workload is no longer ranked", pod, value,
                 extra={"pod": pod, "result": Result.OK.value})  # fmt: skip
        return Result.OK

    async def _attempt(self, kube: PodAPI, want: Want[Ticket[_Batch]]) -> Result:
        """One write, verified (see the module docstring); waits while the view may still show
        the pod's owners, within ``view_grace_seconds``. A release's removal is ``_remove``."""
        if want.remove:
            return await self._remove(kube, want)
        message = want.origin.item.message
        assert message is not None, "only decoded decisions queue writes"
        view = self.view
        assert view is not None, "writes are made only while running"
        while not view.synced():
            await self._clock.sleep(VIEW_POLL_S)
        since = self._clock.now()
        while True:
            result = await self._attempt_once(kube, want, message, view, since)
            if result is not None:
                return result
            await self._clock.sleep(VIEW_POLL_S)

    def _refusal(
        self, want: Want[Ticket[_Batch]], message: DesiredCostsMessage, refused: Refused,
        since: float,
    ) -> Result | None:  # fmt: skip
        """``refused``, counted and logged; ``None`` (look again) while the view may still
        catch up: until ``view_grace_seconds`` after the decision was published and after this write
        began waiting."""
        grace = self.config.view_grace_seconds
        # From when it was published, or consumed if that is earlier (a stamp may lie ahead):
        # one record's writes all stop waiting then, however many pods it names.
        began = min(message.emitted_at, want.origin.item.accepted_at or message.emitted_at)
        if (
            refused.reason.may_catch_up
            and self._wall() < began + grace
            and self._clock.now() - since < grace
        ):
            return None
        return self._count_refusal(want, message, refused)

    def _count_refusal(
        self, want: Want[Ticket[_Batch]], message: DesiredCostsMessage, refused: Refused
    ) -> Result:
        """Count and log a refused write, and tell the pod (a Warning event)."""
        self.metrics.refusals.labels(refused.reason.value).inc()
        pod = f"{want.namespace}/{want.name}"
        if self.events is not None:
            known = self.view.pod(want.namespace, want.name) if self.view is not None else None
            uid = str(((known or {}).get("metadata") or {}).get("uid") or "")
            self.events.record(
                ObjectRef("v1", "Pod", want.namespace, want.name, uid),
                type="Warning", reason="CostRefused", action="WriteCosts",
                note=f"refused cost {want.cost} of {message.key} decision {message.version}: "
                f"{refused.reason.value}, {refused.detail}",
            )  # fmt: skip
        log.warning(
            "refusing cost %d for pod %s (uid %s) of %s version %d: %s, %s",
            want.cost, pod, want.uid, message.key, message.version, refused.reason.value,
            refused.detail,
            extra={"pod": pod, "cost": want.cost, "workload": message.key,
                   "version": message.version, "result": Result.REFUSED.value,
                   "reason": refused.reason.value},
        )  # fmt: skip
        return Result.REFUSED

    async def _attempt_once(
        self, kube: PodAPI, want: Want[Ticket[_Batch]], message: DesiredCostsMessage,
        view: ClusterView, since: float,
    ) -> Result | None:  # fmt: skip
        pod = f"{want.namespace}/{want.name}"
        extra: dict[str, object] = {"pod": pod, "cost": want.cost}
        known = view.pod(want.namespace, want.name)
        if known is None and view.deleted(want.uid):
            log.info("pod %s is gone: its cost %d is not written", pod, want.cost,
                     extra={**extra, "result": Result.GONE.value})  # fmt: skip
            return Result.GONE
        refused = verify(
            message.workload, want.namespace, want.name, want.uid, known, view.store, self.scope
        )
        if refused is not None and refused.reason is not Refusal.UNKNOWN_POD:
            return self._refusal(want, message, refused, since)
        if refused is not None and not self._spend_unknown_read(want.origin.item):
            return self._count_refusal(want, message, refused)
        # Backed by the view, or a pod the view does not show (gone before it started, or too
        # new for it): the read says which, and what it returns is verified again below.
        fence = want.origin.item
        seen = await self._request(lambda: kube.read_pod(want.namespace, want.name), fence)
        state = pod_state(seen, self.settings.adopted)
        verdict = decide(
            want.cost, want.uid, state, overwrite_foreign=self.config.overwrite_foreign
        )
        while verdict is Verdict.WRITE:
            # The pod as read now must be the workload's (its owner may have changed since the
            # view saw it, or the view never saw it). Waiting for its owners to show in the
            # view needs no new read: the PATCH tests the pod's uid and cost as read.
            refused = verify(
                message.workload, want.namespace, want.name, want.uid, seen, view.store,
                self.scope,
            )  # fmt: skip
            if refused is None:
                break
            outcome = self._refusal(want, message, refused, since)
            if outcome is not None:
                return outcome
            await self._clock.sleep(VIEW_POLL_S)
        if verdict is Verdict.GONE:
            log.info(
                "pod %s is gone or replaced: its cost %d is not written",
                pod,
                want.cost,
                extra={**extra, "result": Result.GONE.value},
            )
            return Result.GONE
        if verdict is Verdict.UNCHANGED:
            log.debug("pod %s already has cost %d", pod, want.cost, extra=extra)
            return Result.UNCHANGED
        if verdict is Verdict.FOREIGN:
            log.info(
                "pod %s carries cost %r set by someone else: left as it is (wanted %d)",
                pod,
                state.value,
                want.cost,
                extra={**extra, "result": Result.FOREIGN.value, "found": state.value},
            )
            return Result.FOREIGN
        if state.invalid:
            log.warning("pod %s: replacing its deletion cost, %s", pod, state.invalid, extra=extra)
        if self.dry_run:
            self._tell_dry_run(want.uid, pod, want.cost, state.value, extra)
            return Result.DRY_RUN
        await self._request(
            lambda: kube.patch_deletion_cost_if_unchanged(
                want.namespace, want.name, want.cost, seen=seen
            ),
            fence,
        )
        if message.changed_at is not None:
            # From the change the watcher saw, not from this message's own hop.
            self.metrics.event_to_annotation.observe(max(0.0, self._wall() - message.changed_at))
        log.info(
            "set pod %s cost %d (was %r)",
            pod,
            want.cost,
            state.value,
            extra={**extra, "result": Result.OK.value},
        )
        return Result.OK

    def _spend_unknown_read(self, batch: _Batch) -> bool:
        """Whether ``batch``'s record may have one more pod the view does not show read from
        the API server (``unknown_pod_budget``); counts it if so."""
        if batch.unknown_reads >= self.config.unknown_pod_budget:
            return False
        batch.unknown_reads += 1
        return True

    def _tell_dry_run(
        self, uid: PodUID, pod: str, cost: int, now: str | None, extra: dict[str, object]
    ) -> None:
        """Log the write a dry run leaves out: at info the first time, at debug while the pod's
        wanted and current costs stay what they were when it was last said."""
        said = (cost, now)
        repeated = self._told.get(uid) == said
        self._told[uid] = said
        self._told.move_to_end(uid)
        if len(self._told) > DRY_RUN_TOLD:
            self._told.popitem(last=False)
        log.log(
            logging.DEBUG if repeated else logging.INFO,
            "dry run: would set pod %s cost %d (now %r)",
            pod,
            cost,
            now,
            extra={**extra, "result": Result.DRY_RUN.value},
        )

    async def _request(self, call: Callable[[], Awaitable[R]], fence: _Batch | None = None) -> R:
        """One API request within the QPS budget and the request timeout; made only while the
        assignment ``fence``'s record was read under holds (else ``_Revoked``)."""
        assert self._bucket is not None, "requests are made only while running"
        wait = self._bucket.reserve(self._clock.now())
        if wait > 0:
            self.metrics.rate_limit_waits.inc(wait)
            await self._clock.sleep(wait)
        if fence is not None and not self._owned(fence):
            raise _Revoked()
        try:
            async with asyncio.timeout(self.config.request_timeout_seconds):
                answer = await call()
        except (KubeError, TimeoutError) as error:
            if _unanswered(error):
                self._api_failed()
            else:
                self._api_answered()
            raise
        self._api_answered()
        return answer

    def _api_failed(self) -> None:
        now = self._clock.now()
        self.outage.failed(now)
        if self.outage.down(now) and not self.outage.reported:
            self.outage.reported = True
            log.error(
                "not ready: the API server has failed every request for %.1fs; writes are "
                "retried until it answers", self.outage.lasted(now),
            )  # fmt: skip

    def _api_answered(self) -> None:
        lasted = self.outage.answered(self._clock.now())
        if lasted is not None:
            log.warning("ready again: the API server answers after an outage of %.1fs", lasted)


def _unanswered(error: KubeError | TimeoutError) -> bool:
    """Whether a request got no answer from a working API server (no reply, a timeout, 5xx)."""
    if isinstance(error, TimeoutError):
        return True
    return error.status is None or error.status == 0 or error.status >= 500


def _retry_reason(error: KubeError | TimeoutError) -> Retry:
    status = error.status if isinstance(error, KubeError) else None
    if isinstance(error, CostChanged) or status == 409:
        return Retry.CONFLICT
    if status == 429:
        return Retry.THROTTLED
    return Retry.UNAVAILABLE


def _describe(error: BaseException) -> str:
    return str(error) or type(error).__name__


def bootstrap(
    settings: ServiceSettings,
    bus_settings: BusSettings,
    annotator_settings: AnnotatorSettings,
    *,
    bus: Bus | None = None,
    kube: PodAPI | None = None,
    clock: Clock | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    catch_up: CatchUp | None = None,
    scope: Scope | None = None,
    view: ClusterView | None = None,
    families: Families | None = None,
    rng: Random = random.random,
) -> AnnotatorService:
    """The annotator, wired: ``bus`` (default: the one ``bus_settings`` ask for, not started;
    ``serve`` starts it), ``kube`` (default: connect with ``$KUBECONFIG`` or in-cluster when
    it runs), ``clock`` (default: the event loop's), spans to ``tracer_provider`` (default: the
    global one); ``catch_up``: what must be written before it is ready (default: nothing);
    ``scope``: the namespace and opt-in rules it writes for (default: the watcher's defaults,
    every namespace, workloads that opt in themselves); ``view``: its view of the cluster
    (default: an ``InformerView`` over ``kube``, which must then be the ``Kube`` adapter);
    ``families``: the process's metric families (default: a registry of its own); ``rng``: the
    random source of the retries' jitter (a test's own makes their waits exact)."""
    if view is None and kube is not None and not isinstance(kube, Kube):
        raise ValueError("an annotator over a pod API that is not the Kube adapter needs a view")
    return AnnotatorService(
        settings=settings,
        bus_settings=bus_settings,
        config=annotator_settings,
        bus=bus if bus is not None else open_bus(bus_settings),
        kube=kube,
        clock=clock if clock is not None else LoopClock(),
        metrics=Metrics("annotator", families),
        otel=tracer(tracer_provider),
        catch_up=catch_up,
        scope=scope,
        view=view,
        rng=rng,
    )


def _tail_decision(record: Record, *, now: float, allowance: float) -> TailDecision | None:
    """The workload, order and pods of the decision a record carries (``None`` if it does not
    decode, or is stamped in the future: ``_accept`` dead-letters it, and it supersedes
    nothing)."""
    try:
        message = decode(DesiredCostsMessage, record.value, record.headers, key=record.key)
    except DecodeError:
        return None
    if future_stamp(message, now=now, allowance=allowance) is not None:
        return None
    decided = Decided(message.version, message.changed_at, message.complete)
    return TailDecision(message.key, decided, frozenset(pod.uid for pod in message.costs))
