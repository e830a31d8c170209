"""Per-cluster identity on the real broker and the real control plane: cluster A's watcher signs
what it publishes with A's key, and an aggregator given each cluster's keys
(``PODCOST_FLEET_KEYS_FILE``) decides A's workload; a snapshot naming cluster B signed with A's
key (what A's watcher, or anyone holding A's key, could forge), an unsigned one and one whose
value was altered after signing are dead-lettered with the reason and decide nothing. B's
second key (a rotation under way) is accepted as its first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from kubernetes_asyncio import config
from tests.conftest import ControlPlane
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import Reader, fresh_kafka_settings, running
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.aggregator import AggregatorSettings
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost.watcher.service import bootstrap as watcher
from podcost_bus import KafkaBus
from podcost_contracts.messages import (
    DeadLetter,
    DesiredCostsMessage,
    WorkloadSnapshotMessage,
    encode,
)
from podcost_contracts.signing import SIGNATURE_HEADER, signature
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

A, B = "cluster-a", "cluster-b"
KEY_A = "a" * 64
KEY_B_OLD, KEY_B_NEW = "b" * 64, "c" * 64


@pytest.fixture
async def bus(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "signed")
    async with KafkaBus(settings) as started:
        await started.ensure_topics(
            [*settings.topics.shared(), *(settings.topics.costs_for(c) for c in (A, B))]
        )
        yield started


async def _publish(bus: KafkaBus, message: WorkloadSnapshotMessage, key: str | None,
                   *, alter: bool = False) -> None:  # fmt: skip
    encoded = encode(message)
    headers = dict(encoded.headers)
    if key is not None:
        headers[SIGNATURE_HEADER] = signature(key.encode(), encoded.key or b"", encoded.value)
    value = encoded.value + b" " if alter else encoded.value
    await bus.publish(bus.settings.topics.workloads, encoded.key, value, headers)


async def test_a_watcher_publishes_only_as_its_own_cluster(
    bus: KafkaBus, control_plane: ControlPlane, kube: KubeTestCluster, tmp_path: Path
) -> None:
    settings, topics = bus.settings, bus.settings.topics
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{A} {KEY_A}\n{B} {KEY_B_OLD} {KEY_B_NEW}  # rotating\n")
    signing_key = tmp_path / "signing.key"
    signing_key.write_text(KEY_A + "\n")
    run = settings.client_id.rsplit("-", 1)[-1]
    config_ = AggregatorSettings(
        deadline_s=0.2, tick_s=0.05, app_id=f"signed-{run}-aggregator", engine="consumer"
    )
    combiner = aggregator.bootstrap(
        ServiceSettings(http_port=0, fleet_keys_file=keys), settings, config=config_, bus=bus
    )
    namespace = await kube.create_namespace(f"signed-{uuid.uuid4().hex[:6]}")
    node = f"signed-{namespace}"
    await kube.create_node(node, zone="zone-a", labels={"signed": namespace})
    now = time.time()
    base = deployment(pods=2, nodes=2)
    as_b = replace(base, workload=replace(base.workload, cluster=B), version=5)
    forged = WorkloadSnapshotMessage.of(as_b, emitted_at=now)
    genuine_b = WorkloadSnapshotMessage.of(replace(as_b, version=6), emitted_at=now + 1)
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        async with api:
            agent = watcher(
                ServiceSettings(cluster=A, http_port=0), settings,
                WatcherSettings(namespace=namespace, debounce_seconds=0.2,
                                signing_key_file=signing_key),
                kube=Kube(api), bus=bus,
            )  # fmt: skip
            async with (
                running(combiner),
                Reader(bus, topics.costs_for(A), DesiredCostsMessage) as costs_a,
                Reader(bus, topics.costs_for(B), DesiredCostsMessage) as costs_b,
                Reader(bus, topics.deadletter, DeadLetter) as dead,
            ):
                task = asyncio.create_task(agent.run())
                try:
                    await kube.create_deployment(
                        namespace, "web", 2, opt_in=True, node_selector={"signed": namespace}
                    )
                    # A's watcher, signing with A's key: decided.
                    (decided_a,) = await costs_a.take(1, timeout=60)
                    # As B with A's key, unsigned, altered after signing: refused, each.
                    await _publish(bus, forged, KEY_A)
                    await _publish(bus, forged, None)
                    await _publish(bus, forged, KEY_B_OLD, alter=True)
                    letters = await dead.take(3, timeout=60)
                    # B's own (second) key: decided.
                    await _publish(bus, genuine_b, KEY_B_NEW)
                    (decided_b,) = await costs_b.take(1, timeout=60)
                    await costs_b.nothing_more(0.5)
                finally:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            forged_count = combiner.metrics.get_sample_value(
                "podcost_messages_consumed_total", {"topic": topics.workloads, "outcome": "forged"}
            )
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])
    assert decided_a.key == f"{A}/{namespace}/Deployment/web"
    assert decided_b.version == 6
    reasons = {letter.reason for letter in letters}
    assert reasons == {
        f"the record is not signed with a key of cluster '{B}' ({SIGNATURE_HEADER} header "
        "missing or wrong)"
    }
    assert forged_count == 3
