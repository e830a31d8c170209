"""Strategy ``priority-qos``: lower priority first, then BestEffort < Burstable < Guaranteed.

Seed 004's preemption order: priority first, QoS class only among equal priorities (the seed
explains why not the other way round: a high-priority Burstable web server must not lose to a
low-priority Guaranteed pod). Inside one workload this matters while pods of two templates
coexist, e.g. during a rollout that changes the priority class or the resources.

The rule: raw score = 3 · (dense rank of the pod's priority among the snapshot's priorities) +
QoS rank (0 BestEffort, 1 Burstable, 2 Guaranteed). Ranks, not the priority values themselves,
because priorities span ±1e9 and normalization to [0, 100] would crush the QoS step next to them;
the order of priorities is all that counts. Callers: the registry, the combiner, the generic ranker.
"""

from __future__ import annotations

from dataclasses import dataclass

from podcost_core.model import PodUID, QoSClass, Snapshot
from podcost_core.strategies.base import Strategy, reading

NAME = "priority-qos"

QOS_RANK = {QoSClass.BEST_EFFORT: 0, QoSClass.BURSTABLE: 1, QoSClass.GUARANTEED: 2}


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``priority-qos``."""

    qos: bool = True
    """Whether the QoS class breaks ties between equal priorities."""


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """``3 · priority rank + QoS rank``; higher = keep."""
    pods = snapshot.pods
    # In floats from the start (small integers, so exactly the same sums): no float() per pod.
    rank = {
        priority: 3.0 * index for index, priority in enumerate(sorted({p.priority for p in pods}))
    }
    if not args.qos:
        return {pod.uid: rank[pod.priority] for pod in pods}
    qos_rank = _QOS_RANK_FLOAT.get
    return {pod.uid: rank[pod.priority] + qos_rank(pod.qos, 0.0) for pod in pods}


_QOS_RANK_FLOAT = {qos: float(rank) for qos, rank in QOS_RANK.items()}


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    unread=reading(),
    description="Delete lower-priority pods first, then BestEffort < Burstable < Guaranteed.",
)
