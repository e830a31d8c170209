"""Strategy plugins for the registry and combiner tests, loaded through real ``EntryPoint``s.

Not a test module: ``tests/unit/test_registry.py`` points entry points at the names below, the
way an installed package's ``podcost.strategies`` entry points would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from podcost_core.model import PodUID, Snapshot
from podcost_core.strategies import age
from podcost_core.strategies.base import ArgError, Strategy


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``name-length``."""

    factor: float = 1.0

    def __post_init__(self) -> None:
        if self.factor <= 0:
            raise ArgError("factor", "must be positive")


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """Longer names are kept: a deterministic, easily predicted plugin."""
    return {pod.uid: args.factor * len(pod.name) for pod in snapshot.pods}


def out_of_range(values: Sequence[float], threshold: float | None) -> list[int]:
    """A broken normalization: 101 for everyone."""
    return [101] * len(values)


STRATEGY: Strategy[Args] = Strategy("name-length", Args, score, "Keep pods with longer names.")
BROKEN: Strategy[Args] = Strategy(
    "broken-normalization", Args, score, "Normalizes out of range.", normalize=out_of_range
)
MISNAMED: Strategy[Args] = Strategy("other-name", Args, score, "Registered under another name.")
NOT_A_STRATEGY = {"name": "name-length"}
AGE_AGAIN = age.STRATEGY


@dataclass(frozen=True, slots=True)
class RackArgs:
    """Arguments of ``rack-spread``."""


def rack_domains(snapshot: Snapshot, args: RackArgs) -> dict[PodUID, str | None]:
    """A second spread strategy: the ``rack`` label of the pod's node."""
    out: dict[PodUID, str | None] = {}
    for pod in snapshot.pods:
        node = snapshot.node_of(pod)
        out[pod.uid] = node.labels.get("rack") if node is not None else None
    return out


def rack_score(snapshot: Snapshot, args: RackArgs) -> dict[PodUID, float]:
    """Unused by the combiner (it levels spread strategies itself); a constant will do."""
    return {pod.uid: 0.0 for pod in snapshot.pods}


RACK_SPREAD: Strategy[RackArgs] = Strategy(
    "rack-spread", RackArgs, rack_score, "Spread over racks.", domains=rack_domains
)
