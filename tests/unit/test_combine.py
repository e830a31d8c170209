"""The combiner: tiers dominate, weights weigh, ties tie, every cost is explained, gaps reported."""

from __future__ import annotations

from dataclasses import replace
from importlib.metadata import EntryPoint

import pytest
from tests.support.pods import NOW, pod

from podcost_core import combine as combine_module
from podcost_core.combine import (
    Combined,
    Contribution,
    ScoreContractError,
    answers_needed,
    combine,
    rank,
)
from podcost_core.model import Node, NodeName, Phase, Pod, PodUID, Snapshot, WorkloadRef
from podcost_core.policy import DEFAULT_POLICY, Policy, StrategySpec, parse_strategies
from podcost_core.strategies.registry import BUILTIN_REGISTRY, build_registry

ZONE = "topology.kubernetes.io/zone"
SPOT = {"karpenter.sh/capacity-type": "spot"}
U = PodUID


def policy(text: str) -> Policy:
    return Policy(parse_strategies(text), BUILTIN_REGISTRY)


def plugins() -> Policy:
    registry = build_registry(
        [
            EntryPoint(name, f"tests.unit.plugin_fixture:{attribute}", "podcost.strategies")
            for name, attribute in [
                ("broken-normalization", "BROKEN"),
                ("rack-spread", "RACK_SPREAD"),
                ("name-length", "STRATEGY"),
            ]
        ]
    )
    return Policy((StrategySpec("broken-normalization"),), registry)


def snapshot(*pods: Pod, nodes: dict[str, dict[str, str]] | None = None) -> Snapshot:
    nodes = nodes or {}
    return Snapshot(
        WorkloadRef("c", "shop", "Deployment", "web"),
        tuple(pods),
        {name: Node(NodeName(name), labels=labels) for name, labels in nodes.items()},
        version=7,
        taken_at=NOW,
    )


def names(groups: tuple[tuple[PodUID, ...], ...]) -> list[list[str]]:
    return [[uid.removeprefix("uid-") for uid in group] for group in groups]


# A spot pod that is old, an on-demand pod that is young: capacity and age disagree.
SPOT_OLD = pod("spot-old", node="spot", ready_since=NOW - 86_400)
DEMAND_YOUNG = pod("demand-young", node="demand", ready_since=NOW - 60)
DISAGREE = snapshot(SPOT_OLD, DEMAND_YOUNG, nodes={"spot": SPOT, "demand": {}})


def test_a_dominant_tier_decides_whatever_the_next_tier_says() -> None:
    assert names(rank(DISAGREE, policy("capacity-type | age=100")).order) == [
        ["spot-old"],
        ["demand-young"],
    ]
    assert names(rank(DISAGREE, policy("age | capacity-type=100")).order) == [
        ["demand-young"],
        ["spot-old"],
    ]


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("capacity-type=3, age=1", "spot-old"),  # spot 0*3 + 100*1 = 100 < 300 + 0
        ("capacity-type=1, age=3", "demand-young"),  # 100*1 + 0 = 100 < 0 + 300
        ("capacity-type=1, age=1", None),  # 100 = 100: a tie
    ],
)
def test_weights_trade_strategies_off_inside_a_tier(text: str, first: str | None) -> None:
    order = names(rank(DISAGREE, policy(text)).order)
    if first is None:
        assert order == [["demand-young", "spot-old"]]
    else:
        assert order[0] == [first]


def test_every_cost_is_explained_strategy_by_strategy() -> None:
    combined = rank(DISAGREE, policy("capacity-type | age=2"))
    assert combined.breakdown(U("uid-spot-old")) == (
        Contribution("capacity-type", tier=0, weight=1, raw=1.0, normalized=0),
        Contribution("age", tier=1, weight=2, raw=86_400.0, normalized=100),
    )
    assert combined.breakdown(U("uid-demand-young")) == (
        Contribution("capacity-type", tier=0, weight=1, raw=3.0, normalized=100),
        Contribution("age", tier=1, weight=2, raw=60.0, normalized=0),
    )
    assert combined.key(U("uid-spot-old")) == (0, 200)
    assert combined.breakdown(U("uid-spot-old"))[1].points == 200


def mixed() -> Snapshot:
    """Four pods over three nodes in two zones, one spot, one older, one of higher priority."""
    return snapshot(
        pod("a", node="n1"),
        pod("b", node="n1", priority=5),
        pod("c", node="n2", ready_since=NOW - 10),
        pod("d", node="n3"),
        nodes={"n1": {ZONE: "x"}, "n2": {ZONE: "y", **SPOT}, "n3": {ZONE: "y"}},
    )


def test_the_breakdown_adds_up_to_the_key_it_was_sorted_by() -> None:
    s = mixed()
    combined = rank(s)
    for uid in combined.uids:
        points = [0] * len(DEFAULT_POLICY.tiers)
        for part in combined.breakdown(uid):
            points[DEFAULT_POLICY.tiers.index(part.tier)] += part.points
        assert tuple(points) == combined.key(uid)
    keys = [combined.key(uid) for group in combined.order for uid in group]
    assert keys == sorted(keys)


def test_pods_that_tie_on_everything_share_a_group_listed_by_uid() -> None:
    s = snapshot(pod("b", node="n1"), pod("a", node="n2"), pod("c", node="n3"))
    combined = rank(s, policy("capacity-type, age"))
    assert names(combined.order) == [["a", "b", "c"]]
    assert combined.ranks == {U("uid-a"): 0, U("uid-b"): 0, U("uid-c"): 0}
    assert combined.flat() == [U("uid-a"), U("uid-b"), U("uid-c")]


def test_a_missing_answer_is_reported_and_the_others_still_rank() -> None:
    p = policy("capacity-type | age")
    scores = {"capacity-type": {SPOT_OLD.uid: 1.0, DEMAND_YOUNG.uid: 3.0}}
    combined = combine(DISAGREE, p, scores)
    assert combined.missing == ("age",)
    assert not combined.complete
    assert names(combined.order) == [["spot-old"], ["demand-young"]]
    assert [part.strategy for part in combined.breakdown(SPOT_OLD.uid)] == ["capacity-type"]


def test_with_no_answer_at_all_every_pod_ties() -> None:
    combined = combine(DISAGREE, policy("capacity-type | age"), {})
    assert combined.missing == ("capacity-type", "age")
    assert names(combined.order) == [["demand-young", "spot-old"]]


def test_answers_the_policy_does_not_use_are_listed_as_ignored() -> None:
    p = policy("topology-spread | capacity-type")
    answers = {
        "capacity-type": {SPOT_OLD.uid: 1.0, DEMAND_YOUNG.uid: 3.0},
        "topology-spread": {SPOT_OLD.uid: 0.0, DEMAND_YOUNG.uid: 0.0},
        "age": {},
    }
    combined = combine(DISAGREE, p, answers)
    assert combined.ignored == ("age", "topology-spread")
    assert combined.missing == ()


def test_the_combiner_needs_no_answer_from_spread_strategies() -> None:
    assert answers_needed(DEFAULT_POLICY) == (
        "priority-qos",
        "capacity-type",
        "untolerated-taints",
        "co-location",
        "node-consolidation",
        "age",
    )


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        pytest.param({SPOT_OLD.uid: 1.0}, "no score for pod 'uid-demand-young'", id="pod left out"),
        pytest.param({SPOT_OLD.uid: 1.0, DEMAND_YOUNG.uid: float("nan")}, "nan", id="nan"),
        pytest.param({SPOT_OLD.uid: 1.0, DEMAND_YOUNG.uid: float("inf")}, "inf", id="inf"),
        pytest.param({SPOT_OLD.uid: 1.0, DEMAND_YOUNG.uid: "3"}, "'3'", id="text"),
    ],
)
def test_an_answer_that_breaks_the_score_contract_is_an_error_naming_the_strategy(
    answer: dict[PodUID, object], message: str
) -> None:
    with pytest.raises(ScoreContractError, match=message) as raised:
        combine(DISAGREE, policy("age"), {"age": answer})  # type: ignore[dict-item]
    assert raised.value.strategy == "age"
    assert "'age'" in str(raised.value)


def test_a_plugin_normalizing_out_of_range_is_an_error_naming_it() -> None:
    with pytest.raises(ScoreContractError, match=r"broken-normalization.*\[0, 100\]"):
        rank(DISAGREE, plugins())


def test_scores_for_pods_not_ranked_are_accepted() -> None:
    answer = {SPOT_OLD.uid: 1.0, DEMAND_YOUNG.uid: 2.0, U("uid-gone"): 9.0}
    assert names(combine(DISAGREE, policy("age"), {"age": answer}).order) == [
        ["spot-old"],
        ["demand-young"],
    ]


def test_finished_and_terminating_pods_are_not_ranked_but_listed() -> None:
    s = snapshot(pod("running"), pod("done", phase=Phase.SUCCEEDED), pod("leaving", deleting=True))
    combined = rank(s)
    assert names(combined.order) == [["running"]]
    assert combined.excluded == (U("uid-done"), U("uid-leaving"))
    assert combined.version == 7
    with pytest.raises(KeyError):
        combined.breakdown(U("uid-done"))


def test_an_empty_workload_combines_to_an_empty_order() -> None:
    combined = rank(snapshot())
    assert combined.order == ()
    assert combined.uids == ()
    assert combined.flat() == []


def test_a_pod_listed_twice_is_ranked_once() -> None:
    s = snapshot(pod("a"), pod("a"), pod("b", node="n2"))
    assert sorted(rank(s).flat()) == [U("uid-a"), U("uid-b")]


def test_rank_runs_the_policys_strategies_and_combines_their_answers() -> None:
    s = snapshot(
        pod("a", node="n1"),
        pod("b", node="n2", ready_since=NOW - 5),
        pod("c", node="n2"),
        nodes={"n1": {ZONE: "x", **SPOT}, "n2": {ZONE: "y"}},
    )
    answers = {
        bound.name: bound.strategy.score(s, bound.args)
        for bound in DEFAULT_POLICY.bound
        if not bound.strategy.spread
    }
    assert rank(s).order == combine(s, DEFAULT_POLICY, answers).order


# --- spread strategies in context --------------------------------------------------------------


def zones_with(spot_in_a: str) -> Snapshot:
    """Zone a: three pods, one of them (``spot_in_a``) on a spot node; zone b: two pods."""
    pods = [pod(name, node=f"node-{name}") for name in ("a1", "a2", "a3", "b1", "b2")]
    nodes = {f"node-{p.name}": {ZONE: p.name[0]} for p in pods}
    nodes[f"node-{spot_in_a}"] |= SPOT
    return snapshot(*pods, nodes=nodes)


@pytest.mark.parametrize("spot", ["a1", "a2", "a3"])
def test_under_the_default_policy_the_rest_of_the_policy_picks_which_pod_of_a_zone_goes(
    spot: str,
) -> None:
    combined = rank(zones_with(spot))
    # Zone a is the largest: it loses a pod first, and that pod is its spot pod.
    assert names(combined.order)[0] == [spot]
    raw = combined.raw["topology-spread"]
    levels = {uid: -score for uid, score in zip(combined.uids, raw, strict=True)}
    assert levels[U(f"uid-{spot}")] == 3


def test_a_pod_the_controller_deletes_first_anyway_takes_the_top_level_of_its_zone() -> None:
    s = zones_with("a1")
    not_ready = replace(s.pods[1], ready=False, ready_since=None)  # a2
    combined = rank(replace(s, pods=(s.pods[0], not_ready, *s.pods[2:])))
    levels = dict(zip(combined.uids, combined.raw["topology-spread"], strict=True))
    # a2 goes first whatever its cost (rule 3), so the spot pod a1 is levelled after it.
    assert levels[U("uid-a2")] == -3.0
    assert levels[U("uid-a1")] == -2.0


def test_topology_spread_alone_orders_like_its_own_score() -> None:
    s = zones_with("a1")
    combined = rank(s, policy("topology-spread"))
    from podcost_core.strategies import topology_spread

    own = topology_spread.score(s, topology_spread.Args())
    assert list(combined.raw["topology-spread"]) == [own[uid] for uid in combined.uids]


def test_two_spread_strategies_are_levelled_least_dominant_first() -> None:
    registry = build_registry(
        [EntryPoint("rack-spread", "tests.unit.plugin_fixture:RACK_SPREAD", "podcost.strategies")]
    )
    p = Policy((StrategySpec("topology-spread"), StrategySpec("rack-spread", tier=1)), registry)
    pods = []
    nodes: dict[str, dict[str, str]] = {}
    for zone, racks in (("a", "rrrs"), ("b", "rs")):
        for index, rack in enumerate(racks):
            name = f"{zone}{index}"
            nodes[name] = {ZONE: zone, "rack": rack}
            pods.append(pod(name, node=name))
    combined = rank(snapshot(*pods, nodes=nodes), p)
    # Racks first (levels r: a0 4, a1 3, a2 2, b0 1; s: a3 2, b1 1), then zones ordered by those
    # points: zone a goes down to zone b's size first, and the tie at level 2 between a2 and b0
    # goes to a2, the rack-r pod with the higher rack level.
    assert [uid.removeprefix("uid-") for uid in combined.flat()] == [
        "a0",
        "a1",
        "a2",
        "b0",
        "a3",
        "b1",
    ]


def test_combined_keeps_the_policy_it_was_made_with() -> None:
    combined: Combined = rank(DISAGREE, policy("age"))
    assert combined.policy.names == ("age",)
    assert combined.normalized == {"age": [100, 0]}


def test_an_order_s_normalized_scores_are_those_computed_while_combining(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = mixed()
    # Every kind of term: a spread, a threshold, a strategy where all pods tie (all 0).
    specs = (
        StrategySpec("topology-spread"),
        StrategySpec("age", tier=1, threshold=20),
        StrategySpec("untolerated-taints", tier=1),
    )
    policies = [DEFAULT_POLICY, Policy(specs, BUILTIN_REGISTRY)]
    combined = [rank(s, p) for p in policies]
    # Computed afresh from the raw scores by a copy (the cached property is its own).
    expected = [replace(c).normalized for c in combined]
    assert [dict(e) for e in expected] != [{}, {}]
    calls: list[object] = []
    monkeypatch.setattr(combine_module, "normalize", lambda *args: calls.append(args))
    for made, fresh in zip(combined, expected, strict=True):
        assert made.normalized == fresh
        assert list(made.normalized) == list(fresh)  # in the same order
    assert calls == []


def test_the_points_of_every_tier_unpack_from_the_packed_key_that_sorts_like_them() -> None:
    s = snapshot(
        pod("a", node="n1"),
        pod("b", node="n1", priority=5),
        pod("c", node="n2", ready_since=NOW - 10),
        pod("d", node="n3"),
        pod("e", node=None, phase=Phase.PENDING, ready=False, ready_since=None),
        nodes={"n1": {ZONE: "x"}, "n2": {ZONE: "y", **SPOT}, "n3": {ZONE: "y"}},
    )
    three_tiers = policy("topology-spread | capacity-type=2, priority-qos | age=3, co-location")
    combined = rank(s, three_tiers)
    assert len(combined.points) == 3
    for index, uid in enumerate(combined.uids):
        points = [0, 0, 0]
        for part in combined.breakdown(uid):
            points[three_tiers.tiers.index(part.tier)] += part.points
        assert [tier[index] for tier in combined.points] == points
        assert combined.key(uid) == tuple(points)
    by_packed = sorted(range(len(combined.uids)), key=combined.packed.__getitem__)
    assert [combined.keys[i] for i in by_packed] == sorted(combined.keys)
