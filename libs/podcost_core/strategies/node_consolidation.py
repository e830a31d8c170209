"""Strategy ``node-consolidation``: delete pods on the emptiest nodes first, so a node can drain.

What users of cluster autoscalers and Karpenter ask for: after a scale-in, the pods left should sit
on fewer nodes, and a node that loses its last pods can be removed. Taking pods off the least
used nodes gets nodes to empty soonest.

The rule: raw score = the node's utilization, requested / allocatable (``measure``: the larger of
the CPU and memory fractions, ``dominant``; or ``cpu``; or ``memory``); higher = busier = keep.
The fractions need every scheduled pod's node in the snapshot with a non-zero allocatable for the
measure; if one is missing the whole snapshot falls back to ``count``, the number of the
workload's active pods on the node, rather than mix two units in one ranking. Unscheduled and
inactive pods score 0. Callers: the registry, the combiner, the generic ranker.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from podcost_core.model import Node, PodUID, Snapshot
from podcost_core.strategies.base import Strategy, active_pods, require_choice, scores_by_uid

NAME = "node-consolidation"
MEASURES = ("dominant", "cpu", "memory", "count")


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``node-consolidation``."""

    measure: str = "dominant"
    """``dominant`` (max of CPU and memory fractions), ``cpu``, ``memory`` or ``count``."""

    def __post_init__(self) -> None:
        require_choice("measure", self.measure, MEASURES)


def utilization(node: Node, measure: str) -> float | None:
    """requested / allocatable of ``node`` for ``measure``; ``None`` if allocatable is unknown."""
    alloc, req = node.allocatable, node.requested
    cpu = req.cpu_milli / alloc.cpu_milli if alloc.cpu_milli > 0 else None
    if measure == "cpu":
        return cpu
    memory = req.memory_bytes / alloc.memory_bytes if alloc.memory_bytes > 0 else None
    if measure == "memory":
        return memory
    if cpu is None:
        return memory
    return cpu if memory is None or cpu >= memory else memory


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """The node's utilization (or the workload's pod count on it); higher = keep."""
    active = active_pods(snapshot)
    values: list[float] = []
    if args.measure != "count":
        measure = args.measure
        dominant = measure == "dominant"
        by_node: dict[str | None, float] = {None: 0.0}  # unscheduled pods score 0
        for name, node in snapshot.nodes.items():
            alloc, requested = node.allocatable, node.requested
            # The usual case inlined (both amounts known, the larger share): a call per node
            # costs as much as the arithmetic.
            if dominant and alloc.cpu_milli > 0 and alloc.memory_bytes > 0:
                cpu = requested.cpu_milli / alloc.cpu_milli
                memory = requested.memory_bytes / alloc.memory_bytes
                by_node[name] = cpu if cpu >= memory else memory
                continue
            used = utilization(node, measure)
            if used is not None:
                by_node[name] = used
        try:
            values = [by_node[pod.node] for pod in active]
        except KeyError:  # a node without the numbers: count pods everywhere instead
            values = []
    if not values:
        counts = Counter([pod.node for pod in active])
        values = [float(counts[pod.node]) if pod.node is not None else 0.0 for pod in active]
    return scores_by_uid(snapshot, active, values)


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    description="Delete pods on the least used nodes first so that nodes can drain and go.",
)
