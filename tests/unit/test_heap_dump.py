"""``PODCOST_HEAP_DUMP``: the debugging aid that attributes a process's memory."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import platform
import signal
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.bench.heap_diff import diff

from podcost.runtime import heap
from podcost.runtime.heap import heap_dumps_on_signal, trim_heap


@pytest.fixture
def restored() -> Iterator[None]:
    handler = signal.getsignal(signal.SIGUSR1)
    tracing = tracemalloc.is_tracing()
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, handler)
        if not tracing:
            tracemalloc.stop()


def test_without_the_variable_nothing_is_traced(restored: None) -> None:
    assert heap_dumps_on_signal({}) is None
    assert signal.getsignal(signal.SIGUSR1) is not None


def test_each_sigusr1_dumps_the_traced_heap_and_the_diff_names_what_grew(
    tmp_path: Path, restored: None
) -> None:
    directory = heap_dumps_on_signal({"PODCOST_HEAP_DUMP": str(tmp_path / "heap")})
    assert directory == tmp_path / "heap"
    assert tracemalloc.is_tracing()
    os.kill(os.getpid(), signal.SIGUSR1)
    kept = [bytearray(1000) for _ in range(500)]  # this line grows by 500 KB
    os.kill(os.getpid(), signal.SIGUSR1)
    assert (directory / "heap-1.txt").read_text().startswith("traced ")
    lines = diff(str(directory / "heap-1.tracemalloc"), str(directory / "heap-2.tracemalloc"),
                 by="lineno", top=5, pods=500, frames=1)  # fmt: skip
    assert lines[0].startswith("traced: ")
    assert "test_heap_dump.py" in "\n".join(lines[1:3])
    assert len(kept) == 500


def test_with_no_frames_nothing_is_traced_and_the_dump_is_the_allocators_account(
    tmp_path: Path, restored: None
) -> None:
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is on for the whole test run")
    directory = heap_dumps_on_signal(
        {"PODCOST_HEAP_DUMP": str(tmp_path), "PODCOST_HEAP_DUMP_FRAMES": "0"}
    )
    assert directory == tmp_path
    assert not tracemalloc.is_tracing()
    os.kill(os.getpid(), signal.SIGUSR1)
    lines = (tmp_path / "heap-1.txt").read_text().splitlines()
    assert lines[0].startswith("rss ")
    assert any(line.startswith("pymalloc: # bytes in allocated blocks") for line in lines)
    if platform.libc_ver()[0] == "glibc":
        assert any(line.startswith("malloc: heap ") for line in lines)
    [mappings] = [line for line in lines if line.startswith("mappings: ")]
    assert "anonymous " in mappings
    assert not (tmp_path / "heap-1.tracemalloc").exists()


def test_trimming_the_heap_gives_freed_buffers_back_on_glibc() -> None:
    if platform.libc_ver()[0] != "glibc":
        assert trim_heap() is False  # no such call: nothing is done
        return
    # Buffers under glibc's mmap threshold, each with a small one after it that stays: freed,
    # they are holes in malloc's heap that free() cannot give back by itself.
    buffers: list[bytearray] = []
    kept: list[bytearray] = []
    for _ in range(800):
        buffers.append(bytearray(64 * 1024))
        buffers[-1][::4096] = b"x" * 16  # touched: resident
        kept.append(bytearray(1024))
    del buffers
    freed = _rss()
    assert trim_heap() is True
    assert _rss() < freed - 8 * 2**20  # of the 50 MiB freed; without the trim: none
    assert len(kept) == 800


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_trim_forever_trims_every_period_until_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[float] = []
    three = asyncio.Event()

    def trim() -> bool:
        trims.append(time.monotonic())
        if len(trims) == 3:
            three.set()
        return True

    monkeypatch.setattr(heap, "trim_heap", trim)
    task = asyncio.create_task(heap.trim_forever(0.01))
    await asyncio.sleep(0.005)
    assert trims == []  # not at once: the service has just settled
    await asyncio.wait_for(three.wait(), 5)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    count = len(trims)
    await asyncio.sleep(0.03)
    assert len(trims) == count
    assert all(b - a >= 0.009 for a, b in itertools.pairwise(trims))


def test_traced_from_the_first_signal_the_second_dump_holds_what_grew_since(
    tmp_path: Path, restored: None
) -> None:
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is already on in this process (python -X tracemalloc)")
    environ = {"PODCOST_HEAP_DUMP": str(tmp_path / "heap"), "PODCOST_HEAP_DUMP_FROM": "signal"}
    directory = heap_dumps_on_signal(environ)
    assert directory is not None
    before = [bytearray(1000) for _ in range(500)]  # allocated before the signal: not traced
    assert not tracemalloc.is_tracing()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert tracemalloc.is_tracing()
    kept = [bytearray(1000) for _ in range(300)]  # this line grows by 300 KB
    os.kill(os.getpid(), signal.SIGUSR1)
    first = tracemalloc.Snapshot.load(str(directory / "heap-1.tracemalloc"))
    assert sum(trace.size for trace in first.traces) < 100_000
    lines = diff(str(directory / "heap-1.tracemalloc"), str(directory / "heap-2.tracemalloc"),
                 by="lineno", top=3, pods=0, frames=1)  # fmt: skip
    assert "test_heap_dump.py" in lines[1]
    grown = int(lines[1].split()[2].replace(",", ""))  # the bytes column
    assert 300_000 <= grown < 400_000  # the 300 arrays after the signal, not the 500 before
    assert (len(before), len(kept)) == (500, 300)
