"""SIGKILL, for real: one podcost process of a cluster is killed at a seeded random moment of
steady churn and started again, and the cluster ends where an undisturbed twin ends.

Two real control planes and the real broker. Cluster ``a`` runs the pipeline under test; cluster
``b``, the twin, runs its own complete pipeline, undisturbed: ``podcost run`` in one process, as
the chart's ``all`` mode runs it without Kafka, so nothing of ``a``'s (topics, consumer groups,
faust tables) is shared with it. Both get the same seeded scenario (``tests/support/twin.py``):
the same nodes (same names, zones, capacities), the same Deployments placed by node capacity,
then the same churn steps, step by step on both (scale-outs onto new nodes, pod deletions, a
taint, a zone turned spot, scale-ins last).

- The fleet variant: ``a`` runs every component as the chart does, each its own process (the
  watcher and annotator of the ``agent`` mode, one ranker per strategy and the faust aggregator
  of the ``core`` mode, with this test's own topics and app id). Seeds visit the victims in turn
  (watcher, annotator, aggregator, a ranker); the kill comes while the Deployments are created
  or 0-2.5 s into a churn step, the restart at once or after a pause, and in about half the
  seeds the new process is killed again during its start-up (before ``/readyz``; for the
  aggregator, during faust's table recovery).
- The ``podcost run`` variant: ``a`` runs ``podcost run`` as one process, embedded or with
  ``--kafka``; the one process is the victim.

A process that exits by itself is started again, as the kubelet restarts a container
(``Kubelet``); each such exit is printed with its last log line. (The faust aggregator exits on
purpose when it finds faust skipped records after a restart, ``podcost_bus.faust_app.
SkippedRecords``, so that a restart reads them.)

Once both clusters are quiet (nothing left to write, and nothing changes for a few seconds):

- ``a`` converged: podcost has nothing left to write, and every cost on an active pod of an
  opted-in Deployment is one podcost wrote (a pod without one reads as 0, where podcost wants 0);
- the twin's verdict: for every Deployment and every ``k``, the zones left after the real
  controller's victim selection deletes ``k`` pods by the written costs
  (``podcost_core.simulate`` with ``policy=None``: the controller model, not podcost's ranking)
  are the same in ``a`` and ``b``; a ``k`` where the written costs tie is left out;
- no decision lost (Kafka variants): each active pod's cost is the newest decision's about it on
  ``a``'s costs topic;
- no cost rewound (Kafka variants): the costs read on ``a``'s pods every 0.3 s never go back to
  an older decision's value after a newer one was written (``twin.rewinds``);
- the time from the kill to ``a`` having nothing left to write again is printed per seed, with
  p50 and max over the seeds of the test.

``make test`` runs three fleet seeds and one seed per ``podcost run`` transport; the ``long``
variants (``make test-long``) run 24 fleet seeds and 4 per transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from kubernetes_asyncio.client.exceptions import ApiException
from tests.conftest import ControlPlane
from tests.support.kube import (
    CAPACITY_LABEL,
    COST_ANNOTATION,
    ZONE_LABEL,
    KubeTestCluster,
    costed_by_podcost,
)
from tests.support.services import ServiceProcess, ServiceSpec, chart_specs
from tests.support.services import processes as started_processes
from tests.support.tools import require_helm
from tests.support.twin import (
    App,
    Decision,
    Fault,
    Scenario,
    Step,
    newest_costs,
    percentile,
    rewinds,
    scenario,
)

from podcost_contracts.messages import DesiredCostsMessage, decode
from podcost_contracts.topics import Topics
from podcost_core.convert import load_objects, snapshot_for_workload
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.simulate import simulate
from podcost_kube.client import Kube

pytestmark = pytest.mark.e2e

#: The fleet variant's victims, visited in turn by consecutive seeds (the ranker: by seed).
FLEET_VICTIMS = ("a/watcher", "a/annotator", "a/aggregator", "a/ranker")
QUIET_SECONDS = 3.0


@dataclass
class Side:
    """One cluster of the pair: its API, the nodes made on it, its podcost processes."""

    name: str
    kube: KubeTestCluster
    namespace: str
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)


@dataclass
class Watch:
    """What the test reads of cluster ``a`` during a seed: every decision on its costs topic and
    the successive cost values of each pod (by uid)."""

    decisions: list[Decision] = field(default_factory=list)
    observed: dict[str, list[tuple[float, int | None]]] = field(default_factory=dict)
    """pod uid → (wall-clock time of the read, cost) each time the cost read changed."""


# --- the processes -------------------------------------------------------------------------------


def _specs(
    helm: Path, kafka: str, run: str, plane_a: Path, plane_b: Path, shape: str
) -> list[ServiceSpec]:
    """``a``'s processes (``shape``: ``fleet``, ``embedded`` or ``kafka``) and the twin's."""
    watch = {"namespace": run}
    lease = {"leaseName": f"{run}-watcher"}
    twin = chart_specs(helm, {"mode": "all", "clusterName": "b", "watch": watch,
                              "leaderElection": lease}, prefix="b/")  # fmt: skip
    specs = [dataclasses.replace(s, env={**s.env, "KUBECONFIG": str(plane_b)}) for s in twin]
    if shape == "fleet":
        agent = chart_specs(helm, {"mode": "agent", "clusterName": "a", "watch": watch,
                                   "kafka": {"bootstrapServers": kafka},
                                   "leaderElection": lease}, prefix="a/")  # fmt: skip
        core = chart_specs(helm, {"mode": "core", "kafka": {"bootstrapServers": kafka}},
                           prefix="a/")  # fmt: skip
        mine = [*agent, *core]
    else:
        embedded = chart_specs(helm, {"mode": "all", "clusterName": "a", "watch": watch,
                                      "leaderElection": lease}, prefix="a/")  # fmt: skip
        extra = ("--kafka", kafka) if shape == "kafka" else ()
        mine = [dataclasses.replace(s, args=(*s.args, *extra)) for s in embedded]
    specs += [dataclasses.replace(s, env={**s.env, "KUBECONFIG": str(plane_a)}) for s in mine]
    return specs


def _topics(run: str) -> Topics:
    return Topics(
        workloads=f"{run}.workloads", ranks=f"{run}.ranks",
        costs=f"{run}.costs", deadletter=f"{run}.deadletter",
    )  # fmt: skip


# --- playing a scenario on a cluster -------------------------------------------------------------


def _node(run: str, app: App | str, index: int | str) -> str:
    name = app.name if isinstance(app, App) else app
    return f"{run}-{name}-{index}"


async def _prepare(side: Side, run: str, plan: Scenario) -> None:
    """The nodes of every Deployment, then the Deployments, all pods Ready."""
    made = []
    for app in plan.apps:
        for index, (zone, capacity) in enumerate(app.nodes):
            node = _node(run, app, index)
            side.nodes.append(node)
            made.append(side.kube.create_node(
                node, zone=zone, capacity_type="on-demand", pods=str(capacity),
                labels={"fleet": _node(run, app, "pool")},
            ))  # fmt: skip
    await asyncio.gather(*made)
    for app in plan.apps:
        pool = {"fleet": _node(run, app, "pool")}
        await side.kube.create_deployment(
            side.namespace, app.name, app.replicas, opt_in=True, node_selector=pool
        )
    await asyncio.gather(*(
        side.kube.wait_ready(side.namespace, app.name, app.replicas) for app in plan.apps
    ))  # fmt: skip


async def _apply(
    side: Side, run: str, plan: Scenario, index: int, replicas: dict[str, int]
) -> None:
    """Step ``index`` on one cluster, until its pods are where the step puts them."""
    step = plan.steps[index]
    app = next(a for a in plan.apps if a.name == step.app)
    kube, namespace = side.kube, side.namespace
    if step.kind == "scale-out":
        node = _node(run, app, f"x{index}")
        side.nodes.append(node)
        await kube.create_node(node, zone=step.zone, capacity_type="on-demand",
                               pods=str(step.amount),
                               labels={"fleet": _node(run, app, "pool")})  # fmt: skip
        await kube.scale(namespace, app.name, replicas[app.name] + step.amount)
    elif step.kind == "delete-pod":
        target = _node(run, app, step.node)
        on_node = sorted(p.name for p in await kube.active_pods(namespace, app.name)
                         if p.node == target)  # fmt: skip
        if on_node:
            with contextlib.suppress(ApiException):
                await kube.core.delete_namespaced_pod(on_node[0], namespace)
    elif step.kind == "taint":
        taint = {"key": "podcost.dev/test-drain", "value": "soon", "effect": "PreferNoSchedule"}
        await kube.core.patch_node(_node(run, app, step.node), {"spec": {"taints": [taint]}})
    elif step.kind == "spot":
        for node_index, (zone, _) in enumerate(app.nodes):
            if zone == step.zone:
                spot = {"metadata": {"labels": {CAPACITY_LABEL: "spot"}}}
                await kube.core.patch_node(_node(run, app, node_index), spot)
    elif step.kind == "scale-in":
        await kube.scale_and_observe(namespace, app.name, replicas[app.name] - step.amount)
    else:
        raise AssertionError(f"unknown step {step}")
    await kube.wait_ready(namespace, app.name, _after(replicas, step)[app.name])


def _after(replicas: Mapping[str, int], step: Step) -> dict[str, int]:
    changed = dict(replicas)
    if step.kind == "scale-out":
        changed[step.app] += step.amount
    elif step.kind == "scale-in":
        changed[step.app] -= step.amount
    return changed


# --- observing a cluster -------------------------------------------------------------------------


async def _left_to_write(side: Side, apps: Sequence[str]) -> dict[str, Any]:
    """Per Deployment, what podcost would still write (empty when converged)."""
    objects = load_objects(await Kube(side.kube.api).dump(side.namespace))
    left: dict[str, Any] = {}
    for app in apps:
        snapshot = snapshot_for_workload(objects, side.namespace, app, "Deployment")
        active = [pod for pod in snapshot.pods if pod.active]
        result = simulate(snapshot, len(active), time.time(), policy=DEFAULT_POLICY)
        if result.writes:  # a pod without the annotation may keep the 0 it reads as
            left[app] = {"writes": dict(result.writes)}
    return left


async def _costs(side: Side) -> dict[str, int | None]:
    """pod uid → its deletion cost (``None``: none), every pod of the namespace."""
    listed = await side.kube.core.list_namespaced_pod(side.namespace)
    found: dict[str, int | None] = {}
    for pod in listed.items:
        raw = (pod.metadata.annotations or {}).get(COST_ANNOTATION)
        found[pod.metadata.uid] = None if raw is None else int(raw)
    return found


async def _zones_per_k(side: Side, app: str) -> dict[int, dict[str, int] | None]:
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


async def _watch_costs(side: Side, watch: Watch) -> None:
    """Read the cost of every pod of ``side`` every 0.3 s; keep each pod's successive values."""
    while True:
        costs = await _costs(side)
        at = time.time()  # after the read: every value read was written by then
        for uid, cost in costs.items():
            seen = watch.observed.setdefault(uid, [])
            if not seen or seen[-1][1] != cost:
                seen.append((at, cost))
        await asyncio.sleep(0.3)


async def _read_decisions(bootstrap: str, topic: str, watch: Watch) -> None:
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
async def _background(*coroutines: Any) -> AsyncIterator[None]:
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


# --- the fault -----------------------------------------------------------------------------------


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


@dataclass
class Crash:
    """What became of a fault: when the first kill came, and whether each kill came before the
    process was ready."""

    killed_at: float = 0.0
    before_ready: list[bool] = field(default_factory=list)
    restarted: asyncio.Event = field(default_factory=asyncio.Event)
    ready_after: float = 0.0
    """Seconds from the last start of the victim until it was ready."""


async def _crash(
    proc: ServiceProcess, fault: Fault, reached: asyncio.Event, crash: Crash, kubelet: Kubelet
) -> None:
    await reached.wait()
    await asyncio.sleep(fault.delay)
    kills = [fault.pause] if fault.again is None else [fault.pause, fault.pause]
    for number, pause in enumerate(kills):
        if number:
            assert fault.again is not None
            await asyncio.sleep(fault.again)
        crash.before_ready.append(not await proc.is_ready())
        kubelet.held.add(proc)
        proc.kill()
        await proc.stop()  # reaps it: SIGTERM to a dead process is nothing
        if not number:
            crash.killed_at = time.monotonic()
        await asyncio.sleep(pause)
        await proc.start()
        kubelet.held.discard(proc)

    async def ready() -> bool:  # the kubelet starts it again should it exit by itself
        return await proc.is_ready()

    await KubeTestCluster.wait_for(ready, f"{proc.spec.name} ready after its restart", 180, 0.25)
    crash.ready_after = time.monotonic() - proc.started_at
    crash.restarted.set()


# --- one seed ------------------------------------------------------------------------------------


async def _play(
    plan: Scenario,
    run: str,
    a: Side,
    b: Side,
    victim: ServiceProcess,
    kafka: tuple[str, str] | None,
    kubelet: Kubelet,
) -> float:
    """Play ``plan`` on both clusters with the fault in ``a``; judge; the seconds from the kill
    until ``a`` had nothing left to write again."""
    apps = [app.name for app in plan.apps]
    watch = Watch()
    background = [_watch_costs(a, watch)]
    if kafka is not None:
        background.append(_read_decisions(*kafka, watch))
    reached = {index: asyncio.Event() for index in range(-1, len(plan.steps))}
    crash = Crash()
    recovered: list[float] = []

    async def recovery() -> None:
        await reached[plan.fault.at].wait()
        await crash.restarted.wait()

        async def current() -> bool:
            return not await _left_to_write(a, apps)

        await a.kube.wait_for(current, "a's costs current again after the kill", 180, 0.25)
        recovered.append(time.monotonic() - crash.killed_at)

    async with _background(*background):
        at = reached[plan.fault.at]
        fault = asyncio.create_task(_crash(victim, plan.fault, at, crash, kubelet))
        measuring = asyncio.create_task(recovery())
        try:
            reached[-1].set()
            await asyncio.gather(*(_prepare(side, run, plan) for side in (a, b)))
            replicas = {app.name: app.replicas for app in plan.apps}
            for index, step in enumerate(plan.steps):
                if step.kind == "scale-in":
                    await _quiet(a, b, apps, f"before step {index} ({step})", fault, victim)
                reached[index].set()
                await asyncio.gather(*(_apply(side, run, plan, index, replicas) for side in (a, b)))
                replicas = _after(replicas, step)
            await fault
            await asyncio.wait_for(measuring, 180)
            await _quiet(a, b, apps, "at the end", fault, victim)
            await _judge(plan, a, b, apps, watch, kafka is not None)
        finally:
            for task in (fault, measuring):
                task.cancel()
            await asyncio.gather(fault, measuring, return_exceptions=True)
    print(f"seed {plan.seed}: {plan.fault} kills before ready {crash.before_ready}; "
          f"the last start ready after {crash.ready_after:.1f}s; "
          f"kill → nothing left to write {recovered[0]:.1f}s")  # fmt: skip
    return recovered[0]


async def _quiet(
    a: Side,
    b: Side,
    apps: Sequence[str],
    when: str,
    fault: asyncio.Task[None],
    victim: ServiceProcess,
) -> None:
    """Until both clusters have nothing left to write and their costs stay put for
    ``QUIET_SECONDS``."""
    deadline = time.monotonic() + 180
    left: dict[str, Any] = {}
    while True:
        if fault.done():
            fault.result()
        left = {side.name: await _left_to_write(side, apps) for side in (a, b)}
        if not any(left.values()):
            before = [await _costs(side) for side in (a, b)]
            await asyncio.sleep(QUIET_SECONDS)
            after = [await _costs(side) for side in (a, b)]
            if before == after:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"not quiet {when} after 180 s; still to write: {left}")
        await asyncio.sleep(0.5)


async def _judge(
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
        left = await _left_to_write(a, [app])
        assert not left, f"seed {plan.seed}: {app}: podcost still has to write {left}"
        mine, twin = await _zones_per_k(a, app), await _zones_per_k(b, app)
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
    final = await _costs(a)
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


async def _clean(side: Side, plan: Scenario) -> None:
    for app in plan.apps:
        with contextlib.suppress(ApiException):
            await side.kube.apps.delete_namespaced_deployment(app.name, side.namespace)

    async def no_pods() -> bool:
        return not (await side.kube.core.list_namespaced_pod(side.namespace)).items

    await side.kube.wait_for(no_pods, f"the pods of {side.namespace} gone", 90, 0.5)
    await side.kube.delete_nodes(side.nodes)
    side.nodes.clear()


# --- the tests -----------------------------------------------------------------------------------


async def _seeds(
    shape: str,
    seeds: Sequence[int],
    kafka_bootstrap: str,
    planes: tuple[ControlPlane, ControlPlane],
    kubes: tuple[KubeTestCluster, KubeTestCluster],
    tmp_path: Path,
) -> None:
    helm = require_helm()
    run = f"kill-{uuid.uuid4().hex[:6]}"
    topics = _topics(run)
    env = {
        "PODCOST_TOPIC_WORKLOADS": topics.workloads,
        "PODCOST_TOPIC_RANKS": topics.ranks,
        "PODCOST_TOPIC_COSTS": topics.costs,
        "PODCOST_TOPIC_DEADLETTER": topics.deadletter,
        "PODCOST_AGGREGATOR_APP_ID": f"{run}-aggregator",
    }
    specs = _specs(helm, kafka_bootstrap, run, planes[0].kubeconfig, planes[1].kubeconfig, shape)
    a, b = Side("a", kubes[0], run), Side("b", kubes[1], run)
    await asyncio.gather(a.kube.create_namespace(run), b.kube.create_namespace(run))
    times: list[float] = []
    try:
        async with started_processes(specs, env=env, log_dir=tmp_path, ready_timeout=300) as procs:
            for name, proc in procs.items():
                (a if name.startswith("a/") else b).procs[name] = proc
            ready = {name: round(p.ready_after or 0, 1) for name, p in procs.items()}
            print(f"{shape}: processes ready after (s): {ready}")
            rankers = sorted(name for name in a.procs if "/ranker-" in name)
            kubelet = Kubelet(list(procs.values()))
            supervising = asyncio.create_task(kubelet.run())
            try:
                for seed in seeds:
                    plan = scenario(seed, FLEET_VICTIMS if shape == "fleet" else ("a/embedded",))
                    victim = plan.fault.victim
                    if victim == "a/ranker":
                        victim = rankers[seed % len(rankers)]
                        plan = dataclasses.replace(plan, fault=dataclasses.replace(
                            plan.fault, victim=victim))  # fmt: skip
                    reads = (
                        None if shape == "embedded" else (kafka_bootstrap, topics.costs_for("a"))
                    )
                    try:
                        exits = len(kubelet.exits)
                        times.append(await _play(plan, run, a, b, a.procs[victim], reads, kubelet))
                        for exit in kubelet.exits[exits:]:
                            print(f"seed {seed}: the kubelet restarted {exit}")
                    finally:
                        await asyncio.gather(_clean(a, plan), _clean(b, plan))
            finally:  # never restart what the end of the test stops
                supervising.cancel()
                await asyncio.gather(supervising, return_exceptions=True)
    finally:
        await asyncio.gather(a.kube.delete_namespace(run), b.kube.delete_namespace(run))
    print(f"{shape}: seeds {list(seeds)}: kill → every cost current again: "
          f"p50 {percentile(times, 0.5):.1f}s, max {max(times):.1f}s")  # fmt: skip


FLEET_SHORT = [0, 2, 5]
FLEET_LONG = list(range(100, 124))


@pytest.mark.parametrize(
    "seeds",
    [
        pytest.param(FLEET_SHORT, id="3-seeds"),
        pytest.param(
            FLEET_LONG, id="24-seeds", marks=[pytest.mark.long, pytest.mark.timeout(5400)]
        ),
    ],
)
async def test_a_sigkilled_fleet_process_ends_where_its_undisturbed_twin_ends(
    seeds: list[int],
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    second_control_plane: ControlPlane,
    kube: KubeTestCluster,
    second_kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    await _seeds("fleet", seeds, kafka_bootstrap, (control_plane, second_control_plane),
                 (kube, second_kube), tmp_path)  # fmt: skip


RUN_LONG = [200, 201, 202, 203]
#: ``podcost run --kafka``'s quick seed left one pod behind its decided cost before any kill in
#: 1 of 4 runs (issue 12). The cause found: a decision made from a snapshot older than the
#: annotator's own last write to the pod was taken at its word, and the write stayed (such
#: decisions seen in the logs; fixed in the annotator's ``WriteQueue``; the failure itself did
#: not recur in 13 runs). It still runs with the long seeds: in 5 of 13 runs ``a/embedded`` was
#: never ready (4 at its first start, 1 after the double kill; where it was traced, the faust
#: aggregator's start hung creating its ``__assignor-__leader`` topic), not explained yet.


@pytest.mark.parametrize(
    ("transport", "seeds"),
    [
        pytest.param("embedded", [7], id="embedded-1-seed"),
        pytest.param("kafka", [7], id="kafka-1-seed", marks=[pytest.mark.long]),
        pytest.param("embedded", RUN_LONG, id="embedded-4-seeds",
                     marks=[pytest.mark.long, pytest.mark.timeout(3600)]),
        pytest.param("kafka", RUN_LONG, id="kafka-4-seeds",
                     marks=[pytest.mark.long, pytest.mark.timeout(3600)]),
    ],
)  # fmt: skip
async def test_a_sigkilled_podcost_run_ends_where_its_undisturbed_twin_ends(
    transport: str,
    seeds: list[int],
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    second_control_plane: ControlPlane,
    kube: KubeTestCluster,
    second_kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    await _seeds(transport, seeds, kafka_bootstrap, (control_plane, second_control_plane),
                 (kube, second_kube), tmp_path)  # fmt: skip
