"""Memory per pod of the informer's store (issue 14), without a cluster.

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

The ``PodCache`` of a running watcher comes on top of the store; its figure is the last line.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson
from tests.support.served import served_pod

from podcost_core.convert import SharedParts, pod_from_json, project_pod, slim_managed_fields
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--replicasets", type=int, default=20, help="Deployments the pods are of")
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


if __name__ == "__main__":
    main()
