"""``podcost remove-cluster`` against the real Kafka broker and the faust aggregator, the command
run as its own process: refused while the cluster's watcher still publishes and while its
annotators' group has a member; its plan changes nothing; with ``--yes`` the cluster leaves
nothing behind (no state in the aggregator's tables, none recovered from their changelogs after
a restart, no costs topic, no consumer group) and the other cluster keeps everything."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from tests.support.pipeline import eventually, fresh_kafka_settings, running
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.aggregator import AggregatorService, AggregatorSettings
from podcost.runtime.settings import ServiceSettings
from podcost_bus import BusSettings, KafkaBus, publish_message
from podcost_bus.admin import FleetAdmin
from podcost_bus.faust_app import FaustKeyedApp
from podcost_contracts.messages import WorkloadSnapshotMessage
from podcost_core.model import WorkloadRef

# The command runs as its own process five times (about 40 s on a loaded machine): make test-long.
pytestmark = [pytest.mark.integration, pytest.mark.long]

LEAVING, STAYING = "leaving", "staying"
ANNOTATIONS = {"podcost.dev/enabled": "true", "podcost.dev/strategies": "age"}
GROUP = "podcost-annotator"


def _aggregator(bus: KafkaBus, data_dir: Path, app_id: str) -> AggregatorService:
    config = AggregatorSettings(
        deadline_seconds=0.5, tick_seconds=0.1, app_id=app_id, data_dir=data_dir,
        commit_interval_seconds=0.2,
    )  # fmt: skip
    return aggregator.bootstrap(ServiceSettings(http_port=0), bus.settings, config=config, bus=bus)


def _stored(service: AggregatorService) -> set[str]:
    transport = service.transport
    assert isinstance(transport, FaustKeyedApp)
    return {key.decode() for table in transport.tables.values() for key in table}


def _snapshot(cluster: str, name: str) -> WorkloadSnapshotMessage:
    base = deployment(name, pods=3, nodes=3, namespace="shop")
    snapshot = replace(base, workload=WorkloadRef(cluster, "shop", "Deployment", name, "u"),
                       annotations=ANNOTATIONS)  # fmt: skip
    return WorkloadSnapshotMessage.of(snapshot, emitted_at=time.time())


async def _command(settings: BusSettings, app_id: str, *args: str) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "PODCOST_KAFKA": settings.bootstrap_servers,
        "PODCOST_TOPIC_WORKLOADS": settings.topics.workloads,
        "PODCOST_TOPIC_RANKS": settings.topics.ranks,
        "PODCOST_TOPIC_COSTS": settings.topics.costs,
        "PODCOST_TOPIC_DEADLETTER": settings.topics.deadletter,
        "PODCOST_AGGREGATOR_APP_ID": app_id,
        "PODCOST_ANNOTATOR_GROUP": GROUP,
    }
    podcost = shutil.which("podcost", path=str(Path(sys.executable).parent))
    assert podcost is not None
    process = await asyncio.create_subprocess_exec(
        podcost, "remove-cluster", *args, "-o", "json", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_removed_cluster_leaves_nothing_behind_and_is_refused_while_its_agent_runs(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    settings = fresh_kafka_settings(kafka_bootstrap, "remove")
    topics = settings.topics
    app_id = f"test-{settings.client_id}-aggregator"
    leaving = {f"{LEAVING}/shop/Deployment/{name}" for name in ("a", "b", "c")}
    staying = {f"{STAYING}/shop/Deployment/{name}" for name in ("a", "b")}
    async with KafkaBus(settings) as bus:
        costs_topics = [topics.costs_for(LEAVING), topics.costs_for(STAYING)]
        await bus.ensure_topics([*topics.shared(), *costs_topics])
        core = _aggregator(bus, tmp_path / "first", app_id)
        async with running(core):
            for key in sorted(leaving | staying):
                cluster, _, _, name = key.split("/")
                await publish_message(bus, topics.workloads, _snapshot(cluster, name))
            await eventually(lambda: leaving | staying <= _stored(core), "every state")
            # The leaving cluster's annotator reads its costs (its group commits) and runs.
            annotator = bus.consumer([topics.costs_for(LEAVING)], group=f"{GROUP}.{LEAVING}")
            async with annotator:
                decisions = []
                while len(decisions) < len(leaving):
                    decisions += await annotator.poll(max_wait=20)
                await annotator.commit(decisions)
                code, out, _ = await _command(settings, app_id, LEAVING, "--quiet-for", "0")
                assert code == 1
                assert json.loads(out)["annotator_members"] == 1
            # Its watcher published moments ago.
            code, out, err = await _command(settings, app_id, LEAVING, "--yes")
            assert code == 1, err
            refused = json.loads(out)
            assert "published" in refused["refused"]
            assert refused["last_published_at"] is not None
            # The plan (no --yes) changes nothing.
            code, out, err = await _command(settings, app_id, LEAVING, "--quiet-for", "0")
            assert code == 0, err
            plan = json.loads(out)
            assert plan["done"] is False
            assert plan["costs_topic_exists"] is True
            assert plan["annotator_group_exists"] is True
            assert leaving <= _stored(core)
            code, out, err = await _command(
                settings, app_id, LEAVING, "--quiet-for", "0", "--yes", "--timeout", "60"
            )
            assert code == 0, err
            assert json.loads(out)["done"] is True
            assert not leaving & _stored(core)
            assert staying <= _stored(core)
            removed = core.metrics.get_sample_value(
                "podcost_aggregator_states_forgotten_total", {"reason": "removed"}
            )
            assert removed == len(leaving)
        async with FleetAdmin(settings) as admin:
            names = await admin.topics()
            assert topics.costs_for(LEAVING) not in names
            assert topics.costs_for(STAYING) in names
            assert not (await admin.group(f"{GROUP}.{LEAVING}")).exists
        # The changelogs hold the tombstones: a restarted aggregator recovers no state of it.
        again = _aggregator(bus, tmp_path / "again", app_id)
        async with running(again):
            stored = _stored(again)
            assert not leaving & stored
            assert staying <= stored
