"""Benchmark of the watcher's CPU per pod watch event, its whole path, without servers, beside
its floor (``floors.watcher_floor``: ``orjson.loads`` of the same watch lines).

A script, not a test (``python -m tests.bench.bench_watcher [--events N --rate R --rounds K]``);
it prints numbers and asserts nothing. The real watcher service (``podcost.watcher.service``,
bootstrapped as ``podcost watcher`` bootstraps it, its tracing set up as the command sets it
up) over the in-memory bus, with the heap keeper it has over Kafka, on a fake clock, takes in
``bench_pipeline``'s churn (its fleet of ``--workloads`` Deployments of ``--pods`` kwok-like
pods, ``tests.support.served``; then ``--events`` events of replacements, readiness flaps and
status noise) the way ``bench_pipeline``'s watcher process does: each line through
``decode_event``, ``apply_event`` and the watcher's informer handler. The clock moves on by
``1 / --rate`` a line, so the debouncer emits what it would at that rate, and the watcher
builds, encodes and publishes each snapshot as it does. What is counted is process CPU per line
over the churn and until what it left pending is published (the fleet and the first pass not
counted); the best of ``--rounds`` runs over the same lines, each in a fresh watcher.

Between two moves the clock lets every task run until it blocks (``SettledClock``), and no
longer: the loop's empty turns are not the watcher's CPU. ``--harness`` prints what the loop and
the clock cost alone over the same moves (no line delivered). ``--fixed-rounds`` settles in
``FakeClock``'s fixed number of turns, as this benchmark did before: that counted 2.4-4.4 µs a
line of empty turns, and, its first pass not yet published when the count began, the first
pass's snapshots (one per workload) among the churn's.

What the count leaves out, against ``bench_pipeline``'s watcher process: reading the lines
from a socket or a pipe, and Kafka's producer (here the in-memory bus takes the records).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import floors
from tests.bench.bench_pipeline import WATCHED, Churn, Event, Templates
from tests.bench.record import record
from tests.support.clock import FakeClock
from tests.support.served import served_deployment, served_node, served_pod, served_replicaset

from podcost.runtime.heap import HeapKeeper, settle_heap
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import setup_tracing
from podcost.watcher.service import WatcherService, WatcherSettings, bootstrap
from podcost_bus import BusSettings
from podcost_core.projection import SharedParts
from podcost_kube.informer import apply_event, decode_event

#: Lines taken in between two moves of the clock (the publishing loop runs then).
BATCH = 50


class SettledClock(FakeClock):
    """``FakeClock`` whose :meth:`settle` yields to the loop only while another task can run,
    rather than a fixed ``SETTLE_ROUNDS`` times: the same tasks run the same steps to the same
    point (each until it blocks; nothing here waits on real I/O or real time), without the
    loop's empty turns in between, which cost 2.4-2.6 µs of the process's CPU per line on top
    of the watcher's (``--harness`` measures it)."""

    async def settle(self) -> None:
        ready = asyncio.get_running_loop()._ready  # type: ignore[attr-defined]  # due next turn
        while True:
            await asyncio.sleep(0)
            if not ready:
                return


def churn_lines(args: argparse.Namespace) -> tuple[list[Event], list[Event]]:
    """The fleet as ADDED lines, and ``args.events`` lines of churn at ``args.rate``."""
    templates = Templates(
        pod=served_pod(0),
        replicaset=served_replicaset(0),
        deployment=served_deployment(0),
        node=served_node(0),
    )
    churn = Churn(templates, workloads=args.workloads, pods=args.pods,
                  namespaces=args.namespaces, nodes=args.nodes)  # fmt: skip
    fleet = list(churn.fleet())
    start = time.time()
    events = [churn.next_event(start + index / args.rate) for index in range(args.events)]
    return fleet, events


class Feed:
    """What ``bench_agent.Feed.deliver`` does with a line: the informer's path."""

    def __init__(self, watcher: WatcherService) -> None:
        self.watcher = watcher
        self.shared = SharedParts()

    def deliver(self, kind: str, line: bytes) -> None:
        resource = WATCHED[kind]
        event = decode_event(line, f"{kind}: watch", resource)
        change = apply_event(self.watcher.store, resource, event, self.shared)
        if change is not None:
            self.watcher._on_change(change)


async def one_run(
    fleet: Sequence[Event],
    events: Sequence[Event],
    rate: float,
    *,
    fixed_rounds: bool = False,
    harness_only: bool = False,
) -> tuple[float, int]:
    """CPU seconds per churn line of a fresh watcher, and the snapshots it published.

    ``fixed_rounds``: on a ``FakeClock`` that settles in its fixed number of turns, as this
    benchmark did before ``SettledClock``. ``harness_only``: the churn's lines are not delivered
    (the fleet is): the CPU of the loop and the clock alone, for the same moves of the clock."""
    clock = (FakeClock if fixed_rounds else SettledClock)(time.time())
    watcher = bootstrap(
        ServiceSettings(cluster="bench"), BusSettings(), WatcherSettings(),
        kube=None, clock=clock,  # type: ignore[arg-type]
    )  # fmt: skip
    # As over Kafka (``bootstrap`` gives the watcher of an in-memory bus none: that process is
    # ``podcost run``'s).
    watcher.keeper = HeapKeeper()
    feed = Feed(watcher)
    async with watcher.bus:
        await watcher.bus.ensure_topics([watcher.topics.workloads])
        for kind, line in fleet:
            feed.deliver(kind, line)
        # What ``WatcherService.run`` does once synced.
        watcher._ready = True
        settle_heap()
        watcher._start_first_pass()
        publishing = asyncio.create_task(watcher._publish_forever())
        keeping = asyncio.create_task(watcher.keep_heap())
        try:
            await clock.advance(5.0)  # the first pass
            before = watcher.metrics.get_sample_value("podcost_snapshots_published_total") or 0
            gc.collect()
            started = time.process_time()
            for index in range(0, len(events), BATCH):
                if not harness_only:
                    for kind, line in events[index : index + BATCH]:
                        feed.deliver(kind, line)
                await clock.advance(BATCH / rate)
            await clock.advance(watcher.settings.max_delay_seconds)  # what is pending goes out
            cpu = time.process_time() - started
            after = watcher.metrics.get_sample_value("podcost_snapshots_published_total") or 0
        finally:
            publishing.cancel()
            keeping.cancel()
            await asyncio.gather(publishing, keeping, return_exceptions=True)
            gc.unfreeze()  # the next round starts from the same heap
    return cpu / len(events), int(after - before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=5000.0, help="events/s the clock moves at")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", type=int, default=40)
    parser.add_argument("--pods", type=int, default=25, help="per workload")
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument(
        "--fixed-rounds", action="store_true",
        help="settle the fake clock in a fixed number of loop turns (the method before)",
    )  # fmt: skip
    parser.add_argument(
        "--harness", action="store_true",
        help="also print the CPU of the loop and the clock alone, no line delivered",
    )  # fmt: skip
    args = parser.parse_args()
    setup_tracing("podcost-watcher")
    fleet, events = churn_lines(args)
    lines = [line for _, line in events]
    best, snapshots, floor = float("inf"), 0, float("inf")
    for _ in range(args.rounds):  # interleaved, so that a busy moment touches both
        per_event, snapshots = asyncio.run(
            one_run(fleet, events, args.rate, fixed_rounds=args.fixed_rounds)
        )
        best = min(best, per_event)
        floor = min(floor, floors.watcher_floor(lines))
    harness = None
    if args.harness:
        harness = min(
            asyncio.run(
                one_run(fleet, events, args.rate, fixed_rounds=args.fixed_rounds,
                        harness_only=True)
            )[0]
            for _ in range(args.rounds)
        )  # fmt: skip
    size = sum(len(line) for line in lines) / len(lines)
    print(
        f"{args.workloads} Deployments x {args.pods} pods on {args.nodes} nodes; "
        f"{len(events):,} churn events at {args.rate:,.0f}/s on a fake clock ({size:,.0f} bytes "
        f"a line on average), {snapshots} snapshots published; best of {args.rounds} rounds:"
    )
    print(f"  watcher, whole path       {best * 1e6:7.1f} µs CPU per event")
    print(f"  floor (orjson.loads)      {floor * 1e6:7.1f} µs")
    print(f"  ratio                     {floors.ratio(best, floor)}")
    if harness is not None:
        print(f"  harness alone (counted)   {harness * 1e6:7.1f} µs")
    record(
        "bench_watcher",
        f"the watcher's CPU per pod watch event, whole path without servers (in-memory bus), "
        f"{args.workloads}x{args.pods} pods, {len(events):,} churn events at {args.rate:,.0f}/s "
        f"on a fake clock, best of {args.rounds}",
        [
            f"watcher: {best * 1e6:.1f} µs per event",
            f"floor (orjson.loads of the same lines): {floor * 1e6:.1f} µs",
            f"ratio: {floors.ratio(best, floor)}",
        ],
    )


if __name__ == "__main__":
    main()
