"""Switching from the lablabs pod-deletion-cost-controller to podcost, on the real control plane.

A 5-replica Deployment with the lablabs annotations runs on two zones (3 + 2 pods). Before podcost
starts, a client that names itself as the lablabs controller does (user agent ``manager/...``, no
field manager: the API server calls it ``manager``) gives four pods lablabs-like costs near 2^31,
and ``kubectl annotate`` (field manager ``kubectl-annotate``) gives the fifth a cost of 1000.
Left as they are, a scale-in to 4 deletes the ``kubectl`` pod of the smaller zone (skew 1 → 2).
podcost, started with its default settings, takes the lablabs costs over (rewrites them into its
own order and band, under its own field manager), leaves the ``kubectl`` cost as it is, and the
real kube-controller-manager's scale-in to 4 then leaves the least skew (0).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from tests.conftest import ControlPlane
from tests.support.kube import COST_ANNOTATION, KubeTestCluster

from podcost.embedded import bootstrap
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_core.kubejson import cost_managers
from podcost_core.labels import DEFAULT_BAND
from podcost_core.model import FIELD_MANAGER, LABLABS_FIELD_MANAGER
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube

pytestmark = pytest.mark.e2e

LABLABS = {"pod-deletion-cost.lablabs.io/enabled": "true"}
#: client-go's user agent for a binary named ``manager`` (``rest.DefaultKubernetesUserAgent``).
LABLABS_USER_AGENT = "manager/v0.0.0 (linux/amd64) kubernetes/$Format"


def _manager_of(pod: dict[str, Any]) -> tuple[str, ...]:
    return cost_managers(pod["metadata"])


async def test_podcost_takes_over_the_lablabs_costs_keeps_kubectls_and_scales_in_evenly(
    control_plane: ControlPlane, kube: KubeTestCluster
) -> None:
    prefix = f"l{uuid.uuid4().hex[:5]}"
    namespace = await kube.create_namespace(f"adopt-{prefix}")
    nodes = {f"{prefix}-a-{i}": "zone-a" for i in range(3)}
    nodes |= {f"{prefix}-b-{i}": "zone-b" for i in range(2)}
    for name, zone in nodes.items():
        await kube.create_node(name, zone=zone, labels={"e2e": prefix})
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None
    lablabs_api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        await kube.create_deployment(
            namespace, "web", 5, annotations=LABLABS, one_per_node=True,
            node_selector={"e2e": prefix},
        )  # fmt: skip
        pods = await kube.wait_ready(namespace, "web", 5)
        zone_of = {pod.name: nodes[pod.node or ""] for pod in pods}
        in_a = sorted(name for name, zone in zone_of.items() if zone == "zone-a")
        in_b = sorted(name for name, zone in zone_of.items() if zone == "zone-b")

        # The lablabs controller's writes: a merge patch, no field manager, its user agent.
        lablabs_api.user_agent = LABLABS_USER_AGENT
        lablabs = client.CoreV1Api(lablabs_api)
        lablabs_costs = {name: 2**31 - 1 - index for index, name in enumerate([*in_a, in_b[0]])}
        for name, cost in lablabs_costs.items():
            body = {"metadata": {"annotations": {COST_ANNOTATION: str(cost)}}}
            await lablabs.patch_namespaced_pod(name, namespace, body)
        # `kubectl annotate pod ... controller.kubernetes.io/pod-deletion-cost=1000`.
        person = in_b[1]
        await kube.core.patch_namespaced_pod(
            person, namespace, {"metadata": {"annotations": {COST_ANNOTATION: "1000"}}},
            field_manager="kubectl-annotate",
        )  # fmt: skip

        kube_client = Kube(api)
        dump = await kube_client.dump(namespace)
        by_name = {
            item["metadata"]["name"]: item for item in dump["items"] if item["kind"] == "Pod"
        }
        assert {_manager_of(by_name[name]) for name in lablabs_costs} == {(LABLABS_FIELD_MANAGER,)}
        assert _manager_of(by_name[person]) == ("kubectl-annotate",)
        # Today, with those costs: the controller deletes the kubectl pod of zone-b.
        snapshot = snapshot_for_workload(load_objects(dump), namespace, "web", "Deployment")
        today = simulate(snapshot, 4, time.time(), policy=None)
        assert [pod.name for pod in today.victims] == [person]
        assert (today.skew_before, today.skew_after) == (1, 2)

        pipeline = bootstrap(
            ServiceSettings(cluster="e2e", http_port=0),  # default: adopt "manager"
            BusSettings(),
            kube=kube_client,
            bus=MemoryBus(),
            watcher_settings=WatcherSettings(
                namespace=namespace, debounce_seconds=0.2, max_delay_seconds=1.0
            ),
        )
        task = asyncio.create_task(
            serve(pipeline.services, ServiceSettings(http_port=0), bus=pipeline.bus, stop=stop)
        )

        async def taken_over() -> bool:
            if task is not None and task.done():
                task.result()
            raw = {pod["metadata"]["name"]: pod for pod in await kube.raw_pods(namespace, "web")}
            return all(
                _manager_of(raw[name]) == (FIELD_MANAGER,)
                and int(raw[name]["metadata"]["annotations"][COST_ANNOTATION]) in DEFAULT_BAND
                for name in lablabs_costs
            )

        await kube.wait_for(taken_over, "podcost's costs on the lablabs pods", timeout=60)
        raw = {pod["metadata"]["name"]: pod for pod in await kube.raw_pods(namespace, "web")}
        assert raw[person]["metadata"]["annotations"][COST_ANNOTATION] == "1000"
        assert _manager_of(raw[person]) == ("kubectl-annotate",)

        deleted = await kube.scale_and_observe(namespace, "web", 4)
        assert len(deleted) == 1, deleted
        assert deleted <= set(in_a), (deleted, in_a)
        left = [pod.name for pod in await kube.active_pods(namespace, "web")]
        assert sorted(zone_of[name] for name in left) == ["zone-a", "zone-a", "zone-b", "zone-b"]
        assert person in left
    finally:
        stop.set()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
        await lablabs_api.close()
        await api.close()
        await kube.delete_namespace(namespace)
        await kube.delete_nodes(list(nodes))
