"""``karpenter`` in a dominant tier, as a property of the combined order and of the controller's
choice: pods on nodes Karpenter is draining go first, ``do-not-disrupt`` pods go last, and the
rest of the policy only orders pods inside those three bands."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from tests.unit.snapshots import NOW, PROPERTY, snapshots

from podcost_core.combine import rank
from podcost_core.labels import current_costs, label_costs
from podcost_core.model import DELETION_COST_ANNOTATION, CostOwner, Phase, PodUID, Snapshot, Taint
from podcost_core.policy import Policy, StrategySpec
from podcost_core.strategies import karpenter
from podcost_core.victims import pods_to_delete

POLICY = Policy(
    (
        StrategySpec(karpenter.NAME, tier=0),
        StrategySpec("topology-spread", tier=1),
        StrategySpec("node-consolidation", tier=2, weight=2),
        StrategySpec("age", tier=2),
    )
)
DISRUPTED = Taint(karpenter.DISRUPTED_TAINT, "NoSchedule")


@st.composite
def karpenter_snapshots(draw: st.DrawFn) -> Snapshot:
    """Any snapshot, with the disrupted taint on some of its nodes and do-not-disrupt on some
    of its pods."""
    snapshot = draw(snapshots())
    nodes = {
        name: replace(node, taints=(*node.taints, DISRUPTED)) if draw(st.booleans()) else node
        for name, node in snapshot.nodes.items()
    }
    pods = tuple(
        replace(pod, annotations={**pod.annotations, karpenter.DO_NOT_DISRUPT: "true"})
        if draw(st.integers(0, 3)) == 0
        else pod
        for pod in snapshot.pods
    )
    return replace(snapshot, nodes=nodes, pods=pods)


def band(snapshot: Snapshot, uid: PodUID) -> int:
    """0: on a disrupted node; 2: do-not-disrupt; 1: the rest."""
    return int(karpenter.score(snapshot, karpenter.Args())[uid]) + 1


@PROPERTY
@given(karpenter_snapshots())
def test_disrupted_node_pods_come_first_and_do_not_disrupt_pods_last_in_the_order(
    snapshot: Snapshot,
) -> None:
    order = rank(snapshot, POLICY).flat()
    bands = [band(snapshot, uid) for uid in order]
    assert bands == sorted(bands)


def with_costs(snapshot: Snapshot) -> Snapshot:
    """The snapshot with the costs podcost writes for ``POLICY`` on its pods."""
    labelling = label_costs(
        rank(snapshot, POLICY).order,
        {pod.uid: pod.replicaset for pod in snapshot.pods},
        current_costs(snapshot.pods),
    )
    costs = labelling.costs
    return replace(
        snapshot,
        pods=tuple(
            replace(
                pod, deletion_cost=costs[pod.uid], deletion_cost_raw=str(costs[pod.uid]),
                annotations={**pod.annotations, DELETION_COST_ANNOTATION: str(costs[pod.uid])},
                cost_owner=CostOwner.PODCOST,
            )
            for pod in snapshot.pods
        ),
    )  # fmt: skip


@PROPERTY
@given(karpenter_snapshots(), st.data())
def test_the_controller_deletes_disrupted_node_pods_before_others_and_do_not_disrupt_pods_last(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    ready = tuple(
        replace(pod, phase=Phase.RUNNING, ready=True, deleting=False, replicaset="web-1")
        for pod in snapshot.pods
        if pod.node is not None and pod.node in snapshot.nodes
    )
    costed = with_costs(replace(snapshot, pods=ready, bystanders=()))
    pods = list(costed.pods)
    choice = pods_to_delete(pods, pods, data.draw(st.integers(0, len(pods))), NOW)
    certain = {pod.uid for pod in choice.certain}
    tied = {pod.uid for pod in choice.tied}
    rest = [pod.uid for pod in pods if pod.uid not in certain | tied]
    # Tied pods share a cost, hence a band; whichever the sort picks, victims precede survivors.
    assert len({band(costed, uid) for uid in tied}) <= 1
    gone = [*certain, *(tied if choice.tie_picks else ())]
    left = [*rest, *(tied if choice.tie_picks < len(tied) else ())]
    if gone and left:
        assert max(band(costed, uid) for uid in gone) <= min(band(costed, uid) for uid in left)
