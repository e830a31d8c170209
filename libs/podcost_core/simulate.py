"""What-if scale-in: "if this workload scales to N, which pods go?", with or without podcost.

Pure: a snapshot in, a ``SimulationResult`` out. ``podcost simulate`` (services/podcost/commands/
simulate.py) is its caller. With a policy, podcost ranks the workload (``combine.rank``), labels
the costs it would write (``labels.label_costs``, less what ``implied.drop_implied`` leaves to the
controller), puts them on the pods, and asks the victim model (``victims.scale_in``) what the
ReplicaSet controller then deletes. Without one
(baseline), the pods keep the costs they have: what Kubernetes does today.

Which ReplicaSet scales. A ReplicaSet scales itself. A Deployment with one ReplicaSet holding
replicas scales that one to N (``FindActiveOrLatest`` in the deployment controller's
``scale``), exactly. With several (mid-rollout) the deployment controller splits the change
proportionally across them (``rollout.settled_sizes``, given the Deployment's ``Rollout``), and
each ReplicaSet that shrinks picks its own victims (their syncs run concurrently, so one's
co-location rank may or may not count another's victims as gone: the pods that could flip are
tied, ``_maybe_gone``); without the ``Rollout``, or when the split would grow one of them,
``SimulationError`` says so rather than guess. A rollout that is not paused goes on afterwards
and may move more replicas: that is the rollout, not this scale-in.

What podcost cannot change. A cost someone else set (a person with ``kubectl annotate``, a tool
whose field manager podcost does not adopt) is kept: never rewritten, fitted around inside the
band, and beyond the band it decides alone. With a policy, the result names those pods
(``kept``), who set them (``setters``, read off ``managedFields`` by the caller; empty when the
dump has none) and whether they change the outcome: the same scale-in is simulated once more
with them adopted (rewritten like podcost's own), and ``kept_changes_outcome`` says whether the
victims or the domains after differ. ``adopt_kept=True`` makes that adopted run the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from podcost_core.combine import rank
from podcost_core.implied import drop_implied
from podcost_core.labels import DEFAULT_BAND, CostBand, band_for, current_costs, label_costs
from podcost_core.model import (
    DELETION_COST_ANNOTATION,
    CostOwner,
    Pod,
    PodUID,
    Snapshot,
)
from podcost_core.policy import Policy
from podcost_core.rollout import Rollout, RolloutError, settled_sizes
from podcost_core.strategies import topology_spread
from podcost_core.victims import Now, VictimChoice, scale_in, victim_inputs

#: The domain name under which pods without one (unscheduled, node unknown or unlabelled) count.
NO_DOMAIN = "<none>"


class SimulationError(ValueError):
    """The request cannot be simulated; permanent, the message says what to change."""


@dataclass(frozen=True, slots=True)
class KeptCost:
    """A deletion cost podcost keeps as it is: someone else set it."""

    pod: str
    cost: int
    set_by: tuple[str, ...]
    """The field managers that own it; empty when not known (a dump without managedFields)."""
    in_band: bool
    """Inside podcost's band: a constraint podcost fits around. Outside: it decides alone."""

    def to_json(self) -> dict[str, object]:
        return {
            "pod": self.pod,
            "cost": self.cost,
            "set_by": list(self.set_by) if self.set_by else None,
            "in_band": self.in_band,
        }


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """The outcome of one simulated scale-in."""

    workload: str
    """``namespace/name``."""
    replicaset: str | None
    """The ReplicaSet that scales (``None`` when the workload has none)."""
    replicas_before: int
    """Active pods of that ReplicaSet now."""
    replicas_after: int
    victims: tuple[Pod, ...]
    """The deleted pods, first preferred first (one outcome the controller can produce)."""
    tied: tuple[Pod, ...]
    """Pods among which the controller's unstable sort picks ``tie_picks`` victims at random."""
    tie_picks: int
    costs: Mapping[str, int]
    """Pod name to the deletion cost the controller reads, after podcost's writes if any."""
    writes: Mapping[str, int]
    """Pod name to the cost podcost would write (empty for the baseline)."""
    topology_key: str
    domains_before: Mapping[str, int]
    domains_after: Mapping[str, int]
    skew_before: int
    skew_after: int
    rounds: tuple[VictimChoice, ...] = ()
    """One choice per controller sync (at most ``BURST_REPLICAS`` deletions each)."""
    pod_domains: Mapping[str, str] = field(default_factory=dict)
    """Pod name to its domain (``NO_DOMAIN`` if none), for every active pod."""
    replicasets: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Mid-rollout: each ReplicaSet the scale-in shrinks, ``spec.replicas`` before and after
    the deployment controller's proportional split (empty otherwise)."""
    rollout_goes_on: bool = False
    """Mid-rollout and not paused: the rollout moves more replicas after this scale-in."""
    kept: tuple[KeptCost, ...] = ()
    """With a policy: the active pods whose costs someone else set, which podcost keeps (with
    ``adopt_kept``: which it would keep, were they not adopted)."""
    kept_changes_outcome: bool = False
    """Whether adopting the ``kept`` costs changes the victims or the domains after."""
    adopted_kept: bool = False
    """The result is the outcome with the ``kept`` costs adopted (``adopt_kept``)."""

    def admits(self, deleted: Iterable[str]) -> bool:
        """Whether the controller deleting exactly ``deleted`` (pod names) is an outcome this
        simulation allows: every certain victim, plus ``tie_picks`` of the tied pods."""
        chosen = set(deleted)
        tied = {pod.name for pod in self.tied}
        certain = {pod.name for pod in self.victims} - tied
        drawn = chosen - certain
        return certain <= chosen and drawn <= tied and len(drawn) == self.tie_picks

    def to_json(self) -> dict[str, object]:
        """The ``podcost simulate --output json`` document (its contract, plus the tie)."""
        return {
            "workload": self.workload,
            "replicas_before": self.replicas_before,
            "replicas_after": self.replicas_after,
            "victims": [pod.name for pod in self.victims],
            "costs": dict(self.costs),
            "topology_key": self.topology_key,
            "domains_before": dict(self.domains_before),
            "domains_after": dict(self.domains_after),
            "skew_before": self.skew_before,
            "skew_after": self.skew_after,
            "tied": [pod.name for pod in self.tied],
            "tie_picks": self.tie_picks,
            "kept_costs": [kept.to_json() for kept in self.kept],
            "kept_costs_change_outcome": self.kept_changes_outcome,
            "kept_costs_adopted": self.adopted_kept,
            **(
                {
                    "replicasets": {
                        name: {"before": before, "after": after}
                        for name, (before, after) in self.replicasets.items()
                    },
                    "rollout_goes_on": self.rollout_goes_on,
                }
                if self.replicasets or self.rollout_goes_on
                else {}
            ),
        }


def scaling_replicaset(snapshot: Snapshot) -> str | None:
    """The ReplicaSet a change of the workload's replicas lands on; ``SimulationError`` when the
    deployment controller would split it across several."""
    workload = snapshot.workload
    if workload.kind == "ReplicaSet":
        return workload.name
    holding = sorted(name for name, info in snapshot.replicasets.items() if info.replicas > 0)
    if len(holding) > 1:
        raise SimulationError(
            f"{workload.namespace}/{workload.name} is mid-rollout: ReplicaSets "
            f"{', '.join(holding)} all hold replicas, and the deployment controller's "
            "proportional scaling across them is not modelled"
        )
    if holding:
        return holding[0]
    # No ReplicaSet holds replicas: FindActiveOrLatest picks the newest one.
    newest = max(
        snapshot.replicasets.values(),
        key=lambda info: (info.created or 0.0, info.name),
        default=None,
    )
    return newest.name if newest is not None else None


def topology_key_of(policy: Policy | None, annotations: Mapping[str, str]) -> str:
    """The node label whose domains the result reports: the policy's topology-spread key, else
    the workload's ``spread-by`` annotation, else the zone."""
    if policy is not None:
        for bound in policy.bound:
            if bound.name == topology_spread.NAME and isinstance(bound.args, topology_spread.Args):
                return bound.args.topology_key
    for key in ("podcost.dev/spread-by", "pod-deletion-cost.lablabs.io/spread-by"):
        if annotations.get(key, "").strip():
            return annotations[key].strip()
    return topology_spread.DEFAULT_TOPOLOGY_KEY


def _with_cost(pod: Pod, cost: int) -> Pod:
    return replace(
        pod,
        annotations={**pod.annotations, DELETION_COST_ANNOTATION: str(cost)},
        deletion_cost=cost,
        deletion_cost_raw=str(cost),
        cost_owner=CostOwner.PODCOST,
    )


def _domain(snapshot: Snapshot, pod: Pod, key: str) -> str:
    node = snapshot.node_of(pod)
    domain = node.labels.get(key) if node is not None else None
    return domain if domain is not None else NO_DOMAIN


def _domains(snapshot: Snapshot, pods: list[Pod], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in pods:
        name = _domain(snapshot, pod, key)
        counts[name] = counts.get(name, 0) + 1
    return counts


def _skew(counts: Mapping[str, int]) -> int:
    real = [count for domain, count in counts.items() if domain != NO_DOMAIN]
    return max(real) - min(real) if real else 0


def simulate(
    snapshot: Snapshot,
    replicas: int,
    now: Now,
    *,
    policy: Policy | None,
    topology_key: str | None = None,
    overwrite_foreign: bool = False,
    rollout: Rollout | None = None,
    setters: Mapping[PodUID, tuple[str, ...]] | None = None,
    adopt_kept: bool = False,
) -> SimulationResult:
    """Scale ``snapshot``'s workload to ``replicas``; ``policy=None`` is the baseline.

    ``now`` is the controller's clock (LogarithmicScaleDown compares ages against it).
    ``rollout`` (``rollout.rollout_for``) lets a Deployment mid-rollout be scaled: its
    ``replicas`` is then the Deployment's new ``spec.replicas``, split as the deployment
    controller splits it. ``setters``: per pod, the field managers that own its cost
    (``kubejson.cost_managers``), to name who set the costs podcost keeps; ``adopt_kept``: the
    result is the outcome with them adopted (see the module docstring).
    """
    result = _simulate_once(
        snapshot, replicas, now, policy=policy, topology_key=topology_key,
        overwrite_foreign=overwrite_foreign or adopt_kept, rollout=rollout,
    )  # fmt: skip
    if policy is None or overwrite_foreign:
        return result
    kept = kept_costs(snapshot, setters or {}, band_for(policy.non_negative_costs))
    if not kept:
        return result
    other = _simulate_once(
        snapshot, replicas, now, policy=policy, topology_key=topology_key,
        overwrite_foreign=not adopt_kept, rollout=rollout,
    )  # fmt: skip
    changes = {p.name for p in other.victims} != {p.name for p in result.victims} or (
        dict(other.domains_after) != dict(result.domains_after)
    )
    return replace(result, kept=kept, kept_changes_outcome=changes, adopted_kept=adopt_kept)


def kept_costs(
    snapshot: Snapshot, setters: Mapping[PodUID, tuple[str, ...]], band: CostBand = DEFAULT_BAND
) -> tuple[KeptCost, ...]:
    """The active pods whose valid cost someone else set (``labels.current_costs``), by name;
    ``band`` is the one podcost writes this workload's costs in."""
    current = current_costs(snapshot.pods)
    found = []
    for pod in snapshot.pods:
        cost = current[pod.uid]
        if pod.active and cost.foreign and cost.value is not None:
            found.append(
                KeptCost(pod.name, cost.value, setters.get(pod.uid, ()), cost.value in band)
            )
    return tuple(sorted(found, key=lambda kept: kept.pod))


def _simulate_once(
    snapshot: Snapshot,
    replicas: int,
    now: Now,
    *,
    policy: Policy | None,
    topology_key: str | None,
    overwrite_foreign: bool,
    rollout: Rollout | None,
) -> SimulationResult:
    workload = snapshot.workload
    name = f"{workload.namespace}/{workload.name}"
    split: dict[str, tuple[int, int]] = {}
    replicaset: str | None
    mid_rollout = rollout is not None and len(rollout.holding()) > 1
    if mid_rollout and rollout is not None:
        split = _proportional_split(rollout, replicas, name)
        # The largest that shrinks; none when the split leaves every size as it is.
        replicaset = max(split, key=lambda rs: (split[rs][0], rs), default=None)
        candidates = [p for p in snapshot.pods if p.active and p.replicaset in rollout.holding()]
    else:
        replicaset = scaling_replicaset(snapshot)
        candidates = [p for p in snapshot.pods if p.active and p.replicaset == replicaset]
        if replicaset is None or not 0 <= replicas <= len(candidates):
            raise SimulationError(
                f"--replicas {replicas} is outside 0..{len(candidates)}, the active pods of "
                f"{name} (simulate models scale-in only)"
            )

    writes: dict[PodUID, int] = {}
    if policy is not None:
        combined = rank(snapshot, policy)
        current = current_costs(snapshot.pods)
        labelling = label_costs(
            combined.order,
            {p.uid: p.replicaset for p in snapshot.pods},
            current,
            overwrite_foreign=overwrite_foreign,
            band=band_for(policy.non_negative_costs),
        )
        labelling = drop_implied(
            labelling, combined.order, snapshot, current, band=band_for(policy.non_negative_costs)
        )
        writes = dict(labelling.writes)
        snapshot = replace(
            snapshot,
            pods=tuple(
                _with_cost(p, writes[p.uid]) if p.uid in writes else p for p in snapshot.pods
            ),
        )

    rounds: tuple[VictimChoice, ...] = ()
    if mid_rollout:
        for rs, (_, size) in sorted(split.items()):
            pods, related = victim_inputs(snapshot, rs)
            maybe = _maybe_gone(snapshot, split, rs)
            rounds += scale_in(pods, related, size, now, maybe_gone=maybe)
    elif replicaset is not None:  # refused above when there is none
        pods, related = victim_inputs(snapshot, replicaset)
        rounds = scale_in(pods, related, replicas, now)
    victims = tuple(pod for choice in rounds for pod in choice.victims)
    gone = {pod.uid for pod in victims}
    # Later rounds follow the model's own tie picks (see scale_in); report every round's tie.
    tied = tuple(pod for choice in rounds for pod in choice.tied)
    tie_picks = sum(choice.tie_picks for choice in rounds)

    key = topology_key or topology_key_of(policy, snapshot.annotations)
    active = [p for p in snapshot.pods if p.active]
    before = _domains(snapshot, active, key)
    after = _domains(snapshot, [p for p in active if p.uid not in gone], key)
    after = {domain: after.get(domain, 0) for domain in before}
    names = {p.uid: p.name for p in snapshot.pods}
    return SimulationResult(
        workload=name,
        replicaset=replicaset,
        replicas_before=len(candidates),
        replicas_after=replicas,
        victims=victims,
        tied=tied,
        tie_picks=tie_picks,
        costs={p.name: p.deletion_cost for p in active},
        writes={names[uid]: cost for uid, cost in writes.items()},
        topology_key=key,
        domains_before=before,
        domains_after=after,
        skew_before=_skew(before),
        skew_after=_skew(after),
        rounds=rounds,
        pod_domains={p.name: _domain(snapshot, p, key) for p in active},
        replicasets=split,
        rollout_goes_on=mid_rollout and rollout is not None and not rollout.paused,
    )


def _maybe_gone(
    snapshot: Snapshot, split: Mapping[str, tuple[int, int]], replicaset: str
) -> dict[str, int]:
    """Per node ("" for unscheduled pods), how many related pods the other shrinking
    ReplicaSets may have deleted already when ``replicaset`` sorts its pods: their syncs run
    concurrently with its own, and its rank (rule 5) counts only the pods still active."""
    gone: dict[str, int] = {}
    for other, (before, after) in split.items():
        if other == replicaset:
            continue
        on_node: dict[str, int] = {}
        for pod in snapshot.pods:
            if pod.active and pod.replicaset == other:
                on_node[pod.node or ""] = on_node.get(pod.node or "", 0) + 1
        for node, count in on_node.items():
            gone[node] = gone.get(node, 0) + min(count, before - after)
    return gone


def _proportional_split(rollout: Rollout, replicas: int, name: str) -> dict[str, tuple[int, int]]:
    """The ReplicaSets a mid-rollout scale to ``replicas`` shrinks: name → (before, after)."""
    current = {rs.name: rs.replicas for rs in rollout.replicasets}
    total = sum(current.values())
    try:
        sizes = settled_sizes(rollout, replicas)
    except RolloutError as error:
        raise SimulationError(f"{name}: {error}") from None
    grown = sorted(rs for rs, size in sizes.items() if size > current[rs])
    if grown:
        raise SimulationError(
            f"--replicas {replicas} grows ReplicaSet(s) {', '.join(grown)} of {name}, which "
            f"hold {total} replicas mid-rollout (simulate models scale-in only)"
        )
    return {rs: (current[rs], size) for rs, size in sizes.items() if size < current[rs]}
