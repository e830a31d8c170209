"""The whole decision, as a property: podcost ranks, labels costs onto the pods, and the model of
the ReplicaSet controller (``podcost_core.victims``) picks the victims of each scale-down.

From any placement of ready pods over three zones and through any sequence of scale-downs, the
zone skew never grows and is, after every step, the least that many deletions can leave (so it
falls to ≤ 1 as fast as possible), whichever of its tied pods the controller's unstable sort
picks. Each step re-ranks and re-labels the surviving pods, starting from the costs the previous
step wrote, as the running service does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.snapshots import (
    NOW,
    PROPERTY,
    ZONE,
    domain_sizes,
    least_skew,
    skew,
    zoned_snapshots,
)

from podcost_core.combine import rank
from podcost_core.labels import current_costs, label_costs
from podcost_core.model import DELETION_COST_ANNOTATION, CostOwner, Phase, Pod, Snapshot
from podcost_core.victims import scale_in

REPLICASET = "web-5d8f"


def _ready_zoned_pods(snapshot: Snapshot) -> Snapshot:
    """Only pods on zone-labelled nodes, all Running, Ready, of one ReplicaSet, without costs:
    the controller's rules 1-3 (unscheduled, phase, readiness) then leave the order to the
    costs, and no foreign cost constrains the labelling."""
    pods = []
    for pod in snapshot.pods:
        node = snapshot.node_of(pod)
        if node is None or ZONE not in node.labels:
            continue
        annotations = {k: v for k, v in pod.annotations.items() if k != DELETION_COST_ANNOTATION}
        pods.append(
            replace(
                pod, phase=Phase.RUNNING, ready=True, deleting=False, replicaset=REPLICASET,
                annotations=annotations, deletion_cost=0, deletion_cost_raw=None,
                cost_owner=CostOwner.NONE,
            )
        )  # fmt: skip
    return replace(snapshot, pods=tuple(pods))


def _with_costs(pods: tuple[Pod, ...], costs: dict[Any, int]) -> tuple[Pod, ...]:
    return tuple(
        replace(
            pod, deletion_cost=costs[pod.uid], deletion_cost_raw=str(costs[pod.uid]),
            annotations={**pod.annotations, DELETION_COST_ANNOTATION: str(costs[pod.uid])},
            cost_owner=CostOwner.PODCOST,
        )
        if pod.uid in costs else pod
        for pod in pods
    )  # fmt: skip


@settings(PROPERTY, max_examples=120)
@given(
    zoned_snapshots(max_pods=30),
    st.lists(st.integers(1, 7), min_size=1, max_size=10),
    st.randoms(use_true_random=False),
)
def test_scale_downs_decided_by_the_controller_model_keep_the_least_zone_skew_possible(
    generated: Snapshot, steps: list[int], random: Any
) -> None:
    snapshot = _ready_zoned_pods(generated)
    start = domain_sizes(snapshot, {pod.uid for pod in snapshot.pods})
    pods = snapshot.pods
    deleted_so_far = 0
    previous = skew(start)
    for step in steps:
        if not pods:
            break
        view = replace(snapshot, pods=pods)
        labelling = label_costs(
            rank(view).order, {pod.uid: pod.replicaset for pod in pods}, current_costs(pods)
        )
        pods = _with_costs(pods, dict(labelling.costs))
        target = max(0, len(pods) - step)
        gone: set[Any] = set()
        for choice in scale_in(pods, pods, target, NOW):
            # Any outcome the controller's unstable sort can produce.
            gone |= {pod.uid for pod in choice.certain}
            gone |= {pod.uid for pod in random.sample(choice.tied, choice.tie_picks)}
        deleted_so_far += len(pods) - target
        pods = tuple(pod for pod in pods if pod.uid not in gone)
        now = skew(domain_sizes(snapshot, {pod.uid for pod in pods}))
        assert now == least_skew(start, deleted_so_far)
        assert now <= max(previous, 1)
        previous = now
