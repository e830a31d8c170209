"""The worked plugin (``examples/podcost-strategy-example``, strategy ``restarts``) runs as its
own ranker process — ``podcost ranker --strategy restarts``, found through its entry point —
next to the built-in rankers and the faust aggregator, over the real Kafka broker; and its weight
changes the costs: the same pods decided without it and then with ``restarts=10`` come out in a
different order, each exactly as the pure core computes it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from tests.support.pipeline import Reader, expected_costs, fresh_kafka_settings, running
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator, ranker
from podcost.aggregator import AggregatorSettings
from podcost.runtime.settings import ServiceSettings
from podcost_bus import BusSettings, KafkaBus, publish_message
from podcost_contracts.messages import DesiredCostsMessage, WorkloadSnapshotMessage
from podcost_core.combine import rank
from podcost_core.model import Pod
from podcost_core.policy import policy_from_annotations

pytestmark = pytest.mark.integration

SETTINGS = ServiceSettings(http_port=0)
WITHOUT = {
    "podcost.dev/enabled": "true",
    "podcost.dev/strategies": "topology-spread | capacity-type=3, age",
}
WITH = {**WITHOUT, "podcost.dev/strategies": "topology-spread | capacity-type=3, age, restarts=10"}


def _pods_that_restart_where_podcost_would_keep_them() -> tuple[Pod, ...]:
    """9 pods whose restart counts run against the order podcost gives them without the plugin:
    the pod it would delete first never restarted, the one it would keep longest did most."""
    base = deployment(pods=9, nodes=6)
    order = rank(replace(base, annotations=WITHOUT), policy_from_annotations(WITHOUT)).flat()
    restarts = {uid: position for position, uid in enumerate(order)}
    return tuple(replace(pod, restarts=restarts[pod.uid]) for pod in base.pods)


@pytest.fixture
async def kafka(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "plugin")
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
        yield bus


def _ranker_process_env(settings: BusSettings) -> dict[str, str]:
    topics = settings.topics
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCOST_")}
    env.update(
        {
            "PODCOST_KAFKA": settings.bootstrap_servers or "",
            "PODCOST_KAFKA_CLIENT_ID": f"{settings.client_id}-restarts",
            "PODCOST_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "PODCOST_TOPIC_WORKLOADS": topics.workloads,
            "PODCOST_TOPIC_RANKS": topics.ranks,
            "PODCOST_TOPIC_COSTS": topics.costs,
            "PODCOST_TOPIC_DEADLETTER": topics.deadletter,
            "PODCOST_HTTP_PORT": "0",
            "PODCOST_LOG_FORMAT": "text",
        }
    )
    return env


async def test_the_example_plugin_runs_as_its_own_ranker_and_its_weight_reorders_the_costs(
    kafka: KafkaBus, tmp_path: Path
) -> None:
    pods = _pods_that_restart_where_podcost_would_keep_them()
    base = deployment(pods=9, nodes=6)
    without = replace(base, pods=pods, annotations=WITHOUT, version=1)
    with_plugin = replace(without, annotations=WITH, version=2)
    config = AggregatorSettings(
        deadline_seconds=60.0, tick_seconds=0.1, app_id=f"test-plugin-{uuid.uuid4().hex[:8]}",
        data_dir=tmp_path, commit_interval_seconds=0.2,
    )  # fmt: skip
    plugin = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "podcost", "ranker", "--strategy", "restarts",
        env=_ranker_process_env(kafka.settings),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        async with (
            running(
                ranker.bootstrap(SETTINGS, kafka.settings, strategy="capacity-type", bus=kafka),
                ranker.bootstrap(SETTINGS, kafka.settings, strategy="age", bus=kafka),
                aggregator.bootstrap(SETTINGS, kafka.settings, config=config, bus=kafka),
            ),
            Reader(kafka, kafka.settings.topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
        ):
            decisions = []
            for snapshot in (without, with_plugin):  # one by one: a newer version supersedes
                message = WorkloadSnapshotMessage.of(snapshot, emitted_at=time.time())
                await publish_message(kafka, kafka.settings.topics.workloads, message)
                decisions.extend(await costs.take(1, timeout=90))
            first, second = decisions
    finally:
        if plugin.returncode is None:
            plugin.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(plugin.communicate(), 30)
    assert plugin.returncode == 0, output.decode()

    assert (first.version, second.version) == (1, 2)
    assert first.complete
    assert second.complete  # the plugin's ranker process answered
    assert all("restarts" not in pod.breakdown for pod in first.costs)
    assert all(pod.breakdown["restarts"].weight == 10 for pod in second.costs)
    decided = [{pod.uid: pod.cost for pod in m.costs} for m in (first, second)]
    assert decided[0] == expected_costs(without, policy_from_annotations(WITHOUT))
    assert decided[1] == expected_costs(with_plugin, policy_from_annotations(WITH))
    orders = [sorted(costs_, key=costs_.__getitem__) for costs_ in decided]
    assert orders[0] != orders[1]
    most_restarts = max(pods, key=lambda pod: pod.restarts)
    assert orders[0][-1] == most_restarts.uid  # kept longest without the plugin
    assert orders[1][0] == most_restarts.uid  # deleted first with it
