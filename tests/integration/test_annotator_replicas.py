"""Two annotators of one cluster share its costs topic, and a crash of one loses no write and
rewinds no cost.

Two ``podcost annotator`` processes for the same cluster, started as the Helm chart's ``agent``
mode starts them with ``annotator.replicaCount: 2`` (``tests.support.services.chart_specs``),
join the same consumer group (``<PODCOST_ANNOTATOR_GROUP>.<cluster>``, a prefix of this run's
own) on the real broker, and write to the real control plane. The cluster's costs topic has
four partitions and the workloads' names are chosen so that every partition holds two of them:
both annotators get work. A stream of decisions flows, every workload's versions one after the
other, each version's costs higher than the last version's for every pod; mid-stream one
annotator is SIGKILLed, so its partitions wait for the session timeout and the other one takes
them over, reading again what the dead one had not committed.

The oracle is an undisturbed twin: the same annotator, in-process over the in-memory bus, never
stopped, given the very same decisions for a twin namespace holding the same Deployments. Every
pod ends at the cost its twin pod (same Deployment, same rank among its pods) ends at; and no
pod's cost ever goes down on the way there, as a watch on the pods sees every change: costs only
grow with the version, so a decrease is an older decision written over a newer one.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import watch
from tests.conftest import ControlPlane
from tests.support.costs import Desire, desired, publish_costs
from tests.support.kube import KubeTestCluster, PodView
from tests.support.pipeline import fresh_kafka_settings, running
from tests.support.services import ServiceProcess, assert_alive, chart_specs, processes
from tests.support.tools import require_helm

from podcost.annotator import AnnotatorSettings, bootstrap
from podcost.runtime.settings import ServiceSettings
from podcost_bus import Bus, BusSettings, KafkaBus, MemoryBus
from podcost_bus.faust_app import key_partition
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

CLUSTER = "replicas"
PARTITIONS = 4
PER_PARTITION = 2
"""Workloads whose costs land in each partition of the costs topic."""
PODS = 4
VERSIONS = 14
CRASH_AFTER = 5
"""The version of every workload published right before one annotator is SIGKILLed."""
PACE_S = 0.4
"""Between two versions of the stream (every workload's next version at once)."""
SESSION_TIMEOUT_MS = 6000
"""How soon the broker gives the dead annotator's partitions away."""
SETTLE_S = 90.0


def cost_of(workload: int, version: int, rank: int) -> int:
    """The cost version ``version`` of workload ``workload`` wants for its ``rank``-th pod:
    higher than every earlier version's for that pod, otherwise shuffled. Deterministic."""
    rng = random.Random(f"{workload}/{version}")
    return version * 100 + rng.sample(range(100), PODS)[rank]


def workload_names(namespace: str) -> list[str]:
    """Names whose workload keys put :data:`PER_PARTITION` workloads in every partition."""
    names: list[str] = []
    filled: dict[int, int] = defaultdict(int)
    for index in range(10_000):
        name = f"w{index}"
        partition = key_partition(f"{CLUSTER}/{namespace}/Deployment/{name}".encode(), PARTITIONS)
        if filled[partition] < PER_PARTITION:
            filled[partition] += 1
            names.append(name)
        if len(names) == PARTITIONS * PER_PARTITION:
            return names
    raise AssertionError("no names fill every partition")


class Namespace:
    """One namespace's Deployments, their pods in a fixed order, and the decisions for them."""

    def __init__(self, kube: KubeTestCluster, name: str, apps: Sequence[str], node: str) -> None:
        self.kube = kube
        self.name = name
        self.apps = list(apps)
        self.node = node
        self.pods: dict[str, list[PodView]] = {}

    async def create(self) -> None:
        await self.kube.create_namespace(self.name)
        labels = {"podcost-replicas-test": self.name}
        await self.kube.create_node(self.node, zone="a", labels=labels)
        for app in self.apps:
            await self.kube.create_deployment(
                self.name, app, PODS, opt_in=True, node_selector=labels
            )
        for app in self.apps:

            async def created(app: str = app) -> bool:
                self.pods[app] = sorted(
                    await self.kube.active_pods(self.name, app), key=lambda p: p.name
                )
                return len(self.pods[app]) == PODS

            await self.kube.wait_for(created, f"{PODS} pods of {app}", 60, 0.1)

    async def delete(self) -> None:
        await self.kube.delete_namespace(self.name)
        await self.kube.delete_nodes([self.node])

    async def publish(self, bus: Bus, topic: str, version: int, *, here: str = CLUSTER) -> None:
        """Version ``version`` of every workload's decision (its key names cluster ``here``)."""
        for index, app in enumerate(self.apps):
            pods = [
                Desire(pod.name, pod.uid, cost_of(index, version, rank))
                for rank, pod in enumerate(self.pods[app])
            ]
            message = desired(self.name, app, pods, version=version, cluster=here)
            await publish_costs(bus, topic, message)

    async def costs(self) -> dict[tuple[int, int], int | None]:
        """Per (workload index, pod rank): the cost on the pod now."""
        found: dict[tuple[int, int], int | None] = {}
        for index, app in enumerate(self.apps):
            by_name = {
                pod["metadata"]["name"]: (pod["metadata"].get("annotations") or {}).get(
                    DELETION_COST_ANNOTATION
                )
                for pod in await self.kube.raw_pods(self.name, app)
            }
            for rank, pod in enumerate(self.pods[app]):
                value = by_name.get(pod.name)
                found[index, rank] = None if value is None else int(value)
        return found

    def final(self) -> dict[tuple[int, int], int]:
        return {
            (index, rank): cost_of(index, VERSIONS, rank)
            for index in range(len(self.apps))
            for rank in range(PODS)
        }


async def watch_costs(kube: KubeTestCluster, namespace: str, seen: dict[str, list[int]]) -> None:
    """Append every change of a pod's deletion cost in ``namespace`` to ``seen[pod]``, in the
    order the API server made them, until cancelled."""
    version = (await kube.core.list_namespaced_pod(namespace)).metadata.resource_version
    while True:
        stream = watch.Watch().stream(
            kube.core.list_namespaced_pod, namespace, resource_version=version,
            timeout_seconds=300, allow_watch_bookmarks=True,
        )  # fmt: skip
        async with stream:
            async for event in stream:
                pod: Any = event["object"]
                version = pod.metadata.resource_version
                if event["type"] != "MODIFIED":
                    continue
                value = (pod.metadata.annotations or {}).get(DELETION_COST_ANNOTATION)
                history = seen[pod.metadata.name]
                if value is not None and (not history or history[-1] != int(value)):
                    history.append(int(value))


async def consumed(process: ServiceProcess) -> float:
    metrics = await process.metrics()
    return sum(
        value
        for key, value in metrics.items()
        if key.startswith("podcost_messages_consumed_total{") and 'outcome="ok"' in key
    )


@pytest.fixture
async def kafka(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "annrep").model_copy(
        update={"partitions": PARTITIONS, "session_timeout_ms": SESSION_TIMEOUT_MS}
    )
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
        yield bus


async def test_two_annotators_of_one_cluster_share_it_and_a_crash_loses_no_write_nor_rewinds(
    kafka: KafkaBus, kube: KubeTestCluster, control_plane: ControlPlane, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    disturbed = Namespace(kube, f"annrep-{run}", workload_names(f"annrep-{run}"), f"annrep-{run}")
    twin = Namespace(kube, f"annrep-{run}-twin", disturbed.apps, f"annrep-{run}-twin")
    settings = kafka.settings
    topic = settings.topics.costs_for(CLUSTER)
    values = {
        "mode": "agent",
        "clusterName": CLUSTER,
        "kafka": {"bootstrapServers": settings.bootstrap_servers, "partitions": PARTITIONS},
        "annotator": {"replicaCount": 2},
    }
    specs = [s for s in chart_specs(require_helm(), values) if s.name.startswith("annotator")]
    assert [s.name for s in specs] == ["annotator#1", "annotator#2"]
    env = {
        "KUBECONFIG": str(control_plane.kubeconfig),
        "PODCOST_TOPIC_WORKLOADS": settings.topic_workloads,
        "PODCOST_TOPIC_RANKS": settings.topic_ranks,
        "PODCOST_TOPIC_COSTS": settings.topic_costs,
        "PODCOST_TOPIC_DEADLETTER": settings.topic_deadletter,
        "PODCOST_ANNOTATOR_GROUP": f"annrep-{run}",
        "PODCOST_KAFKA_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
    }
    memory_settings = BusSettings(partitions=PARTITIONS)
    memory = MemoryBus(partitions=PARTITIONS)
    twin_annotator = bootstrap(
        ServiceSettings(http_port=0, cluster=CLUSTER), memory_settings,
        AnnotatorSettings(group=f"twin-{run}"), bus=memory, kube=Kube(kube.api),
    )  # fmt: skip
    seen: dict[str, list[int]] = defaultdict(list)
    await asyncio.gather(disturbed.create(), twin.create())
    watcher = asyncio.create_task(watch_costs(kube, disturbed.name, seen))
    try:
        async with (
            processes(specs, env=env, log_dir=tmp_path, ready_timeout=240) as annotators,
            memory,
            running(twin_annotator),
        ):
            first, second = annotators["annotator#1"], annotators["annotator#2"]
            for version in range(1, VERSIONS + 1):
                await disturbed.publish(kafka, topic, version)
                await twin.publish(memory, memory_settings.topics.costs_for(CLUSTER), version)
                if version == CRASH_AFTER:
                    # Both hold partitions and have written; then one dies at once, with this
                    # version's records read or on their way and their writes and commits in
                    # flight, and the other takes its partitions over from their last commit.
                    shares = {p.spec.name: await consumed(p) for p in (first, second)}
                    assert all(share > 0 for share in shares.values()), shares
                    second.kill()
                    await second.stop()
                await asyncio.sleep(PACE_S)

            wanted = disturbed.final()
            deadline = time.monotonic() + SETTLE_S
            while (now := await disturbed.costs()) != wanted:
                assert_alive([first])
                assert time.monotonic() < deadline, f"not settled: {now} != {wanted}"
                await asyncio.sleep(0.2)
            while (twin_now := await twin.costs()) != twin.final():
                assert time.monotonic() < deadline, f"the twin did not settle: {twin_now}"
                await asyncio.sleep(0.2)
            taken_over = await consumed(first)
        # The watch saw each pod's last change (it ends at its final cost), so no change before
        # it went unseen.
        deadline = time.monotonic() + SETTLE_S
        last = {(i, r): p.name for i, app in enumerate(disturbed.apps)
                for r, p in enumerate(disturbed.pods[app])}  # fmt: skip
        while {key: seen[name][-1] if seen[name] else None for key, name in last.items()} != wanted:
            if watcher.done():
                watcher.result()  # raises what stopped the watch
                raise AssertionError("the watch on the pods ended")
            assert time.monotonic() < deadline, f"the watch saw {dict(seen)}"
            await asyncio.sleep(0.2)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await asyncio.gather(disturbed.delete(), twin.delete())

    assert now == twin_now
    rewound = {pod: costs for pod, costs in seen.items() if costs != sorted(costs)}
    assert rewound == {}, f"costs that went down: {rewound}"
    assert taken_over > shares["annotator#1"]
    print(f"\nnew decisions read per annotator before the crash: {shares}; by the survivor in "
          f"all: {taken_over} ({len(disturbed.apps) * (VERSIONS - CRASH_AFTER)} published after "
          f"the crash); pods by how many cost changes the watch saw: {_spread(seen)}")  # fmt: skip


def _spread(seen: Mapping[str, list[int]]) -> dict[int, int]:
    counts: dict[int, int] = defaultdict(int)
    for costs in seen.values():
        counts[len(costs)] += 1
    return dict(sorted(counts.items()))
