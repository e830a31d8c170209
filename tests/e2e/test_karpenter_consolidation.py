"""A real Karpenter (kwok provider) consolidating after the real ReplicaSet controller's scale-ins,
with podcost steering them and without it.

Karpenter runs against a control plane of its own (``tests/support/karpenter.py``), so every node
is one it made from a NodePool (spot and on-demand in three zones, consolidation
``WhenEmptyOrUnderutilized``). What is counted is read from the API server: Karpenter's nodes
made and removed, the pods evicted by its drains (the Eviction API's ``DisruptionTarget``
condition), never podcost's model.

- Karpenter provisions nodes for a pending Deployment and removes them when it scales to 0.
- The KEP-5982 shape: 20 pods Karpenter packed 4 to a node, scaled in to 10. Without podcost the
  controller leaves nodes half full and Karpenter evicts pods to consolidate; with podcost
  (``node-consolidation``) the scale-in empties two nodes and Karpenter removes them without an
  eviction.
- Spot and on-demand pools: ``capacity-type`` first frees the spot nodes, and Karpenter then
  moves the on-demand nodes' pods to new spot nodes (evictions): measured, and asserted as
  Karpenter's answer.
- A node Karpenter is draining during a scale-in: with ``karpenter`` first its pods go and
  nothing is left to evict; ``do-not-disrupt`` pods stay.
- Zone spread and consolidation with the default policy: skew 0, nodes emptied in each zone.
- The cost band: 200 pods costed in the wide band (±1e9) by the default policy, and no scale-in:
  Karpenter reads the nodes whose pods podcost ranks lowest as empty and deletes them, their
  running pods evicted; in the chart's band ([0, 2^27)) it deletes none.

Every scenario with podcost runs twice: ``embedded`` (its services in the test's process) and
``fleet`` (the chart's ``core`` processes, started once for the module, and an ``agent`` per
scenario against the Karpenter control plane), with the same assertions; the runs without
podcost they are compared with are made once per module.

The scenarios themselves are ``tests/support/karpenter_scenarios.py``, shared with
``tests/bench/bench_karpenter.py``.

Long (each scenario waits for Karpenter's consolidation rounds): ``make test-long``.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from tests.conftest import unavailable
from tests.support import karpenter as k
from tests.support.karpenter_scenarios import (
    CONSOLIDATE_AFTER,
    MIXED_POOLS,
    Embedded,
    Fleet,
    Loop,
    Podcost,
    fleet_core,
    fresh_pools,
    scenario,
    standing,
)
from tests.support.kube import KubeTestCluster
from tests.support.tools import require_helm

from podcost_kube.client import Kube
from podcost_localinfra import build, process

pytestmark = [pytest.mark.e2e, pytest.mark.long]


@pytest.fixture(scope="module")
def autoscaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[k.Autoscaled]:
    try:
        started = k.start_autoscaled(tmp_path_factory.mktemp("karpenter"))
    except (build.BuildError, process.StartError, OSError) as error:
        unavailable(f"Karpenter on its control plane is unavailable: {error}")
    yield started
    started.stop()


@pytest.fixture(scope="module")
async def loop(autoscaled: k.Autoscaled) -> AsyncIterator[Loop]:
    api = await config.new_client_from_config(config_file=str(autoscaled.plane.kubeconfig))
    async with api:
        await k.node_class(api)
        yield Loop(autoscaled, KubeTestCluster(api), Kube(api))


@pytest.fixture(scope="module")
async def fleet(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    """The chart's core processes (in its default band), once for the module."""
    helm = require_helm()
    log_dir = Path(tmp_path_factory.mktemp("karpenter-fleet"))
    async with fleet_core(helm, kafka_bootstrap, log_dir) as core:
        yield core


@pytest.fixture(params=["embedded", "fleet"])
def podcost(request: pytest.FixtureRequest) -> Podcost:
    """How podcost runs: in the test's process, or as the fleet's processes."""
    if request.param == "fleet":
        fleet: Fleet = request.getfixturevalue("fleet")
        return fleet
    return Embedded()


@pytest.fixture(scope="module")
def baselines() -> dict[str, k.Outcome]:
    """The runs without podcost, by scenario: made once, compared with every mode's run."""
    return {}


async def without_podcost(
    baselines: dict[str, k.Outcome], name: str, run: Callable[[], Awaitable[k.Outcome]]
) -> k.Outcome:
    if name not in baselines:
        baselines[name] = await run()
    return baselines[name]


@pytest.fixture
async def pool(loop: Loop) -> AsyncIterator[str]:
    """A NodePool of spot and on-demand nodes in three zones; gone with its nodes afterwards."""
    name = f"pool-{uuid.uuid4().hex[:5]}"
    await k.node_pool(loop.kube.api, name, consolidate_after=f"{CONSOLIDATE_AFTER:.0f}s")
    yield name
    await k.delete_node_pools(loop.kube.api, loop.kube)


async def test_karpenter_provisions_nodes_for_pending_pods_and_removes_them_at_zero(
    loop: Loop, pool: str
) -> None:
    kube = loop.kube
    namespace = await kube.create_namespace(f"k-{uuid.uuid4().hex[:6]}")
    async with k.Ledger(kube, namespace) as ledger:
        await kube.create_deployment(namespace, "web", 8, pod_spec_extra=k.pod_spec())
        pods = await kube.wait_ready(namespace, "web", 8, timeout=180)
        nodes = {record.name: record for record in ledger.live_nodes()}
        assert len(nodes) == 2, nodes
        assert all(record.pool == pool for record in nodes.values())
        assert all(pod.node in nodes for pod in pods)
        assert set(Counter(pod.node for pod in pods).values()) == {4}
        assert all(r.zone in k.ZONES and r.capacity_type for r in nodes.values())

        scaled = time.monotonic()
        await kube.scale(namespace, "web", 0)

        async def none_left() -> bool:
            return not await k.karpenter_nodes(kube)

        await kube.wait_for(none_left, "Karpenter's nodes removed", timeout=180)
        assert {r.name for r in ledger.removed(scaled)} == set(nodes)
        assert ledger.removed_empty(scaled) == ledger.removed(scaled)
        assert not ledger.evictions()
    await kube.delete_namespace(namespace)


async def test_kep_shape_podcost_lets_karpenter_remove_empty_nodes_instead_of_evicting(
    loop: Loop, pool: str, podcost: Podcost, baselines: dict[str, k.Outcome]
) -> None:
    """20 pods on 5 nodes Karpenter made, scaled in to 10 (kubernetes/kubernetes#138718)."""

    async def run() -> k.Outcome:
        return await scenario(loop, replicas=20, to=10, podcost=None)

    without = await without_podcost(baselines, "kep", run)
    await fresh_pools(loop, [{"name": pool}])
    with_podcost = await scenario(
        loop, replicas=20, to=10, podcost=podcost, strategies="node-consolidation"
    )
    print(f"\nKEP shape, without podcost: {without.row()}\nKEP shape, with podcost: "
          f"{with_podcost.row()}")  # fmt: skip
    assert without.nodes_before == with_podcost.nodes_before == 5
    # podcost's scale-in empties two nodes; Karpenter removes them without an eviction.
    assert with_podcost.removed_empty == 2, with_podcost
    assert with_podcost.evictions == 0, with_podcost
    assert with_podcost.nodes_after == 3, with_podcost
    # Without it Karpenter reaches as few nodes only by evicting pods to consolidate.
    assert without.evictions > with_podcost.evictions, without
    assert without.removed_empty < with_podcost.removed_empty, without


async def test_kep_shape_over_kafka_podcost_lets_karpenter_remove_empty_nodes(
    loop: Loop, pool: str, kafka_bootstrap: str
) -> None:
    """The KEP-5982 shape with podcost's services joined by the real Kafka broker."""
    outcome = await scenario(
        loop, replicas=20, to=10, podcost=Embedded(kafka=kafka_bootstrap),
        strategies="node-consolidation",
    )  # fmt: skip
    print(f"\nKEP shape, podcost over Kafka: {outcome.row()}")
    assert outcome.nodes_before == 5, outcome
    assert outcome.removed_empty == 2, outcome
    assert outcome.evictions == 0, outcome
    assert outcome.nodes_after == 3, outcome


async def test_spot_and_on_demand_spot_first_is_refilled_by_karpenter(
    loop: Loop, podcost: Podcost, baselines: dict[str, k.Outcome]
) -> None:
    """16 pods on 2 spot and 2 on-demand nodes, scaled in to 8. ``capacity-type`` first deletes
    the spot pods, so Karpenter removes the two spot nodes empty; but the spot pool has room
    again then, and Karpenter, which minimises price, replaces the on-demand nodes with spot
    ones, evicting their pods: spot first works against Karpenter's own choice of capacity."""

    async def run() -> k.Outcome:
        await fresh_pools(loop, MIXED_POOLS)
        return await scenario(loop, replicas=16, to=8, podcost=None)

    without = await without_podcost(baselines, "spot", run)
    await fresh_pools(loop, MIXED_POOLS)
    with_podcost = await scenario(
        loop, replicas=16, to=8, podcost=podcost, strategies="capacity-type | node-consolidation"
    )
    await k.delete_node_pools(loop.kube.api, loop.kube)
    for name, outcome in (("without", without), ("with", with_podcost)):
        print(f"\nspot/on-demand, {name} podcost: {outcome.row()} removed empty: "
              f"{outcome.removed_empty_capacity} kept: {outcome.kept_capacity}")  # fmt: skip
    assert without.nodes_before == with_podcost.nodes_before == 4
    assert with_podcost.removed_empty_capacity == ("spot", "spot"), with_podcost
    # Karpenter's answer: the on-demand nodes replaced by spot ones, their pods evicted.
    assert "on-demand" not in with_podcost.kept_capacity, with_podcost
    assert with_podcost.evictions > 0, with_podcost


async def test_disrupted_node_podcost_deletes_its_pods_first_and_keeps_do_not_disrupt_pods(
    loop: Loop, pool: str, podcost: Podcost, baselines: dict[str, k.Outcome]
) -> None:
    """12 pods on 3 nodes; Karpenter is draining one node (its NodeClaim deleted: tainted
    ``karpenter.sh/disrupted``, the drain held by a PodDisruptionBudget) and two pods of another
    node are ``do-not-disrupt`` when the Deployment scales in to 8. With ``karpenter`` first,
    the scale-in takes the draining node's pods, so once the budget lets go there is nothing
    left to evict, and the do-not-disrupt pods stay."""
    kept: dict[bool, set[str]] = {}
    running: list[bool] = []  # whether the scenario running now has podcost
    custom = client.CustomObjectsApi(loop.kube.api)
    policy = client.PolicyV1Api(loop.kube.api)

    async def disrupt(loop: Loop, ledger: k.Ledger, namespace: str) -> None:
        budget: Any = {
            "metadata": {"name": "web"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}},
        }
        await policy.create_namespaced_pod_disruption_budget(namespace, budget)
        pods = await loop.kube.active_pods(namespace, "web")
        nodes = sorted({pod.node or "" for pod in pods})
        draining, keeping = nodes[0], nodes[1]
        dnd = sorted(pod.name for pod in pods if pod.node == keeping)[:2]
        for name in dnd:
            await loop.kube.core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": {k.DO_NOT_DISRUPT: "true"}}}
            )
        kept[running[-1]] = set(dnd)
        claim = ledger.nodes[draining].claim
        await custom.delete_cluster_custom_object(*k.KARPENTER, "nodeclaims", claim)

        async def tainted() -> bool:
            return ledger.nodes[draining].disrupted is not None

        await loop.kube.wait_for(tainted, f"{draining} tainted karpenter.sh/disrupted", 60)

    async def release(loop: Loop, ledger: k.Ledger, namespace: str) -> None:
        await policy.delete_namespaced_pod_disruption_budget("web", namespace)

    async def run(podcost: Podcost | None) -> k.Outcome:
        running.append(podcost is not None)
        await fresh_pools(loop, [{"name": pool}])
        return await scenario(
            loop, replicas=12, to=8, podcost=podcost,
            strategies="karpenter | node-consolidation" if podcost else None,
            before_scale_in=disrupt, after_scale_in=release,
        )  # fmt: skip

    without = await without_podcost(baselines, "disrupted", lambda: run(None))
    with_podcost = await run(podcost)
    survivors = kept[True] - with_podcost.deleted
    print(f"\ndisrupted node, without podcost: {without.row()}\ndisrupted node, with podcost: "
          f"{with_podcost.row()} do-not-disrupt pods kept: {len(survivors)}/2")  # fmt: skip
    if False in kept:
        print(f"without podcost, do-not-disrupt pods kept: "
              f"{len(kept[False] - without.deleted)}/2")  # fmt: skip
    assert with_podcost.evictions == 0, with_podcost
    assert survivors == kept[True], (survivors, kept)
    assert with_podcost.evictions <= without.evictions, (with_podcost, without)


async def test_zone_balance_and_consolidation_default_policy_keeps_least_skew(
    loop: Loop, pool: str, podcost: Podcost, baselines: dict[str, k.Outcome]
) -> None:
    """24 pods spread over 3 zones (a zone spread constraint: Karpenter makes 2 nodes in each),
    scaled in to 12 with podcost's default policy (zone spread dominant, node consolidation
    among its ties): the zone skew stays the least possible (0) and nodes empty inside each
    zone, so Karpenter removes them without eviction."""

    async def run(podcost: Podcost | None) -> k.Outcome:
        await fresh_pools(loop, [{"name": pool}])
        return await scenario(loop, replicas=24, to=12, podcost=podcost, spread_zones=True)

    without = await without_podcost(baselines, "zones", lambda: run(None))
    with_podcost = await run(podcost)
    for name, outcome in (("without", without), ("with", with_podcost)):
        print(f"\nzones and consolidation, {name} podcost: {outcome.row()}")
    assert with_podcost.nodes_before == 6, with_podcost
    assert with_podcost.pod_zone_skew == 0, with_podcost
    assert with_podcost.evictions <= without.evictions, (with_podcost, without)
    assert with_podcost.removed_empty >= without.removed_empty, (with_podcost, without)


async def test_the_wide_band_makes_karpenter_delete_nodes_with_running_pods_the_chart_band_none(
    loop: Loop, pool: str
) -> None:
    """200 pods (zone spread) on the 50 nodes Karpenter makes for them, costed by podcost's
    default policy, and no scale-in. In the wide band (±1e9) the pods podcost ranks lowest get
    costs of -2^27 or less, which Karpenter counts as nothing: it reads the nodes holding only
    such pods as empty, and its Emptiness method deletes them under the ``Empty`` reason,
    evicting their running pods. In the chart's band ([0, 2^27)) it removes no node."""
    wide = await standing(loop, replicas=200, podcost=Embedded(non_negative_costs=False))
    await fresh_pools(loop, [{"name": pool}])
    chart = await standing(loop, replicas=200, podcost=Embedded(non_negative_costs=True))
    for outcome in (wide, chart):
        print(f"\nno scale-in, {outcome.podcost}: {outcome.row()}")
    assert wide.seen_empty, wide
    # Karpenter deletes nodes whose pods are running: drained by eviction, reason Empty.
    assert wide.removed_holding_pods, wide
    assert set(wide.seen_empty) <= set(wide.removed), wide
    assert wide.evictions >= 4 * len(wide.seen_empty), wide
    # Karpenter's own record: each was disrupted as Empty.
    assert wide.disrupted_as_empty == len(wide.removed), wide
    assert set(wide.event_reasons.values()) == {"Empty"}, wide
    # The chart's band: no pod counts less than 1, no node looks empty, none is removed.
    assert chart.pods_counting_nothing == 0, chart
    assert not chart.seen_empty, chart
    assert not chart.removed, chart
    assert chart.evictions == 0, chart
    assert chart.disrupted_as_empty == 0, chart
