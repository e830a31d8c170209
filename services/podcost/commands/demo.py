"""``podcost demo``: podcost in embedded mode on a local control plane, end to end.

Brings up the project's own control plane (``podcost_localinfra``: real kube-apiserver,
kube-controller-manager, kube-scheduler, etcd and kwok nodes) and builds a small fleet-like
cluster: 3 zones, spot and on-demand nodes, one node tainted ``PreferNoSchedule``. Deploys two
opted-in workloads that Kubernetes places unevenly (zone-c is cordoned while they start) and
that ask for different strategies: ``shop/web`` keeps its zones balanced, ``shop/worker``
deletes spot pods first. Runs podcost embedded (watcher, rankers, aggregator and annotator over
the in-process bus) until the costs on the pods converge, scales both in, and shows side by
side what the real controller deleted with podcost and what it would have deleted without (the
victim model on the same pods with no costs, ``demo_compare``), as a table, a PNG chart
(``demo_chart``) and, with ``--json``, a machine-readable record of what it read from the
cluster. Stops everything it started, also on Ctrl-C and on error. Called by ``make demo``.

With ``--fleet`` the same scenario plays in two clusters served by one core over a Kafka
broker, every component its own process (``demo_fleet``); ``make demo-fleet`` runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import logging
import shutil
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from podcost.commands.demo_chart import ChartUnavailable, draw, require_matplotlib
from podcost.commands.demo_compare import CAPACITY, ZONE, Comparison, Outcome, compare, skew
from podcost.commands.demo_fleet import Fleet, fleet_processes, fleet_servers
from podcost.commands.demo_progress import Step, Steps
from podcost.embedded import Pipeline, bootstrap
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_core.model import Snapshot
from podcost_core.policy import DEFAULT_POLICY, policy_from_annotations
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube, connect

log = logging.getLogger("podcost.demo")

NAMESPACE = "shop"
#: Replicas each workload starts with (zone-c cordoned), then grows to once zone-c is back.
STARTING, FULL = 9, 12
NODES = [
    # name, zone, capacity type, taint effect
    ("node-a1", "zone-a", "on-demand", None),
    ("node-a2", "zone-a", "spot", None),
    ("node-b1", "zone-b", "on-demand", None),
    ("node-b2", "zone-b", "spot", "PreferNoSchedule"),
    ("node-c1", "zone-c", "on-demand", None),
    ("node-c2", "zone-c", "spot", None),
]
WAIT = 120.0
"""Seconds any one wait on the cluster may take before the demo gives up."""


@dataclass(frozen=True)
class Workload:
    """One opted-in Deployment of the demo and the policy its annotations ask for."""

    name: str
    strategies: str
    """``podcost.dev/strategies``."""
    aim: str
    spread_by: str | None = None
    """``podcost.dev/spread-by`` (only with ``topology-spread``)."""


WORKLOADS = (
    Workload("web", "topology-spread", "keep its zones balanced", spread_by=ZONE),
    Workload("worker", "capacity-type=3, untolerated-taints=1",
             "delete spot pods first, then pods on the tainted node"),
)  # fmt: skip


class DemoError(RuntimeError):
    """The demo cannot go on; the message says what went wrong, in one line."""


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


def _deployment(workload: Workload, replicas: int) -> Any:
    labels = {"app": workload.name}
    annotations = {"podcost.dev/enabled": "true", "podcost.dev/strategies": workload.strategies}
    if workload.spread_by:
        annotations["podcost.dev/spread-by"] = workload.spread_by
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": workload.name, "namespace": NAMESPACE, "labels": labels,
                     "annotations": annotations},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": workload.name,
                                         "image": f"registry.local/shop/{workload.name}:1",
                                         "resources": {"requests": {"cpu": "100m"}}}],
                         "terminationGracePeriodSeconds": 0},
            },
        },
    }  # fmt: skip


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not await check():
        if time.monotonic() > deadline:
            raise DemoError(f"gave up after {WAIT:.0f}s waiting for {what}")
        await asyncio.sleep(0.25)


async def _snapshots(
    kube: Kube, *, include_inactive: bool = True
) -> tuple[dict[str, Any], dict[str, Snapshot]]:
    """The namespace's dump, and each workload's snapshot from it (with ``include_inactive``,
    the terminating pods too)."""
    dump = await kube.dump(NAMESPACE)
    objects = load_objects(dump)
    return dump, {
        w.name: snapshot_for_workload(
            objects, NAMESPACE, w.name, "Deployment", include_inactive=include_inactive
        )
        for w in WORKLOADS
    }


def _settled(snapshot: Snapshot) -> int:
    """How many pods of ``snapshot`` are active and ready (none of them terminating)."""
    return sum(pod.active and pod.ready for pod in snapshot.pods)


async def _wait_settled(kube: Kube, step: Step, replicas: int) -> None:
    """Until every workload has exactly ``replicas`` pods, all ready, none terminating."""

    async def settled() -> bool:
        _, snapshots = await _snapshots(kube)
        step.advance_to(sum(min(_settled(s), replicas) for s in snapshots.values()))
        return all(len(s.pods) == replicas == _settled(s) for s in snapshots.values())

    await _until(settled, f"{replicas} ready pods in each workload")


def _unconverged(snapshot: Snapshot) -> int:
    """How many active pods still lack the cost podcost's current decision gives them (a pod
    without the annotation reads as 0, and podcost leaves it so where 0 is what it wants)."""
    active = [pod for pod in snapshot.pods if pod.active]
    policy = policy_from_annotations(snapshot.annotations, default=DEFAULT_POLICY)
    writes = simulate(snapshot, len(active), time.time(), policy=policy).writes
    return sum(pod.name in writes for pod in active)


@contextlib.asynccontextmanager
async def _podcost(kube: Kube) -> AsyncIterator[Callable[[], None]]:
    """podcost in embedded mode, watching the demo's namespace, for as long as the block runs.

    Runs the services as tasks rather than through ``runner.serve``: that one takes over
    SIGINT, and the demo wants Ctrl-C to stop the demo. Yields a check that raises if a
    service stopped by itself.
    """
    settings = ServiceSettings(cluster="demo", http_port=0, dry_run=False, policy_file=None)
    pipeline: Pipeline = bootstrap(
        settings, BusSettings(bootstrap_servers=None), kube=kube, bus=MemoryBus(),
        watcher_settings=WatcherSettings(namespace=NAMESPACE, debounce_seconds=0.2,
                                         max_delay_seconds=1.0, leader_election=False),
    )  # fmt: skip
    await pipeline.bus.start()
    tasks = [asyncio.create_task(s.run(), name=s.name) for s in pipeline.services]

    def healthy() -> None:
        for task in tasks:
            if task.done():
                error = None if task.cancelled() else task.exception()
                raise DemoError(f"podcost's {task.get_name()} stopped: {error or 'cancelled'}")

    try:
        yield healthy
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pipeline.bus.stop()


@contextlib.asynccontextmanager
async def _fleet_running(fleet: Fleet) -> AsyncIterator[Callable[[], None]]:
    """The fleet's processes run already, for every cluster: yield their health check."""
    yield fleet.healthy


Podcost = Callable[[Kube], AbstractAsyncContextManager[Callable[[], None]]]
"""Runs podcost on a cluster for as long as its block runs; yields a health check."""


@dataclass(frozen=True)
class Result:
    """What the demo read from the cluster: the comparison and the pods left, per workload."""

    comparisons: list[Comparison]
    remaining: dict[str, list[dict[str, object]]]
    dump: dict[str, Any]
    """The namespace as podcost left it before the scale-in (``kubectl get -o json`` shape)."""


async def _scenario(
    kube: Kube, steps: Steps, target: int, podcost: Podcost = _podcost, who: str = "embedded"
) -> Result:
    with steps.step("Creating 6 nodes in 3 zones (spot and on-demand; zone-c cordoned)"):
        await kube.create([_node(*spec, cordoned=spec[1] == "zone-c") for spec in NODES])
        await kube.create([{"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": NAMESPACE}}])  # fmt: skip

        async def has_service_account() -> bool:
            accounts = await kube.core.list_namespaced_service_account(NAMESPACE)
            return bool(accounts.items)

        await _until(has_service_account, "the namespace's default service account")
    names = " and ".join(f"{NAMESPACE}/{w.name}" for w in WORKLOADS)
    total = STARTING * len(WORKLOADS)
    with steps.step(f"Deploying {names} ({STARTING} replicas each)", total) as step:
        await kube.create([_deployment(w, STARTING) for w in WORKLOADS])
        await _wait_settled(kube, step, STARTING)
    total = FULL * len(WORKLOADS)
    with steps.step(f"zone-c is back: uncordoning it, scaling both to {FULL}", total) as step:
        for name, zone, *_ in NODES:
            if zone == "zone-c":
                await kube.core.patch_node(name, {"spec": {"unschedulable": False}})
        for workload in WORKLOADS:
            await kube.scale(NAMESPACE, "Deployment", workload.name, FULL)
        await _wait_settled(kube, step, FULL)

    async with podcost(kube) as healthy:
        with steps.step(f"podcost ({who}) ranks the pods and writes costs", total) as step:

            async def converged() -> bool:
                healthy()
                _, snapshots = await _snapshots(kube, include_inactive=False)
                missing = sum(_unconverged(s) for s in snapshots.values())
                step.advance_to(total - missing)
                return missing == 0

            await _until(converged, "podcost's costs to converge")
            # The controller decides from its informer cache: give it a moment to see the writes.
            await asyncio.sleep(1.0)
        dump, before = await _snapshots(kube, include_inactive=False)
        deletions = (FULL - target) * len(WORKLOADS)
        with steps.step(
            f"Scaling both to {target}: the real controller chooses", deletions
        ) as step:
            now = time.time()
            for workload in WORKLOADS:
                await kube.scale(NAMESPACE, "Deployment", workload.name, target)

            async def scaled_in() -> bool:
                healthy()
                _, snapshots = await _snapshots(kube)
                step.advance_to(sum(FULL - _settled(s) for s in snapshots.values()))
                return all(len(s.pods) == target == _settled(s) for s in snapshots.values())

            await _until(scaled_in, f"the scale-in to {target}")
        _, after = await _snapshots(kube)

    comparisons: list[Comparison] = []
    remaining: dict[str, list[dict[str, object]]] = {}
    for workload in WORKLOADS:
        snapshot = before[workload.name]
        left = {pod.name for pod in after[workload.name].pods if pod.active}
        strays = left - {pod.name for pod in snapshot.pods}
        if strays:
            raise DemoError(f"{workload.name}: pods appeared during the scale-in: {sorted(strays)}")
        deleted = [pod.name for pod in snapshot.pods if pod.active and pod.name not in left]
        comparison = compare(snapshot, target, deleted, now, strategies=workload.strategies)
        comparisons.append(comparison)
        remaining[comparison.workload] = [
            place.to_json() for place in comparison.before if place.name in left
        ]
    return Result(comparisons, remaining, dump)


def _counts(counts: Mapping[str, int]) -> str:
    return " ".join(f"{key}={value}" for key, value in sorted(counts.items()))


def _victims(outcome: Outcome) -> str:
    tied = set(outcome.tied)
    lines = [
        f"{p.name}  {p.zone}  {p.capacity}{'  *' if p.name in tied else ''}"
        for p in outcome.deleted
    ]
    if outcome.tie_picks:
        lines.append(f"* {outcome.tie_picks} of {len(tied)} tied pods, picked at random")
    return "\n".join(lines)


def _table(console: Console, comparison: Comparison, aim: str) -> None:
    without, ours = comparison.without, comparison.with_podcost
    table = Table(
        title=escape(
            f"{comparison.workload} [{comparison.strategies}]: scale-in "
            f"{comparison.replicas_before} → {comparison.replicas_after} ({aim})"
        )
    )
    table.add_column("")
    table.add_column("without podcost (victim model, no costs)", no_wrap=True)
    table.add_column("with podcost (deleted by the real controller)", no_wrap=True)
    table.add_row("deleted", _victims(without), _victims(ours))
    table.add_row(
        "zones before", _counts(comparison.zones_before), _counts(comparison.zones_before)
    )
    table.add_row("zones after", _counts(without.zones_after), _counts(ours.zones_after))
    zones = skew(comparison.zones_before)
    table.add_row("zone skew", f"{zones} → {without.zone_skew}", f"{zones} → {ours.zone_skew}")
    capacity = _counts(comparison.capacity_before)
    table.add_row("capacity before", capacity, capacity)
    table.add_row("capacity after", _counts(without.capacity_after), _counts(ours.capacity_after))
    console.print(table)
    verdict = (
        "[green]exactly what podcost's costs predicted[/green]"
        if comparison.as_predicted
        else f"[red]NOT what podcost's costs predicted ({', '.join(comparison.predicted)})[/red]"
    )
    console.print(f"{comparison.workload}: the real kube-controller-manager deleted {verdict}.")


def _next_steps(console: Console, dump_path: Path) -> None:
    tips = [
        (f"podcost simulate --snapshot {dump_path} --workload {NAMESPACE}/worker --replicas 4 "
         "--output table", "what-if on the demo's cluster as podcost left it, or on any "
         "`kubectl get pods,nodes,replicasets,deployments -A -o json`"),
        ("make cluster-up && export KUBECONFIG=<the path it prints> && podcost run",
         "podcost on a control plane that stays up; opt a Deployment in with the annotation "
         "podcost.dev/enabled: \"true\" (make cluster-down stops it)"),
    ]  # fmt: skip
    if importlib.util.find_spec("podcost.commands.explain") is not None:
        tips.append(("podcost explain NAMESPACE/POD", "while podcost runs: why a pod carries "
                     "its deletion cost, strategy by strategy"))  # fmt: skip
    console.print("\nWhat to try next:")
    for command, why in tips:
        console.print(f"  {command}\n      {why}", highlight=False, soft_wrap=True)


def _log_to(path: Path) -> logging.Handler:
    """Send every log record (podcost's services, the clients) to ``path``, not the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


@contextlib.contextmanager
def _control_plane(steps: Steps, console: Console) -> Iterator[Path]:
    """Build (once) and start the local control plane; yield its kubeconfig; stop it."""
    try:
        from podcost_localinfra import build, cluster, process
    except ImportError:
        raise DemoError("needs the local infrastructure; run `make demo` in a checkout") from None
    with steps.step("Building the control plane (cached after the first time)"):
        build.ensure_cluster_tools()
    run_dir = Path(tempfile.mkdtemp(prefix="podcost-demo-"))
    keep = False
    try:
        with steps.step("Starting etcd, kube-apiserver, controller-manager, scheduler, kwok"):
            control_plane = cluster.start(run_dir)
        console.print(f"Control plane up at {control_plane.server}", highlight=False)
        yield control_plane.kubeconfig
    except Exception:
        keep = True  # the servers' logs say why
        raise
    finally:
        with steps.step("Stopping the control plane"):
            process.stop_all(run_dir)
        if keep:
            log.error("server logs kept in %s", run_dir / "logs")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


def _default_out(fleet: bool) -> Path:
    name = "podcost-demo-fleet.png" if fleet else "podcost-demo.png"
    try:
        from podcost_localinfra import paths
    except ImportError:
        return Path.cwd() / name
    return paths.cache_dir() / "demo" / name


def _fleet(steps: Steps, target: int) -> dict[str, Result]:
    """The scenario in each cluster of a fleet, one cluster after the other, with one core."""
    strategies = sorted({
        name for w in WORKLOADS
        for name in policy_from_annotations(
            _deployment(w, FULL)["metadata"]["annotations"], default=DEFAULT_POLICY
        ).names
    })  # fmt: skip
    with fleet_servers(steps) as servers, fleet_processes(servers, strategies, NAMESPACE) as fleet:

        async def run() -> dict[str, Result]:
            clusters = " and ".join(servers.kubeconfigs)
            with steps.step(
                f"Starting podcost: agents of {clusters}, one core ({len(fleet)} processes)",
                len(fleet),
            ) as step:
                deadline = time.monotonic() + 2 * WAIT
                while (ready := await fleet.ready()) < len(fleet):
                    step.advance_to(ready)
                    if time.monotonic() > deadline:
                        raise DemoError(f"only {ready} of {len(fleet)} processes ready after "
                                        f"{2 * WAIT:.0f}s")  # fmt: skip
                    await asyncio.sleep(0.5)
            results: dict[str, Result] = {}
            for name, kubeconfig in servers.kubeconfigs.items():
                async with connect(str(kubeconfig)) as kube:
                    result = await _scenario(
                        kube, steps, target, podcost=lambda _: _fleet_running(fleet),
                        who=f"fleet, cluster {name}",
                    )  # fmt: skip
                comparisons = [dataclasses.replace(c, workload=f"{name}: {c.workload}")
                               for c in result.comparisons]  # fmt: skip
                remaining = {f"{name}: {key}": pods for key, pods in result.remaining.items()}
                results[name] = Result(comparisons, remaining, result.dump)
            return results

        return asyncio.run(run())


def _demo(
    console: Console, target: int, out: Path, json_path: Path | None, fleet: bool = False
) -> bool:
    steps = Steps(console)
    results: dict[str, Result]
    if fleet:
        results = _fleet(steps, target)
    else:
        with _control_plane(steps, console) as kubeconfig:

            async def scenario() -> Result:
                async with connect(str(kubeconfig)) as kube:
                    return await _scenario(kube, steps, target)

            results = {"": asyncio.run(scenario())}
    comparisons = [c for result in results.values() for c in result.comparisons]
    for result in results.values():
        for workload, comparison in zip(WORKLOADS, result.comparisons, strict=True):
            console.print()
            _table(console, comparison, workload.aim)
    draw(comparisons, out)
    console.print(f"\nChart: {out}", highlight=False, soft_wrap=True)
    dump_paths = []
    for cluster, result in results.items():
        dump_path = out.with_name(f"{out.stem}{'-' + cluster if cluster else ''}-cluster.json")
        dump_path.write_text(json.dumps(result.dump, indent=1))
        dump_paths.append(dump_path)
    if json_path is not None:
        document = {
            "version": 1,
            "chart": str(out),
            "workloads": [
                comparison.to_json()
                | {"remaining": result.remaining[comparison.workload]}
                | ({"cluster": cluster} if cluster else {})
                for cluster, result in results.items()
                for comparison in result.comparisons
            ],
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(document, indent=1))
        console.print(f"Result: {json_path}", highlight=False, soft_wrap=True)
    _next_steps(console, dump_paths[0])
    return all(comparison.as_predicted for comparison in comparisons)


def demo_command(
    replicas: Annotated[
        int, typer.Option(min=1, max=FULL - 1, help="The replica count both workloads scale to.")
    ] = 6,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Where to write the PNG chart [~/.cache/podcost/demo/podcost-demo.png, "
            "podcost-demo-fleet.png with --fleet]."
        ),
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="Also write what the demo read from the cluster, as JSON."),
    ] = None,
    fleet: Annotated[
        bool,
        typer.Option(
            "--fleet",
            help="Two clusters and one core over a Kafka broker, every component its own "
            "process, instead of podcost embedded in one cluster.",
        ),
    ] = False,
) -> None:
    """Run podcost embedded on a local control plane it starts and stops itself, and compare a
    scale-in with and without it."""
    console = Console(highlight=False)
    if not console.is_terminal:
        # A pipe or a file has no width: keep the tables whole rather than cut at 80 columns.
        console.width = max(console.width, 160)
    out = (out or _default_out(fleet)).resolve()
    log_path = out.with_suffix(".log")
    try:
        require_matplotlib()
    except ChartUnavailable as error:
        typer.echo(f"podcost demo: {error}", err=True)
        raise typer.Exit(2) from None
    handler = _log_to(log_path)
    try:
        agrees = _demo(console, replicas, out, json_path, fleet)
    except KeyboardInterrupt:
        typer.echo("\npodcost demo: interrupted; stopped everything it started", err=True)
        raise typer.Exit(130) from None
    except Exception as error:  # the demo's last word: one line here, the traceback in the log
        log.error("the demo failed:\n%s", traceback.format_exc())
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        typer.echo(f"podcost demo: {first} (details: {log_path})", err=True)
        raise typer.Exit(1) from None
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    if not agrees:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``podcost demo`` to ``app``."""
    app.command("demo")(demo_command)
