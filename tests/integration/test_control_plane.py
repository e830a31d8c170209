"""Proof that the project's own control plane is real: kwok nodes in three zones run a
Deployment's pods, and the real ReplicaSet controller picks scale-in victims by its own rules —
the deletion-cost annotation first, and, without it, the newest pods first."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from tests.support.kube import KubeTestCluster

pytestmark = pytest.mark.integration

ZONES = ("zone-a", "zone-b", "zone-c")


@pytest.fixture(scope="module")
async def six_nodes_in_three_zones(kube: KubeTestCluster) -> list[str]:
    names = [f"proof-{zone}-{i}" for zone in ZONES for i in range(2)]
    for name in names:
        await kube.create_node(
            name, zone=name.split("-", 1)[1].rsplit("-", 1)[0], labels={"proof": "cp"}
        )
    return names


async def test_a_six_replica_deployment_on_six_kwok_nodes_becomes_ready(
    kube: KubeTestCluster, six_nodes_in_three_zones: list[str]
) -> None:
    namespace = await kube.create_namespace(f"proof-{uuid.uuid4().hex[:6]}")
    await kube.create_deployment(
        namespace, "web", 6, one_per_node=True, node_selector={"proof": "cp"}
    )
    pods = await kube.wait_ready(namespace, "web", 6)
    assert sorted(pod.node for pod in pods) == sorted(six_nodes_in_three_zones)


async def test_scale_in_deletes_exactly_the_pods_given_a_low_deletion_cost(
    kube: KubeTestCluster, six_nodes_in_three_zones: list[str]
) -> None:
    namespace = await kube.create_namespace(f"proof-{uuid.uuid4().hex[:6]}")
    await kube.create_deployment(
        namespace, "web", 6, one_per_node=True, node_selector={"proof": "cp"}
    )
    pods = await kube.wait_ready(namespace, "web", 6)
    chosen = sorted(pod.name for pod in pods)[1:3]
    for name in chosen:
        await kube.set_deletion_cost(namespace, name, -100)
    deleted = await kube.scale_and_observe(namespace, "web", 4)
    assert deleted == set(chosen)


async def test_without_costs_the_controller_deletes_the_newest_ready_pods_first(
    kube: KubeTestCluster, six_nodes_in_three_zones: list[str]
) -> None:
    namespace = await kube.create_namespace(f"proof-{uuid.uuid4().hex[:6]}")
    await kube.create_deployment(
        namespace, "web", 3, one_per_node=True, node_selector={"proof": "cp"}
    )
    old = {pod.name for pod in await kube.wait_ready(namespace, "web", 3)}
    # LogarithmicScaleDown compares ready times in powers-of-two buckets of age: the old pods must
    # be more than twice as old as the new ones when the controller decides. Real time has to
    # pass here; there is no clock to fake inside kube-controller-manager.
    await asyncio.sleep(8)
    await kube.scale(namespace, "web", 6)
    everyone = {pod.name for pod in await kube.wait_ready(namespace, "web", 6)}
    new = everyone - old
    deleted = await kube.scale_and_observe(namespace, "web", 3)
    assert deleted == new
