"""Kubernetes Events (``events.k8s.io/v1``) about what podcost did, where operators look first:
``kubectl describe deployment/x`` and ``kubectl get events``.

The watcher and the annotator call :meth:`EventRecorder.record` (synchronous, never waits for the
API server); :meth:`EventRecorder.run` writes in the background. Like client-go's recorder
(``k8s.io/client-go/tools/events`` with the spam filter of ``tools/record``), it keeps the API
server's load bounded whatever happens:

- **Series**: an event that repeats one already written (same object, reason, action and type)
  within ``series_window_seconds`` is not written again: the first repeat patches the event's
  ``series`` (count 2), later ones are counted and flushed at most every
  ``series_flush_seconds``. The note of the first occurrence stays.
- **Per-object budget**: a token bucket per object (``burst`` events, one more every
  ``refill_seconds``) caps new events and first repeats; past it they are dropped, counted.
- **Bounded memory and queue**: at most ``queue_limit`` writes wait, and at most
  :data:`MAX_TRACKED` series and budgets are remembered (the oldest are forgotten first). A
  series is forgotten once its window has passed, and a budget once it has refilled (it is then
  what a new one would be), so what is remembered follows the objects told of lately, not every
  object ever told of (workloads and pods that come and go under new names).

Events are best effort: a write the API server refuses is logged and dropped, never retried
into a loop, and never stops the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

from podcost_kube.client import KubeError

log = logging.getLogger("podcost.events")

JSON = dict[str, Any]
EventType = Literal["Normal", "Warning"]

#: Series and budgets remembered at most (each a few hundred bytes).
MAX_TRACKED = 4096
#: The API server's limit on an event's note.
MAX_NOTE = 1024


@dataclass(frozen=True)
class ObjectRef:
    """The object an event is about (``regarding``); ``kubectl describe`` finds events by its
    kind, name, namespace and uid."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    def as_json(self) -> JSON:
        ref: JSON = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
        }
        if self.uid:
            ref["uid"] = self.uid
        return ref

    @classmethod
    def of(cls, obj: Mapping[str, Any], *, api_version: str = "", kind: str = "") -> ObjectRef:
        """The reference of an object's JSON (``apiVersion``/``kind`` given when the JSON, as a
        list or a watch serves it, has none)."""
        meta = obj.get("metadata") or {}
        return cls(
            api_version=str(obj.get("apiVersion") or api_version),
            kind=str(obj.get("kind") or kind),
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
        )


@dataclass(frozen=True)
class EventSettings:
    """How many events the recorder writes (see the module docstring)."""

    enabled: bool = True
    burst: int = 25
    """New events (and first repeats) one object may get at once."""
    refill_seconds: float = 300.0
    """Seconds until one object may get one more."""
    series_window_seconds: float = 360.0
    """A repeat within this long of the last occurrence counts into the series."""
    series_flush_seconds: float = 30.0
    """Longest a series' count waits to be written."""
    queue_limit: int = 1000
    """Writes that may wait; more are dropped."""


@runtime_checkable
class EventSink(Protocol):
    """What the recorder needs of the Kubernetes adapter (``podcost_kube.client.Kube``)."""

    async def create_event(self, namespace: str, body: JSON) -> JSON:
        """POST an ``events.k8s.io/v1`` Event."""
        ...

    async def patch_event(self, namespace: str, name: str, patch: JSON) -> JSON:
        """Merge-patch an Event."""
        ...


@dataclass
class _Series:
    namespace: str
    name: str
    count: int = 1
    last: float = 0.0
    """When (monotonic) it last occurred."""
    last_wall: float = 0.0
    written: int = 1
    """The count the API server has."""
    flushed_at: float = 0.0
    created: bool = False


@dataclass
class _Bucket:
    tokens: float
    at: float


def _micro_time(wall: float) -> str:
    """A ``MicroTime`` (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class EventRecorder:
    """Records events about objects (see the module docstring). ``controller`` is the
    ``reportingController`` (``podcost.dev/annotator``), ``instance`` this replica (its pod)."""

    sink: EventSink
    controller: str
    instance: str
    settings: EventSettings = field(default_factory=EventSettings)
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    counts: Counter[str] = field(default_factory=Counter)
    """Occurrences by outcome: created, series, patched, dropped_budget, dropped_queue,
    failed (read by tests and logged)."""

    def __post_init__(self) -> None:
        self._series: OrderedDict[tuple[str, ...], _Series] = OrderedDict()
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._queue: deque[tuple[str, _Series, JSON]] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def record(
        self,
        regarding: ObjectRef,
        *,
        type: EventType,
        reason: str,
        action: str,
        note: str,
    ) -> None:
        """Note one occurrence; the write (if any) happens in :meth:`run`."""
        if not self.settings.enabled or not regarding.name or not regarding.namespace:
            return
        now = self.monotonic()
        target = regarding.uid or f"{regarding.namespace}/{regarding.kind}/{regarding.name}"
        key = (target, reason, action, type)
        series = self._series.get(key)
        if series is not None and now - series.last < self.settings.series_window_seconds:
            series.count += 1
            series.last, series.last_wall = now, self.wall()
            self._series.move_to_end(key)
            self.counts["series"] += 1
            # The first repeat is written at once (so `describe` shows a series), if the
            # object's budget allows; later ones wait for the flush.
            if series.count == 2 and series.created and self._take(target, now):
                self._enqueue("patch", series, {})
                series.flushed_at = now
            return
        if not self._take(target, now):
            self.counts["dropped_budget"] += 1
            return
        wall = self.wall()
        name = f"{regarding.name}.{time.time_ns():x}"
        series = _Series(regarding.namespace, name, last=now, last_wall=wall, flushed_at=now)
        body: JSON = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": regarding.namespace},
            "eventTime": _micro_time(wall),
            "reportingController": self.controller,
            "reportingInstance": self.instance[:128],
            "action": action,
            "reason": reason,
            "type": type,
            "note": note if len(note) <= MAX_NOTE else note[: MAX_NOTE - 3] + "...",
            "regarding": regarding.as_json(),
        }
        if self._enqueue("create", series, body):
            self._series[key] = series
            self._series.move_to_end(key)
            while len(self._series) > MAX_TRACKED:
                self._series.popitem(last=False)

    def _take(self, target: str, now: float) -> bool:
        """One token of ``target``'s budget, if it has one."""
        bucket = self._buckets.get(target)
        burst = float(self.settings.burst)
        if bucket is None:
            bucket = self._buckets[target] = _Bucket(burst, now)
            while len(self._buckets) > MAX_TRACKED:
                self._buckets.popitem(last=False)
        else:
            refill = self.settings.refill_seconds
            gained = (now - bucket.at) / refill if refill > 0 else burst
            bucket.tokens, bucket.at = min(burst, bucket.tokens + gained), now
            self._buckets.move_to_end(target)
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _enqueue(self, what: str, series: _Series, body: JSON) -> bool:
        if len(self._queue) >= self.settings.queue_limit:
            self.counts["dropped_queue"] += 1
            return False
        self._queue.append((what, series, body))
        self._idle.clear()
        self._wake.set()
        return True

    @property
    def tracked(self) -> tuple[int, int]:
        """How many series and budgets are remembered now."""
        return len(self._series), len(self._buckets)

    async def idle(self) -> None:
        """Return once every queued write is done (tests; a flush at shutdown)."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write queued events and flush series counts until cancelled. Off, it writes nothing
        and still lasts until cancelled: the services run it beside their other tasks, and a
        task of theirs that ends ends the service (a dry-run watcher would stop once synced)."""
        if not self.settings.enabled:
            await asyncio.Event().wait()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.series_flush_seconds)
            self._wake.clear()
            while self._queue:
                what, series, body = self._queue.popleft()
                await self._write(what, series, body)
            self._idle.set()
            await self._flush_series()

    async def flush(self) -> None:
        """Write every series count the API server does not have yet (at once)."""
        await self._flush_series(force=True)

    async def _flush_series(self, *, force: bool = False) -> None:
        now = self.monotonic()
        for key, series in list(self._series.items()):
            if series.created and series.count > series.written:
                if force or now - series.flushed_at >= self.settings.series_flush_seconds:
                    series.flushed_at = now
                    await self._write("patch", series, {})
            elif now - series.last >= self.settings.series_window_seconds:
                self._series.pop(key, None)  # closed: a later occurrence starts a new event
        burst, refill = float(self.settings.burst), self.settings.refill_seconds
        for target, bucket in list(self._buckets.items()):
            if refill <= 0 or bucket.tokens + (now - bucket.at) / refill >= burst:
                del self._buckets[target]  # refilled: the same as a new one

    async def _write(self, what: str, series: _Series, body: JSON) -> None:
        try:
            if what == "create":
                await self.sink.create_event(series.namespace, body)
                series.created = True
                self.counts["created"] += 1
                return
            if not series.created or series.count <= series.written:
                return
            count = series.count
            patch = {"series": {"count": count, "lastObservedTime": _micro_time(series.last_wall)}}
            await self.sink.patch_event(series.namespace, series.name, patch)
            series.written = count
            self.counts["patched"] += 1
        except KubeError as error:  # best effort: an event never stops the service
            self.counts["failed"] += 1
            series.written = series.count  # not tried again until it repeats
            log.warning("could not write event %s/%s: %s", series.namespace, series.name, error)
