"""Removing the deletion costs podcost wrote: ``podcost cleanup`` and the chart's uninstall hook.

:func:`clean_up` lists the pods of the cluster (or of one namespace), keeps those whose deletion
cost podcost's own field manager alone owns (``podcost_core.tomodel.own_cost``: an adopted
manager's, a person's or an unknown writer's cost is never touched) and removes each with one
guarded PATCH (``Kube.remove_deletion_cost_if_unchanged``: a JSON patch that tests the pod's uid
and the value as listed before it removes the annotation), so a cost someone changed meanwhile
stays. A refused test reads the pod again and decides again, up to ``max_attempts``.

It writes within the annotator's budget and pacing (``AnnotatorSettings``: ``qps``/``burst``
through the same :class:`~podcost.annotator.pacing.TokenBucket`, ``max_in_flight`` requests at
once, the same backoff, and ``gives_up``: 429, 5xx and timeouts are retried for as long as they
last, conflicts up to ``max_attempts``). Nothing here decides what a cost is worth; it only undoes
podcost's own writes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any, Protocol, TypeVar, cast

from podcost.annotator.pacing import Clock, LoopClock, TokenBucket
from podcost.annotator.plan import Retry, gives_up
from podcost.annotator.settings import AnnotatorSettings
from podcost.runtime.retry import DEFAULT_BACKOFF
from podcost_core.backoff import Backoff, Random
from podcost_core.kubejson import ObjectMetaJSON
from podcost_core.tomodel import own_cost
from podcost_kube.client import CostChanged, KubeError, PodGone

log = logging.getLogger("podcost.cleanup")

R = TypeVar("R")


class CleanupAPI(Protocol):
    """What cleaning up needs of the Kubernetes adapter (``podcost_kube.client.Kube``)."""

    async def list_pods(self, namespace: str | None = None) -> list[dict[str, Any]]: ...

    async def read_pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    async def remove_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, *, seen: Mapping[str, Any]
    ) -> Mapping[str, Any]: ...


class Outcome(StrEnum):
    """What became of one pod whose cost podcost had written."""

    REMOVED = "removed"
    KEPT = "kept"
    """Its cost changed hands or value before the write: no longer podcost's, left as it is."""
    GONE = "gone"
    """Deleted, being deleted, or another pod under the name."""
    DRY_RUN = "dry_run"
    ERROR = "error"


@dataclass
class CleanupReport:
    """What :func:`clean_up` did."""

    pods: int = 0
    """Pods listed."""
    own: int = 0
    """Of them, those carrying a cost podcost's field manager alone owns."""
    outcomes: Counter[Outcome] = field(default_factory=Counter)
    seconds: float = 0.0
    """Wall time from the list to the last write."""

    def to_json(self) -> dict[str, object]:
        return {
            "pods": self.pods,
            "podcost_costs": self.own,
            **{outcome.value: self.outcomes[outcome] for outcome in Outcome},
            "seconds": round(self.seconds, 3),
        }


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _own(pod: Mapping[str, Any]) -> bool:
    return own_cost(cast(ObjectMetaJSON, _meta(pod))) is not None


class _Cleaner:
    def __init__(
        self,
        kube: CleanupAPI,
        config: AnnotatorSettings,
        clock: Clock,
        dry_run: bool,
        backoff: Backoff,
        rng: Random,
    ) -> None:
        self.kube = kube
        self.config = config
        self.backoff = backoff
        self.rng = rng
        self.clock = clock
        self.dry_run = dry_run
        self.bucket = TokenBucket(config.qps, config.burst, now=clock.now())
        self.slots = asyncio.Semaphore(config.max_in_flight)

    async def request(self, call: Callable[[], Awaitable[R]]) -> R:
        """One API request within the budget: a token, a slot, the request timeout."""
        wait = self.bucket.reserve(self.clock.now())
        if wait > 0:
            await self.clock.sleep(wait)
        async with self.slots, asyncio.timeout(self.config.request_timeout_seconds):
            return await call()

    async def remove(self, listed: Mapping[str, Any]) -> Outcome:
        meta = _meta(listed)
        namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), meta.get("uid")
        where = f"{namespace}/{name}"
        seen = listed
        attempt = 1
        while True:
            seen_meta = _meta(seen)
            if seen_meta.get("uid") != uid or seen_meta.get("deletionTimestamp") is not None:
                return Outcome.GONE
            if not _own(seen):
                log.info("pod %s: its cost is no longer podcost's, left as it is", where)
                return Outcome.KEPT
            if self.dry_run:
                log.info("dry run: would remove pod %s's cost %s", where, own_cost(
                    cast(ObjectMetaJSON, seen_meta)))  # fmt: skip
                return Outcome.DRY_RUN
            try:
                await self.request(
                    partial(self.kube.remove_deletion_cost_if_unchanged, namespace, name, seen=seen)
                )
                return Outcome.REMOVED
            except PodGone:
                return Outcome.GONE
            except (KubeError, TimeoutError) as error:
                status = error.status if isinstance(error, KubeError) else None
                reason = (
                    Retry.CONFLICT
                    if isinstance(error, CostChanged) or status == 409
                    else Retry.THROTTLED
                    if status == 429
                    else Retry.UNAVAILABLE
                )
                retriable = isinstance(error, TimeoutError) or error.retriable
                if not retriable or gives_up(reason, attempt, self.config.max_attempts):
                    log.error("giving up removing pod %s's cost after %d attempt(s): %s",
                              where, attempt, error)  # fmt: skip
                    return Outcome.ERROR
                retry_after = error.retry_after if isinstance(error, KubeError) else None
                if reason is Retry.THROTTLED and retry_after:
                    self.bucket.hold(self.clock.now() + retry_after)
                await self.clock.sleep(self.backoff.delay(attempt, self.rng, at_least=retry_after))
                attempt += 1
                if reason is Retry.CONFLICT:
                    try:
                        seen = await self.request(partial(self.kube.read_pod, namespace, name))
                    except PodGone:
                        return Outcome.GONE
                    except (KubeError, TimeoutError):
                        continue  # the next attempt's test decides with what was seen


async def clean_up(
    kube: CleanupAPI,
    config: AnnotatorSettings,
    *,
    namespace: str | None = None,
    dry_run: bool = False,
    clock: Clock | None = None,
    backoff: Backoff = DEFAULT_BACKOFF,
    rng: Random = random.random,
) -> CleanupReport:
    """Remove every deletion cost podcost's field manager alone set in ``namespace`` (one, or a
    comma-separated list as ``PODCOST_WATCHER_NAMESPACE`` takes it; ``None`` or empty: the whole
    cluster), within ``config``'s budget, retrying by ``backoff``; see the module docstring."""
    started = time.monotonic()
    clock = clock if clock is not None else LoopClock()
    cleaner = _Cleaner(kube, config, clock, dry_run, backoff, rng)
    names: list[str | None] = [p.strip() for p in (namespace or "").split(",") if p.strip()]
    pods = []
    for name in names or [None]:
        pods.extend(await kube.list_pods(name))
    own = [pod for pod in pods if _own(pod)]
    report = CleanupReport(pods=len(pods), own=len(own))
    log.info("%d of %d pods carry a cost podcost wrote%s", len(own), len(pods),
             " (dry run: nothing is removed)" if dry_run else "")  # fmt: skip
    outcomes = await asyncio.gather(*(cleaner.remove(pod) for pod in own))
    report.outcomes.update(outcomes)
    report.seconds = time.monotonic() - started
    return report
