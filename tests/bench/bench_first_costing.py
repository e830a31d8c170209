"""Benchmark of a first costing: the writes podcost makes when it first costs a whole cluster.

A script, not a test (``uv run python -m tests.bench.bench_first_costing [--sizes 1000 10000
150000] [--qps 10] [--seed 42]``); prints numbers, asserts nothing but that every labelling it
counts still realises its order. Per cluster size it builds a fleet of opted-in Deployments whose
pods carry no deletion cost yet (``bench_core``'s synthetic nodes and pods: 3 zones, spot and
on-demand nodes, random ages), in a mix of sizes a real cluster has (many small workloads, a
few large ones), ranks every workload with the default policy, and counts the writes of three
labellers of the same orders:

- **dense**: every pod gets a cost (``labels.dense_costs``, the naive first costing);
- **before**: ``labels.label_costs`` reading a pod without the annotation as "no cost", so it
  writes every pod of a first costing (what podcost did before reading it as 0);
- **zero**: ``labels.label_costs`` on ``labels.current_costs``: a missing annotation is the
  cost 0 the controller reads, kept where 0 fits;
- **after**: that, less the writes the controller's own order makes unnecessary
  (``implied.drop_implied``: readiness and co-location rank already place the pod): what the
  aggregator now decides.

and the minutes each takes at the annotator's write budget (``--qps``, 10/s by default), which
bounds a first costing: the ranking itself takes about a second per 150,000 pods
(``bench_core``). The largest default size is ``bench_core``'s fleet, 150,000 pods.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from tests.bench.bench_core import make_nodes, make_snapshots

from podcost.annotator.plan import write_priority
from podcost_core.combine import rank
from podcost_core.implied import drop_implied
from podcost_core.labels import CurrentCost, Labelling, current_costs, dense_costs, label_costs
from podcost_core.model import PodUID, Snapshot
from podcost_core.urgency import first_wrong
from podcost_core.victims import clockless_key, colocation_ranks, victim_inputs

#: Pods per workload and how often each size is drawn: mostly small Deployments.
SIZES = (2, 3, 3, 3, 5, 5, 10, 10, 20, 50, 100)

Labeller = Callable[
    [Sequence[Sequence[PodUID]], dict[PodUID, str | None], dict[PodUID, CurrentCost]], Labelling
]


@dataclass
class Count:
    """Writes of one labeller over a fleet, and how many workloads needed none."""

    writes: int = 0
    untouched: int = 0


def fleet(pods: int, rng: random.Random) -> list[Snapshot]:
    """Workloads of ``SIZES`` until ``pods`` pods, on one node per 30 pods."""
    nodes = make_nodes(max(3, pods // 30), rng)
    snapshots: list[Snapshot] = []
    total = 0
    while total < pods:
        size = min(rng.choice(SIZES), pods - total)
        snapshots.extend(make_snapshots(1, size, nodes, rng))
        total += size
    return snapshots


def before_current(current: dict[PodUID, CurrentCost]) -> dict[PodUID, CurrentCost]:
    """``current`` as podcost read it before: a pod without the annotation had no cost."""
    return {uid: CurrentCost() if cost == CurrentCost(0) else cost for uid, cost in current.items()}


def realises(labelling: Labelling, order: Sequence[Sequence[PodUID]], snapshot: Snapshot) -> bool:
    """Whether the controller's clockless keys (rules 1-5, with the labelled costs) order the
    groups, a key never spanning two (one ReplicaSet per workload here)."""
    group_of = {uid: index for index, group in enumerate(order) for uid in group}
    pods, related = victim_inputs(snapshot, snapshot.pods[0].replicaset or "")
    ranks = colocation_ranks(pods, related)
    keyed = sorted(
        (clockless_key(pod, ranks[pod.uid], labelling.costs[pod.uid]), group_of[pod.uid])
        for pod in pods
    )
    return all(
        group_b >= group_a and (key_a != key_b or group_a == group_b)
        for (key_a, group_a), (key_b, group_b) in pairwise(keyed)
    )


@dataclass
class Writes:
    """One workload's writes (after), each with the annotator's priority, in message order."""

    snapshot: Snapshot
    order: Sequence[Sequence[PodUID]]
    writes: list[tuple[int, PodUID, int]]  # (priority, pod, cost)


def measure(snapshots: list[Snapshot]) -> tuple[dict[str, Count], list[Writes], float]:
    counts = {name: Count() for name in ("dense", "before", "zero", "after")}
    queued: list[Writes] = []
    started = time.perf_counter()
    for snapshot in snapshots:
        combined = rank(snapshot)
        order = combined.order
        replicaset_of = {pod.uid: pod.replicaset for pod in snapshot.pods}
        current = current_costs(snapshot.pods)
        zero = label_costs(order, replicaset_of, current)
        labellings = {
            "dense": dense_costs(order, replicaset_of, current),
            "before": label_costs(order, replicaset_of, before_current(current)),
            "zero": zero,
            "after": drop_implied(zero, order, snapshot, current),
        }
        for name, labelling in labellings.items():
            assert realises(labelling, order, snapshot), (name, snapshot.workload.key)
            counts[name].writes += len(labelling.writes)
            counts[name].untouched += not labelling.writes
        # As the aggregator publishes it: pods first deleted first, and its urgency.
        urgent = first_wrong(order, snapshot)
        after = labellings["after"].writes
        listed = [uid for group in order for uid in group]
        queued.append(Writes(snapshot, order, [
            (write_priority(urgent, position, rising=after[uid] > (current[uid].value or 0)),
             uid, after[uid])
            for position, uid in enumerate(listed)
            if uid in after
        ]))  # fmt: skip
    return counts, queued, time.perf_counter() - started


def covered(queued: list[Writes], scale_in: int) -> tuple[int, int, int]:
    """For scale-ins up to ``scale_in`` to be right in every workload: the writes the
    annotator makes before (its priority order; the writes of priority up to ``scale_in``),
    those it would make in arrival order (workload by workload), and the workloads where
    those writes do not suffice (checked with ``urgency.first_wrong`` on the written costs)."""
    by_priority = sum(1 for work in queued for priority, _, _ in work.writes
                      if priority <= scale_in)  # fmt: skip
    fifo = done = 0
    short = 0
    for work in queued:
        needed = [index for index, (priority, _, _) in enumerate(work.writes)
                  if priority <= scale_in]  # fmt: skip
        if needed:
            fifo = done + needed[-1] + 1
        done += len(work.writes)
        written = {uid: cost for priority, uid, cost in work.writes if priority <= scale_in}
        pods = tuple(replace(pod, deletion_cost=written.get(pod.uid, pod.deletion_cost))
                     for pod in work.snapshot.pods)  # fmt: skip
        wrong = first_wrong(work.order, replace(work.snapshot, pods=pods))
        short += wrong is not None and wrong <= scale_in
    return by_priority, fifo, short


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 150_000])
    parser.add_argument("--qps", type=float, default=10.0, help="the annotator's write budget")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--scale-ins", type=int, nargs="+", default=[1, 2, 5])
    options = parser.parse_args()
    print(f"first costing at {options.qps:g} writes/s; seed {options.seed}")
    header = f"{'pods':>8}{'workloads':>11}{'labeller':>10}{'writes':>9}{'minutes':>9}"
    print(f"{header}{'no-write workloads':>20}")
    for pods in options.sizes:
        rng = random.Random(options.seed)
        snapshots = fleet(pods, rng)
        counts, queued, seconds = measure(snapshots)
        for name, count in counts.items():
            minutes = count.writes / options.qps / 60
            print(
                f"{pods:>8,}{len(snapshots):>11,}{name:>10}{count.writes:>9,}{minutes:>9.1f}"
                f"{count.untouched:>20,}"
            )
        saved = 1 - counts["after"].writes / counts["before"].writes
        print(f"{'':>19}{'saved':>10}{saved:>9.1%}   (ranked and labelled in {seconds:.1f}s)")
        for scale_in in options.scale_ins:
            by_priority, fifo, short = covered(queued, scale_in)
            print(
                f"{'':>19}scale-ins <= {scale_in} right everywhere after {by_priority:,} writes "
                f"({by_priority / options.qps / 60:.1f} min) by priority, {fifo:,} "
                f"({fifo / options.qps / 60:.1f} min) workload by workload; "
                f"{short} workloads short"
            )


if __name__ == "__main__":
    main()
