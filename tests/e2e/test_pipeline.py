"""The whole pipeline against the real control plane, in embedded mode (one process, in-memory
bus) and in Kafka mode (the same services over the real broker).

podcost runs (watcher → rankers → aggregator → annotator) while a Deployment is churned and
scaled in by the real kube-controller-manager:
- an uneven 12-replica Deployment over 3 zones, scaled in step by step to 3: with podcost the zone
  skew never grows and is the least possible after every step; the same scenario without podcost
  shows what Kubernetes does by itself (never better, and reported);
- spot and on-demand nodes: scale-in removes the spot pods first;
- the costs on the pods are the aggregator's latest decisions, and the annotator wrote no more
  PATCHes than the decisions' changed costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio import config
from tests.conftest import ControlPlane
from tests.support.kube import KubeTestCluster

from podcost.embedded import Pipeline, bootstrap
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_contracts.messages import DesiredCostsMessage, decode_costs_record
from podcost_core.policy import DEFAULT_POLICY, policy_from_annotations
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube

pytestmark = pytest.mark.e2e

ZONES = ("zone-a", "zone-b", "zone-c")


@dataclass
class Running:
    """A running pipeline and how to reach the cluster it steers."""

    pipeline: Pipeline
    kube: Kube
    namespace: str
    bus_settings: BusSettings


@pytest.fixture(params=["embedded", "kafka"])
async def podcost(
    request: pytest.FixtureRequest, control_plane: ControlPlane, kube: KubeTestCluster
) -> AsyncIterator[Running]:
    namespace = await kube.create_namespace(f"e2e-{uuid.uuid4().hex[:6]}")
    if request.param == "kafka":
        bootstrap_servers = request.getfixturevalue("kafka_bootstrap")
        suffix = namespace
        bus_settings = BusSettings(
            bootstrap_servers=bootstrap_servers,
            topic_workloads=f"w-{suffix}", topic_ranks=f"r-{suffix}",
            topic_costs=f"c-{suffix}", topic_deadletter=f"d-{suffix}",
        )  # fmt: skip
    else:
        bus_settings = BusSettings()
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    async with api:
        client = Kube(api)
        pipeline = bootstrap(
            ServiceSettings(cluster="e2e", http_port=0),
            bus_settings,
            kube=client,
            bus=None if request.param == "kafka" else MemoryBus(),
            watcher_settings=WatcherSettings(
                namespace=namespace, debounce_seconds=0.2, max_delay_seconds=1.0
            ),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(serve(pipeline.services, ServiceSettings(http_port=0),
                                         bus=pipeline.bus, stop=stop))  # fmt: skip

        async def ready() -> bool:
            if task.done():
                task.result()
            return all(service.ready() for service in pipeline.services)

        try:
            await kube.wait_for(ready, "every service ready", timeout=60)
            yield Running(pipeline, client, namespace, bus_settings)
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
            await kube.delete_namespace(namespace)


async def _nodes(kube: KubeTestCluster, prefix: str, spot: bool = False) -> dict[str, str]:
    """Two nodes per zone (the second spot when ``spot``); returns node → zone."""
    nodes = {}
    for zone in ZONES:
        for index in range(2):
            name = f"{prefix}-{zone}-{index}"
            capacity = "spot" if spot and index == 1 else "on-demand"
            await kube.create_node(name, zone=zone, capacity_type=capacity, labels={"e2e": prefix})
            nodes[name] = zone
    return nodes


async def _uneven_deployment(kube: KubeTestCluster, namespace: str, prefix: str, *,
                             opt_in: bool) -> None:  # fmt: skip
    """12 replicas made uneven by churn: zone-c is cordoned while they start, then pods of
    zone-a are deleted and replaced once zone-c is back."""
    zone_c = [f"{prefix}-zone-c-{i}" for i in range(2)]
    for name in zone_c:
        await kube.core.patch_node(name, {"spec": {"unschedulable": True}})
    await kube.create_deployment(namespace, "web", 12, opt_in=opt_in, node_selector={"e2e": prefix})
    pods = await kube.wait_ready(namespace, "web", 12)
    for name in zone_c:
        await kube.core.patch_node(name, {"spec": {"unschedulable": False}})
    in_zone_a = [pod for pod in pods if pod.node and "zone-a" in pod.node][:2]
    for pod in in_zone_a:
        await kube.core.delete_namespaced_pod(pod.name, namespace, grace_period_seconds=0)
    await kube.wait_for(
        _settled(kube, namespace, {pod.name for pod in in_zone_a}), "churned pods replaced", 60
    )


def _settled(kube: KubeTestCluster, namespace: str, gone: set[str]) -> Any:
    async def check() -> bool:
        pods = await kube.pods(namespace, "web")
        names = {pod.name for pod in pods}
        return not (names & gone) and len(pods) == 12 and all(p.ready for p in pods)

    return check


async def _zones(kube: KubeTestCluster, namespace: str, nodes: dict[str, str]) -> dict[str, int]:
    counts = dict.fromkeys(ZONES, 0)
    for pod in await kube.active_pods(namespace, "web"):
        counts[nodes[pod.node]] += 1  # type: ignore[index]
    return counts


def _skew(counts: dict[str, int]) -> int:
    return max(counts.values()) - min(counts.values())


def _least_skew(counts: dict[str, int], deletions: int) -> int:
    left = sorted(counts.values())
    for _ in range(deletions):
        left[-1] -= 1
        left.sort()
    return left[-1] - left[0]


async def _converged(running: Running, timeout: float = 60) -> None:
    """Wait until podcost has nothing more to write for ``web``: every active pod carries the
    cost the current ranking and labelling give it (a pod without the annotation reads as 0,
    which podcost may leave it)."""
    deadline = time.monotonic() + timeout
    while True:
        objects = load_objects(await running.kube.dump(running.namespace))
        snapshot = snapshot_for_workload(objects, running.namespace, "web", "Deployment")
        active = [pod for pod in snapshot.pods if pod.active]
        policy = policy_from_annotations(snapshot.annotations, default=DEFAULT_POLICY)
        result = simulate(snapshot, len(active), time.time(), policy=policy)
        if not result.writes:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"podcost did not converge: still to write {result.writes}")
        await asyncio.sleep(0.25)


async def test_scale_in_step_by_step_keeps_the_zone_skew_least_with_podcost(
    podcost: Running, kube: KubeTestCluster
) -> None:
    prefix = f"z{uuid.uuid4().hex[:5]}"
    nodes = await _nodes(kube, prefix)
    namespace = podcost.namespace
    await _uneven_deployment(kube, namespace, prefix, opt_in=True)
    start = await _zones(kube, namespace, nodes)
    skews = [_skew(start)]
    deleted = 0
    for replicas in (10, 8, 6, 3):
        await _converged(podcost)
        before = len(await kube.active_pods(namespace, "web"))
        await kube.scale_and_observe(namespace, "web", replicas)
        deleted += before - replicas
        now = await _zones(kube, namespace, nodes)
        skews.append(_skew(now))
        assert skews[-1] == _least_skew(start, deleted), (start, now, skews)
        assert skews[-1] <= max(skews[-2], 1), skews

    # The same churn and scale-in without podcost: what Kubernetes does by itself.
    baseline_ns = await kube.create_namespace(f"{namespace}-k8s")
    try:
        await _uneven_deployment(kube, baseline_ns, prefix, opt_in=False)
        base_start = await _zones(kube, baseline_ns, nodes)
        base_skews = [_skew(base_start)]
        for replicas in (10, 8, 6, 3):
            await kube.scale_and_observe(baseline_ns, "web", replicas)
            base_skews.append(_skew(await _zones(kube, baseline_ns, nodes)))
        print(f"zone skew by step: podcost {skews}, Kubernetes alone {base_skews}")
        # podcost is never worse than Kubernetes alone, from an equally uneven start.
        if base_start == start:
            assert all(ours <= theirs for ours, theirs in zip(skews, base_skews, strict=True))
    finally:
        await kube.delete_namespace(baseline_ns)
        await kube.delete_nodes(list(nodes))


async def test_scale_in_removes_the_spot_pods_first(
    podcost: Running, kube: KubeTestCluster
) -> None:
    prefix = f"s{uuid.uuid4().hex[:5]}"
    nodes = await _nodes(kube, prefix, spot=True)
    namespace = podcost.namespace
    try:
        await kube.create_deployment(
            namespace, "web", 6, opt_in=True, one_per_node=True,
            node_selector={"e2e": prefix},
            annotations={"podcost.dev/strategies": "capacity-type"},
        )  # fmt: skip
        pods = await kube.wait_ready(namespace, "web", 6)
        spot = {pod.name for pod in pods if pod.node and pod.node.endswith("-1")}
        assert len(spot) == 3
        await _converged(podcost)
        deleted = await kube.scale_and_observe(namespace, "web", 3)
        assert deleted == spot
    finally:
        await kube.delete_nodes(list(nodes))


async def test_the_costs_on_the_pods_are_the_aggregators_latest_decisions(
    podcost: Running, kube: KubeTestCluster
) -> None:
    prefix = f"d{uuid.uuid4().hex[:5]}"
    nodes = await _nodes(kube, prefix)
    namespace = podcost.namespace
    pipeline = podcost.pipeline
    topics = podcost.bus_settings.topics
    try:
        async with pipeline.bus.consumer(
            [topics.costs_for("e2e")], group=f"e2e-{prefix}"
        ) as decisions:
            await kube.create_deployment(namespace, "web", 9, opt_in=True,
                                         node_selector={"e2e": prefix})  # fmt: skip
            await kube.wait_ready(namespace, "web", 9)
            await _converged(podcost)
            latest: dict[str, int] = {}
            writes = 0
            while records := await decisions.poll(max_wait=1.0):
                for record in records:
                    message = decode_costs_record(record.value, record.headers)
                    if not isinstance(message, DesiredCostsMessage):
                        continue  # a release of an earlier test's workload, gone since
                    for cost in message.costs:
                        latest[cost.name] = cost.cost
                        writes += cost.cost != cost.previous
        on_pods = {}
        for pod in await kube.active_pods(namespace, "web"):
            annotations = pod.raw.metadata.annotations or {}
            # No annotation reads as 0, a cost podcost may leave a pod without writing it.
            on_pods[pod.name] = int(
                annotations.get("controller.kubernetes.io/pod-deletion-cost", 0)
            )
        assert on_pods == {name: latest[name] for name in on_pods}
        registry = pipeline.annotator.metrics
        patched = registry.get_sample_value("podcost_patches_total", {"result": "ok"}) or 0
        assert 0 < patched <= writes
    finally:
        await kube.delete_nodes(list(nodes))
