"""Benchmark of the pure core: every strategy and the combiner over a synthetic fleet.

A script, not a test (``uv run python tests/bench/bench_core.py [--quick]``; ``make bench``). It
builds 150,000 pods on 5,000 nodes in 3 zones, as 1,500 workloads of 100 pods, ranks every
workload with each strategy of the default policy (plus ``work-in-progress``) and combines, and
prints pods/s per strategy and in total, the peak memory, and the ratio to a naive first version
(per-pod scans, eager per-pod explanations) that must produce the same orders. It also checks a
fingerprint of every order and every pod's tier sums against the one recorded for the same fleet
before the hot path was optimised (``RECORDED``): optimisations must not change a single cost.
The goal is a full recompute of the fleet in under one second on one core.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import random
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.record import record

from podcost_core.combine import Combined, Contribution, combine, rank
from podcost_core.model import (
    AffinityTerm,
    Node,
    NodeName,
    Phase,
    Pod,
    PodUID,
    QoSClass,
    Resources,
    Snapshot,
    Taint,
    Toleration,
    WorkloadRef,
)
from podcost_core.policy import DEFAULT_POLICY, Policy, StrategySpec
from podcost_core.strategies import capacity_type, co_location, node_consolidation
from podcost_core.strategies.base import Scores, controller_class, controller_order_key

ZONES = ("eu-west-1a", "eu-west-1b", "eu-west-1c")
NOW = 1_700_000_000.0

# The default policy plus work-in-progress, so that every built-in strategy is measured.
POLICY = Policy((*DEFAULT_POLICY.specs, StrategySpec("work-in-progress", weight=2, tier=1)))

#: fingerprint() of the fleet of (workloads, pods per workload, nodes), seed 42, as ranked by
#: podcost_core before its hot path was optimised (commit ef4d303); re-recorded with the code of
#: commit e27d21b, since node-consolidation ranks by the nodes a scale-in can empty (commit
#: 6b4a373), which changes orders by design.
RECORDED = {(1_500, 100, 5_000): "245536fc9349e669", (150, 100, 5_000): "1672d2dfbf5cb49d"}


def make_nodes(count: int, rng: random.Random) -> list[Node]:
    nodes = []
    for index in range(count):
        labels = {
            "topology.kubernetes.io/zone": ZONES[index % len(ZONES)],
            "kubernetes.io/hostname": f"node-{index}",
        }
        annotations = {}
        roll = rng.random()
        if roll < 0.2:
            labels["karpenter.sh/capacity-type"] = "spot"
        elif roll < 0.6:
            labels["karpenter.sh/capacity-type"] = "on-demand"
            annotations["podcost.dev/hourly-price"] = f"{rng.uniform(0.1, 2.0):.3f}"
        taints = (Taint("maintenance", "PreferNoSchedule"),) if rng.random() < 0.05 else ()
        cpu = 16_000
        nodes.append(
            Node(
                NodeName(f"node-{index}"),
                labels=labels,
                annotations=annotations,
                taints=taints,
                allocatable=Resources(cpu, 64 << 30, 110),
                requested=Resources(rng.randrange(cpu), rng.randrange(64 << 30), 30),
            )
        )
    return nodes


def make_snapshots(
    workloads: int, pods_per_workload: int, nodes: list[Node], rng: random.Random
) -> list[Snapshot]:
    snapshots = []
    for w in range(workloads):
        app = f"app-{w}"
        labels = {"app": app}
        tolerations = (Toleration("maintenance", "Exists"),) if w % 10 == 0 else ()
        terms = (
            (AffinityTerm("kubernetes.io/hostname", {"app": app}, weight=100),)
            if w % 3 == 0
            else ()
        )
        priorities = (0, 1000) if w % 20 == 0 else (0,)
        pods = []
        used: dict[str, Node] = {}
        for p in range(pods_per_workload):
            node = nodes[rng.randrange(len(nodes))]
            used[node.name] = node
            created = NOW - rng.uniform(60, 3 * 86_400)
            annotations = {"podcost.dev/work-cost": str(rng.randrange(100))} if w % 4 == 0 else {}
            pods.append(
                Pod(
                    uid=PodUID(f"{w:04d}-{p:03d}-{rng.getrandbits(32):08x}"),
                    name=f"{app}-{p}",
                    namespace="bench",
                    node=node.name,
                    phase=Phase.RUNNING,
                    ready=True,
                    ready_since=created + 30,
                    created=created,
                    replicaset=f"{app}-rs",
                    priority=rng.choice(priorities),
                    qos=QoSClass.BURSTABLE,
                    tolerations=tolerations,
                    requests=Resources(250, 256 << 20, 1),
                    labels=labels,
                    annotations=annotations,
                    anti_affinity=terms,
                )
            )
        snapshots.append(
            Snapshot(
                workload=WorkloadRef("bench", "bench", "Deployment", app),
                pods=tuple(pods),
                nodes=used,
                replicas=pods_per_workload,
                version=1,
                taken_at=NOW,
            )
        )
    return snapshots


# --- the naive first version: per-pod scans and eager explanations --------------------------


def naive_capacity(snapshot: Snapshot, args: Any) -> dict[PodUID, float]:
    out = {}
    for pod in snapshot.pods:
        node = snapshot.nodes.get(pod.node) if pod.node is not None else None
        if node is None:
            out[pod.uid] = 3.0
            continue
        highest = max(
            (capacity_type.price(n, args.price_annotation) for n in snapshot.nodes.values()),
            default=0.0,
        )
        own = capacity_type.price(node, args.price_annotation)
        share = own / highest if highest > 0.0 else 0.0
        out[pod.uid] = (0.0 if capacity_type.is_spot(node, args) else 2.0) + 1.0 - share
    return out


def naive_co_location(snapshot: Snapshot, args: Any) -> dict[PodUID, float]:
    active = [pod for pod in snapshot.pods if pod.active]
    population = active + [pod for pod in snapshot.bystanders if pod.active]

    def domain(pod: Pod, key: str) -> str | None:
        node = snapshot.nodes.get(pod.node) if pod.node is not None else None
        value = node.labels.get(key) if node is not None else None
        return pod.node if value is None and key == co_location.HOSTNAME_KEY else value

    out = {pod.uid: 0.0 for pod in snapshot.pods}
    for pod in active:
        if pod.node is None:
            continue
        same = sum(1 for other in population if other.node == pod.node)
        penalty = args.same_node_weight * (same - 1)
        for term in pod.anti_affinity:
            weight = (
                args.required_weight
                if term.weight == 0
                else args.preferred_weight * term.weight / 100.0
            )
            own = domain(pod, term.topology_key)
            if not weight or own is None:
                continue
            others = sum(
                1
                for other in population
                if other is not pod
                and co_location._matches(other, term)
                and domain(other, term.topology_key) == own
            )
            penalty += weight * others
        out[pod.uid] = -penalty
    return out


def naive_consolidation(snapshot: Snapshot, args: Any) -> dict[PodUID, float]:
    scheduled = [pod for pod in snapshot.pods if pod.active and pod.node is not None]
    names = {pod.node for pod in scheduled}
    used = {
        name: node_consolidation.utilization(snapshot.nodes[name], args.measure)
        if name in snapshot.nodes
        else None
        for name in names
    }
    known = args.measure != "count" and None not in used.values()

    def key(name: str, cls: int) -> tuple[bool, int, float, str]:
        mine = [pod for pod in scheduled if pod.node == name]
        return node_consolidation.node_key(
            name,
            sum(1 for pod in mine if controller_class(pod) == cls),
            len(mine),
            node_consolidation.other_pods(snapshot.nodes.get(name), len(mine)),
            any(controller_class(pod) > cls for pod in mine),
            (used[name] or 0.0) if known else 0.0,
        )

    out = {}
    for pod in snapshot.pods:
        if not pod.active or pod.node is None:
            out[pod.uid] = 0.0
            continue
        cls = controller_class(pod)
        same = {other.node for other in scheduled if controller_class(other) == cls}
        order = sorted((name for name in same if name is not None), key=lambda n: key(n, cls))
        out[pod.uid] = float(order.index(pod.node))
    return out


NAIVE: Mapping[str, Callable[[Snapshot, Any], Mapping[PodUID, float]]] = {
    capacity_type.NAME: naive_capacity,
    co_location.NAME: naive_co_location,
    node_consolidation.NAME: naive_consolidation,
}


def naive_normalize(raw: dict[PodUID, float], threshold: float | None) -> dict[PodUID, int]:
    if threshold is not None:
        raw = {uid: min(value, threshold) for uid, value in raw.items()}
        low, high = min(0.0, *raw.values()), threshold
    else:
        low, high = min(raw.values()), max(raw.values())
        if low == high:
            return dict.fromkeys(raw, 0)
    factor = 100 / (high - low)
    return {uid: int((value - low) * factor + 0.5) for uid, value in raw.items()}


def naive_rank(snapshot: Snapshot, policy: Policy) -> tuple[tuple[PodUID, ...], ...]:
    active = [pod for pod in snapshot.pods if pod.active]
    explanations: dict[PodUID, list[Contribution]] = {pod.uid: [] for pod in active}
    points: dict[PodUID, dict[int, int]] = {
        pod.uid: dict.fromkeys(policy.tiers, 0) for pod in active
    }

    def add(bound: Any, raw: dict[PodUID, float]) -> None:
        normalized = naive_normalize(raw, bound.spec.threshold)
        for pod in active:
            points[pod.uid][bound.spec.tier] += bound.weight * normalized[pod.uid]
            explanations[pod.uid].append(
                Contribution(
                    bound.name, bound.spec.tier, bound.weight, raw[pod.uid], normalized[pod.uid]
                )
            )

    for bound in policy.bound:
        if not bound.strategy.spread:
            score = NAIVE.get(bound.name, bound.strategy.score)
            scores = score(snapshot, bound.args)
            add(bound, {pod.uid: scores[pod.uid] for pod in active})
    by_controller = sorted(active, key=controller_order_key)
    for bound in sorted(
        (b for b in policy.bound if b.strategy.spread), key=lambda b: -b.tier_index
    ):
        domain = bound.strategy.domains(snapshot, bound.args)
        within = {
            pod.uid: (
                controller_class(pod),
                *(points[pod.uid][t] for t in policy.tiers),
                by_controller.index(pod),
            )
            for pod in active
        }
        levels = {
            pod.uid: sum(
                1
                for other in active
                if domain[other.uid] == domain[pod.uid] and within[other.uid] >= within[pod.uid]
            )
            for pod in active
        }
        add(bound, {uid: float(-level) for uid, level in levels.items()})
    key = {uid: tuple(tiers[t] for t in policy.tiers) for uid, tiers in points.items()}
    ordered = sorted(key, key=lambda uid: (key[uid], uid))
    return tuple(tuple(group) for _, group in itertools.groupby(ordered, key=key.__getitem__))


def fingerprint(results: list[Combined]) -> str:
    """A digest of every workload's order and every ranked pod's tier sums, in fleet order."""
    digest = hashlib.sha256()
    for combined in results:
        digest.update(repr((combined.order, combined.keys)).encode())
    return digest.hexdigest()[:16]


def timed(
    run: Callable[[], object], repeat: int, clock: Callable[[], float], *, collect: bool = False
) -> float:
    """Best time of ``repeat`` runs on ``clock``; the collector off unless ``collect``.

    ``clock`` is this thread's CPU time unless ``--wall``: the goal is about one core, and on a
    machine shared with builds the wall clock measures the neighbours too. The parts run with
    the collector off because they keep every result (a full collection over them is the
    benchmark's artefact, not the service's); the total drops results and collects, as a service.
    """
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        if not collect:
            gc.disable()
        start = clock()
        run()
        best = min(best, clock() - start)
        gc.enable()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=1_500)
    parser.add_argument("--pods", type=int, default=100, help="pods per workload")
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    parser.add_argument("--quick", action="store_true", help="150 workloads, one run")
    parser.add_argument("--wall", action="store_true", help="wall clock instead of CPU time")
    options = parser.parse_args()
    clock = time.perf_counter if options.wall else time.thread_time
    if options.quick:
        options.workloads, options.repeat = 150, 1

    rng = random.Random(42)
    nodes = make_nodes(options.nodes, rng)
    snapshots = make_snapshots(options.workloads, options.pods, nodes, rng)
    total_pods = sum(len(snapshot.pods) for snapshot in snapshots)
    fleet_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{total_pods:,} pods, {options.nodes:,} nodes, {len(ZONES)} zones, "
        f"{len(snapshots):,} workloads; python {sys.version.split()[0]}; best of {options.repeat}"
        f"; {'wall-clock' if options.wall else 'CPU'} seconds"
    )

    print(f"{'strategy':<22}{'seconds':>10}{'pods/s':>14}")
    answers: list[dict[str, Scores]] = [{} for _ in snapshots]
    strategy_total = 0.0
    for bound in POLICY.bound:
        strategy, args = bound.strategy, bound.args
        run: Callable[[], object]
        if strategy.spread:
            domains = strategy.domains
            assert domains is not None

            def run(domains: Any = domains, args: Any = args) -> object:
                return [domains(snapshot, args) for snapshot in snapshots]

            label = f"{bound.name} (domains)"
        else:

            def run(strategy: Any = strategy, args: Any = args) -> object:
                return [strategy.score(snapshot, args) for snapshot in snapshots]

            label = bound.name
            for index, scores in enumerate(strategy.score(s, args) for s in snapshots):
                answers[index][bound.name] = scores
        seconds = timed(run, options.repeat, clock)
        strategy_total += seconds
        print(f"{label:<22}{seconds:>10.3f}{total_pods / seconds:>14,.0f}")

    def combine_all() -> object:
        return [combine(s, POLICY, a) for s, a in zip(snapshots, answers, strict=True)]

    seconds = timed(combine_all, options.repeat, clock)
    print(f"{'combine':<22}{seconds:>10.3f}{total_pods / seconds:>14,.0f}")

    def rank_all() -> list[Combined]:
        return [rank(snapshot, POLICY) for snapshot in snapshots]

    def rank_each() -> None:
        for snapshot in snapshots:
            rank(snapshot, POLICY)

    total = timed(rank_each, options.repeat, clock, collect=True)
    print(f"{'total (rank, GC on)':<22}{total:>10.3f}{total_pods / total:>14,.0f}")
    print(f"  sum of the parts: strategies {strategy_total:.3f} s + combine {seconds:.3f} s")

    fast = rank_all()
    naive_seconds = timed(lambda: [naive_rank(s, POLICY) for s in snapshots], 1, clock)
    naive = [naive_rank(snapshot, POLICY) for snapshot in snapshots]
    same = all(n == tuple(f.order) for n, f in zip(naive, fast, strict=True))
    print(
        f"{'naive first version':<22}{naive_seconds:>10.3f}{total_pods / naive_seconds:>14,.0f}"
        f"   {naive_seconds / total:.1f}x slower; same orders: {same}"
    )
    recorded = RECORDED.get((options.workloads, options.pods, options.nodes))
    unchanged = recorded is None or fingerprint(fast) == recorded
    print(
        "orders and tier sums as recorded before the optimisations: "
        + ("(no record for this fleet)" if recorded is None else str(unchanged))
    )

    gc.collect()
    tracemalloc.start()
    rank_all()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"peak memory: ranking all workloads {peak / 2**20:.1f} MiB (tracemalloc, results kept); "
        f"process max RSS {rss:.0f} MiB, of which {fleet_rss:.0f} MiB before ranking (the fleet)"
    )
    if not same:
        sys.exit("the naive baseline and podcost_core disagree")
    if not unchanged:
        sys.exit("podcost_core no longer gives the recorded orders and tier sums")
    record(
        "bench_core",
        f"{total_pods:,} pods ({len(snapshots):,} workloads, {options.nodes:,} nodes) ranked by "
        f"every strategy and combined, one core, best of {options.repeat}",
        [
            f"full recompute {total:.2f} s, {total_pods / total:,.0f} pods/s "
            f"(strategies {strategy_total:.2f} s, combine {seconds:.2f} s)",
            f"naive first version {naive_seconds / total:.1f}x slower, same orders",
            f"{peak / 2**20:.0f} MiB while ranking",
        ],
    )


if __name__ == "__main__":
    main()
