"""Churn benchmark for cost labelling: API writes per event, fewest-writes vs dense renumbering.

Run by ``make bench`` (or ``uv run python tests/bench/bench_labels.py [--events N --seed S]``);
prints numbers, asserts nothing. A workload's combined order churns the way a live cluster makes
it churn: pods are added (scale-out lands them anywhere in the order) and removed (scale-in takes
the first), single pods move (a restart, a new taint on one node), and a node's pods move
together (it turned spot, or was cordoned). After every event both labellers turn the new order
into costs, starting from the costs they wrote before, and every changed cost is one write.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.record import record

from podcost_core.labels import CurrentCost, Labelling, dense_costs, label_costs
from podcost_core.model import PodUID

Labeller = Callable[
    [Sequence[Sequence[PodUID]], dict[PodUID, str | None], dict[PodUID, CurrentCost]], Labelling
]


@dataclass
class Workload:
    """The combined order (groups of pod UIDs, first deleted first) and each pod's node."""

    order: list[list[PodUID]]
    node_of: dict[PodUID, int]
    replicaset_of: dict[PodUID, str | None]
    next_id: int = 0

    def new_pod(self, rng: random.Random, nodes: int, replicasets: int) -> PodUID:
        uid = PodUID(f"pod-{self.next_id:05}")
        self.next_id += 1
        self.node_of[uid] = rng.randrange(nodes)
        self.replicaset_of[uid] = f"rs-{rng.randrange(replicasets)}"
        return uid

    def insert(self, rng: random.Random, uid: PodUID, tie_share: float) -> None:
        if self.order and rng.random() < tie_share:
            rng.choice(self.order).append(uid)
        else:
            self.order.insert(rng.randrange(len(self.order) + 1), [uid])

    def remove(self, uid: PodUID) -> None:
        for group in self.order:
            if uid in group:
                group.remove(uid)
        self.order = [group for group in self.order if group]

    def pods(self) -> list[PodUID]:
        return [uid for group in self.order for uid in group]


def churn(
    workload: Workload, rng: random.Random, nodes: int, replicasets: int, tie_share: float
) -> int:
    """Apply one random event to the order; return how many pods it added or moved (a rough
    floor for the writes: a moved pod may happen to keep a fitting cost)."""
    pods = workload.pods()
    roll = rng.random()
    if roll < 0.25 or len(pods) < 4:
        workload.insert(rng, workload.new_pod(rng, nodes, replicasets), tie_share)
        return 1
    if roll < 0.50:
        # Scale-in takes the first pods of the order; evictions take any.
        victim = pods[0] if rng.random() < 0.7 else rng.choice(pods)
        workload.remove(victim)
        return 0
    if roll < 0.85:
        uid = rng.choice(pods)
        workload.remove(uid)
        workload.insert(rng, uid, tie_share)
        return 1
    # A node changed (spot, tainted, drained): all its pods go to the front or the back.
    node = rng.randrange(nodes)
    moved = [uid for uid in pods if workload.node_of[uid] == node]
    for uid in moved:
        workload.remove(uid)
    if moved:
        if rng.random() < 0.5:
            workload.order.insert(0, moved)
        else:
            workload.order.append(moved)
    return len(moved)


def run(
    pods: int, events: int, seed: int, nodes: int, replicasets: int, tie_share: float
) -> dict[str, list[int]]:
    rng = random.Random(seed)
    workload = Workload([], {}, {})
    for _ in range(pods):
        workload.insert(rng, workload.new_pod(rng, nodes, replicasets), tie_share)
    labellers: dict[str, Labeller] = {"fewest": label_costs, "dense": dense_costs}
    # Both start from a labelled workload: the first labelling is not churn.
    state: dict[str, dict[PodUID, CurrentCost]] = {
        name: {
            uid: CurrentCost(value)
            for uid, value in labeller(workload.order, workload.replicaset_of, {}).costs.items()
        }
        for name, labeller in labellers.items()
    }
    writes: dict[str, list[int]] = {name: [] for name in labellers}
    writes["touched"] = []
    for _ in range(events):
        writes["touched"].append(churn(workload, rng, nodes, replicasets, tie_share))
        alive = set(workload.pods())
        for name, labeller in labellers.items():
            current = {uid: cost for uid, cost in state[name].items() if uid in alive}
            result = labeller(workload.order, workload.replicaset_of, current)
            writes[name].append(len(result.writes))
            state[name] = {uid: CurrentCost(value) for uid, value in result.costs.items()}
    return writes


#: The scenarios whose figures go into the results table (docs/benchmarks/results.md).
HEADLINE = {(100, 1, 0.0), (500, 1, 0.3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    scenarios = [
        # (pods, nodes, replicasets, share of new pods tied with an existing group)
        (20, 6, 1, 0.0),
        (100, 20, 1, 0.0),
        (100, 20, 1, 0.3),
        (100, 20, 2, 0.3),
        (500, 60, 1, 0.3),
    ]
    header = (
        f"{'pods':>5} {'nodes':>5} {'rs':>3} {'ties':>5} | {'touched/ev':>10} {'fewest w/ev':>11} "
        f"{'dense w/ev':>10} {'ratio':>6} | {'fewest max':>10} {'dense max':>9} | {'s':>5}"
    )
    print(f"bench_labels: {args.events} churn events per scenario, seed {args.seed}")
    print(header)
    print("-" * len(header))
    total = {"fewest": 0, "dense": 0}
    figures = []
    for pods, nodes, replicasets, tie_share in scenarios:
        started = time.perf_counter()
        writes = run(pods, args.events, args.seed, nodes, replicasets, tie_share)
        elapsed = time.perf_counter() - started
        touched = sum(writes["touched"]) / args.events
        fewest = sum(writes["fewest"]) / args.events
        dense = sum(writes["dense"]) / args.events
        total["fewest"] += sum(writes["fewest"])
        total["dense"] += sum(writes["dense"])
        print(
            f"{pods:>5} {nodes:>5} {replicasets:>3} {tie_share:>5.1f} | {touched:>10.2f} "
            f"{fewest:>11.2f} "
            f"{dense:>10.2f} {dense / fewest if fewest else float('inf'):>5.1f}x | "
            f"{max(writes['fewest']):>10} {max(writes['dense']):>9} | {elapsed:>5.1f}"
        )
        if (pods, replicasets, tie_share) in HEADLINE:
            figures.append(
                f"{pods} pods, {replicasets} ReplicaSet, {tie_share:.0%} ties: {fewest:.2f} vs "
                f"{dense:.2f} writes per event "
                f"({dense / fewest if fewest else float('inf'):.0f}x)"
            )
    print(
        f"all scenarios: fewest {total['fewest']} writes, dense {total['dense']} writes, "
        f"dense/fewest = {total['dense'] / total['fewest']:.1f}x"
    )
    figures.append(f"all scenarios: dense needs {total['dense'] / total['fewest']:.1f}x the writes")
    record(
        "bench_labels",
        f"API writes per churn event, fewest-writes labelling vs dense renumbering, "
        f"{args.events:,} events per scenario, seed {args.seed}",
        figures,
    )


if __name__ == "__main__":
    main()
