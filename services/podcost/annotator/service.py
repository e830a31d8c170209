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
request failing for ``unready_after`` seconds, logged when it begins to count and when the
server answers again); and, when built with ``catch_up`` (embedded mode: the watcher's first
pass after start), caught up: every decision of that pass written, i.e. the costs are current
again after a restart. A retriable bus error in the consume or commit loop is logged and
retried after a backoff; only a permanent one stops the annotator.

Offsets are committed only after the writes (at least once): a restart re-reads what was not
committed, and re-reading finds the costs already written, so nothing is written twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fastapi import APIRouter
from opentelemetry import trace

from podcost.annotator.decisions import DecisionLog, Written, trace_id_of
from podcost.annotator.pacing import (
    Clock,
    Flow,
    LoopClock,
    Outage,
    TokenBucket,
    WaterMarks,
    backoff_delay,
)
from podcost.annotator.plan import (
    Decided,
    Freshness,
    Ledger,
    Result,
    Retry,
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
)
from podcost.annotator.settings import AnnotatorSettings
from podcost.runtime.metrics import Metrics
from podcost.runtime.retry import DEFAULT_BACKOFF, retry_transient
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import (
    ATTR_COMPLETE,
    ATTR_COST,
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
    tracer,
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
from podcost_bus.messaging import decode_or_dead_letter
from podcost_contracts.messages import DecodeError, DesiredCostsMessage, decode
from podcost_core.model import PodUID
from podcost_kube.client import CostChanged, KubeError, PodGone, connect

log = logging.getLogger("podcost.annotator")

R = TypeVar("R")

#: How long one poll waits for records before the loop looks around (lag, a stop) again.
POLL_WAIT_S = 0.5
#: How often the consumer lag gauge is refreshed (it asks the broker).
LAG_INTERVAL_S = 5.0

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


@dataclass(eq=False)
class _Batch:
    """One consumed record while its writes are under way."""

    record: Record
    message: DesiredCostsMessage | None
    span: trace.Span | None
    results: Counter[Result] = field(default_factory=Counter)


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
    ) -> None:
        self.settings = settings
        self.bus_settings = bus_settings
        self.config = config
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
        self._ready: asyncio.Queue[PodUID] = asyncio.Queue()
        self._progress = asyncio.Event()
        self._consumer: Consumer | None = None
        self.decisions = DecisionLog()
        """The last decision per pod and what became of it, for ``GET /explain/...``."""
        self.guard = VersionGuard()
        """The newest decision accepted per workload (stale and duplicate ones are skipped)."""
        self.outage = Outage(config.unready_after)
        """Whether the API server has been failing long enough to be reported."""
        self._catch_up = catch_up
        self._caught_up = catch_up is None
        self._started_at: float | None = None
        self._done: dict[str, int] = {}
        """Per workload key, the newest version whose every write is done."""

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
        return self._consumer is not None and not self.outage.reported and self._caught_up

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
            await self._run(self._kube)
            return
        async with connect() as kube:
            await self._run(kube)

    # --- the three loops ------------------------------------------------------------------

    async def _run(self, kube: PodAPI) -> None:
        topics = self.bus_settings.topics
        await self.bus.ensure_topics([self.topic, topics.deadletter])
        # A fresh start forgets what a previous run had in flight: it is read again from the bus.
        self._writes, self._ledger, self._open = WriteQueue(), Ledger(), set()
        self._ready, self._progress = asyncio.Queue(), asyncio.Event()
        self.guard, self._done = VersionGuard(), {}
        self._started_at = self._clock.now()
        self.marks = WaterMarks(self.config.high_water, self.config.low_water)
        self._bucket = TokenBucket(self.config.qps, self.config.burst, now=self._clock.now())
        consumer = self.bus.consumer(
            [self.topic], group=self.group, max_poll_records=self.config.poll_records
        )
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
                delay = DEFAULT_BACKOFF.delay(failures)
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
        read, tail = list(records), [_tail_decision(record) for record in records]

        def writes() -> int:  # at most what the high-water mark lets wait
            return sum(len(decision.pods) for decision in tail if decision is not None)

        while writes() < self.marks.high and sum((await consumer.lag()).values()) > 0:
            more = await consumer.poll(max_wait=POLL_WAIT_S)
            if not more:
                break
            read.extend(more)
            tail.extend(_tail_decision(record) for record in more)
        return read, tail

    async def _write_loop(self, kube: PodAPI) -> None:
        while True:
            uid = await self._ready.get()
            want = self._writes.take(uid)
            if want is None:  # settled while waiting its turn (superseded by an unchanged cost)
                continue
            result = await self._write(kube, want)
            again = self._writes.finish(want.uid)
            self._settle(want, result)
            if again:
                self._ready.put_nowait(want.uid)
            self._observe_depth()

    async def _commit_loop(self, consumer: Consumer) -> None:
        while True:
            await self._progress.wait()
            self._progress.clear()
            done = self._ledger.committable()
            if done:
                records = [batch.record for batch in done]
                committed = await retry_transient(
                    functools.partial(consumer.commit, records),
                    what=f"committing {self.group}'s offsets",
                    sleep=self._clock.sleep,
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
                self.bus, record, DesiredCostsMessage, topic=topics.deadletter, group=self.group
            ),
            what=f"dead-lettering {record.topic}@{record.partition}:{record.offset}",
            sleep=self._clock.sleep,
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
            self._nothing_to_write(record, message)
            return
        decided = Decided(message.version, message.changed_at, message.complete)
        stale = bool(dropped) and all(pod.uid in dropped for pod in message.costs)
        if dropped and not stale:
            kept = tuple(pod for pod in message.costs if pod.uid not in dropped)
            message = message.model_copy(update={"costs": kept})
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
            attributes={
                ATTR_WORKLOAD: message.key,
                ATTR_VERSION: message.version,
                ATTR_PODS: len(message.costs),
                ATTR_COMPLETE: message.complete,
                ATTR_MISSING: list(message.missing),
            },
        )
        batch = _Batch(record, message, span)
        self._open.add(batch)
        self.decisions.record(message, trace_id_of(record.headers))
        ticket = self._ledger.open(record.tp, record.offset, len(message.costs), batch)
        if not message.costs:
            self._finish(batch)
        for pod in message.costs:
            want = Want(pod.uid, pod.namespace, pod.name, pod.cost, pod.previous, ticket)
            offer = self._writes.offer(want)
            for settled in offer.settled:
                self._settle(settled.want, settled.result)
            if offer.ready:
                self._ready.put_nowait(pod.uid)

    def _nothing_to_write(self, record: Record, message: DesiredCostsMessage | None) -> None:
        batch = _Batch(record, message, None)
        self._ledger.open(record.tp, record.offset, 0, batch)
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
            trace_id = trace_id_of(batch.record.headers)
            written = Written(cost=want.cost, version=version, trace_id=trace_id)
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
        if message is not None:
            key = message.key
            self._done[key] = max(self._done.get(key, message.version), message.version)
            self._check_caught_up()
        self._progress.set()

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
            attributes={ATTR_POD: f"{want.namespace}/{want.name}", ATTR_COST: want.cost},
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
                delay = backoff_delay(
                    attempt,
                    initial=self.config.backoff_initial,
                    maximum=self.config.backoff_max,
                    retry_after=retry_after,
                )
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

    async def _attempt(self, kube: PodAPI, want: Want[Ticket[_Batch]]) -> Result:
        pod = f"{want.namespace}/{want.name}"
        extra: dict[str, object] = {"pod": pod, "cost": want.cost}
        seen = await self._request(lambda: kube.read_pod(want.namespace, want.name))
        state = pod_state(seen)
        verdict = decide(
            want.cost, want.uid, state, overwrite_foreign=self.config.overwrite_foreign
        )
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
            log.info(
                "dry run: would set pod %s cost %d (now %r)",
                pod,
                want.cost,
                state.value,
                extra={**extra, "result": Result.DRY_RUN.value},
            )
            return Result.DRY_RUN
        await self._request(
            lambda: kube.patch_deletion_cost_if_unchanged(
                want.namespace, want.name, want.cost, seen=seen
            )
        )
        message = want.origin.item.message
        if message is not None and message.changed_at is not None:
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

    async def _request(self, call: Callable[[], Awaitable[R]]) -> R:
        """One API request within the QPS budget and the request timeout."""
        assert self._bucket is not None, "requests are made only while running"
        wait = self._bucket.reserve(self._clock.now())
        if wait > 0:
            self.metrics.rate_limit_waits.inc(wait)
            await self._clock.sleep(wait)
        try:
            async with asyncio.timeout(self.config.request_timeout):
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
) -> AnnotatorService:
    """The annotator, wired: ``bus`` (default: the one ``bus_settings`` ask for, not started;
    ``serve`` starts it), ``kube`` (default: connect with ``$KUBECONFIG`` or in-cluster when
    it runs), ``clock`` (default: the event loop's), spans to ``tracer_provider`` (default: the
    global one); ``catch_up``: what must be written before it is ready (default: nothing)."""
    return AnnotatorService(
        settings=settings,
        bus_settings=bus_settings,
        config=annotator_settings,
        bus=bus if bus is not None else open_bus(bus_settings),
        kube=kube,
        clock=clock if clock is not None else LoopClock(),
        metrics=Metrics("annotator"),
        otel=tracer(tracer_provider),
        catch_up=catch_up,
    )


def _tail_decision(record: Record) -> TailDecision | None:
    """The workload, order and pods of the decision a record carries (``None`` if it does not
    decode: ``_accept`` dead-letters it)."""
    try:
        message = decode(DesiredCostsMessage, record.value, record.headers, key=record.key)
    except DecodeError:
        return None
    decided = Decided(message.version, message.changed_at, message.complete)
    return TailDecision(message.key, decided, frozenset(pod.uid for pod in message.costs))
