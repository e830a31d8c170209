"""Differential test: podcost's model of the ReplicaSet controller's victim selection against the
real kube-controller-manager.

Each scenario is drawn from a seeded random generator: a Deployment on a few kwok nodes (pods
doubled up or not), ready in one or two waves (so LogarithmicScaleDown buckets differ), then
deletion costs, restart counts (regular and sidecar), not-ready and Unknown-phase pods, and pods
the scheduler could not place. The controller's state is read back from the API, the model
(``podcost_core.victims``) predicts the victims of a scale-in, the real controller deletes, and
the two must agree exactly; where Kubernetes' own sort leaves a tie, the model names the tied
pods and how many of them go, and the real choice must be drawn from exactly those.

20 scenarios run in ``make test``; the ``long``-marked variant runs 300 (``make test-long``).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from tests.support.kube import KubeTestCluster

from podcost_core.tomodel import pod_from_json
from podcost_core.victims import NowWindow, deletion_cost_error, pods_to_delete

pytestmark = pytest.mark.integration

LANES = 3
COSTS = ("-5", "0", "3", "3", "100", "-2147483648", "2147483647", "-007", "-0")
#: Values around the edges of what the API server accepts as a deletion cost.
COST_EDGES = (
    "0",
    "-0",
    "7",
    "-007",
    "+7",
    "007",
    " 5",
    "5 ",
    "1_000",
    "2147483647",
    "2147483648",
    "-2147483648",
    "-2147483649",
    "1e3",
    "0x10",
    "",
    "٣",
)

# kwok's pod-ready stage never touches a Running pod again, so status patches stick.
SIDECAR = {
    "name": "sidecar",
    "image": "registry.local/podcost/sidecar:1",
    "restartPolicy": "Always",
}


@dataclass
class Scenario:
    """What one seed decided; printed when the model and the controller disagree."""

    seed: int
    replicas: int = 0
    second_wave: int = 0
    wave_gap: float = 0.0
    tight: bool = False
    nodes: list[str] = field(default_factory=list)
    mutations: list[str] = field(default_factory=list)
    target: int = 0


def _lane_nodes(lane: int) -> tuple[list[str], str]:
    return [f"diff-{lane}-{i}" for i in range(4)], f"diff-{lane}-tight"


@pytest.fixture(scope="module")
async def lanes(kube: KubeTestCluster) -> list[int]:
    """Per lane: four roomy nodes in two zones, and one tainted node with room for 3 pods."""
    for lane in range(LANES):
        roomy, tight = _lane_nodes(lane)
        for index, name in enumerate(roomy):
            await kube.create_node(name, zone=f"zone-{index % 2}", labels={"diff-node": name})
        await kube.create_node(
            tight,
            zone="zone-t",
            labels={"diff-node": tight},
            taints=[{"key": "diff-tight", "value": "true", "effect": "NoSchedule"}],
            pods="3",
        )
    return list(range(LANES))


async def _run_scenario(kube: KubeTestCluster, lane: int, seed: int) -> tuple[Scenario, str | None]:
    namespace = await kube.create_namespace(f"diff-{seed}-{uuid.uuid4().hex[:4]}")
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
    scenario.tight = rng.random() < 0.2
    if scenario.tight:
        # More pods than fit on the tight node: the rest stay unassigned (rule 1).
        scenario.nodes = [tight]
        scenario.replicas = rng.randint(4, 6)
    else:
        scenario.nodes = rng.sample(roomy, rng.randint(1, 4))
        scenario.replicas = rng.randint(3, 9)
    extra: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": "diff-node", "operator": "In", "values": scenario.nodes}
                        ]}
                    ]
                }
            }
        },
        "tolerations": [{"key": "diff-tight", "operator": "Exists", "effect": "NoSchedule"}],
    }  # fmt: skip
    with_sidecar = rng.random() < 0.4
    if with_sidecar:
        extra["initContainers"] = [SIDECAR]
    scheduled = min(scenario.replicas, 3) if scenario.tight else scenario.replicas
    await kube.create_deployment(namespace, "web", scenario.replicas, pod_spec_extra=extra)
    await _wait_placed(kube, namespace, scenario.replicas, scheduled)
    if not scenario.tight and rng.random() < 0.5:
        # A second wave, later: their ready times fall in younger log2 buckets (rule 6).
        scenario.second_wave = rng.randint(1, 4)
        scenario.wave_gap = rng.choice((0.0, 2.5, 5.0))
        await asyncio.sleep(scenario.wave_gap)
        scenario.replicas += scenario.second_wave
        await kube.scale(namespace, "web", scenario.replicas)
        await _wait_placed(kube, namespace, scenario.replicas, scenario.replicas)

    pods = sorted(await kube.pods(namespace, "web"), key=lambda pod: pod.name)
    placed = [pod for pod in pods if pod.node]
    if rng.random() < 0.6:
        for pod in rng.sample(pods, rng.randint(1, len(pods))):
            cost = rng.choice(COSTS)
            await kube.set_deletion_cost(namespace, pod.name, cost)
            scenario.mutations.append(f"{pod.name} cost={cost}")
    if rng.random() < 0.5:
        for pod in rng.sample(placed, rng.randint(1, min(3, len(placed)))):
            restarts = rng.choice((1, 2, 5))
            statuses = [
                {"name": "app", "image": "registry.local/podcost/app:1", "ready": True,
                 "restartCount": restarts, "state": {"running": {}}}
            ]  # fmt: skip
            status: dict[str, Any] = {"containerStatuses": statuses}
            if with_sidecar and rng.random() < 0.5:
                status["initContainerStatuses"] = [
                    {"name": "sidecar", "image": SIDECAR["image"], "ready": True, "started": True,
                     "restartCount": rng.choice((1, 3)), "state": {"running": {}}}
                ]  # fmt: skip
            await kube.patch_pod_status(namespace, pod.name, status)
            scenario.mutations.append(f"{pod.name} restarts={restarts}")
    if rng.random() < 0.3 and len(placed) > 1:
        pod = rng.choice(placed)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        await kube.patch_pod_status(
            namespace,
            pod.name,
            {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}]},
        )
        scenario.mutations.append(f"{pod.name} not-ready")
    if rng.random() < 0.15 and len(placed) > 1:
        pod = rng.choice(placed)
        await kube.patch_pod_status(namespace, pod.name, {"phase": "Unknown"})
        scenario.mutations.append(f"{pod.name} phase=Unknown")
    # The controller decides from its informer cache; give it a moment to see the patches
    # (there is no API to ask a controller what its cache holds).
    await asyncio.sleep(1.0)

    raw = await kube.raw_pods(namespace, "web")
    model_pods = [pod_from_json(item) for item in raw]
    active = [pod for pod in model_pods if pod.active]
    scenario.target = rng.randint(1, len(active) - 1)
    earliest = time.time()
    deleted_names = await kube.scale_and_observe(namespace, "web", scenario.target)
    latest = time.time()
    choice = pods_to_delete(
        active, model_pods, len(active) - scenario.target, NowWindow(earliest, latest)
    )
    by_name = {pod.name: pod.uid for pod in model_pods}
    deleted = {by_name[name] for name in deleted_names}
    if choice.admits(deleted):
        return scenario, None
    return scenario, (
        f"seed {seed}: controller deleted {sorted(deleted_names)}; model: certain "
        f"{sorted(p.name for p in choice.certain)}, {choice.tie_picks} of "
        f"{sorted(p.name for p in choice.tied)}\n  {scenario}\n  pods: {_describe(raw)}"
    )


async def _wait_placed(kube: KubeTestCluster, namespace: str, total: int, ready: int) -> None:
    async def placed() -> bool:
        pods = await kube.active_pods(namespace, "web")
        return len(pods) == total and sum(pod.ready for pod in pods) == ready

    await kube.wait_for(placed, f"{total} pods, {ready} ready in {namespace}", timeout=90)


def _describe(raw: list[dict[str, Any]]) -> str:
    rows = []
    for item in raw:
        meta, status = item["metadata"], item.get("status", {})
        ready = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
        rows.append(
            f"{meta['name']}@{item['spec'].get('nodeName')} phase={status.get('phase')} "
            f"ready={ready[0]['status'] if ready else None}/"
            f"{ready[0].get('lastTransitionTime') if ready else None} "
            f"created={meta['creationTimestamp']} uid={meta['uid']} "
            f"cost={meta.get('annotations', {}).get('controller.kubernetes.io/pod-deletion-cost')}"
        )
    return "\n    ".join(rows)


@pytest.mark.parametrize(
    "scenarios",
    [
        pytest.param(20, id="20", marks=pytest.mark.timeout(600)),
        pytest.param(300, id="300", marks=[pytest.mark.long, pytest.mark.timeout(1800)]),
    ],
)
async def test_the_victim_model_agrees_with_the_real_replicaset_controller(
    kube: KubeTestCluster, lanes: list[int], scenarios: int
) -> None:
    async def lane_run(lane: int) -> list[tuple[Scenario, str | None]]:
        return [
            await _run_scenario(kube, lane, seed) for seed in range(lane, scenarios, len(lanes))
        ]

    results = [result for lane in await asyncio.gather(*map(lane_run, lanes)) for result in lane]
    failures = [failure for _, failure in results if failure]
    assert len(results) == scenarios
    assert not failures, "\n".join(failures)


async def test_the_api_server_accepts_exactly_the_deletion_costs_the_model_calls_valid(
    kube: KubeTestCluster, lanes: list[int]
) -> None:
    namespace = await kube.create_namespace(f"diff-costs-{uuid.uuid4().hex[:4]}")
    await kube.create_deployment(namespace, "web", 1, node_selector={"diff-node": "diff-0-0"})
    (pod,) = await kube.wait_ready(namespace, "web", 1)
    verdicts = {}
    for value in COST_EDGES:
        try:
            await kube.set_deletion_cost(namespace, pod.name, value)
            verdicts[value] = True
        except ApiException as error:
            # Anything but "Invalid" is a broken test, not a verdict.
            if error.status != 422:
                raise
            verdicts[value] = False
    await kube.delete_namespace(namespace)
    assert verdicts == {value: deletion_cost_error(value) is None for value in COST_EDGES}
