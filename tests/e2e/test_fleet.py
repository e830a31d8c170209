"""A fleet of two clusters and one core, every component its own process, as the chart runs them.

Two real control planes (``control_plane``, ``second_control_plane``) and one real broker
(``kafka_bootstrap``). The chart rendered by the real helm in ``agent`` mode for cluster ``a``
and for cluster ``b`` (a watcher and an annotator each, with that cluster's kubeconfig) and in
``core`` mode once (one ranker per strategy of the default policy, and the aggregator); each
container becomes a ``python -m podcost`` process with the container's arguments and
environment (``tests/support/services.py``). Only the topic names and the aggregator's app id
are the test's own, so that no other test's records or consumer groups meet these.

Each cluster has two opted-in Deployments of the same names in a namespace of the same name
(so the decisions of the two clusters differ only by their cluster), placed unevenly over three
zones by node capacity. Then:

- every pod of every opted-in workload in both clusters carries the cost podcost decides for it,
  written by podcost's field manager;
- each cluster's annotator read its own costs topic and nothing else (``/metrics``);
- a costs record for cluster ``a`` (naming cluster ``b``'s pods), and one for cluster ``b``
  misrouted onto ``a``'s topic, are handled by ``a``'s annotator and cause no request to cluster
  ``b``: ``b``'s annotator counted nothing new, ``b``'s API server served no pod GET or PATCH, and
  ``b``'s pods are unchanged;
- scaling every Deployment in on the real kube-controller-manager leaves each with the least
  zone skew possible.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import ControlPlane
from tests.support.costs import Desire, desired, publish_costs
from tests.support.kube import COST_ANNOTATION, KubeTestCluster, costed_by_podcost
from tests.support.services import (
    ServiceProcess,
    ServiceSpec,
    assert_alive,
    chart_policy,
    chart_specs,
    parse_metrics,
    processes,
    sample,
    series,
)
from tests.support.tools import require_helm

from podcost_bus import BusSettings, KafkaBus
from podcost_core.policy import DEFAULT_POLICY, policy_from_annotations
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Layout:
    """One Deployment: its replicas, the nodes that take them (zone, pod capacity), and the
    replicas it is scaled in to. The capacities add up to the replicas, so the scheduler has
    exactly one way to place them, and it is uneven."""

    replicas: int
    nodes: tuple[tuple[str, int], ...]
    scale_to: int

    def start(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for zone, capacity in self.nodes:
            counts[zone] = counts.get(zone, 0) + capacity
        return counts


LAYOUTS: dict[str, dict[str, Layout]] = {
    "a": {
        "web": Layout(12, (("zone-a", 3), ("zone-a", 3), ("zone-b", 3), ("zone-c", 3)), 6),
        "api": Layout(7, (("zone-a", 1), ("zone-b", 2), ("zone-b", 2), ("zone-c", 2)), 4),
    },
    "b": {
        "web": Layout(9, (("zone-a", 2), ("zone-b", 2), ("zone-c", 3), ("zone-c", 2)), 4),
        "api": Layout(6, (("zone-a", 4), ("zone-b", 1), ("zone-c", 1)), 3),
    },
}


@dataclass
class Cluster:
    """One cluster of the fleet: its name, API, kubeconfig, and node → zone of its test nodes."""

    name: str
    kube: KubeTestCluster
    kubeconfig: Path
    nodes: dict[str, str] = dataclasses.field(default_factory=dict)


def _least_skew(counts: Mapping[str, int], deletions: int) -> int:
    left = sorted(counts.values())
    for _ in range(deletions):
        left[-1] -= 1
        left.sort()
    return left[-1] - left[0]


def _skew(counts: Mapping[str, int]) -> int:
    return max(counts.values()) - min(counts.values())


async def _prepare(cluster: Cluster, namespace: str, run: str) -> None:
    """The namespace, the nodes of every Deployment and the Deployments, all pods Ready."""
    await cluster.kube.create_namespace(namespace)
    creating = []
    for app, layout in LAYOUTS[cluster.name].items():
        for index, (zone, capacity) in enumerate(layout.nodes):
            node = f"{run}-{app}-{index}"
            cluster.nodes[node] = zone
            creating.append(cluster.kube.create_node(
                node, zone=zone, pods=str(capacity), labels={"fleet": f"{run}-{app}"}
            ))  # fmt: skip
    await asyncio.gather(*creating)
    for app, layout in LAYOUTS[cluster.name].items():
        await cluster.kube.create_deployment(
            namespace, app, layout.replicas, opt_in=True, node_selector={"fleet": f"{run}-{app}"}
        )
    await asyncio.gather(*(
        cluster.kube.wait_ready(namespace, app, layout.replicas)
        for app, layout in LAYOUTS[cluster.name].items()
    ))  # fmt: skip


async def _zones(cluster: Cluster, namespace: str, app: str) -> dict[str, int]:
    counts = dict.fromkeys(sorted(set(cluster.nodes.values())), 0)
    for pod in await cluster.kube.active_pods(namespace, app):
        assert pod.node is not None
        counts[cluster.nodes[pod.node]] += 1
    return counts


async def _left_to_write(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """Per opted-in Deployment, what podcost would still write (empty when converged)."""
    objects = load_objects(await Kube(cluster.kube.api).dump(namespace))
    left: dict[str, Any] = {}
    for app in LAYOUTS[cluster.name]:
        snapshot = snapshot_for_workload(objects, namespace, app, "Deployment")
        active = [pod for pod in snapshot.pods if pod.active]
        # The chart's policy file is every component's default.
        policy = policy_from_annotations(snapshot.annotations, default=chart_policy())
        result = simulate(snapshot, len(active), time.time(), policy=policy)
        if result.writes:  # a pod without the annotation may keep the 0 it reads as
            left[app] = {"writes": result.writes}
    return left


async def _pod_versions(cluster: Cluster, namespace: str) -> dict[str, str]:
    listed = await cluster.kube.core.list_namespaced_pod(namespace)
    return {pod.metadata.name: pod.metadata.resource_version for pod in listed.items}


async def _pod_requests(cluster: Cluster) -> dict[str, float]:
    """The API server's own count of single-pod GETs and PATCHes (not status): the only pod
    requests an annotator makes; nothing else of the test's clusters sends them."""
    response = await cluster.kube.api.call_api(
        "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False
    )
    try:
        assert response.status == 200, f"GET /metrics of cluster {cluster.name}: {response.status}"
        text = (await response.read()).decode()
    finally:
        response.release()
    counts = {"GET": 0.0, "PATCH": 0.0}
    for labels, value in series(parse_metrics(text), "apiserver_request_total"):
        pod_itself = labels.get("resource") == "pods" and not labels.get("subresource")
        if pod_itself and labels.get("verb") in counts:
            counts[labels["verb"]] += value
    return counts


def _consumed(metrics: Mapping[str, float]) -> dict[tuple[str, str], float]:
    """The annotator's records consumed, by (topic, outcome); the series it starts at 0 (so an
    alert sees the first increase) count only once they counted something."""
    return {
        (labels["topic"], labels["outcome"]): value
        for labels, value in series(metrics, "podcost_messages_consumed_total")
        if value
    }


async def test_two_clusters_one_core_cost_every_pod_and_keep_each_clusters_requests_its_own(
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    second_control_plane: ControlPlane,
    kube: KubeTestCluster,
    second_kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    helm = require_helm()
    run = f"fleet-{uuid.uuid4().hex[:6]}"
    namespace = run
    clusters = {
        "a": Cluster("a", kube, control_plane.kubeconfig),
        "b": Cluster("b", second_kube, second_control_plane.kubeconfig),
    }
    bus_settings = BusSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_workloads=f"{run}.workloads", topic_ranks=f"{run}.ranks",
        topic_costs=f"{run}.costs", topic_deadletter=f"{run}.deadletter",
    )  # fmt: skip
    topics = bus_settings.topics
    kafka = {"bootstrapServers": kafka_bootstrap}

    core = chart_specs(helm, {"mode": "core", "kafka": kafka}, prefix="core/")
    assert sorted(s.name for s in core) == sorted(
        ["core/aggregator", *(f"core/ranker-{name}" for name in DEFAULT_POLICY.names)]
    )
    specs: list[ServiceSpec] = list(core)
    for name, cluster in clusters.items():
        values = {"mode": "agent", "clusterName": name, "kafka": kafka,
                  "watch": {"namespace": namespace}}  # fmt: skip
        for spec in chart_specs(helm, values, prefix=f"{name}/"):
            env = {**spec.env, "KUBECONFIG": str(cluster.kubeconfig)}
            specs.append(dataclasses.replace(spec, env=env))
    env = {
        "PODCOST_TOPIC_WORKLOADS": topics.workloads,
        "PODCOST_TOPIC_RANKS": topics.ranks,
        "PODCOST_TOPIC_COSTS": topics.costs,
        "PODCOST_TOPIC_DEADLETTER": topics.deadletter,
        # faust's consumer group and changelog topics: this run's own.
        "PODCOST_AGGREGATOR_APP_ID": f"{run}-aggregator",
    }

    # The clusters are prepared while the processes import and connect (seconds each).
    setup = asyncio.ensure_future(
        asyncio.gather(*(_prepare(c, namespace, run) for c in clusters.values()))
    )
    try:
        async with processes(specs, env=env, log_dir=tmp_path, ready_timeout=240) as running:
            await setup
            # Indicative only (imports of a dozen processes share the machine's cores).
            ready = {name: round(p.ready_after or 0, 1) for name, p in running.items()}
            print(f"fleet processes ready after (s): {ready}")
            await _fleet_checks(clusters, running, namespace, bus_settings)
    finally:
        if not setup.done():
            setup.cancel()
        await asyncio.gather(setup, return_exceptions=True)
        await asyncio.gather(*(_clean(cluster, namespace) for cluster in clusters.values()))


async def _clean(cluster: Cluster, namespace: str) -> None:
    await cluster.kube.delete_namespace(namespace)
    await cluster.kube.delete_nodes(list(cluster.nodes))


async def _fleet_checks(
    clusters: Mapping[str, Cluster],
    running: Mapping[str, ServiceProcess],
    namespace: str,
    bus_settings: BusSettings,
) -> None:
    topics = bus_settings.topics
    a, b = clusters["a"], clusters["b"]
    annotator = {name: running[f"{name}/annotator"] for name in clusters}

    # 1. Every pod of every opted-in workload, in both clusters, gets the cost podcost decides.
    for cluster in clusters.values():
        left: dict[str, Any] = {}

        async def converged(cluster: Cluster = cluster) -> bool:
            nonlocal left
            assert_alive(running)
            left = await _left_to_write(cluster, namespace)
            return not left

        try:
            await cluster.kube.wait_for(converged, f"cluster {cluster.name} costed", 120, 0.5)
        except AssertionError as error:
            error.add_note(f"still to write in cluster {cluster.name}: {left}")
            raise
        costed = 0
        for app in LAYOUTS[cluster.name]:
            pods = await cluster.kube.active_pods(namespace, app)
            # podcost's cost, or none: the 0 a missing annotation reads as, where 0 fits.
            assert all(costed_by_podcost(pod.raw)
                       or COST_ANNOTATION not in (pod.raw.metadata.annotations or {})
                       for pod in pods), (cluster.name, app)  # fmt: skip
            costed += sum(costed_by_podcost(pod.raw) for pod in pods)
        assert costed, f"podcost wrote no cost in cluster {cluster.name}"

    # 2. Each cluster's annotator read its own costs topic, every record about its own cluster.
    for name in clusters:
        consumed = _consumed(await annotator[name].metrics())
        assert consumed, f"the annotator of {name} consumed nothing"
        assert {topic for topic, _ in consumed} == {topics.costs_for(name)}, consumed
        assert {outcome for _, outcome in consumed} == {"ok"}, consumed

    # 3. Records for cluster a cause no request to cluster b's API server.
    b_pods = await b.kube.active_pods(namespace, "web")

    async def b_state() -> tuple[Any, ...]:
        """What a request to cluster b by its annotator would change."""
        metrics = await annotator["b"].metrics()
        return (_consumed(metrics), sample(metrics, "podcost_patches_total"),
                await _pod_requests(b), await _pod_versions(b, namespace))  # fmt: skip

    # b settled first (a decision still in flight there would be b's own business).
    b_before = await b_state()

    async def b_quiet() -> bool:
        nonlocal b_before
        previous, b_before = b_before, await b_state()
        return b_before == previous

    await b.kube.wait_for(b_quiet, "cluster b quiet", timeout=30, interval=1.0)
    a_before = await annotator["a"].metrics()
    named = [Desire(pod.name, pod.uid, cost=index) for index, pod in enumerate(b_pods)]
    async with KafkaBus(bus_settings) as bus:
        # About cluster a, naming b's pods, on a's topic: a's annotator looks them up in a.
        await publish_costs(bus, topics.costs_for("a"),
                            desired(namespace, "web", named, cluster="a"))  # fmt: skip
        # About cluster b, misrouted onto a's topic: a's annotator refuses it.
        await publish_costs(bus, topics.costs_for("a"),
                            desired(namespace, "web", named, cluster="b"))  # fmt: skip

    async def a_handled_both() -> bool:
        assert_alive(running)
        now = await annotator["a"].metrics()
        gone = sample(now, "podcost_patches_total", result="gone") - sample(
            a_before, "podcost_patches_total", result="gone"
        )
        refused = sample(now, "podcost_messages_consumed_total", outcome="other_cluster")
        return gone >= len(named) and refused == 1

    # Handled: b's pods looked up in a and not found there, the misrouted record refused.
    await a.kube.wait_for(a_handled_both, "cluster a's annotator to handle both records", 60)
    consumed, patches, requests, versions = await b_state()
    assert consumed == b_before[0], "cluster b's annotator consumed a record meant for a"
    assert patches == b_before[1], "cluster b's annotator sent a request for a record meant for a"
    assert requests == b_before[2], "cluster b's API server served a pod GET or PATCH"
    assert versions == b_before[3], "a pod of cluster b changed"

    # 4. Scale-in on the real controller leaves every Deployment with the least skew possible.
    async def scale_in(cluster: Cluster, app: str, layout: Layout) -> tuple[str, str, Any]:
        start = await _zones(cluster, namespace, app)
        assert start == {**dict.fromkeys(start, 0), **layout.start()}, (cluster.name, app, start)
        await cluster.kube.scale_and_observe(namespace, app, layout.scale_to)
        after = await _zones(cluster, namespace, app)
        least = _least_skew(start, layout.replicas - layout.scale_to)
        return cluster.name, app, (start, after, least)

    outcomes = await asyncio.gather(*(
        scale_in(cluster, app, layout)
        for cluster in clusters.values()
        for app, layout in LAYOUTS[cluster.name].items()
    ))  # fmt: skip
    assert_alive(running)
    for cluster_name, app, (start, after, least) in outcomes:
        assert _skew(after) == least, f"{cluster_name}/{app}: {start} → {after}, least {least}"
