"""Retrying what the bus says may succeed later: our code, never a framework's default.

The ranker, the aggregator and the annotator publish (and commit) through
:func:`retry_transient`: a ``BusError`` marked ``retriable`` (broker unreachable, leader moving,
timeout) is retried, after a wait by the process's one retry policy
(``podcost_core.backoff.Backoff``, full jitter, from ``ServiceSettings.backoff``), for as long as
it takes, so nothing is committed before its output is acknowledged; any other error propagates
to the caller, who dead-letters or stops.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from podcost_bus import BusError
from podcost_core.backoff import Backoff, Random

log = logging.getLogger("podcost.retry")

R = TypeVar("R")

#: The policy of a service built without settings (tests): ``ServiceSettings``' defaults.
DEFAULT_BACKOFF = Backoff()


async def retry_transient(
    call: Callable[[], Awaitable[R]],
    *,
    what: str,
    sleep: Callable[[float], Awaitable[None]],
    backoff: Backoff = DEFAULT_BACKOFF,
    rng: Random = random.random,
) -> R:
    """``await call()`` until it succeeds; retriable ``BusError`` s are retried (and logged)
    after ``backoff``'s wait, anything else propagates. ``what`` names the call in the log."""
    attempt = 0
    while True:
        try:
            return await call()
        except BusError as error:
            if not error.retriable:
                raise
            attempt += 1
            delay = backoff.delay(attempt, rng)
            log.warning(
                "%s failed (attempt %d), retrying in %.2fs: %s", what, attempt, delay, error
            )
            await sleep(delay)
