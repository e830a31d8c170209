"""The demo's comparison, decided purely: the same pods scaled in without podcost and with it.

``podcost demo`` (``podcost.commands.demo``) reads the cluster, hands the snapshot of a workload
(as podcost left it, costs written) and the pods the real controller deleted to :func:`compare`,
and prints, charts (``demo_chart``) and writes as JSON what comes back. Nothing here does I/O.

The "without podcost" column is the victim model (``podcost_core.simulate`` with no policy) on
the very same pods with every deletion cost taken off: what the ReplicaSet controller would have
deleted had podcost never run. The "with podcost" column is what the real controller deleted,
read back from the cluster; the model's prediction from the costs podcost wrote is kept beside
it, so the demo can say whether the controller did what podcost predicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from podcost_core.model import DELETION_COST_ANNOTATION, CostOwner, Pod, Snapshot
from podcost_core.simulate import NO_DOMAIN, SimulationResult, simulate
from podcost_core.victims import Now

ZONE = "topology.kubernetes.io/zone"
CAPACITY = "karpenter.sh/capacity-type"
#: How a pod on a node without the capacity label counts.
UNKNOWN = "?"


@dataclass(frozen=True, slots=True)
class PodPlace:
    """Where one pod runs, and the deletion cost it carried before the scale-in."""

    name: str
    node: str
    zone: str
    capacity: str
    cost: int | None
    """The deletion cost on the pod (``None``: none)."""

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "node": self.node, "zone": self.zone,
                "capacity": self.capacity, "cost": self.cost}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    """One column of the comparison: the pods deleted and what is left."""

    deleted: tuple[PodPlace, ...]
    zones_after: Mapping[str, int]
    capacity_after: Mapping[str, int]
    tied: tuple[str, ...] = ()
    """Pods among which Kubernetes picks ``tie_picks`` victims at random (without podcost)."""
    tie_picks: int = 0

    @property
    def zone_skew(self) -> int:
        return skew(self.zones_after)

    def to_json(self) -> dict[str, object]:
        return {
            "deleted": [place.to_json() for place in self.deleted],
            "zones_after": dict(self.zones_after),
            "capacity_after": dict(self.capacity_after),
            "zone_skew_after": self.zone_skew,
            "tied": list(self.tied),
            "tie_picks": self.tie_picks,
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """One workload scaled in, without podcost (model) and with it (the real controller)."""

    workload: str
    strategies: str
    replicas_before: int
    replicas_after: int
    before: tuple[PodPlace, ...]
    """Every active pod before the scale-in, with the cost podcost gave it."""
    without: Outcome
    with_podcost: Outcome
    predicted: tuple[str, ...]
    """What the victim model predicted the controller deletes, given podcost's costs."""
    as_predicted: bool
    """Whether the real controller deleted what the model predicted (ties allowed)."""

    @property
    def zones_before(self) -> dict[str, int]:
        return _count(place.zone for place in self.before)

    @property
    def capacity_before(self) -> dict[str, int]:
        return _count(place.capacity for place in self.before)

    def to_json(self) -> dict[str, object]:
        return {
            "workload": self.workload,
            "strategies": self.strategies,
            "replicas_before": self.replicas_before,
            "replicas_after": self.replicas_after,
            "before": [place.to_json() for place in self.before],
            "zones_before": self.zones_before,
            "capacity_before": self.capacity_before,
            "zone_skew_before": skew(self.zones_before),
            "without_podcost": self.without.to_json(),
            "with_podcost": self.with_podcost.to_json(),
            "predicted": list(self.predicted),
            "as_predicted": self.as_predicted,
        }


def skew(counts: Mapping[str, int]) -> int:
    """Largest minus smallest count over the real domains."""
    real = [count for domain, count in counts.items() if domain != NO_DOMAIN]
    return max(real) - min(real) if real else 0


def _count(values: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))


def without_costs(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with every deletion cost taken off its pods: the cluster had podcost not run."""

    def bare(pod: Pod) -> Pod:
        annotations = {k: v for k, v in pod.annotations.items() if k != DELETION_COST_ANNOTATION}
        return replace(pod, annotations=annotations, deletion_cost=0, deletion_cost_raw=None,
                       cost_owner=CostOwner.NONE)  # fmt: skip

    return replace(snapshot, pods=tuple(bare(pod) for pod in snapshot.pods))


def places(snapshot: Snapshot) -> dict[str, PodPlace]:
    """Every active pod of ``snapshot`` by name, with its zone, capacity type and cost."""
    found: dict[str, PodPlace] = {}
    for pod in snapshot.pods:
        if not pod.active:
            continue
        node = snapshot.node_of(pod)
        labels = node.labels if node is not None else {}
        found[pod.name] = PodPlace(
            name=pod.name,
            node=pod.node or "",
            zone=labels.get(ZONE, NO_DOMAIN),
            capacity=labels.get(CAPACITY, UNKNOWN),
            cost=pod.deletion_cost if pod.deletion_cost_raw is not None else None,
        )
    return found


def _outcome(before: Mapping[str, PodPlace], deleted: Iterable[str], zones: Iterable[str],
             result: SimulationResult | None = None) -> Outcome:  # fmt: skip
    gone = [before[name] for name in deleted]
    names = {place.name for place in gone}
    left = [place for name, place in before.items() if name not in names]
    zones_after = dict.fromkeys(zones, 0) | _count(place.zone for place in left)
    capacity_after = dict.fromkeys(sorted({p.capacity for p in before.values()}), 0)
    return Outcome(
        deleted=tuple(gone),
        zones_after=dict(sorted(zones_after.items())),
        capacity_after=capacity_after | _count(place.capacity for place in left),
        tied=tuple(pod.name for pod in result.tied) if result is not None else (),
        tie_picks=result.tie_picks if result is not None else 0,
    )


def compare(
    snapshot: Snapshot,
    replicas: int,
    deleted: Iterable[str],
    now: Now,
    *,
    strategies: str,
) -> Comparison:
    """Compare, for ``snapshot``'s workload scaled in to ``replicas``, what Kubernetes deletes
    without podcost (the model on the same pods, costs taken off) with what the real controller
    ``deleted`` (pod names) given podcost's costs. ``now`` is the controller's clock at the
    scale-in (its LogarithmicScaleDown compares pod ages against it)."""
    before = places(snapshot)
    zones = sorted({place.zone for place in before.values()})
    baseline = simulate(without_costs(snapshot), replicas, now, policy=None, topology_key=ZONE)
    predicted = simulate(snapshot, replicas, now, policy=None, topology_key=ZONE)
    really = sorted(deleted, key=lambda name: (before[name].cost or 0, name))
    return Comparison(
        workload=f"{snapshot.workload.namespace}/{snapshot.workload.name}",
        strategies=strategies,
        replicas_before=len(before),
        replicas_after=replicas,
        before=tuple(before.values()),
        without=_outcome(before, [pod.name for pod in baseline.victims], zones, baseline),
        with_podcost=_outcome(before, really, zones),
        predicted=tuple(pod.name for pod in predicted.victims),
        as_predicted=predicted.admits(really),
    )
