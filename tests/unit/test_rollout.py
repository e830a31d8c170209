"""The deployment controller's proportional scaling of a Deployment mid-rollout
(``podcost_core.rollout``): worked examples read off sync.go and deployment_util.go, and the
bounds it keeps for any sizes. The real controller's agreement is in
``tests/integration/test_rollout_differential.py``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from tests.support.pods import NOW, pod

from podcost_core.model import ReplicaSetInfo, Snapshot, WorkloadRef
from podcost_core.rollout import (
    Rollout,
    RolloutReplicaSet,
    max_surge,
    rollout_for,
    scaled_sizes,
    settled_sizes,
)
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload

DATA = Path(__file__).parent / "data"


def rs(name: str, replicas: int, created: float, **extra: Any) -> RolloutReplicaSet:
    return RolloutReplicaSet(name, replicas, created=created, **extra)


def test_a_scale_in_mid_rollout_is_split_in_proportion_to_the_sizes() -> None:
    # 10 old + 2 new (surge 2, stuck), Deployment 10 → 5: allowed 5 + 2 = 7, to remove 5.
    rollout = Rollout(
        (rs("old", 10, 1.0, max_replicas=12), rs("new", 2, 2.0, max_replicas=12)),
        new="new", max_surge=2, max_unavailable=0,
    )  # fmt: skip
    # old: round(10 * 7 / 12) - 10 = -4; new: round(2 * 7 / 12) - 2 = -1.
    assert scaled_sizes(rollout, 5) == {"old": 6, "new": 1}
    # 10 → 8: allowed 10, to remove 2, all of it from the larger one.
    assert scaled_sizes(rollout, 8) == {"old": 8, "new": 2}


def test_equal_sizes_scale_in_the_older_first_and_it_takes_what_rounding_leaves() -> None:
    rollout = Rollout(
        (rs("b", 3, 2.0, max_replicas=7), rs("a", 3, 1.0, max_replicas=7)),
        new="b", max_surge=1, max_unavailable=0,
    )  # fmt: skip
    # allowed 4 + 1 = 5, to remove 1: a (older) first: round(3 * 5 / 7) - 3 = -1.
    assert scaled_sizes(rollout, 4) == {"a": 2, "b": 3}


def test_without_the_max_replicas_annotation_the_status_replicas_stand_in() -> None:
    rollout = Rollout(
        (rs("old", 6, 1.0), rs("new", 2, 2.0)),
        new="new", max_surge="25%", status_replicas=8,
    )  # fmt: skip
    assert max_surge(rollout, 4) == 1  # 25 % of 4, rounded up
    # allowed 5, to remove 3: old round(6 * 5 / 8) - 6 = -2, new round(2 * 5 / 8) - 2 = -1.
    assert scaled_sizes(rollout, 4) == {"old": 4, "new": 1}


def test_one_replicaset_holding_replicas_takes_them_all_and_zero_empties_every_one() -> None:
    rollout = Rollout((rs("old", 0, 1.0), rs("new", 5, 2.0)), new="new")
    assert scaled_sizes(rollout, 3) == {"old": 0, "new": 3}
    both = Rollout((rs("old", 4, 1.0, max_replicas=6), rs("new", 1, 2.0, max_replicas=6)),
                   new="new")  # fmt: skip
    assert scaled_sizes(both, 0) == {"old": 0, "new": 0}


def test_a_saturated_new_replicaset_keeps_its_size_and_the_old_ones_go_to_zero() -> None:
    rollout = Rollout(
        (rs("old", 2, 1.0), rs("new", 4, 2.0, desired_replicas="4", available=4)), new="new"
    )
    assert scaled_sizes(rollout, 4) == {"old": 0, "new": 4}


def test_a_recreate_deployment_is_not_split() -> None:
    rollout = Rollout((rs("old", 3, 1.0), rs("new", 2, 2.0)), new="new", rolling=False)
    assert scaled_sizes(rollout, 2) == {"old": 3, "new": 2}


@given(
    sizes=st.lists(st.integers(0, 40), min_size=2, max_size=5),
    headroom=st.integers(0, 20),
    surge=st.one_of(st.integers(0, 5), st.sampled_from(["0%", "25%", "50%", "100%"])),
    target=st.integers(0, 60),
)
def test_a_scale_in_never_grows_a_replicaset_or_drives_one_below_zero(
    sizes: list[int], headroom: int, surge: int | str, target: int
) -> None:
    # As the controller leaves them: every ReplicaSet annotated with the size it was scaled for
    # (the Deployment's replicas plus surge then), at least what they hold together.
    before = sum(sizes) + headroom
    sets = tuple(rs(f"rs-{i}", size, float(i), max_replicas=before) for i, size in enumerate(sizes))
    rollout = Rollout(sets, new=sets[-1].name, max_surge=surge)
    after = scaled_sizes(rollout, target)
    assert all(size >= 0 for size in after.values())
    allowed = target + max_surge(rollout, target) if target else 0
    if len([s for s in sizes if s > 0]) > 1 and allowed < sum(sizes):
        assert all(after[s.name] <= s.replicas for s in sets)
        assert sum(after.values()) >= allowed


def test_simulate_splits_a_scale_in_of_a_deployment_mid_rollout() -> None:
    dump: dict[str, Any] = json.loads((DATA / "shop-dump.json").read_text())
    objects = load_objects(dump)
    snapshot = snapshot_for_workload(objects, "shop", "api")
    rollout = rollout_for(objects, snapshot)
    assert rollout is not None
    assert rollout.holding() == ["api-new", "api-old"]
    # 3 → 1 (surge 1): allowed 2, one to remove, from the larger api-new.
    result = simulate(snapshot, 1, snapshot.taken_at, policy=None, rollout=rollout)
    assert result.replicasets == {"api-new": (2, 1)}
    assert [pod.replicaset for pod in result.victims] == ["api-new"]
    assert result.rollout_goes_on
    assert result.to_json()["replicasets"] == {"api-new": {"before": 2, "after": 1}}
    # 3 → 2 (surge 1): allowed 3 = what they hold: the scale event itself deletes nothing.
    unchanged = simulate(snapshot, 2, snapshot.taken_at, policy=None, rollout=rollout)
    assert unchanged.victims == ()
    assert unchanged.replicasets == {}
    assert unchanged.rollout_goes_on


def test_a_dump_keeps_what_the_deployment_controller_scales_by() -> None:
    # Found by the differential test: validating a dump dropped the Deployment's strategy,
    # ``paused`` and status, so every Deployment read as 25 %/25 %, unpaused, and no new
    # ReplicaSet as saturated (its availableReplicas gone).
    def workload(kind: str, name: str, spec: dict[str, Any], status: dict[str, Any],
                 **meta: Any) -> dict[str, Any]:  # fmt: skip
        return {
            "apiVersion": "apps/v1", "kind": kind, "spec": spec, "status": status,
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", **meta},
        }  # fmt: skip

    def owned(name: str, revision: str, replicas: int, available: int) -> dict[str, Any]:
        return workload(
            "ReplicaSet", name, {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}},
            {"replicas": replicas, "availableReplicas": available},
            creationTimestamp=f"2024-05-01T11:00:0{revision}Z",
            annotations={"deployment.kubernetes.io/revision": revision,
                         "deployment.kubernetes.io/desired-replicas": "7",
                         "deployment.kubernetes.io/max-replicas": "7"},
            ownerReferences=[{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                              "uid": "uid-web", "controller": True}],
        )  # fmt: skip

    spec = {
        "replicas": 7, "selector": {"matchLabels": {"app": "web"}}, "paused": True,
        "strategy": {"type": "RollingUpdate",
                     "rollingUpdate": {"maxSurge": "0%", "maxUnavailable": 2}},
    }  # fmt: skip
    dump = {"apiVersion": "v1", "kind": "List", "items": [
        workload("Deployment", "web", spec, {"replicas": 7, "availableReplicas": 5},
                 annotations={"deployment.kubernetes.io/revision": "2"}),
        owned("web-old", "1", 5, 5),
        owned("web-new", "2", 2, 0),
    ]}  # fmt: skip
    objects = load_objects(dump)
    rollout = rollout_for(objects, snapshot_for_workload(objects, "ns", "web", "Deployment"))
    assert rollout is not None
    assert (rollout.max_surge, rollout.max_unavailable) == ("0%", 2)
    assert rollout.paused
    assert rollout.rolling
    assert rollout.new == "web-new"
    assert rollout.status_replicas == 7
    assert {rs.name: rs.available for rs in rollout.replicasets} == {"web-old": 5, "web-new": 0}
    # Stalled at R + maxSurge = 7: scaling at 7 (what pausing does) moves nothing.
    assert scaled_sizes(rollout, 7) == {"web-old": 5, "web-new": 2}
    recreate = {**spec, "strategy": {"type": "Recreate"}}
    dump["items"][0] = workload("Deployment", "web", recreate, {"replicas": 7},
                                annotations={"deployment.kubernetes.io/revision": "2"})  # fmt: skip
    objects = load_objects(dump)
    rollout = rollout_for(objects, snapshot_for_workload(objects, "ns", "web", "Deployment"))
    assert rollout is not None
    assert not rollout.rolling


def test_a_shrinking_replicaset_may_sort_after_another_deleted_pods_on_its_nodes() -> None:
    # Found by the differential test (seed 98 of the long run): the old ReplicaSet's victims
    # were gone from node-1 before the new one sorted, so the new one's cost-0 pod on node-0
    # had more related pods there, and went instead of the one the snapshot ranks first.
    old = [pod(f"old-{i}", node="node-1", replicaset="old", cost=c) for i, c in enumerate(
        (10, 0, 0, 0))] + [pod(f"old-{i}", node="node-0", replicaset="old", cost=c)
                           for i, c in ((4, 0), (5, 10), (6, 10))]  # fmt: skip
    new = [
        pod("new-a", node="node-0", replicaset="new"),
        pod("new-b", node="node-0", replicaset="new", cost=5),
        pod("new-c", node="node-1", replicaset="new", cost=5),
        pod("new-d", node="node-1", replicaset="new"),
    ]
    infos = {
        name: ReplicaSetInfo(name, uid=name, replicas=size, controller_uid="web", created=t)
        for name, size, t in (("old", 7, 1.0), ("new", 4, 2.0))
    }
    snapshot = Snapshot(
        WorkloadRef("local", "shop", "Deployment", "web"), (*old, *new), replicasets=infos
    )
    rollout = Rollout(
        (rs("old", 7, 1.0, max_replicas=11, desired_replicas="7", available=7),
         rs("new", 4, 2.0, max_replicas=11, desired_replicas="7")),
        new="new", max_surge="50%", max_unavailable=0, paused=True,
    )  # fmt: skip
    # 7 → 5: allowed 8, to remove 3: old round(7 * 8 / 11) - 7 = -2, new round(4 * 8 / 11) - 4 = -1.
    result = simulate(snapshot, 5, NOW, policy=None, rollout=rollout)
    assert result.replicasets == {"old": (7, 5), "new": (4, 3)}
    # The snapshot ranks new-d (6 on node-1) before new-a (5 on node-0); two of old's cost-0
    # pods may be gone from node-1 and from node-0 when new sorts: either may go.
    assert result.admits(["old-1", "old-2", "new-d"])
    assert result.admits(["old-1", "old-2", "new-a"])
    assert not result.admits(["old-1", "old-2", "new-b"])


def test_a_paused_deployment_scales_again_until_nothing_changes() -> None:
    # Found by the differential test (seeds 18 and 90 of the long run). Old 1 + new 5 (R 3,
    # surge 100 %), to 1: allowed 1 + 1 = 2; new round(5 * 2 / 6) - 5 = -3, old -1: new 2.
    sets = (rs("old", 1, 1.0, max_replicas=6, desired_replicas="3", available=1),
            rs("new", 5, 2.0, max_replicas=6, desired_replicas="3"))  # fmt: skip
    rollout = Rollout(sets, new="new", max_surge="100%", max_unavailable=2)
    assert scaled_sizes(rollout, 1) == {"old": 0, "new": 2}
    assert settled_sizes(rollout, 1) == {"old": 0, "new": 2}  # unpaused: the rollout goes on
    # Paused, the next sync finds one ReplicaSet holding replicas and gives it exactly 1.
    paused = replace(rollout, paused=True)
    assert settled_sizes(paused, 1) == {"old": 0, "new": 1}
    # Old 8 + new 1 (surge 1), to 1: old round(8 * 2 / 9) - 8 = -6 → 2, new → 0; then old 1.
    sets = (rs("old", 8, 1.0, max_replicas=9, desired_replicas="8", available=8),
            rs("new", 1, 2.0, max_replicas=9, desired_replicas="8"))  # fmt: skip
    paused = Rollout(sets, new="new", max_surge=1, max_unavailable=0, paused=True)
    assert scaled_sizes(paused, 1) == {"old": 2, "new": 0}
    assert settled_sizes(paused, 1) == {"old": 1, "new": 0}
    # When the split leaves several holding at replicas + surge, once is enough.
    assert settled_sizes(paused, 5) == scaled_sizes(paused, 5)
