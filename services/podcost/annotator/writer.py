"""The annotator's writes: one pod read, verified, decided and PATCHed, paced and retried.

``AnnotatorService`` (``podcost.annotator.service``) runs ``max_in_flight`` writer tasks; each
takes a pod's write off the backlog (``backlog``) and hands it to :meth:`Writer.write`, which
never raises an API error: every write ends as a ``plan.Result``. The pure decisions it applies
are ``plan.decide`` (write, leave, keep someone else's cost, gone) and ``plan.gives_up`` (which
failures end as errors), the pacing is ``pacing.TokenBucket`` and ``pacing.Outage``, and the
checks against the annotator's own view are ``intake.Verifier``'s.

A write is a read and a compare-and-swap: the read gives the value on the pod now and who set
it; the PATCH (a JSON patch that tests the pod's uid and that one annotation) only lands if
neither changed since, so a cost someone sets between the two is never overwritten (the PATCH
is refused with ``CostChanged`` and the pod is read again), while status changes of a young pod
do not get in the way. Requests go through a token bucket; 404 means the pod is gone (skipped,
counted); a refused swap and 409 are retried with exponential backoff up to ``max_attempts``,
then counted as errors and logged; 429 (after its ``Retry-After``, which also holds the bucket),
5xx, timeouts and refused connections are retried with capped exponential backoff for as long as
they last (``plan.gives_up``), so an API server outage delays the writes and loses none; a
permanent error (403, 422 ...) is counted as an error at once. Nothing is dropped silently.
Every request is made only while the assignment its record was read under holds (else the
write ends as ``Result.REVOKED``: see ``backlog``).

A release's removal (``ReleaseCostsMessage``) reads the pod and removes the cost only where
podcost's own field manager alone owns it, with a PATCH that tests the value
(``Kube.remove_deletion_cost_if_unchanged``), so a cost someone set stays.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

from opentelemetry import trace

from podcost.annotator.backlog import Batch, Running
from podcost.annotator.intake import Verifier
from podcost.annotator.pacing import Clock, Outage, TokenBucket
from podcost.annotator.plan import (
    Refusal,
    Result,
    Retry,
    Scope,
    Ticket,
    Verdict,
    Want,
    decide,
    gives_up,
    pod_state,
    verify,
    verify_release,
)
from podcost.annotator.settings import AnnotatorSettings
from podcost.annotator.view import ClusterView
from podcost.runtime.metrics import Metrics
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import (
    ATTR_COST,
    ATTR_K8S_NAMESPACE,
    ATTR_K8S_POD,
    ATTR_POD,
    ATTR_RESULT,
    SPAN_PATCH,
)
from podcost_contracts.messages import DesiredCostsMessage
from podcost_core.backoff import Backoff, Random
from podcost_core.kubejson import ObjectMetaJSON
from podcost_core.model import DELETION_COST_ANNOTATION, PodUID
from podcost_core.tomodel import own_cost
from podcost_kube.client import CostChanged, KubeError, PodGone

log = logging.getLogger("podcost.annotator")

R = TypeVar("R")

#: How often a write waiting for the view to show its pod looks again.
VIEW_POLL_S = 0.05
#: How many pods a dry run remembers having logged (:meth:`Writer._tell_dry_run`).
DRY_RUN_TOLD = 65536


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


class Revoked(Exception):
    """A write's record was read under an assignment this annotator no longer holds."""


class Writer:
    """Makes one pod's write at a time per caller (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: ServiceSettings,
        config: AnnotatorSettings,
        metrics: Metrics,
        clock: Clock,
        wall: Callable[[], float],
        otel: trace.Tracer,
        backoff: Backoff,
        rng: Random,
        scope: Scope,
        verifier: Verifier,
        running: Running,
        owned: Callable[[Batch], bool],
    ) -> None:
        self.settings = settings
        self.config = config
        self.metrics = metrics
        self._clock = clock
        self._wall = wall
        self._tracer = otel
        self.backoff = backoff
        self._random = rng
        self.scope = scope
        self._verifier = verifier
        self._running = running
        self._owned = owned
        self.bucket: TokenBucket | None = None
        """The QPS budget of this run's requests (made by :meth:`restart`)."""
        self.outage = Outage(config.unready_after_seconds)
        """Whether the API server has been failing long enough to be reported."""
        self._told: OrderedDict[PodUID, tuple[int, str | None]] = OrderedDict()
        """In a dry run, per pod, the cost it was last said to get and the cost it had then:
        a decision that repeats them is logged at debug, not again at info (the costs of a dry
        run are never written, so every later decision would repeat them for every pod)."""

    @property
    def dry_run(self) -> bool:
        return self.settings.dry_run

    def forget(self, uid: PodUID) -> None:
        """The pod ``uid`` is gone: forget what a dry run last said of it."""
        self._told.pop(uid, None)

    @property
    def told(self) -> int:
        """How many pods a dry run remembers having told of."""
        return len(self._told)

    def restart(self) -> None:
        """A new run: a full budget of requests from now."""
        self.bucket = TokenBucket(self.config.qps, self.config.burst, now=self._clock.now())

    async def write(self, kube: PodAPI, want: Want[Ticket[Batch]]) -> Result:
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

    async def _attempts(self, kube: PodAPI, want: Want[Ticket[Batch]], span: trace.Span) -> Result:
        pod = f"{want.namespace}/{want.name}"
        attempt = 1
        while True:
            try:
                return await self._attempt(kube, want)
            except Revoked:
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
                if reason is Retry.THROTTLED and retry_after and self.bucket is not None:
                    self.bucket.hold(self._clock.now() + retry_after)
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

    async def _remove(self, kube: PodAPI, want: Want[Ticket[Batch]]) -> Result:
        """Remove the cost podcost wrote on one pod of a workload no longer ranked: only when
        podcost's own field manager alone owns it, with a PATCH that tests the value first."""
        pod = f"{want.namespace}/{want.name}"
        release, view = want.origin.item.release, self._running.view
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

    async def _attempt(self, kube: PodAPI, want: Want[Ticket[Batch]]) -> Result:
        """One write, verified (see ``intake``'s docstring); waits while the view may still
        show the pod's owners, within ``view_grace_seconds``. A release's removal is
        ``_remove``."""
        if want.remove:
            return await self._remove(kube, want)
        message = want.origin.item.message
        assert message is not None, "only decoded decisions queue writes"
        view = self._running.view
        assert view is not None, "writes are made only while running"
        while not view.synced():
            await self._clock.sleep(VIEW_POLL_S)
        since = self._clock.now()
        while True:
            result = await self._attempt_once(kube, want, message, view, since)
            if result is not None:
                return result
            await self._clock.sleep(VIEW_POLL_S)

    async def _attempt_once(
        self, kube: PodAPI, want: Want[Ticket[Batch]], message: DesiredCostsMessage,
        view: ClusterView, since: float,
    ) -> Result | None:  # fmt: skip
        verifier = self._verifier
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
            return verifier.refusal(want, message, refused, since)
        if refused is not None and not verifier.spend_unknown_read(want.origin.item):
            return verifier.count_refusal(want, message, refused)
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
            outcome = verifier.refusal(want, message, refused, since)
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

    async def _request(self, call: Callable[[], Awaitable[R]], fence: Batch | None = None) -> R:
        """One API request within the QPS budget and the request timeout; made only while the
        assignment ``fence``'s record was read under holds (else ``Revoked``)."""
        assert self.bucket is not None, "requests are made only while running"
        wait = self.bucket.reserve(self._clock.now())
        if wait > 0:
            self.metrics.rate_limit_waits.inc(wait)
            await self._clock.sleep(wait)
        if fence is not None and not self._owned(fence):
            raise Revoked()
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
