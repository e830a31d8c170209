"""What-if scale-in on a dump: the baseline is what Kubernetes does today, the policy run
labels costs first; mid-rollout and out-of-range requests are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.pods import NOW, READY, pod

from podcost_core.combine import rank
from podcost_core.model import Node, NodeName, ReplicaSetInfo, Snapshot, WorkloadRef
from podcost_core.policy import DEFAULT_POLICY, load_policy_file
from podcost_core.simulate import SimulationError, scaling_replicaset, simulate
from podcost_core.snapshots import snapshot_for_workload
from podcost_core.victims import NowWindow

DATA = Path(__file__).parent / "data"


def shop(name: str = "web", kind: str | None = None) -> Snapshot:
    dump: dict[str, Any] = json.loads((DATA / "shop-dump.json").read_text())
    return snapshot_for_workload(dump, "shop", name, kind=kind)


def test_the_baseline_keeps_todays_costs_and_grows_the_skew() -> None:
    snapshot = shop()
    result = simulate(snapshot, 4, snapshot.taken_at, policy=None)
    # fffff carries podcost's old -5; then the doubled-up pods, in UID order within one bucket.
    assert [p.name for p in result.victims] == ["web-5d8f7-fffff", "web-5d8f7-ddddd"]
    assert result.writes == {}
    assert result.domains_before == {"zone-a": 3, "zone-b": 2, "zone-c": 1}
    assert result.domains_after == {"zone-a": 3, "zone-b": 1, "zone-c": 0}
    assert (result.skew_before, result.skew_after) == (2, 3)


def test_with_a_policy_the_controller_deletes_podcasts_order() -> None:
    snapshot = shop()
    policy = load_policy_file(DATA / "spread-policy.json")
    result = simulate(snapshot, 3, snapshot.taken_at, policy=policy)
    flat = rank(snapshot, policy).flat()
    names = {p.uid: p.name for p in snapshot.pods}
    assert [p.name for p in result.victims] == [names[uid] for uid in flat[:3]]
    assert result.victims[0].name == "web-5d8f7-ccccc"  # the spot pod of the largest zone
    assert result.skew_after == 0
    assert "web-5d8f7-ccccc" not in result.writes  # its cost was set by hand: left alone
    assert result.costs["web-5d8f7-ccccc"] == 100


def test_the_default_policy_never_lets_the_skew_grow() -> None:
    snapshot = shop()
    for replicas in range(6, -1, -1):
        result = simulate(snapshot, replicas, snapshot.taken_at, policy=DEFAULT_POLICY)
        assert result.skew_after <= max(result.skew_before, 1)


def test_a_replicaset_without_owner_ignores_co_location() -> None:
    snapshot = shop("batch")
    result = simulate(snapshot, 2, snapshot.taken_at, policy=None)
    # batch-y and batch-z share a node, but with no owner every rank is 0: the youngest goes.
    assert [p.name for p in result.victims] == ["batch-x"]


def test_a_deployment_mid_rollout_is_refused_with_the_reason() -> None:
    with pytest.raises(SimulationError, match="mid-rollout"):
        simulate(shop("api"), 2, None, policy=None)


def test_one_replicaset_of_a_rollout_can_still_be_simulated_alone() -> None:
    snapshot = shop("api-new", kind="ReplicaSet")
    assert scaling_replicaset(snapshot) == "api-new"
    assert len(simulate(snapshot, 1, snapshot.taken_at, policy=None).victims) == 1


@pytest.mark.parametrize("replicas", [-1, 7])
def test_replicas_outside_zero_to_the_current_count_are_refused(replicas: int) -> None:
    with pytest.raises(SimulationError, match=r"outside 0\.\.6"):
        simulate(shop(), replicas, None, policy=None)


def test_scaling_to_the_current_count_deletes_nothing() -> None:
    result = simulate(shop(), 6, None, policy=None)
    assert result.victims == ()
    assert result.domains_after == result.domains_before


def test_equal_pods_show_as_a_tie() -> None:
    pods = tuple(pod(f"p{i}", node=f"n{i}") for i in range(3))
    snapshot = Snapshot(
        workload=WorkloadRef("local", "shop", "ReplicaSet", "web-1"),
        pods=pods,
        nodes={f"n{i}": Node(NodeName(f"n{i}"), labels={"zone": f"z{i}"}) for i in range(3)},
        replicasets={"web-1": ReplicaSetInfo("web-1")},
    )
    result = simulate(snapshot, 2, NOW, policy=None, topology_key="zone")
    assert result.tie_picks == 1
    assert sorted(p.name for p in result.tied) == ["p0", "p1", "p2"]
    assert result.to_json()["tied"] == [p.name for p in result.tied]
    # Any one of the tied pods is an outcome the controller can produce; two, or none, is not.
    assert all(result.admits([name]) for name in ("p0", "p1", "p2"))
    assert not result.admits(["p0", "p1"])
    assert not result.admits([])


def test_an_outcome_must_hold_every_certain_victim() -> None:
    snapshot = shop()
    result = simulate(snapshot, 4, snapshot.taken_at, policy=None)
    assert len(result.victims) == 2
    assert not result.tied
    victims = [pod.name for pod in result.victims]
    assert result.admits(victims)
    assert not result.admits(victims[:-1])
    kept = next(name for name in result.costs if name not in victims)
    assert not result.admits([*victims[:-1], kept])


def test_more_than_a_burst_is_deleted_over_several_syncs() -> None:
    pods = tuple(pod(f"p{i:03}", node=f"n{i % 7}", ready_since=READY + i) for i in range(620))
    snapshot = Snapshot(
        workload=WorkloadRef("local", "shop", "ReplicaSet", "web-1"),
        pods=pods,
        replicasets={"web-1": ReplicaSetInfo("web-1")},
    )
    result = simulate(snapshot, 20, NowWindow(NOW, NOW + 1), policy=None)
    assert [len(choice.victims) for choice in result.rounds] == [500, 100]
    assert len(result.victims) == 600


def test_the_json_document_has_the_contract_keys() -> None:
    snapshot = shop()
    document = simulate(snapshot, 5, snapshot.taken_at, policy=DEFAULT_POLICY).to_json()
    assert list(document) == [
        "workload",
        "replicas_before",
        "replicas_after",
        "victims",
        "costs",
        "topology_key",
        "domains_before",
        "domains_after",
        "skew_before",
        "skew_after",
        "tied",
        "tie_picks",
        "kept_costs",
        "kept_costs_change_outcome",
        "kept_costs_adopted",
    ]
    assert document["workload"] == "shop/web"
    assert document["topology_key"] == "topology.kubernetes.io/zone"
