"""Differential test: podcost's model of the deployment controller's scaling of a Deployment
mid-rollout (``podcost_core.rollout``), and of each shrinking ReplicaSet's victims
(``podcost_core.simulate``), against the real kube-controller-manager.

Each scenario is drawn from a seeded random generator: a RollingUpdate Deployment of R replicas
(maxSurge and maxUnavailable random ints or percentages) on kwok nodes, all ready; then a
template change whose new pods never become available, so the rollout stalls with two
ReplicaSets holding replicas. Three shapes:

- ``pending``: the new pods ask for a node no node is, and stay Pending;
- ``unready``: the new pods run on the same nodes, Ready, but ``minReadySeconds`` keeps them
  unavailable (the old and new pods share nodes, so the related-pods rank mixes them);
- ``three``: a first change sends the pods to a node with room for 3, where a few become
  available and the rest stay Pending, then a second change whose pods stay Pending: three
  ReplicaSets hold replicas.

Once the sizes are stable the Deployment is paused (``spec.paused: true``): a paused Deployment's
sync (``sync`` in sync.go) runs ``scale`` and then only cleans up empty old ReplicaSets and
writes status, so what moves afterwards is exactly the proportional split and nothing of
``rolloutRolling`` follows, which is the claim of the model (an unpaused rollout goes on after
the scale-in, and ``simulate`` says so: here it must say it does not). Pausing itself runs
``scale`` at the current size, which is checked too. The pods get random deletion costs,
distinct or partly equal, the namespace is dumped (``Kube.dump``), and ``simulate(...,
rollout=rollout_for(...))`` predicts a scale to a random M < R: each ReplicaSet's new
``spec.replicas`` must be exactly the controller's, and the deleted pods must be an outcome the
model admits (where Go's unstable sort ties pods, or the shrinking ReplicaSets' concurrent syncs
may see each other's deletions, the model names the tied pods and how many go). A split that
grows a ReplicaSet is refused by ``simulate`` (scale-in only); then the real controller must grow
it too.

It found three faults of the model, each fixed with a unit test in ``tests/unit/test_rollout.py``:
a dump lost the Deployment's strategy, ``paused`` and status in validation (every Deployment
read as 25 %/25 %: 9 of the first 10 scenarios disagreed on the sizes); the shrinking
ReplicaSets sync concurrently, so one's co-location rank (rule 5) may already miss another's
victims on its node (seed 98 of the long run, an ``unready`` scenario); and a paused Deployment
runs ``scale`` again after its own updates, so a split that leaves one ReplicaSet holding
replicas ends at exactly M, not M + maxSurge (``settled_sizes``; seeds 18 and 90, once
``maxSurge: 100%`` was drawn).

6 scenarios run in ``make test``; the ``long``-marked variant runs 100 (``make test-long``).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from tests.support.kube import KubeTestCluster

from podcost_core.rollout import Rollout, rollout_for, settled_sizes
from podcost_core.simulate import SimulationError, simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_core.victims import NowWindow
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

LANES = 3
APP = "web"
COST = "controller.kubernetes.io/pod-deletion-cost"
SHAPES = ("pending", "pending", "unready", "three")
SURGES: tuple[int | str, ...] = (0, 1, 2, 3, "0%", "25%", "50%", "100%")
UNAVAILABLES: tuple[int | str, ...] = (0, 1, 2, "0%", "25%", "34%", "50%")
#: How long the controllers' state must stay the same to count as settled: they act on every
#: event within milliseconds, so a second and a half without a change means they are done.
QUIET = 1.5


@dataclass
class Scenario:
    """What one seed decided and what came of it; printed when model and controller disagree."""

    seed: int
    shape: str = ""
    replicas: int = 0
    max_surge: int | str = 0
    max_unavailable: int | str = 0
    nodes: list[str] = field(default_factory=list)
    costs: dict[str, str] = field(default_factory=dict)
    stalled: dict[str, int] = field(default_factory=dict)
    """The ReplicaSets' sizes before the pause."""
    paused: dict[str, int] = field(default_factory=dict)
    """... after it (the pause's own ``scale``)."""
    target: int = 0
    mid_rollout: bool = False
    """More than one ReplicaSet held replicas when the Deployment was scaled."""
    grows: bool = False
    """The split grows a ReplicaSet (``simulate`` refuses it)."""
    deleted: int = 0
    """Pods the controller deleted on the scale-in."""
    tied: bool = False
    """The model left a tie for Go's unstable sort to break."""


def _lane_nodes(lane: int) -> tuple[list[str], str]:
    return [f"roll-{lane}-{i}" for i in range(3)], f"roll-{lane}-tight"


@pytest.fixture(scope="module")
async def rollout_lanes(kube: KubeTestCluster) -> list[int]:
    """Per lane: three roomy nodes in two zones, and one tainted node with room for 3 pods."""
    for lane in range(LANES):
        roomy, tight = _lane_nodes(lane)
        for index, name in enumerate(roomy):
            await kube.create_node(name, zone=f"zone-{index % 2}", labels={"roll-node": name})
        await kube.create_node(
            tight,
            zone="zone-t",
            labels={"roll-node": tight},
            taints=[{"key": "roll-tight", "value": "true", "effect": "NoSchedule"}],
            pods="3",
        )
    return list(range(LANES))


def _node_affinity(nodes: list[str]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "roll-node", "operator": "In", "values": nodes}]}
                ]
            }
        }
    }


async def _run_scenario(kube: KubeTestCluster, lane: int, seed: int) -> tuple[Scenario, str | None]:
    namespace = await kube.create_namespace(f"roll-{seed}-{uuid.uuid4().hex[:4]}")
    try:
        return await _play(kube, lane, seed, namespace)
    finally:
        await kube.delete_namespace(namespace)


async def _play(
    kube: KubeTestCluster, lane: int, seed: int, namespace: str
) -> tuple[Scenario, str | None]:
    rng = random.Random(seed)
    scenario = Scenario(seed)
    roomy, tight = _lane_nodes(lane)
    scenario.shape = rng.choice(SHAPES)
    scenario.replicas = rng.randint(3, 8)
    scenario.max_surge = rng.choice(SURGES)
    unavailable = [
        u for u in UNAVAILABLES if u not in (0, "0%") or scenario.max_surge not in (0, "0%")
    ]
    scenario.max_unavailable = rng.choice(unavailable)
    scenario.nodes = rng.sample(roomy, rng.randint(1, 3))
    extra = {
        "affinity": _node_affinity(scenario.nodes),
        "tolerations": [{"key": "roll-tight", "operator": "Exists", "effect": "NoSchedule"}],
    }
    await kube.create_deployment(namespace, APP, scenario.replicas, pod_spec_extra=extra)
    await kube.apps.patch_namespaced_deployment(
        APP,
        namespace,
        {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {
            "maxSurge": scenario.max_surge, "maxUnavailable": scenario.max_unavailable}}}},
    )  # fmt: skip
    await kube.wait_ready(namespace, APP, scenario.replicas)

    nowhere = {"op": "add", "path": "/spec/template/spec/nodeSelector",
               "value": {"roll-node": "nowhere"}}  # fmt: skip
    if scenario.shape == "pending":
        await _patch(kube, namespace, [nowhere])
    elif scenario.shape == "unready":
        await _patch(kube, namespace, [
            {"op": "add", "path": "/spec/progressDeadlineSeconds", "value": 7200},
            {"op": "add", "path": "/spec/minReadySeconds", "value": 3600},
            {"op": "add", "path": "/spec/template/metadata/annotations", "value": {"rev": "2"}},
        ])  # fmt: skip
    else:
        values = ("/spec/template/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnored"
                  "DuringExecution/nodeSelectorTerms/0/matchExpressions/0/values")  # fmt: skip
        await _patch(kube, namespace, [{"op": "replace", "path": values, "value": [tight]}])
        await _settle(kube, namespace)
        await _patch(kube, namespace, [nowhere])
    stalled = await _settle(kube, namespace)
    scenario.stalled = _sizes(stalled)

    # Pausing runs ``scale`` at the Deployment's own size: the model's split, at R.
    before_pause = _rollout(stalled, namespace)
    await kube.apps.patch_namespaced_deployment(APP, namespace, {"spec": {"paused": True}})
    pods = [pod.name for pod in await kube.active_pods(namespace, APP)]
    distinct = rng.random() < 0.6
    values_drawn = rng.sample(range(-50, 50), len(pods))
    for pod, drawn in zip(pods, values_drawn, strict=True):
        if distinct:
            cost = str(drawn)
        else:
            cost = rng.choice(("0", "5", "10", ""))
            if not cost:
                continue
        await kube.set_deletion_cost(namespace, pod, cost)
        scenario.costs[pod] = cost
    dump = await _settle(kube, namespace, paused=True)
    scenario.paused = _sizes(dump)
    expected_pause = (
        settled_sizes(replace(before_pause, paused=True), scenario.replicas)
        if before_pause
        else None
    )
    if expected_pause is not None and expected_pause != scenario.paused:
        return scenario, _report(
            scenario,
            f"pausing at {scenario.replicas}: the controller sized {scenario.paused}, "
            f"the model {expected_pause}",
            dump,
        )
    # The ReplicaSet controller sorts from its informer cache; the costs were patched before
    # the settling began, which took QUIET seconds at least, so its cache holds them.

    objects = load_objects(dump)
    snapshot = snapshot_for_workload(objects, namespace, APP, "Deployment")
    rollout = rollout_for(objects, snapshot)
    assert rollout is not None
    scenario.mid_rollout = len(rollout.holding()) > 1
    scenario.target = rng.randint(0, scenario.replicas - 1) if rng.random() < 0.1 else (
        rng.randint(1, scenario.replicas - 1)
    )  # fmt: skip
    active_before = {pod.name for pod in snapshot.pods if pod.active}

    earliest = time.time()
    await kube.scale(namespace, APP, scenario.target)
    after = await _settle(kube, namespace, paused=True)
    latest = time.time()

    real = _sizes(after)
    deleted = active_before - {p["metadata"]["name"] for p in _active_pods(after)}
    scenario.deleted = len(deleted)
    model = settled_sizes(rollout, scenario.target)
    if real != model:
        return scenario, _report(
            scenario,
            f"scaling to {scenario.target}: the controller sized {real}, the model {model}",
            dump,
        )
    try:
        result = simulate(
            snapshot, scenario.target, NowWindow(earliest, latest), policy=None, rollout=rollout
        )
    except SimulationError as error:
        scenario.grows = True
        grown = {name for name, size in real.items() if size > scenario.paused.get(name, 0)}
        if not grown:
            return scenario, _report(scenario, f"simulate refused ({error}), nothing grew", dump)
        return scenario, None
    current = {rs.name: rs.replicas for rs in rollout.replicasets}
    predicted = {
        name: result.replicasets.get(name, (size, size))[1] for name, size in current.items()
    }
    if predicted != real:
        return scenario, _report(
            scenario,
            f"simulate's split {dict(result.replicasets)} is not the controller's {real}",
            dump,
        )
    if result.rollout_goes_on:
        return scenario, _report(scenario, "simulate says a paused rollout goes on", dump)
    scenario.tied = result.tie_picks > 0
    if not result.admits(deleted):
        return scenario, _report(
            scenario,
            f"the controller deleted {sorted(deleted)}; the model: victims "
            f"{sorted(p.name for p in result.victims)}, {result.tie_picks} of tied "
            f"{sorted(p.name for p in result.tied)}",
            dump,
        )
    return scenario, None


async def _patch(kube: KubeTestCluster, namespace: str, ops: list[dict[str, Any]]) -> None:
    """A JSON patch of the Deployment (a list body is sent as ``application/json-patch+json``)."""
    await kube.apps.patch_namespaced_deployment(APP, namespace, ops)


async def _dump(kube: KubeTestCluster, namespace: str) -> dict[str, Any]:
    return await Kube(kube.api).dump(namespace)


def _items(dump: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [item for item in dump["items"] if item["kind"] == kind]


def _active_pods(dump: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        pod
        for pod in _items(dump, "Pod")
        if pod["metadata"].get("deletionTimestamp") is None
        and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    ]


def _sizes(dump: Mapping[str, Any]) -> dict[str, int]:
    return {rs["metadata"]["name"]: rs["spec"]["replicas"] for rs in _items(dump, "ReplicaSet")}


def _rollout(dump: Mapping[str, Any], namespace: str) -> Rollout | None:
    objects = load_objects(dump)
    return rollout_for(objects, snapshot_for_workload(objects, namespace, APP, "Deployment"))


def _condition(pod: Mapping[str, Any], kind: str) -> str | None:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == kind:
            return str(condition["status"])
    return None


def _fingerprint(dump: Mapping[str, Any], paused: bool) -> tuple[object, ...] | None:
    """What the controllers act on, when every one of them has caught up with it; ``None``
    while one of them still has work seen in the objects themselves."""
    (deployment,) = _items(dump, "Deployment")
    meta, status = deployment["metadata"], deployment.get("status", {})
    if status.get("observedGeneration") != meta["generation"]:
        return None
    if deployment["spec"].get("paused", False) != paused:
        return None
    pods = _active_pods(dump)
    sets = []
    for rs in _items(dump, "ReplicaSet"):
        rs_status, uid = rs.get("status", {}), rs["metadata"]["uid"]
        owned = [
            p
            for p in pods
            if any(o["uid"] == uid for o in p["metadata"].get("ownerReferences", []))
        ]
        want = rs["spec"]["replicas"]
        if rs_status.get("observedGeneration") != rs["metadata"]["generation"]:
            return None
        if rs_status.get("replicas", 0) != want or len(owned) != want:
            return None
        sets.append((rs["metadata"]["name"], want, rs_status.get("availableReplicas", 0),
                     tuple(sorted(rs["metadata"].get("annotations", {}).items()))))  # fmt: skip
    for pod in pods:
        bound = pod["spec"].get("nodeName")
        if bound and _condition(pod, "Ready") != "True":
            return None
        if not bound and _condition(pod, "PodScheduled") != "False":
            return None
    names = tuple(sorted(p["metadata"]["name"] for p in pods))
    return (tuple(sorted(sets)), status.get("replicas"), status.get("availableReplicas"), names)


async def _settle(kube: KubeTestCluster, namespace: str, *, paused: bool = False) -> dict[str, Any]:
    """The namespace's dump once the deployment and ReplicaSet controllers are done: every
    object observed, every ReplicaSet at its size, every pod placed and Ready or unschedulable,
    and nothing changed for ``QUIET`` seconds."""
    dump: dict[str, Any] = {}
    seen: tuple[object, ...] | None = None
    since = 0.0

    async def quiet() -> bool:
        nonlocal dump, seen, since
        dump = await _dump(kube, namespace)
        now = time.monotonic()
        mark = _fingerprint(dump, paused)
        if mark is None or mark != seen:
            seen, since = mark, now
            return False
        return now - since >= QUIET

    await kube.wait_for(
        quiet, f"the rollout of {namespace}/{APP} settled", timeout=120, interval=0.3
    )
    return dump


def _report(scenario: Scenario, what: str, dump: Mapping[str, Any]) -> str:
    rows = []
    for rs in _items(dump, "ReplicaSet"):
        annotations = rs["metadata"].get("annotations", {})
        rows.append(
            f"rs {rs['metadata']['name']} replicas={rs['spec']['replicas']} "
            f"available={rs.get('status', {}).get('availableReplicas', 0)} "
            f"created={rs['metadata']['creationTimestamp']} "
            f"revision={annotations.get('deployment.kubernetes.io/revision')} "
            f"desired={annotations.get('deployment.kubernetes.io/desired-replicas')} "
            f"max={annotations.get('deployment.kubernetes.io/max-replicas')}"
        )
    for pod in _active_pods(dump):
        meta = pod["metadata"]
        rows.append(
            f"pod {meta['name']}@{pod['spec'].get('nodeName')} "
            f"phase={pod.get('status', {}).get('phase')} ready={_condition(pod, 'Ready')} "
            f"created={meta['creationTimestamp']} cost={meta.get('annotations', {}).get(COST)}"
        )
    return f"seed {scenario.seed}: {what}\n  {scenario}\n    " + "\n    ".join(rows)


@pytest.mark.parametrize(
    "scenarios",
    [
        pytest.param(6, id="6", marks=pytest.mark.timeout(600)),
        pytest.param(100, id="100", marks=[pytest.mark.long, pytest.mark.timeout(3600)]),
    ],
)
async def test_the_rollout_model_agrees_with_the_real_deployment_controller(
    kube: KubeTestCluster, rollout_lanes: list[int], scenarios: int
) -> None:
    async def lane_run(lane: int) -> list[tuple[Scenario, str | None]]:
        return [
            await _run_scenario(kube, lane, seed)
            for seed in range(lane, scenarios, len(rollout_lanes))
        ]

    lanes = await asyncio.gather(*map(lane_run, rollout_lanes))
    results = [result for lane in lanes for result in lane]
    failures = [failure for _, failure in results if failure]
    played = [scenario for scenario, _ in results]
    three = sum(s.mid_rollout and len([n for n in s.paused.values() if n]) > 2 for s in played)
    print(
        f"\nrollout differential: {len(results)} scenarios, {len(results) - len(failures)} "
        f"agreed; {sum(s.mid_rollout for s in played)} mid-rollout at the scale ({three} with "
        f"three ReplicaSets holding), {sum(s.paused != s.stalled for s in played)} resized by "
        f"the pause, {sum(s.grows for s in played)} refused as growing, "
        f"{sum(s.deleted for s in played)} pods deleted, {sum(s.tied for s in played)} with a tie"
    )
    assert len(results) == scenarios
    assert not failures, "\n".join(failures)
