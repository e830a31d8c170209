"""Time to find one workload's snapshot objects in the informer's store, without a
cluster.

A script, not a test (``uv run python -m tests.bench.bench_workload_objects [--pods 10000,40000]``).
For each size it fills a ``Store`` as the watcher's informer does (kwok-like pods as served,
``tests.support.served``, slimmed and projected with shared parts) with ``--pods`` pods of
Deployments of ``--replicas`` pods each, all in one namespace, one ReplicaSet per Deployment,
``--pods-per-node`` pods per node (a Deployment's pods on consecutive nodes); then, for
``--sample`` Deployments spread over the namespace, it times, one right after the other:

- ``workload_objects`` as it was (``_workload_objects_by_scan``: every pod of the namespace,
  every selector on every pod's labels) and as it is (through the store's pod indexes), checking
  both give the same objects in the same order;
- ``workload_snapshot`` with each of them, through one warm ``PodCache`` (the steady state of the
  watcher: no pod converted again), i.e. what the watcher spends per emitted workload;
- ``workload_snapshot`` as it is and as it was before the watcher's cache kept each node's usage
  (``PodCache.node_usage``), the store indexed ReplicaSets by controller
  (``WorkloadIndexes.controlled_by``) and label sets by label
  (``WorkloadIndexes.pod_label_sets_with``): every pod on the snapshot's nodes summed again,
  every ReplicaSet of the namespace read, every label set of the namespace checked (the same
  snapshot, asserted).

It prints milliseconds per workload and the ratio, and the time to fill the store.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.support.served import served_pod

from podcost_core.projection import SharedParts, project_pod, slim_managed_fields
from podcost_core.snapshots import snapshot_for_workload
from podcost_kube import snapshots
from podcost_kube.podcache import PodCache
from podcost_kube.snapshots import (
    WorkloadIndexes,
    _workload_objects_by_scan,
    workload_objects,
    workload_snapshot,
)
from podcost_kube.store import ChangeType, RawObject, Store
from podcost_kube.workloads import DEPLOYMENT, REPLICASET, WorkloadKey

NAMESPACE = "bench"
DUMP = Path(__file__).parents[1] / "unit" / "data" / "shop-dump.json"


def template_hash(deployment: int) -> str:
    return f"{deployment:05d}5b6d"


def node_template() -> RawObject:
    items = json.loads(DUMP.read_text(encoding="utf-8"))["items"]
    node: RawObject = next(item for item in items if item["kind"] == "Node")
    return node


def workload_pair(deployment: int) -> tuple[RawObject, RawObject]:
    """Deployment ``d<deployment>`` and its ReplicaSet, with the uid ``served_pod`` gives it."""
    name = f"d{deployment}"
    replicaset = f"{name}-{template_hash(deployment)}"
    uid = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{NAMESPACE}/{name}"))
    labels = {"app": name}
    rs_labels = {**labels, "pod-template-hash": template_hash(deployment)}
    dep = {
        "kind": DEPLOYMENT,
        "apiVersion": "apps/v1",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid,
            "resourceVersion": "1",
            "annotations": {"podcost.dev/enabled": "true"},
        },
        "spec": {"selector": {"matchLabels": labels}},
    }
    rs = {
        "kind": REPLICASET,
        "apiVersion": "apps/v1",
        "metadata": {
            "name": replicaset,
            "namespace": NAMESPACE,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, f"{NAMESPACE}/{replicaset}")),
            "resourceVersion": "1",
            "labels": rs_labels,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": DEPLOYMENT,
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"selector": {"matchLabels": rs_labels}},
    }
    return dep, rs


def fill(pods: int, replicas: int, pods_per_node: int) -> tuple[Store, list[WorkloadKey], float]:
    """The store, its Deployments' keys, and the seconds the pods took to apply."""
    deployments = -(-pods // replicas)
    nodes = -(-pods // pods_per_node)
    store = Store()
    template = node_template()
    for index in range(nodes):
        node = copy.deepcopy(template)
        node["metadata"]["name"] = f"kwok-node-{index}"
        # As the API serves a node: its own uid and a resourceVersion (the watcher's cache
        # converts a node once per version; without one, every snapshot converted it again).
        node["metadata"]["uid"] = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"kwok-node-{index}"))
        node["metadata"]["resourceVersion"] = "1"
        store.apply("Node", ChangeType.ADDED, node)
    keys = []
    for deployment in range(deployments):
        dep, rs = workload_pair(deployment)
        store.apply(DEPLOYMENT, ChangeType.ADDED, dep)
        store.apply(REPLICASET, ChangeType.ADDED, rs)
        keys.append(WorkloadKey(NAMESPACE, DEPLOYMENT, dep["metadata"]["name"]))
    shared = SharedParts()
    kept = []
    for index in range(pods):
        deployment = index // replicas
        served = served_pod(
            index,
            namespace=NAMESPACE,
            deployment=f"d{deployment}",
            template_hash=template_hash(deployment),
            nodes=nodes,
            cost=index % 7 if index % 3 == 0 else None,
        )
        kept.append(project_pod(slim_managed_fields(served), shared))
    start = time.perf_counter()
    for pod in kept:
        store.apply("Pod", ChangeType.ADDED, pod)
    return store, keys, time.perf_counter() - start


def ordered(objects: Any) -> tuple[Any, ...]:
    return tuple(
        list(part.items())
        for part in (objects.pods, objects.nodes, objects.replicasets, objects.deployments)
    )


def timed(work: Callable[[], Any]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def bench(pods: int, replicas: int, pods_per_node: int, sample: int) -> None:
    store, keys, filled = fill(pods, replicas, pods_per_node)
    step = max(1, len(keys) // sample)
    chosen = keys[::step][:sample]
    print(f"\n{pods:,} pods of {len(keys):,} Deployments in one namespace, "
          f"{store.count('Node'):,} nodes; store filled in {filled:.2f} s "
          f"({filled / pods * 1e6:.1f} µs per pod); {len(chosen)} Deployments timed")  # fmt: skip
    for key in chosen:  # same answer, same order
        assert ordered(workload_objects(store, key)) == ordered(
            _workload_objects_by_scan(store, key)
        ), key
    cache = PodCache()
    for key in chosen:  # warm the cache: the steady state
        workload_snapshot(store, key, pods=cache)

    def snapshot_by_scan(key: WorkloadKey) -> Any:
        indexed = snapshots.workload_objects
        snapshots.workload_objects = _workload_objects_by_scan  # what workload_snapshot calls
        try:
            return workload_snapshot(store, key, pods=cache)
        finally:
            snapshots.workload_objects = indexed

    def snapshot_before(key: WorkloadKey) -> Any:
        """``workload_snapshot`` without the node usage kept, the ReplicaSets' index and the
        label sets looked up by a label their selectors require."""
        indexed, pairs = WorkloadIndexes.controlled_by, snapshots._required_pairs
        WorkloadIndexes.controlled_by = lambda *args: None  # type: ignore[assignment,method-assign]
        snapshots._required_pairs = lambda selectors: None
        try:
            objects = workload_objects(store, key)
        finally:
            WorkloadIndexes.controlled_by = indexed  # type: ignore[method-assign]
            snapshots._required_pairs = pairs
        snapshot = snapshot_for_workload(
            objects, key.namespace, key.name, key.kind, convert_pod=cache.convert,
            requests_of=cache.requests, convert_node=cache.node,
        )  # fmt: skip
        return replace(snapshot, version=0, taken_at=0.0)

    for key in chosen:
        assert snapshot_before(key) == workload_snapshot(store, key, pods=cache), key

    totals = {"objects scan": 0.0, "objects indexed": 0.0, "snapshot scan": 0.0,
              "snapshot indexed": 0.0, "snapshot before": 0.0}  # fmt: skip
    for key in chosen:  # one right after the other, workload by workload
        totals["objects scan"] += timed(lambda: _workload_objects_by_scan(store, key))  # noqa: B023
        totals["objects indexed"] += timed(lambda: workload_objects(store, key))  # noqa: B023
        totals["snapshot scan"] += timed(lambda: snapshot_by_scan(key))  # noqa: B023
        totals["snapshot indexed"] += timed(
            lambda: workload_snapshot(store, key, pods=cache)  # noqa: B023
        )
        totals["snapshot before"] += timed(lambda: snapshot_before(key))  # noqa: B023
    per = {name: total / len(chosen) * 1000 for name, total in totals.items()}
    for what in ("objects", "snapshot"):
        before, after = per[f"{what} scan"], per[f"{what} indexed"]
        rates = f"{1000 / before:8.1f} → {1000 / after:8.1f} workloads/s"
        print(f"  workload_{what:8s} scan {before:8.3f} ms  indexed {after:7.3f} ms  "
              f"x{before / after:6.1f}  ({rates})")  # fmt: skip
    before, after = per["snapshot before"], per["snapshot indexed"]
    print(f"  workload_snapshot before the node usage kept, the ReplicaSet index and the label "
          f"lookup {before:7.3f} ms, now {after:7.3f} ms  x{before / after:5.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=lambda s: [int(p) for p in s.split(",")],
                        default=[10_000, 40_000])  # fmt: skip
    parser.add_argument("--replicas", type=int, default=30, help="pods per Deployment")
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--sample", type=int, default=50, help="Deployments timed per size")
    args = parser.parse_args()
    for pods in args.pods:
        bench(pods, args.replicas, args.pods_per_node, args.sample)


if __name__ == "__main__":
    main()
