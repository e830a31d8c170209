"""Retrying what the bus says may succeed later: our code, never a framework's default.

The ranker and the aggregator publish through :func:`retry_transient`: a ``BusError`` marked
``retriable`` (broker unreachable, leader moving, timeout) is retried after a growing delay for
as long as it takes, so nothing is committed before its output is acknowledged; any other error
propagates to the caller, who dead-letters or stops.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from podcost_bus import BusError

log = logging.getLogger("podcost.retry")

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: ``first_s``, then times ``factor`` per attempt, at most ``max_s``."""

    first_s: float = 0.1
    max_s: float = 5.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s or self.factor < 1:
            raise ValueError(f"invalid backoff {self!r}")

    def delay(self, attempt: int) -> float:
        """The wait before retry number ``attempt`` (1 = the first retry)."""
        return min(self.max_s, self.first_s * self.factor ** max(0, attempt - 1))


#: What the services use unless told otherwise: 0.1 s doubling up to 5 s.
DEFAULT_BACKOFF = Backoff()


async def retry_transient(
    call: Callable[[], Awaitable[R]],
    *,
    what: str,
    sleep: Callable[[float], Awaitable[None]],
    backoff: Backoff = DEFAULT_BACKOFF,
) -> R:
    """``await call()`` until it succeeds; retriable ``BusError`` s are retried (and logged),
    anything else propagates. ``what`` names the call in the log."""
    attempt = 0
    while True:
        try:
            return await call()
        except BusError as error:
            if not error.retriable:
                raise
            attempt += 1
            delay = backoff.delay(attempt)
            log.warning(
                "%s failed (attempt %d), retrying in %.2fs: %s", what, attempt, delay, error
            )
            await sleep(delay)
