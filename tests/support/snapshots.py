"""Workload snapshots for the message and bus tests, from one pod to a 10,000-pod Deployment.

``large_snapshot`` is as close to production as a fixture gets without a cluster: random pod
uids and name suffixes (the part gzip cannot squeeze), the two tolerations every pod receives by
default, requests, labels, a podcost-written cost, and nodes with the labels a cloud provider and
an autoscaler put on them. Seeded, so every run measures the same bytes.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import replace

from podcost_core.model import (
    DELETION_COST_ANNOTATION,
    CostOwner,
    Node,
    NodeName,
    Phase,
    Pod,
    PodUID,
    QoSClass,
    Resources,
    Snapshot,
    Taint,
    Toleration,
    WorkloadRef,
)

CLUSTER = "prod-eu-1"
CREATED = 1_714_564_800.0

_DEFAULT_TOLERATIONS = (
    Toleration("node.kubernetes.io/not-ready", "Exists", "", "NoExecute"),
    Toleration("node.kubernetes.io/unreachable", "Exists", "", "NoExecute"),
)


def _node(index: int) -> Node:
    name = f"ip-10-0-{index // 256}-{index % 256}.eu-west-1.compute.internal"
    return Node(
        name=NodeName(name),
        labels={
            "kubernetes.io/hostname": name,
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "m6i.2xlarge",
            "topology.kubernetes.io/region": "eu-west-1",
            "topology.kubernetes.io/zone": f"eu-west-1{'abc'[index % 3]}",
            "karpenter.sh/capacity-type": "spot" if index % 2 else "on-demand",
            "karpenter.sh/nodepool": "default",
        },
        taints=(Taint("example.com/batch", "PreferNoSchedule", "true"),) if index % 7 == 0 else (),
        allocatable=Resources(cpu_milli=7910, memory_bytes=32_000_000_000, pods=110),
        requested=Resources(cpu_milli=4000, memory_bytes=16_000_000_000, pods=40),
    )


def snapshot(
    name: str = "web",
    *,
    pods: int = 3,
    nodes: int = 3,
    version: int = 1,
    namespace: str = "shop",
    seed: int = 0,
) -> Snapshot:
    """A Deployment ``name`` with ``pods`` running pods spread over ``nodes`` nodes."""
    rng = random.Random(seed)
    node_list = [_node(index) for index in range(min(nodes, pods) or 1)]
    template_hash = "7d9f8c6b5"
    pod_list = []
    for index in range(pods):
        cost = index - pods // 2
        pod_list.append(
            Pod(
                uid=PodUID(str(uuid.UUID(int=rng.getrandbits(128)))),
                name=f"{name}-{template_hash}-{rng.getrandbits(25):05x}",
                namespace=namespace,
                node=node_list[index % len(node_list)].name,
                phase=Phase.RUNNING,
                ready=True,
                ready_since=CREATED + 60 + index,
                created=CREATED + index,
                replicaset=f"{name}-{template_hash}",
                owner_uid="0b6a1d1e-6c1f-4a57-9d38-2f5d0c0a7e11",
                restarts=index % 3,
                priority=1000,
                qos=QoSClass.BURSTABLE,
                tolerations=_DEFAULT_TOLERATIONS,
                requests=Resources(cpu_milli=250, memory_bytes=512 * 2**20, pods=1),
                labels={
                    "app": name,
                    "app.kubernetes.io/part-of": namespace,
                    "pod-template-hash": template_hash,
                },
                annotations={DELETION_COST_ANNOTATION: str(cost)},
                deletion_cost=cost,
                deletion_cost_raw=str(cost),
                cost_owner=CostOwner.PODCOST,
            )
        )
    return Snapshot(
        workload=WorkloadRef(CLUSTER, namespace, "Deployment", name, uid="f00d"),
        pods=tuple(pod_list),
        nodes={node.name: node for node in node_list},
        replicas=pods,
        annotations={"podcost.dev/enabled": "true"},
        version=version,
        taken_at=CREATED + 3600,
    )


def reshuffled(
    base: Snapshot, rng: random.Random, priorities: tuple[int, ...] = (0, 1000, 2000)
) -> Snapshot:
    """``base``'s pods (same uids) moved between its nodes, restarted, re-prioritised (one of
    ``priorities`` each) and carrying other current costs, drawn from ``rng``: another version
    of the same workload, on which every strategy's answer and the decision change."""
    pods_count = len(base.pods)
    nodes = sorted(base.nodes)
    costs = rng.sample(range(-pods_count, pods_count), pods_count)
    pods = tuple(
        replace(
            pod,
            node=NodeName(nodes[rng.randrange(len(nodes))]),
            restarts=rng.randrange(4),
            ready_since=base.taken_at - rng.randrange(600, 200_000),
            priority=rng.choice(priorities),
            qos=rng.choice((QoSClass.BURSTABLE, QoSClass.GUARANTEED, QoSClass.BEST_EFFORT)),
            annotations={DELETION_COST_ANNOTATION: str(cost)},
            deletion_cost=cost,
            deletion_cost_raw=str(cost),
        )
        for pod, cost in zip(base.pods, costs, strict=True)
    )
    return replace(base, pods=pods)


def large_snapshot(pods: int = 10_000, nodes: int = 500) -> Snapshot:
    """A 10,000-pod Deployment on 500 nodes (see the module docstring)."""
    return snapshot("checkout", pods=pods, nodes=nodes, version=7, seed=10_000)
