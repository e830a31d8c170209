"""Strategy ``restarts``: delete the pods that restart most first.

Why a user wants it: the ReplicaSet controller already prefers deleting the pod with more
container restarts, but only as its 7th rule, after the deletion cost (rule 4). Once podcost
writes costs, that preference no longer gets a say. A pod that keeps crash-looping or getting
OOM-killed is usually the one to lose on scale-in (a bad node, a poisoned cache, a leak);
``restarts`` brings that preference back as a weighted strategy of the policy, e.g.
``podcost.dev/strategies: "topology-spread | restarts=3, capacity-type=2"``.

The rule: a pod's restarts are the highest ``restartCount`` of its containers (and, with
``count_sidecars``, of its sidecars), capped at ``saturation`` so that 40 restarts and 400 tie;
raw score = ``saturation`` − restarts, so a pod that never restarted scores highest (kept) and a
pod at or past the cap scores 0 (deleted first). Scores lie in [0, ``saturation``]: a policy
``threshold`` equal to ``saturation`` makes normalized values independent of the other pods.

Pure: it reads the snapshot podcost hands it and nothing else (no I/O, no clock). podcost calls
:func:`score` from its generic ranker (``podcost ranker --strategy restarts``) or its combiner.
"""

from __future__ import annotations

from dataclasses import dataclass

from podcost_core.model import PodUID, Snapshot
from podcost_core.strategies.base import ArgError, Strategy

NAME = "restarts"


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``restarts`` (``podcost.dev/args.restarts: "saturation=5"``)."""

    saturation: int = 10
    """Restart counts at or above this tie: the pod is as bad as a pod gets."""
    count_sidecars: bool = True
    """Count restarts of restartable init containers (sidecars) too."""

    def __post_init__(self) -> None:
        if self.saturation < 1:
            raise ArgError("saturation", f"must be at least 1, got {self.saturation}")


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """``saturation`` − capped restarts for every pod of ``snapshot``; higher = keep."""
    cap = args.saturation
    out: dict[PodUID, float] = {}
    for pod in snapshot.pods:
        restarts = max(pod.restarts, pod.sidecar_restarts) if args.count_sidecars else pod.restarts
        out[pod.uid] = float(cap - min(restarts, cap))
    return out


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    description="Delete the pods that restart most first; counts past a saturation tie.",
)
