"""Cost labelling: minimal writes (against brute force), validity, and that the controller then
deletes in the combined order."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.pods import NOW, pod, with_cost

from podcost_core.labels import (
    DEFAULT_BAND,
    EDGE_STEP,
    NON_NEGATIVE_BAND,
    CostBand,
    CurrentCost,
    Labelling,
    current_costs,
    dense_costs,
    label_costs,
)
from podcost_core.model import CostOwner, Pod, PodUID
from podcost_core.victims import parse_deletion_cost, pods_to_delete

U = PodUID


def uids(*names: str) -> list[PodUID]:
    return [U(name) for name in names]


def one_rs(order: Sequence[Sequence[PodUID]]) -> dict[PodUID, str | None]:
    return {uid: "rs" for group in order for uid in group}


def costs_of(**values: int | None) -> dict[PodUID, CurrentCost]:
    return {U(name): CurrentCost(value) for name, value in values.items()}


# --- table tests ----------------------------------------------------------------------------


def test_a_fresh_workload_gets_evenly_spread_costs_in_the_middle_of_the_band() -> None:
    order = [uids("a"), uids("b"), uids("c")]
    result = label_costs(order, one_rs(order), {})
    assert result.costs == {"a": -333_333_334, "b": 0, "c": 333_333_334}
    assert set(result.writes) == {"a", "b", "c"}


def test_pods_without_the_annotation_that_all_tie_need_no_write() -> None:
    # The controller reads a missing annotation as 0: three tied pods already share a cost.
    order = [uids("uid-a", "uid-b", "uid-c")]
    result = label_costs(order, one_rs(order), current_costs(pod(n) for n in ("a", "b", "c")))
    assert result.writes == {}
    assert result.costs == {"uid-a": 0, "uid-b": 0, "uid-c": 0}


def test_a_first_labelling_keeps_the_largest_group_at_0_and_writes_the_others() -> None:
    order = [uids("a"), uids("b", "c"), uids("d")]
    result = label_costs(order, one_rs(order), costs_of(a=0, b=0, c=0, d=0))
    assert result.costs == {"a": -EDGE_STEP, "b": 0, "c": 0, "d": EDGE_STEP}
    assert set(result.writes) == {"a", "d"}


def test_with_non_negative_costs_only_the_first_group_can_keep_0() -> None:
    order = [uids("a"), uids("b", "c")]
    result = label_costs(order, one_rs(order), costs_of(a=0, b=0, c=0), band=NON_NEGATIVE_BAND)
    assert result.costs == {"a": 0, "b": EDGE_STEP, "c": EDGE_STEP}
    assert set(result.writes) == {"b", "c"}


def test_costs_already_in_order_need_no_write() -> None:
    order = [uids("a"), uids("b", "c"), uids("d")]
    result = label_costs(order, one_rs(order), costs_of(a=-5, b=3, c=3, d=9))
    assert result.writes == {}


def test_pods_of_one_group_may_keep_different_costs() -> None:
    order = [uids("a", "b"), uids("c")]
    result = label_costs(order, one_rs(order), costs_of(a=1, b=7, c=8))
    assert result.writes == {}


def test_equal_costs_across_groups_are_not_an_order() -> None:
    order = [uids("a"), uids("b")]
    result = label_costs(order, one_rs(order), costs_of(a=5, b=5))
    assert len(result.writes) == 1
    assert result.costs[U("a")] < result.costs[U("b")]


def test_a_new_pod_takes_a_value_in_its_gap_without_moving_the_others() -> None:
    order = [uids("a"), uids("new"), uids("b")]
    result = label_costs(order, one_rs(order), costs_of(a=0, b=100))
    assert result.writes == {"new": 50}


def test_a_pod_moved_to_the_front_is_the_only_write_a_fixed_step_before_the_rest() -> None:
    order = [uids("d"), uids("a"), uids("b"), uids("c")]
    result = label_costs(order, one_rs(order), costs_of(a=10, b=20, c=30, d=40))
    assert result.writes == {"d": 10 - EDGE_STEP}


def test_pods_moved_to_the_back_follow_at_fixed_steps() -> None:
    order = [uids("a"), uids("b"), uids("x"), uids("y")]
    result = label_costs(order, one_rs(order), costs_of(a=10, b=20, x=5, y=0))
    assert result.writes == {"x": 20 + EDGE_STEP, "y": 20 + 2 * EDGE_STEP}


def test_when_a_gap_runs_out_some_neighbours_are_renumbered() -> None:
    order = [uids("a"), uids("new"), uids("b"), uids("c")]
    result = label_costs(order, one_rs(order), costs_of(a=1, b=2, c=3))
    assert len(result.writes) == 2  # "new" and one of its neighbours
    values = [result.costs[uid] for group in order for uid in group]
    assert values == sorted(set(values))


def test_each_replicaset_is_labelled_on_its_own() -> None:
    order = [uids("x1"), uids("y1"), uids("x2"), uids("y2")]
    replicasets: dict[PodUID, str | None] = {U("x1"): "x", U("x2"): "x", U("y1"): "y", U("y2"): "y"}
    # In one global numbering y1 (5) would have to sit between x1 (5) and x2 (6): a write.
    result = label_costs(order, replicasets, costs_of(x1=5, x2=6, y1=5, y2=6))
    assert result.writes == {}


def test_a_foreign_cost_is_never_rewritten_and_the_others_fit_around_it() -> None:
    order = [uids("a"), uids("b"), uids("c")]
    current = {U("a"): CurrentCost(0), U("b"): CurrentCost(7, foreign=True), U("c"): CurrentCost(3)}
    result = label_costs(order, one_rs(order), current)
    assert "b" not in result.writes
    assert result.costs[U("a")] < 7 < result.costs[U("c")]
    assert result.conflicts == ()


def test_contradicting_foreign_costs_are_reported_and_left_alone() -> None:
    order = [uids("a"), uids("b")]
    current = {U("a"): CurrentCost(9, foreign=True), U("b"): CurrentCost(1, foreign=True)}
    result = label_costs(order, one_rs(order), current)
    assert result.writes == {}
    assert len(result.conflicts) == 1
    assert result.costs == {"a": 9, "b": 1}


def test_a_hand_set_cost_beyond_the_band_pins_the_pod_without_constraining_the_rest() -> None:
    order = [uids("pinned"), uids("a"), uids("b")]
    current = {U("pinned"): CurrentCost(2_000_000_000, foreign=True)}
    result = label_costs(order, one_rs(order), current)
    assert result.costs[U("pinned")] == 2_000_000_000
    assert result.conflicts == ()
    assert all(result.costs[uid] in DEFAULT_BAND for uid in uids("a", "b"))


def test_overwrite_foreign_treats_foreign_costs_as_podcasts_own() -> None:
    order = [uids("a"), uids("b")]
    current = {U("a"): CurrentCost(9, foreign=True), U("b"): CurrentCost(1, foreign=True)}
    result = label_costs(order, one_rs(order), current, overwrite_foreign=True)
    assert len(result.writes) == 1
    assert result.costs[U("a")] < result.costs[U("b")]


def test_a_pod_listed_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="twice"):
        label_costs([uids("a"), uids("a")], {}, {})


def test_more_groups_than_the_band_holds_is_an_error() -> None:
    order = [uids("a"), uids("b"), uids("c")]
    with pytest.raises(ValueError, match="band"):
        label_costs(order, one_rs(order), {}, band=CostBand(0, 1))


def test_dense_baseline_numbers_the_groups_of_the_whole_order() -> None:
    order = [uids("a", "b"), uids("c")]
    result = dense_costs(order, one_rs(order), costs_of(a=-1_000_000_000))
    assert result.costs == {"a": -1_000_000_000, "b": -1_000_000_000, "c": -999_999_999}
    assert set(result.writes) == {"b", "c"}


@pytest.mark.parametrize(
    ("owner", "raw", "expected"),
    [
        (None, None, CurrentCost(0)),  # no annotation: the controller reads 0, kept if it fits
        (CostOwner.PODCOST, "12", CurrentCost(12)),
        (CostOwner.OTHER, "12", CurrentCost(12, foreign=True)),
        (CostOwner.OTHER, "oops", CurrentCost()),  # invalid: no cost, whoever set it
        (CostOwner.OTHER, "2147483648", CurrentCost()),  # out of int32: invalid too
        (CostOwner.OTHER, "-007", CurrentCost(-7, foreign=True)),  # valid, the controller's -7
        (CostOwner.PODCOST, "012", CurrentCost()),  # ours but unreadable: rewrite
    ],
)
def test_current_costs_read_what_the_controller_reads(
    owner: CostOwner | None, raw: str | None, expected: CurrentCost
) -> None:
    base = pod("p")
    if raw is not None:
        base = replace(
            base,
            annotations={"controller.kubernetes.io/pod-deletion-cost": raw},
            deletion_cost=parse_deletion_cost(raw),
            deletion_cost_raw=raw,
            cost_owner=owner or CostOwner.NONE,
        )
    assert current_costs([base])[base.uid] == expected


# --- brute force ----------------------------------------------------------------------------


def _fixed(cost: CurrentCost) -> bool:
    return cost.foreign and cost.value is not None


def _feasible(
    groups: list[list[PodUID]],
    kept: set[PodUID],
    current: Mapping[PodUID, CurrentCost],
    band: CostBand,
) -> bool:
    """Whether keeping exactly ``kept`` leaves room for everyone else: greedily give each group
    without a kept pod the smallest value above everything before it."""
    floor = band.low - 1
    for group in groups:
        values = [current[uid].value for uid in group if uid in kept]
        known = [value for value in values if value is not None]
        if known:
            if min(known) <= floor:
                return False
            floor = max(known)
        elif any(uid not in kept for uid in group):
            floor += 1
            if floor > band.high:
                return False
    return True


def _best(
    groups: list[list[PodUID]], current: Mapping[PodUID, CurrentCost], band: CostBand
) -> tuple[int, int]:
    """(most foreign costs honoured, then most own costs kept) over every subset."""
    candidates = [
        uid for group in groups for uid in group if current.get(uid, CurrentCost()).value in band
    ]
    best = (0, 0)
    for size in range(len(candidates), -1, -1):
        for chosen in itertools.combinations(candidates, size):
            kept = set(chosen)
            score = (
                sum(1 for uid in kept if _fixed(current[uid])),
                sum(1 for uid in kept if not _fixed(current[uid])),
            )
            if score > best and _feasible(groups, kept, current, band):
                best = score
    return best


@st.composite
def labelling_cases(
    draw: st.DrawFn,
) -> tuple[list[list[PodUID]], dict[PodUID, str | None], dict[PodUID, CurrentCost], CostBand]:
    size = draw(st.integers(1, 7))
    pods = draw(st.permutations([U(f"p{i}") for i in range(size)]))
    cuts = draw(st.lists(st.booleans(), min_size=size - 1, max_size=size - 1))
    order: list[list[PodUID]] = [[pods[0]]]
    for uid, cut in zip(pods[1:], cuts, strict=True):
        if cut:
            order.append([uid])
        else:
            order[-1].append(uid)
    replicasets = {uid: draw(st.sampled_from(["x", "y"])) for uid in pods}
    band = CostBand(0, draw(st.integers(0, 8)))
    current: dict[PodUID, CurrentCost] = {}
    for uid in pods:
        value = draw(st.none() | st.integers(-2, 10))
        current[uid] = CurrentCost(
            value, foreign=value is not None and draw(st.integers(0, 4)) == 0
        )
    return order, dict(replicasets), current, band


def _check_valid(
    result: Labelling,
    order: list[list[PodUID]],
    replicasets: Mapping[PodUID, str | None],
    current: Mapping[PodUID, CurrentCost],
    band: CostBand,
) -> None:
    everyone = [uid for group in order for uid in group]
    assert set(result.costs) == set(everyone)
    for uid in everyone:
        cost = current.get(uid, CurrentCost())
        if _fixed(cost):
            assert result.costs[uid] == cost.value
            assert uid not in result.writes
        elif cost.value != result.costs[uid]:
            assert result.writes[uid] == result.costs[uid]
            assert result.costs[uid] in band
        else:
            assert uid not in result.writes
    position = {uid: index for index, group in enumerate(order) for uid in group}
    ordered = [
        uid
        for uid in everyone
        if uid not in result.conflicts
        and not (_fixed(current[uid]) and current[uid].value not in band)
    ]
    for first, second in itertools.permutations(ordered, 2):
        same_rs = replicasets[first] == replicasets[second]
        if same_rs and position[first] < position[second]:
            assert result.costs[first] < result.costs[second], (first, second, result)


@settings(max_examples=300, deadline=None)
@given(labelling_cases())
def test_labelling_writes_the_fewest_pods_brute_force_finds(
    case: tuple[list[list[PodUID]], dict[PodUID, str | None], dict[PodUID, CurrentCost], CostBand],
) -> None:
    order, replicasets, current, band = case
    groups_fit = sum(1 for _ in order) <= band.high - band.low + 1
    try:
        result = label_costs(order, replicasets, current, band=band)
    except ValueError:
        assert not groups_fit
        return
    _check_valid(result, order, replicasets, current, band)

    pinned = {uid for uid, cost in current.items() if _fixed(cost) and cost.value not in band}
    writes = conflicts = 0
    for replicaset in ("x", "y"):
        groups = [
            [uid for uid in group if replicasets[uid] == replicaset and uid not in pinned]
            for group in order
        ]
        groups = [group for group in groups if group]
        foreign_kept, own_kept = _best(groups, current, band)
        members = [uid for group in groups for uid in group]
        foreign = [uid for uid in members if _fixed(current[uid])]
        writes += len(members) - len(foreign) - own_kept
        conflicts += len(foreign) - foreign_kept
    assert len(result.conflicts) == conflicts
    assert len(result.writes) == writes


@settings(max_examples=100, deadline=None)
@given(labelling_cases())
def test_labelling_with_overwrite_foreign_never_leaves_a_conflict(
    case: tuple[list[list[PodUID]], dict[PodUID, str | None], dict[PodUID, CurrentCost], CostBand],
) -> None:
    order, replicasets, current, _ = case
    result = label_costs(order, replicasets, current, overwrite_foreign=True)
    assert result.conflicts == ()
    own = {uid: CurrentCost(cost.value) for uid, cost in current.items()}
    _check_valid(result, order, replicasets, own, DEFAULT_BAND)


@settings(max_examples=300, deadline=None)
@given(labelling_cases(), st.booleans())
def test_reading_a_missing_annotation_as_0_never_writes_more_and_still_realises_the_order(
    case: tuple[list[list[PodUID]], dict[PodUID, str | None], dict[PodUID, CurrentCost], CostBand],
    wide: bool,
) -> None:
    order, replicasets, before, narrow = case
    band = DEFAULT_BAND if wide else narrow
    # The same pods, those without a cost now read as the controller reads them: 0.
    after = {uid: CurrentCost(0) if cost.value is None else cost for uid, cost in before.items()}
    try:
        old = label_costs(order, replicasets, before, band=band)
    except ValueError:
        return  # more groups than the band holds, either way
    new = label_costs(order, replicasets, after, band=band)
    _check_valid(new, order, replicasets, after, band)
    assert len(new.writes) <= len(old.writes)
    assert len(new.conflicts) == len(old.conflicts)


@st.composite
def previous_labellings(
    draw: st.DrawFn,
) -> tuple[list[list[PodUID]], dict[PodUID, str | None], dict[PodUID, CurrentCost]]:
    """An order and costs as a cluster may hold them when the option is switched on: podcost's
    own earlier costs anywhere in ``DEFAULT_BAND`` (negative ones too), none, or foreign ones."""
    order, replicasets, _, _ = draw(labelling_cases())
    values = st.none() | st.integers(DEFAULT_BAND.low, DEFAULT_BAND.high) | st.integers(-3, 3)
    current = {
        uid: CurrentCost(value := draw(values), foreign=value is not None and draw(st.booleans()))
        for group in order
        for uid in group
    }
    return order, replicasets, current


@settings(max_examples=300, deadline=None)
@given(previous_labellings(), st.booleans())
def test_with_non_negative_costs_every_cost_podcost_writes_is_at_least_0_and_the_order_holds(
    case: tuple[list[list[PodUID]], dict[PodUID, str | None], dict[PodUID, CurrentCost]],
    overwrite: bool,
) -> None:
    order, replicasets, current = case
    result = label_costs(
        order, replicasets, current, overwrite_foreign=overwrite, band=NON_NEGATIVE_BAND
    )
    assert all(0 <= cost <= NON_NEGATIVE_BAND.high for cost in result.writes.values())
    # Karpenter's view: cost / 2^27 added to 1.0; nothing podcost wrote makes a pod count less.
    assert all(0.0 <= cost / 2**27 < 1.0 for cost in result.writes.values())
    checked = current if not overwrite else {u: CurrentCost(c.value) for u, c in current.items()}
    _check_valid(result, order, replicasets, checked, NON_NEGATIVE_BAND)
    if overwrite:
        assert all(0 <= cost < 2**27 for cost in result.costs.values())


# --- the controller follows the labels ------------------------------------------------------


@st.composite
def scale_in_cases(
    draw: st.DrawFn,
) -> tuple[list[list[PodUID]], dict[PodUID, int | None], list[Pod]]:
    size = draw(st.integers(2, 9))
    names = [f"p{i}" for i in range(size)]
    order: list[list[PodUID]] = []
    for name in draw(st.permutations(names)):
        if order and draw(st.booleans()):
            order[-1].append(U(f"uid-{name}"))
        else:
            order.append([U(f"uid-{name}")])
    # Everything below rule 4 varies, so only the costs can explain the order.
    pods = [
        pod(
            name,
            node=draw(st.sampled_from(["n1", "n2", "n3"])),
            ready_since=NOW - draw(st.integers(1, 100_000)),
            restarts=draw(st.integers(0, 3)),
            created=NOW - draw(st.integers(100_000, 200_000)),
            cost=draw(st.none() | st.integers(-5, 5)),
        )
        for name in names
    ]
    previous = {p.uid: p.deletion_cost if p.deletion_cost_raw else None for p in pods}
    return order, previous, pods


@settings(max_examples=100, deadline=None)
@given(scale_in_cases())
def test_written_costs_make_the_controller_delete_in_the_combined_order(
    case: tuple[list[list[PodUID]], dict[PodUID, int | None], list[Pod]],
) -> None:
    order, _, pods = case
    result = label_costs(order, {p.uid: p.replicaset for p in pods}, current_costs(pods))
    assert {p.uid for p in pods if p.deletion_cost == result.costs[p.uid]} >= (
        {p.uid for p in pods} - set(result.writes)
    )
    # Only the writes are applied: a pod left alone keeps its annotation, or has none.
    labelled = [with_cost(p, result.writes[p.uid]) if p.uid in result.writes else p for p in pods]
    position = {uid: index for index, group in enumerate(order) for uid in group}
    for diff in range(1, len(pods)):
        choice = pods_to_delete(labelled, labelled, diff, NOW)
        deleted = {p.uid for p in choice.victims}
        kept = [position[p.uid] for p in labelled if p.uid not in deleted]
        assert max(position[uid] for uid in deleted) <= min(kept)
        # Which pods of a group at the cut go is the controller's affair, but never a
        # pod of another group: every class sits inside one group.
        for members in choice.classes:
            assert len({position[p.uid] for p in members}) == 1
