"""The cyclic garbage collector's settings for a service that keeps a large heap for long.

The watcher (its informer cache) and the aggregator (every workload's state) call
:func:`settle_heap` once that heap is built: what lives as long as the process leaves the
collector's passes (``gc.freeze``), and the youngest generation is collected less often.
Decoding one pod event or one snapshot allocates hundreds of containers, so at CPython's default
threshold (700) a collection ran every few records and a full one, over the whole heap, every few
hundred: 12-17 % of the watcher's CPU in the whole-pipeline benchmark, about a fifth of the
aggregator's deciding in ``tests/bench/bench_aggregator.py``.
"""

from __future__ import annotations

import gc
from typing import Final

#: The youngest generation's threshold once settled (CPython's default is 700).
GC_THRESHOLD: Final = 20_000


def settle_heap() -> None:
    """Collect once, freeze what is left (imports, caches, states) and raise the threshold."""
    gc.collect()
    gc.freeze()
    youngest, middle, oldest = gc.get_threshold()
    gc.set_threshold(max(GC_THRESHOLD, youngest), middle, oldest)


def freeze_imports() -> None:
    """Freeze what the imports built (it lives as long as the process) out of the collector's
    passes, before the services start: without it the first :func:`settle_heap` walks some
    80 000 import-time objects (0.1-0.2 s, blocking the event loop just before the first cost
    writes of a start) to find no garbage among them."""
    gc.freeze()
