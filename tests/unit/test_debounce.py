"""The per-workload debouncer, on a fake clock: bursts become one emission, churn still emits
by the maximum delay, and versions grow by one per emission of each key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest
from tests.support.clock import FakeClock
from tests.support.tasks import leak_check

from podcost_kube.debounce import Debouncer, Emission

WINDOW = 1.0
MAX_DELAY = 3.0


@dataclass(frozen=True)
class Case:
    """Touches at the given times; the emissions expected as (time, key, version, touches)."""

    name: str
    touches: Sequence[tuple[float, str]]
    expected: Sequence[tuple[float, str, int, int]]
    until: float = 30.0


def every(start: float, step: float, stop: float, key: str = "a") -> list[tuple[float, str]]:
    count = round((stop - start) / step)
    return [(start + step * i, key) for i in range(count)]


CASES = [
    Case(
        "a single touch is emitted one window later as version 1",
        touches=[(0.5, "a")],
        expected=[(1.5, "a", 1, 1)],
    ),
    Case(
        "a burst of a hundred touches within the window becomes one emission",
        touches=every(0.0, 0.005, 0.5),
        expected=[(0.495 + WINDOW, "a", 1, 100)],
    ),
    Case(
        "touches further apart than the window are emitted one by one with growing versions",
        touches=[(0.0, "a"), (2.5, "a"), (5.0, "a")],
        expected=[(1.0, "a", 1, 1), (3.5, "a", 2, 1), (6.0, "a", 3, 1)],
    ),
    Case(
        "a workload under constant churn is still emitted every maximum delay",
        touches=every(0.25, 0.5, 10.25),
        # Each burst is cut off MAX_DELAY after its first touch; the touch that falls on the
        # cut-off starts the next burst. The last one ends one window after the last touch.
        expected=[(3.25, "a", 1, 6), (6.25, "a", 2, 6), (9.25, "a", 3, 6), (10.75, "a", 4, 2)],
    ),
    Case(
        "two workloads are debounced independently, each with its own versions",
        touches=[(0.0, "a"), (0.4, "b"), (0.8, "a"), (3.0, "b")],
        expected=[(1.4, "b", 1, 1), (1.8, "a", 1, 2), (4.0, "b", 2, 1)],
    ),
    Case(
        "a touch just after an emission starts a new burst",
        touches=[(0.0, "a"), (1.01, "a")],
        expected=[(1.0, "a", 1, 1), (2.01, "a", 2, 1)],
    ),
    Case(
        "nothing is emitted while nothing is touched",
        touches=[],
        expected=[],
    ),
]


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    async with leak_check():
        yield


async def run_timeline(
    debouncer: Debouncer[str], clock: FakeClock, touches: Sequence[tuple[float, str]], until: float
) -> list[tuple[float, Emission[str]]]:
    """Touch at the given times on the fake clock, collecting emissions with their times."""
    emitted: list[tuple[float, Emission[str]]] = []

    async def consume() -> None:
        async for emission in debouncer:
            emitted.append((clock.now(), emission))

    consumer = asyncio.create_task(consume())
    try:
        for at, key in sorted(touches, key=lambda touch: touch[0]):
            await clock.advance_to(at)
            debouncer.touch(key)
        await clock.advance_to(until)
    finally:
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
    return emitted


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_debouncing(case: Case) -> None:
    clock = FakeClock()
    debouncer: Debouncer[str] = Debouncer(window=WINDOW, max_delay=MAX_DELAY, clock=clock)
    emitted = await run_timeline(debouncer, clock, case.touches, case.until)
    got = [(e.key, e.version, e.touches) for _, e in emitted]
    assert got == [expected[1:] for expected in case.expected]
    assert [at for at, _ in emitted] == pytest.approx([expected[0] for expected in case.expected])
    assert debouncer.pending == 0


async def test_an_emission_says_when_its_burst_began_and_ended() -> None:
    clock = FakeClock(start=100.0)
    debouncer: Debouncer[str] = Debouncer(window=WINDOW, max_delay=MAX_DELAY, clock=clock)
    [(_, emission)] = await run_timeline(
        debouncer, clock, [(100.0, "a"), (100.5, "a"), (100.9, "a")], until=110.0
    )
    assert (emission.first_touch, emission.last_touch) == (100.0, 100.9)


async def test_versions_continue_from_the_ones_given_at_start() -> None:
    clock = FakeClock()
    debouncer: Debouncer[str] = Debouncer(
        window=WINDOW, max_delay=MAX_DELAY, clock=clock, versions={"a": 41}
    )
    emitted = await run_timeline(debouncer, clock, [(0.0, "a"), (0.0, "b")], until=5.0)
    assert sorted((e.key, e.version) for _, e in emitted) == [("a", 42), ("b", 1)]
    assert (debouncer.version("a"), debouncer.version("b"), debouncer.version("c")) == (42, 1, 0)


async def test_a_consumer_waits_without_sleeping_until_the_first_touch() -> None:
    clock = FakeClock()
    debouncer: Debouncer[str] = Debouncer(window=WINDOW, max_delay=MAX_DELAY, clock=clock)
    waiting = asyncio.create_task(debouncer.next())
    await clock.advance(1000.0)
    assert not waiting.done()
    assert clock.sleepers == 0
    debouncer.touch("a")
    await clock.advance(WINDOW)
    assert (await waiting).version == 1


@pytest.mark.parametrize(
    ("window", "max_delay"),
    [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)],
    ids=["a zero window", "a negative window", "a maximum delay shorter than the window"],
)
def test_a_debouncer_refuses(window: float, max_delay: float) -> None:
    with pytest.raises(ValueError, match=r"window|max_delay"):
        Debouncer[str](window=window, max_delay=max_delay)


async def test_take_emits_at_once_what_would_have_waited_for_its_window() -> None:
    clock = FakeClock()
    debouncer: Debouncer[str] = Debouncer(
        window=WINDOW, max_delay=MAX_DELAY, clock=clock, versions={"b": 6}
    )
    debouncer.touch("a")
    await clock.advance(0.25)
    debouncer.touch("a")
    taken = debouncer.take(["a", "b", "a"])
    assert [(e.key, e.version, e.touches) for e in taken] == [("a", 1, 2), ("b", 7, 1)]
    assert (taken[0].first_touch, taken[0].last_touch) == (0.0, 0.25)
    assert debouncer.pending == 0
    # The queue entry of the burst taken is dropped; later touches debounce as before.
    emitted = await run_timeline(debouncer, clock, [(0.5, "a"), (0.5, "c")], until=10.0)
    got = [(at, e.key, e.version, e.touches) for at, e in emitted]
    assert got == [(1.5, "a", 2, 1), (1.5, "c", 1, 1)]
    assert debouncer.pending == 0


async def test_a_forgotten_key_keeps_no_version_and_counts_on_above_every_one_forgotten() -> None:
    clock = FakeClock()
    debouncer: Debouncer[str] = Debouncer(
        window=WINDOW, max_delay=MAX_DELAY, clock=clock, versions={"a": 41, "b": 6}
    )
    assert debouncer.versions_kept == 2
    debouncer.forget("a")
    debouncer.forget("never seen")
    assert debouncer.versions_kept == 1
    emitted = await run_timeline(debouncer, clock, [(0.0, "a"), (0.0, "c")], until=5.0)
    # Above 41, so "a" never repeats a version it had; "c" too, which is new.
    assert sorted((e.key, e.version) for _, e in emitted) == [("a", 42), ("c", 42)]
    debouncer.forget_all()
    assert debouncer.versions_kept == 0
    assert [e.version for e in debouncer.take(["b"])] == [43]


async def test_forgetting_a_key_leaves_its_pending_burst_to_be_emitted() -> None:
    clock = FakeClock()
    debouncer: Debouncer[str] = Debouncer(window=WINDOW, max_delay=MAX_DELAY, clock=clock)
    emitted = await run_timeline(debouncer, clock, [(0.0, "a")], until=2.0)
    assert [e.version for _, e in emitted] == [1]
    debouncer.touch("a")
    debouncer.forget("a")
    assert debouncer.pending == 1
    assert [e.version for e in debouncer.take(["a"])] == [2]
