"""A watcher's live set, on the real control plane, the real Kafka broker and the faust
aggregator: a workload deleted, and one opted out, while no watcher ran are forgotten once the
watcher is back (their states leave the tables and the changelog, and the opted-out one's pods
get a release), and over a deletion-heavy run the number of states follows the live workloads,
not the history."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import Reader, eventually, fresh_kafka_settings, running
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.aggregator import AggregatorService, AggregatorSettings
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings, bootstrap
from podcost_bus import KafkaBus, publish_message
from podcost_bus.faust_app import FaustKeyedApp
from podcost_contracts.messages import (
    GONE_UNLISTED,
    ReleaseCostsMessage,
    WorkloadGoneMessage,
    WorkloadSnapshotMessage,
    decode_costs_record,
    encode,
    live_set_key,
)
from podcost_core.model import WorkloadRef
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

CLUSTER = "live"
ANNOTATIONS = {"podcost.dev/enabled": "true", "podcost.dev/strategies": "age"}


def _aggregator(bus: KafkaBus, data_dir: Path, run: str) -> AggregatorService:
    config = AggregatorSettings(
        deadline_seconds=0.5, tick_seconds=0.1, app_id=f"test-{run}-aggregator",
        data_dir=data_dir, commit_interval_seconds=0.2,
    )  # fmt: skip
    return aggregator.bootstrap(ServiceSettings(http_port=0), bus.settings, config=config, bus=bus)


def _stored(service: AggregatorService) -> set[str]:
    transport = service.transport
    assert isinstance(transport, FaustKeyedApp)
    return {key.decode() for table in transport.tables.values() for key in table}


def _states(service: AggregatorService) -> float:
    return service.metrics.get_sample_value("podcost_aggregator_states") or 0.0


async def test_workloads_deleted_or_opted_out_while_no_watcher_ran_are_forgotten_when_it_returns(
    kafka_bootstrap: str, kube: KubeTestCluster, tmp_path: Path
) -> None:
    settings = fresh_kafka_settings(kafka_bootstrap, "liveset")
    run = settings.client_id.rsplit("-", 1)[-1]
    namespace = await kube.create_namespace(f"live-{uuid.uuid4().hex[:6]}")
    node = f"live-{namespace}"
    await kube.create_node(node, zone="zone-a", labels={"live": namespace})
    config = WatcherSettings(namespace=namespace, debounce_seconds=0.2)
    service = ServiceSettings(cluster=CLUSTER, http_port=0)
    keys = {name: f"{CLUSTER}/{namespace}/Deployment/{name}" for name in ("kept", "gone", "out")}
    try:
        for name in keys:
            await kube.create_deployment(namespace, name, 2, opt_in=True,
                                         node_selector={"live": namespace})  # fmt: skip
            await kube.wait_ready(namespace, name, 2)
        async with KafkaBus(settings) as bus:
            await bus.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
            core = _aggregator(bus, tmp_path, run)
            async with (
                Reader(
                    bus,
                    settings.topics.costs_for(CLUSTER),
                    ReleaseCostsMessage,
                    decoder=decode_costs_record,
                ) as costs,  # fmt: skip
                running(core),
            ):
                watcher = bootstrap(service, settings, config, kube=Kube(kube.api), bus=bus)
                async with running(watcher):
                    await eventually(lambda: set(keys.values()) <= _stored(core),
                                     "every workload's state", timeout=60)  # fmt: skip
                # No watcher runs: one workload is deleted, one opts out; nobody says so.
                await kube.apps.delete_namespaced_deployment("gone", namespace)
                await kube.apps.patch_namespaced_deployment(
                    "out",
                    namespace,
                    {"metadata": {"annotations": {"podcost.dev/enabled": "false"}}},
                )
                await costs.take(3, timeout=30)  # the decisions of the first run
                assert set(keys.values()) <= _stored(core)
                back = bootstrap(service, settings, config, kube=Kube(kube.api), bus=bus)
                async with running(back):
                    await eventually(
                        lambda: not {keys["gone"], keys["out"]} & _stored(core),
                        "the unlisted states to be forgotten", timeout=60,
                    )  # fmt: skip
                    releases = []
                    while len(releases) < 2:
                        message = (await costs.take(1, timeout=30))[0]
                        if isinstance(message, ReleaseCostsMessage):
                            releases.append(message)
                assert keys["kept"] in _stored(core)
                assert {release.key for release in releases} == {keys["gone"], keys["out"]}
                assert {release.reason for release in releases} == {GONE_UNLISTED}
                forgotten = core.metrics.get_sample_value(
                    "podcost_aggregator_states_forgotten_total", {"reason": "unlisted"}
                )
                assert forgotten == 2
            # The tombstones are in the changelog: a restarted aggregator does not bring them back.
            again = _aggregator(bus, tmp_path / "again", run)
            async with running(again):
                assert keys["gone"] not in _stored(again)
                assert keys["out"] not in _stored(again)
                assert keys["kept"] in _stored(again)
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])


def _snapshot_of(name: str, emitted_at: float) -> WorkloadSnapshotMessage:
    base = deployment(name, pods=3, nodes=3, namespace="churn")
    workload = WorkloadRef(CLUSTER, "churn", "Deployment", name, uid=f"uid-{name}")
    snapshot = replace(base, workload=workload, annotations=ANNOTATIONS)
    return WorkloadSnapshotMessage.of(snapshot, emitted_at=emitted_at)


async def test_over_a_deletion_heavy_run_the_states_follow_the_live_workloads(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    settings = fresh_kafka_settings(kafka_bootstrap, "churn")
    run = settings.client_id.rsplit("-", 1)[-1]
    per_round = 20
    unswept: list[float] = []
    swept: list[tuple[float, float]] = []
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
        core = _aggregator(bus, tmp_path, run)
        async with running(core):
            held = 0
            for round_ in range(6):
                # Each round replaces every live workload by new ones, the old ones deleted
                # while no watcher ran (no WorkloadGoneMessage); from the fourth round on, a
                # watcher syncs after each (its live set).
                live = [f"w{round_}-{index}" for index in range(per_round)]
                for name in live:
                    await publish_message(bus, settings.topics.workloads,
                                          _snapshot_of(name, time.time()))  # fmt: skip
                held += per_round
                await eventually(lambda: _states(core) == held, f"{held} states")  # noqa: B023
                if round_ < 3:
                    unswept.append(_states(core))
                    continue
                listed = WorkloadGoneMessage(
                    key=live_set_key(CLUSTER).text(), version=0, reason=GONE_UNLISTED,
                    emitted_at=time.time(),
                    live=tuple(f"{CLUSTER}/churn/Deployment/{name}" for name in live),
                )  # fmt: skip
                encoded = encode(listed)
                await bus.broadcast(settings.topics.workloads, encoded.key, encoded.value,
                                    encoded.headers)  # fmt: skip
                before = _states(core)
                await eventually(lambda: _states(core) == per_round, "the states to follow")
                held = per_round
                swept.append((before, _states(core)))
    print(f"\nstates without a live set: {unswept}; before/after each live set: {swept}")
    assert unswept == [20, 40, 60]
    assert swept == [(80, 20), (40, 20), (40, 20)]
