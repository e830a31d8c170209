"""The pure aggregation: when a decision is due, what it decides, what is ignored, and how a state
is stored. Timelines are tables of inputs at fake times (``now`` is a parameter: no clock)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.pods import NOW, pod
from tests.support.snapshots import large_snapshot
from tests.support.snapshots import snapshot as deployment

from podcost_core import aggregate
from podcost_core.aggregate import (
    AT_ONCE,
    PROGRESS_PART,
    SNAPSHOT_PART,
    AggregationConfig,
    Aggregator,
    Arrival,
    Outcome,
    PolicyResolver,
    Scores,
    StateDecodeError,
    Verdict,
    WorkloadState,
    dump_parts,
    load_parts,
    score_problem,
)
from podcost_core.combine import rank
from podcost_core.implied import drop_implied
from podcost_core.labels import current_costs, label_costs
from podcost_core.model import CostOwner, Node, NodeName, PodUID, Snapshot, WorkloadRef
from podcost_core.policy import (
    DEFAULT_POLICY,
    Policy,
    PolicyError,
    StrategySpec,
    policy_from_annotations,
)
from podcost_core.urgency import first_wrong

CAP, AGE = "capacity-type", "age"
STRATEGIES = {"podcost.dev/enabled": "true", "podcost.dev/strategies": f"{CAP}=3, {AGE}"}
BASE = replace(deployment(pods=4, nodes=4), annotations=STRATEGIES)
KEY = BASE.workload.key
DEADLINE = 5.0


def snap(version: int, snapshot: Snapshot = BASE) -> Snapshot:
    return replace(snapshot, version=version)


def scores(snapshot: Snapshot, strategy: str) -> Scores:
    bound = next(
        b for b in policy_from_annotations(snapshot.annotations).bound if b.name == strategy
    )
    return bound.strategy.score(snapshot, bound.args)


# --- timelines --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snap:
    """The snapshot of ``version`` arrives at ``at``, emitted at ``emitted`` (or ``version``)."""

    version: int
    at: float
    emitted: float | None = None


@dataclass(frozen=True)
class Rank:
    """``strategy``'s answer for ``version`` arrives at ``at``."""

    strategy: str
    version: int
    at: float


@dataclass(frozen=True)
class Tick:
    """Time passes to ``at``."""

    at: float


Event = Snap | Rank | Tick
#: (when, version, complete, missing)
Decided = tuple[float, int, bool, tuple[str, ...]]


def play(events: list[Event], aggregator: Aggregator | None = None) -> list[Decided]:
    """Feed ``events`` in order, asking for a due decision after each; the decisions made."""
    aggregator = aggregator or Aggregator(AggregationConfig(deadline_s=DEADLINE))
    state = WorkloadState(KEY)
    decided: list[Decided] = []
    for event in events:
        if isinstance(event, Snap):
            emitted = float(event.version) if event.emitted is None else event.emitted
            state = aggregator.on_snapshot(
                state, snap(event.version), emitted_at=emitted, now=event.at
            ).state
        elif isinstance(event, Rank):
            answer = scores(snap(event.version), event.strategy)
            state = aggregator.on_ranks(
                state, strategy=event.strategy, version=event.version, scores=answer, now=event.at
            ).state
        state, decision = aggregator.due(state, event.at)
        if decision is not None:
            decided.append((event.at, decision.version, decision.complete, decision.missing))
    return decided


TIMELINES: dict[str, tuple[list[Event], list[Decided]]] = {
    "every answer decides at once, complete": (
        [Snap(1, 0), Rank(CAP, 1, 0.5), Rank(AGE, 1, 1)],
        [(1, 1, True, ())],
    ),
    "a missing answer decides at the deadline, incomplete": (
        [Snap(1, 0), Rank(CAP, 1, 1), Tick(4.9), Tick(5)],
        [(5, 1, False, (AGE,))],
    ),
    "a late answer completes a deadline decision": (
        [Snap(1, 0), Rank(CAP, 1, 1), Tick(5), Tick(6), Rank(AGE, 1, 7)],
        [(5, 1, False, (AGE,)), (7, 1, True, ())],
    ),
    "a deadline decision is made once": (
        [Snap(1, 0), Tick(5), Tick(10), Tick(60)],
        [(5, 1, False, (CAP, AGE))],
    ),
    "answers for an older version are ignored": (
        [Snap(2, 0), Rank(CAP, 1, 1), Rank(AGE, 1, 1), Tick(4.9)],
        [],
    ),
    "a newer snapshot supersedes the pending one": (
        [
            Snap(1, 0),
            Rank(CAP, 1, 1),
            Snap(2, 2),
            Rank(AGE, 1, 3),
            Tick(5),
            Rank(CAP, 2, 6),
            Rank(AGE, 2, 6.5),
        ],
        [(6.5, 2, True, ())],
    ),
    "a newer snapshot after a decision is decided again": (
        [
            Snap(1, 0),
            Rank(CAP, 1, 1),
            Rank(AGE, 1, 1),
            Snap(2, 2),
            Rank(CAP, 2, 3),
            Rank(AGE, 2, 3),
        ],
        [(1, 1, True, ()), (3, 2, True, ())],
    ),
    "answers that come before their snapshot are used when it comes": (
        [Rank(CAP, 1, 0), Rank(AGE, 1, 0.5), Snap(1, 1)],
        [(1, 1, True, ())],
    ),
    "answers for a later version wait while the current one is decided": (
        [
            Snap(1, 0),
            Rank(CAP, 2, 0.5),
            Rank(AGE, 2, 0.5),
            Rank(CAP, 1, 1),
            Rank(AGE, 1, 1),
            Snap(2, 2),
        ],
        [(1, 1, True, ()), (2, 2, True, ())],
    ),
    "a redelivered snapshot changes nothing": (
        [Snap(1, 0), Rank(CAP, 1, 1), Rank(AGE, 1, 1), Snap(1, 2), Tick(10)],
        [(1, 1, True, ())],
    ),
    "a redelivered answer after a complete decision changes nothing": (
        [Snap(1, 0), Rank(CAP, 1, 1), Rank(AGE, 1, 1), Rank(CAP, 1, 2), Tick(10)],
        [(1, 1, True, ())],
    ),
    "an older snapshot arriving late is ignored": (
        [Snap(2, 0), Snap(1, 1), Rank(CAP, 2, 2), Rank(AGE, 2, 2), Tick(10)],
        [(2, 2, True, ())],
    ),
    "a restarted watcher's lower versions are still heard": (
        [
            Snap(7, 0),
            Rank(CAP, 7, 1),
            Rank(AGE, 7, 1),
            Snap(1, 10, emitted=20),
            Rank(CAP, 1, 11),
            Rank(AGE, 1, 11),
        ],
        [(1, 7, True, ()), (11, 1, True, ())],
    ),
    "answers waiting too long for their snapshot are dropped": (
        [Rank(CAP, 3, 0), Tick(61), Snap(3, 62), Rank(AGE, 3, 63), Tick(66.9), Tick(67)],
        [(67, 3, False, (CAP,))],
    ),
}


@pytest.mark.parametrize(
    ("events", "expected"), list(TIMELINES.values()), ids=list(TIMELINES.keys())
)
def test_timeline(events: list[Event], expected: list[Decided]) -> None:
    assert play(events) == expected


# --- outcomes ---------------------------------------------------------------------------------


def started(aggregator: Aggregator, version: int = 2) -> WorkloadState:
    return aggregator.on_snapshot(
        WorkloadState(KEY), snap(version), emitted_at=float(version), now=0.0
    ).state


def test_each_input_says_what_became_of_it() -> None:
    aggregator = Aggregator()
    state = started(aggregator)
    on_ranks = aggregator.on_ranks
    answer = scores(snap(2), CAP)
    assert (
        on_ranks(state, strategy=CAP, version=2, scores=answer, now=1).outcome is Outcome.ACCEPTED
    )
    assert on_ranks(state, strategy=CAP, version=1, scores=answer, now=1).outcome is Outcome.STALE
    assert on_ranks(state, strategy=CAP, version=3, scores=answer, now=1).outcome is Outcome.EARLY
    unused = on_ranks(state, strategy="priority-qos", version=2, scores=answer, now=1)
    assert unused.outcome is Outcome.UNUSED
    assert unused.state is state
    again = on_ranks(state, strategy=CAP, version=2, scores=answer, now=1).state
    assert on_ranks(again, strategy=CAP, version=2, scores=answer, now=2).outcome is (
        Outcome.DUPLICATE
    )
    replay = aggregator.on_snapshot(state, snap(2), emitted_at=2.0, now=3)
    assert replay.outcome is Outcome.DUPLICATE
    older = aggregator.on_snapshot(state, snap(1), emitted_at=1.0, now=3)
    assert older.outcome is Outcome.STALE
    assert older.state is state


def test_a_spread_strategy_answer_is_not_needed_and_a_spread_only_policy_decides_at_once() -> None:
    aggregator = Aggregator()
    only_spread = {"podcost.dev/enabled": "true", "podcost.dev/strategies": "topology-spread"}
    snapshot = replace(snap(1), annotations=only_spread)
    state = aggregator.on_snapshot(WorkloadState(KEY), snapshot, emitted_at=1, now=0).state
    answer = {pod.uid: 1.0 for pod in snapshot.pods}
    unused = aggregator.on_ranks(state, strategy="topology-spread", version=1, scores=answer, now=0)
    assert unused.outcome is Outcome.UNUSED
    _, decision = aggregator.due(state, 0)
    assert decision is not None
    assert decision.complete
    assert decision.combined.order == rank(snapshot, policy_from_annotations(only_spread)).order


def test_a_policy_with_non_negative_costs_decides_costs_of_at_least_0() -> None:
    default = Policy((StrategySpec("node-consolidation"),), non_negative_costs=True)
    aggregator = Aggregator(policies=PolicyResolver(default))
    snapshot = replace(snap(1), annotations={"podcost.dev/enabled": "true"})
    state = aggregator.on_snapshot(WorkloadState(KEY), snapshot, emitted_at=1, now=0).state
    answer = scores(snapshot, "node-consolidation")
    state = aggregator.on_ranks(
        state, strategy="node-consolidation", version=1, scores=answer, now=0
    ).state
    _, decision = aggregator.due(state, 0)
    assert decision is not None
    assert decision.labelling.writes
    assert all(0 <= cost < 2**27 for cost in decision.labelling.costs.values())


def test_an_invalid_policy_is_refused_and_leaves_the_state_as_it_was() -> None:
    aggregator = Aggregator()
    state = started(aggregator)
    bad = replace(snap(3), annotations={"podcost.dev/strategies": "no-such-strategy"})
    with pytest.raises(PolicyError, match="no-such-strategy"):
        aggregator.on_snapshot(state, bad, emitted_at=3.0, now=1)
    assert state.version == 2


def test_a_snapshot_of_another_workload_is_a_programming_error() -> None:
    other = replace(BASE, workload=WorkloadRef("c", "shop", "Deployment", "api"))
    with pytest.raises(ValueError, match="given to"):
        Aggregator().on_snapshot(WorkloadState(KEY), other, emitted_at=1, now=0)


def test_only_the_newest_versions_wait_for_their_snapshot() -> None:
    aggregator = Aggregator(AggregationConfig(early_versions=2))
    state = WorkloadState(KEY)
    for version in (5, 3, 4):
        state = aggregator.on_ranks(
            state, strategy=CAP, version=version, scores=scores(snap(version), CAP), now=0
        ).state
    assert [waiting.version for waiting in state.progress.early] == [4, 5]


# --- what is decided --------------------------------------------------------------------------


def workload_with_costs() -> Snapshot:
    """Six pods in two ReplicaSets on spot and on-demand nodes, some already labelled, one by
    a person: the decision must be exactly ``rank`` + ``label_costs``."""
    nodes = {
        f"node-{i}": Node(NodeName(f"node-{i}"), labels={
            "topology.kubernetes.io/zone": f"zone-{i % 3}",
            "karpenter.sh/capacity-type": "spot" if i % 2 else "on-demand",
        })
        for i in range(6)
    }  # fmt: skip
    pods = (
        pod("a", node="node-0", replicaset="web-1", cost=100),
        pod("b", node="node-1", replicaset="web-1", cost=-100),
        pod("c", node="node-2", replicaset="web-1", created=NOW - 60),
        pod("d", node="node-3", replicaset="web-2", cost=5, cost_owner=CostOwner.OTHER),
        pod("e", node="node-4", replicaset="web-2"),
        pod("f", node="node-5", replicaset="web-2", cost=7),
    )
    return Snapshot(
        WorkloadRef("c", "shop", "Deployment", "web"),
        pods,
        nodes,
        annotations={"podcost.dev/enabled": "true"},
        version=3,
        taken_at=NOW,
    )


def test_a_complete_decision_is_rank_then_label_costs_against_the_costs_on_the_pods() -> None:
    snapshot = workload_with_costs()
    aggregator = Aggregator()
    state = aggregator.on_snapshot(
        WorkloadState(snapshot.workload.key), snapshot, emitted_at=1, now=0, trace={"a": "b"}
    ).state
    for bound in DEFAULT_POLICY.bound:
        if not bound.strategy.spread:
            answer = bound.strategy.score(snapshot, bound.args)
            state = aggregator.on_ranks(
                state, strategy=bound.name, version=3, scores=answer, now=1
            ).state
    state, decision = aggregator.due(state, 1)
    assert decision is not None
    expected = rank(snapshot, DEFAULT_POLICY)
    current = current_costs(snapshot.pods)
    labelled = label_costs(expected.order, {p.uid: p.replicaset for p in snapshot.pods}, current)
    labelled = drop_implied(labelled, expected.order, snapshot, current)
    assert decision.complete
    assert decision.combined.order == expected.order
    assert decision.labelling == labelled
    assert decision.trace == {"a": "b"}
    assert state.progress.verdict is Verdict.COMPLETE

    # The order's groups handed down (Combined.ranks) decide as the order itself does.
    assert decision.combined.ranks == {
        uid: index for index, group in enumerate(expected.order) for uid in group
    }
    assert decision.first_wrong == first_wrong(expected.order, snapshot)

    pods = {p.pod.name: p for p in decision.pods()}
    assert set(pods) == set("abcdef")
    assert pods["d"].cost == 5  # a person's cost is left alone
    assert not pods["d"].changes
    assert {name for name, p in pods.items() if p.changes} == {
        snapshot.pods[i].name for i, p in enumerate(snapshot.pods) if p.uid in labelled.writes
    }
    assert pods["c"].previous == 0  # no annotation: the controller reads 0
    for p in pods.values():
        assert [term.strategy for term in p.breakdown] == [b.name for b in DEFAULT_POLICY.bound]


def test_an_answer_that_breaks_the_score_contract_is_left_out_and_counted_missing() -> None:
    aggregator = Aggregator()
    state = started(aggregator, version=1)
    partial = dict(list(scores(snap(1), CAP).items())[1:])  # a pod without a score
    state = aggregator.on_ranks(state, strategy=CAP, version=1, scores=partial, now=1).state
    state = aggregator.on_ranks(
        state, strategy=AGE, version=1, scores=scores(snap(1), AGE), now=1
    ).state
    state, decision = aggregator.due(state, 1)
    assert decision is not None
    assert not decision.complete
    assert decision.missing == (CAP,)
    assert "no score for pod" in decision.rejected[CAP]
    assert state.progress.verdict is Verdict.PARTIAL
    assert aggregator.due(state, 2)[1] is None  # not decided again until a new answer

    fixed = aggregator.on_ranks(state, strategy=CAP, version=1, scores=scores(snap(1), CAP), now=3)
    _, complete = aggregator.due(fixed.state, 3)
    assert complete is not None
    assert complete.complete


def test_the_next_wakeup_is_the_deadline_then_the_expiry_of_waiting_answers() -> None:
    aggregator = Aggregator(AggregationConfig(deadline_s=5, early_ttl_s=30))
    state = started(aggregator, version=1)
    assert aggregator.next_wakeup(state) == 5.0
    state = aggregator.on_ranks(state, strategy=CAP, version=4, scores={}, now=2).state
    assert aggregator.next_wakeup(state) == 5.0
    state, _ = aggregator.due(state, 5.0)
    assert aggregator.next_wakeup(state) == 32.0
    assert Aggregator.waiting(state)
    state, _ = aggregator.due(state, 32.0)
    assert aggregator.next_wakeup(state) is None
    assert not Aggregator.waiting(state)


@pytest.mark.parametrize(
    "config",
    [{"deadline_s": 0}, {"deadline_s": math.nan}, {"early_ttl_s": -1}, {"early_versions": 0}],
)
def test_a_config_that_cannot_work_is_refused(config: Mapping[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        AggregationConfig(**config)  # type: ignore[arg-type]


# --- policies and answers ---------------------------------------------------------------------


def test_the_resolver_gives_the_cluster_default_unless_the_workload_says_otherwise() -> None:
    cluster = Policy((StrategySpec(AGE), StrategySpec(CAP, weight=2)))
    resolver = PolicyResolver(cluster)
    assert resolver({"podcost.dev/enabled": "true"}).specs == cluster.specs
    own = resolver(STRATEGIES)
    assert [b.name for b in own.bound] == [CAP, AGE]
    assert resolver({**STRATEGIES, "unrelated": "x"}) is own  # cached on the policy annotations
    assert PolicyResolver()({"podcost.dev/enabled": "true"}).specs == DEFAULT_POLICY.specs
    with pytest.raises(PolicyError, match="arg 'bogus': unknown arg"):
        resolver({"podcost.dev/args.age": "bogus=1"})


def test_a_snapshot_s_policy_is_resolved_once_for_its_whole_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolved: list[Mapping[str, str]] = []

    def relevant(annotations: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        resolved.append(annotations)
        return original(annotations)

    original = aggregate._relevant
    monkeypatch.setattr(aggregate, "_relevant", relevant)
    aggregator = Aggregator()
    state = aggregator.on_snapshot(WorkloadState(KEY), BASE, emitted_at=1, now=0).state
    for strategy in (CAP, AGE):
        state = aggregator.on_ranks(
            state, strategy=strategy, version=BASE.version, scores=scores(BASE, strategy), now=1
        ).state
        state, decision = aggregator.due(state, 1)
    assert decision is not None
    assert decision.complete
    assert resolved == [BASE.annotations]
    # Equal annotations in another mapping (the next snapshot) are resolved again, to the same
    # policy (cached by content).
    copy = replace(BASE, annotations=dict(BASE.annotations), version=BASE.version + 1)
    assert aggregator.policies.of(copy) is aggregator.policies.of(BASE)
    assert len(resolved) == 2


@pytest.mark.parametrize(("size", "kept"), [(2, 2), (10_000, aggregate._SEEN_AT_MOST)])
def test_the_resolver_keeps_the_annotations_of_its_latest_snapshots_only(
    size: int, kept: int
) -> None:
    resolver = PolicyResolver(size=size)
    snapshots = [replace(BASE, annotations=dict(STRATEGIES)) for _ in range(kept + 1)]
    policies = [resolver.of(snapshot) for snapshot in snapshots]
    assert all(policy is policies[0] for policy in policies)
    remembered = [mapping for mapping, _ in resolver._seen.values()]
    assert remembered == [snapshot.annotations for snapshot in snapshots[1:]]
    assert all(a is b.annotations for a, b in zip(remembered, snapshots[1:], strict=True))


U = PodUID


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({U("uid-a"): 1.0, U("uid-b"): 2.0}, None),
        ({U("uid-a"): 1.0}, "no score for pod 'uid-b'"),
        (
            {U("uid-a"): 1.0, U("uid-b"): math.nan},
            "the score of pod 'uid-b' is nan, not a finite number",
        ),
        (
            {U("uid-a"): math.inf, U("uid-b"): 0.0},
            "the score of pod 'uid-a' is inf, not a finite number",
        ),
        ({U("uid-a"): 1, U("uid-b"): 0}, None),
    ],
)
def test_an_answer_must_score_every_active_pod_with_a_finite_number(
    answer: Scores, problem: str | None
) -> None:
    snapshot = Snapshot(
        WorkloadRef("c", "shop", "Deployment", "web"),
        (pod("a"), pod("b"), pod("gone", deleting=True)),
    )
    assert score_problem(snapshot, answer) == problem


# --- storing a state --------------------------------------------------------------------------


def test_a_state_is_stored_in_two_parts_and_read_back_equal() -> None:
    aggregator = Aggregator()
    state = started(aggregator, version=2)
    state = aggregator.on_ranks(
        state, strategy=CAP, version=2, scores=scores(snap(2), CAP), now=1
    ).state
    state = aggregator.on_ranks(
        state, strategy=AGE, version=3, scores=scores(snap(3), AGE), now=1
    ).state
    parts = dump_parts(None, state)
    assert set(parts) == {SNAPSHOT_PART, PROGRESS_PART}
    assert load_parts(KEY, parts) == state

    later = aggregator.on_ranks(state, strategy=AGE, version=2, scores=scores(snap(2), AGE), now=2)
    changed = dump_parts(state, later.state)
    assert set(changed) == {PROGRESS_PART}  # the snapshot is written once per version
    assert load_parts(KEY, {**parts, **changed}) == later.state


def test_a_progress_part_over_its_limit_leaves_out_the_early_answers_first() -> None:
    # Seven strategies' early answers for a 10,000-pod version: more than one Kafka record.
    rng = random.Random(3)
    uids = [PodUID(f"{rng.getrandbits(128):032x}") for _ in range(10_000)]
    aggregator = Aggregator()
    state = started(aggregator, version=2)
    for index in range(7):
        early = {uid: rng.random() for uid in uids}
        state = aggregator.on_ranks(state, strategy=f"s{index}", version=3, scores=early,
                                    now=1).state  # fmt: skip
    assert len(dump_parts(None, state)[PROGRESS_PART]) > 1_048_576
    told: list[str] = []
    parts = dump_parts(None, state, max_progress_bytes=1_000_000, on_trimmed=told.append)
    assert len(parts[PROGRESS_PART]) <= 1_000_000
    assert told == ["the answers for later versions"]
    loaded = load_parts(KEY, parts)
    assert loaded.latest == state.latest
    assert [(w.version, dict(w.answers)) for w in loaded.progress.early] == [(3, {})]


def test_answers_stored_for_another_snapshot_than_the_stored_one_are_dropped() -> None:
    aggregator = Aggregator()
    old = started(aggregator, version=2)
    old = aggregator.on_ranks(
        old, strategy=CAP, version=2, scores=scores(snap(2), CAP), now=1
    ).state
    new = aggregator.on_snapshot(old, snap(3), emitted_at=3.0, now=2).state
    # A crash after the snapshot part was written, before the progress part was.
    mixed = {SNAPSHOT_PART: dump_parts(None, new)[SNAPSHOT_PART]}
    mixed[PROGRESS_PART] = dump_parts(None, old)[PROGRESS_PART]
    loaded = load_parts(KEY, mixed)
    assert loaded.version == 3
    assert loaded.progress.answers == {}


def answered(
    aggregator: Aggregator, state: WorkloadState, version: int, *names: str
) -> WorkloadState:
    for name in names:
        state = aggregator.on_ranks(
            state, strategy=name, version=version, scores=scores(snap(version), name), now=1
        ).state
    return state


def test_a_snapshot_stored_without_its_progress_is_pending_not_taken_for_decided() -> None:
    aggregator = Aggregator(AggregationConfig(deadline_s=DEADLINE))
    decided, decision = aggregator.due(answered(aggregator, started(aggregator), 2, CAP, AGE), 1)
    assert decision is not None
    assert decided.progress.verdict is Verdict.COMPLETE
    # One answer for version 3 came before its snapshot; then the snapshot, whose two parts a
    # crash tore: the snapshot part was written, the progress part (version 2's, complete) not.
    # That is also what is stored when the new snapshot's progress is not written at all.
    early = answered(aggregator, decided, 3, CAP)
    new = aggregator.on_snapshot(early, snap(3), emitted_at=3.0, now=2).state
    parts = dump_parts(None, early)
    assert set(dump_parts(early, new)) == {SNAPSHOT_PART}  # the progress is implied
    torn = {**parts, SNAPSHOT_PART: dump_parts(early, new)[SNAPSHOT_PART]}
    told: list[tuple[int | None, int]] = []
    loaded = load_parts(KEY, torn, on_torn=lambda *versions: told.append(versions))
    assert load_parts(KEY, parts, on_torn=lambda *versions: told.append(versions)) == early
    assert told == []  # an earlier snapshot's progress is no tear worth a warning
    assert loaded == new  # pending, with the answer that waited for it
    assert loaded.progress.verdict is Verdict.PENDING

    # The records are read again (they were not committed): the snapshot is a duplicate, the
    # missing answer decides version 3.
    again = aggregator.on_snapshot(loaded, snap(3), emitted_at=3.0, now=3)
    assert again.outcome is Outcome.DUPLICATE
    _, decision = aggregator.due(answered(aggregator, again.state, 3, CAP, AGE), 3)
    assert decision is not None
    assert decision.version == 3
    assert decision.complete


def test_a_progress_stored_without_its_snapshot_leaves_the_stored_snapshot_pending() -> None:
    aggregator = Aggregator(AggregationConfig(deadline_s=DEADLINE))
    decided, _ = aggregator.due(answered(aggregator, started(aggregator), 2, CAP, AGE), 1)
    new = aggregator.on_snapshot(decided, snap(3), emitted_at=3.0, now=2).state
    new = answered(aggregator, new, 3, CAP)
    new = answered(aggregator, new, 4, AGE)  # early, for a version not seen yet
    # The progress part of version 3 was written, its snapshot part not.
    torn = {
        SNAPSHOT_PART: dump_parts(None, decided)[SNAPSHOT_PART],
        PROGRESS_PART: dump_parts(None, new)[PROGRESS_PART],
    }
    told: list[tuple[int | None, int]] = []
    loaded = load_parts(KEY, torn, on_torn=lambda *versions: told.append(versions))
    assert told == [(3, 2)]
    assert loaded.version == 2
    assert loaded.progress.verdict is Verdict.PENDING
    assert loaded.progress.answers == {}
    assert [waiting.version for waiting in loaded.progress.early] == [4]
    # Read again, version 3's snapshot replaces it, and its answers decide it.
    again = aggregator.on_snapshot(loaded, snap(3), emitted_at=3.0, now=3).state
    _, decision = aggregator.due(answered(aggregator, again, 3, CAP, AGE), 3)
    assert decision is not None
    assert decision.version == 3


def test_a_new_snapshot_is_stored_without_its_progress_when_the_stored_one_implies_it() -> None:
    aggregator = Aggregator(AggregationConfig(deadline_s=DEADLINE))
    first = started(aggregator)
    assert set(dump_parts(None, first)) == {SNAPSHOT_PART}  # nothing stored: no answers yet
    decided, _ = aggregator.due(answered(aggregator, first, 2, CAP, AGE), 1)
    stored = dump_parts(None, decided)
    new = aggregator.on_snapshot(decided, snap(3), emitted_at=3.0, now=2).state
    changed = dump_parts(decided, new)
    assert set(changed) == {SNAPSHOT_PART}
    assert load_parts(KEY, {**stored, **changed}) == new
    # A second snapshot before anything else: the stored progress is version 2's, not the one
    # left unwritten, so this one is written in full.
    newer = aggregator.on_snapshot(new, snap(4), emitted_at=4.0, now=3).state
    assert set(dump_parts(new, newer)) == {SNAPSHOT_PART, PROGRESS_PART}
    # A restarted watcher's snapshot of the stored version: load_parts would take the stored
    # progress (complete) as its own, so it is written too.
    again = aggregator.on_snapshot(decided, snap(2), emitted_at=5.0, now=3).state
    assert again.progress.verdict is Verdict.PENDING
    assert set(dump_parts(decided, again)) == {SNAPSHOT_PART, PROGRESS_PART}


@dataclass(frozen=True)
class Store:
    """A step of :func:`test_a_state_read_back_from_what_was_stored_is_the_state_kept`."""

    kind: str
    version: int
    strategy: str = CAP


STORE_STEPS = st.lists(
    st.builds(
        Store,
        kind=st.sampled_from(["snapshot", "answer", "tick"]),
        version=st.integers(min_value=1, max_value=5),
        strategy=st.sampled_from([CAP, AGE]),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(STORE_STEPS)
def test_a_state_read_back_from_what_was_stored_is_the_state_kept(steps: list[Store]) -> None:
    # What the faust transport does: after each change, store the parts that differ from the
    # state as last stored; reading the parts back must always give the state kept in memory,
    # whichever parts were left unwritten.
    aggregator = Aggregator(AggregationConfig(deadline_s=DEADLINE, early_ttl_s=30))
    state, store, now = WorkloadState(KEY), {}, 0.0
    kept: WorkloadState | None = None
    for step in steps:
        now += 1
        if step.kind == "snapshot":
            new = aggregator.on_snapshot(state, snap(step.version), emitted_at=now, now=now).state
        elif step.kind == "answer":
            answer = scores(snap(step.version), step.strategy)
            new = aggregator.on_ranks(
                state, strategy=step.strategy, version=step.version, scores=answer, now=now
            ).state
        else:
            now += DEADLINE * step.version
            new, _ = aggregator.due(state, now)
        new, _ = aggregator.due(new, now)
        if new is state:
            continue
        store.update(dump_parts(kept, new))
        kept = state = new
        assert load_parts(KEY, store) == state


def test_a_10000_pod_workload_state_fits_in_kafka_records() -> None:
    snapshot = replace(large_snapshot(), annotations=STRATEGIES)
    aggregator = Aggregator()
    state = aggregator.on_snapshot(
        WorkloadState(snapshot.workload.key), snapshot, emitted_at=1, now=0
    ).state
    for name in (CAP, AGE):
        state = aggregator.on_ranks(
            state, strategy=name, version=snapshot.version, scores=scores(snapshot, name), now=1
        ).state
    parts = dump_parts(None, state)
    assert all(len(blob) < 1_000_000 for blob in parts.values())
    assert load_parts(snapshot.workload.key, parts) == state


def test_a_stored_part_that_cannot_be_read_is_a_clear_error() -> None:
    with pytest.raises(StateDecodeError, match="cannot be read"):
        load_parts(KEY, {PROGRESS_PART: b'{"verdict": "maybe"}'})


# --- the change time and workloads that are gone -----------------------------------------------


def test_a_decision_carries_the_change_time_of_its_snapshot_and_a_stored_state_keeps_it() -> None:
    aggregator = Aggregator()
    state = aggregator.on_snapshot(
        WorkloadState(KEY), snap(2), emitted_at=2.0, now=2.5, changed_at=1.25
    ).state
    assert load_parts(KEY, dump_parts(None, state)) == state
    for name in (CAP, AGE):
        state = aggregator.on_ranks(
            state, strategy=name, version=2, scores=scores(snap(2), name), now=3
        ).state
    _, decision = aggregator.due(state, 3)
    assert decision is not None
    assert decision.changed_at == 1.25


def test_a_state_stored_before_the_change_time_existed_still_loads_without_it() -> None:
    state = Aggregator().on_snapshot(WorkloadState(KEY), snap(2), emitted_at=2.0, now=2.5).state
    parts = dict(dump_parts(None, state))
    stored = json.loads(parts[SNAPSHOT_PART])
    del stored["changed_at"]
    parts[SNAPSHOT_PART] = json.dumps(stored).encode()
    loaded = load_parts(KEY, parts)
    assert loaded == state
    assert loaded.latest is not None
    assert loaded.latest.changed_at is None


@pytest.mark.parametrize(
    ("emitted_at", "version", "outcome"),
    [
        (3.0, 3, Outcome.ACCEPTED),  # after the latest snapshot: forget the workload
        (2.0, 3, Outcome.ACCEPTED),  # same time, later version
        (2.0, 2, Outcome.ACCEPTED),  # said right after that very snapshot
        (1.0, 9, Outcome.STALE),  # an older watcher's word: the workload came back since
        (2.0, 1, Outcome.STALE),
    ],
)
def test_a_workload_gone_is_forgotten_unless_a_later_snapshot_came_since(
    emitted_at: float, version: int, outcome: Outcome
) -> None:
    state = Aggregator().on_snapshot(WorkloadState(KEY), snap(2), emitted_at=2.0, now=2.5).state
    assert Aggregator.on_gone(state, emitted_at=emitted_at, version=version) is outcome


@pytest.mark.parametrize(
    ("listed_at", "outcome"),
    [
        (3.0, Outcome.ACCEPTED),  # listed after its snapshot, and left out: forget it
        (2.0, Outcome.STALE),  # listed at the very time of its snapshot: it may be new
        (1.0, Outcome.STALE),  # a set older than its snapshot: the workload came since
    ],
)
def test_a_workload_left_out_of_a_live_set_is_forgotten_unless_its_snapshot_is_later(
    listed_at: float, outcome: Outcome
) -> None:
    state = Aggregator().on_snapshot(WorkloadState(KEY), snap(2), emitted_at=2.0, now=2.5).state
    assert Aggregator.on_unlisted(state, listed_at=listed_at) is outcome


def test_answers_without_a_snapshot_are_forgotten_by_a_later_live_set_only() -> None:
    state = (
        Aggregator()
        .on_ranks(WorkloadState(KEY), strategy="age", version=2, scores={}, now=5.0)
        .state
    )
    assert state.latest is None
    assert state.progress.early
    # Answers that came after the set may be of a workload created since: kept.
    assert Aggregator.on_unlisted(state, listed_at=4.0) is Outcome.STALE
    assert Aggregator.on_unlisted(state, listed_at=6.0) is Outcome.ACCEPTED


def test_a_workload_gone_before_any_snapshot_has_nothing_to_keep() -> None:
    assert Aggregator.on_gone(WorkloadState(KEY), emitted_at=0.0, version=0) is Outcome.ACCEPTED


# --- states that describe nothing -------------------------------------------------------------

HORIZON = 30.0


def test_an_answer_after_its_workload_is_gone_describes_nothing_once_its_horizon_passed() -> None:
    aggregator = Aggregator(AggregationConfig(deadline_s=DEADLINE, early_ttl_s=HORIZON))
    # The gone message dropped the state: the late answer starts one, as an early answer would.
    late = aggregator.on_ranks(
        WorkloadState(KEY), strategy=AGE, version=3, scores=scores(snap(3), AGE), now=10.0
    )
    assert late.outcome is Outcome.EARLY
    assert not Aggregator.describes_nothing(late.state)
    assert aggregator.next_wakeup(late.state) == 10.0 + HORIZON
    before, decision = aggregator.due(late.state, 10.0 + HORIZON - 0.1)
    assert decision is None
    assert not Aggregator.describes_nothing(before)
    after, decision = aggregator.due(before, 10.0 + HORIZON)
    assert decision is None
    assert Aggregator.describes_nothing(after)
    assert aggregator.next_wakeup(after) == AT_ONCE


def test_an_early_answer_whose_snapshot_comes_within_the_horizon_is_decided() -> None:
    aggregator = Aggregator(AggregationConfig(deadline_s=DEADLINE, early_ttl_s=HORIZON))
    state = WorkloadState(KEY)
    for strategy in (CAP, AGE):
        state = aggregator.on_ranks(
            state, strategy=strategy, version=2, scores=scores(snap(2), strategy), now=1.0
        ).state
    state, _ = aggregator.due(state, 1.0 + HORIZON - 0.1)
    assert not Aggregator.describes_nothing(state)
    step = aggregator.on_snapshot(state, snap(2), emitted_at=0.5, now=1.0 + HORIZON - 0.1)
    state, decision = aggregator.due(step.state, 1.0 + HORIZON - 0.1)
    assert decision is not None
    assert decision.complete
    # A state with a snapshot holds something, however long after.
    state, _ = aggregator.due(state, 10 * HORIZON)
    assert not Aggregator.describes_nothing(state)


def test_a_stored_state_that_describes_nothing_is_due_at_once() -> None:
    """As left by a version that kept such states (a progress part, no snapshot part)."""
    aggregator = Aggregator(AggregationConfig(deadline_s=DEADLINE, early_ttl_s=HORIZON))
    parts = dump_parts(None, WorkloadState(KEY))
    assert set(parts) == {PROGRESS_PART}
    state = load_parts(KEY, parts)
    assert Aggregator.describes_nothing(state)
    assert aggregator.next_wakeup(state) == AT_ONCE
    assert aggregator.stored_wakeup(KEY, parts[PROGRESS_PART], None) == AT_ONCE
    assert not Aggregator.waiting(state)


#: One input of a timeline of one workload: a snapshot, or a strategy's answer, of a version.
_ARRIVALS = st.one_of(
    st.tuples(st.just("snapshot"), st.integers(2, 5), st.just("")),
    st.tuples(st.just("rank"), st.integers(2, 8), st.sampled_from([CAP, AGE])),
)


@settings(max_examples=150, deadline=None)
@given(inputs=st.lists(st.tuples(_ARRIVALS, st.floats(0.0, 2 * HORIZON)), max_size=14))
def test_a_state_describes_nothing_only_once_every_answer_waited_its_horizon_without_snapshot(
    inputs: list[tuple[tuple[str, int, str], float]],
) -> None:
    """Along any timeline of snapshots and answers, each followed by a tick (``due``), a state
    describes nothing exactly when no snapshot came and every version answered has waited the
    horizon since its first answer (or was pushed out by ``early_versions`` newer ones): an
    answer that may still meet its snapshot is never forgotten. Once it describes nothing, it is
    forgotten (the timeline starts afresh)."""
    config = AggregationConfig(deadline_s=DEADLINE, early_ttl_s=HORIZON, early_versions=3)
    aggregator = Aggregator(config)
    state = WorkloadState(KEY)
    snapshots = 0
    since: dict[int, float] = {}  # per version waiting, when its first answer came
    now = 0.0
    for (kind, version, strategy), step in inputs:
        now += step
        if kind == "snapshot":
            state = aggregator.on_snapshot(state, snap(version), emitted_at=now, now=now).state
            snapshots += 1
        else:
            state = aggregator.on_ranks(
                state, strategy=strategy, version=version, scores=scores(snap(version), strategy),
                now=now,
            ).state  # fmt: skip
            since.setdefault(version, now)
            since = {v: since[v] for v in sorted(since)[-config.early_versions :]}
        state, _ = aggregator.due(state, now)
        since = {v: t for v, t in since.items() if now < t + HORIZON}
        expected = snapshots == 0 and not since
        assert Aggregator.describes_nothing(state) is expected
        if expected:
            assert aggregator.next_wakeup(state) == AT_ONCE
            state, snapshots = WorkloadState(KEY), 0


# --- a stored state's wake-up without its snapshot --------------------------------------------

#: One input of a timeline: a snapshot of a version, an answer of a strategy for a version, or
#: time passing (``due``); each at a time after the one before.
_INPUTS = st.one_of(
    st.tuples(st.just("snapshot"), st.integers(2, 5), st.just("")),
    st.tuples(st.just("rank"), st.integers(2, 6), st.sampled_from([CAP, AGE])),
    st.tuples(st.just("due"), st.just(0), st.just("")),
)


@settings(max_examples=200, deadline=None)
@given(
    inputs=st.lists(st.tuples(_INPUTS, st.floats(0.0, 40.0)), max_size=12),
    torn=st.lists(st.booleans(), max_size=12),
)
def test_a_stored_states_wake_up_is_told_without_its_snapshot_as_it_is_decoded(
    inputs: list[tuple[tuple[str, int, str], float]], torn: list[bool]
) -> None:
    """``stored_wakeup`` from the progress part and the snapshot's version and arrival equals
    ``next_wakeup`` of the state ``load_parts`` reads, along timelines of snapshots, answers,
    decisions and deadlines, the parts written as ``dump_parts`` writes them, and torn: a write
    whose snapshot part or progress part was lost."""
    aggregator = Aggregator(AggregationConfig(deadline_s=DEADLINE, early_ttl_s=20.0))
    state = WorkloadState(KEY)
    stored: dict[str, bytes] = {}
    now = 0.0
    for index, ((kind, version, strategy), step) in enumerate(inputs):
        now += step
        if kind == "snapshot":
            new = aggregator.on_snapshot(state, snap(version), emitted_at=now, now=now).state
        elif kind == "rank":
            new = aggregator.on_ranks(
                state, strategy=strategy, version=version, scores=scores(snap(version), strategy),
                now=now,
            ).state  # fmt: skip
        else:
            new, _ = aggregator.due(state, now)
        changed = dump_parts(state if stored else None, new)
        if index < len(torn) and torn[index] and len(changed) == 2:
            changed.pop(SNAPSHOT_PART if index % 2 else PROGRESS_PART)  # the other write lost
        stored.update(changed)
        state = load_parts(KEY, stored)
        latest = state.latest
        arrival = None if latest is None else Arrival(latest.version, latest.arrived_at)
        told = aggregator.stored_wakeup(KEY, stored.get(PROGRESS_PART), arrival)
        assert told == aggregator.next_wakeup(state)
