"""The annotator's intake: each consumed costs record decoded, checked, and its writes queued.

``AnnotatorService`` (``podcost.annotator.service``) hands every record its consumer polls to
:meth:`Intake.accept`, which never waits for a write: it decodes the record (an undecodable one,
or one stamped later than the clock allows, goes to the dead-letter topic with its reason),
ignores one about another cluster, orders it with its workload's other decisions through the
backlog's version guard (``backlog``), and queues one write per pod, or one removal per pod for a
release. :class:`Verifier` is the check against the annotator's own view of its cluster, here and
again before each write (``writer``); the rules themselves are the pure ``plan.verify``.

Stale and duplicate decisions (``plan.VersionGuard``): a record older than one already accepted
for its workload is skipped (``podcost_messages_consumed{outcome="stale"}``), even if the newer
one's writes are still under way, and the same decision again writes nothing
(``outcome="duplicate"``); both are committed in partition order like any other, so never
before the newer decision's writes are done (a duplicate read again while its first reading's
writes are under way is queued behind them, and finds nothing left to write). The guard lives
as long as one run (what a restart can and cannot refuse is in ``VersionGuard``'s docstring).
After a start, the records already on the topic past the committed offsets are read in full
(:meth:`Intake.read_ahead`) before any is written, and a pod's cost is written only from the
newest decision of its workload among them that names it (an older decision whose every pod a
newer one names is stale: ``plan.superseded``): the run before may have written a newer
decision of that tail and been killed before it committed, and writing the tail in order would
rewind those pods' costs until the newer decision is read again.

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
guard (``writer`` makes each removal).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable

from opentelemetry import trace

from podcost.annotator.backlog import Backlog, Batch, Running
from podcost.annotator.decisions import DecisionLog, trace_id_of
from podcost.annotator.pacing import Clock
from podcost.annotator.plan import (
    Decided,
    Freshness,
    Refusal,
    Refused,
    Result,
    Scope,
    TailDecision,
    Ticket,
    Want,
    verify,
)
from podcost.annotator.settings import AnnotatorSettings
from podcost.runtime.metrics import Metrics
from podcost.runtime.retry import retry_transient
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import (
    ATTR_COMPLETE,
    ATTR_MISSING,
    ATTR_PODS,
    ATTR_VERSION,
    ATTR_WORKLOAD,
    SPAN_ANNOTATE,
    extract,
    processing,
    workload_resource,
)
from podcost_bus import Bus, BusSettings, Consumer, Record
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
from podcost_core.backoff import Backoff, Random
from podcost_core.model import PodUID
from podcost_kube.events import ObjectRef

log = logging.getLogger("podcost.annotator")

#: How long one poll waits for records before the loop looks around (lag, a stop) again.
POLL_WAIT_S = 0.5


class Verifier:
    """The checks of a decision against the annotator's own view of its cluster, and what a
    refusal costs (a metric, a log line, a Warning event on the pod)."""

    def __init__(
        self,
        *,
        config: AnnotatorSettings,
        scope: Scope,
        metrics: Metrics,
        clock: Clock,
        wall: Callable[[], float],
        running: Running,
    ) -> None:
        self.config = config
        self.scope = scope
        self.metrics = metrics
        self._clock = clock
        self._wall = wall
        self._running = running

    def refused_now(self, pod: PodCost, message: DesiredCostsMessage) -> Refused | None:
        """What the view, once synced, refuses for good about ``pod`` now (a pod it does not
        show, or whose owners it does not, is left to the write, which may wait or read)."""
        view = self._running.view
        if view is None or not view.synced():
            return None
        known = view.pod(pod.namespace, pod.name)
        refused = verify(
            message.workload, pod.namespace, pod.name, pod.uid, known, view.store, self.scope
        )
        if refused is None or refused.reason.may_catch_up or refused.reason is Refusal.UNKNOWN_POD:
            return None
        return refused

    def refusal(
        self, want: Want[Ticket[Batch]], message: DesiredCostsMessage, refused: Refused,
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
        return self.count_refusal(want, message, refused)

    def count_refusal(
        self, want: Want[Ticket[Batch]], message: DesiredCostsMessage, refused: Refused
    ) -> Result:
        """Count and log a refused write, and tell the pod (a Warning event) unless it is outside
        the namespaces this annotator serves: a forged record must not make podcost write where
        it has no business (nor need the RBAC to)."""
        self.metrics.refusals.labels(refused.reason.value).inc()
        pod = f"{want.namespace}/{want.name}"
        events, view = self._running.events, self._running.view
        if events is not None and refused.reason is not Refusal.OUT_OF_SCOPE:
            known = view.pod(want.namespace, want.name) if view is not None else None
            uid = str(((known or {}).get("metadata") or {}).get("uid") or "")
            events.record(
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

    def spend_unknown_read(self, batch: Batch) -> bool:
        """Whether ``batch``'s record may have one more pod the view does not show read from
        the API server (``unknown_pod_budget``); counts it if so."""
        if batch.unknown_reads >= self.config.unknown_pod_budget:
            return False
        batch.unknown_reads += 1
        return True


class Intake:
    """Accepts consumed records into the backlog (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: ServiceSettings,
        bus_settings: BusSettings,
        bus: Bus,
        topic: str,
        group: str,
        metrics: Metrics,
        clock: Clock,
        wall: Callable[[], float],
        otel: trace.Tracer,
        backoff: Backoff,
        rng: Random,
        decisions: DecisionLog,
        backlog: Backlog,
        verifier: Verifier,
    ) -> None:
        self.settings = settings
        self.bus_settings = bus_settings
        self.bus = bus
        self.topic = topic
        self.group = group
        self.metrics = metrics
        self._clock = clock
        self._wall = wall
        self._tracer = otel
        self.backoff = backoff
        self._random = rng
        self.decisions = decisions
        self._backlog = backlog
        self._verifier = verifier

    async def read_ahead(
        self, consumer: Consumer, records: list[Record]
    ) -> tuple[list[Record], list[TailDecision | None]]:
        """``records`` and every record already on the topic after them (until their pods reach
        the high-water mark), with the decisions they carry: after a start, the tail past the
        committed offsets, read in full so that a pod's cost is written only from the newest
        decision of its workload there that names it (``plan.superseded``)."""
        decision_of = functools.partial(
            tail_decision, now=self._wall(), allowance=self.settings.clock_skew_seconds
        )
        read, tail = list(records), [decision_of(record) for record in records]

        def writes() -> int:  # at most what the high-water mark lets wait; a record naming no
            # pod (or undecodable) counts as one, so the tail held in memory is bounded too
            return sum(1 if decision is None else max(1, len(decision.pods)) for decision in tail)

        # Retried as every other read is: records polled here are delivered, and a failure that
        # left this method would lose them (the later commits pass their offsets).
        async def lag() -> int:
            return sum((await consumer.lag()).values())

        async def poll() -> list[Record]:
            return await consumer.poll(max_wait=POLL_WAIT_S)

        while writes() < self._backlog.marks.high:
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
            tail.extend(decision_of(record) for record in more)
        return read, tail

    async def accept(self, record: Record, *, dropped: frozenset[str] = frozenset()) -> None:
        """Queue the writes of one record (or dead-letter it); never waits for the writes.
        ``dropped``: the pods a newer decision of the same workload, read ahead after a start,
        names too; their costs here are not written (all of them: the record is stale)."""
        backlog = self._backlog
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
            backlog.nothing_to_write(record, None)
            return
        if message.workload.cluster != self.settings.cluster:
            # Only a misrouted or forged record gets here (the topic is this cluster's own):
            # another cluster's pods are never ours to write.
            self.metrics.consumed.labels(record.topic, "other_cluster").inc()
            log.warning(
                "ignoring %s on %s: not cluster %s", message.key, record.topic,
                self.settings.cluster,
            )  # fmt: skip
            backlog.nothing_to_write(
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
        refusals = [self._verifier.refused_now(pod, message) for pod in message.costs]
        if message.costs and all(refusals):
            self._refuse_whole(record, message, refusals)
            return
        freshness = Freshness.STALE if stale else backlog.guard.admit(message.key, decided)
        if freshness is not Freshness.NEW:
            self.metrics.consumed.labels(record.topic, freshness.value).inc()
        if freshness is Freshness.STALE or (
            freshness is Freshness.DUPLICATE
            and backlog.done.get(message.key, -1) >= message.version
        ):
            # Older than a decision already accepted (whose writes may still be under way; this
            # record, later in the partition, is committed only after them): writing it would
            # rewind the costs. A duplicate whose writes are done has nothing left to write.
            newest = backlog.guard.latest(message.key)
            log.info(
                "skipping %s decision %d of %s: version %s accepted already",
                freshness.value, message.version, message.key,
                "newer, read ahead," if stale else newest.version if newest else "?",
                extra={"workload": message.key, "version": message.version,
                       "result": freshness.value},
            )  # fmt: skip
            backlog.nothing_to_write(record, message)
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
        batch = Batch(record, message, span, trace_id=trace_id_of(record.headers),
                      accepted_at=self._wall())  # fmt: skip
        backlog.open.add(batch)
        again = functools.partial(
            decode, DesiredCostsMessage, record.value, record.headers, key=record.key
        )
        self.decisions.record(message, batch.trace_id, again)
        ticket = backlog.track(batch, len(message.costs))
        if not message.costs:
            backlog.finish(batch)
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
                backlog.settle(want, self._verifier.count_refusal(want, message, refused))
                continue
            backlog.queue(want)

    def _refuse_whole(
        self, record: Record, message: DesiredCostsMessage, refusals: list[Refused | None]
    ) -> None:
        """Settle a decision the view refuses for every pod it names, as refused, without
        admitting it to the version guard (``podcost_messages_consumed{outcome="refused"}``)."""
        self.metrics.consumed.labels(record.topic, "refused").inc()
        batch = Batch(record, None, None)
        ticket = self._backlog.track(batch, len(message.costs))
        for position, (pod, refused) in enumerate(zip(message.costs, refusals, strict=True)):
            assert refused is not None
            want = Want(PodUID(pod.uid), pod.namespace, pod.name, pod.cost, pod.previous, ticket,
                        position=position)  # fmt: skip
            self._backlog.settle(want, self._verifier.count_refusal(want, message, refused))

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
        self._backlog.nothing_to_write(record, None)
        return True

    def _release(self, record: Record, message: ReleaseCostsMessage) -> None:
        """Queue the removal of podcost's costs from the pods of a workload no longer ranked;
        ordered with the workload's decisions (an older release is stale, a newer decision,
        should it opt in again, supersedes it)."""
        backlog = self._backlog
        decided = Decided(message.version, message.changed_at, complete=True)
        freshness = backlog.guard.admit(message.key, decided)
        self.metrics.consumed.labels(record.topic, "ok" if freshness is Freshness.NEW
                                     else freshness.value).inc()  # fmt: skip
        if freshness is not Freshness.NEW and backlog.done.get(message.key, -1) >= message.version:
            backlog.nothing_to_write(record, None)
            return
        log.info("%s is no longer ranked (%s): removing podcost's costs from its %d pods",
                 message.key, message.reason, len(message.pods))  # fmt: skip
        batch = Batch(record, None, None, release=message)
        backlog.open.add(batch)
        ticket = backlog.track(batch, len(message.pods))
        if not message.pods:
            backlog.finish(batch)
        for pod in message.pods:
            backlog.queue(Want(pod.uid, pod.namespace, pod.name, 0, None, ticket, remove=True))


def tail_decision(record: Record, *, now: float, allowance: float) -> TailDecision | None:
    """The workload, order and pods of the decision a record carries (``None`` if it does not
    decode, or is stamped in the future: ``Intake.accept`` dead-letters it, and it supersedes
    nothing)."""
    try:
        message = decode(DesiredCostsMessage, record.value, record.headers, key=record.key)
    except DecodeError:
        return None
    if future_stamp(message, now=now, allowance=allowance) is not None:
        return None
    decided = Decided(message.version, message.changed_at, message.complete)
    return TailDecision(message.key, decided, frozenset(pod.uid for pod in message.costs))
