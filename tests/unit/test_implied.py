"""Writes the controller's own order makes unnecessary: fewer writes, and the victim model still
deletes in the combined order for every k, whatever its clock says."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.pods import NOW, pod, with_cost

from podcost_core.implied import drop_implied
from podcost_core.labels import EDGE_STEP, NON_NEGATIVE_BAND, Labelling, current_costs, label_costs
from podcost_core.model import Phase, Pod, PodUID, Snapshot, WorkloadRef
from podcost_core.victims import Now, NowWindow, clockless_key, pods_to_delete

U = PodUID


def workload(*pods: Pod) -> Snapshot:
    return Snapshot(WorkloadRef("c", "shop", "Deployment", "web"), pods, taken_at=NOW)


def labelled(order: list[list[PodUID]], snapshot: Snapshot) -> tuple[Labelling, Labelling]:
    current = current_costs(snapshot.pods)
    full = label_costs(order, {p.uid: p.replicaset for p in snapshot.pods}, current)
    return full, drop_implied(full, order, snapshot, current)


def test_a_not_ready_pod_the_order_deletes_first_needs_no_cost() -> None:
    snapshot = workload(pod("a", ready=False), pod("b"))
    full, thin = labelled([[U("uid-a")], [U("uid-b")]], snapshot)
    assert len(full.writes) == 1
    assert thin.writes == {}
    assert thin.costs == {"uid-a": 0, "uid-b": 0}


def test_a_doubled_up_pod_the_order_deletes_first_needs_no_cost() -> None:
    snapshot = workload(pod("a", node="n1"), pod("b", node="n1"), pod("c", node="n2"))
    full, thin = labelled([[U("uid-a"), U("uid-b")], [U("uid-c")]], snapshot)
    assert full.writes == {"uid-c": EDGE_STEP}
    assert thin.writes == {}


def test_pods_the_clock_would_order_keep_their_costs() -> None:
    # b and c differ only in age: the controller orders them by log2 buckets that merge as
    # time goes on, so b's cost is still written (c keeps 0, the anchor).
    snapshot = workload(pod("a", ready=False), pod("b", ready_since=NOW - 10), pod("c"))
    full, thin = labelled([[U("uid-a")], [U("uid-b")], [U("uid-c")]], snapshot)
    assert set(full.writes) == {"uid-a", "uid-b"}
    assert set(thin.writes) == {"uid-b"}


def test_an_order_against_the_controllers_own_keeps_every_write() -> None:
    # The order deletes the ready pod first: the controller cannot, whatever the costs; the
    # labelling is left as it is rather than thinned against an order it does not realise.
    snapshot = workload(pod("a"), pod("b", ready=False), pod("c", ready=False))
    full, thin = labelled([[U("uid-a")], [U("uid-b")], [U("uid-c")]], snapshot)
    assert thin == full


def test_an_invalid_cost_is_replaced_even_where_the_controller_reads_0_right() -> None:
    bad = replace(pod("a", ready=False), deletion_cost_raw="oops")
    snapshot = workload(bad, pod("b"))
    full, thin = labelled([[U("uid-a")], [U("uid-b")]], snapshot)
    assert thin.writes == {"uid-a": full.writes["uid-a"]}


# --- properties -----------------------------------------------------------------------------

STATES = [
    {"node": None, "phase": Phase.PENDING, "ready": False},
    {"phase": Phase.PENDING, "ready": False},
    {"phase": Phase.RUNNING, "ready": False},
    {"phase": Phase.RUNNING, "ready": True},
]


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[list[PodUID]], Snapshot]:
    """Pods of one or two ReplicaSets in random states, and an order the controller can follow:
    rules 1-3 first (no cost overrides them), then random groups."""
    size = draw(st.integers(2, 9))
    pods = []
    for index in range(size):
        state = draw(st.sampled_from(STATES))
        pods.append(
            pod(
                f"p{index}",
                **{"node": draw(st.sampled_from(["n1", "n2", "n3"])), **state},
                ready_since=NOW - draw(st.integers(1, 100_000)),
                restarts=draw(st.integers(0, 2)),
                created=NOW - draw(st.integers(100_000, 200_000)),
                cost=draw(st.none() | st.none() | st.integers(-2, 2)),
                replicaset=draw(st.sampled_from(["web-1", "web-1", "web-2"])),
            )
        )
    rank = {p.uid: draw(st.integers(0, 3)) for p in pods}

    def place(p: Pod) -> tuple[int, ...]:
        return (*clockless_key(p, 0, 0)[:3], rank[p.uid])

    order: list[list[PodUID]] = []
    last: tuple[int, ...] | None = None
    for p in sorted(pods, key=place):
        if place(p) == last:
            order[-1].append(p.uid)
        else:
            order.append([p.uid])
            last = place(p)
    return order, workload(*pods)


NOWS: list[Now] = [
    None,
    NOW,
    NOW + 7,
    NOW + 86_400,
    NOW + 10**8,
    NowWindow(NOW, NOW + 3600),
]


def deletes_in_order(order: list[list[PodUID]], snapshot: Snapshot, labelling: Labelling) -> bool:
    """For every ReplicaSet, k and clock: every class of the model inside one group of the order,
    the classes following the groups; so any pods it deletes are the first ones the order has."""
    position = {uid: index for index, group in enumerate(order) for uid in group}
    pods = [with_cost(p, labelling.writes[p.uid]) if p.uid in labelling.writes else p
            for p in snapshot.pods]  # fmt: skip
    for replicaset in {p.replicaset for p in pods}:
        members = [p for p in pods if p.replicaset == replicaset]
        for now in NOWS:
            for diff in range(1, len(members)):
                choice = pods_to_delete(members, pods, diff, now)
                groups = [{position[p.uid] for p in members} for members in choice.classes]
                if any(len(found) != 1 for found in groups):
                    return False
                flat = [min(found) for found in groups]
                if flat != sorted(flat):
                    return False
    return True


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_thinned_costs_make_the_controller_delete_in_order_for_every_k_and_clock(
    case: tuple[list[list[PodUID]], Snapshot],
) -> None:
    order, snapshot = case
    full, thin = labelled(order, snapshot)
    assert set(thin.writes) <= set(full.writes)
    assert all(full.writes[uid] == value for uid, value in thin.writes.items())
    current = current_costs(snapshot.pods)
    for uid, cost in thin.costs.items():
        if uid not in thin.writes:
            assert cost == current[uid].value  # what the pod carries (0 without annotation)
    # The order follows rules 1-3, so the full labelling realises it; the thinned one must too.
    assert deletes_in_order(order, snapshot, full)
    assert deletes_in_order(order, snapshot, thin)


def test_a_cost_beyond_the_band_is_rewritten_even_where_its_order_is_right() -> None:
    # Karpenter clusters (non_negative_costs): a negative cost of ours must go, in order or not.
    snapshot = workload(pod("a", cost=-2), pod("b", cost=-1), pod("c"))
    order = [[U("uid-a")], [U("uid-b")], [U("uid-c")]]
    current = current_costs(snapshot.pods)
    full = label_costs(order, {p.uid: p.replicaset for p in snapshot.pods}, current,
                       band=NON_NEGATIVE_BAND)  # fmt: skip
    thin = drop_implied(full, order, snapshot, current, band=NON_NEGATIVE_BAND)
    assert thin == full
    assert all(value >= 0 for value in thin.costs.values())
