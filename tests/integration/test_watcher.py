"""The watcher against the real control plane: an opted-in Deployment's changes become
debounced, versioned snapshots on the workloads topic, stamped with when the change was seen;
podcost's own cost writes do not; a workload that did not opt in is never published; one that
opts out or is deleted is said to be gone; and a pod carrying an invalid deletion cost (written
into etcd: the API server refuses one today) is reported and gets a valid cost from the whole
pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kubernetes_asyncio import config
from tests.conftest import ControlPlane
from tests.support.etcd import etcd_endpoint, put_pod
from tests.support.kube import COST_ANNOTATION, KubeTestCluster

from podcost import embedded
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherService, WatcherSettings, bootstrap
from podcost_bus import BusError, BusSettings, Consumer, MemoryBus, Record, open_bus
from podcost_contracts.messages import (
    WorkloadGoneMessage,
    WorkloadSnapshotMessage,
    decode,
    decode_workload_record,
    is_live_set,
)
from podcost_core.victims import deletion_cost_error
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


async def _next_record(consumer: Consumer, timeout: float) -> Record:
    """The next record that is not a live set (the watcher publishes one after each sync)."""
    while True:
        records = await consumer.poll(max_wait=timeout, max_records=1)
        assert records, f"no snapshot within {timeout}s"
        (record,) = records
        await consumer.commit([record])
        if not is_live_set(record.key):
            return record


async def _next_snapshot(consumer: Consumer, timeout: float = 30) -> WorkloadSnapshotMessage:
    record = await _next_record(consumer, timeout)
    return decode(WorkloadSnapshotMessage, record.value, record.headers, key=record.key)


async def _no_snapshot(consumer: Consumer, wait: float) -> None:
    records = [r for r in await consumer.poll(max_wait=wait) if not is_live_set(r.key)]
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
    # Nothing published: the watcher has no sample of the family yet.
    assert watcher.metrics.get_sample_value("podcost_snapshots_published_total") is None


async def test_a_workload_with_an_invalid_policy_is_told_why_it_is_not_ranked(
    running_watcher: tuple[WatcherService, MemoryBus, str], kube: KubeTestCluster
) -> None:
    """A Warning event on the Deployment (``kubectl describe`` shows it), counted into one
    series however often the workload changes."""
    watcher, _, namespace = running_watcher
    await kube.create_deployment(
        namespace, "typo", 2, opt_in=True, node_selector={"watch": namespace},
        annotations={"podcost.dev/strategies": "topology-spred=2"},
    )  # fmt: skip
    await kube.wait_ready(namespace, "typo", 2)

    async def refused() -> list[Any]:
        found = await kube.core.list_namespaced_event(
            namespace, field_selector="involvedObject.kind=Deployment,involvedObject.name=typo"
        )
        return [e for e in found.items if e.reason == "PolicyRefused"]

    async def told() -> bool:
        return bool(await refused())

    await kube.wait_for(told, "a PolicyRefused event on the Deployment", timeout=30)
    [event] = await refused()
    assert event.type == "Warning"
    assert event.reporting_component == "podcost.dev/watcher"
    assert "topology-spred" in event.message
    assert watcher.metrics.get_sample_value("podcost_snapshots_published_total") is None


async def _next_message(
    consumer: Consumer, timeout: float = 30
) -> WorkloadSnapshotMessage | WorkloadGoneMessage:
    record = await _next_record(consumer, timeout)
    return decode_workload_record(record.value, record.headers, key=record.key)


async def _until_gone(consumer: Consumer) -> WorkloadGoneMessage:
    """Snapshots of the burst before it are skipped."""
    while not isinstance(message := await _next_message(consumer), WorkloadGoneMessage):
        pass
    return message


async def test_snapshots_carry_when_the_change_was_seen_and_a_workload_that_goes_is_said_gone(
    running_watcher: tuple[WatcherService, MemoryBus, str], kube: KubeTestCluster
) -> None:
    watcher, bus, namespace = running_watcher
    key = f"test/{namespace}/Deployment/web"
    async with bus.consumer([watcher.topics.workloads], group="t") as consumer:
        before = time.time()
        await kube.create_deployment(
            namespace, "web", 2, opt_in=True, node_selector={"watch": namespace}
        )
        first = await _next_snapshot(consumer)
        assert first.changed_at is not None
        # Seen after the create and before the snapshot came out of the debouncer.
        assert before <= first.changed_at <= time.time() - 0.3

        # Opting out is said once ...
        await kube.apps.patch_namespaced_deployment(
            "web", namespace, {"metadata": {"annotations": {"podcost.dev/enabled": "false"}}}
        )
        opted_out = await _until_gone(consumer)
        assert (opted_out.key, opted_out.reason) == (key, "opted out")
        await _no_snapshot(consumer, wait=1.0)
        # ... opting in again publishes it again, and deleting it is said once too.
        await kube.apps.patch_namespaced_deployment(
            "web", namespace, {"metadata": {"annotations": {"podcost.dev/enabled": "true"}}}
        )
        back = await _next_snapshot(consumer)
        assert back.version > opted_out.version > first.version
        await kube.apps.delete_namespaced_deployment("web", namespace)
        deleted = await _until_gone(consumer)
        assert (deleted.key, deleted.reason) == (key, "deleted")
        assert deleted.emitted_at > back.emitted_at
        await _no_snapshot(consumer, wait=1.5)  # its ReplicaSet and pods going say nothing more
        # Nothing of it is kept: a cluster whose workloads come and go under new names does
        # not pile up a version per name.
        assert watcher.debouncer.versions_kept == 0


def _invalid_counted(watcher: WatcherService) -> float:
    labels = {"source": COST_ANNOTATION}
    value = watcher.metrics.get_sample_value("podcost_invalid_annotations_total", labels)
    return value or 0.0


async def test_a_pod_with_an_invalid_deletion_cost_is_reported_and_gets_a_valid_one(
    control_plane: ControlPlane, kube: KubeTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = etcd_endpoint(control_plane.kubeconfig)
    if endpoint is None:
        pytest.skip("needs the etcd of a control plane podcost_localinfra started here")
    namespace = await kube.create_namespace(f"invalid-{uuid.uuid4().hex[:6]}")
    node = f"invalid-node-{namespace}"
    await kube.create_node(node, zone="zone-a", labels={"watch": namespace})
    try:
        # Not opted in yet: nothing writes a cost while the invalid one is put in place.
        await kube.create_deployment(namespace, "web", 2, node_selector={"watch": namespace})
        first, second = await kube.wait_ready(namespace, "web", 2)
        raw = kube.api.sanitize_for_serialization(
            await kube.core.read_namespaced_pod(first.name, namespace)
        )
        raw["metadata"].setdefault("annotations", {})[COST_ANNOTATION] = "abc"
        await put_pod(endpoint, raw)

        async def stored() -> bool:
            pod = await kube.core.read_namespaced_pod(first.name, namespace)
            return (pod.metadata.annotations or {}).get(COST_ANNOTATION) == "abc"

        await kube.wait_for(stored, "the API server to serve the invalid cost", timeout=10)

        api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
        async with api:
            pipeline = embedded.bootstrap(
                ServiceSettings(cluster="test", http_port=0),
                BusSettings(),
                kube=Kube(api),
                bus=MemoryBus(),
                watcher_settings=WatcherSettings(
                    namespace=namespace, debounce_seconds=0.2, max_delay_seconds=1.0
                ),
            )
            stop = asyncio.Event()
            task = asyncio.create_task(
                serve(pipeline.services, ServiceSettings(http_port=0), bus=pipeline.bus,
                      stop=stop)
            )  # fmt: skip

            async def costs() -> dict[str, str | None]:
                pods = {p.name: p.raw for p in await kube.pods(namespace, "web")}
                return {
                    name: (pod.metadata.annotations or {}).get(COST_ANNOTATION)
                    for name, pod in pods.items()
                }

            async def valid_costs() -> bool:
                if task.done():
                    task.result()
                found = await costs()
                # Every cost valid; a pod podcost leaves without one reads as 0. The invalid one
                # is always replaced, so that pod carries podcost's cost.
                valid = all(v is None or deletion_cost_error(v) is None for v in found.values())
                return valid and found.get(first.name) is not None

            try:
                with caplog.at_level(logging.WARNING, logger="podcost.watcher"):
                    await kube.apps.patch_namespaced_deployment(
                        "web", namespace,
                        {"metadata": {"annotations": {"podcost.dev/enabled": "true"}}},
                    )  # fmt: skip
                    await kube.wait_for(
                        valid_costs, "valid costs, the invalid one replaced", timeout=60
                    )
            finally:
                stop.set()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(task, 30)
        found = await costs()
        assert set(found) == {first.name, second.name}
        assert _invalid_counted(pipeline.watcher) >= 1  # once per invalid value of the pod
        [warning] = [r for r in caplog.records if "is not a cost the controller" in r.message]
        assert first.name in warning.message
        assert (getattr(warning, "pod", None), getattr(warning, "value", None)) == (
            f"{namespace}/{first.name}",
            "abc",
        )
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])


async def test_a_snapshot_the_broker_refuses_ends_the_watcher(
    control_plane: ControlPlane, kube: KubeTestCluster, kafka_bootstrap: str
) -> None:
    # Snapshots are queued without waiting for each acknowledgement; one the broker refuses
    # must still stop the watcher (whose restart publishes every workload again), not vanish.
    namespace = await kube.create_namespace(f"refuse-{uuid.uuid4().hex[:6]}")
    node = f"refuse-node-{namespace}"
    await kube.create_node(node, zone="zone-a", labels={"watch": namespace})
    settings = BusSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_workloads=f"{namespace}.workloads",
        topic_ranks=f"{namespace}.ranks",
        topic_costs=f"{namespace}.costs",
        topic_deadletter=f"{namespace}.deadletter",
    )
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:  # a topic whose records must be smaller than any snapshot
        await admin.create_topics(
            [NewTopic(settings.topic_workloads, 1, 1, topic_configs={"max.message.bytes": "256"})]
        )
    finally:
        await admin.close()
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    bus = open_bus(settings)
    async with api:
        watcher = bootstrap(
            ServiceSettings(cluster="test", http_port=0),
            settings,
            WatcherSettings(namespace=namespace, debounce_seconds=0.1),
            kube=Kube(api),
            bus=bus,
        )
        await bus.start()
        task = asyncio.create_task(watcher.run())
        try:
            await kube.create_deployment(
                namespace, "web", 2, opt_in=True, node_selector={"watch": namespace}
            )
            with pytest.raises(BusError, match="MessageSizeTooLarge"):
                await asyncio.wait_for(task, 60)
            published = watcher.metrics.get_sample_value("podcost_snapshots_published_total")
            assert published is None  # none published, so no sample yet
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, BusError):
                await task
            await bus.stop()
            await kube.delete_namespace(namespace)
            await kube.delete_nodes([node])
