"""Pods as the API server serves a Deployment's pods that kwok runs: every field of a real pod
(the service-account volume, default tolerations, managedFields of the controller manager, kwok
and podcost, the four conditions, container statuses), for measuring and checking what the
informer keeps of them (``podcost_core.convert.project_pod``).

The shape is that of a ``kubectl get pod -o json --show-managed-fields`` of a kube-apiserver
1.3x with kwok; values vary per pod (name, uid, version, volume suffix, IPs, times) as they do
in a cluster, and repeat within a ReplicaSet (labels, owner, requests) as they do there.
"""

from __future__ import annotations

import uuid
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
