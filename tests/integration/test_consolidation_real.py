"""KEP-5982's example on the real kube-controller-manager: 5 nodes of 4 pods of one Deployment,
scaled from 20 to 10 (kubernetes/kubernetes#138718); and on the same nodes, Karpenter's marks.

Without deletion costs the ReplicaSet controller draws 10 of 20 tied pods and leaves, almost
always, no node empty; 2 empty nodes are possible. podcost ranks the Deployment read back from
the API (``node-consolidation`` alone, and the default policy), its costs are written onto the
pods, the real controller scales in, and the pods it deleted must empty 2 whole nodes, as the
victim model predicted (``SimulationResult.admits``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter

import pytest
from tests.support.kube import KubeTestCluster

from podcost_core.policy import DEFAULT_POLICY, STRATEGIES, policy_from_annotations
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_core.strategies.karpenter import DISRUPTED_TAINT, DO_NOT_DISRUPT
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

NODES = tuple(f"kep5982-{index}" for index in range(5))
TAINT = {"key": "podcost-test/kep-5982", "value": "true", "effect": "NoSchedule"}
DISRUPTED = {"key": DISRUPTED_TAINT, "effect": "NoSchedule"}


@pytest.fixture(scope="module")
async def kep_nodes(kube: KubeTestCluster) -> tuple[str, ...]:
    """Five nodes with room for exactly 4 pods each, tainted so that only this test uses them."""
    for name in NODES:
        await kube.create_node(name, labels={"kep-5982": "true"}, taints=[TAINT], pods="4")
    return NODES


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "annotations",
    [pytest.param({STRATEGIES: "node-consolidation"}, id="node-consolidation"),
     pytest.param({}, id="default-policy")],
)  # fmt: skip
async def test_scaling_20_pods_on_5_nodes_to_10_with_podcosts_costs_empties_2_nodes(
    kube: KubeTestCluster, kep_nodes: tuple[str, ...], annotations: dict[str, str]
) -> None:
    namespace = await kube.create_namespace(f"kep5982-{uuid.uuid4().hex[:6]}")
    try:
        await kube.create_deployment(
            namespace,
            "web",
            20,
            annotations=annotations,
            opt_in=True,
            node_selector={"kep-5982": "true"},
            pod_spec_extra={"tolerations": [{**TAINT, "operator": "Equal"}]},
        )
        pods = await kube.wait_ready(namespace, "web", 20)
        assert Counter(pod.node for pod in pods) == dict.fromkeys(kep_nodes, 4)

        objects = load_objects(await Kube(kube.api).dump(namespace))
        snapshot = snapshot_for_workload(objects, namespace, "web", "Deployment")
        policy = policy_from_annotations(snapshot.annotations, default=DEFAULT_POLICY)
        planned = simulate(snapshot, 10, time.time(), policy=policy)
        # The pods of one node take one run of costs: nodes are drained one after the other
        # (the costs as the controller reads them once written; a pod podcost leaves without
        # one reads as 0).
        node_of = {pod.name: pod.node for pod in pods}
        runs = [node_of[name] for name, _ in sorted(planned.costs.items(), key=lambda i: i[1])]
        assert [len(list(run)) for _, run in itertools.groupby(runs)] == [4] * 5
        for name, cost in planned.writes.items():
            await kube.set_deletion_cost(namespace, name, cost)
        # The controller decides from its informer cache; give it a moment to see the costs
        # (there is no API to ask a controller what its cache holds).
        await asyncio.sleep(1.0)

        deleted = await kube.scale_and_observe(namespace, "web", 10)
        left = Counter(pod.node for pod in await kube.active_pods(namespace, "web"))
        assert planned.admits(deleted), (sorted(deleted), planned.to_json())
        assert sorted(left.values()) == [2, 4, 4]
        assert len([name for name in kep_nodes if not left[name]]) == 2
    finally:
        await kube.delete_namespace(namespace)


@pytest.mark.timeout(300)
async def test_karpenters_draining_node_goes_first_and_do_not_disrupt_pods_stay(
    kube: KubeTestCluster, kep_nodes: tuple[str, ...]
) -> None:
    """Scale 20 → 14 with ``karpenter | node-consolidation``: the 4 pods of the node tainted
    ``karpenter.sh/disrupted`` go, then 2 of the node drained next, whose 2 pods annotated
    ``karpenter.sh/do-not-disrupt`` stay."""
    namespace = await kube.create_namespace(f"karpenter-{uuid.uuid4().hex[:6]}")
    draining, next_up = kep_nodes[3], kep_nodes[0]
    try:
        await kube.create_deployment(
            namespace,
            "web",
            20,
            annotations={STRATEGIES: "karpenter | node-consolidation"},
            opt_in=True,
            node_selector={"kep-5982": "true"},
            pod_spec_extra={"tolerations": [{**TAINT, "operator": "Equal"}]},
        )
        pods = await kube.wait_ready(namespace, "web", 20)
        await kube.core.patch_node(draining, {"spec": {"taints": [TAINT, DISRUPTED]}})
        precious = sorted(pod.name for pod in pods if pod.node == next_up)[:2]
        for name in precious:
            await kube.core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": {DO_NOT_DISRUPT: "true"}}}
            )

        objects = load_objects(await Kube(kube.api).dump(namespace))
        snapshot = snapshot_for_workload(objects, namespace, "web", "Deployment")
        policy = policy_from_annotations(snapshot.annotations, default=DEFAULT_POLICY)
        planned = simulate(snapshot, 14, time.time(), policy=policy)
        for name, cost in planned.writes.items():
            await kube.set_deletion_cost(namespace, name, cost)
        await asyncio.sleep(1.0)  # the controller's informer cache (see above)

        deleted = await kube.scale_and_observe(namespace, "web", 14)
        node_of = {pod.name: pod.node for pod in pods}
        assert planned.admits(deleted), (sorted(deleted), planned.to_json())
        assert Counter(node_of[name] for name in deleted) == {draining: 4, next_up: 2}
        assert not deleted & set(precious)
    finally:
        await kube.core.patch_node(draining, {"spec": {"taints": [TAINT]}})
        await kube.delete_namespace(namespace)
