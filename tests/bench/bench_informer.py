"""Benchmark of the watcher's Kubernetes side: list and watch throughput against the real API
server, raw JSON against client-library models, and the cost of the decisions per event.

A script, not a test (``uv run python -m tests.bench.bench_informer [--pods N]``). It uses the
cluster of ``$KUBECONFIG`` when ``PODCOST_USE_KUBECONFIG=1``, else starts its own control plane
in a temporary directory (``podcost_localinfra``). It creates one namespace with an N-replica
Deployment on kwok nodes, then prints:

- pods/s listed (pages of 500) three ways: raw (``_preload_content=False`` + ``json.loads``, what
  the informer does), typed (the generated ``list_namespaced_pod``), and typed then
  ``sanitize_for_serialization`` back to JSON (the other way to get raw JSON);
- the informer's initial sync time, and its watch throughput while every pod is patched;
- decode + store rate of watch lines: ``decode_event`` against kubernetes-asyncio's
  ``watch.Watch.unmarshal_event`` (which deserialises into ``V1Pod``);
- the bytes per pod the informer's store holds of these pods as the API server served them
  (``tracemalloc``), before ``project_pod`` and now (``tests/bench/bench_store_memory.py``
  measures the same without a cluster);
- ``touched_by`` per event, and one snapshot of the N-pod Deployment from the cache, without and
  with the watcher's pod conversion cache (``PodCache``) warm, as after a node change that
  re-publishes the workload.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from kubernetes_asyncio import client, config, watch
from tests.bench.bench_store_memory import store_bytes
from tests.support.kube import KubeTestCluster

from podcost_core.model import DELETION_COST_ANNOTATION, FIELD_MANAGER
from podcost_core.projection import SharedParts, project_pod, slim_managed_fields
from podcost_kube.client import Kube
from podcost_kube.informer import WORKLOAD_RESOURCES, Informer, decode_event
from podcost_kube.podcache import PodCache
from podcost_kube.snapshots import workload_objects, workload_snapshot
from podcost_kube.store import Change, ChangeType, Store
from podcost_kube.workloads import DEPLOYMENT, WorkloadKey, touched_by
from podcost_localinfra import cluster


async def timed(make: Callable[[], Awaitable[Any]], runs: int = 3) -> float:
    results = []
    for _ in range(runs):
        start = time.perf_counter()
        await make()
        results.append(time.perf_counter() - start)
    return min(results)


def timed_sync(work: Callable[[], Any], runs: int = 3) -> float:
    results = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        results.append(time.perf_counter() - start)
    return min(results)


async def pages(
    api: client.ApiClient, namespace: str, loads: Callable[[bytes], Any]
) -> AsyncIterator[dict[str, Any]]:
    """The pages of a raw JSON list of ``namespace``'s pods, each parsed with ``loads``."""
    token = ""
    while True:
        query = [("limit", "500")] + ([("continue", token)] if token else [])
        response = await api.call_api(
            f"/api/v1/namespaces/{namespace}/pods", "GET", query_params=query,
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
            _preload_content=False,
        )  # fmt: skip
        try:
            page = loads(await response.read())
        finally:
            response.release()
        yield page
        token = page["metadata"].get("continue") or ""
        if not token:
            return


async def list_raw(api: client.ApiClient, namespace: str) -> int:
    return sum([len(page["items"]) async for page in pages(api, namespace, json.loads)])


async def served_pods(api: client.ApiClient, namespace: str) -> list[bytes]:
    """Every pod of ``namespace`` as the API server serves it, one JSON document each."""
    return [
        orjson.dumps({"apiVersion": "v1", "kind": "Pod", **item})
        async for page in pages(api, namespace, orjson.loads)
        for item in page["items"]
    ]


async def list_typed(api: client.ApiClient, namespace: str, sanitize: bool) -> int:
    core = client.CoreV1Api(api)
    count, token = 0, None
    while True:
        page = await core.list_namespaced_pod(namespace, limit=500, _continue=token)
        if sanitize:
            count += len(api.sanitize_for_serialization(page)["items"])
        else:
            count += len(page.items)
        token = page.metadata._continue
        if not token:
            return count


async def setup(kube: KubeTestCluster, namespace: str, pods: int) -> list[str]:
    await kube.create_namespace(namespace)
    node_count = max(1, -(-pods // 100))
    nodes = [f"{namespace}-n{i}" for i in range(node_count)]
    await asyncio.gather(*(kube.create_node(n, zone=f"z{i % 3}", labels={"bench": namespace})
                           for i, n in enumerate(nodes)))  # fmt: skip
    await kube.create_deployment(
        namespace, "big", pods, opt_in=True, node_selector={"bench": namespace},
        pod_spec_extra={"containers": [{"name": "app", "image": "registry.local/podcost/app:1",
                                        "resources": {"requests": {"cpu": "10m"}}}]},
    )  # fmt: skip

    async def all_bound() -> bool:
        listed = await kube.core.list_namespaced_pod(namespace)
        return len(listed.items) == pods and all(p.spec.node_name for p in listed.items)

    await kube.wait_for(all_bound, f"{pods} bound pods", timeout=600, interval=1)
    return nodes


async def bench(kubeconfig: str, pods: int) -> None:
    api = await config.new_client_from_config(config_file=kubeconfig)
    async with api:
        kube = KubeTestCluster(api)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        nodes = await setup(kube, namespace, pods)
        print(f"setup: {pods} pods on {len(nodes)} nodes in {time.perf_counter() - started:.1f}s")
        try:
            await measure(api, kube, namespace, pods)
        finally:
            await kube.core.delete_namespace(namespace)
            await kube.delete_nodes(nodes)


async def measure(api: client.ApiClient, kube: KubeTestCluster, namespace: str, pods: int) -> None:
    print("\n== list pods (pages of 500), best of 3")
    for label, work in [
        ("raw JSON (informer)", lambda: list_raw(api, namespace)),
        ("typed models", lambda: list_typed(api, namespace, sanitize=False)),
        ("typed + sanitize", lambda: list_typed(api, namespace, sanitize=True)),
    ]:
        seconds = await timed(work)
        print(f"  {label:22s} {seconds * 1000:8.1f} ms  {pods / seconds:10,.0f} pods/s")

    print("\n== the store's bytes per pod (tracemalloc)")
    served = await served_pods(api, namespace)
    print(f"  ({sum(map(len, served)) / len(served):,.0f} bytes of JSON per pod as served)")
    shared = SharedParts()
    for label, keep in [
        ("as served", lambda obj: obj),
        ("slim (before project_pod)", slim_managed_fields),
        ("projected, shared (now)", lambda obj: project_pod(slim_managed_fields(obj), shared)),
    ]:
        print(f"  {label:28s} {store_bytes(served, keep) / len(served):8,.0f}")

    print("\n== informer over pods, nodes, ReplicaSets, Deployments of the namespace")
    seen: list[Change] = []
    modified = asyncio.Event()
    informer = Informer(Kube(api), WORKLOAD_RESOURCES, namespace=namespace)
    informer.add_handler(seen.append)
    start = time.perf_counter()
    async with informer:
        await informer.wait_synced()
        sync = time.perf_counter() - start
        print(f"  initial sync            {sync * 1000:8.1f} ms  "
              f"({informer.store.count('Pod')} pods)")  # fmt: skip
        names = [obj["metadata"]["name"] for obj in informer.store.objects("Pod", namespace)]
        seen.clear()

        patched: set[str] = set()

        def count(change: Change) -> None:
            if change.kind == "Pod" and change.type is ChangeType.MODIFIED:
                patched.add(change.key.name)
                if len(patched) == len(names):
                    modified.set()

        informer.add_handler(count)
        core = client.CoreV1Api(api)
        limit = asyncio.Semaphore(64)

        async def patch(name: str) -> None:
            async with limit:
                await core.patch_namespaced_pod(
                    name, namespace, {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "1"}}},
                    field_manager=FIELD_MANAGER,
                )  # fmt: skip

        start = time.perf_counter()
        await asyncio.gather(*(patch(name) for name in names))
        written = time.perf_counter() - start
        await modified.wait()
        observed = time.perf_counter() - start
        print(f"  {len(names)} PATCHes (64 in flight) written in {written:.2f}s "
              f"({len(names) / written:,.0f}/s); all seen by the watch after {observed:.2f}s "
              f"(lag after the last write {1000 * (observed - written):.0f} ms)")  # fmt: skip
        own_writes = [c for c in seen if c.kind == "Pod"]
        store = informer.store

    print("\n== per watch event (CPU only), best of 5")
    # The pods as served (the store keeps only a projection of them, which no client decodes).
    lines = [b'{"type":"MODIFIED","object":' + pod + b"}" for pod in served]
    print(f"  (watch lines of {sum(map(len, lines)) / len(lines):,.0f} bytes on average)")

    def decode_ours() -> None:
        scratch = Store()
        for line in lines:
            event = decode_event(line)
            scratch.apply("Pod", ChangeType(event.type), event.obj)

    async with watch.Watch() as kube_watch:

        def decode_theirs() -> None:
            for line in lines:
                kube_watch.unmarshal_event(line, "V1Pod")

        decoders = [("decode_event + Store.apply", decode_ours),
                    ("watch.Watch.unmarshal_event", decode_theirs)]  # fmt: skip
        for label, decode in decoders:
            seconds = timed_sync(decode, runs=5)
            print(f"  {label:30s} {len(lines) / seconds:10,.0f} events/s")

    relabelled = []
    for change in own_writes:
        assert change.new is not None
        new = copy.deepcopy(change.new)
        new["metadata"].setdefault("labels", {})["extra"] = "x"
        relabelled.append(Change("Pod", ChangeType.MODIFIED, change.new, new))

    def status_changes(edit: Callable[[dict[str, Any]], None]) -> list[Change]:
        changes = []
        for change in own_writes:
            assert change.new is not None
            new = copy.deepcopy(change.new)
            edit(new["status"])
            changes.append(Change("Pod", ChangeType.MODIFIED, change.new, new))
        return changes

    def unready(status: dict[str, Any]) -> None:
        for condition in status.get("conditions", []):
            if condition["type"] == "Ready":
                condition["status"] = "False"

    cases = {
        "touched_by, own cost write": own_writes,
        "touched_by, label change": relabelled,
        "touched_by, pod IP change": status_changes(lambda st: st.update(podIP="10.9.9.9")),
        "touched_by, pod turns unready": status_changes(unready),
    }
    for label, changes in cases.items():

        def touch_all(changes: list[Change] = changes) -> None:
            for change in changes:
                touched_by(change, store)

        seconds = timed_sync(touch_all, runs=5)
        print(f"  {label:30s} {len(changes) / seconds:10,.0f} events/s")

    print("\n== snapshot of the whole Deployment from the cache, best of 3")
    key = WorkloadKey(namespace, DEPLOYMENT, "big")
    seconds = timed_sync(lambda: workload_snapshot(store, key, version=1, taken_at=time.time()))
    gather = timed_sync(lambda: workload_objects(store, key))
    snapshot = workload_snapshot(store, key)
    print(f"  {len(snapshot.pods)} pods on {len(snapshot.nodes)} nodes: {seconds * 1000:.1f} ms "
          f"(of which gathering the objects from the cache {gather * 1000:.1f} ms; the rest is "
          f"podcost_core.snapshots)")  # fmt: skip
    pods = PodCache()
    cold = timed_sync(lambda: workload_snapshot(store, key, pods=PodCache()))
    assert workload_snapshot(store, key, pods=pods) == snapshot  # warms the cache
    # A node change: the workload is published again, none of its pods changed.
    warm = timed_sync(lambda: workload_snapshot(store, key, pods=pods))
    print(f"  with the pod conversion cache: cold {cold * 1000:.1f} ms, warm {warm * 1000:.1f} ms "
          f"({seconds / warm:.1f}x; {len(pods)} pods cached, {pods.misses} conversions "
          f"for {pods.hits + pods.misses} lookups)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=2000)
    args = parser.parse_args()
    if os.environ.get("PODCOST_USE_KUBECONFIG") == "1" and os.environ.get("KUBECONFIG"):
        asyncio.run(bench(os.environ["KUBECONFIG"], args.pods))
        return
    with tempfile.TemporaryDirectory(prefix="podcost-bench-") as run_dir:
        control_plane = cluster.start(Path(run_dir))
        try:
            asyncio.run(bench(str(control_plane.kubeconfig), args.pods))
        finally:
            control_plane.stop()


if __name__ == "__main__":
    main()
