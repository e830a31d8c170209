"""Karpenter scenarios: a Deployment Karpenter provisions nodes for, scaled in with podcost or
without it, and Karpenter's answer as :class:`tests.support.karpenter.Outcome`.

podcost runs in one of two ways, as a scenario's ``podcost`` says:

- :class:`Embedded`: its services in the test's process (``podcost run``'s composition) over an
  in-memory bus, or over the real broker; costs in the wide band unless told otherwise;
- :class:`Fleet`: the fleet's own processes as the Helm chart renders them, a core started once
  (:func:`fleet_core`: one ranker per strategy and the aggregator) and one agent per scenario
  (:func:`fleet_agent`: watcher and annotator, with the Karpenter control plane's kubeconfig),
  each scenario a cluster of its own on the core; costs in the chart's band.

Used by the node-autoscaler e2e tests (``tests/e2e/test_karpenter_consolidation.py``) and their
benchmark (``tests/bench/bench_karpenter.py``), so both run the very same scenarios.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from podcost.embedded import bootstrap
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_core.labels import band_for
from podcost_core.model import CostOwner
from podcost_core.policy import Policy, policy_from_annotations
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube
from tests.support import karpenter as k
from tests.support.kube import KubeTestCluster
from tests.support.services import (
    ServiceProcess,
    assert_alive,
    chart_policy,
    chart_policy_document,
    chart_specs,
    processes,
)

#: The pools' ``consolidateAfter``: short, so a scenario settles in a minute or two.
CONSOLIDATE_AFTER = 5.0

#: A spot pool Karpenter prefers, capped at two nodes, and an on-demand pool for the rest.
MIXED_POOLS = (
    {"name": "spot", "capacity_types": ("spot",), "weight": 50, "cpu_limit": "8"},
    {"name": "on-demand", "capacity_types": ("on-demand",)},
)

#: Strategies the scenarios name that the chart's default policy has no ranker for.
EXTRA_STRATEGIES = ("karpenter",)


def band_name(non_negative_costs: bool) -> str:
    """The cost band in a word and its bounds, for printouts."""
    band = band_for(non_negative_costs)
    return f"[{band.low}, 2^27)" if non_negative_costs else f"±{band.high:.0e}"


@dataclass(frozen=True)
class Embedded:
    """podcost's services in the test's process."""

    kafka: str | None = None
    """The broker's bootstrap address to join the services over (topics of the scenario's
    own), or ``None`` for the in-memory bus."""
    non_negative_costs: bool = False
    """The band: the built-in default policy's wide one, or (a policy file of the chart's
    policy, ``non_negative_costs: true``) the chart's."""

    @property
    def default_policy(self) -> Policy:
        return chart_policy(self.non_negative_costs)

    @property
    def label(self) -> str:
        how = "embedded over Kafka" if self.kafka else "embedded"
        return f"{how}, {band_name(self.non_negative_costs)}"


@dataclass(frozen=True)
class Fleet:
    """A running fleet core that agents join (:func:`fleet_core`)."""

    helm: Path
    kafka: str
    env: Mapping[str, str]
    """Topics and the aggregator's app id of this core: every agent gets the same."""
    log_dir: Path
    non_negative_costs: bool
    """``policy.nonNegativeCosts`` the core and its agents are rendered with."""
    running: Mapping[str, ServiceProcess]

    @property
    def default_policy(self) -> Policy:
        return chart_policy(self.non_negative_costs)

    @property
    def label(self) -> str:
        return f"fleet, {band_name(self.non_negative_costs)}"


Podcost = Embedded | Fleet


@dataclass(frozen=True)
class Loop:
    """The Karpenter cluster as the tests drive it."""

    cluster: k.Autoscaled
    kube: KubeTestCluster
    podcost: Kube


@contextlib.asynccontextmanager
async def podcost_embedded(loop: Loop, namespace: str, mode: Embedded) -> AsyncIterator[None]:
    """podcost's pipeline watching ``namespace``, ready when it yields (see :class:`Embedded`)."""
    bus_settings = BusSettings()
    if mode.kafka is not None:
        bus_settings = BusSettings(
            bootstrap_servers=mode.kafka, topic_workloads=f"w-{namespace}",
            topic_ranks=f"r-{namespace}", topic_costs=f"c-{namespace}",
            topic_deadletter=f"d-{namespace}",
        )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="podcost-policy-") as scratch:
        policy_file = None
        if mode.non_negative_costs:
            policy_file = Path(scratch) / "policy.json"
            policy_file.write_text(json.dumps(chart_policy_document(non_negative=True)))
        settings = ServiceSettings(cluster="karpenter", http_port=0, policy_file=policy_file)
        pipeline = bootstrap(
            settings,
            bus_settings,
            kube=loop.podcost,
            bus=None if mode.kafka is not None else MemoryBus(),
            watcher_settings=WatcherSettings(
                namespace=namespace, debounce_seconds=0.2, max_delay_seconds=1.0
            ),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(
            serve(pipeline.services, ServiceSettings(http_port=0), bus=pipeline.bus, stop=stop)
        )

        async def ready() -> bool:
            if task.done():
                task.result()
            return all(service.ready() for service in pipeline.services)

        try:
            await loop.kube.wait_for(ready, "every podcost service ready", timeout=60)
            yield
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)


@contextlib.asynccontextmanager
async def fleet_core(
    helm: Path, kafka: str, log_dir: Path, *, non_negative_costs: bool = True
) -> AsyncIterator[Fleet]:
    """The chart in ``core`` mode (one ranker per strategy of its default policy and of
    :data:`EXTRA_STRATEGIES`, and the aggregator), each container a process, on topics and an
    aggregator app id of its own; stopped at the end."""
    run = f"karpenter-{uuid.uuid4().hex[:6]}"
    env = {
        "PODCOST_TOPIC_WORKLOADS": f"{run}.workloads",
        "PODCOST_TOPIC_RANKS": f"{run}.ranks",
        "PODCOST_TOPIC_COSTS": f"{run}.costs",
        "PODCOST_TOPIC_DEADLETTER": f"{run}.deadletter",
        # faust's consumer group and changelog topics: this core's own.
        "PODCOST_AGGREGATOR_APP_ID": f"{run}-aggregator",
    }
    values = {
        "mode": "core", "kafka": {"bootstrapServers": kafka},
        "rankers": {"extraStrategies": list(EXTRA_STRATEGIES)},
        "policy": {"nonNegativeCosts": non_negative_costs},
    }  # fmt: skip
    specs = await asyncio.to_thread(chart_specs, helm, values, prefix="core/")
    async with processes(specs, env=env, log_dir=log_dir / "core", ready_timeout=240) as running:
        yield Fleet(helm, kafka, env, log_dir, non_negative_costs, running)


@contextlib.asynccontextmanager
async def fleet_agent(
    loop: Loop, fleet: Fleet, namespace: str
) -> AsyncIterator[Mapping[str, ServiceProcess]]:
    """The chart in ``agent`` mode for a cluster named after ``namespace`` (it watches that
    namespace of the Karpenter control plane, its Lease there too), joined to ``fleet``; ready
    when it yields, stopped at the end."""
    values = {
        "mode": "agent", "clusterName": namespace, "kafka": {"bootstrapServers": fleet.kafka},
        "watch": {"namespace": namespace},
        "policy": {"nonNegativeCosts": fleet.non_negative_costs},
    }  # fmt: skip
    rendered = await asyncio.to_thread(
        chart_specs, fleet.helm, values, prefix=f"{namespace}/", namespace=namespace
    )
    kubeconfig = str(loop.cluster.plane.kubeconfig)
    specs = [dataclasses.replace(s, env={**s.env, "KUBECONFIG": kubeconfig}) for s in rendered]
    async with processes(
        specs, env=fleet.env, log_dir=fleet.log_dir / namespace, ready_timeout=240
    ) as running:
        yield running


@contextlib.asynccontextmanager
async def podcost_running(
    loop: Loop, namespace: str, podcost: Podcost
) -> AsyncIterator[Callable[[], None]]:
    """podcost for ``namespace`` as ``podcost`` says; yields a check that fails when one of its
    processes has stopped by itself (nothing to check for the embedded pipeline)."""
    if isinstance(podcost, Embedded):
        async with podcost_embedded(loop, namespace, podcost):
            yield lambda: None
        return
    async with fleet_agent(loop, podcost, namespace) as agent:
        yield lambda: assert_alive([*podcost.running.values(), *agent.values()])


async def converged(
    loop: Loop,
    namespace: str,
    app: str,
    default: Policy,
    *,
    alive: Callable[[], None] = lambda: None,
    timeout: float = 90,
) -> None:
    """Wait until podcost has written, on every active pod of ``app``, the cost the current
    ranking gives it (nothing left to write) under the cluster default ``default``."""
    deadline = time.monotonic() + timeout
    while True:
        alive()
        objects = load_objects(await loop.podcost.dump(namespace))
        snapshot = snapshot_for_workload(objects, namespace, app, "Deployment")
        active = [pod for pod in snapshot.pods if pod.active]
        policy = policy_from_annotations(snapshot.annotations, default=default)
        result = simulate(snapshot, len(active), time.time(), policy=policy)
        if not result.writes and any(pod.cost_owner is CostOwner.PODCOST for pod in active):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"podcost did not converge: still to write {result.writes}")
        await asyncio.sleep(0.25)


Hook = Callable[[Loop, k.Ledger, str], Awaitable[None]]


async def scenario(
    loop: Loop,
    *,
    replicas: int,
    to: int,
    podcost: Podcost | None,
    strategies: str | None = None,
    before_scale_in: Hook | None = None,
    after_scale_in: Hook | None = None,
    spread_zones: bool = False,
) -> k.Outcome:
    """A Deployment of ``replicas`` pods Karpenter provisions nodes for, scaled in to ``to``
    with podcost (``strategies`` as its policy, run as ``podcost`` says) or without; Karpenter's
    answer, its ``podcost`` naming how podcost ran and its band.
    ``before_scale_in`` runs once the pods are placed (podcost then writes its costs before the
    scale-in), ``after_scale_in`` once the controller has deleted its pods."""
    kube = loop.kube
    namespace = await kube.create_namespace(f"k-{uuid.uuid4().hex[:6]}")
    annotations = {"podcost.dev/strategies": strategies} if strategies else {}
    metrics = loop.cluster.karpenter.metrics
    try:
        async with contextlib.AsyncExitStack() as stack:
            ledger = await stack.enter_async_context(k.Ledger(kube, namespace))
            alive: Callable[[], None] = lambda: None  # noqa: E731
            if podcost is not None:
                alive = await stack.enter_async_context(podcost_running(loop, namespace, podcost))
            await kube.create_deployment(
                namespace, "web", replicas, opt_in=podcost is not None, annotations=annotations,
                pod_spec_extra=k.pod_spec(spread_zones=spread_zones),
            )  # fmt: skip
            await kube.wait_ready(namespace, "web", replicas, timeout=180)
            await k.wait_stable(ledger, metrics, quiet=CONSOLIDATE_AFTER)
            if before_scale_in is not None:
                await before_scale_in(loop, ledger, namespace)
            if podcost is not None:
                await converged(loop, namespace, "web", podcost.default_policy, alive=alive)
            after = None
            if after_scale_in is not None:
                hook = after_scale_in

                async def after() -> None:
                    await hook(loop, ledger, namespace)

            outcome = await k.scale_in(
                ledger, metrics, "web", to, zones=k.ZONES, quiet=CONSOLIDATE_AFTER,
                after_scale_in=after,
            )  # fmt: skip
            alive()
            label = "none" if podcost is None else podcost.label
            return dataclasses.replace(outcome, podcost=label)
    finally:
        await kube.delete_namespace(namespace)


@dataclass(frozen=True)
class Standing:
    """A Deployment left as it is (no scale-in) once podcost has costed it, and what Karpenter
    did to its nodes in the window after, read from the API server."""

    podcost: str
    pods: int
    nodes: int
    """Karpenter's nodes once the pods were placed and costed."""
    seen_empty: tuple[str, ...]
    """The nodes Karpenter reads as empty then: every pod on them counts 0 or less."""
    pods_counting_nothing: int
    """Pods whose eviction cost, as Karpenter computes it, is 0 or less."""
    lowest_count: float
    """The lowest of those eviction costs."""
    removed: tuple[str, ...]
    """Nodes removed in the window."""
    removed_holding_pods: tuple[str, ...]
    """Of those, nodes the workload's running pods were evicted from by Karpenter's drain."""
    evictions: int
    disrupted_as_empty: int
    """NodeClaims Karpenter disrupted in the window for the reason ``Empty``, by its own count
    (``karpenter_nodeclaims_disrupted_total``)."""
    event_reasons: Mapping[str, str]
    """Removed node → the reason of Karpenter's ``DisruptionTerminating`` event for it, for
    those whose event reached the API server (its recorder drops some under a burst)."""
    window_seconds: float

    def row(self) -> dict[str, object]:
        return {
            "podcost": self.podcost, "pods": self.pods, "nodes": self.nodes,
            "seen_empty": len(self.seen_empty), "pods_count_le_0": self.pods_counting_nothing,
            "lowest_count": round(self.lowest_count, 2),
            "removed": len(self.removed), "removed_holding_pods": len(self.removed_holding_pods),
            "evictions": self.evictions, "disrupted_as_empty": self.disrupted_as_empty,
            "events": dict(collections.Counter(self.event_reasons.values())),
            "window_s": round(self.window_seconds),
        }  # fmt: skip


async def poke_pools(loop: Loop) -> None:
    """Change every NodePool's spec (its weight), which is what makes Karpenter forget that it
    found nothing to consolidate (``MarkUnconsolidated``): a pod's annotation change does not,
    so without it Karpenter looks at costs written after its last look only up to five minutes
    later. On a busy cluster any pod binding does the same."""
    custom = client.CustomObjectsApi(loop.kube.api)
    pools = await custom.list_cluster_custom_object(*k.KARPENTER, "nodepools")
    for pool in pools["items"]:
        weight = int(pool["spec"].get("weight") or 0) % 100 + 1
        await custom.patch_cluster_custom_object(
            *k.KARPENTER,
            "nodepools",
            pool["metadata"]["name"],
            {"spec": {"weight": weight}},
            _content_type="application/merge-patch+json",
        )


async def standing(loop: Loop, *, replicas: int, podcost: Podcost, window: float = 240) -> Standing:
    """``replicas`` pods in zone spread (so Karpenter's nodes are even over the zones), opted in
    once Karpenter has placed them and costed by podcost's default policy, and no scale-in.
    Karpenter is then made to look again (:func:`poke_pools`); the window ends when every node
    it reads as empty is gone, or after two of its disruption loops that did nothing (and
    ``CONSOLIDATE_AFTER`` quiet), or after ``window`` seconds."""
    kube = loop.kube
    namespace = await kube.create_namespace(f"k-{uuid.uuid4().hex[:6]}")
    metrics = loop.cluster.karpenter.metrics
    try:
        async with contextlib.AsyncExitStack() as stack:
            ledger = await stack.enter_async_context(k.Ledger(kube, namespace))
            alive = await stack.enter_async_context(podcost_running(loop, namespace, podcost))
            await kube.create_deployment(
                namespace, "web", replicas, pod_spec_extra=k.pod_spec(spread_zones=True)
            )
            await kube.wait_ready(namespace, "web", replicas, timeout=600)
            await k.wait_stable(ledger, metrics, quiet=CONSOLIDATE_AFTER)
            # Opted in once running, as on a cluster podcost is installed on: its first costing
            # ranks every pod at once (costs given as pods arrive fill gaps nearer the middle).
            opt_in = {"metadata": {"annotations": {"podcost.dev/enabled": "true"}}}
            await kube.apps.patch_namespaced_deployment("web", namespace, opt_in)
            await converged(
                loop, namespace, "web", podcost.default_policy, alive=alive, timeout=300
            )
            by_node: dict[str, list[Any]] = {}
            for pod in await kube.active_pods(namespace, "web"):
                by_node.setdefault(pod.node or "", []).append(pod.raw)
            counts = [k.eviction_cost(pod) for pods in by_node.values() for pod in pods]
            seen_empty = sorted(n for n, pods in by_node.items() if k.reschedule_cost(pods) <= 1)
            nodes = len(ledger.live_nodes())
            empty_before = await asyncio.to_thread(k.karpenter_disrupted, metrics, "empty")
            since = time.monotonic()
            await poke_pools(loop)

            async def emptied() -> bool:
                alive()
                return all(ledger.nodes[name].deleted is not None for name in seen_empty)

            settle = asyncio.ensure_future(
                k.wait_stable(ledger, metrics, quiet=CONSOLIDATE_AFTER, since=since,
                              timeout=window)
            )  # fmt: skip
            try:
                deadline = since + window
                while not (seen_empty and await emptied()) and not settle.done():
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
            finally:
                settle.cancel()
                await asyncio.gather(settle, return_exceptions=True)
            ended = time.monotonic()
            removed = ledger.removed(since)
            evicted_from = {d.node for d in ledger.evictions(since)}
            gone = {r.name for r in removed}
            reasons: dict[str, str] = {}

            async def events() -> bool:
                reasons.update(await k.disruption_reasons(kube))
                return gone <= set(reasons)

            # Events reach the API server asynchronously, and a burst loses some: best effort.
            with contextlib.suppress(AssertionError):
                await kube.wait_for(events, "Karpenter's events for the removed nodes", 15, 1.0)
            empty = await asyncio.to_thread(k.karpenter_disrupted, metrics, "empty")
            alive()
            return Standing(
                podcost=podcost.label, pods=replicas, nodes=nodes, seen_empty=tuple(seen_empty),
                pods_counting_nothing=sum(1 for count in counts if count <= 0),
                lowest_count=min(counts, default=1.0),
                removed=tuple(sorted(r.name for r in removed)),
                removed_holding_pods=tuple(sorted(r.name for r in removed
                                                  if r.name in evicted_from)),
                evictions=len(ledger.evictions(since)),
                disrupted_as_empty=round(empty - empty_before),
                event_reasons={n: reasons[n] for n in sorted(gone & set(reasons))},
                window_seconds=ended - since,
            )  # fmt: skip
    finally:
        await kube.delete_namespace(namespace)


async def fresh_pools(loop: Loop, pools: Sequence[Mapping[str, Any]]) -> None:
    """Remove every NodePool with its nodes, then create ``pools`` (``k.node_pool`` args)."""
    await k.delete_node_pools(loop.kube.api, loop.kube)
    for pool in pools:
        await k.node_pool(loop.kube.api, consolidate_after=f"{CONSOLIDATE_AFTER:.0f}s", **pool)
