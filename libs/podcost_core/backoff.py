"""How long to wait before trying again: the one retry policy of podcost.

Every retry podcost makes waits by this policy: the services' publishes on the bus
(``podcost.runtime.retry``), the informers' relists after an API server failure
(``podcost_kube.informer``) and the annotator's writes that conflict, are throttled or find the
server unavailable. Capped exponential backoff with *full jitter*: the n-th wait is drawn
uniformly from ``[0, min(maximum, initial × factor^(n-1))]``, so clients that failed together
(every replica when the broker or API server went away) do not come back in step and hammer it
again together. A wait is never shorter than what the server asked for (``Retry-After``).

Pure: the random source is a parameter (tests pass a fixed one); nothing here sleeps.
Configured once per process from the ``PODCOST_RETRY_*`` settings (``ServiceSettings.backoff``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

#: A source of uniform random numbers in [0, 1]: ``random.random`` or a test's own.
Random = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with full jitter, and how many failures in a row to bear."""

    initial_seconds: float = 0.2
    """The ceiling of the first wait."""
    maximum_seconds: float = 10.0
    """No wait is longer than this (unless the server asks for longer)."""
    factor: float = 2.0
    """How much the ceiling grows per failure."""
    max_failures: int | None = None
    """Failures in a row after which the caller gives up; ``None``: never."""

    def __post_init__(self) -> None:
        if not 0 < self.initial_seconds <= self.maximum_seconds:
            raise ValueError(
                f"backoff needs 0 < initial ({self.initial_seconds}) <= maximum "
                f"({self.maximum_seconds})"
            )
        if self.factor < 1:
            raise ValueError(f"backoff factor must be >= 1, got {self.factor}")
        if self.max_failures is not None and self.max_failures < 1:
            raise ValueError(f"backoff max_failures must be >= 1 or None, got {self.max_failures}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait after failed attempt ``attempt`` (1 = the first try failed)."""
        if attempt < 1:
            raise ValueError(f"attempts are counted from 1, got {attempt}")
        exponent = attempt - 1
        # Compared in logarithms: factor ** exponent overflows a float after a long outage.
        if exponent * math.log(self.factor) >= math.log(
            self.maximum_seconds / self.initial_seconds
        ):
            return self.maximum_seconds
        return self.initial_seconds * self.factor**exponent

    def delay(self, attempt: int, rng: Random, *, at_least: float | None = None) -> float:
        """The wait after failed attempt ``attempt``: uniform in ``[0, ceiling(attempt)]``
        (``rng()`` in ``[0, 1]`` scales it; a test's ``lambda: 1.0`` waits the ceiling itself),
        and never less than ``at_least`` (the server's ``Retry-After``)."""
        drawn = rng()
        if not 0 <= drawn <= 1:
            raise ValueError(f"the random source gave {drawn}, not a number in [0, 1]")
        return max(drawn * self.ceiling(attempt), at_least or 0.0)

    def exhausted(self, failures: int) -> bool:
        """Whether ``failures`` in a row are too many to try again."""
        return self.max_failures is not None and failures >= self.max_failures

    def giving_up_after(self, failures: int) -> Backoff:
        """The same policy that gives up after ``failures`` in a row."""
        return Backoff(self.initial_seconds, self.maximum_seconds, self.factor, failures)
