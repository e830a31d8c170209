"""The demo's comparison and chart, on a cluster like the demo's: the "without podcost" column
is the victim model on the same pods with their costs taken off, the "with podcost" column is
what was deleted, and the chart is a PNG of both."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.support.pods import NOW, READY, pod, with_cost

from podcost.commands.demo_chart import draw
from podcost.commands.demo_compare import compare, places, without_costs
from podcost_core.model import Node, NodeName, Snapshot, WorkloadRef
from podcost_core.policy import policy_from_annotations
from podcost_core.simulate import simulate

NODES = {
    "a1": ("zone-a", "on-demand"), "a2": ("zone-a", "spot"),
    "b1": ("zone-b", "on-demand"), "b2": ("zone-b", "spot"),
    "c1": ("zone-c", "on-demand"), "c2": ("zone-c", "spot"),
}  # fmt: skip
#: 12 pods, zone-c's three started last (it was cordoned): a=5, b=4, c=3.
PLACEMENT = ["a1", "a1", "a1", "a2", "a2", "b1", "b1", "b2", "b2", "c1", "c1", "c2"]


def uneven(strategies: str) -> Snapshot:
    """The demo's layout, with the costs podcost writes for ``strategies`` on the pods."""
    pods = [
        pod(f"web-{index:02d}", node=node, owner_uid="deploy-uid",
            ready_since=READY + (600 if node.startswith("c") else index))
        for index, node in enumerate(PLACEMENT)
    ]  # fmt: skip
    annotations = {"podcost.dev/enabled": "true", "podcost.dev/strategies": strategies}
    snapshot = Snapshot(
        workload=WorkloadRef("demo", "shop", "ReplicaSet", "web-1"),
        pods=tuple(pods),
        nodes={
            name: Node(
                NodeName(name),
                labels={
                    "topology.kubernetes.io/zone": zone,
                    "karpenter.sh/capacity-type": capacity,
                },
            )
            for name, (zone, capacity) in NODES.items()
        },
        annotations=annotations,
    )
    # The costs as the controller reads them once podcost wrote (a pod it leaves without one
    # reads as 0): each pod carries its cost, as the demo reads them back.
    costs = simulate(snapshot, 12, NOW, policy=policy_from_annotations(annotations)).costs
    return replace(snapshot, pods=tuple(with_cost(p, costs[p.name]) for p in snapshot.pods))


def test_without_podcost_is_the_model_on_the_same_pods_with_no_costs() -> None:
    snapshot = uneven("topology-spread")
    assert all(p.deletion_cost_raw is not None for p in snapshot.pods)
    expected = simulate(without_costs(snapshot), 6, NOW, policy=None).victims
    predicted = simulate(snapshot, 6, NOW, policy=None).victims
    comparison = compare(snapshot, 6, [p.name for p in predicted], NOW, strategies="ts")

    assert [p.name for p in comparison.without.deleted] == [p.name for p in expected]
    assert {p.name for p in comparison.with_podcost.deleted} == {p.name for p in predicted}
    assert comparison.as_predicted
    assert comparison.zones_before == {"zone-a": 5, "zone-b": 4, "zone-c": 3}
    assert comparison.with_podcost.zones_after == {"zone-a": 2, "zone-b": 2, "zone-c": 2}
    # Kubernetes alone deletes the doubled-up pods first (rule 5): zone-a's, so the skew grows.
    assert comparison.without.zones_after == {"zone-a": 0, "zone-b": 3, "zone-c": 3}
    assert comparison.without.zone_skew == 3
    assert comparison.with_podcost.zone_skew == 0


def test_with_podcost_is_what_was_deleted_and_says_when_that_was_not_predicted() -> None:
    snapshot = uneven("capacity-type")
    spot = [name for name, place in places(snapshot).items() if place.capacity == "spot"]
    on_demand = [name for name in places(snapshot) if name not in spot]
    deleted = on_demand[:6]
    comparison = compare(snapshot, 6, deleted, NOW, strategies="capacity-type")
    assert {p.name for p in comparison.with_podcost.deleted} == set(deleted)
    assert not comparison.as_predicted
    assert set(comparison.predicted) >= set(spot)  # the model says: every spot pod first
    assert comparison.with_podcost.capacity_after == {"on-demand": 1, "spot": 5}
    assert comparison.to_json()["as_predicted"] is False


def test_the_chart_is_a_png_of_both_workloads(tmp_path: Path) -> None:
    comparisons = []
    for strategies in ("topology-spread", "capacity-type=3, untolerated-taints=1"):
        snapshot = uneven(strategies)
        predicted = simulate(snapshot, 6, NOW, policy=None).victims
        comparisons.append(compare(snapshot, 6, [p.name for p in predicted], NOW,
                                   strategies=strategies))  # fmt: skip
    path = draw(comparisons, tmp_path / "chart.png")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 20_000
