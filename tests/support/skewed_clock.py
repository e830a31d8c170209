"""``python -m tests.support.skewed_clock SECONDS ARGS...``: the podcost CLI with its wall clock
moved by ``SECONDS`` (negative: behind).

Two replicas of a service on different nodes do not share a clock, and nothing on one machine
can give one process a wall clock of its own (a time namespace moves only the monotonic and
boot clocks; no libfaketime here). This stand-in moves ``time.time``/``time.time_ns`` of one
process before podcost is imported, which covers every wall-clock reading podcost makes (its
``WallClock``, and the Lease times its elector writes); the monotonic clock, which podcost uses
for all waiting, is left alone, as a skewed host would leave it. Used by
``tests/e2e/test_watcher_failover.py``.
"""

from __future__ import annotations

import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m tests.support.skewed_clock SECONDS ARGS...")
    offset = float(sys.argv.pop(1))
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + offset
    time.time_ns = lambda: real_time_ns() + round(offset * 1e9)
    runpy.run_module("podcost", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
