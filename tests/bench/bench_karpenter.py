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

``python -m tests.bench.bench_karpenter [--pods 200 --to 100]`` (``make bench``; needs
``make karpenter-tools``). Slow: each run waits for Karpenter's consolidation rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from kubernetes_asyncio import config
from tests.bench.record import record
from tests.support import karpenter as k
from tests.support.karpenter_scenarios import Loop, fresh_pools, scenario
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
    simulated: dict[str, int] = {}

    async def orderings(loop: Loop, ledger: k.Ledger, namespace: str) -> None:
        objects = load_objects(await loop.podcost.dump(namespace))
        snapshot = snapshot_for_workload(objects, namespace, "web", "Deployment")
        by_node: dict[str, list[str]] = {}
        for pod in snapshot.pods:
            by_node.setdefault(pod.node or "", []).append(pod.name)
        now = time.time()
        for name, policy in (("controller (simulate)", None), ("PR #2894 (simulate)", PR_2894)):
            result = simulate(snapshot, args.to, now, policy=policy)
            simulated[name] = emptied(by_node, {pod.name for pod in result.victims})

    rows: list[dict[str, object]] = []
    for name, podcost in (("without podcost", False), ("podcost", True)):
        await fresh_pools(loop, [{"name": "default"}])
        started = time.monotonic()
        outcome = await scenario(
            loop, replicas=args.pods, to=args.to, podcost=podcost,
            strategies=PODCOST_POLICY if podcost else None,
            before_scale_in=None if podcost else orderings,
        )  # fmt: skip
        rows.append({"variant": name, **outcome.row(), "run_s": round(time.monotonic() - started)})
    await k.delete_node_pools(loop.kube.api, loop.kube)
    for name, count in simulated.items():
        rows.append({"variant": name, "emptied_by_scale_in": count})
    return rows


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
    args = parser.parse_args()
    rows = asyncio.run(bench(args))
    _print(rows)
    runs = {str(row["variant"]): row for row in rows}
    figures = [
        f"{name}: {row['nodes_before']}→{row['nodes_after']} nodes, "
        f"{row['removed_empty']} removed empty, {row['evictions']} evicted, "
        f"settled in {row['settle_s']} s, {row['node_min_saved_10m']} node-min saved / 10 min"
        for name, row in runs.items()
        if "nodes_before" in row
    ] + [
        f"{name}: {row['emptied_by_scale_in']} nodes emptied"
        for name, row in runs.items()
        if "emptied_by_scale_in" in row
    ]
    record(
        "bench_karpenter",
        f"real Karpenter (kwok) after a scale-in of {args.pods}→{args.to} pods",
        figures,
    )


if __name__ == "__main__":
    main()
