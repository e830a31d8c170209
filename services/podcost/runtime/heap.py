"""The cyclic garbage collector's settings for a service that keeps a large heap for long.

The watcher (its informer cache) and the aggregator (every workload's state) call
:func:`settle_heap` once that heap is built (the aggregator over Kafka then keeps it so with a
:class:`HeapKeeper`, as its states keep being replaced): what lives as long as the process leaves
the collector's passes (``gc.freeze``), and the youngest generation is collected less often.
Decoding one pod event or one snapshot allocates hundreds of containers, so at CPython's default
threshold (700) a collection ran every few records and a full one, over the whole heap, every few
hundred: 12-17 % of the watcher's CPU in the whole-pipeline benchmark, about a fifth of the
aggregator's deciding in ``tests/bench/bench_aggregator.py``.

Settling also hands the C allocator's free memory back to the system (:func:`trim_heap`): building
that heap went through much larger transient buffers (a list's pages as received and parsed, the
first snapshots as encoded) that glibc's ``malloc`` otherwise keeps in its heap for good: about
10 MiB at 10,000 pods for ``podcost watcher`` (``tests/bench/bench_scale.py --service watcher``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import itertools
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

#: The youngest generation's threshold once settled (CPython's default is 700).
GC_THRESHOLD: Final = 20_000


def settle_heap() -> None:
    """Collect once, freeze what is left (imports, caches, states), raise the threshold, and
    give the allocator's free memory back (:func:`trim_heap`). Called again once more of the
    long-lived heap is built (the watcher's first pass), it freezes that too."""
    gc.collect()
    gc.freeze()
    youngest, middle, oldest = gc.get_threshold()
    gc.set_threshold(max(GC_THRESHOLD, youngest), middle, oldest)
    trim_heap()


#: How often :class:`HeapKeeper` collects the whole heap, what it froze included.
FULL_COLLECTION_EVERY_S: Final = 600.0


class HeapKeeper:
    """Keeps the collector's passes off a long-lived heap that keeps being replaced: the
    aggregator's states, where every decision replaces a workload's snapshot (a few hundred
    containers). Settled once, such a heap still fills the older generations again, and every
    full collection walks all of it: in ``tests/bench/bench_aggregator.py`` (5,000 workloads
    decided in about 10 s) the collector took 3.4 s of CPU after the start, a full pass over the
    states every few seconds and a middle-generation pass over each second's decisions.

    :meth:`tick`, once a second, turns the automatic collection off and freezes what survived
    since the last tick, so that no pass walks it; refcounting still frees what is replaced.
    What it cannot free are reference cycles that became garbage: once every ``full_every_s``
    the whole heap is collected, frozen part included, and frozen again (the bench found about
    300 unreachable objects after 3,000 decisions with the collector off: a slow trickle, which
    that pass bounds). The aggregator over Kafka runs one; embedded mode does not (its heap is
    mostly the watcher's cache, which :func:`settle_heap` keeps out of the passes)."""

    def __init__(
        self,
        *,
        full_every_s: float = FULL_COLLECTION_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._full_every_s = full_every_s
        self._clock = clock
        self._last_full = clock()

    def tick(self) -> bool:
        """Freeze what the collector tracks now; first collect everything (frozen part
        included) if the last full collection is ``full_every_s`` old. Returns whether it
        collected. The first tick turns the automatic collection off."""
        gc.disable()
        now = self._clock()
        full = now - self._last_full >= self._full_every_s
        if full:
            gc.unfreeze()
            gc.collect()
            self._last_full = now
        gc.freeze()
        return full

    def stop(self) -> None:
        """Turn the automatic collection back on (what was frozen stays so, as after
        :func:`settle_heap`)."""
        gc.enable()


#: How often :func:`trim_forever` hands ``malloc``'s free memory back.
TRIM_EVERY_S: Final = 5.0


async def trim_forever(every_s: float = TRIM_EVERY_S) -> None:
    """:func:`trim_heap` every ``every_s`` seconds, for as long as the service runs.

    ``free`` gives back only the top of ``malloc``'s heap: what each burst of work frees inside
    it (watch events decoded, snapshots encoded, HTTP requests served) stays resident until a
    trim. ``podcost watcher`` at 10,000 pods held 4-6 MB so (a third of what its cache holds),
    at its baseline as well as settled, more or less according to when it was read
    (``tests/bench/bench_scale.py --service watcher --heap-dump``: the dumps' ``malloc:`` and
    ``mappings:`` lines). A trim takes about a millisecond, so every few seconds costs
    nothing measurable; pages reused after it are faulted in again."""
    while True:
        await asyncio.sleep(every_s)
        trim_heap()


def trim_heap() -> bool:
    """glibc's ``malloc_trim(0)``: the free pages anywhere in ``malloc``'s heap go back to the
    system (a few milliseconds for tens of MiB). ``False`` where there is no such call (another
    C library): nothing is done."""
    trim = _libc("malloc_trim", ctypes.c_int, (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _libc(name: str, restype: Any, argtypes: tuple[Any, ...] = ()) -> Any:
    """The C library's function ``name`` with that signature, or ``None`` where it has none
    (not glibc)."""
    try:
        call = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    call.argtypes, call.restype = list(argtypes), restype
    return call


def freeze_imports() -> None:
    """Freeze what the imports built (it lives as long as the process) out of the collector's
    passes, before the services start: without it the first :func:`settle_heap` walks some
    80 000 import-time objects (0.1-0.2 s, blocking the event loop just before the first cost
    writes of a start) to find no garbage among them."""
    gc.freeze()


#: Set to a directory: the process traces its allocations and dumps them there on SIGUSR1.
HEAP_DUMP_ENV: Final = "PODCOST_HEAP_DUMP"
#: Frames kept per allocation when tracing (``PODCOST_HEAP_DUMP_FRAMES``).
HEAP_DUMP_FRAMES: Final = 12
#: Set to ``signal``: tracing starts at the first SIGUSR1, not at the start.
HEAP_DUMP_FROM_ENV: Final = "PODCOST_HEAP_DUMP_FROM"


def heap_dumps_on_signal(environ: Mapping[str, str] = os.environ) -> Path | None:
    """A debugging aid for memory, off unless ``PODCOST_HEAP_DUMP`` names a
    directory: then ``tracemalloc`` traces every allocation from here on (with
    ``PODCOST_HEAP_DUMP_FRAMES`` frames, 12 by default; the process runs slower and larger), and
    each SIGUSR1 collects the garbage and writes ``heap-<n>.tracemalloc`` (a
    ``tracemalloc.Snapshot``, for ``tests.bench.heap_diff``) and ``heap-<n>.txt`` (the traced
    total, the RSS, CPython's allocator's own account of its arenas, glibc's of its heap, the
    resident bytes by kind of mapping and the 60 largest allocation sites by file:line) into
    it. With ``PODCOST_HEAP_DUMP_FRAMES=0`` nothing is
    traced (the process runs as usual) and the text has the RSS and the allocator's account
    only: how much of the RSS its arenas hold and how much of that is in use. With
    ``PODCOST_HEAP_DUMP_FROM`` set to ``signal`` tracing starts at the first SIGUSR1 (whose
    dump then has nothing traced): the process starts and warms up at its usual speed, and a
    later dump holds exactly what was allocated since that signal and still lives, what grew.
    Returns the directory, or ``None`` when off."""
    target = environ.get(HEAP_DUMP_ENV)
    if not target:
        return None
    directory = Path(target)
    directory.mkdir(parents=True, exist_ok=True)
    frames = int(environ.get("PODCOST_HEAP_DUMP_FRAMES", HEAP_DUMP_FRAMES))
    late = environ.get(HEAP_DUMP_FROM_ENV, "start") == "signal"
    if frames > 0 and not late:
        tracemalloc.start(frames)
    count = itertools.count(1)

    def dump(*_: object) -> None:
        n = next(count)
        gc.collect()
        if frames > 0 and late and not tracemalloc.is_tracing():
            tracemalloc.start(frames)
        lines = [f"rss {_rss_bytes()} bytes"]
        snapshot = None
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot()
            snapshot.dump(str(directory / f"heap-{n}.tracemalloc"))
            current, peak = tracemalloc.get_traced_memory()
            lines[0] = f"traced {current} bytes (peak {peak}), {lines[0]}"
        lines += _allocator_account()
        lines += _malloc_account()
        lines += _mappings_account()
        if snapshot is not None:
            lines += [str(stat) for stat in snapshot.statistics("lineno")[:60]]
        (directory / f"heap-{n}.txt").write_text("\n".join(lines) + "\n")

    signal.signal(signal.SIGUSR1, dump)
    return directory


def _allocator_account() -> list[str]:
    """The summary of ``sys._debugmallocstats()`` (pymalloc's arenas, the bytes in use in them,
    free, lost), which CPython writes to the C stderr: captured through a temporary file."""
    with tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    start = text.find("# arenas allocated total")
    return ["pymalloc: " + line for line in text[start:].splitlines() if line.strip()]


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _malloc_account() -> list[str]:
    """glibc's account of ``malloc``'s heap (``mallinfo2``: what CPython's large objects, dict
    tables and list arrays above 512 bytes, and C extensions allocate there), beside pymalloc's;
    nothing where there is no such call."""
    call = _libc("mallinfo2", _MallInfo2)
    if call is None:
        return []
    info = call()
    return [
        f"malloc: heap {info.arena:,} bytes (in use {info.uordblks:,}, free {info.fordblks:,} "
        f"in {info.ordblks:,} chunks), mmapped {info.hblkhd:,} bytes in {info.hblks:,} blocks"
    ]


def _mappings_account() -> list[str]:
    """The resident bytes by kind of mapping (``/proc/self/smaps``): ``malloc``'s main heap,
    anonymous mappings (pymalloc's arenas, ``malloc``'s large blocks and its threads' heaps,
    thread stacks), and files (the interpreter, extension modules); nothing where unreadable."""
    resident: dict[str, int] = {}
    kind = "anonymous"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/smaps").read_text().splitlines():
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else ""
                kind = name if name.startswith("[") else "file" if name else "anonymous"
            elif head and head[0] == "Rss:":
                resident[kind] = resident.get(kind, 0) + int(head[1]) * 1024
    return ["mappings: " + ", ".join(f"{kind} {size:,}" for kind, size in sorted(resident.items()))]


def _rss_bytes() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1
