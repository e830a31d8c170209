"""Memory per pod of the informer's store, without a cluster.

A script, not a test (``uv run python -m tests.bench.bench_store_memory [--pods N]``). It
serialises N pods as the API server serves a Deployment's pods that kwok runs
(``tests.support.served``: managedFields, volumes, conditions and all; a third of them with a
cost podcost wrote), then, for each way of keeping them, parses each one with ``orjson`` as the
informer does, keeps it, and puts it in a ``Store``; ``tracemalloc`` counts the bytes the store
holds then, per pod:

- ``as served``: the JSON as parsed;
- ``slim``: without the managedFields podcost does not read (``slim_managed_fields``), what the
  informer kept before ``project_pod``;
- ``projected``: ``slim`` then ``project_pod`` without sharing parts, interning strings only;
- ``projected, shared``: ``slim`` then ``project_pod`` with one ``SharedParts`` for all the pods,
  what the informer keeps now;
- ``Pod only``: no raw dict at all, only the converted ``Pod`` and its requests per pod (as the
  watcher's ``PodCache`` holds them), for comparison: what dropping the raw store would leave.

The ``PodCache`` of a running watcher comes on top of the store; its figure follows.

The last lines are the objects around the pods, per pod, at ``tests.bench.bench_scale``'s ratios
(a node per ``--pods-per-node`` pods, a Deployment and its ReplicaSet per ``--replicas`` pods;
``tests.support.served``): ``slim`` as the informer kept them before, ``projected`` as it keeps
them now (``project_node``, ``project_workload``, with one ``SharedParts`` for all of them).
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson
from tests.support.served import (
    served_deployment,
    served_node,
    served_pod,
    served_replicaset,
)

from podcost_core.projection import (
    SharedParts,
    project_node,
    project_pod,
    project_workload,
    slim_managed_fields,
)
from podcost_core.tomodel import pod_from_json
from podcost_kube.podcache import PodCache
from podcost_kube.store import ChangeType, Store


def served(pods: int, replicasets: int) -> list[bytes]:
    """The pods as JSON lines, spread over ``replicasets`` Deployments."""
    return [
        orjson.dumps(
            served_pod(
                index,
                deployment=f"web{index % replicasets}",
                template_hash=f"{index % replicasets:05d}5b6d",
                cost=index % 7 if index % 3 == 0 else None,
            )
        )
        for index in range(pods)
    ]


def store_bytes(lines: list[bytes], keep: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """What a store of the pods kept with ``keep`` holds, in bytes (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = Store()
    for line in lines:
        store.apply("Pod", ChangeType.ADDED, keep(orjson.loads(line)))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del store
    return held


def pods_only_bytes(lines: list[bytes]) -> int:
    """What a ``PodCache`` holding only the converted pods (no raw dict kept) holds."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache = PodCache()
    for line in lines:
        raw = project_pod(slim_managed_fields(orjson.loads(line)))
        cache.convert(raw)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del cache
    return held


def objects_bytes(
    kinds: list[tuple[str, list[bytes]]], shared: SharedParts | None
) -> dict[str, int]:
    """What a store of the nodes and workloads holds, per kind, in bytes (tracemalloc): slim
    without ``shared``, projected with it (its remembered parts counted)."""
    held: dict[str, int] = {}
    for kind, lines in kinds:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        store = Store()
        parts = SharedParts() if shared is not None else None
        for line in lines:
            obj = slim_managed_fields(orjson.loads(line))
            if parts is not None:
                obj = project_node(obj, parts) if kind == "Node" else project_workload(obj, parts)
            store.apply(kind, ChangeType.ADDED, obj)
        gc.collect()
        held[kind] = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del store, parts
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--replicasets", type=int, default=20, help="Deployments the pods are of")
    parser.add_argument("--pods-per-node", type=int, default=30, help="for the nodes' lines")
    parser.add_argument("--replicas", type=int, default=30, help="for the workloads' lines")
    args = parser.parse_args()
    lines = served(args.pods, args.replicasets)
    pod_from_json(orjson.loads(lines[0]))  # build the validators before measuring
    average = sum(map(len, lines)) / len(lines)
    print(f"{args.pods} kwok-like pods of {args.replicasets} Deployments, "
          f"{average:,.0f} bytes of JSON each; bytes held per pod (tracemalloc):")  # fmt: skip
    ways: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
        ("as served", lambda obj: obj),
        ("slim (before)", slim_managed_fields),
        ("projected", lambda obj: project_pod(slim_managed_fields(obj))),
    ]
    shared = SharedParts()
    ways.append(("projected, shared", lambda obj: project_pod(slim_managed_fields(obj), shared)))
    for label, keep in ways:
        held = store_bytes(lines, keep)
        print(f"  store, {label:18s} {held / args.pods:10,.0f}")
    print(f"  ({len(shared)} distinct parts shared)")
    held = pods_only_bytes(lines)
    print(f"  PodCache, Pod per pod  {held / args.pods:10,.0f}  (on top of the store)")
    nodes = -(-args.pods // args.pods_per_node)
    workloads = -(-args.pods // args.replicas)
    kinds = [
        ("Node", [orjson.dumps(served_node(i, pods=args.pods_per_node)) for i in range(nodes)]),
        ("Deployment", [orjson.dumps(served_deployment(i)) for i in range(workloads)]),
        ("ReplicaSet", [orjson.dumps(served_replicaset(i)) for i in range(workloads)]),
    ]
    print(f"{nodes} nodes, {workloads} Deployments and their ReplicaSets; bytes per pod:")
    slim, projected = objects_bytes(kinds, None), objects_bytes(kinds, SharedParts())
    for kind, _ in kinds:
        print(f"  {kind:10s} slim {slim[kind] / args.pods:6,.0f}  "
              f"projected {projected[kind] / args.pods:6,.0f}")  # fmt: skip
    print(f"  all        slim {sum(slim.values()) / args.pods:6,.0f}  "
          f"projected {sum(projected.values()) / args.pods:6,.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
