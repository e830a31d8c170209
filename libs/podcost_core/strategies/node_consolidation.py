"""Strategy ``node-consolidation``: drain whole nodes, the emptiest first, so nodes can go.

What users of cluster autoscalers and Karpenter ask for: after a scale-in, the pods left should
sit on as few nodes as possible. Deleting pods spread over many nodes empties none (5 nodes of 4
pods scaled from 20 to 10 keep all 5 nodes, kubernetes/kubernetes#138718, KEP-5982), deleting
them node by node empties two. This strategy orders *nodes*, not pods: every pod of a node gets
the node's position in the order, so the pods of one node are contiguous in the deletion order
and a node is drained completely before the next one is touched.

The order of the nodes, first drained first, by :func:`node_key`:

1. Nodes the scale-in can empty before those it cannot. A node cannot be emptied when it also
   runs pods the workload does not own (``Node.requested.pods``, every active pod on the node,
   counts them, less ``Node.daemon_pods``: DaemonSet and static pods leave with the node, so
   Karpenter and the cluster autoscaler call a node empty without them; a node without that
   count is taken to run the workload's pods only).
2. Then the fewest pods first: the workload's pods that must go to empty it for a node it can
   empty; the workload's own pods for the others.
3. Then, for a node that holds no other workload's pods, the least used first (``measure``:
   ``dominant``, ``cpu`` or ``memory`` utilization, requested / allocatable, when every node of
   the snapshot has the numbers; ``count``: skip).
4. Then the node name, so that ties between nodes are broken deterministically.

What other workloads run on a node orders it only through rule 1, whether it holds any of their
pods: neither how many (rule 2) nor what they request (rule 3). Those change with every pod another
workload places, and a workload's costs would change with them: each pod bound anywhere on its
nodes would ask for a new decision and its writes. So a workload's order moves only when one of
its nodes starts or stops holding other pods (or, for a node that holds none, its DaemonSet pods'
requests change), which is when the watcher re-publishes it
(``podcost_kube.workloads.node_load_neighbours``).

Deleting pods in that order empties the most nodes any choice of *k* pods can empty, for every
*k*: the nodes a scale-in can empty cost their pod count each, and taking the cheapest first is
the optimal greedy (``tests/unit/test_consolidation.py`` proves it over random clusters against
a brute force, through the victim model). The raw score of a pod is its node's position
(0 = drained first; higher = keep).

The controller's own rules come first. It deletes unscheduled, pending and not-ready pods
(``controller_class``) before it reads any cost, so costs only order pods of one class. The
order is therefore made per class: when the cut of a scale-in falls inside class *c*, every pod
of a lower class is already gone and a node can still be emptied only if it holds no pod of a
higher class, and its cost is its number of class-*c* pods. Positions of different classes are
never compared by the controller, so one score serves every *k*.

Normalization keeps neighbouring positions apart while a class spans at most 101 nodes; beyond
that, neighbouring nodes may share a cost and interleave. Callers: the registry, the combiner,
the generic ranker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from podcost_core.model import Node, PodUID, Snapshot
from podcost_core.strategies.base import (
    Strategy,
    active_pods,
    controller_class,
    reading,
    require_choice,
    scores_by_uid,
)

NAME = "node-consolidation"
MEASURES = ("dominant", "cpu", "memory", "count")


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``node-consolidation``."""

    measure: str = "dominant"
    """Which utilization breaks ties between nodes with as many pods: ``dominant`` (max of the
    CPU and memory fractions), ``cpu``, ``memory``, or ``count`` (none: straight to the name)."""

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


def other_pods(node: Node | None, own: int) -> int:
    """Active pods on ``node`` the workload does not own: what keeps a scale-in from emptying it.

    ``Node.requested.pods`` counts every active pod on the node; DaemonSet and mirror pods
    (``Node.daemon_pods``) do not count, since they leave with the node. 0 (or a node missing
    from the snapshot) means unknown, and then the node is taken to run the workload's ``own``
    pods only.
    """
    if node is None or node.requested.pods <= 0:
        return 0
    return max(0, node.requested.pods - node.daemon_pods - own)


def node_key(
    name: str, own: int, own_total: int, others: int, blocked_by_class: bool, used: float
) -> tuple[bool, int, float, str]:
    """Sort key of a node, ascending = drained first (module docstring, rules 1-4).

    ``own`` is the number of the workload's pods that must go to empty it (those of the class
    being ordered), ``own_total`` all its active pods there, ``others`` the node's other
    active pods but daemon pods, ``blocked_by_class`` whether it also holds pods of the workload
    that the controller deletes only later, ``used`` its utilization (0 when not compared; not
    read when ``others`` is not 0).
    """
    if others > 0:
        return (True, own_total, 0.0, name)
    if blocked_by_class:
        return (True, own_total, used, name)
    return (False, own, used, name)


def node_positions(snapshot: Snapshot, args: Args) -> dict[tuple[int, str], int]:
    """Per (controller class, node): the node's position in that class's drain order."""
    active = active_pods(snapshot)
    by_class: Counter[tuple[int, str]] = Counter()
    total: Counter[str] = Counter()
    top_class: dict[str, int] = {}
    for pod in active:
        if pod.node is None:
            continue
        cls = controller_class(pod)
        by_class[(cls, pod.node)] += 1
        total[pod.node] += 1
        if cls > top_class.get(pod.node, -1):
            top_class[pod.node] = cls
    used = _utilizations(snapshot.nodes, list(total), args.measure)
    others = {name: other_pods(snapshot.nodes.get(name), total[name]) for name in total}
    positions: dict[tuple[int, str], int] = {}
    for cls in sorted({cls for cls, _ in by_class}):
        names = [name for c, name in by_class if c == cls]
        names.sort(
            key=lambda name: node_key(
                name,
                by_class[(cls, name)],
                total[name],
                others[name],
                top_class[name] > cls,
                used[name],
            )
        )
        for position, name in enumerate(names):
            positions[(cls, name)] = position
    return positions


def _utilizations(nodes: Mapping[str, Node], names: list[str], measure: str) -> dict[str, float]:
    """Each node's utilization, or 0 for all when ``measure`` is ``count`` or a node lacks the
    numbers (a tie-breaker that mixed known and unknown values would order by ignorance)."""
    zero = dict.fromkeys(names, 0.0)
    if measure == "count":
        return zero
    found: dict[str, float] = {}
    for name in names:
        node = nodes.get(name)
        value = utilization(node, measure) if node is not None else None
        if value is None:
            return zero
        found[name] = value
    return found


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """The position of the pod's node in its class's drain order; higher = keep.

    Unscheduled pods (which the controller deletes first anyway) and inactive pods score 0.
    """
    active = active_pods(snapshot)
    positions = node_positions(snapshot, args)
    values = [
        float(positions[(controller_class(pod), pod.node)]) if pod.node is not None else 0.0
        for pod in active
    ]
    return scores_by_uid(snapshot, active, values)


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    unread=reading(node=("allocatable", "requested")),
    description="Drain whole nodes, the emptiest first, so scale-in empties the most nodes.",
)
