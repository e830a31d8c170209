"""``node-consolidation`` as a property of the whole decision: podcost ranks, labels costs onto the
pods, and the model of the ReplicaSet controller (``podcost_core.victims``) picks the victims.

For random clusters (nodes holding some of the workload's pods, some also other workloads'
pods, the workload's pods of every controller class) and every scale-in by *k*, the victims
empty as many nodes as the best choice the controller could be steered to, computed here by
brute force over sets of nodes; with all pods ready, that is the best choice of any *k* pods.
With ``topology-spread`` in a dominant tier the zone skew is the least possible first, and
inside each zone the deletions empty the most nodes the zone's share of them can.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.pods import NOW, pod
from tests.unit.snapshots import PROPERTY, ZONE

from podcost_core.combine import rank
from podcost_core.labels import current_costs, label_costs
from podcost_core.model import (
    DELETION_COST_ANNOTATION,
    CostOwner,
    Node,
    NodeName,
    Phase,
    Pod,
    ReplicaSetInfo,
    Resources,
    Snapshot,
    WorkloadRef,
)
from podcost_core.policy import Policy, StrategySpec
from podcost_core.simulate import simulate
from podcost_core.strategies import node_consolidation
from podcost_core.strategies.base import controller_class
from podcost_core.victims import VictimChoice, pods_to_delete, victim_inputs

REPLICASET = "web-1"
CONSOLIDATE = Policy((StrategySpec(node_consolidation.NAME),))
BALANCE_THEN_CONSOLIDATE = Policy(
    (StrategySpec("topology-spread", tier=0), StrategySpec(node_consolidation.NAME, tier=1))
)
#: (phase, ready, scheduled): the controller classes a pod can be in.
STATES = (
    (Phase.RUNNING, True, True),
    (Phase.RUNNING, False, True),
    (Phase.PENDING, False, True),
    (Phase.UNKNOWN, True, True),
    (Phase.PENDING, False, False),
)


def cluster(
    layout: Sequence[tuple[int, int, str]],
    states: Iterable[int] = (),
    restarts: int = 0,
    daemons: int = 0,
) -> Snapshot:
    """A Deployment's snapshot: node *i* holds ``layout[i][0]`` of its pods, ``layout[i][1]``
    other pods and ``daemons`` DaemonSet pods, in zone ``layout[i][2]``; pod *j* gets
    ``STATES[states[j]]`` (default ready)."""
    choices = list(states)
    pods: list[Pod] = []
    nodes: dict[str, Node] = {}
    for index, (own, others, zone) in enumerate(layout):
        name = NodeName(f"node-{index}")
        total = own + others + daemons
        nodes[name] = Node(
            name,
            labels={ZONE: zone},
            allocatable=Resources(8000, 32 << 30, 110),
            requested=Resources(100 * total, 1 << 20, total),
            daemon_pods=daemons,
        )
        for slot in range(own):
            number = len(pods)
            phase, ready, scheduled = STATES[choices[number] if number < len(choices) else 0]
            pods.append(
                pod(
                    f"web-{number:02d}",
                    # UIDs in no relation to the nodes, as the API server's are (rule 8's tie).
                    uid=hashlib.sha256(str(number).encode()).hexdigest()[:12],
                    node=name if scheduled else None,
                    phase=phase,
                    ready=ready,
                    replicaset=REPLICASET,
                    restarts=(number * 7 + slot) % 3 if restarts else 0,
                    created=NOW - 3600 - 60 * (number % 4),
                )
            )
    return Snapshot(
        WorkloadRef("c", "shop", "Deployment", "web"),
        tuple(pods),
        nodes,
        replicas=len(pods),
        replicasets={
            REPLICASET: ReplicaSetInfo(REPLICASET, replicas=len(pods), controller_uid="d")
        },
    )


@st.composite
def clusters(draw: st.DrawFn, *, classes: bool, zones: int = 1) -> Snapshot:
    layout = draw(
        st.lists(
            st.tuples(
                st.integers(0, 5),
                st.sampled_from((0, 0, 0, 1, 3)),
                st.sampled_from([f"zone-{z}" for z in range(zones)]),
            ),
            min_size=1,
            max_size=7,
        )
    )
    total = sum(own for own, _, _ in layout)
    states: list[int] = []
    if classes:
        states = draw(st.lists(st.sampled_from(range(len(STATES))), min_size=total, max_size=total))
    return cluster(
        layout, states, restarts=draw(st.integers(0, 1)), daemons=draw(st.sampled_from((0, 0, 2)))
    )


def with_podcost_costs(snapshot: Snapshot, policy: Policy) -> Snapshot:
    """The snapshot with the costs podcost writes for ``policy`` on its pods."""
    combined = rank(snapshot, policy)
    labelling = label_costs(
        combined.order, {p.uid: p.replicaset for p in snapshot.pods}, current_costs(snapshot.pods)
    )
    pods = tuple(
        replace(
            p, deletion_cost=labelling.costs[p.uid], deletion_cost_raw=str(labelling.costs[p.uid]),
            annotations={**p.annotations, DELETION_COST_ANNOTATION: str(labelling.costs[p.uid])},
            cost_owner=CostOwner.PODCOST,
        )
        if p.uid in labelling.costs else p
        for p in snapshot.pods
    )  # fmt: skip
    return replace(snapshot, pods=pods)


def emptied(snapshot: Snapshot, gone: Collection[str], nodes: Iterable[str] | None = None) -> int:
    """How many nodes (of ``nodes``, default all) hold no active pod but daemon pods once
    ``gone`` are deleted."""
    own: Counter[str | None] = Counter(p.node for p in snapshot.pods if p.active)
    left: Counter[str | None] = Counter(
        p.node for p in snapshot.pods if p.active and p.uid not in gone
    )
    count = 0
    for name in snapshot.nodes if nodes is None else nodes:
        node = snapshot.nodes[name]
        others = node.requested.pods - node.daemon_pods - own[name]
        if own[name] and not left[name] and others == 0:
            count += 1
    return count


def outcomes(choice: VictimChoice) -> Iterable[set[str]]:
    """Every set of pods the controller's unstable sort can delete for this choice."""
    certain = {p.uid for p in choice.certain}
    for picks in itertools.combinations([p.uid for p in choice.tied], choice.tie_picks):
        yield certain | set(picks)


def best_possible(snapshot: Snapshot, k: int) -> int:
    """The most nodes any deletion of ``k`` pods the controller can be steered to empties.

    The controller deletes every pod of a lower class than the *k*-th (unscheduled, pending,
    not ready, ...) before it reads a cost; costs then pick *r* pods of that class. Brute force
    over the sets of nodes whose class pods could be the ones picked.
    """
    pods = sorted((p for p in snapshot.pods if p.active), key=controller_class)
    if k == 0:
        return 0
    cut = controller_class(pods[k - 1])
    forced = {p.uid for p in pods if controller_class(p) < cut}
    picks = k - len(forced)
    at_cut: Counter[str | None] = Counter(p.node for p in pods if controller_class(p) == cut)
    best = 0
    names = [name for name in at_cut if name is not None]
    for size in range(len(names) + 1):
        for chosen in itertools.combinations(names, size):
            needed = sum(at_cut[name] for name in chosen)
            if needed > picks:
                continue
            gone = forced | {p.uid for p in pods if p.node in chosen and controller_class(p) == cut}
            best = max(best, emptied(snapshot, gone))
    return best


@settings(PROPERTY, max_examples=150)
@given(clusters(classes=False))
def test_any_scale_in_of_ready_pods_empties_the_most_nodes_any_k_pods_can(
    snapshot: Snapshot,
) -> None:
    costed = with_podcost_costs(snapshot, CONSOLIDATE)
    pods, related = victim_inputs(costed, REPLICASET)
    for k in range(len(pods) + 1):
        choice = pods_to_delete(pods, related, k, NOW)
        for gone in outcomes(choice):
            assert emptied(costed, gone) == best_possible(costed, k), k


@settings(PROPERTY, max_examples=150)
@given(clusters(classes=True))
def test_with_unscheduled_pending_and_not_ready_pods_each_scale_in_empties_the_most_nodes(
    snapshot: Snapshot,
) -> None:
    costed = with_podcost_costs(snapshot, CONSOLIDATE)
    pods, related = victim_inputs(costed, REPLICASET)
    for k in range(len(pods) + 1):
        choice = pods_to_delete(pods, related, k, NOW)
        for gone in outcomes(choice):
            assert emptied(costed, gone) == best_possible(costed, k), k


def water_filled(sizes: Counter[str], k: int) -> list[int]:
    """Zone sizes after deleting ``k`` pods one at a time from a largest zone."""
    left = Counter(sizes)
    for _ in range(k):
        largest = max(left.values())
        zone = min(zone for zone, size in left.items() if size == largest)
        left[zone] -= 1
    return sorted(left.values())


@settings(PROPERTY, max_examples=150)
@given(clusters(classes=False, zones=3))
def test_with_topology_spread_first_the_skew_is_least_and_each_zone_empties_the_most_nodes(
    snapshot: Snapshot,
) -> None:
    costed = with_podcost_costs(snapshot, BALANCE_THEN_CONSOLIDATE)
    pods, related = victim_inputs(costed, REPLICASET)
    zone_of = {name: node.labels[ZONE] for name, node in costed.nodes.items()}
    sizes = Counter(zone_of[p.node] for p in pods if p.node is not None)
    for k in range(len(pods) + 1):
        choice = pods_to_delete(pods, related, k, NOW)
        for gone in outcomes(choice):
            deleted = Counter(zone_of[p.node] for p in pods if p.uid in gone and p.node)
            after = sorted(sizes[zone] - deleted[zone] for zone in sizes)
            assert after == water_filled(sizes, k), k
            for zone in sizes:
                in_zone = [name for name, z in zone_of.items() if z == zone]
                most = best_in_zone(costed, in_zone, deleted[zone])
                assert emptied(costed, gone, in_zone) == most, (k, zone)


def best_in_zone(snapshot: Snapshot, names: list[str], picks: int) -> int:
    """The most nodes of ``names`` that ``picks`` deletions of ready pods there can empty."""
    own: Counter[str | None] = Counter(p.node for p in snapshot.pods if p.active)
    free = [
        own[name]
        for name in names
        if own[name]
        and snapshot.nodes[name].requested.pods - snapshot.nodes[name].daemon_pods == own[name]
    ]
    best = 0
    for size in range(len(free) + 1):
        for chosen in itertools.combinations(free, size):
            if sum(chosen) <= picks:
                best = max(best, size)
    return best


# --- the KEP-5982 example and the order itself --------------------------------------------------


def test_kep_5982s_example_scaled_from_20_to_10_empties_2_of_5_nodes() -> None:
    snapshot = cluster([(4, 0, "zone-a")] * 5)
    result = simulate(snapshot, 10, NOW, policy=CONSOLIDATE)
    baseline = simulate(snapshot, 10, NOW, policy=None)
    (choice,) = result.rounds
    assert all(emptied(snapshot, gone) == 2 for gone in outcomes(choice))
    # One cost per node, as the controller reads them (one node's pods may keep no annotation,
    # the 0 it reads as, where 0 is that node's cost).
    assert len(set(result.costs.values())) == 5
    # Without podcost: 20 costs of 0 and all 20 pods tie, so the controller draws 10 at random.
    (drawn,) = baseline.rounds
    assert (drawn.tie_picks, len(drawn.tied)) == (10, 20)


def test_simulate_writes_costs_of_at_least_0_when_the_policy_asks_for_non_negative_costs() -> None:
    snapshot = cluster([(4, 0, "zone-a")] * 5)
    policy = Policy((StrategySpec(node_consolidation.NAME),), non_negative_costs=True)
    result = simulate(snapshot, 10, NOW, policy=policy)
    assert all(0 <= cost < 2**27 for cost in result.writes.values())
    (choice,) = result.rounds
    assert all(emptied(snapshot, gone) == 2 for gone in outcomes(choice))


def test_the_pods_of_one_node_are_contiguous_and_the_emptiest_node_goes_first() -> None:
    snapshot = cluster([(3, 0, "z"), (1, 0, "z"), (2, 0, "z"), (1, 2, "z"), (2, 0, "z")])
    order = rank(snapshot, CONSOLIDATE).flat()
    nodes = [next(p.node for p in snapshot.pods if p.uid == uid) for uid in order]
    runs = [name for name, _ in itertools.groupby(nodes)]
    assert len(runs) == len(set(runs))
    # Emptiable nodes by pod count (ties by name), then the one shared with other pods.
    assert runs == ["node-1", "node-2", "node-4", "node-0", "node-3"]


@pytest.mark.parametrize(
    ("measure", "first"), [("dominant", "node-1"), ("cpu", "node-1"), ("count", "node-0")]
)
def test_utilization_breaks_ties_between_nodes_with_as_many_pods_then_the_name(
    measure: str, first: str
) -> None:
    snapshot = cluster([(2, 0, "z"), (2, 0, "z")])
    busy = replace(snapshot.nodes["node-0"], requested=Resources(4000, 1 << 20, 2))
    snapshot = replace(snapshot, nodes={**snapshot.nodes, "node-0": busy})
    scores = node_consolidation.score(snapshot, node_consolidation.Args(measure))
    by_node = {p.node: scores[p.uid] for p in snapshot.pods}
    assert by_node[NodeName(first)] == 0.0


def test_daemonset_pods_do_not_keep_a_node_from_counting_as_one_the_scale_in_can_empty() -> None:
    snapshot = cluster([(1, 1, "z"), (3, 0, "z")], daemons=2)
    order = rank(snapshot, CONSOLIDATE).flat()
    first = next(p.node for p in snapshot.pods if p.uid == order[0])
    assert first == "node-1"  # three pods and two daemons, before one pod beside another's


def test_a_node_without_a_pod_count_is_taken_to_run_the_workloads_pods_only() -> None:
    snapshot = cluster([(2, 0, "z"), (1, 0, "z")])
    unknown = replace(snapshot.nodes["node-0"], requested=Resources())
    snapshot = replace(snapshot, nodes={**snapshot.nodes, "node-0": unknown})
    positions = node_consolidation.node_positions(snapshot, node_consolidation.Args("count"))
    assert positions == {(7, "node-1"): 0, (7, "node-0"): 1}


def test_unscheduled_and_finished_pods_score_zero() -> None:
    snapshot = cluster([(2, 0, "z")], states=[0, 4])
    done = replace(snapshot.pods[0], phase=Phase.FAILED)
    snapshot = replace(snapshot, pods=(done, snapshot.pods[1]))
    assert set(node_consolidation.score(snapshot, node_consolidation.Args()).values()) == {0.0}
