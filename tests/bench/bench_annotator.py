"""Benchmark of the annotator against the real API server: writes per second within the QPS
budget and without one, and PATCH requests against the minimum when decisions supersede each
other.

A script, not a test (``uv run python -m tests.bench.bench_annotator [--pods N]``). It uses the
cluster of ``$KUBECONFIG`` when ``PODCOST_USE_KUBECONFIG=1``, else starts its own control plane
in a temporary directory (``podcost_localinfra``). Desired costs travel over the in-memory bus
(the API server is the bottleneck, not the bus). It creates one namespace with an N-replica
Deployment on kwok nodes, then prints:

- with the default budget (20 requests/s, burst 40, 8 in flight): writes/s and requests/s
  (each write is a read and a compare-and-swap PATCH, so writes/s is about half the QPS);
- with no budget to speak of, at 8 and 32 requests in flight: the writes/s the annotator and
  this API server reach;
- five decisions in a burst for the same pods, each superseding the last, with only some pods
  changing in the final one: PATCH requests sent against the minimum (the pods whose final
  cost differs from what they carry), and p50/p99 from publishing to each pod's PATCH.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import config
from tests.bench.record import record
from tests.support.costs import CountingPods, Desire, desired, publish_costs
from tests.support.kube import KubeTestCluster, PodView

from podcost.annotator import AnnotatorService, AnnotatorSettings, bootstrap
from podcost.annotator.plan import Scope
from podcost.annotator.view import InformerView
from podcost.runtime.settings import ServiceSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_kube.client import Kube
from podcost_localinfra import cluster

BUS = BusSettings()


class Stopwatch(CountingPods):
    """Counts PATCH requests and notes when each pod's PATCH returned."""

    def __init__(self, inner: Kube) -> None:
        super().__init__(inner)
        self.written_at: dict[str, float] = {}

    async def patch_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, cost: int, *, seen: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        result = await super().patch_deletion_cost_if_unchanged(namespace, pod, cost, seen=seen)
        self.written_at[pod] = time.perf_counter()
        return result


def _true(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return condition()

    return check


async def run_until_committed(
    bus: MemoryBus, pods: CountingPods, config_: AnnotatorSettings, records: int
) -> tuple[AnnotatorService, float]:
    """Start an annotator, wait until ``records`` records are committed; seconds it took."""
    assert isinstance(pods.inner, Kube)
    view = InformerView(pods.inner, Scope())  # what it verifies decisions against
    service = bootstrap(ServiceSettings(http_port=0), BUS, config_, bus=bus, kube=pods, view=view)
    started = time.perf_counter()
    task = asyncio.create_task(service.run())
    try:
        while sum(service.committed.values()) < records:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        return service, time.perf_counter() - started
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def write_all(
    kube: Kube, namespace: str, app: str, pods: list[PodView], cost: int, **options: Any
) -> tuple[float, int, int]:
    """Give every pod ``cost``; (seconds, PATCH requests, all requests)."""
    bus = MemoryBus()
    group = f"bench-{uuid.uuid4().hex[:6]}"
    message = desired(namespace, app, [Desire(p.name, p.uid, cost) for p in pods])
    await publish_costs(bus, BUS.topics.costs_for("local"), message)
    counting = CountingPods(kube)
    _, seconds = await run_until_committed(
        bus, counting, AnnotatorSettings(group=group, **options), 1
    )
    return seconds, counting.total, counting.total + sum(counting.reads.values())


async def bench(kubeconfig: str, replicas: int) -> None:
    api = await config.new_client_from_config(config_file=kubeconfig)
    async with api:
        helpers = KubeTestCluster(api)
        kube = Kube(api)
        run = uuid.uuid4().hex[:6]
        namespace = await helpers.create_namespace(f"bench-annotator-{run}")
        nodes = [f"bench-annotator-{run}-{i}" for i in range(max(1, replicas // 100))]
        label = {"bench-annotator": run}
        try:
            await asyncio.gather(*(helpers.create_node(n, labels=label, pods="200") for n in nodes))
            app = "web"
            await helpers.create_deployment(
                namespace, app, replicas, opt_in=True, node_selector=label
            )
            pods: list[PodView] = []

            async def created() -> bool:
                nonlocal pods
                pods = await helpers.active_pods(namespace, app)
                return len(pods) == replicas

            await helpers.wait_for(created, f"{replicas} pods", timeout=300, interval=0.5)
            print(f"{replicas} pods of {namespace}/{app}")

            budget = pods[: min(len(pods), 200)]
            seconds, patches, requests = await write_all(kube, namespace, app, budget, 1)
            figures = [
                f"default budget: {patches / seconds:.1f} writes/s "
                f"({requests / seconds:.1f} requests/s: a read and a conditional patch each)"
            ]
            print(
                f"default budget (20 QPS, burst 40, 8 in flight): {patches} writes in "
                f"{seconds:.2f}s = {patches / seconds:.1f} writes/s, {requests / seconds:.1f} "
                "requests/s"
            )
            for in_flight, cost in ((8, 2), (32, 3)):
                seconds, patches, requests = await write_all(
                    kube, namespace, app, pods, cost, qps=10_000, burst=10_000,
                    max_in_flight=in_flight,
                )  # fmt: skip
                print(
                    f"no budget, {in_flight} in flight: {patches} writes in {seconds:.2f}s = "
                    f"{patches / seconds:.0f} writes/s ({requests / seconds:.0f} requests/s)"
                )
                figures.append(
                    f"no budget, {in_flight} in flight: {patches / seconds:.0f} writes/s"
                )
            figures += await superseded_burst(kube, namespace, app, pods)
            record(
                "bench_annotator",
                f"the annotator writing decided costs to {replicas} pods on the real API server",
                figures,
            )
        finally:
            await helpers.delete_namespace(namespace)
            await helpers.delete_nodes(nodes)


async def superseded_burst(kube: Kube, namespace: str, app: str, pods: list[PodView]) -> list[str]:
    """Five versions published at once to a running annotator; only the last counts. Every pod
    carries 3 now; the last version changes one pod in ten. Returns the headline figures."""
    rng = random.Random(7)
    bus = MemoryBus()
    changed = set(rng.sample(range(len(pods)), k=len(pods) // 10))
    versions = [
        [Desire(p.name, p.uid, rng.randint(4, 99), previous=3) for p in pods] for _ in range(4)
    ]
    versions.append(
        [Desire(p.name, p.uid, 100 + i if i in changed else 3, previous=3)
         for i, p in enumerate(pods)]
    )  # fmt: skip
    counting = Stopwatch(kube)
    options = AnnotatorSettings(group=f"bench-{uuid.uuid4().hex[:6]}", qps=10_000, burst=10_000)
    service = bootstrap(
        ServiceSettings(http_port=0), BUS, options, bus=bus, kube=counting,
        view=InformerView(kube, Scope(namespaces=(namespace,))),
    )  # fmt: skip
    task = asyncio.create_task(service.run())
    try:
        await KubeTestCluster.wait_for(_true(service.ready), "the annotator to start", 30, 0.005)
        published = time.perf_counter()
        for version, costs in enumerate(versions, 1):  # no await yields: one poll takes all five
            await publish_costs(
                bus, BUS.topics.costs_for("local"), desired(namespace, app, costs, version=version)
            )
        await KubeTestCluster.wait_for(
            _true(lambda: sum(service.committed.values()) == len(versions)),
            "the five records committed", 60, 0.005,
        )  # fmt: skip
        seconds = time.perf_counter() - published
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    latencies = sorted(at - published for at in counting.written_at.values())
    figures = [f"PATCH requests / minimum = {counting.total / len(changed):.2f}"]
    print(
        f"5 superseding decisions for {len(pods)} pods, {len(changed)} changed in the last: "
        f"{counting.total} PATCH requests, minimum {len(changed)}, ratio "
        f"{counting.total / len(changed):.2f}; all committed {seconds * 1000:.0f} ms after "
        "publishing"
    )
    if latencies:
        p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
        print(f"publish → PATCH: p50 {statistics.median(latencies) * 1000:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms (no budget; {len(latencies)} PATCHes)")  # fmt: skip
        figures.append(
            f"publish → PATCH p50 {statistics.median(latencies) * 1000:.0f} ms, "
            f"p99 {p99 * 1000:.0f} ms"
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500, help="replicas of the Deployment")
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
