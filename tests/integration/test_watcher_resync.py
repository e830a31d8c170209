"""The watcher's periodic resync, on the real control plane and the real Kafka broker: a pod
whose cost went wrong without a change the watcher reacts to (podcost's own field manager wrote
it: a write that ended as an error or a refusal and was committed, a cost set by a run that was
rolled back) is published again within ``PODCOST_WATCHER_RESYNC_SECONDS`` (plus its jitter), so
the pipeline decides and writes its workload again; without the resync it stays wrong until the
workload changes.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import Reader, fresh_kafka_settings

from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings, bootstrap
from podcost_bus import KafkaBus
from podcost_contracts.messages import WorkloadSnapshotMessage
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

RESYNC_S = 2.0


async def test_a_cost_gone_wrong_without_a_change_is_published_again_by_the_resync(
    kafka_bootstrap: str, kube: KubeTestCluster
) -> None:
    settings = fresh_kafka_settings(kafka_bootstrap, "resync")
    namespace = await kube.create_namespace(f"resync-{uuid.uuid4().hex[:6]}")
    node = f"resync-{namespace}"
    await kube.create_node(node, zone="zone-a", labels={"resync": namespace})
    config = WatcherSettings(namespace=namespace, debounce_seconds=0.2, resync_seconds=RESYNC_S)
    try:
        await kube.create_deployment(namespace, "web", 2, opt_in=True,
                                     node_selector={"resync": namespace})  # fmt: skip
        pods = await kube.wait_ready(namespace, "web", 2)
        async with KafkaBus(settings) as bus:
            await bus.ensure_topics([settings.topics.workloads, settings.topics.deadletter])
            async with Reader(bus, settings.topics.workloads, WorkloadSnapshotMessage) as read:
                watcher = bootstrap(ServiceSettings(cluster="test", http_port=0), settings,
                                    config, kube=Kube(kube.api), bus=bus)  # fmt: skip
                task = asyncio.create_task(watcher.run(), name="watcher-under-test")
                try:
                    (first,) = await read.take(1, timeout=60)
                    assert all(pod.deletion_cost != 7 for pod in first.snapshot.pods)
                    # podcost's own write: no change the watcher reacts to (no feedback loop).
                    await Kube(kube.api).patch_deletion_cost(namespace, pods[0].name, 7)
                    deadline = asyncio.get_running_loop().time() + 4 * RESYNC_S + 10
                    while True:  # a snapshot of the first pass's burst may come first
                        left = deadline - asyncio.get_running_loop().time()
                        (again,) = await read.take(1, timeout=max(0.1, left))
                        by_name = {pod.name: pod.deletion_cost for pod in again.snapshot.pods}
                        if by_name[pods[0].name] == 7:
                            break
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        assert again.key == first.key
        assert again.version > first.version
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])
