"""A fake clock for asyncio code that takes a clock: time moves only when a test says so.

Implements ``podcost_kube.debounce.Clock`` (``now`` and ``sleep``). ``advance`` wakes the
sleepers in deadline order, each at its own deadline, and lets the woken tasks run until they
block again, so a test reads like a timeline and never really sleeps. Used by the debouncer
tests; any component that takes a ``Clock`` can use it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

#: How many times ``settle`` yields to the loop: enough for a woken task to run a few awaits
#: deep and block again (no real I/O is involved, so this is deterministic).
SETTLE_ROUNDS = 20


class FakeClock:
    """Monotonic seconds starting at ``start``; sleepers wake only through :meth:`advance`."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + max(0.0, seconds), next(self._order), wake))
        await wake

    @property
    def sleepers(self) -> int:
        """How many tasks sleep on this clock now."""
        return sum(1 for _, _, wake in self._sleepers if not wake.done())

    async def settle(self) -> None:
        """Let every runnable task run until it blocks."""
        for _ in range(SETTLE_ROUNDS):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, waking each sleeper at its own deadline."""
        await self.advance_to(self._now + seconds)

    async def advance_to(self, when: float) -> None:
        """Move time on to ``when`` (never back), waking each sleeper at its own deadline."""
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= when:
            deadline, _, wake = heapq.heappop(self._sleepers)
            if wake.done():  # its sleeper was cancelled
                continue
            self._now = max(self._now, deadline)
            wake.set_result(None)
            await self.settle()
        self._now = max(self._now, when)
        await self.settle()
