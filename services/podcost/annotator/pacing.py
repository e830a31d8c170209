"""How fast the annotator talks to the API server and reads the bus: pure arithmetic on time.

The annotator's writer (``podcost.annotator.writer``) asks :class:`TokenBucket` how long each
request must wait and tells :class:`Outage` what became of each request, its backlog
(``podcost.annotator.backlog``) asks :class:`WaterMarks` when to pause and resume its consumer,
and readiness (``AnnotatorService.ready``) asks :class:`Outage` whether the API server has been
failing long enough to say so (how long a retry waits is ``podcost_core.backoff``). None of
them sleeps or reads a clock: the caller passes "now" in and does the waiting, through a
:class:`Clock` that tests replace with a fake one.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


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


class TokenBucket:
    """``rate`` requests per second on average, up to ``burst`` at once after a quiet spell.

    :meth:`reserve` takes a token now and says how long to wait before using it; tokens may go
    negative, so waiting callers are served in the order they reserved (as golang.org/x/time's
    ``Limiter.Reserve``, which client-go's rate limiter builds on). :meth:`hold` stops handing
    out tokens until a given time and then restarts at one token, without a burst: a 429 with
    ``Retry-After`` slows every request down, not only the one that got it.
    """

    def __init__(self, rate: float, burst: int, *, now: float = 0.0) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a positive number of requests per second, got {rate}")
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._at = now
        """The time ``_tokens`` is counted at; in the future while held."""

    def reserve(self, now: float) -> float:
        """Take one token at ``now``; the seconds to wait before the request may go (0: now)."""
        self._refill(now)
        self._tokens -= 1.0
        deficit = max(0.0, -self._tokens) / self.rate
        return max(0.0, self._at - now + deficit)

    def hold(self, until: float) -> None:
        """Hand out no token that may be used before ``until``."""
        if until > self._at:
            self._tokens = min(self._tokens, 1.0)
            self._at = until

    def available(self, now: float) -> float:
        """Tokens at ``now`` (negative: that many requests are already waiting)."""
        self._refill(now)
        return self._tokens

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
            self._at = now


class Flow(StrEnum):
    """What :meth:`WaterMarks.observe` asks of the consumer."""

    PAUSE = "pause"
    RESUME = "resume"


@dataclass(slots=True)
class WaterMarks:
    """Pause consuming when ``high`` writes are pending, resume once they drop to ``low``.

    The gap between the marks keeps the consumer from flapping on every write.
    """

    high: int
    low: int
    paused: bool = False
    pauses: int = 0
    """How many times consumption was paused."""
    resumes: int = 0
    deepest: int = 0
    """The most writes ever pending at once."""

    def __post_init__(self) -> None:
        if not 0 <= self.low < self.high:
            raise ValueError(f"need 0 <= low < high, got low={self.low}, high={self.high}")

    def observe(self, depth: int) -> Flow | None:
        """The depth now; a :class:`Flow` when the consumer must change state."""
        self.deepest = max(self.deepest, depth)
        if not self.paused and depth >= self.high:
            self.paused = True
            self.pauses += 1
            return Flow.PAUSE
        if self.paused and depth <= self.low:
            self.paused = False
            self.resumes += 1
            return Flow.RESUME
        return None


@dataclass(slots=True)
class Outage:
    """Whether the API server has been failing for too long: what readiness reports.

    :meth:`failed` is called with every request that got no answer (5xx, a timeout, a refused
    connection), :meth:`answered` with every one that got an answer; the outage lasts from the
    first failure after an answer until the next answer. ``after`` is how long it may last
    before :meth:`down` says so (a blip of a few failed requests is retried, not reported).
    """

    after: float
    since: float | None = None
    """When the failures began; ``None`` while the server answers."""
    reported: bool = False
    """Whether this outage was reported (logged) as one already."""

    def failed(self, now: float) -> None:
        if self.since is None:
            self.since = now

    def answered(self, now: float) -> float | None:
        """The server answered at ``now``; how long the outage lasted if it was reported as
        one, else ``None``."""
        since, reported = self.since, self.reported
        self.since, self.reported = None, False
        return None if since is None or not reported else now - since

    def down(self, now: float) -> bool:
        """Whether the failures have lasted ``after`` seconds or more by ``now``."""
        return self.since is not None and now - self.since >= self.after

    def lasted(self, now: float) -> float:
        """Seconds the current outage has lasted at ``now`` (0 while the server answers)."""
        return 0.0 if self.since is None else now - self.since
