"""Karpenter scenarios: a Deployment Karpenter provisions nodes for, scaled in with podcost
(embedded) or without it, and Karpenter's answer as :class:`tests.support.karpenter.Outcome`.

Used by the node-autoscaler e2e tests (``tests/e2e/test_karpenter_consolidation.py``) and their
benchmark (``tests/bench/bench_karpenter.py``), so both run the very same scenarios.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podcost.embedded import bootstrap
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_core.model import CostOwner
from podcost_core.policy import DEFAULT_POLICY, policy_from_annotations
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube
from tests.support import karpenter as k
from tests.support.kube import KubeTestCluster

#: The pools' ``consolidateAfter``: short, so a scenario settles in a minute or two.
CONSOLIDATE_AFTER = 5.0

#: A spot pool Karpenter prefers, capped at two nodes, and an on-demand pool for the rest.
MIXED_POOLS = (
    {"name": "spot", "capacity_types": ("spot",), "weight": 50, "cpu_limit": "8"},
    {"name": "on-demand", "capacity_types": ("on-demand",)},
)


@dataclass(frozen=True)
class Loop:
    """The Karpenter cluster as the tests drive it."""

    cluster: k.Autoscaled
    kube: KubeTestCluster
    podcost: Kube


@contextlib.asynccontextmanager
async def podcost_embedded(
    loop: Loop, namespace: str, kafka: str | None = None
) -> AsyncIterator[None]:
    """podcost's pipeline watching ``namespace``, ready when it yields: over an in-memory bus,
    or with ``kafka`` (a bootstrap address) over the real broker on topics of its own."""
    bus_settings = BusSettings()
    if kafka is not None:
        bus_settings = BusSettings(
            bootstrap_servers=kafka, topic_workloads=f"w-{namespace}", topic_ranks=f"r-{namespace}",
            topic_costs=f"c-{namespace}", topic_deadletter=f"d-{namespace}",
        )  # fmt: skip
    pipeline = bootstrap(
        ServiceSettings(cluster="karpenter", http_port=0),
        bus_settings,
        kube=loop.podcost,
        bus=None if kafka is not None else MemoryBus(),
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


async def converged(loop: Loop, namespace: str, app: str, timeout: float = 90) -> None:
    """Wait until podcost has written, on every active pod of ``app``, the cost the current
    ranking gives it (nothing left to write)."""
    deadline = time.monotonic() + timeout
    while True:
        objects = load_objects(await loop.podcost.dump(namespace))
        snapshot = snapshot_for_workload(objects, namespace, app, "Deployment")
        active = [pod for pod in snapshot.pods if pod.active]
        policy = policy_from_annotations(snapshot.annotations, default=DEFAULT_POLICY)
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
    podcost: bool,
    strategies: str | None = None,
    before_scale_in: Hook | None = None,
    after_scale_in: Hook | None = None,
    spread_zones: bool = False,
    kafka: str | None = None,
) -> k.Outcome:
    """A Deployment of ``replicas`` pods Karpenter provisions nodes for, scaled in to ``to``
    with podcost (embedded, ``strategies`` as its policy; over the broker at ``kafka`` if given)
    or without; Karpenter's answer.
    ``before_scale_in`` runs once the pods are placed (podcost then writes its costs before the
    scale-in), ``after_scale_in`` once the controller has deleted its pods."""
    kube = loop.kube
    namespace = await kube.create_namespace(f"k-{uuid.uuid4().hex[:6]}")
    annotations = {"podcost.dev/strategies": strategies} if strategies else {}
    metrics = loop.cluster.karpenter.metrics
    try:
        async with contextlib.AsyncExitStack() as stack:
            ledger = await stack.enter_async_context(k.Ledger(kube, namespace))
            if podcost:
                await stack.enter_async_context(podcost_embedded(loop, namespace, kafka))
            await kube.create_deployment(
                namespace, "web", replicas, opt_in=podcost, annotations=annotations,
                pod_spec_extra=k.pod_spec(spread_zones=spread_zones),
            )  # fmt: skip
            await kube.wait_ready(namespace, "web", replicas, timeout=180)
            await k.wait_stable(ledger, metrics, quiet=CONSOLIDATE_AFTER)
            if before_scale_in is not None:
                await before_scale_in(loop, ledger, namespace)
            if podcost:
                await converged(loop, namespace, "web")
            after = None
            if after_scale_in is not None:
                hook = after_scale_in

                async def after() -> None:
                    await hook(loop, ledger, namespace)

            return await k.scale_in(
                ledger, metrics, "web", to, zones=k.ZONES, quiet=CONSOLIDATE_AFTER,
                after_scale_in=after,
            )  # fmt: skip
    finally:
        await kube.delete_namespace(namespace)


async def fresh_pools(loop: Loop, pools: Sequence[Mapping[str, Any]]) -> None:
    """Remove every NodePool with its nodes, then create ``pools`` (``k.node_pool`` args)."""
    await k.delete_node_pools(loop.kube.api, loop.kube)
    for pool in pools:
        await k.node_pool(loop.kube.api, consolidate_after=f"{CONSOLIDATE_AFTER:.0f}s", **pool)
