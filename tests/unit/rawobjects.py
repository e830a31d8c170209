"""Raw Kubernetes objects as the API serves them, small and hand-written, for the unit tests of
the watcher's decisions over the informer cache (``test_workloads.py``, ``test_node_load.py``)."""

from __future__ import annotations

from typing import Any

from podcost_kube.workloads import DEPLOYMENT, REPLICASET

NS = "shop"
T = "2024-05-01T12:00:00Z"


def managed(manager: str, *annotations: str) -> dict[str, Any]:
    """A managedFields entry: ``manager`` owns these annotations."""
    fields: dict[str, Any] = {f"f:{key}": {} for key in annotations}
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": T,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": fields}},
    }


def owner(kind: str, name: str) -> list[dict[str, Any]]:
    api_version = "v1" if kind == "Node" else "apps/v1"
    return [
        {"apiVersion": api_version, "kind": kind, "name": name, "uid": f"uid-{name}",
         "controller": True}
    ]  # fmt: skip


def raw_pod(
    name: str,
    *,
    rs: str | None,
    app: str,
    node: str | None,
    namespace: str = NS,
    cpu: str = "100m",
    phase: str = "Running",
    controller_kind: str = REPLICASET,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "resourceVersion": "1",
        "creationTimestamp": T,
        "labels": {"app": app},
        "managedFields": [managed("kube-controller-manager")],
    }
    if rs is not None:
        meta["ownerReferences"] = owner(controller_kind, rs)
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {
            "phase": phase,
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": T}],
        },
    }


def raw_replicaset(
    name: str, app: str, deployment: str | None, replicas: int = 2
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "resourceVersion": "1",
        "creationTimestamp": T,
    }
    if deployment is not None:
        meta["ownerReferences"] = owner(DEPLOYMENT, deployment)
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": meta,
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}}},
        "status": {"replicas": replicas},
    }


def raw_deployment(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": 1,
            "annotations": annotations or {},
        },
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}}},
        "status": {"observedGeneration": 1},
    }


def raw_node(name: str, zone: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"topology.kubernetes.io/zone": zone},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": T}],
        },
    }


def raw_namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    meta = {"name": name, "uid": f"uid-ns-{name}", "resourceVersion": "1", "labels": labels}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
