"""Strategy ``karpenter``: pods on nodes Karpenter is disrupting go first, pods it must not
disrupt go last.

Karpenter taints a node it has decided to disrupt (consolidate, expire, drift) with
``karpenter.sh/disrupted:NoSchedule`` before it drains it: the pods there are about to be evicted
anyway, so deleting them on scale-in costs nothing. A pod annotated
``karpenter.sh/do-not-disrupt: "true"`` is one its owner wants left alone (a long job, a warm
cache); Karpenter will not voluntarily disrupt its node, so it is the last pod to give up.

``untolerated-taints`` already counts the disrupted taint (effect ``NoSchedule``), but only for
pods that do not tolerate it, and a pod that tolerates every taint (``operator: Exists``) is
drained all the same. This strategy reads the taint whatever the tolerations.

The rule: raw score −1 for a pod on a node with a taint whose key is in ``disrupted_taints``
(any effect), +1 for a pod whose ``do_not_disrupt`` annotation is ``"true"`` (and that is not on
such a node: the node goes whatever the pod says), 0 otherwise; higher = keep. Put it in a tier
of its own ahead of the others for "first" and "last" to hold against every other preference.
Callers: the registry, the combiner, the generic ranker.
"""

from __future__ import annotations

from dataclasses import dataclass

from podcost_core.model import PodUID, Snapshot
from podcost_core.strategies.base import ArgError, Strategy, reading, require_label_key

NAME = "karpenter"
DISRUPTED_TAINT = "karpenter.sh/disrupted"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``karpenter``."""

    disrupted_taints: tuple[str, ...] = (DISRUPTED_TAINT,)
    """Taint keys that mark a node being drained (annotation syntax: ``a;b``)."""
    do_not_disrupt: str = DO_NOT_DISRUPT
    """The pod annotation that asks for the pod to be kept (value ``"true"``)."""

    def __post_init__(self) -> None:
        if not self.disrupted_taints:
            raise ArgError("disrupted_taints", "must name at least one taint key")
        for key in self.disrupted_taints:
            require_label_key("disrupted_taints", key)
        require_label_key("do_not_disrupt", self.do_not_disrupt)


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """−1 on a disrupted node, +1 for a do-not-disrupt pod, 0 otherwise; higher = keep."""
    keys = frozenset(args.disrupted_taints)
    disrupted = {
        name
        for name, node in snapshot.nodes.items()
        if any(taint.key in keys for taint in node.taints)
    }
    out: dict[PodUID, float] = {}
    for pod in snapshot.pods:
        if pod.node is not None and pod.node in disrupted:
            out[pod.uid] = -1.0
        elif pod.annotations.get(args.do_not_disrupt, "").strip().lower() == "true":
            out[pod.uid] = 1.0
        else:
            out[pod.uid] = 0.0
    return out


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    unread=reading(pod=("annotations",), node=("taints",)),
    description="Delete pods on nodes Karpenter is draining first; keep do-not-disrupt pods last.",
)
