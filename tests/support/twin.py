"""The crash tests' plan and judgement, pure: a seeded churn scenario with one fault in it, and
the rules that compare a disturbed run with its undisturbed twin.

``tests/e2e/test_sigkill.py`` plays a :class:`Scenario` on two real clusters at once (the same
nodes, Deployments and churn steps on each), SIGKILLs one podcost process of cluster ``a`` as
the scenario's :class:`Fault` says, and judges the outcome with :func:`rewinds` (no pod's cost
went back to an older decision's value) and the per-``k`` comparison of what the real
ReplicaSet controller would leave. ``tests/unit/test_twin.py`` checks these rules without servers.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

ZONES = ("zone-a", "zone-b", "zone-c")

StepKind = Literal["scale-out", "delete-pod", "taint", "spot", "scale-in"]


@dataclass(frozen=True)
class App:
    """One opted-in Deployment: the nodes made for it (zone, pod capacity). The capacities add
    up to its replicas, so the scheduler has exactly one way to place the pods."""

    name: str
    nodes: tuple[tuple[str, int], ...]

    @property
    def replicas(self) -> int:
        return sum(capacity for _, capacity in self.nodes)


@dataclass(frozen=True)
class Step:
    """One churn step, applied to both clusters.

    ``scale-out``: a new node of capacity ``amount`` in ``zone``, then ``amount`` more replicas
    (only that node has room). ``delete-pod``: one pod of node ``node`` deleted (its replacement
    lands on the same node, the only one with room). ``taint``: node ``node`` gets a
    ``PreferNoSchedule`` taint. ``spot``: every node of ``app`` in ``zone`` becomes spot
    capacity. ``scale-in``: ``amount`` fewer replicas; the controller deletes by cost, so it
    waits until both clusters have nothing left to write (a crash makes costs late, and a
    scale-in on late costs deletes other pods: a different, not a lost, outcome). Scale-ins come
    last: after one, freed room could place a later pod on another node in either cluster.
    """

    kind: StepKind
    app: str
    zone: str = ""
    node: int = 0
    amount: int = 0


@dataclass(frozen=True)
class Fault:
    """One crash of one process of cluster ``a``.

    It comes ``delay`` seconds after step ``at`` was issued (``-1``: while the Deployments are
    being created and their pods made Ready). The process is SIGKILLed and started again after
    ``pause`` seconds; when ``again`` is set, the new process is SIGKILLed again ``again``
    seconds after that start (during its start-up: imports, the broker's group join, faust's
    table recovery) and started once more after ``pause``.
    """

    victim: str
    at: int
    delay: float
    pause: float
    again: float | None


@dataclass(frozen=True)
class Scenario:
    seed: int
    apps: tuple[App, ...]
    steps: tuple[Step, ...]
    fault: Fault


def scenario(seed: int, victims: Sequence[str]) -> Scenario:
    """The scenario of ``seed``: two Deployments of 5-9 pods on 3-4 nodes over three zones, three
    or four churn steps then one or two scale-ins, and one fault whose victim is
    ``victims[seed % len(victims)]`` (so consecutive seeds visit every victim)."""
    rng = random.Random(seed)
    apps = []
    for name in ("web", "api"):
        nodes = [(zone, rng.randint(1, 3)) for zone in ZONES]
        if rng.random() < 0.5:
            nodes.append((rng.choice(ZONES), rng.randint(1, 2)))
        apps.append(App(f"{name}{seed}", tuple(nodes)))
    steps: list[Step] = []
    for _ in range(rng.randint(3, 4)):
        app = rng.choice(apps)
        kind = rng.choice(("scale-out", "delete-pod", "taint", "spot"))
        steps.append(Step(
            kind, app.name, zone=rng.choice(ZONES), node=rng.randrange(len(app.nodes)),
            amount=rng.randint(1, 2),
        ))  # fmt: skip
    for app in rng.sample(apps, rng.randint(1, 2)):
        steps.append(Step("scale-in", app.name, amount=rng.randint(1, 3)))
    fault = Fault(
        victim=victims[seed % len(victims)],
        at=rng.randint(-1, len(steps) - 1),
        delay=round(rng.uniform(0, 2.5), 2),
        pause=rng.choice((0.0, round(rng.uniform(0.5, 3), 2))),
        again=rng.choice((None, round(rng.uniform(0.3, 4), 2))),
    )
    return Scenario(seed, tuple(apps), tuple(steps), fault)


# --- judging ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """One decision about a workload, as the costs topic carries it."""

    order: tuple[float, int, bool, float]
    """``(changed_at, version, complete, emitted_at)``: the aggregator's and annotator's order
    of a workload's decisions (when the watcher saw the change, the snapshot version, a
    deadline's incomplete decision before the complete one), then when it was published."""
    costs: Mapping[str, int]
    """pod uid → cost."""
    emitted_at: float
    """When the aggregator published it (POSIX seconds; the test's processes share a clock)."""


@dataclass(frozen=True)
class Rewind:
    pod: str
    earlier: int
    later: int
    why: str
    history: tuple[tuple[int, int], ...] = ()
    """The pod's observed values up to the rewind, each with the index (in decision order) of
    the newest decision that desired it."""


def rewinds(
    decisions: Sequence[Decision], observed: Mapping[str, Sequence[tuple[float, int | None]]]
) -> list[Rewind]:
    """Every pod whose cost was rewound.

    ``observed`` lists, per pod uid, the successive values read on the pod with the wall-clock
    time of the read (``None``: no annotation yet). A value read at ``t`` is attributed to the
    newest decision published (``emitted_at``) by ``t`` that desired it for that pod: the one it
    can have come from at the latest. The cost is rewound when a value read after another is
    attributed to an older decision than the one before it (``5`` from decision 3, then ``2``
    that only decision 1 desired), or is a value no decision published by then desired.
    """
    ordered = sorted(decisions, key=lambda d: d.order)
    found: list[Rewind] = []
    for pod, values in observed.items():
        naming = [(i, d) for i, d in enumerate(ordered) if pod in d.costs]
        previous: tuple[int, int] | None = None
        history: list[tuple[int, int]] = []
        for at, value in values:
            if value is None:
                continue
            sources = [i for i, d in naming if d.costs[pod] == value and d.emitted_at <= at]
            if not sources:
                found.append(Rewind(pod, value, value, "no decision desired this value by then"))
                continue
            source = max(sources)
            history.append((value, source))
            if previous is not None and value != previous[0] and source < previous[1]:
                found.append(
                    Rewind(pod, previous[0], value, "an older decision's value", tuple(history))
                )
            previous = (value, source)
    return found


def newest_costs(decisions: Sequence[Decision]) -> dict[str, int]:
    """Per pod uid, the cost the newest decision naming it desires."""
    costs: dict[str, int] = {}
    for decision in sorted(decisions, key=lambda d: d.order):
        costs.update(decision.costs)
    return costs


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
