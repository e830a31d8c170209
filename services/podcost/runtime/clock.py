"""Wall-clock time for the services whose timestamps travel or are stored: the ranker and the
aggregator stamp messages with it and count deadlines in it (a deadline stored in a faust table
must keep its meaning in the next process, which a monotonic clock would not).

Their composition roots take a :class:`Clock`; tests pass ``tests.support.clock.FakeClock``,
which moves only when told to.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """POSIX seconds, and a way to wait for them to pass."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    """The system's clock: the production :class:`Clock`."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
