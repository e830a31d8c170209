"""Pods as the API server serves a Deployment's pods that kwok runs: every field of a real pod
(the service-account volume, default tolerations, managedFields of the controller manager, kwok
and podcost, the four conditions, container statuses), for measuring and checking what the
informer keeps of them (``podcost_core.projection.project_pod``).

The shape is that of a ``kubectl get pod -o json --show-managed-fields`` of a kube-apiserver
1.3x with kwok; values vary per pod (name, uid, version, volume suffix, IPs, times) as they do
in a cluster, and repeat within a ReplicaSet (labels, owner, requests) as they do there.
:func:`served_node`, :func:`served_deployment` and :func:`served_replicaset` are the nodes and
workloads of ``tests.bench.bench_scale``'s cluster as served (``project_node``,
``project_workload``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from podcost_core.model import DELETION_COST_ANNOTATION, FIELD_MANAGER

_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _suffix(index: int, length: int = 5) -> str:
    chars = []
    for _ in range(length):
        index, digit = divmod(index, len(_ALPHABET))
        chars.append(_ALPHABET[digit])
    return "".join(chars)


def _time(second: int) -> str:
    minutes, seconds = divmod(second, 60)
    hours, minutes = divmod(minutes, 60)
    return f"2026-11-24T{hours % 24:02d}:{minutes:02d}:{seconds:02d}Z"


def served_pod(
    index: int,
    *,
    namespace: str = "bench",
    deployment: str = "web",
    template_hash: str = "7c9d8f5b6d",
    nodes: int = 100,
    cost: int | None = None,
) -> dict[str, Any]:
    """The ``index``-th pod of a Deployment, Running and Ready on one of ``nodes`` kwok nodes,
    with a deletion cost written by podcost when ``cost`` is given."""
    replicaset = f"{deployment}-{template_hash}"
    rs_uid = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{namespace}/{replicaset}"))
    name = f"{replicaset}-{_suffix(index)}"
    volume = f"kube-api-access-{_suffix(index * 7919 + 13)}"
    created = _time(3600 + index // 50)  # a burst: 50 pods a second
    started = _time(3600 + index // 50 + 2)
    node = f"kwok-node-{index % nodes}"
    host_ip = f"10.0.{index % nodes // 250}.{index % nodes % 250 + 1}"
    pod_ip = f"10.{1 + index // 65000}.{index // 250 % 250}.{index % 250 + 1}"
    managed: list[dict[str, Any]] = [
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "apiVersion": "v1",
            "time": created,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {
                    "f:generateName": {},
                    "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                    "f:ownerReferences": {".": {}, f'k:{{"uid":"{rs_uid}"}}': {}},
                },
                "f:spec": {
                    "f:containers": {
                        'k:{"name":"app"}': {
                            ".": {},
                            "f:image": {},
                            "f:imagePullPolicy": {},
                            "f:name": {},
                            "f:resources": {
                                ".": {},
                                "f:limits": {".": {}, "f:memory": {}},
                                "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}},
                            },
                            "f:terminationMessagePath": {},
                            "f:terminationMessagePolicy": {},
                        }
                    },
                    "f:dnsPolicy": {},
                    "f:enableServiceLinks": {},
                    "f:restartPolicy": {},
                    "f:schedulerName": {},
                    "f:securityContext": {},
                    "f:terminationGracePeriodSeconds": {},
                },
            },
        },
        {
            "manager": "kwok",
            "operation": "Update",
            "apiVersion": "v1",
            "time": started,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:status": {
                    "f:conditions": {
                        f'k:{{"type":"{kind}"}}': {
                            ".": {},
                            "f:lastProbeTime": {},
                            "f:lastTransitionTime": {},
                            "f:status": {},
                            "f:type": {},
                        }
                        for kind in ("ContainersReady", "Initialized", "Ready")
                    },
                    "f:containerStatuses": {},
                    "f:hostIP": {},
                    "f:hostIPs": {},
                    "f:phase": {},
                    "f:podIP": {},
                    "f:podIPs": {".": {}, f'k:{{"ip":"{pod_ip}"}}': {".": {}, "f:ip": {}}},
                    "f:startTime": {},
                }
            },
            "subresource": "status",
        },
    ]
    annotations: dict[str, str] | None = None
    if cost is not None:
        annotations = {DELETION_COST_ANNOTATION: str(cost)}
        managed.append(
            {
                "manager": FIELD_MANAGER,
                "operation": "Apply",
                "apiVersion": "v1",
                "time": started,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:annotations": {f"f:{DELETION_COST_ANNOTATION}": {}}}
                },
            }
        )
    metadata: dict[str, Any] = {
        "name": name,
        "generateName": f"{replicaset}-",
        "namespace": namespace,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, f"{namespace}/{name}")),
        "resourceVersion": str(100_000 + index * 3),
        "creationTimestamp": created,
        "labels": {"app": deployment, "pod-template-hash": template_hash},
        **({"annotations": annotations} if annotations is not None else {}),
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": replicaset,
                "uid": rs_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "managedFields": managed,
    }
    condition = {"status": "True", "lastProbeTime": None, "lastTransitionTime": started}
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": {
            "volumes": [
                {
                    "name": volume,
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": [
                {
                    "name": "app",
                    "image": "registry.local/podcost/app:1",
                    "resources": {
                        "limits": {"memory": "64Mi"},
                        "requests": {"cpu": "10m", "memory": "64Mi"},
                    },
                    "volumeMounts": [
                        {
                            "name": volume,
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": node,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": f"node.kubernetes.io/{taint}",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
                for taint in ("not-ready", "unreachable")
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", **condition},
                {"type": "Ready", **condition},
                {"type": "ContainersReady", **condition},
                {"type": "PodScheduled", **condition, "lastTransitionTime": created},
            ],
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": created,
            "containerStatuses": [
                {
                    "name": "app",
                    "state": {"running": {"startedAt": started}},
                    "lastState": {},
                    "ready": True,
                    "restartCount": index % 3,
                    "image": "registry.local/podcost/app:1",
                    "imageID": "",
                    "started": True,
                }
            ],
            "qosClass": "Burstable",
        },
    }


# --- the objects around the pods ---------------------------------------------------------------

_NODE_CONDITIONS = (
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"),
)


def served_node(index: int, *, pods: int = 30) -> dict[str, Any]:
    """The ``index``-th kwok node as the API server serves it once kwok's ``node-initialize``
    stage has run (its conditions, addresses, node info, daemon endpoints), with the labels of
    ``tests.bench.bench_scale``'s nodes and those the node controller adds."""
    name = f"kwok-node-{index}"
    created, beat = _time(60 + index), _time(3000 + index)
    allocatable = {"cpu": "32", "memory": "128Gi", "pods": str(pods)}
    version = "kwok-v0.8.0"
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, name)),
            "resourceVersion": str(100000 + index),
            "creationTimestamp": created,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "karpenter.sh/capacity-type": "spot" if index % 5 == 0 else "on-demand",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": f"z{index % 3}",
                "type": "kwok",
            },
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [
                {
                    "manager": "kwok",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": beat,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:nodeInfo": {}}},
                    "subresource": "status",
                }
            ],
        },
        "spec": {
            "podCIDR": f"10.244.{index % 250}.0/24",
            "podCIDRs": [f"10.244.{index % 250}.0/24"],
        },
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": kind,
                    "status": status,
                    "lastHeartbeatTime": beat,
                    "lastTransitionTime": created,
                    "reason": reason,
                    "message": message,
                }
                for kind, status, reason, message in _NODE_CONDITIONS
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10247}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": version,
                "osImage": "",
                "containerRuntimeVersion": version,
                "kubeletVersion": version,
                "kubeProxyVersion": version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "phase": "Running",
        },
    }


def _template(labels: dict[str, str]) -> dict[str, Any]:
    container = {
        "name": "app",
        "image": "registry.local/podcost/app:1",
        "resources": {},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    return {
        "metadata": {"creationTimestamp": None, "labels": labels},
        "spec": {
            "containers": [container],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "dnsPolicy": "ClusterFirst",
            "securityContext": {},
            "schedulerName": "default-scheduler",
        },
    }


def _manager(name: str, api: str, time: str) -> list[dict[str, Any]]:
    return [
        {
            "manager": name,
            "operation": "Update",
            "apiVersion": api,
            "time": time,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:replicas": {}}},
        }
    ]


def served_deployment(
    index: int, *, namespace: str = "scale", replicas: int = 30, template_hash: str = "5b6d7f8c9"
) -> dict[str, Any]:
    """The ``index``-th opted-in Deployment of ``tests.bench.bench_scale`` (``d{index}``) as the
    API server serves it once rolled out: defaults filled in, two conditions."""
    name, created = f"d{index}", _time(600 + index)
    labels = {"app": name}
    return {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, f"{namespace}/deployment/{name}")),
            "resourceVersion": str(200000 + index),
            "generation": 1,
            "creationTimestamp": created,
            "labels": labels,
            "annotations": {
                "deployment.kubernetes.io/revision": "1",
                "podcost.dev/enabled": "true",
            },
            "managedFields": _manager("bench", "apps/v1", created),
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": _template(labels),
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
            },
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": 600,
        },
        "status": {
            "observedGeneration": 1,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "conditions": [
                {
                    "type": "Available",
                    "status": "True",
                    "lastUpdateTime": created,
                    "lastTransitionTime": created,
                    "reason": "MinimumReplicasAvailable",
                    "message": "Deployment has minimum availability.",
                },
                {
                    "type": "Progressing",
                    "status": "True",
                    "lastUpdateTime": created,
                    "lastTransitionTime": created,
                    "reason": "NewReplicaSetAvailable",
                    "message": f'ReplicaSet "{name}-{template_hash}" has successfully progressed.',
                },
            ],
        },
    }


def served_replicaset(
    index: int, *, namespace: str = "scale", replicas: int = 30, template_hash: str = "5b6d7f8c9"
) -> dict[str, Any]:
    """The ReplicaSet of :func:`served_deployment` ``index``, as the API server serves it."""
    deployment = served_deployment(index, namespace=namespace, replicas=replicas)
    owner, created = deployment["metadata"], _time(600 + index)
    name = f"{owner['name']}-{template_hash}"
    labels = {"app": owner["name"], "pod-template-hash": template_hash}
    return {
        "kind": "ReplicaSet",
        "apiVersion": "apps/v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, f"{namespace}/{name}")),
            "resourceVersion": str(300000 + index),
            "generation": 1,
            "creationTimestamp": created,
            "labels": labels,
            "annotations": {
                "deployment.kubernetes.io/desired-replicas": str(replicas),
                "deployment.kubernetes.io/max-replicas": str(replicas + (replicas + 3) // 4),
                "deployment.kubernetes.io/revision": "1",
                "podcost.dev/enabled": "true",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": owner["name"],
                    "uid": owner["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": _manager("kube-controller-manager", "apps/v1", created),
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": _template(labels),
        },
        "status": {
            "replicas": replicas,
            "fullyLabeledReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "observedGeneration": 1,
        },
    }


# --- edits of a served object, for the change filters' tests -----------------------------------


def edit(path: tuple[str | int, ...], value: object) -> Callable[[dict[str, Any]], None]:
    """An edit that sets the field at ``path`` (keys and list indices) of an object to ``value``."""

    def apply(obj: dict[str, Any]) -> None:
        node: Any = obj
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    return apply


def drop(path: tuple[str | int, ...]) -> Callable[[dict[str, Any]], None]:
    """An edit that removes the field at ``path`` of an object."""

    def apply(obj: dict[str, Any]) -> None:
        node: Any = obj
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]

    return apply
