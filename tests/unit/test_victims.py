"""The victim model against the v1.36 ReplicaSet controller: one table per rule, precedence,
LogarithmicScaleDown buckets and their UID tie-break, cost parsing, ranks, ties and bursts."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.pods import CREATED, NOW, READY, pod

from podcost_core.model import Phase, Pod, ReplicaSetInfo, Snapshot, WorkloadRef
from podcost_core.tomodel import pod_from_json
from podcost_core.victims import (
    BURST_REPLICAS,
    NowWindow,
    RankedPod,
    colocation_ranks,
    comparator,
    deletion_cost_error,
    less,
    log_rank,
    parse_deletion_cost,
    pods_to_delete,
    scale_in,
    sort_key,
    victim_inputs,
)

SECOND = 1.0


def first(a: Pod, b: Pod, *, ranks: tuple[int, int] = (1, 1), now: float | None = NOW) -> None:
    """``a`` goes before ``b``, and not the other way round."""
    ra, rb = RankedPod(a, ranks[0]), RankedPod(b, ranks[1])
    assert less(ra, rb, now)
    assert not less(rb, ra, now)


def equal(a: Pod, b: Pod, *, now: float | None = NOW) -> None:
    ra, rb = RankedPod(a, 1), RankedPod(b, 1)
    assert not less(ra, rb, now)
    assert not less(rb, ra, now)


# --- the 8 rules, each with a pair that only differs in that rule --------------------------


def test_rule_1_an_unassigned_pod_goes_before_an_assigned_one() -> None:
    first(pod("a", node=None), pod("b"))


def test_rule_1_two_unassigned_pods_fall_through_to_later_rules() -> None:
    first(pod("a", node=None, phase=Phase.PENDING), pod("b", node=None))


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        (Phase.PENDING, Phase.UNKNOWN),
        (Phase.UNKNOWN, Phase.RUNNING),
        (Phase.PENDING, Phase.RUNNING),
    ],
)
def test_rule_2_pending_goes_before_unknown_before_running(earlier: Phase, later: Phase) -> None:
    first(pod("a", phase=earlier), pod("b", phase=later))


def test_rule_3_a_pod_not_ready_goes_before_a_ready_one() -> None:
    first(pod("a", ready=False), pod("b"))


def test_rule_4_the_lower_deletion_cost_goes_first() -> None:
    first(pod("a", cost=-3), pod("b", cost=2))


def test_rule_4_a_missing_cost_reads_as_zero() -> None:
    first(pod("a", cost=-1), pod("b"))
    first(pod("a"), pod("b", cost=1))


def test_rule_4_is_skipped_when_pod_deletion_cost_is_disabled() -> None:
    a, b = RankedPod(pod("a", cost=5), 2), RankedPod(pod("b", cost=1), 1)
    assert less(a, b, NOW, cost_enabled=False)


def test_rule_5_the_pod_with_more_related_pods_on_its_node_goes_first() -> None:
    first(pod("a"), pod("b"), ranks=(3, 1))


def test_rule_6_the_pod_ready_for_less_time_goes_first() -> None:
    first(pod("a", ready_since=NOW - 10), pod("b", ready_since=NOW - 100))


def test_rule_6_a_ready_pod_without_ready_time_goes_first() -> None:
    first(pod("a", ready_since=None), pod("b"))


def test_rule_6_only_applies_when_both_are_ready() -> None:
    # Not ready pods skip rule 6 and are compared by restarts.
    a = pod("a", phase=Phase.PENDING, ready=False, restarts=2)
    b = pod("b", phase=Phase.PENDING, ready=False)
    first(a, b)


def test_rule_7_the_pod_with_more_restarts_goes_first() -> None:
    first(pod("a", restarts=4), pod("b", restarts=1))


def test_rule_7_sidecar_restarts_only_break_ties_of_regular_containers() -> None:
    first(pod("a", sidecar_restarts=3), pod("b"))
    first(pod("a", restarts=1), pod("b", sidecar_restarts=9))


def test_rule_8_the_newer_pod_goes_first() -> None:
    first(pod("a", created=CREATED + 1800), pod("b", created=CREATED - 86_400))


def test_rule_8_a_pod_without_creation_time_goes_first() -> None:
    first(pod("a", created=None), pod("b"))


def test_pods_equal_in_every_rule_compare_equal() -> None:
    equal(pod("a"), pod("b"))


# --- precedence: each rule beats every later one -------------------------------------------


def test_precedence_unassigned_beats_phase() -> None:
    first(pod("a", node=None), pod("b", phase=Phase.PENDING, ready=False))


def test_precedence_phase_beats_readiness() -> None:
    first(pod("a", phase=Phase.PENDING), pod("b", phase=Phase.RUNNING, ready=False))


def test_precedence_readiness_beats_cost() -> None:
    first(pod("a", ready=False, cost=100), pod("b", cost=-100))


def test_precedence_cost_beats_rank() -> None:
    first(pod("a", cost=0), pod("b", cost=1), ranks=(1, 9))


def test_precedence_rank_beats_ready_time() -> None:
    first(pod("a", ready_since=NOW - 3000), pod("b", ready_since=NOW - 5), ranks=(2, 1))


def test_precedence_ready_time_beats_restarts() -> None:
    first(pod("a", ready_since=NOW - 10), pod("b", ready_since=NOW - 1000, restarts=7))


def test_precedence_restarts_beat_creation_time() -> None:
    first(pod("a", restarts=1, created=CREATED - 86_400), pod("b", created=CREATED + 1800))


# --- LogarithmicScaleDown -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("age_ns", "bucket"),
    [
        (-5, -1),
        (0, -1),
        (1, 0),
        (2**30 - 1, 29),
        (2**30, 30),
        (1_000_000_000, 29),  # one second
        (10_000_000_000, 33),
        (12_000_000_000, 33),
        (20_000_000_000, 34),
        # Values from Go (math.Log2 on amd64, go1.26): float rounding lifts these to the next
        # power of two, and the model must too.
        (2**49 - 2, 48),
        (2**49 - 1, 49),
        (2**50 - 3, 49),
        (2**50 - 2, 50),
        (2**51 - 6, 50),
        (2**51 - 5, 51),
    ],
)
def test_log_rank_is_go_int64_of_math_log2(age_ns: int, bucket: int) -> None:
    assert log_rank(age_ns) == bucket


def test_ready_times_in_the_same_bucket_are_ordered_by_uid() -> None:
    # 10 s and 12 s ago share bucket 33: the UID decides, whatever the restarts say.
    young = pod("young", uid="uid-b", ready_since=NOW - 10)
    older = pod("older", uid="uid-a", ready_since=NOW - 12, restarts=5)
    first(older, young)


def test_ready_times_in_different_buckets_are_ordered_by_age() -> None:
    young = pod("young", uid="uid-b", ready_since=NOW - 10)
    older = pod("older", uid="uid-a", ready_since=NOW - 20)
    first(young, older)


def test_equal_ready_times_fall_through_to_restarts_not_uid() -> None:
    first(pod("a", uid="uid-z", restarts=1), pod("b", uid="uid-a"))


def test_creation_times_in_the_same_bucket_are_ordered_by_uid() -> None:
    a = pod("a", uid="uid-a", created=NOW - 10)
    b = pod("b", uid="uid-b", created=NOW - 12)
    first(a, b)


def test_without_now_times_compare_exactly() -> None:
    # A zero Now falls back to afterOrZero: later first, no buckets, no UID.
    a = pod("a", uid="uid-b", ready_since=NOW - 10)
    b = pod("b", uid="uid-a", ready_since=NOW - 12)
    first(a, b, now=None)


def test_a_time_after_now_is_in_the_lowest_bucket() -> None:
    a = pod("a", uid="uid-b", ready_since=NOW + 5)
    b = pod("b", uid="uid-a", ready_since=NOW - 1)
    first(a, b)


# --- the annotation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "cost"),
    [
        (None, 0),
        ("", 0),
        ("0", 0),
        ("10", 10),
        ("-10", -10),
        ("+10", 0),
        ("007", 0),
        ("00", 0),
        ("-007", -7),
        ("-0", 0),
        ("-", 0),
        ("--1", 0),
        ("2147483647", 2147483647),
        ("2147483648", 0),
        ("-2147483648", -2147483648),
        ("-2147483649", 0),
        (" 1", 0),
        ("1 ", 0),
        ("1_000", 0),
        ("1.5", 0),
        ("1e3", 0),
        ("\u0661", 0),  # an Arabic-Indic digit: int() takes it, Go does not
        ("abc", 0),
    ],
)
def test_deletion_cost_parses_exactly_as_the_controller_does(raw: str | None, cost: int) -> None:
    assert parse_deletion_cost(raw) == cost


@pytest.mark.parametrize(
    ("raw", "valid"), [("5", True), ("-5", True), ("+5", False), ("05", False)]
)
def test_the_api_server_rejects_what_the_controller_cannot_read(raw: str, valid: bool) -> None:
    assert (deletion_cost_error(raw) is None) is valid


# --- ranks ----------------------------------------------------------------------------------


def test_rank_counts_active_related_pods_on_the_node_ready_or_not() -> None:
    mine = [pod("a", node="n1"), pod("b", node="n2")]
    related = [
        *mine,
        pod("c", node="n1", ready=False),  # counts: active, not ready
        pod("d", node="n1", deleting=True),  # does not count: being deleted
        pod("e", node="n1", phase=Phase.SUCCEEDED, ready=False),  # does not count: finished
        pod("f", node="n2", replicaset="web-0"),  # counts: another ReplicaSet of the owner
    ]
    assert colocation_ranks(mine, related) == {"uid-a": 2, "uid-b": 2}


def test_unscheduled_pods_share_one_rank() -> None:
    mine = [pod("a", node=None), pod("b", node=None)]
    assert colocation_ranks(mine, mine) == {"uid-a": 2, "uid-b": 2}


def _snapshot(kind: str, owner: str | None) -> Snapshot:
    pods = (pod("a", node="n1"), pod("b", node="n1"), pod("c", node="n2"))
    return Snapshot(
        workload=WorkloadRef("local", "shop", kind, "web"),
        pods=pods,
        replicasets={"web-1": ReplicaSetInfo("web-1", controller_uid=owner)},
    )


def test_a_replicaset_of_a_deployment_relates_every_pod_of_the_deployment() -> None:
    pods, related = victim_inputs(_snapshot("Deployment", "uid-deploy"), "web-1")
    assert colocation_ranks(pods, related) == {"uid-a": 2, "uid-b": 2, "uid-c": 1}


def test_a_replicaset_without_owner_relates_no_pod_so_every_rank_is_zero() -> None:
    pods, related = victim_inputs(_snapshot("ReplicaSet", None), "web-1")
    assert related == []
    assert colocation_ranks(pods, related) == {"uid-a": 0, "uid-b": 0, "uid-c": 0}


# --- choices --------------------------------------------------------------------------------


def names(pods: tuple[Pod, ...]) -> list[str]:
    return [p.name for p in pods]


def test_distinct_costs_make_the_choice_certain() -> None:
    pods = [pod(f"p{cost}", cost=cost) for cost in (3, 1, 2, 0)]
    choice = pods_to_delete(pods, pods, 2, NOW)
    assert names(choice.victims) == ["p0", "p1"]
    assert names(choice.certain) == ["p0", "p1"]
    assert choice.tied == ()
    assert choice.tie_picks == 0


def test_pods_equal_in_every_rule_are_a_tie_the_sort_resolves_freely() -> None:
    pods = [pod("x", cost=-1), pod("a"), pod("b"), pod("c")]
    choice = pods_to_delete(pods, pods, 2, NOW)
    assert names(choice.certain) == ["x"]
    assert sorted(names(choice.tied)) == ["a", "b", "c"]
    assert choice.tie_picks == 1
    assert choice.admits({"uid-x", "uid-b"})
    assert not choice.admits({"uid-a", "uid-b"})
    assert not choice.admits({"uid-x"})


def test_distinct_times_in_one_bucket_are_a_certain_uid_order() -> None:
    pods = [pod(f"p{i}", uid=f"uid-{i}", ready_since=NOW - 40 - i) for i in range(5)]
    choice = pods_to_delete(pods, pods, 2, NOW)
    assert names(choice.certain) == ["p0", "p1"]
    assert all(len(members) == 1 for members in choice.classes)


def test_a_comparison_cycle_is_one_class() -> None:
    # a and b share a ready time (rule 7 decides: a first), c is in their bucket with another
    # time (the UID decides: b before c, c before a). Less is not transitive here.
    a = pod("a", uid="uid-c", restarts=5)
    b = pod("b", uid="uid-a")
    c = pod("c", uid="uid-b", ready_since=READY + 1)
    pods = [a, b, c]
    ranked = [RankedPod(p, 1) for p in pods]
    assert less(ranked[0], ranked[1], NOW)
    assert less(ranked[1], ranked[2], NOW)
    assert less(ranked[2], ranked[0], NOW)
    choice = pods_to_delete(pods, pods, 1, NOW)
    assert len(choice.classes) == 1
    assert choice.certain == ()
    assert choice.tie_picks == 1


def test_deleting_every_pod_needs_no_sort() -> None:
    pods = [pod("a"), pod("b")]
    choice = pods_to_delete(pods, pods, 2, NOW)
    assert names(choice.certain) == ["a", "b"]


def test_a_diff_beyond_the_pods_is_an_error() -> None:
    with pytest.raises(ValueError, match="diff"):
        pods_to_delete([pod("a")], [], 2, NOW)


def test_pods_sharing_a_uid_are_an_error() -> None:
    with pytest.raises(ValueError, match="UID"):
        pods_to_delete([pod("a", uid="u"), pod("b", uid="u")], [], 1, NOW)


def test_only_active_pods_can_be_candidates() -> None:
    with pytest.raises(ValueError, match="active"):
        pods_to_delete([pod("a", deleting=True), pod("b")], [], 1, NOW)


def test_a_bucket_edge_inside_the_now_window_makes_the_pair_a_tie() -> None:
    # b's age crosses 2**33 ns (8.59 s) during the window; a is 8 s old throughout.
    a = pod("a", uid="uid-b", ready_since=NOW - 8)
    b = pod("b", uid="uid-a", ready_since=NOW - 8.5)
    pods = [a, b]
    assert names(pods_to_delete(pods, pods, 1, NOW).certain) == ["b"]  # same bucket: UID
    assert names(pods_to_delete(pods, pods, 1, NOW + 0.5).certain) == ["a"]  # b is older now
    window = pods_to_delete(pods, pods, 1, NowWindow(NOW, NOW + 0.5))
    assert window.certain == ()
    assert sorted(names(window.tied)) == ["a", "b"]


def test_a_window_without_a_bucket_edge_stays_certain() -> None:
    pods = [pod("a", ready_since=NOW - 100), pod("b", ready_since=NOW - 1000)]
    choice = pods_to_delete(pods, pods, 1, NowWindow(NOW, NOW + 0.2))
    assert names(choice.certain) == ["a"]


def test_the_comparator_sorts_like_the_controller() -> None:
    pods = [RankedPod(pod(f"p{cost}", cost=cost), 1) for cost in (2, -1, 7)]
    assert [r.pod.name for r in sorted(pods, key=sort_key(NOW))] == ["p-1", "p2", "p7"]
    assert comparator(NOW)(pods[1], pods[0]) == -1


def test_each_sync_deletes_at_most_the_burst_and_the_next_one_reranks() -> None:
    # a1 and a2 share n1, b is alone on n2 but was ready most recently.
    a1 = pod("a1", node="n1", ready_since=NOW - 3000)
    a2 = pod("a2", node="n1", ready_since=NOW - 3000)
    b = pod("b", node="n2", ready_since=NOW - 10)
    pods = [a1, a2, b]
    at_once = scale_in(pods, pods, 1, NOW)
    assert len(at_once) == 1
    assert sorted(names(at_once[0].certain)) == ["a1", "a2"]  # rank 2 beats ready time
    one_by_one = scale_in(pods, pods, 1, NOW, burst=1)
    assert [choice.tie_picks for choice in one_by_one] == [1, 0]
    assert names(one_by_one[1].certain) == ["b"]  # ranks are even now; b is youngest


def test_the_burst_is_500() -> None:
    assert BURST_REPLICAS == 500


# --- properties -----------------------------------------------------------------------------


@st.composite
def pod_sets(draw: st.DrawFn) -> list[Pod]:
    size = draw(st.integers(1, 9))
    return [
        pod(
            f"p{i}",
            uid=f"uid-{draw(st.integers(0, 99)):02d}-{i}",
            node=draw(st.sampled_from([None, "n1", "n2"])),
            phase=draw(st.sampled_from([Phase.PENDING, Phase.UNKNOWN, Phase.RUNNING])),
            ready=draw(st.booleans()),
            ready_since=draw(st.sampled_from([None, READY, READY + 1, NOW - 20, NOW - 5])),
            created=draw(st.sampled_from([None, CREATED, CREATED + 1, NOW - 30])),
            restarts=draw(st.integers(0, 2)),
            sidecar_restarts=draw(st.integers(0, 1)),
            cost=draw(st.sampled_from([None, -1, 1])),
        )
        for i in range(size)
    ]


@settings(max_examples=150, deadline=None)
@given(pod_sets(), st.data())
def test_every_order_the_sort_can_produce_is_admitted(pods: list[Pod], data: st.DataObject) -> None:
    # Insertion sort from a random start order is a comparison sort like Go's pdqsort: each
    # outcome it yields must fit the classes.
    ranks = colocation_ranks(pods, pods)
    start = data.draw(st.permutations(pods))
    ranked = [RankedPod(p, ranks[p.uid]) for p in start]
    for index in range(1, len(ranked)):
        position = index
        while position > 0 and less(ranked[position], ranked[position - 1], NOW):
            ranked[position - 1], ranked[position] = ranked[position], ranked[position - 1]
            position -= 1
    diff = data.draw(st.integers(0, len(pods)))
    choice = pods_to_delete(pods, pods, diff, NOW)
    assert choice.admits(r.pod.uid for r in ranked[:diff])
    position_of = {p.uid: i for i, members in enumerate(choice.classes) for p in members}
    assert [position_of[r.pod.uid] for r in ranked] == sorted(
        position_of[r.pod.uid] for r in ranked
    )


@settings(max_examples=100, deadline=None)
@given(pod_sets(), st.integers(0, 2000))
def test_a_window_is_never_more_certain_than_a_point_inside_it(pods: list[Pod], shift: int) -> None:
    window = NowWindow(NOW - 10, NOW + 10)
    point = NOW - 10 + shift / 100
    for diff in range(len(pods) + 1):
        wide = pods_to_delete(pods, pods, diff, window)
        exact = pods_to_delete(pods, pods, diff, point)
        assert {p.uid for p in wide.certain} <= {p.uid for p in exact.certain}
        assert wide.admits(p.uid for p in exact.victims)


def test_a_large_workload_is_modelled_quickly() -> None:
    pods = [
        pod(f"p{i}", node=f"n{i % 50}", ready_since=READY + i % 7, created=CREATED + i % 5)
        for i in range(2000)
    ]
    choice = pods_to_delete(pods, pods, 700, NOW)
    assert len(choice.victims) == 700


def test_replacing_a_pod_field_keeps_the_model_consistent() -> None:
    # The simulate command re-labels pods with dataclasses.replace; deletion_cost drives rule 4.
    a = replace(pod("a"), deletion_cost=-4)
    first(a, pod("b"))


# --- recorded from the real controller --------------------------------------------------------

GOLDEN = Path(__file__).parent / "data" / "less-golden.jsonl"


def test_less_agrees_with_the_real_controller_on_recorded_cases() -> None:
    # Each line: pods as JSON, their ranks, Now, and the matrix of Less(i, j) that
    # controller.ActivePodsWithRanks.Less of k8s.io/kubernetes v1.36.3 computed for them
    # (random pods: phases, readiness, costs valid and not, restarts with sidecars, times).
    cases = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    assert len(cases) == 60
    for case in cases:
        ranked = [
            RankedPod(pod_from_json(raw), rank)
            for raw, rank in zip(case["pods"], case["ranks"], strict=True)
        ]
        now = datetime.fromisoformat(case["now"]).timestamp()
        size = len(ranked)
        for i, a in enumerate(ranked):
            for j, b in enumerate(ranked):
                assert less(a, b, now) == (case["less"][i * size + j] == "1"), (i, j, case)


def test_a_rank_that_other_deletions_may_have_lowered_ties_rule_5() -> None:
    # Equal cost: the pod on node-b (6 related pods) goes before the one on node-a (5)...
    mine = [pod("on-a", node="node-a"), pod("on-b", node="node-b")]
    related = [
        *mine,
        *(pod(f"a{i}", node="node-a", replicaset="web-0") for i in range(4)),
        *(pod(f"b{i}", node="node-b", replicaset="web-0") for i in range(5)),
    ]
    certain = pods_to_delete(mine, related, 1, NOW)
    assert [p.name for p in certain.certain] == ["on-b"]
    # ... unless up to 2 of node-b's may already be gone (ranks 4-6 against 5): either goes.
    either = pods_to_delete(mine, related, 1, NOW, maybe_gone={"node-b": 2})
    assert either.certain == ()
    assert {p.name for p in either.tied} == {"on-a", "on-b"}
    assert either.tie_picks == 1
    # One gone at most (5-6 against 5): they may be equal, then rules 6-8 decide, and here
    # nothing does: either goes.
    assert pods_to_delete(mine, related, 1, NOW, maybe_gone={"node-b": 1}).tie_picks == 1
    # Ranks that cannot meet stay certain: node-b 6, node-a at most 3 after two went.
    fewer = [p for p in related if p.name not in ("a0", "a1")]
    kept = pods_to_delete(mine, fewer, 1, NOW, maybe_gone={"node-b": 2})
    assert [p.name for p in kept.certain] == ["on-b"]
