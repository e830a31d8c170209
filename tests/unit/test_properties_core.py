"""Properties of the strategies and the combiner over arbitrary and zoned snapshots.

No strategy raises on any snapshot; the combined order is a deterministic partition of the
active pods; under the default policy every scale-in leaves the least zone skew possible; a
strategy in the top tier dominates entirely.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.snapshots import (
    PROPERTY,
    domain_sizes,
    least_skew,
    skew,
    snapshots,
    zoned_snapshots,
)

from podcost_core.combine import Combined, combine, rank
from podcost_core.model import Pod, PodUID, Snapshot
from podcost_core.policy import DEFAULT_POLICY, Policy, StrategySpec
from podcost_core.strategies import (
    age,
    capacity_type,
    co_location,
    karpenter,
    node_consolidation,
    priority_qos,
    topology_spread,
    untolerated_taints,
    work_in_progress,
)
from podcost_core.strategies.base import Strategy, active_pods
from podcost_core.strategies.registry import BUILTIN, BUILTIN_REGISTRY

#: Args worth trying beyond the defaults, per strategy.
ARGS: dict[str, st.SearchStrategy[Any]] = {
    topology_spread.NAME: st.sampled_from(
        [topology_spread.Args(), topology_spread.Args("rack"), topology_spread.Args("absent")]
    ),
    capacity_type.NAME: st.builds(
        capacity_type.Args,
        label=st.sampled_from(["", "rack"]),
        price_annotation=st.sampled_from(["", capacity_type.DEFAULT_PRICE_ANNOTATION]),
        known_labels=st.booleans(),
    ),
    untolerated_taints.NAME: st.lists(
        st.sampled_from(untolerated_taints.EFFECTS), min_size=1, unique=True
    ).map(lambda effects: untolerated_taints.Args(tuple(effects))),
    priority_qos.NAME: st.builds(priority_qos.Args, qos=st.booleans()),
    age.NAME: st.builds(
        age.Args,
        direction=st.sampled_from(age.DIRECTIONS),
        saturation_seconds=st.sampled_from([1.0, 3600.0, age.DAY, 1e12]),
        since=st.sampled_from(age.SINCE),
    ),
    work_in_progress.NAME: st.just(work_in_progress.Args()),
    co_location.NAME: st.builds(
        co_location.Args,
        same_node_weight=st.sampled_from([0.0, 1.0]),
        required_weight=st.sampled_from([1.0, 10.0]),
        preferred_weight=st.sampled_from([0.0, 0.5]),
    ),
    node_consolidation.NAME: st.builds(
        node_consolidation.Args, measure=st.sampled_from(node_consolidation.MEASURES)
    ),
    karpenter.NAME: st.just(karpenter.Args()),
}


def test_there_are_args_to_try_for_every_builtin_strategy() -> None:
    assert set(ARGS) == set(BUILTIN)


@PROPERTY
@given(snapshots(), st.sampled_from(sorted(BUILTIN)), st.data())
def test_no_strategy_raises_and_each_scores_every_pod_with_a_finite_float(
    snapshot: Snapshot, name: str, data: st.DataObject
) -> None:
    strategy: Strategy[Any] = BUILTIN[name]
    args = data.draw(ARGS[name])
    scores = strategy.score(snapshot, args)
    assert set(scores) == {pod.uid for pod in snapshot.pods}
    assert all(isinstance(value, float) and math.isfinite(value) for value in scores.values())
    if strategy.domains is not None:
        assert set(strategy.domains(snapshot, args)) == set(scores)


@PROPERTY
@given(snapshots())
def test_active_pods_is_the_pod_active_property_inlined(snapshot: Snapshot) -> None:
    assert active_pods(snapshot) == [pod for pod in snapshot.pods if pod.active]


def check_partition(combined: Combined, snapshot: Snapshot) -> None:
    active = {pod.uid for pod in snapshot.pods if pod.active}
    flat = combined.flat()
    assert sorted(flat) == sorted(active)
    assert set(combined.excluded) == {pod.uid for pod in snapshot.pods} - active
    for group in combined.order:
        assert list(group) == sorted(group)
        assert len({combined.key(uid) for uid in group}) == 1
    firsts = [combined.key(group[0]) for group in combined.order]
    assert firsts == sorted(firsts)
    assert len(set(firsts)) == len(firsts)


@PROPERTY
@given(snapshots())
def test_the_default_policy_ranks_any_snapshot_into_a_partition_of_its_active_pods(
    snapshot: Snapshot,
) -> None:
    check_partition(rank(snapshot), snapshot)


@PROPERTY
@given(snapshots(), st.sets(st.sampled_from(sorted(BUILTIN))))
def test_combining_with_answers_missing_never_raises_and_reports_them(
    snapshot: Snapshot, absent: set[str]
) -> None:
    answers = {
        bound.name: bound.strategy.score(snapshot, bound.args)
        for bound in DEFAULT_POLICY.bound
        if bound.name not in absent
    }
    combined = combine(snapshot, DEFAULT_POLICY, answers)
    check_partition(combined, snapshot)
    assert set(combined.missing) == absent & {
        bound.name for bound in DEFAULT_POLICY.bound if not bound.strategy.spread
    }


@PROPERTY
@given(snapshots(max_pods=15), st.randoms(use_true_random=False))
def test_the_order_does_not_depend_on_the_order_of_the_pods_in_the_snapshot(
    snapshot: Snapshot, random: Any
) -> None:
    pods = list(snapshot.pods)
    random.shuffle(pods)
    assert rank(replace(snapshot, pods=tuple(pods))).order == rank(snapshot).order


# --- zone skew under the default policy --------------------------------------------------------


@PROPERTY
@given(zoned_snapshots(), st.randoms(use_true_random=False))
def test_deleting_the_first_k_pods_of_the_default_order_leaves_the_least_skew_for_every_k(
    snapshot: Snapshot, random: Any
) -> None:
    combined = rank(snapshot)
    # Ties in any order: the controller may pick any pod of a group.
    order = [uid for group in combined.order for uid in random.sample(group, len(group))]
    start = domain_sizes(snapshot, set(order))
    for k in range(len(order) + 1):
        assert skew(domain_sizes(snapshot, set(order[k:]))) == least_skew(start, k)


@settings(PROPERTY, max_examples=60)
@given(zoned_snapshots(max_pods=25), st.randoms(use_true_random=False))
def test_re_ranking_after_each_deletion_never_grows_the_skew_beyond_what_is_unavoidable(
    snapshot: Snapshot, random: Any
) -> None:
    remaining = {pod.uid for pod in snapshot.pods}
    start = domain_sizes(snapshot, remaining)
    previous = skew(start)
    for k in range(1, len(remaining) + 1):
        pods = tuple(pod for pod in snapshot.pods if pod.uid in remaining)
        lowest = rank(replace(snapshot, pods=pods)).order[0]
        remaining.discard(random.choice(lowest))
        now = skew(domain_sizes(snapshot, remaining))
        assert now == least_skew(start, k)
        assert now <= max(previous, 1)
        previous = now


# --- a top-tier strategy dominates -------------------------------------------------------------


def top_tier(name: str) -> Policy:
    """``name`` alone on top, topology-spread next, the rest of the default policy last."""
    rest = [replace(spec, tier=2) for spec in DEFAULT_POLICY.specs if spec.name != name]
    specs = [StrategySpec(name, tier=0), *rest]
    specs = [replace(s, tier=1) if s.name == topology_spread.NAME else s for s in specs]
    return Policy(tuple(specs), BUILTIN_REGISTRY)


def all_before(combined: Combined, first: set[PodUID]) -> bool:
    ranks = combined.ranks
    later = set(ranks) - first
    return all(ranks[a] < ranks[b] for a in first for b in later)


@PROPERTY
@given(zoned_snapshots())
def test_with_capacity_type_on_top_every_spot_pod_goes_before_every_other(
    snapshot: Snapshot,
) -> None:
    args = capacity_type.Args()
    spot = {
        pod.uid
        for pod in snapshot.pods
        if (node := snapshot.node_of(pod)) is not None and capacity_type.is_spot(node, args)
    }
    assert all_before(rank(snapshot, top_tier(capacity_type.NAME)), spot)


def untolerated(snapshot: Snapshot, pod: Pod) -> int:
    node = snapshot.node_of(pod)
    taints = node.taints if node is not None else ()
    return sum(
        1
        for taint in taints
        if taint.effect in untolerated_taints.EFFECTS
        and not any(toleration.tolerates(taint) for toleration in pod.tolerations)
    )


@PROPERTY
@given(zoned_snapshots())
def test_with_untolerated_taints_on_top_pods_on_unwelcoming_nodes_go_first(
    snapshot: Snapshot,
) -> None:
    combined = rank(snapshot, top_tier(untolerated_taints.NAME))
    counts = {pod.uid: untolerated(snapshot, pod) for pod in snapshot.pods}
    for level in set(counts.values()):
        assert all_before(combined, {uid for uid, count in counts.items() if count > level})


@PROPERTY
@given(zoned_snapshots())
def test_with_priority_on_top_lower_priority_pods_all_go_first(snapshot: Snapshot) -> None:
    combined = rank(snapshot, top_tier(priority_qos.NAME))
    for pod in snapshot.pods:
        below = {other.uid for other in snapshot.pods if other.priority < pod.priority}
        assert all(combined.ranks[uid] < combined.ranks[pod.uid] for uid in below)
