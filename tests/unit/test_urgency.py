"""How urgent a decision is: the smallest scale-in that goes wrong with the costs on the pods now,
checked against the victim model for every k; and the annotator's line built on it."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.pods import NOW, pod

from podcost.annotator.plan import NOT_URGENT, Want, WriteQueue, write_priority
from podcost_core.model import Pod, PodUID, Snapshot, WorkloadRef
from podcost_core.urgency import first_wrong
from podcost_core.victims import NowWindow, pods_to_delete

U = PodUID


def workload(*pods: Pod) -> Snapshot:
    return Snapshot(WorkloadRef("c", "shop", "Deployment", "web"), pods, taken_at=NOW)


def test_a_first_costing_of_pods_that_all_tie_goes_wrong_at_a_scale_in_of_one() -> None:
    snapshot = workload(pod("a"), pod("b"), pod("c"))
    assert first_wrong([[U("uid-a")], [U("uid-b"), U("uid-c")]], snapshot) == 1


def test_an_order_the_costs_already_give_is_not_urgent() -> None:
    snapshot = workload(pod("a", cost=1), pod("b", cost=2), pod("c", cost=3))
    assert first_wrong([[U("uid-a")], [U("uid-b")], [U("uid-c")]], snapshot) is None


def test_pods_that_tie_in_the_order_are_not_urgent_either() -> None:
    snapshot = workload(pod("a"), pod("b"), pod("c"))
    assert first_wrong([[U("uid-a"), U("uid-b"), U("uid-c")]], snapshot) is None


def test_only_the_last_pods_out_of_place_make_a_larger_scale_in_the_first_wrong_one() -> None:
    # The costs give a, b, then c and d tied: the order wants d before c, so a scale-in of 3
    # (which keeps one of c and d, the clock decides which) is the first that can go wrong.
    snapshot = workload(pod("a", cost=1), pod("b", cost=2), pod("c", cost=3), pod("d", cost=3))
    order = [[U("uid-a")], [U("uid-b")], [U("uid-d")], [U("uid-c")]]
    assert first_wrong(order, snapshot) == 3


def test_a_not_ready_pod_goes_first_whatever_the_cost() -> None:
    snapshot = workload(pod("a", cost=1), pod("b", ready=False, cost=9))
    assert first_wrong([[U("uid-a")], [U("uid-b")]], snapshot) == 1
    assert first_wrong([[U("uid-b")], [U("uid-a")]], snapshot) is None


@pytest.mark.parametrize(
    ("first_wrong_k", "position", "expected"),
    [
        (1, 0, 1),  # the first pod to go, where a scale-in of one goes wrong: first of all
        (1, 4, 5),  # the fifth pod helps scale-ins of five and more
        (3, 0, 3),  # scale-ins of one and two are right already
        (3, 7, 8),
        (None, 0, NOT_URGENT),  # nothing goes wrong: after everything else
        (2**40, 0, NOT_URGENT - 1),
    ],
)
def test_write_priority_is_the_smallest_scale_in_the_write_can_set_right(
    first_wrong_k: int | None, position: int, expected: int
) -> None:
    assert write_priority(first_wrong_k, position) == expected


def test_a_rising_cost_is_needed_from_the_first_wrong_scale_in_wherever_the_pod_goes() -> None:
    # Its pod may go too early now, at any scale-in: before pods of earlier groups.
    assert write_priority(2, 7, rising=True) == 2
    assert write_priority(None, 7, rising=True) == NOT_URGENT


def test_the_write_queue_shows_the_write_waiting_for_its_turn() -> None:
    queue: WriteQueue[str] = WriteQueue()
    want = Want(U("p"), "shop", "p", 5, None, "record", first_wrong=2)
    queue.offer(want)
    assert queue.queued(U("p")) == want
    queue.take(U("p"))
    assert queue.queued(U("p")) is None


# --- against the victim model ---------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[list[PodUID]], Snapshot]:
    size = draw(st.integers(2, 7))
    pods = [
        pod(
            f"p{index}",
            node=draw(st.sampled_from(["n1", "n2"])),
            ready=draw(st.integers(0, 4)) > 0,
            ready_since=NOW - draw(st.integers(1, 100_000)),
            cost=draw(st.none() | st.integers(-1, 2)),
        )
        for index in range(size)
    ]
    order: list[list[PodUID]] = []
    for uid in draw(st.permutations([p.uid for p in pods])):
        if order and draw(st.booleans()):
            order[-1].append(uid)
        else:
            order.append([uid])
    return order, workload(*pods)


def _wrong(order: list[list[PodUID]], snapshot: Snapshot, k: int) -> bool:
    """Whether a scale-in of ``k``, the clock anywhere in the next year, may delete a pod the
    order keeps (every outcome of the model's ties)."""
    group_of = {uid: index for index, group in enumerate(order) for uid in group}
    pods = list(snapshot.pods)
    choice = pods_to_delete(pods, pods, k, NowWindow(NOW, NOW + 365 * 86_400))
    everyone = {p.uid for p in pods}
    certain = {p.uid for p in choice.certain}
    for picks in combinations([p.uid for p in choice.tied], choice.tie_picks):
        deleted = certain | set(picks)
        kept = everyone - deleted
        if max(group_of[uid] for uid in deleted) > min(group_of[uid] for uid in kept):
            return True
    return False


@settings(max_examples=150, deadline=None)
@given(cases())
def test_first_wrong_is_never_later_than_the_first_scale_in_the_model_gets_wrong(
    case: tuple[list[list[PodUID]], Snapshot],
) -> None:
    # Conservative: the clock may order tied keys right for a while, never for ever; so every
    # scale-in before first_wrong is right whatever the clock, and the model agrees.
    order, snapshot = case
    found = first_wrong(order, snapshot)
    limit = len(snapshot.pods) if found is None else found
    for k in range(1, limit):
        assert not _wrong(order, snapshot, k), k
