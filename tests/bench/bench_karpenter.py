"""A real Karpenter consolidating after a scale-in, with and without podcost, and the order
Karpenter's own pod-deletion-cost proposal (kubernetes-sigs/karpenter PR #2894) would give.

The KEP-5982 shape at a larger size: ``--pods`` pods (four fit a node of the one offered
type) that Karpenter provisions nodes for, scaled in to ``--to``. Two runs on the real
controller and the real Karpenter (kwok provider, ``tests/support/karpenter.py``):

- ``without``: no deletion costs; the ReplicaSet controller picks by its own ranks;
- ``podcost``: podcost embedded, policy ``karpenter | node-consolidation``.

and a third column from podcost's ``simulate`` on the same pods before the scale-in: the
ordering PR #2894 proposes (nodes by live pod count, fewest first, disrupted nodes first),
written as podcost's ``karpenter | node-consolidation`` with ``measure=count``. Per run, read
from the API server: nodes before and after, nodes Karpenter removed without an eviction,
pods it evicted, seconds until its node count settled, node-minutes saved in the next 10
minutes; and for every column the nodes the scale-in itself emptied (``simulate``'s victims
for the orderings, the controller's real deletions for the runs).

``--repeat N`` makes each run N times (the run without podcost varies with the controller's
and Karpenter's tie-breaking) and prints every run, then min / median / max per column.
``--no-scale-in`` runs, instead, the cost bands' comparison: ``--pods`` pods in zone spread
costed by podcost's default policy in the wide band and in the chart's band, no scale-in, and the
nodes Karpenter removes with their pods running (``karpenter_scenarios.standing``).

``python -m tests.bench.bench_karpenter [--pods 200 --to 100] [--repeat N] [--no-scale-in]``
(``make bench``; needs ``make karpenter-tools``). Slow: each run waits for Karpenter's
consolidation rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from kubernetes_asyncio import config
from tests.bench.record import record
from tests.support import karpenter as k
from tests.support.karpenter_scenarios import Embedded, Loop, fresh_pools, scenario, standing
from tests.support.kube import KubeTestCluster

from podcost_core.policy import Policy, StrategySpec
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube

PODCOST_POLICY = "karpenter | node-consolidation"
#: PR #2894's order: disrupted nodes first, then nodes by live pod count, fewest first.
PR_2894 = Policy(
    (
        StrategySpec("karpenter", tier=0),
        StrategySpec("node-consolidation", tier=1, args={"measure": "count"}),
    )
)


def emptied(pods_by_node: Mapping[str, Sequence[str]], victims: set[str]) -> int:
    """Nodes whose every pod of the workload is among ``victims``."""
    return sum(1 for pods in pods_by_node.values() if pods and set(pods) <= victims)


async def bench(args: argparse.Namespace) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="bench-karpenter-") as tmp:
        started = k.start_autoscaled(Path(tmp))
        try:
            api = await config.new_client_from_config(config_file=str(started.plane.kubeconfig))
            async with api:
                await k.node_class(api)
                loop = Loop(started, KubeTestCluster(api), Kube(api))
                return await _runs(loop, args)
        finally:
            started.stop()


async def _runs(loop: Loop, args: argparse.Namespace) -> list[dict[str, object]]:
    if args.no_scale_in:
        return await _standing(loop, args)
    simulated: dict[str, list[int]] = {}

    async def orderings(loop: Loop, ledger: k.Ledger, namespace: str) -> None:
        objects = load_objects(await loop.podcost.dump(namespace))
        snapshot = snapshot_for_workload(objects, namespace, "web", "Deployment")
        by_node: dict[str, list[str]] = {}
        for pod in snapshot.pods:
            by_node.setdefault(pod.node or "", []).append(pod.name)
        now = time.time()
        for name, policy in (("controller (simulate)", None), ("PR #2894 (simulate)", PR_2894)):
            result = simulate(snapshot, args.to, now, policy=policy)
            count = emptied(by_node, {pod.name for pod in result.victims})
            simulated.setdefault(name, []).append(count)

    rows: list[dict[str, object]] = []
    for run in range(1, args.repeat + 1):
        for name, podcost in (("without podcost", None), ("podcost", Embedded())):
            await fresh_pools(loop, [{"name": "default"}])
            started = time.monotonic()
            outcome = await scenario(
                loop, replicas=args.pods, to=args.to, podcost=podcost,
                strategies=PODCOST_POLICY if podcost else None,
                before_scale_in=None if podcost else orderings,
            )  # fmt: skip
            row: dict[str, object] = {"variant": name, "run": run, **outcome.row(),
                   "run_s": round(time.monotonic() - started)}  # fmt: skip
            print(" ".join(f"{key}={value}" for key, value in row.items()), flush=True)
            rows.append(row)
    await k.delete_node_pools(loop.kube.api, loop.kube)
    for name, counts in simulated.items():
        for run, count in enumerate(counts, 1):
            rows.append({"variant": name, "run": run, "emptied_by_scale_in": count})
    return rows


async def _standing(loop: Loop, args: argparse.Namespace) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for run in range(1, args.repeat + 1):
        for non_negative in (False, True):
            await fresh_pools(loop, [{"name": "default"}])
            outcome = await standing(
                loop, replicas=args.pods, podcost=Embedded(non_negative_costs=non_negative)
            )
            row: dict[str, object] = {"variant": "no scale-in", "run": run, **outcome.row()}
            print(" ".join(f"{key}={value}" for key, value in row.items()), flush=True)
            rows.append(row)
    await k.delete_node_pools(loop.kube.api, loop.kube)
    return rows


def spread(rows: Sequence[Mapping[str, object]], key: str = "variant") -> list[dict[str, object]]:
    """Per ``key`` value with more than one run: min / median / max of every numeric column."""
    groups: dict[str, list[Mapping[str, object]]] = {}
    for row in rows:
        groups.setdefault(str(row.get(key, "")) + str(row.get("podcost", "")), []).append(row)
    summary: list[dict[str, object]] = []
    for runs in groups.values():
        if len(runs) < 2:
            continue
        numeric = [c for c, v in runs[0].items() if c != "run" and isinstance(v, int | float)]
        out: dict[str, object] = {key: runs[0][key], "run": "min/med/max"}
        if "podcost" in runs[0]:
            out["podcost"] = runs[0]["podcost"]
        for column in numeric:
            values = [float(str(r[column])) for r in runs if column in r]
            out[column] = "/".join(
                f"{v:g}" for v in (min(values), statistics.median(values), max(values))
            )
        summary.append(out)
    return summary


def _print(rows: Sequence[Mapping[str, object]]) -> None:
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    widths = {c: max(len(c), *(len(str(row.get(c, ""))) for row in rows)) for c in columns}
    print(" | ".join(c.ljust(widths[c]) for c in columns))
    print("-+-".join("-" * widths[c] for c in columns))
    for row in rows:
        print(" | ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--pods", type=int, default=200, help="replicas before (4 a node)")
    parser.add_argument("--to", type=int, default=100, help="replicas after the scale-in")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant")
    parser.add_argument(
        "--no-scale-in", action="store_true",
        help="compare the cost bands on a standing Deployment instead",
    )  # fmt: skip
    args = parser.parse_args()
    rows = asyncio.run(bench(args))
    _print(rows + spread(rows))
    if args.no_scale_in:
        figures = [
            f"{row['podcost']}: {row['nodes']} nodes, {row['seen_empty']} read as empty, "
            f"{row['removed_holding_pods']} removed with running pods, {row['evictions']} evicted"
            for row in rows
        ]
        title = f"real Karpenter (kwok), {args.pods} pods costed by podcost, no scale-in"
        record("bench_karpenter_bands", title, figures)
        return
    figures = []
    for name in dict.fromkeys(str(row["variant"]) for row in rows):
        runs = [row for row in rows if row["variant"] == name]
        if "nodes_before" in runs[0]:
            medians = {c: statistics.median(float(str(r[c])) for r in runs) for c in (
                "nodes_before", "nodes_after", "removed_empty", "evictions", "settle_s",
                "node_min_saved_10m")}  # fmt: skip
            figures.append(
                f"{name}: {medians['nodes_before']:g}→{medians['nodes_after']:g} nodes, "
                f"{medians['removed_empty']:g} removed empty, {medians['evictions']:g} evicted, "
                f"settled in {medians['settle_s']:g} s, {medians['node_min_saved_10m']:g} "
                f"node-min saved / 10 min" + (f" (median of {len(runs)})" if len(runs) > 1 else "")
            )
        else:
            count = statistics.median(float(str(r["emptied_by_scale_in"])) for r in runs)
            figures.append(
                f"{name}: {count:g} nodes emptied"
                + (f" (median of {len(runs)})" if len(runs) > 1 else "")
            )
    record(
        "bench_karpenter",
        f"real Karpenter (kwok) after a scale-in of {args.pods}→{args.to} pods",
        figures,
    )


if __name__ == "__main__":
    main()
