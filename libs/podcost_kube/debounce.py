"""Per-workload debouncing: a burst of changes to one workload becomes one emission.

The watcher's informer handler calls :meth:`Debouncer.touch` for every workload a change
touches (``podcost_kube.workloads.touched_by``); the watcher's publishing loop iterates the
debouncer and, for each :class:`Emission`, builds that workload's snapshot from the cache as it
is *then* and publishes it with the emission's version. Because the consumer pulls, a slow
consumer is its own backpressure: touches that arrive meanwhile coalesce into the next emission.

Timing, per key: an emission is due ``window`` seconds after the last touch (the burst has gone
quiet), and never later than ``max_delay`` after the first touch of the burst (a workload under
constant churn is still published). Versions start after the ones given (so a restarted watcher
can continue them) and grow by one per emission of that key.

What it keeps per key lives as long as the key is live: a burst until it is emitted, and the
key's last version until its owner forgets it (:meth:`Debouncer.forget`; the watcher does when
a workload is gone), so that a cluster whose workloads come and go under new names does not
pile up a version per name it ever saw. A key seen again after that starts above every version
forgotten, so its versions never repeat one it had.

Time comes from an injectable :class:`Clock`, so tests run on a fake clock without sleeping.
Uses no task of its own: stopping means cancelling the task that iterates it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


class Clock(Protocol):
    """Monotonic time in seconds, and a way to wait for it to pass."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """The running event loop's monotonic clock: the production :class:`Clock`."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class Emission(Generic[K]):
    """One debounced change of one key."""

    key: K
    version: int
    """1 + the key's previous version: one more per emission of this key (after
    :meth:`Debouncer.forget`, above every version forgotten)."""
    touches: int
    """How many touches this emission stands for."""
    first_touch: float
    """Clock time of the first touch of the burst (for event-to-publish latency)."""
    last_touch: float


@dataclass(slots=True)
class _Burst:
    first: float
    last: float
    touches: int


class Debouncer(Generic[K]):
    """Coalesces touches per key; iterate it (``async for emission in debouncer``) to get them.

    Meant for one consumer; several would share the emissions between them.
    """

    def __init__(
        self,
        *,
        window: float,
        max_delay: float,
        clock: Clock | None = None,
        versions: Mapping[K, int] | None = None,
    ) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        if max_delay < window:
            raise ValueError(f"max_delay ({max_delay}) must be at least the window ({window})")
        self.window = window
        self.max_delay = max_delay
        self._clock: Clock = clock or LoopClock()
        self._versions: dict[K, int] = dict(versions or {})
        self._forgotten = 0
        """The highest version of a key forgotten: where a key without a version starts."""
        self._bursts: dict[K, _Burst] = {}
        # One entry per pending key: (when it was last known to be due, tie-breaker, key).
        self._due: list[tuple[float, int, K]] = []
        self._order = itertools.count()
        self._touched = asyncio.Event()

    @property
    def pending(self) -> int:
        """How many keys wait for an emission."""
        return len(self._bursts)

    @property
    def versions_kept(self) -> int:
        """How many keys have a version kept (emitted and not forgotten)."""
        return len(self._versions)

    def version(self, key: K) -> int:
        """The version of ``key``'s last emission (0 before the first; after :meth:`forget`,
        the highest version forgotten)."""
        return self._versions.get(key, self._forgotten)

    def forget(self, key: K) -> None:
        """Drop ``key``'s version (its workload is gone); a burst of it pending stays. Its next
        emission, if any, is numbered above every version forgotten, so never one it had."""
        version = self._versions.pop(key, None)
        if version is not None and version > self._forgotten:
            self._forgotten = version

    def forget_all(self) -> None:
        """:meth:`forget` every key (a watcher that stops leading: what it published is the next
        leader's to follow)."""
        if self._versions:
            self._forgotten = max(self._forgotten, *self._versions.values())
            self._versions.clear()

    def touch(self, key: K) -> None:
        """Note one change of ``key``."""
        now = self._clock.now()
        burst = self._bursts.get(key)
        if burst is not None:
            burst.last = now
            burst.touches += 1
            return
        self._bursts[key] = _Burst(now, now, 1)
        # A new burst is never due before the earliest pending one (same window, later start),
        # so a consumer sleeping until that one needs no wake-up; one waiting for any touch does.
        heapq.heappush(self._due, (now + self.window, next(self._order), key))
        self._touched.set()

    def touch_all(self, keys: Iterable[K]) -> None:
        """Note one change of each of ``keys``."""
        for key in keys:
            self.touch(key)

    def take(self, keys: Iterable[K]) -> list[Emission[K]]:
        """Emit ``keys`` now, without waiting for their window: each key's pending burst (or a
        new one-touch burst) as one emission, in the order given; a key given twice once.

        For work that is due at once, such as the watcher's first pass after a start, where a
        quiet window would only delay the first decisions.
        """
        now = self._clock.now()
        emissions: list[Emission[K]] = []
        for key in dict.fromkeys(keys):
            burst = self._bursts.pop(key, None) or _Burst(now, now, 1)
            version = self.version(key) + 1
            self._versions[key] = version
            emissions.append(Emission(key, version, burst.touches, burst.first, burst.last))
        # Their queue entries stay; ``next`` drops an entry whose key has no burst left.
        return emissions

    def _deadline(self, burst: _Burst) -> float:
        return min(burst.last + self.window, burst.first + self.max_delay)

    async def next(self) -> Emission[K]:
        """Wait for the next due key and emit it."""
        while True:
            if not self._due:
                self._touched.clear()
                await self._touched.wait()
                continue
            noted, _, key = self._due[0]
            burst = self._bursts.get(key)
            if burst is None:  # emitted by ``take``
                heapq.heappop(self._due)
                continue
            due = self._deadline(burst)
            if due > noted:  # touched since it was queued: it is due later now
                heapq.heapreplace(self._due, (due, next(self._order), key))
                continue
            now = self._clock.now()
            if due > now:
                await self._clock.sleep(due - now)
                continue
            heapq.heappop(self._due)
            del self._bursts[key]
            version = self.version(key) + 1
            self._versions[key] = version
            return Emission(key, version, burst.touches, burst.first, burst.last)

    def __aiter__(self) -> Debouncer[K]:
        return self

    async def __anext__(self) -> Emission[K]:
        return await self.next()
