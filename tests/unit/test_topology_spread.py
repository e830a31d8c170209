"""topology-spread: domains, the level rule, and the proof that one order serves every scale-in."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.pods import READY, pod
from tests.unit.snapshots import PROPERTY, least_skew, skew

from podcost_core.model import Node, NodeName, Phase, Pod, PodUID, Snapshot, WorkloadRef
from podcost_core.strategies import topology_spread
from podcost_core.strategies.base import spread_levels

ZONE = topology_spread.DEFAULT_TOPOLOGY_KEY


def zoned(sizes: dict[str, int], extra: tuple[Pod, ...] = ()) -> Snapshot:
    """``sizes[zone]`` ready pods per zone, each on its own node, ready one second apart."""
    pods, nodes = [], {}
    for zone, size in sizes.items():
        for index in range(size):
            name = f"{zone}-{index}"
            nodes[name] = Node(NodeName(name), labels={ZONE: zone})
            pods.append(pod(name, node=name, ready_since=READY + index))
    return Snapshot(WorkloadRef("c", "shop", "Deployment", "web"), (*pods, *extra), nodes)


def deletion_order(snapshot: Snapshot) -> list[PodUID]:
    scores = topology_spread.score(snapshot, topology_spread.Args())
    return sorted(scores, key=lambda uid: (scores[uid], uid))


def zone_counts(snapshot: Snapshot, remaining: set[PodUID]) -> dict[str, int]:
    domains = topology_spread.domains(snapshot, topology_spread.Args())
    counts: dict[str, int] = {}
    for p in snapshot.pods:
        if p.active:
            key = domains[p.uid] or ""
            counts[key] = counts.get(key, 0) + (p.uid in remaining)
    return counts


def test_a_pod_is_in_its_nodes_zone_and_unlabelled_or_unscheduled_pods_share_one_domain() -> None:
    s = Snapshot(
        WorkloadRef("c", "shop", "Deployment", "web"),
        (
            pod("zoned", node="n1"),
            pod("bare", node="n2"),
            pod("lost", node="gone"),
            pod("pending", node=None, phase=Phase.PENDING),
        ),
        {"n1": Node(NodeName("n1"), labels={ZONE: "a"}), "n2": Node(NodeName("n2"))},
    )
    domains = topology_spread.domains(s, topology_spread.Args())
    assert {p.name: domains[p.uid] for p in s.pods} == {
        "zoned": "a",
        "bare": None,
        "lost": None,
        "pending": None,
    }


def test_any_node_label_can_be_the_topology_key() -> None:
    s = Snapshot(
        WorkloadRef("c", "shop", "Deployment", "web"),
        (pod("p", node="n1"),),
        {"n1": Node(NodeName("n1"), labels={"rack": "r7", ZONE: "a"})},
    )
    domains = topology_spread.domains(s, topology_spread.Args(topology_key="rack"))
    assert domains == {PodUID("uid-p"): "r7"}


def test_the_pod_at_position_j_of_a_domain_of_c_pods_scores_minus_c_plus_j() -> None:
    s = zoned({"a": 4, "b": 2, "c": 1})
    scores = topology_spread.score(s, topology_spread.Args())
    # Inside a zone the most recently ready pod goes first (the controller's own preference).
    assert {p.name: scores[p.uid] for p in s.pods} == {
        "a-3": -4.0,
        "a-2": -3.0,
        "a-1": -2.0,
        "a-0": -1.0,
        "b-1": -2.0,
        "b-0": -1.0,
        "c-0": -1.0,
    }


def test_inside_a_domain_the_controllers_preferences_order_the_pods() -> None:
    s = zoned(
        {},
        extra=(
            pod("old", node="n1", ready_since=READY - 100),
            pod("restarting", node="n1", ready_since=READY - 100, restarts=3),
            pod("recent", node="n1", ready_since=READY),
            pod("not-ready", node="n1", ready=False),
            pod("pending", node="n1", phase=Phase.PENDING, ready=False),
            pod("unscheduled", node=None, phase=Phase.PENDING, ready=False),
        ),
    )
    # All in the unlabelled domain; rules 1-3 and 6-8 of the controller decide.
    assert deletion_order(s) == [
        PodUID(f"uid-{name}")
        for name in ("unscheduled", "pending", "not-ready", "recent", "restarting", "old")
    ]


def test_inactive_pods_score_below_every_active_pod_and_do_not_count() -> None:
    s = zoned({"a": 2, "b": 2}, extra=(pod("done", node="a-0", phase=Phase.SUCCEEDED),))
    scores = topology_spread.score(s, topology_spread.Args())
    assert scores[PodUID("uid-done")] == -3.0
    assert min(v for u, v in scores.items() if u != "uid-done") == -2.0


def test_an_empty_workload_has_no_scores() -> None:
    assert topology_spread.score(zoned({}), topology_spread.Args()) == {}


@pytest.mark.parametrize(
    "sizes",
    [{"a": 4, "b": 4, "c": 4}, {"a": 5, "b": 3, "c": 1}, {"a": 7, "b": 1}, {"a": 3}],
    ids=str,
)
def test_deleting_the_first_k_pods_of_one_order_leaves_the_least_skew_for_every_k(
    sizes: dict[str, int],
) -> None:
    s = zoned(sizes)
    order = deletion_order(s)
    for k in range(len(order) + 1):
        remaining = set(order[k:])
        assert skew(zone_counts(s, remaining)) == least_skew(sizes, k), k


def test_the_kep_workflow_example_keeps_the_skew_at_most_one() -> None:
    # KEP "Workflow example": 12 pods, 3 zones evenly; scaling down one by one keeps skew <= 1.
    s = zoned({"az1": 4, "az2": 4, "az3": 4})
    order = deletion_order(s)
    assert all(skew(zone_counts(s, set(order[k:]))) <= 1 for k in range(13))


@PROPERTY
@given(st.lists(st.integers(0, 6), min_size=1, max_size=4))
def test_least_skew_is_what_brute_force_finds(sizes: list[int]) -> None:
    domains = {f"z{i}": size for i, size in enumerate(sizes)}
    for k in range(sum(sizes) + 1):
        best = min(
            max(c - d for c, d in zip(sizes, cut, strict=True))
            - min(c - d for c, d in zip(sizes, cut, strict=True))
            for cut in itertools.product(*(range(size + 1) for size in sizes))
            if sum(cut) == k
        )
        assert least_skew(domains, k) == best


@PROPERTY
@given(st.data())
def test_any_order_inside_domains_gives_levels_whose_descending_order_is_skew_optimal(
    data: st.DataObject,
) -> None:
    domains = data.draw(st.lists(st.sampled_from("abcd"), max_size=30))
    order = data.draw(st.permutations(range(len(domains))))
    levels = spread_levels(order, domains)
    sizes = {d: domains.count(d) for d in set(domains)}
    # Ties between levels broken adversarially: any tie order must do.
    tie_break = data.draw(st.permutations(range(len(domains))))
    deletion = sorted(range(len(domains)), key=lambda i: (-levels[i], tie_break[i]))
    left = dict(sizes)
    for k, index in enumerate(deletion, start=1):
        assert left[domains[index]] == max(left.values())  # always from a largest domain
        left[domains[index]] -= 1
        assert skew(left) == least_skew(sizes, k)


@PROPERTY
@given(st.dictionaries(st.sampled_from("abcde"), st.integers(1, 12), min_size=1))
def test_levels_of_a_domain_are_one_to_its_size(sizes: dict[str, int]) -> None:
    domains = [d for d, size in sizes.items() for _ in range(size)]
    levels = spread_levels(list(range(len(domains))), domains)
    for d, size in sizes.items():
        assert sorted(lv for lv, dom in zip(levels, domains, strict=True) if dom == d) == list(
            range(1, size + 1)
        )
