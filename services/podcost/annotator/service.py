"""The annotator service: desired costs from the bus, written onto the pods, gently.

Built by :func:`bootstrap` (the composition root ``podcost annotator``, ``podcost run`` and the
tests use) and run by ``podcost.runtime.runner.serve``. One consumer task reads its own
cluster's costs topic (``<costs>.<cluster>``, group ``podcost-annotator.<cluster>``: see
``podcost_contracts.topics`` for the routing), decodes each record (an undecodable one goes to
the dead-letter topic with its reason) and queues one write per pod; ``max_in_flight`` writer
tasks take pods off the queue and, for each, read the pod, decide (``plan.decide``), and write
its cost with one conditional PATCH; a commit task commits offsets past the records whose every
write is done. All the deciding is in ``plan`` and ``pacing``; this module only wires the pieces
and runs those loops. It also keeps the last decision per pod and what became of its write
(``decisions``), served as ``GET /explain/{namespace}/{pod}`` for ``podcost explain``.

What it keeps per pod and per workload (:meth:`AnnotatorService.kept`) goes when its view sees
the pod or the workload deleted (``ClusterView.deletions``), so that over months of workloads
and pods coming and going under new names it follows the cluster as it is.

The loops work through three pieces, one role each, every one of them used by this class alone:

- ``intake``: consume and verify. Each record decoded (or dead-lettered), checked against the
  annotator's own view of its cluster (uid, owner, opt-in: a forged record is refused), ordered
  by the version guard, and its writes queued; the tail a previous run left uncommitted is read
  ahead after a start.
- ``backlog``: the write queue and its guards. The pending writes (coalesced per pod), the
  version guard, the ledger that says which offsets may be committed, the water marks that
  pause consumption, the assignment each record was read under (rebalances), and the Events
  telling a workload its costs were written or someone else's kept.
- ``writer``: pacing and the request itself. One pod read, verified again, decided and PATCHed
  through the token bucket, retried with backoff (429 after its ``Retry-After``) or given up.

Readiness (``ready``, served on ``/readyz``): consuming; not in an API server outage (every
request failing for ``unready_after_seconds``, logged when it begins to count and when the
server answers again); and, when built with ``catch_up`` (embedded mode: the watcher's first
pass after start), caught up: every decision of that pass written, i.e. the costs are current
again after a restart. A retriable bus error in the consume or commit loop is logged and
retried after a backoff; only a permanent one stops the annotator.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import trace

from podcost.annotator.backlog import Backlog, CatchUp, Running
from podcost.annotator.decisions import DecisionLog
from podcost.annotator.intake import POLL_WAIT_S, Intake, Verifier
from podcost.annotator.pacing import Clock, LoopClock, Outage, WaterMarks
from podcost.annotator.plan import (
    Refusal,
    Result,
    Retry,
    Scope,
    VersionGuard,
    superseded,
)
from podcost.annotator.settings import AnnotatorSettings
from podcost.annotator.view import ClusterView, InformerView
from podcost.annotator.writer import PodAPI, Writer
from podcost.runtime.events import recorder
from podcost.runtime.metrics import Families, Metrics
from podcost.runtime.retry import retry_transient
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import tracer
from podcost_bus import (
    Bus,
    BusError,
    BusSettings,
    Consumer,
    TopicPartition,
    open_bus,
)
from podcost_core.backoff import Random
from podcost_core.model import PodUID
from podcost_kube.client import Kube, connect
from podcost_kube.events import EventRecorder, EventSink
from podcost_kube.objects import DEPLOYMENT, REPLICASET, WorkloadKey
from podcost_kube.store import Change

if TYPE_CHECKING:
    from fastapi import APIRouter

__all__ = ["AnnotatorService", "CatchUp", "PodAPI", "bootstrap"]

log = logging.getLogger("podcost.annotator")

#: How often the consumer lag gauge is refreshed (it asks the broker).
LAG_INTERVAL_S = 5.0
#: The kinds a workload key names (``cluster/namespace/kind/name``).
WORKLOAD_KINDS = frozenset({DEPLOYMENT, REPLICASET})


@dataclass(frozen=True)
class Kept:
    """How much the annotator keeps per pod and per workload now: each follows the live pods
    and workloads of its cluster (or, for ``deleted``, the pods deleted lately), never every
    one it ever wrote for."""

    decisions: int
    """Pods whose last decision is remembered (``/explain``)."""
    writes: int
    """Pods whose last write taken is remembered (``WriteQueue``)."""
    told: int
    """Pods a dry run remembers having told of."""
    workloads: int
    """Workloads whose newest decision is remembered (the version guard)."""
    done: int
    """Workloads whose newest version written is remembered."""
    deleted: int
    """Uids of the pods its view saw deleted lately."""


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
        self.committed: dict[TopicPartition, int] = {}
        """The offsets this instance committed, per partition."""
        self.decisions = DecisionLog()
        """The last decision per pod and what became of it, for ``GET /explain/...``."""
        self.scope = scope if scope is not None else Scope()
        """The namespace and opt-in rules this annotator writes for."""
        self._running = Running()
        self._backlog = Backlog(
            config=config, metrics=metrics, clock=clock, decisions=self.decisions,
            running=self._running, catch_up=catch_up,
        )  # fmt: skip
        verifier = Verifier(
            config=config, scope=self.scope, metrics=metrics, clock=clock, wall=wall,
            running=self._running,
        )  # fmt: skip
        self._intake = Intake(
            settings=settings, bus_settings=bus_settings, bus=bus, topic=self.topic,
            group=self.group, metrics=metrics, clock=clock, wall=wall, otel=otel,
            backoff=self.backoff, rng=rng, decisions=self.decisions, backlog=self._backlog,
            verifier=verifier,
        )  # fmt: skip
        self._writer = Writer(
            settings=settings, config=config, metrics=metrics, clock=clock, wall=wall,
            otel=otel, backoff=self.backoff, rng=rng, scope=self.scope, verifier=verifier,
            running=self._running, owned=self._backlog.owned,
        )  # fmt: skip
        self.view = view

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
        return self._backlog.depth

    @property
    def marks(self) -> WaterMarks:
        """Whether consumption is paused now, how often it was, and the deepest queue seen."""
        return self._backlog.marks

    @property
    def guard(self) -> VersionGuard:
        """The newest decision accepted per workload (stale and duplicate ones are skipped)."""
        return self._backlog.guard

    @property
    def outage(self) -> Outage:
        """Whether the API server has been failing long enough to be reported."""
        return self._writer.outage

    @property
    def view(self) -> ClusterView | None:
        """Its own view of its cluster (built over the connected ``Kube`` when not given)."""
        return self._running.view

    @view.setter
    def view(self, view: ClusterView | None) -> None:
        self._running.view = view
        if view is not None and self._forget_deleted not in view.deletions:
            view.deletions.append(self._forget_deleted)

    def _forget_deleted(self, change: Change) -> None:
        """What the annotator keeps of a pod or a workload goes when its view sees it deleted
        (its decision, its last write, the newest decision of the workload), so that it follows
        the cluster as it is, not every pod and workload it ever wrote for."""
        old = change.old
        if old is None:
            return
        meta = old.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str):
            return
        if change.kind == "Pod":
            uid = meta.get("uid")
            if isinstance(uid, str):
                self._backlog.forget_pod(namespace, name, PodUID(uid))
                self._writer.forget(PodUID(uid))
        elif change.kind in WORKLOAD_KINDS:
            key = WorkloadKey(namespace, change.kind, name).bus_key(self.settings.cluster)
            self._backlog.forget_workload(key)

    @property
    def events(self) -> EventRecorder | None:
        """Its Kubernetes Events (over the connected ``Kube``; ``PODCOST_EVENTS``)."""
        return self._running.events

    @property
    def consumer(self) -> Consumer | None:
        """The consumer of its costs topic while it consumes (``None`` otherwise)."""
        return self._running.consumer

    def ready(self) -> bool:
        """Consuming, not in an API server outage, and caught up (see the module docstring)."""
        return (
            self.consumer is not None
            and not self.outage.reported
            and self.caught_up
            and self.view is not None
            and self.view.synced()
        )

    @property
    def caught_up(self) -> bool:
        """Every decision of the catch-up pass is written (always, without a ``catch_up``)."""
        return self._backlog.caught_up

    def kept(self) -> Kept:
        """What it keeps per pod and per workload now (see :class:`Kept`)."""
        backlog, view = self._backlog, self.view
        return Kept(
            decisions=len(self.decisions),
            writes=backlog.writes.remembered,
            told=self._writer.told,
            workloads=len(backlog.guard),
            done=len(backlog.done),
            deleted=view.deleted_kept if view is not None else 0,
        )

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
        self._backlog.restart()
        self._writer.restart()
        consumer = self.bus.consumer(
            [self.topic], group=self.group, max_poll_records=self.config.poll_records
        )
        if isinstance(kube, EventSink):
            self._running.events = recorder(self.settings, kube, "annotator")
        async with consumer:
            self._running.consumer = consumer
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
                self._running.consumer = None
                self._backlog.interrupt()  # stopped mid-way: these records will be read again

    async def _consume_loop(self, consumer: Consumer) -> None:
        topic = self.topic
        backlog = self._backlog
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
                    records, tail = await self._intake.read_ahead(consumer, records)
                    dropped = superseded(tail)
                backlog.purge_revoked()
                backlog.read_under = {tp: consumer.epoch(tp) for tp in consumer.assignment()}
                for index, record in enumerate(records):
                    await self._intake.accept(record, dropped=dropped.get(index, frozenset()))
                backlog.observe_depth()
                backlog.check_caught_up()
                if loop.time() >= next_lag:
                    lags = await consumer.lag()
                    self.metrics.consumer_lag.labels(topic).set(sum(lags.values()))
                    next_lag = loop.time() + LAG_INTERVAL_S
                failures = 0
            except BusError as error:
                if not error.retriable:
                    raise
                # The broker is away: what was polled is accepted (``accept`` retries its own
                # bus calls), so polling again after a pause loses nothing.
                failures += 1
                delay = self.backoff.delay(failures, self._random)
                log.warning("consuming %s failed (%d in a row), again in %.1fs: %s", topic,
                            failures, delay, error)  # fmt: skip
                await self._clock.sleep(delay)

    async def _write_loop(self, kube: PodAPI) -> None:
        backlog = self._backlog
        while True:
            _, _, uid = await backlog.ready.get()
            want = backlog.writes.take(uid)
            if want is None:  # settled while waiting its turn (superseded by an unchanged cost)
                continue
            if backlog.owned(want.origin.item):
                result = await self._writer.write(kube, want)
            else:
                result = Result.REVOKED
                backlog.purge_revoked()
            again = backlog.writes.finish(want.uid)
            backlog.settle(want, result)
            if again:
                backlog.announce(want.uid)
            backlog.observe_depth()

    async def _commit_loop(self, consumer: Consumer) -> None:
        backlog = self._backlog
        while True:
            await backlog.progress.wait()
            backlog.progress.clear()
            done = backlog.committable()
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
