"""The annotator's pure decisions: which pods get a write (tables over the pod's state and the
foreign-cost policy), coalescing of superseded values per pod, the commit ledger that lets
offsets pass a record only once every write of it and of the records before it is done, the
version guard against stale and duplicate decisions, and which failures are retried forever."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podcost.annotator.plan import (
    Decided,
    Freshness,
    Ledger,
    PodState,
    Result,
    Retry,
    TailDecision,
    Verdict,
    VersionGuard,
    Want,
    WriteQueue,
    decide,
    gives_up,
    pod_state,
    superseded,
)
from podcost_core.model import DELETION_COST_ANNOTATION, FIELD_MANAGER, CostOwner, PodUID

UID = "uid-1"


def state(
    value: str | None, owner: CostOwner, *, uid: str = UID, deleting: bool = False
) -> PodState:
    return PodState(uid=uid, value=value, owner=owner, deleting=deleting)


@dataclass(frozen=True)
class Case:
    name: str
    cost: int
    state: PodState | None
    overwrite_foreign: bool
    expected: Verdict


DECISIONS = [
    Case("a pod without a cost gets one", 5, state(None, CostOwner.NONE), False, Verdict.WRITE),
    Case("a pod without a cost already has 0: the controller reads no annotation as 0", 0,
         state(None, CostOwner.NONE), False, Verdict.UNCHANGED),
    Case("an invalid value reads as 0 too, but is replaced by an explicit 0", 0,
         state("abc", CostOwner.OTHER), False, Verdict.WRITE),
    Case("a pod with another cost of podcost's gets the new one", 5,
         state("3", CostOwner.PODCOST), False, Verdict.WRITE),
    Case("a pod that already has the cost is left alone", 5, state("5", CostOwner.PODCOST), False,
         Verdict.UNCHANGED),
    Case("a cost someone else set to the same value needs no write either", 5,
         state("5", CostOwner.OTHER), False, Verdict.UNCHANGED),
    Case("a cost someone else set is never overwritten by default", 5, state("9", CostOwner.OTHER),
         False, Verdict.FOREIGN),
    Case("a cost someone else set is overwritten when configured to", 5,
         state("9", CostOwner.OTHER), True, Verdict.WRITE),
    Case("an invalid value someone else set is no cost: it is replaced", 5,
         state("abc", CostOwner.OTHER), False, Verdict.WRITE),
    Case("an out-of-int32 value someone else set is replaced too", 5,
         state("2147483648", CostOwner.OTHER), False, Verdict.WRITE),
    Case("an invalid value of podcost's own is replaced", 5, state("abc", CostOwner.PODCOST), False,
         Verdict.WRITE),
    Case("a pod that is not there is gone", 5, None, False, Verdict.GONE),
    Case("another pod under the same name is gone, whatever its cost", 5,
         state(None, CostOwner.NONE, uid="uid-2"), True, Verdict.GONE),
    Case("a terminating pod needs no cost", 5, state(None, CostOwner.NONE, deleting=True), False,
         Verdict.GONE),
    Case("the int32 extremes compare as numbers", -(2**31), state(str(-(2**31)), CostOwner.PODCOST),
         False, Verdict.UNCHANGED),
]  # fmt: skip


@pytest.mark.parametrize("case", DECISIONS, ids=lambda case: case.name)
def test_decide(case: Case) -> None:
    assert decide(case.cost, UID, case.state, overwrite_foreign=case.overwrite_foreign) is (
        case.expected
    )


def raw_pod(annotations: dict[str, str] | None, managers: list[tuple[str, bool]]) -> Any:
    """A pod's JSON with the given annotations; ``managers`` as (name, owns the cost field)."""
    managed = []
    for manager, owns in managers:
        fields: dict[str, Any] = {"f:metadata": {"f:annotations": {"f:other": {}}}}
        if owns:
            fields["f:metadata"]["f:annotations"][f"f:{DELETION_COST_ANNOTATION}"] = {}
        managed.append({"manager": manager, "operation": "Update", "fieldsV1": fields})
    meta: dict[str, Any] = {"uid": UID, "resourceVersion": "42", "managedFields": managed}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta}


def test_pod_state_reads_value_owner_and_version_from_the_pods_json() -> None:
    raw = raw_pod({DELETION_COST_ANNOTATION: "12"}, [("kubectl", False), (FIELD_MANAGER, True)])
    assert pod_state(raw) == PodState(UID, "12", CostOwner.PODCOST)


def test_a_cost_whose_field_another_manager_owns_is_foreign() -> None:
    raw = raw_pod({DELETION_COST_ANNOTATION: "12"}, [(FIELD_MANAGER, False), ("kubectl", True)])
    assert pod_state(raw).owner is CostOwner.OTHER


def test_a_cost_an_adopted_manager_set_is_podcosts_to_rewrite_and_kubectls_stays_foreign() -> None:
    lablabs = raw_pod({DELETION_COST_ANNOTATION: "2147483647"}, [("manager", True)])
    assert pod_state(lablabs, {"manager"}).owner is CostOwner.PODCOST
    assert decide(5, UID, pod_state(lablabs, {"manager"})) is Verdict.WRITE
    assert decide(5, UID, pod_state(lablabs)) is Verdict.FOREIGN
    kubectl = raw_pod({DELETION_COST_ANNOTATION: "7"}, [("kubectl-annotate", True)])
    assert decide(5, UID, pod_state(kubectl, {"manager"})) is Verdict.FOREIGN


def test_a_pod_without_annotations_has_no_cost_and_no_owner() -> None:
    found = pod_state(raw_pod(None, [(FIELD_MANAGER, False)]))
    assert (found.value, found.owner, found.invalid) == (None, CostOwner.NONE, None)


def test_an_invalid_value_says_why() -> None:
    assert state("007", CostOwner.OTHER).invalid == "invalid value '007'"


# --- coalescing -------------------------------------------------------------------------------


def want(uid: str, cost: int, origin: str, previous: int | None = None) -> Want[str]:
    return Want(PodUID(uid), "ns", f"pod-{uid}", cost, previous, origin)


def test_a_removal_is_queued_even_where_a_write_would_be_unchanged_and_supersedes_one() -> None:
    queue: WriteQueue[str] = WriteQueue()
    assert queue.offer(want("a", 5, "decision", previous=5)).settled[0].result is Result.UNCHANGED
    assert queue.offer(want("b", 5, "decision")).ready
    removal = Want(PodUID("b"), "ns", "pod-b", 0, None, "release", remove=True)
    offer = queue.offer(removal)
    assert [(s.want.origin, s.result) for s in offer.settled] == [("decision", Result.SUPERSEDED)]
    taken = queue.take(PodUID("b"))
    assert taken is not None
    assert taken.remove
    removal_a = Want(PodUID("a"), "ns", "pod-a", 0, 0, "release", remove=True)
    assert queue.offer(removal_a).ready


def test_a_newer_cost_supersedes_the_queued_one_and_only_the_newest_is_taken() -> None:
    queue: WriteQueue[str] = WriteQueue()
    first = queue.offer(want("a", 1, "r1"))
    second = queue.offer(want("a", 2, "r2"))
    third = queue.offer(want("a", 3, "r3"))
    assert [first.ready, second.ready, third.ready] == [True, False, False]  # announced once
    assert [(s.want.origin, s.result) for s in (*second.settled, *third.settled)] == [
        ("r1", Result.SUPERSEDED),
        ("r2", Result.SUPERSEDED),
    ]
    taken = queue.take(PodUID("a"))
    assert taken == want("a", 3, "r3")
    assert queue.depth == 1
    assert queue.finish(PodUID("a")) is False
    assert queue.depth == 0


def test_a_cost_the_snapshot_already_saw_on_the_pod_is_no_write() -> None:
    queue: WriteQueue[str] = WriteQueue()
    offer = queue.offer(want("a", 4, "r1", previous=4))
    assert not offer.ready
    assert [(s.want.origin, s.result) for s in offer.settled] == [("r1", Result.UNCHANGED)]
    assert queue.depth == 0


def test_an_unchanged_cost_also_cancels_a_queued_older_write() -> None:
    queue: WriteQueue[str] = WriteQueue()
    assert queue.offer(want("a", 9, "r1", previous=4)).ready
    offer = queue.offer(want("a", 4, "r2", previous=4))
    assert [(s.want.origin, s.result) for s in offer.settled] == [
        ("r1", Result.SUPERSEDED),
        ("r2", Result.UNCHANGED),
    ]
    assert queue.take(PodUID("a")) is None  # announced, then nothing left to do
    assert queue.depth == 0


def test_a_pod_with_a_write_in_flight_gets_its_next_write_only_after_it() -> None:
    queue: WriteQueue[str] = WriteQueue()
    queue.offer(want("a", 1, "r1"))
    assert queue.take(PodUID("a")) is not None
    # The snapshot predates the write in flight: "previous == cost" proves nothing now.
    later = queue.offer(want("a", 0, "r2", previous=0))
    assert (later.settled, later.ready) == ((), False)
    assert queue.take(PodUID("a")) is None  # not while one is running
    assert queue.depth == 2
    assert queue.finish(PodUID("a")) is True  # ready again
    assert queue.take(PodUID("a")) == want("a", 0, "r2", previous=0)


def test_a_cost_the_snapshot_saw_is_written_when_a_write_of_ours_since_set_another() -> None:
    """A decision made from a snapshot older than our last write to the pod says the
    pod has what it wants; it has our write instead. The watcher ignores our own writes, so no
    later snapshot would set it right: the pod must be read and written."""
    queue: WriteQueue[str] = WriteQueue()
    assert queue.offer(want("a", 5, "r1", previous=0)).ready
    assert queue.take(PodUID("a")) == want("a", 5, "r1", previous=0)
    assert queue.finish(PodUID("a")) is False  # written, nothing queued, idle
    later = queue.offer(want("a", 0, "r2", previous=0))  # its snapshot predates the write
    assert (later.settled, later.ready) == ((), True)
    assert queue.take(PodUID("a")) == want("a", 0, "r2", previous=0)
    queue.finish(PodUID("a"))
    # Once the last write of ours was of that cost, the snapshot's word is good again.
    again = queue.offer(want("a", 0, "r3", previous=0))
    assert [(s.want.origin, s.result) for s in again.settled] == [("r3", Result.UNCHANGED)]


def test_after_a_removal_a_cost_the_snapshot_saw_is_read_before_it_is_left() -> None:
    queue: WriteQueue[str] = WriteQueue()
    assert queue.offer(Want(PodUID("a"), "ns", "pod-a", 0, None, "release", remove=True)).ready
    assert queue.take(PodUID("a")) is not None
    queue.finish(PodUID("a"))
    assert queue.offer(want("a", 3, "r1", previous=3)).ready


def test_the_queue_forgets_the_oldest_writes_past_what_it_remembers() -> None:
    queue: WriteQueue[str] = WriteQueue(remember=1)
    for uid in ("a", "b"):
        queue.offer(want(uid, 5, f"r-{uid}", previous=0))
        queue.take(PodUID(uid))
        queue.finish(PodUID(uid))
    # a is forgotten: the snapshot's word is taken; b is remembered: read and written.
    assert queue.offer(want("a", 0, "r2", previous=0)).settled[0].result is Result.UNCHANGED
    assert queue.offer(want("b", 0, "r2", previous=0)).ready
    with pytest.raises(ValueError, match="remember"):
        WriteQueue(remember=0)


def test_pods_are_coalesced_independently() -> None:
    queue: WriteQueue[str] = WriteQueue()
    ready = [queue.offer(want(uid, 1, f"r-{uid}")).ready for uid in ("a", "b", "c")]
    assert ready == [True, True, True]
    assert queue.depth == 3


def test_finishing_a_write_that_is_not_running_is_a_bug() -> None:
    queue: WriteQueue[str] = WriteQueue()
    with pytest.raises(KeyError):
        queue.finish(PodUID("a"))


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abc"), st.integers(0, 3), st.one_of(st.none(), st.integers(0, 3))
        ),
        max_size=30,
    ),
    st.randoms(use_true_random=False),
)
def test_every_offer_is_settled_exactly_once_and_the_last_cost_of_each_pod_is_what_is_written(
    offers: list[tuple[str, int, int | None]], rng: Any
) -> None:
    """Interleave offers with writers taking and finishing pods at random: every desired cost
    ends settled or written exactly once, and each pod's last write is its newest cost unless
    that one was already on the pod."""
    queue: WriteQueue[int] = WriteQueue()
    outcomes: dict[int, str] = {}
    ready: list[PodUID] = []
    running: list[PodUID] = []
    written: dict[str, int] = {}

    def settle(settled: Any) -> None:
        assert settled.want.origin not in outcomes
        outcomes[settled.want.origin] = settled.result.value

    def step() -> None:
        if running and rng.random() < 0.5:
            uid = running.pop(rng.randrange(len(running)))
            if queue.finish(uid):
                ready.append(uid)
        elif ready:
            uid = ready.pop(0)
            taken = queue.take(uid)
            if taken is not None:
                assert taken.origin not in outcomes
                outcomes[taken.origin] = "written"
                written[uid] = taken.cost
                running.append(uid)

    for index, (uid, cost, previous) in enumerate(offers):
        offer = queue.offer(Want(PodUID(uid), "ns", uid, cost, previous, index))
        for settled in offer.settled:
            settle(settled)
        if offer.ready:
            ready.append(PodUID(uid))
        step()
    while ready or running:
        step()
    assert sorted(outcomes) == list(range(len(offers)))
    assert queue.depth == 0
    for uid in "abc":
        mine = [(i, cost, prev) for i, (u, cost, prev) in enumerate(offers) if u == uid]
        if mine:
            last, cost, _ = mine[-1]
            assert outcomes[last] in ("written", "unchanged")
            if outcomes[last] == "written" or uid in written:
                # Left unchanged after a write of ours only if that write was of this cost.
                assert written[uid] == cost


# --- the commit ledger --------------------------------------------------------------------------


def test_a_record_is_committable_only_when_it_and_every_earlier_record_is_done() -> None:
    ledger: Ledger[str] = Ledger()
    first = ledger.open("p0", 10, 2, "r10")
    second = ledger.open("p0", 11, 1, "r11")
    assert ledger.committable() == []
    assert ledger.settle(second) is True
    assert ledger.committable() == []  # r10 still has two writes outstanding
    assert ledger.settle(first) is False
    assert ledger.settle(first) is True
    assert ledger.committable() == ["r11"]  # past both at once
    assert ledger.committable() == []
    assert ledger.pending == 0


def test_a_record_without_writes_is_committable_at_once() -> None:
    ledger: Ledger[str] = Ledger()
    ledger.open("p0", 0, 0, "dead letter")
    assert ledger.committable() == ["dead letter"]


def test_partitions_commit_independently() -> None:
    ledger: Ledger[str] = Ledger()
    slow = ledger.open("p0", 0, 1, "p0@0")
    ledger.open("p1", 0, 0, "p1@0")
    assert ledger.committable() == ["p1@0"]
    ledger.settle(slow)
    assert ledger.committable() == ["p0@0"]


def test_a_record_read_again_replaces_what_was_tracked_from_its_offset_on() -> None:
    ledger: Ledger[str] = Ledger()
    ledger.open("p0", 5, 0, "r5")
    stale = ledger.open("p0", 6, 1, "r6 first read")
    ledger.open("p0", 6, 0, "r6 read again")  # the partition came back after a rebalance
    assert ledger.committable() == ["r6 read again"]
    ledger.settle(stale)  # the old write finishing later changes nothing
    assert ledger.committable() == []


def test_settling_more_writes_than_a_record_has_is_a_bug() -> None:
    ledger: Ledger[str] = Ledger()
    ticket = ledger.open("p0", 0, 0, "r0")
    with pytest.raises(ValueError, match="nothing outstanding"):
        ledger.settle(ticket)


# --- the version guard ------------------------------------------------------------------------

KEY = "local/shop/Deployment/web"


@pytest.mark.parametrize(
    ("first", "then", "freshness"),
    [
        (Decided(2, 100.0, True), Decided(1, 90.0, True), Freshness.STALE),
        (Decided(2, 100.0, True), Decided(2, 100.0, True), Freshness.DUPLICATE),
        (Decided(1, 90.0, True), Decided(2, 100.0, True), Freshness.NEW),
        # The deadline's incomplete decision, then the complete one of the same version; not back.
        (Decided(2, 100.0, False), Decided(2, 100.0, True), Freshness.NEW),
        (Decided(2, 100.0, True), Decided(2, 100.0, False), Freshness.STALE),
        # A new watcher leader (another incarnation, lower versions) saw its change later.
        (Decided(9_000_001, 100.0, True), Decided(5_000_001, 130.0, True), Freshness.NEW),
        (Decided(5_000_001, 130.0, True), Decided(9_000_001, 100.0, True), Freshness.STALE),
        # Without ``changed_at`` (an older aggregator) the version alone orders them.
        (Decided(2, None, True), Decided(1, 130.0, True), Freshness.STALE),
        (Decided(1, 130.0, True), Decided(2, None, True), Freshness.NEW),
    ],
)
def test_the_guard_admits_only_decisions_newer_than_the_newest_accepted(
    first: Decided, then: Decided, freshness: Freshness
) -> None:
    guard = VersionGuard()
    assert guard.admit(KEY, first) is Freshness.NEW
    assert guard.admit(KEY, then) is freshness
    assert guard.latest(KEY) == (then if freshness is Freshness.NEW else first)


def test_the_guard_keeps_workloads_apart() -> None:
    guard = VersionGuard()
    assert guard.admit(KEY, Decided(5, 100.0, True)) is Freshness.NEW
    assert guard.admit("local/shop/Deployment/api", Decided(1, 50.0, True)) is Freshness.NEW
    assert len(guard) == 2


@given(st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=30))
def test_whatever_the_arrival_order_the_accepted_decisions_only_ever_move_forward(
    arrivals: list[tuple[int, bool]],
) -> None:
    guard = VersionGuard()
    accepted: list[Decided] = []
    for version, complete in arrivals:
        decided = Decided(version, float(version), complete)
        if guard.admit(KEY, decided) is Freshness.NEW:
            accepted.append(decided)
    keys = [(d.version, d.complete) for d in accepted]
    assert keys == sorted(set(keys))
    assert guard.latest(KEY) == max(
        (Decided(v, float(v), c) for v, c in arrivals), key=lambda d: (d.version, d.complete)
    )


@pytest.mark.parametrize(
    ("reason", "attempt", "ends"),
    [
        (Retry.CONFLICT, 4, False),
        (Retry.CONFLICT, 5, True),
        (Retry.UNAVAILABLE, 5, False),
        (Retry.UNAVAILABLE, 10_000, False),
        (Retry.THROTTLED, 10_000, False),
    ],
)
def test_only_conflicts_are_given_up_an_unavailable_or_throttling_server_is_waited_out(
    reason: Retry, attempt: int, ends: bool
) -> None:
    assert gives_up(reason, attempt, max_attempts=5) is ends


API = "local/shop/Deployment/api"


def tail(key: str, version: int, changed_at: float, *pods: str, complete: bool = True) -> Any:
    return TailDecision(key, Decided(version, changed_at, complete), frozenset(pods))


@pytest.mark.parametrize(
    ("decisions", "dropped"),
    [
        pytest.param([], {}, id="nothing-read"),
        pytest.param([tail(KEY, 1, 90.0, "a")], {}, id="one-decision"),
        pytest.param(
            [tail(KEY, 1, 90.0, "a", "b"), tail(KEY, 2, 100.0, "a", "b")],
            {0: {"a", "b"}},
            id="in-order",
        ),
        pytest.param(
            [tail(KEY, 2, 100.0, "a"), tail(KEY, 1, 90.0, "a")], {1: {"a"}}, id="out-of-order"
        ),
        pytest.param(
            [tail(KEY, 2, 100.0, "a"), None, tail(KEY, 2, 100.0, "a")],
            {},
            id="a-duplicate-and-an-undecodable-record",
        ),
        pytest.param(
            [tail(KEY, 2, 100.0, "a", complete=False), tail(KEY, 2, 100.0, "a")],
            {0: {"a"}},
            id="the-deadlines-decision-then-the-complete-one",
        ),
        pytest.param(
            [tail(KEY, 1, 90.0, "a", "gone"), tail(KEY, 2, 100.0, "a", "new")],
            {0: {"a"}},
            id="only-the-pods-a-newer-one-names",
        ),
        pytest.param([tail(KEY, 1, 90.0, "a"), tail(API, 2, 100.0, "a")], {}, id="workloads-apart"),
    ],
)
def test_a_pods_cost_read_ahead_is_superseded_by_a_newer_decision_of_its_workload_naming_it(
    decisions: list[TailDecision | None], dropped: dict[int, set[str]]
) -> None:
    assert superseded(decisions) == {index: frozenset(pods) for index, pods in dropped.items()}


def test_purging_removes_only_the_queued_writes_refused_and_leaves_running_ones() -> None:
    queue: WriteQueue[str] = WriteQueue()
    for uid, origin in (("a", "lost"), ("b", "kept"), ("c", "lost")):
        queue.offer(want(uid, 1, origin))
    running = queue.take(PodUID("c"))
    assert running is not None
    purged = queue.purge(lambda queued: queued.origin != "lost")
    assert [w.uid for w in purged] == ["a"]
    assert queue.depth == 2  # b queued, c running (its requests are fenced, not purged)
    assert queue.take(PodUID("a")) is None
    assert queue.finish(PodUID("c")) is False


def test_a_forgotten_partition_never_becomes_committable() -> None:
    ledger: Ledger[str] = Ledger()
    lost = ledger.open(("t", 1), 5, 1, "old assignment")
    ledger.open(("t", 2), 5, 0, "new assignment")
    ledger.forget(("t", 1))
    assert ledger.settle(lost)
    assert ledger.committable() == ["new assignment"]
    assert ledger.partitions() == [("t", 2)]
