"""The fleet registry on the real broker: the aggregator serves only the clusters its registry
file lists. A flood of snapshots naming 10,000 invented clusters (1,000 in ``make test``) is
dead-lettered and counted (``podcost_unregistered_records_total``) before it is decoded: no
costs topic is created, no state is kept, the process's memory stays flat, and the registered
cluster's workloads are still decided. A cluster added to the file is served without a
restart.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from tests.support.pipeline import Reader, eventually, fresh_kafka_settings, running
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.aggregator import AggregatorSettings
from podcost.runtime.settings import ServiceSettings
from podcost_bus import KafkaBus, publish_message
from podcost_contracts.messages import DesiredCostsMessage, WorkloadSnapshotMessage, encode
from podcost_core.model import Snapshot

pytestmark = pytest.mark.integration

UNREGISTERED = "podcost_unregistered_records_total"


@pytest.fixture
async def bus(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "fleet")
    async with KafkaBus(settings) as started:
        await started.ensure_topics(settings.topics.shared())
        yield started


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _costs_topics(bootstrap: str, prefix: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {topic for topic in await admin.list_topics() if topic.startswith(prefix)}
    finally:
        await admin.close()


def _of(cluster: str, base: Snapshot) -> Snapshot:
    return replace(base, workload=replace(base.workload, cluster=cluster))


async def _flood(bus: KafkaBus, base: Snapshot, clusters: range) -> None:
    """One valid snapshot per invented cluster, sent without waiting for each acknowledgement."""
    topic = bus.settings.topics.workloads
    now = time.time()
    acks = []
    for index in clusters:
        encoded = encode(WorkloadSnapshotMessage.of(_of(f"invented-{index}", base), emitted_at=now))
        acks.append(await bus.send(topic, encoded.key, encoded.value, encoded.headers))
    await asyncio.gather(*acks)


@pytest.mark.parametrize(
    "invented", [1_000, pytest.param(10_000, marks=pytest.mark.long)], ids=lambda n: f"{n}"
)
async def test_a_flood_of_invented_clusters_creates_nothing_and_the_fleet_is_still_decided(
    bus: KafkaBus, tmp_path: Path, invented: int
) -> None:
    settings, topics = bus.settings, bus.settings.topics
    registry = tmp_path / "clusters.txt"
    registry.write_text(f"# the fleet\n{CLUSTER}\n")
    run = settings.client_id.rsplit("-", 1)[-1]
    # No ranker runs: each snapshot is decided at its deadline with what the aggregator has.
    config = AggregatorSettings(
        deadline_s=0.2, tick_s=0.05, app_id=f"fleet-{run}-aggregator", engine="consumer"
    )
    service = ServiceSettings(http_port=0, fleet_file=registry)
    combiner = aggregator.bootstrap(service, settings, config=config, bus=bus)
    metrics = combiner.metrics
    base = deployment(pods=3, nodes=3)
    genuine = WorkloadSnapshotMessage.of(replace(base, version=2), emitted_at=time.time())

    def unregistered() -> float:
        return metrics.get_sample_value(UNREGISTERED, {"topic": topics.workloads}) or 0.0

    async with (
        running(combiner),
        Reader(bus, topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
    ):
        started = time.monotonic()
        # A first half warms every path (the dead-letter producer's buffers, the allocator's
        # arenas); the second must then cost no memory that stays.
        await _flood(bus, base, range(invented // 2))
        await eventually(lambda: unregistered() == invented // 2, "the first half", timeout=60)
        halfway = _rss_bytes()
        await _flood(bus, base, range(invented // 2, invented))
        await publish_message(bus, topics.workloads, genuine)
        (decision,) = await costs.take(1, timeout=60)
        await eventually(lambda: unregistered() == invented, "every invented record", timeout=60)
        grown = _rss_bytes() - halfway
        took = time.monotonic() - started

        # A cluster added to the registry is served without a restart.
        newcomer = "prod-ap-1"
        registry.write_text(f"{CLUSTER}\n{newcomer}\n")
        added = WorkloadSnapshotMessage.of(_of(newcomer, base), emitted_at=time.time())
        async with Reader(bus, topics.costs_for(newcomer), DesiredCostsMessage) as newcomers:
            await publish_message(bus, topics.workloads, added)
            (first,) = await newcomers.take(1, timeout=30)

    print(
        f"{invented} snapshots of invented clusters dead-lettered in {took:.1f}s; resident "
        f"memory grew {grown / 2**20:.1f} MiB over the second {invented // 2}"
    )
    assert decision.version == 2
    assert first.key.startswith(f"{newcomer}/")
    processor = combiner.processor
    assert set(processor._topic_of) == {CLUSTER, newcomer}
    created = await _costs_topics(settings.bootstrap_servers or "", f"{topics.costs}.")
    assert created == {topics.costs_for(CLUSTER), topics.costs_for(newcomer)}
    consumed = metrics.get_sample_value(
        "podcost_messages_consumed_total", {"topic": topics.workloads, "outcome": "unregistered"}
    )
    assert consumed == invented
    # A kept state or topic entry per invented cluster would be several KB each: thousands of them
    # tens of MB at 10,000. What the second half may cost is the allocator's noise.
    assert grown < 8 * 2**20, f"resident memory grew {grown / 2**20:.1f} MiB"
