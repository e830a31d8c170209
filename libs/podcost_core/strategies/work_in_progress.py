"""Strategy ``work-in-progress``: keep the pods that report work in progress on their annotation.

Seed 003, story 1: workers that "do not checkpoint state" and whose "cost of deleting increases over
time until it completes the current unit of work". The application knows; it writes a number on
its own pod (annotation ``annotation``, default ``podcost.dev/work-cost``): higher = busier = keep.

The rule: raw score = the annotation parsed as a float; missing, not a number or not finite = 0 (an
idle pod). Negative values are kept as given: an application may ask for its pod to go first. The
strategy stays pure and quiet about invalid values; the watcher is the place to report them.
Callers: the registry, the combiner, the generic ranker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from podcost_core.model import PodUID, Snapshot
from podcost_core.strategies.base import Strategy, reading, require_label_key

NAME = "work-in-progress"
DEFAULT_ANNOTATION = "podcost.dev/work-cost"


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``work-in-progress``."""

    annotation: str = DEFAULT_ANNOTATION
    """The pod annotation the application sets to a number."""

    def __post_init__(self) -> None:
        require_label_key("annotation", self.annotation)


def work(raw: str | None) -> float:
    """The annotation's value as a finite float; 0 when missing or invalid."""
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """The reported work; higher = keep."""
    key = args.annotation
    # Most pods carry no such annotation: no call for those.
    return {
        pod.uid: 0.0 if (raw := pod.annotations.get(key)) is None else work(raw)
        for pod in snapshot.pods
    }


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    unread=reading(pod=("annotations",)),
    description="Keep pods whose own annotation reports work in progress; idle pods go first.",
)
