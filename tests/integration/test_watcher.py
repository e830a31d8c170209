"""The watcher against the real control plane: an opted-in Deployment's changes become
debounced, versioned snapshots on the workloads topic; podcost's own cost writes do not; a
workload that did not opt in is never published."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import config
from tests.conftest import ControlPlane
from tests.support.kube import KubeTestCluster

from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherService, WatcherSettings, bootstrap
from podcost_bus import BusSettings, Consumer, MemoryBus
from podcost_contracts.messages import WorkloadSnapshotMessage, decode
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration


@pytest.fixture
async def running_watcher(
    control_plane: ControlPlane, kube: KubeTestCluster
) -> AsyncIterator[tuple[WatcherService, MemoryBus, str]]:
    namespace = await kube.create_namespace(f"watch-{uuid.uuid4().hex[:6]}")
    await kube.create_node(f"watch-node-{namespace}", zone="zone-a", labels={"watch": namespace})
    bus = MemoryBus()
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    async with api:
        watcher = bootstrap(
            ServiceSettings(cluster="test", http_port=0),
            BusSettings(),
            WatcherSettings(namespace=namespace, debounce_seconds=0.3, max_delay_seconds=2.0),
            kube=Kube(api),
            bus=bus,
        )
        await bus.start()
        task = asyncio.create_task(watcher.run())
        try:
            await kube.wait_for(_ready(watcher, task), "the watcher to sync", timeout=30)
            yield watcher, bus, namespace
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await bus.stop()
            await kube.delete_namespace(namespace)
            await kube.delete_nodes([f"watch-node-{namespace}"])


def _ready(watcher: WatcherService, task: asyncio.Task[None]):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        if task.done():
            task.result()
        return watcher.ready()

    return check


async def _next_snapshot(consumer: Consumer, timeout: float = 30) -> WorkloadSnapshotMessage:
    records = await consumer.poll(max_wait=timeout, max_records=1)
    assert records, f"no snapshot within {timeout}s"
    (record,) = records
    await consumer.commit([record])
    return decode(WorkloadSnapshotMessage, record.value, record.headers, key=record.key)


async def _no_snapshot(consumer: Consumer, wait: float) -> None:
    records = await consumer.poll(max_wait=wait)
    assert not records, f"unexpected snapshot(s): {[r.key for r in records]}"


async def test_an_opted_in_deployment_is_published_once_per_burst_with_growing_versions(
    running_watcher: tuple[WatcherService, MemoryBus, str], kube: KubeTestCluster
) -> None:
    watcher, bus, namespace = running_watcher
    async with bus.consumer([watcher.topics.workloads], group="t") as consumer:
        await kube.create_deployment(
            namespace, "web", 4, opt_in=True, node_selector={"watch": namespace}
        )
        pods = await kube.wait_ready(namespace, "web", 4)
        # Creation, scheduling and readiness of 4 pods is a burst: wait until it settled.
        latest = await _next_snapshot(consumer)
        while len([p for p in latest.snapshot.pods if p.ready]) < 4:
            latest = await _next_snapshot(consumer)
        assert latest.key == f"test/{namespace}/Deployment/web"
        assert {pod.name for pod in latest.snapshot.pods} == {pod.name for pod in pods}
        assert all(pod.node == f"watch-node-{namespace}" for pod in latest.snapshot.pods)
        assert f"watch-node-{namespace}" in latest.snapshot.nodes

        # podcost's own cost write is not a change worth a snapshot (no feedback loop) ...
        await watcher.kube.patch_deletion_cost(namespace, pods[0].name, 7)
        await _no_snapshot(consumer, wait=1.5)
        # ... but a cost someone else sets is.
        await kube.set_deletion_cost(namespace, pods[1].name, -3)
        by_hand = await _next_snapshot(consumer)
        assert by_hand.version > latest.version
        costs = {pod.name: pod.deletion_cost for pod in by_hand.snapshot.pods}
        assert costs[pods[0].name] == 7
        assert costs[pods[1].name] == -3


async def test_a_deployment_that_did_not_opt_in_is_never_published(
    running_watcher: tuple[WatcherService, MemoryBus, str], kube: KubeTestCluster
) -> None:
    watcher, bus, namespace = running_watcher
    async with bus.consumer([watcher.topics.workloads], group="t") as consumer:
        await kube.create_deployment(namespace, "quiet", 2, node_selector={"watch": namespace})
        await kube.wait_ready(namespace, "quiet", 2)
        await _no_snapshot(consumer, wait=1.5)
    published = watcher.metrics.registry.get_sample_value("podcost_snapshots_published_total")
    assert published == 0
