"""Strategy ``age``: delete young pods first (or old ones), with ages past a saturation tied.

Seed 003, story 1 and "choose youngest/oldest pods first": a pod that has been serving for a while
has warm caches, established connections, accumulated work; a pod that just started has little
to lose. Ages past ``saturation_seconds`` (default one day) count as equal, so that the order of
long-running pods does not churn, and ``older-first`` serves the opposite wish (refresh the fleet).

The rule: age = ``snapshot.taken_at`` − (``ready_since`` if the pod is ready and has it, else
``created``), clamped to [0, ``saturation_seconds``]; a pod with neither timestamp has age 0. Raw
score = age for ``younger-first`` (old = keep), ``saturation_seconds − age`` for ``older-first``.
Both lie in [0, saturation], so a policy ``threshold`` equal to the saturation gives normalized
values that do not depend on the other pods. Callers: the registry, the combiner, the generic
ranker.
"""

from __future__ import annotations

from dataclasses import dataclass

from podcost_core.model import PodUID, Snapshot
from podcost_core.strategies.base import ArgError, Strategy, reading, require_choice, require_finite

NAME = "age"
DIRECTIONS = ("younger-first", "older-first")
SINCE = ("ready", "created")
DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``age``."""

    direction: str = "younger-first"
    """``younger-first`` (keep long-running pods) or ``older-first``."""
    saturation_seconds: float = DAY
    """Ages past this tie."""
    since: str = "ready"
    """``ready``: age since the pod became ready (creation if it is not ready); ``created``."""

    def __post_init__(self) -> None:
        require_choice("direction", self.direction, DIRECTIONS)
        require_choice("since", self.since, SINCE)
        require_finite("saturation_seconds", self.saturation_seconds)
        if self.saturation_seconds <= 0.0:
            raise ArgError("saturation_seconds", f"must be positive, got {self.saturation_seconds}")


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """Saturated age (``younger-first``) or saturation − age (``older-first``); higher = keep."""
    now = snapshot.taken_at
    cap = args.saturation_seconds
    use_ready = args.since == "ready"
    older_first = args.direction == "older-first"
    out: dict[PodUID, float] = {}
    for pod in snapshot.pods:
        start = pod.ready_since if use_ready and pod.ready else None
        if start is None:
            start = pod.created
        # Inline clamps, not min/max calls: this runs for every pod of every snapshot.
        age = 0.0 if start is None or start >= now else now - start
        if age > cap:
            age = cap
        out[pod.uid] = cap - age if older_first else age
    return out


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    unread=reading(),
    description="Delete the youngest pods first (or the oldest); ages past a saturation tie.",
)
