"""``podcost demo``: the embedded-default demo on a local control plane, end to end.

Brings up the project's own control plane (``podcost_localinfra``: real kube-apiserver,
kube-controller-manager, kube-scheduler, etcd and kwok nodes), builds a small fleet-like
cluster (3 zones, spot and on-demand nodes, one PreferNoSchedule-tainted node), deploys an
opted-in workload whose pods end up unevenly spread, and shows what happens on scale-in: what
Kubernetes deletes by itself (the victim model over the pods as they are) against what it
deletes once podcost has written its costs — and then lets the real controller do it and
checks that prediction. Stops everything it started. Called by ``make demo``.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from podcost_core.convert import load_objects, snapshot_for_workload
from podcost_core.model import Snapshot
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.simulate import SimulationResult, simulate
from podcost_kube.client import Kube, connect

NAMESPACE = "shop"
WORKLOAD = "web"
ZONE = "topology.kubernetes.io/zone"
CAPACITY = "karpenter.sh/capacity-type"
NODES = [
    # name, zone, capacity type, taint effect
    ("node-a1", "zone-a", "on-demand", None),
    ("node-a2", "zone-a", "spot", None),
    ("node-b1", "zone-b", "on-demand", None),
    ("node-b2", "zone-b", "spot", "PreferNoSchedule"),
    ("node-c1", "zone-c", "on-demand", None),
    ("node-c2", "zone-c", "spot", None),
]


def _node(name: str, zone: str, capacity: str, taint: str | None, cordoned: bool) -> Any:
    spec: dict[str, Any] = {"unschedulable": cordoned}
    if taint:
        spec["taints"] = [{"key": "demo.podcost.dev/draining", "value": "true", "effect": taint}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {ZONE: zone, CAPACITY: capacity, "kubernetes.io/hostname": name},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": spec,
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                   "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
    }  # fmt: skip


def _deployment(replicas: int) -> Any:
    labels = {"app": WORKLOAD}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": WORKLOAD, "namespace": NAMESPACE, "labels": labels,
                     "annotations": {"podcost.dev/enabled": "true"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "web", "image": "registry.local/shop/web:1",
                                         "resources": {"requests": {"cpu": "100m"}}}],
                         "terminationGracePeriodSeconds": 0},
            },
        },
    }  # fmt: skip


async def _until(check: Any, what: str, limit: float = 90) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {limit:.0f}s waiting for {what}")
        await asyncio.sleep(0.25)


async def _snapshot(kube: Kube) -> Snapshot:
    objects = load_objects(await kube.dump())
    return snapshot_for_workload(objects, NAMESPACE, WORKLOAD, kind="Deployment")


async def _ready_pods(kube: Kube) -> list[dict[str, Any]]:
    pods = (await kube.dump(NAMESPACE))["items"]
    return [
        pod for pod in pods
        if pod["kind"] == "Pod" and not pod["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True"
                for c in pod.get("status", {}).get("conditions", []))
    ]  # fmt: skip


async def _wait_ready(kube: Kube, count: int) -> None:
    async def ready() -> bool:
        return len(await _ready_pods(kube)) == count

    await _until(ready, f"{count} ready pods")


def _placement_table(console: Console, snapshot: Snapshot) -> None:
    table = Table(title="Nodes and the pods of shop/web on them")
    for column in ("node", "zone", "capacity", "taint", "pods"):
        table.add_column(column)
    per_node: dict[str, int] = {}
    for pod in snapshot.pods:
        if pod.node:
            per_node[pod.node] = per_node.get(pod.node, 0) + 1
    for name, zone, capacity, taint in NODES:
        table.add_row(name, zone, capacity, taint or "", str(per_node.get(name, 0)))
    console.print(table)


def _comparison_table(console: Console, baseline: SimulationResult, ours: SimulationResult,
                      snapshot: Snapshot) -> None:  # fmt: skip
    capacity = {
        pod.name: snapshot.nodes[pod.node].labels.get(CAPACITY, "?")
        for pod in snapshot.pods
        if pod.node and pod.node in snapshot.nodes
    }
    table = Table(title=f"Scale-in {ours.replicas_before} → {ours.replicas_after}: who goes")
    table.add_column("")
    table.add_column("without podcost (Kubernetes today)")
    table.add_column("with podcost")

    def describe(result: SimulationResult) -> str:
        return "\n".join(
            f"{pod.name} ({result.pod_domains.get(pod.name)}, {capacity.get(pod.name, '?')})"
            for pod in result.victims
        )

    def spread(result: SimulationResult) -> str:
        return ", ".join(f"{d}={n}" for d, n in sorted(result.domains_after.items()))

    def spot_left(result: SimulationResult) -> str:
        gone = {pod.name for pod in result.victims}
        left = [name for name in capacity if name not in gone]
        return f"{sum(capacity[name] == 'spot' for name in left)} of {len(left)}"

    table.add_row("victims", describe(baseline), describe(ours))
    before = ", ".join(f"{d}={n}" for d, n in sorted(ours.domains_before.items()))
    table.add_row("zones before", before, before)
    table.add_row("zones after", spread(baseline), spread(ours))
    table.add_row("zone skew", f"{baseline.skew_before} → {baseline.skew_after}",
                  f"{ours.skew_before} → {ours.skew_after}")  # fmt: skip
    table.add_row("spot pods left", spot_left(baseline), spot_left(ours))
    console.print(table)


async def _run_demo(console: Console, kubeconfig: Path, target: int) -> bool:
    async with connect(str(kubeconfig)) as kube:
        with console.status("Creating 6 nodes in 3 zones (zone-c cordoned) ..."):
            await kube.create([_node(*spec, cordoned=spec[1] == "zone-c") for spec in NODES])
            await kube.create([{"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": NAMESPACE}}])  # fmt: skip

            async def has_service_account() -> bool:
                accounts = await kube.core.list_namespaced_service_account(NAMESPACE)
                return bool(accounts.items)

            await _until(has_service_account, "the namespace's default service account")
        with console.status("Deploying shop/web (9 replicas) while zone-c is cordoned ..."):
            await kube.create([_deployment(9)])
            await _wait_ready(kube, 9)
        with console.status("zone-c is back: uncordoning it and scaling shop/web to 12 ..."):
            for name, zone, *_ in NODES:
                if zone == "zone-c":
                    await kube.core.patch_node(name, {"spec": {"unschedulable": False}})
            await kube.scale(NAMESPACE, "Deployment", WORKLOAD, 12)
            await _wait_ready(kube, 12)

        snapshot = await _snapshot(kube)
        _placement_table(console, snapshot)
        now = time.time()
        baseline = simulate(snapshot, target, now, policy=None)
        ours = simulate(snapshot, target, now, policy=DEFAULT_POLICY)
        _comparison_table(console, baseline, ours, snapshot)

        with console.status(f"podcost writes {len(ours.writes)} deletion costs ..."):
            by_name = {pod.name: pod for pod in snapshot.pods}
            for name, cost in ours.writes.items():
                await kube.patch_deletion_cost(by_name[name].namespace, name, cost)
            # The controller decides from its informer cache: let it see the writes.
            await asyncio.sleep(1.0)
        with console.status(f"Scaling shop/web to {target}: the real controller chooses ..."):
            before = {pod.name for pod in snapshot.pods if pod.active}
            await kube.scale(NAMESPACE, "Deployment", WORKLOAD, target)
            await _wait_ready(kube, target)
            remaining = {pod["metadata"]["name"] for pod in await _ready_pods(kube)}
        deleted = before - remaining
        predicted = {pod.name for pod in ours.victims}
        tied = {pod.name for pod in ours.tied}
        agrees = deleted - tied == predicted - tied and len(deleted) == len(predicted)
        console.print(f"The real kube-controller-manager deleted: {', '.join(sorted(deleted))}")
        verdict = "[green]as podcost predicted[/green]" if agrees else "[red]NOT as predicted[/red]"
        console.print(f"That is {verdict}.")
        return agrees


def demo_command(
    replicas: Annotated[int, typer.Option(help="The replica count to scale in to.")] = 6,
) -> None:
    """Run the demo on a local control plane it starts and stops itself."""
    console = Console()
    try:
        from podcost_localinfra import build, cluster
    except ImportError:
        console.print("podcost demo: needs the local infrastructure; run `make demo` in a checkout")
        raise typer.Exit(2) from None
    with console.status("Building the control plane (cached after the first time) ..."):
        build.ensure_cluster_tools()
    with tempfile.TemporaryDirectory(prefix="podcost-demo-") as run_dir:
        with console.status("Starting etcd, kube-apiserver, controller-manager, scheduler, kwok"):
            control_plane = cluster.start(Path(run_dir))
        console.print(f"Control plane up at {control_plane.server}")
        try:
            agrees = asyncio.run(_run_demo(console, control_plane.kubeconfig, replicas))
        finally:
            with console.status("Stopping the control plane ..."):
                control_plane.stop()
    console.print(
        "Next: `podcost simulate --help` for what-if questions on your own cluster's dump "
        "(kubectl get pods,nodes,replicasets,deployments -A -o json)."
    )
    if not agrees:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)
