"""Test helpers over a real kube-apiserver: nodes with chosen labels and taints, opted-in
Deployments, waiting for Ready pods, scaling, and finding out which pods the controller deleted.

Used by the integration and e2e tiers through the ``kube`` fixture in ``tests/conftest.py``. Talks
to the API with kubernetes-asyncio; nothing here is faked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from podcost_core.model import FIELD_MANAGER

ZONE_LABEL = "topology.kubernetes.io/zone"
CAPACITY_LABEL = "karpenter.sh/capacity-type"
COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


def costed_by_podcost(pod: Any) -> bool:
    """Whether ``pod`` (a kubernetes-asyncio ``V1Pod``) carries a deletion cost whose field
    podcost's field manager owns."""
    if COST_ANNOTATION not in (pod.metadata.annotations or {}):
        return False
    for entry in pod.metadata.managed_fields or []:
        owned = (entry.fields_v1 or {}).get("f:metadata", {}).get("f:annotations", {})
        if entry.manager == FIELD_MANAGER and f"f:{COST_ANNOTATION}" in owned:
            return True
    return False


@dataclass(frozen=True)
class PodView:
    """What a test needs to know about one pod."""

    name: str
    uid: str
    node: str | None
    ready: bool
    deleting: bool
    raw: Any


class KubeTestCluster:
    """A handle on the real control plane for tests."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)

    async def create_node(
        self,
        name: str,
        *,
        zone: str | None = None,
        capacity_type: str | None = None,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        cpu: str = "8",
        memory: str = "32Gi",
        pods: str = "110",
    ) -> None:
        """A kwok-managed node with the given topology labels, taints and allocatable."""
        node_labels = {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})}
        if zone is not None:
            node_labels[ZONE_LABEL] = zone
        if capacity_type is not None:
            node_labels[CAPACITY_LABEL] = capacity_type
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": node_labels,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "spec": {"taints": [dict(taint) for taint in taints]},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
                "capacity": {"cpu": cpu, "memory": memory, "pods": pods},
            },
        }
        try:
            await self.core.create_node(body)
        except ApiException as error:
            if error.status != 409:
                raise
        await self.wait_for(lambda: self._node_ready(name), f"node {name} Ready", timeout=60)

    async def _node_ready(self, name: str) -> bool:
        node = await self.core.read_node(name)
        conditions = node.status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    async def delete_nodes(self, names: Sequence[str]) -> None:
        for name in names:
            try:
                await self.core.delete_node(name)
            except ApiException as error:
                if error.status != 404:
                    raise

    async def create_namespace(self, name: str) -> str:
        await self.core.create_namespace({"metadata": {"name": name}})

        async def has_default_sa() -> bool:
            accounts = await self.core.list_namespaced_service_account(name)
            return any(sa.metadata.name == "default" for sa in accounts.items)

        await self.wait_for(has_default_sa, f"default service account in {name}", timeout=60)
        return name

    async def delete_namespace(self, name: str) -> None:
        """Delete a namespace and wait until its pods are gone (so their nodes have room)."""
        try:
            await self.core.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise

        async def no_pods() -> bool:
            return not (await self.core.list_namespaced_pod(name)).items

        await self.wait_for(no_pods, f"the pods of namespace {name} gone", timeout=60)

    async def create_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int,
        *,
        annotations: Mapping[str, str] | None = None,
        opt_in: bool = False,
        one_per_node: bool = False,
        node_selector: Mapping[str, str] | None = None,
        pod_spec_extra: Mapping[str, Any] | None = None,
    ) -> None:
        """A Deployment whose pods kwok runs.

        ``opt_in`` adds podcost's ``podcost.dev/enabled: "true"``; ``one_per_node`` adds required
        pod anti-affinity on the hostname, so each pod lands on a node of its own.
        """
        labels = {"app": name}
        annotations = {**(annotations or {}), **({"podcost.dev/enabled": "true"} if opt_in else {})}
        pod_spec: dict[str, Any] = {
            "containers": [{"name": "app", "image": "registry.local/podcost/app:1"}],
            "terminationGracePeriodSeconds": 0,
        }
        if node_selector:
            pod_spec["nodeSelector"] = dict(node_selector)
        if one_per_node:
            pod_spec["affinity"] = {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": labels},
                         "topologyKey": "kubernetes.io/hostname"}
                    ]
                }
            }  # fmt: skip
        pod_spec.update(pod_spec_extra or {})
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            },
        }
        await self.apps.create_namespaced_deployment(namespace, body)

    async def pods(self, namespace: str, app: str) -> list[PodView]:
        listed = await self.core.list_namespaced_pod(namespace, label_selector=f"app={app}")
        views = []
        for pod in listed.items:
            conditions = (pod.status.conditions if pod.status else None) or []
            views.append(
                PodView(
                    name=pod.metadata.name,
                    uid=pod.metadata.uid,
                    node=pod.spec.node_name,
                    ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
                    deleting=pod.metadata.deletion_timestamp is not None,
                    raw=pod,
                )
            )
        return views

    async def active_pods(self, namespace: str, app: str) -> list[PodView]:
        return [pod for pod in await self.pods(namespace, app) if not pod.deleting]

    async def wait_ready(
        self, namespace: str, app: str, count: int, timeout: float = 90
    ) -> list[PodView]:
        """Wait until exactly ``count`` pods of ``app`` exist, all Ready; return them."""
        result: list[PodView] = []

        async def ready() -> bool:
            nonlocal result
            pods = await self.pods(namespace, app)
            result = pods
            return len(pods) == count and all(p.ready and not p.deleting for p in pods)

        await self.wait_for(ready, f"{count} Ready pods of {namespace}/{app}", timeout)
        return result

    async def scale(self, namespace: str, name: str, replicas: int) -> None:
        await self.apps.patch_namespaced_deployment_scale(
            name, namespace, {"spec": {"replicas": replicas}}
        )

    async def scale_and_observe(
        self, namespace: str, name: str, replicas: int, timeout: float = 90
    ) -> set[str]:
        """Scale in and return the names of the pods the controller deleted."""
        before = {pod.name for pod in await self.active_pods(namespace, name)}
        await self.scale(namespace, name, replicas)
        remaining: set[str] = set()

        async def settled() -> bool:
            nonlocal remaining
            remaining = {pod.name for pod in await self.active_pods(namespace, name)}
            return len(remaining) == replicas

        await self.wait_for(settled, f"{namespace}/{name} at {replicas} pods", timeout)
        return before - remaining

    async def raw_pods(self, namespace: str, app: str) -> list[dict[str, Any]]:
        """The pods of ``app`` as the JSON ``kubectl get -o json`` prints."""
        listed = await self.core.list_namespaced_pod(namespace, label_selector=f"app={app}")
        raw: list[dict[str, Any]] = self.api.sanitize_for_serialization(listed)["items"]
        return raw

    async def patch_pod_status(self, namespace: str, pod: str, status: Mapping[str, Any]) -> None:
        """Strategic-merge ``status`` into the pod's status (conditions merge by type)."""
        await self.core.patch_namespaced_pod_status(pod, namespace, {"status": dict(status)})

    async def set_deletion_cost(self, namespace: str, pod: str, cost: int | str) -> None:
        await self.core.patch_namespaced_pod(
            pod, namespace, {"metadata": {"annotations": {COST_ANNOTATION: str(cost)}}}
        )

    @staticmethod
    async def wait_for(check: Any, what: str, timeout: float = 60, interval: float = 0.2) -> None:
        """Await ``check()`` until it is true; fail the test naming ``what`` on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if await check():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            await asyncio.sleep(interval)
