"""Strategy ``untolerated-taints``: delete pods on nodes whose taints they do not tolerate first.

Seed 003 (the KEP's "pods not tolerating taints first" and story 2: "choose victims from pods that
are running on nodes which have a PreferNoSchedule taint"). A taint a pod does not tolerate says
the node would rather not have it: the node is being drained (a cordon adds
``node.kubernetes.io/unschedulable:NoSchedule``), reserved for someone else, or degraded.

The rule: the raw score is minus the number of the node's taints, with an effect in ``effects``,
that no toleration of the pod tolerates (``Toleration.tolerates``, the API's own rules). Pods on
clean nodes, unscheduled pods and pods on nodes missing from the snapshot score 0. Callers: the
registry, the combiner, the generic ranker.
"""

from __future__ import annotations

from dataclasses import dataclass

from podcost_core.model import PodUID, Snapshot, Taint
from podcost_core.strategies.base import ArgError, Strategy, reading, require_choice

NAME = "untolerated-taints"
EFFECTS = ("PreferNoSchedule", "NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``untolerated-taints``."""

    effects: tuple[str, ...] = EFFECTS
    """Which taint effects count (annotation syntax: ``effects=PreferNoSchedule;NoSchedule``)."""

    def __post_init__(self) -> None:
        if not self.effects:
            raise ArgError("effects", f"must name at least one of {', '.join(EFFECTS)}")
        for effect in self.effects:
            require_choice("effects", effect, EFFECTS)


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """−(number of untolerated taints with a counted effect); higher = keep."""
    effects = frozenset(args.effects)
    # Only the counted taints of each node; most nodes have none, so most pods skip the inner loop.
    counted: dict[str | None, tuple[Taint, ...]] = {
        name: tuple(taint for taint in node.taints if taint.effect in effects)
        for name, node in snapshot.nodes.items()
        if node.taints
    }
    taints_of = counted.get  # an unscheduled pod's node None is no key: no taints
    out: dict[PodUID, float] = {}
    for pod in snapshot.pods:
        taints = taints_of(pod.node)
        if not taints:
            out[pod.uid] = 0.0
            continue
        tolerations = pod.tolerations
        untolerated = 0
        for taint in taints:
            if not any(toleration.tolerates(taint) for toleration in tolerations):
                untolerated += 1
        out[pod.uid] = float(-untolerated)
    return out


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    unread=reading(pod=("tolerations",), node=("taints",)),
    description="Delete pods on nodes whose taints (PreferNoSchedule, ...) they do not tolerate.",
)
