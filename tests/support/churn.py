"""Two clusters played through the same seeded churn, one of them disturbed: the machinery of the
fault tests that run podcost as processes (``tests/e2e/test_sigkill.py``,
``tests/e2e/test_broker_outage_fleet.py``).

Two real control planes. Cluster ``a`` runs the pipeline under test; cluster ``b``, the twin,
runs its own complete pipeline, undisturbed: ``podcost run`` in one process, as the chart's
``all`` mode runs it without Kafka, so nothing of ``a``'s (topics, consumer groups, faust tables)
is shared with it. ``a`` runs every component as the chart does, each its own process (the
watcher and annotator of the ``agent`` mode, one ranker per strategy and the faust aggregator of
the ``core`` mode, with the test's own topics and app id), or ``podcost run`` as one process,
embedded or with ``--kafka`` (:func:`twin_specs`). Both get the same seeded scenario
(``tests/support/twin.py``): the same nodes, the same Deployments placed by node capacity, then
the same churn steps, step by step on both (:func:`play`).

A process that exits by itself is started again, as the kubelet restarts a container
(:class:`Kubelet`); each such exit is kept with its last log line and printed.

Once both clusters are quiet (nothing left to write, and nothing changes for a few seconds),
:func:`judge`:

- ``a`` converged: podcost has nothing left to write, and every cost on an active pod of an
  opted-in Deployment is one podcost wrote (a pod without one reads as 0, where podcost wants 0);
- the twin's verdict: for every Deployment and every ``k``, the zones left after the real
  controller's victim selection deletes ``k`` pods by the written costs
  (``podcost_core.simulate`` with ``policy=None``: the controller model, not podcost's ranking)
  are the same in ``a`` and ``b``; a ``k`` where the written costs tie is left out;
- no decision lost (Kafka variants): each active pod's cost is the newest decision's about it on
  ``a``'s costs topic;
- no cost rewound (Kafka variants): the costs read on ``a``'s pods every 0.3 s never go back to
  an older decision's value after a newer one was written (``twin.rewinds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer
from kubernetes_asyncio.client.exceptions import ApiException

from podcost_contracts.messages import DesiredCostsMessage, decode
from podcost_contracts.topics import Topics
from podcost_core.policy import Policy
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube
from tests.support.kube import (
    CAPACITY_LABEL,
    COST_ANNOTATION,
    ZONE_LABEL,
    KubeTestCluster,
    costed_by_podcost,
)
from tests.support.services import CHART, ServiceProcess, ServiceSpec, chart_policy, chart_specs
from tests.support.services import processes as started_processes
from tests.support.tools import require_helm
from tests.support.twin import App, Decision, Scenario, Step, newest_costs, rewinds

QUIET_SECONDS = 3.0


@dataclass
class Side:
    """One cluster of the pair: its API, the nodes made on it, its podcost processes."""

    name: str
    kube: KubeTestCluster
    namespace: str
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    policy: Policy | None = None
    """The default policy its processes load; ``None``: the chart's (:func:`chart_policy`)."""


@dataclass
class Watch:
    """What the test reads of cluster ``a`` during a seed: every decision on its costs topic and
    the successive cost values of each pod (by uid)."""

    decisions: list[Decision] = field(default_factory=list)
    observed: dict[str, list[tuple[float, int | None]]] = field(default_factory=dict)
    """pod uid → (wall-clock time of the read, cost) each time the cost read changed."""


# --- the processes -------------------------------------------------------------------------------


def fleet_specs(
    helm: Path,
    kafka: str,
    run: str,
    kubeconfig: Path,
    agent: Mapping[str, Any] | None = None,
    chart: Path = CHART,
    common: Mapping[str, Any] | None = None,
) -> list[ServiceSpec]:
    """Cluster ``a``'s fleet as the chart deploys it, each component its own process (``a/...``):
    the watcher and annotator of the ``agent`` mode (watching namespace ``run``, Lease
    ``<run>-watcher``, with the chart values ``agent`` over these), one ranker per strategy and
    the faust aggregator of the ``core`` mode, on the API server of ``kubeconfig``; rendered
    from this checkout's chart or from ``chart`` (another release's), with the values
    ``common`` in both modes."""
    values = {"mode": "agent", "clusterName": "a", "watch": {"namespace": run},
              "kafka": {"bootstrapServers": kafka},
              "leaderElection": {"leaseName": f"{run}-watcher"}, **(common or {}),
              **(agent or {})}  # fmt: skip
    core = chart_specs(helm, {"mode": "core", "kafka": {"bootstrapServers": kafka},
                              **(common or {})}, prefix="a/", chart=chart)  # fmt: skip
    mine = [*chart_specs(helm, values, prefix="a/", chart=chart), *core]
    return [dataclasses.replace(s, env={**s.env, "KUBECONFIG": str(kubeconfig)}) for s in mine]


def twin_specs(
    helm: Path, kafka: str, run: str, plane_a: Path, plane_b: Path, shape: str
) -> list[ServiceSpec]:
    """``a``'s processes (``shape``: ``fleet``, ``embedded`` or ``kafka``) and the twin's."""
    watch = {"namespace": run}
    lease = {"leaseName": f"{run}-watcher"}
    twin = chart_specs(helm, {"mode": "all", "clusterName": "b", "watch": watch,
                              "leaderElection": lease}, prefix="b/")  # fmt: skip
    specs = [dataclasses.replace(s, env={**s.env, "KUBECONFIG": str(plane_b)}) for s in twin]
    if shape == "fleet":
        return specs + fleet_specs(helm, kafka, run, plane_a)
    embedded = chart_specs(helm, {"mode": "all", "clusterName": "a", "watch": watch,
                                  "leaderElection": lease}, prefix="a/")  # fmt: skip
    extra = ("--kafka", kafka) if shape == "kafka" else ()
    mine = [dataclasses.replace(s, args=(*s.args, *extra)) for s in embedded]
    return specs + [dataclasses.replace(s, env={**s.env, "KUBECONFIG": str(plane_a)}) for s in mine]


def run_env(run: str) -> dict[str, str]:
    """The environment of every process of run ``run``: its own topics and aggregator app id."""
    topics = run_topics(run)
    return {
        "PODCOST_TOPIC_WORKLOADS": topics.workloads,
        "PODCOST_TOPIC_RANKS": topics.ranks,
        "PODCOST_TOPIC_COSTS": topics.costs,
        "PODCOST_TOPIC_DEADLETTER": topics.deadletter,
        "PODCOST_AGGREGATOR_APP_ID": f"{run}-aggregator",
    }


def run_topics(run: str) -> Topics:
    return Topics(
        workloads=f"{run}.workloads", ranks=f"{run}.ranks",
        costs=f"{run}.costs", deadletter=f"{run}.deadletter",
    )  # fmt: skip


# --- playing a scenario on a cluster -------------------------------------------------------------


def node_name(run: str, app: App | str, index: int | str) -> str:
    name = app.name if isinstance(app, App) else app
    return f"{run}-{name}-{index}"


async def prepare(side: Side, run: str, plan: Scenario) -> None:
    """The nodes of every Deployment, then the Deployments, all pods Ready."""
    made = []
    for app in plan.apps:
        for index, (zone, capacity) in enumerate(app.nodes):
            node = node_name(run, app, index)
            side.nodes.append(node)
            made.append(side.kube.create_node(
                node, zone=zone, capacity_type="on-demand", pods=str(capacity),
                labels={"fleet": node_name(run, app, "pool")},
            ))  # fmt: skip
    await asyncio.gather(*made)
    for app in plan.apps:
        pool = {"fleet": node_name(run, app, "pool")}
        await side.kube.create_deployment(
            side.namespace, app.name, app.replicas, opt_in=True, node_selector=pool
        )
    await asyncio.gather(*(
        side.kube.wait_ready(side.namespace, app.name, app.replicas) for app in plan.apps
    ))  # fmt: skip


async def apply_step(
    side: Side, run: str, plan: Scenario, index: int, replicas: dict[str, int]
) -> None:
    """Step ``index`` on one cluster, until its pods are where the step puts them."""
    step = plan.steps[index]
    app = next(a for a in plan.apps if a.name == step.app)
    kube, namespace = side.kube, side.namespace
    if step.kind == "scale-out":
        node = node_name(run, app, f"x{index}")
        side.nodes.append(node)
        await kube.create_node(node, zone=step.zone, capacity_type="on-demand",
                               pods=str(step.amount),
                               labels={"fleet": node_name(run, app, "pool")})  # fmt: skip
        await kube.scale(namespace, app.name, replicas[app.name] + step.amount)
    elif step.kind == "delete-pod":
        target = node_name(run, app, step.node)
        on_node = sorted(p.name for p in await kube.active_pods(namespace, app.name)
                         if p.node == target)  # fmt: skip
        if on_node:
            with contextlib.suppress(ApiException):
                await kube.core.delete_namespaced_pod(on_node[0], namespace)
    elif step.kind == "taint":
        taint = {"key": "podcost.dev/test-drain", "value": "soon", "effect": "PreferNoSchedule"}
        await kube.core.patch_node(node_name(run, app, step.node), {"spec": {"taints": [taint]}})
    elif step.kind == "spot":
        for node_index, (zone, _) in enumerate(app.nodes):
            if zone == step.zone:
                spot = {"metadata": {"labels": {CAPACITY_LABEL: "spot"}}}
                await kube.core.patch_node(node_name(run, app, node_index), spot)
    elif step.kind == "scale-in":
        await kube.scale_and_observe(namespace, app.name, replicas[app.name] - step.amount)
    else:
        raise AssertionError(f"unknown step {step}")
    await kube.wait_ready(namespace, app.name, replicas_after(replicas, step)[app.name])


def replicas_after(replicas: Mapping[str, int], step: Step) -> dict[str, int]:
    changed = dict(replicas)
    if step.kind == "scale-out":
        changed[step.app] += step.amount
    elif step.kind == "scale-in":
        changed[step.app] -= step.amount
    return changed


# --- observing a cluster -------------------------------------------------------------------------


async def left_to_write(side: Side, apps: Sequence[str]) -> dict[str, Any]:
    """Per Deployment, what podcost would still write (empty when converged)."""
    objects = load_objects(await Kube(side.kube.api).dump(side.namespace))
    left: dict[str, Any] = {}
    for app in apps:
        snapshot = snapshot_for_workload(objects, side.namespace, app, "Deployment")
        active = [pod for pod in snapshot.pods if pod.active]
        # Every side runs the chart's processes: its policy file is their default.
        result = simulate(snapshot, len(active), time.time(), policy=side.policy or chart_policy())
        if result.writes:  # a pod without the annotation may keep the 0 it reads as
            left[app] = {"writes": dict(result.writes)}
    return left


async def pod_costs(side: Side) -> dict[str, int | None]:
    """pod uid → its deletion cost (``None``: none), every pod of the namespace."""
    listed = await side.kube.core.list_namespaced_pod(side.namespace)
    found: dict[str, int | None] = {}
    for pod in listed.items:
        raw = (pod.metadata.annotations or {}).get(COST_ANNOTATION)
        found[pod.metadata.uid] = None if raw is None else int(raw)
    return found


async def zones_per_k(side: Side, app: str) -> dict[int, dict[str, int] | None]:
    """For every ``k`` (0: the zones as they are, which the scale-ins so far left): the pods per
    zone the real controller's victim selection leaves after deleting ``k`` pods by the costs
    written (``None`` where the written costs tie)."""
    objects = load_objects(await Kube(side.kube.api).dump(side.namespace))
    snapshot = snapshot_for_workload(objects, side.namespace, app, "Deployment")
    active = [pod for pod in snapshot.pods if pod.active]
    verdict: dict[int, dict[str, int] | None] = {}
    for k in range(len(active)):
        result = simulate(snapshot, len(active) - k, time.time(), policy=None,
                          topology_key=ZONE_LABEL)  # fmt: skip
        verdict[k] = None if result.tie_picks else dict(result.domains_after)
    return verdict


async def watch_costs(side: Side, watch: Watch) -> None:
    """Read the cost of every pod of ``side`` every 0.3 s; keep each pod's successive values."""
    while True:
        costs = await pod_costs(side)
        at = time.time()  # after the read: every value read was written by then
        for uid, cost in costs.items():
            seen = watch.observed.setdefault(uid, [])
            if not seen or seen[-1][1] != cost:
                seen.append((at, cost))
        await asyncio.sleep(0.3)


async def read_decisions(
    bootstrap: str, topic: str, watch: Watch, skip: Collection[bytes] = ()
) -> None:
    """Every decision of ``topic`` into ``watch``; records keyed by one of ``skip`` (which the
    test published to be refused) are left out."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
        enable_auto_commit=False, fetch_max_wait_ms=50, metadata_max_age_ms=1000,
    )  # fmt: skip
    await consumer.start()
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    if record.key in skip:
                        continue
                    headers = {name: bytes(value) for name, value in record.headers}
                    message = decode(DesiredCostsMessage, record.value or b"", headers,
                                     key=record.key)  # fmt: skip
                    order = (message.changed_at or 0.0, message.version, message.complete,
                             message.emitted_at)  # fmt: skip
                    costs = {str(pod.uid): pod.cost for pod in message.costs}
                    watch.decisions.append(Decision(order, costs, message.emitted_at))
    finally:
        await consumer.stop()


@contextlib.asynccontextmanager
async def background(*coroutines: Any) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(c) for c in coroutines]
    try:
        yield
        for task in tasks:
            if task.done():
                task.result()  # a reader that failed fails the test
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --- one seed ------------------------------------------------------------------------------------

FaultPlay = Callable[[], Awaitable[float]]
"""A seed's fault, done to cluster ``a`` (or what it depends on) once the scenario reaches it, and
undone; returns the ``time.monotonic()`` the recovery is measured from (the kill, the broker's
return)."""


async def play(
    plan: Scenario,
    run: str,
    a: Side,
    b: Side,
    fault: FaultPlay,
    kafka: tuple[str, str] | None,
    caught_up: Callable[[], Awaitable[bool]] | None = None,
) -> float:
    """Play ``plan`` on both clusters with ``fault`` in ``a``, ``plan.fault.delay`` seconds after
    step ``plan.fault.at`` was issued; judge. Returns the seconds from the moment ``fault``
    returns until ``a`` had nothing left to write again (and ``caught_up`` held: the consumer
    groups' lag drained, say). ``kafka``: the bootstrap address and ``a``'s costs topic, whose
    decisions the judgement reads (``None``: ``a`` runs without Kafka)."""
    apps = [app.name for app in plan.apps]
    watch = Watch()
    readers = [watch_costs(a, watch)]
    if kafka is not None:
        readers.append(read_decisions(*kafka, watch))
    reached = {index: asyncio.Event() for index in range(-1, len(plan.steps))}
    recovered: list[float] = []

    async def faulting() -> float:
        await reached[plan.fault.at].wait()
        await asyncio.sleep(plan.fault.delay)
        return await fault()

    async with background(*readers):
        faulted = asyncio.create_task(faulting())

        async def recovery() -> None:
            since = await faulted

            async def current() -> bool:
                if await left_to_write(a, apps):
                    return False
                return caught_up is None or await caught_up()

            await a.kube.wait_for(current, "a's costs current again after the fault", 180, 0.25)
            recovered.append(time.monotonic() - since)

        measuring = asyncio.create_task(recovery())
        try:
            reached[-1].set()
            await asyncio.gather(*(prepare(side, run, plan) for side in (a, b)))
            replicas = {app.name: app.replicas for app in plan.apps}
            for index, step in enumerate(plan.steps):
                if step.kind == "scale-in":
                    await quiet(a, b, apps, f"before step {index} ({step})", faulted)
                reached[index].set()
                await asyncio.gather(
                    *(apply_step(side, run, plan, index, replicas) for side in (a, b))
                )
                replicas = replicas_after(replicas, step)
            await faulted
            await asyncio.wait_for(measuring, 180)
            await quiet(a, b, apps, "at the end", faulted)
            await judge(plan, a, b, apps, watch, kafka is not None)
        finally:
            for task in (faulted, measuring):
                task.cancel()
            await asyncio.gather(faulted, measuring, return_exceptions=True)
    return recovered[0]


# --- the supervisor ----------------------------------------------------------------------------


class Kubelet:
    """What the kubelet does for a container with ``restartPolicy: Always``: a podcost process
    that exits by itself (not the test's kill) is started again. Each such exit is kept, with
    the last line its process logged, and printed; the test does not hide them."""

    def __init__(self, procs: Sequence[ServiceProcess]) -> None:
        self.procs = list(procs)
        self.held: set[ServiceProcess] = set()
        """Processes the fault has killed and will start itself."""
        self.exits: list[str] = []

    async def run(self) -> None:
        while True:
            for proc in self.procs:
                if proc not in self.held and proc.returncode is not None:
                    self.exits.append(
                        f"{proc.spec.name} exited with {proc.returncode}: {proc.log_tail(1)[:300]}"
                    )
                    await proc.start()
            await asyncio.sleep(0.5)


async def quiet(
    a: Side,
    b: Side,
    apps: Sequence[str],
    when: str,
    fault: asyncio.Task[Any],
) -> None:
    """Until both clusters have nothing left to write and their costs stay put for
    ``QUIET_SECONDS``."""
    deadline = time.monotonic() + 180
    left: dict[str, Any] = {}
    while True:
        if fault.done():
            fault.result()
        left = {side.name: await left_to_write(side, apps) for side in (a, b)}
        if not any(left.values()):
            before = [await pod_costs(side) for side in (a, b)]
            await asyncio.sleep(QUIET_SECONDS)
            after = [await pod_costs(side) for side in (a, b)]
            if before == after:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"not quiet {when} after 180 s; still to write: {left}")
        await asyncio.sleep(0.5)


async def judge(
    plan: Scenario, a: Side, b: Side, apps: Sequence[str], watch: Watch, topic: bool
) -> None:
    for app in apps:
        pods = await a.kube.active_pods(a.namespace, app)
        # podcost's cost on every pod, or none: the 0 a missing annotation reads as, where 0 is
        # what podcost wants (nothing left to write says so).
        foreign = [
            pod.name
            for pod in pods
            if COST_ANNOTATION in (pod.raw.metadata.annotations or {})
            and not costed_by_podcost(pod.raw)
        ]
        assert not foreign, f"seed {plan.seed}: {app} pods with a cost podcost did not write"
        left = await left_to_write(a, [app])
        assert not left, f"seed {plan.seed}: {app}: podcost still has to write {left}"
        mine, twin = await zones_per_k(a, app), await zones_per_k(b, app)
        assert mine.keys() == twin.keys(), (plan.seed, app, mine, twin)
        differ = {
            k: (mine[k], twin[k])
            for k in mine
            if mine[k] is not None and twin[k] is not None and mine[k] != twin[k]
        }
        assert not differ, f"seed {plan.seed}: {app}: k → (a, twin) zones left: {differ}; {plan}"
        compared = [k for k in mine if mine[k] is not None and twin[k] is not None]
        assert compared, f"seed {plan.seed}: {app}: every k tied, nothing compared"
    if not topic:
        return
    assert watch.decisions, "no decision read on a's costs topic"
    final = await pod_costs(a)
    newest = newest_costs(watch.decisions)
    active = {pod.uid for app in apps for pod in await a.kube.active_pods(a.namespace, app)}
    # No annotation reads as 0, as does a pod no decision named.
    lost = {
        uid: (final[uid], newest.get(uid))
        for uid in active
        if (final[uid] or 0) != (newest.get(uid) or 0)
    }
    assert not lost, f"seed {plan.seed}: pods whose cost is not the newest decision's: {lost}"
    rewound = rewinds(watch.decisions, watch.observed)
    if rewound:
        ordered = sorted(watch.decisions, key=lambda d: d.order)
        told = {
            rewind.pod: [(i, d.order, d.costs[rewind.pod])
                         for i, d in enumerate(ordered) if rewind.pod in d.costs]
            for rewind in rewound
        }  # fmt: skip
        raise AssertionError(
            f"seed {plan.seed}: costs rewound: {rewound}; the decisions naming those pods "
            f"(index, order, cost): {told}"
        )


async def clean(side: Side, plan: Scenario) -> None:
    for app in plan.apps:
        with contextlib.suppress(ApiException):
            await side.kube.apps.delete_namespaced_deployment(app.name, side.namespace)

    async def no_pods() -> bool:
        return not (await side.kube.core.list_namespaced_pod(side.namespace)).items

    await side.kube.wait_for(no_pods, f"the pods of {side.namespace} gone", 90, 0.5)
    await side.kube.delete_nodes(side.nodes)
    side.nodes.clear()


# --- the pair of clusters ------------------------------------------------------------------------


@dataclass
class Pair:
    """The two clusters of a test, their processes running (``a/...`` and ``b/...``)."""

    run: str
    """The namespace on both, and the prefix of ``a``'s topics and aggregator app id."""
    topics: Topics
    a: Side
    b: Side
    procs: dict[str, ServiceProcess]
    kubelet: Kubelet


@contextlib.asynccontextmanager
async def twin_pair(
    shape: str,
    kafka_bootstrap: str,
    planes: tuple[Path, Path],
    kubes: tuple[KubeTestCluster, KubeTestCluster],
    log_dir: Path,
    prefix: str,
) -> AsyncIterator[Pair]:
    """``a`` (``shape``: ``fleet``, ``embedded`` or ``kafka``) and the twin ``b`` on the
    control planes of the kubeconfigs ``planes``, every process ready, the :class:`Kubelet`
    supervising them; the namespace ``<prefix>-<random>`` on both."""
    helm = require_helm()
    run = f"{prefix}-{uuid.uuid4().hex[:6]}"
    topics, env = run_topics(run), run_env(run)
    specs = twin_specs(helm, kafka_bootstrap, run, planes[0], planes[1], shape)
    a, b = Side("a", kubes[0], run), Side("b", kubes[1], run)
    await asyncio.gather(a.kube.create_namespace(run), b.kube.create_namespace(run))
    try:
        async with started_processes(specs, env=env, log_dir=log_dir, ready_timeout=300) as procs:
            for name, proc in procs.items():
                (a if name.startswith("a/") else b).procs[name] = proc
            ready = {name: round(p.ready_after or 0, 1) for name, p in procs.items()}
            print(f"{shape}: processes ready after (s): {ready}")
            kubelet = Kubelet(list(procs.values()))
            supervising = asyncio.create_task(kubelet.run())
            try:
                yield Pair(run, topics, a, b, dict(procs), kubelet)
            finally:  # never restart what the end of the test stops
                supervising.cancel()
                await asyncio.gather(supervising, return_exceptions=True)
    finally:
        await asyncio.gather(a.kube.delete_namespace(run), b.kube.delete_namespace(run))


async def play_seed(
    pair: Pair,
    plan: Scenario,
    fault: FaultPlay,
    kafka: tuple[str, str] | None,
    caught_up: Callable[[], Awaitable[bool]] | None = None,
) -> tuple[float, list[str]]:
    """:func:`play` one seed on the pair, then clean both clusters up for the next; returns the
    recovery seconds and the exits the kubelet restarted during the seed (also printed)."""
    exits = len(pair.kubelet.exits)
    try:
        seconds = await play(plan, pair.run, pair.a, pair.b, fault, kafka, caught_up)
    finally:
        restarted = pair.kubelet.exits[exits:]
        for exit in restarted:
            print(f"seed {plan.seed}: the kubelet restarted {exit}")
        await asyncio.gather(clean(pair.a, plan), clean(pair.b, plan))
    return seconds, restarted
