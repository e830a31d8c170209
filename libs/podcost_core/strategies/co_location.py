"""Strategy ``co-location``: delete doubled-up pods and pods that worsen anti-affinity first.

Seed 000's rule 5 (the ReplicaSet controller prefers to delete a pod whose node runs more related
active pods) and seed 003's "minimizing pod anti-affinity". podcost's cost is rule 4, which comes
before rule 5, so a policy without this strategy would silently drop rule 5; with it, the same
preference survives and is weighed against the others.

The rule: penalty = ``same_node_weight`` · (other active pods of the workload on the pod's node)
+ Σ over the pod's anti-affinity terms of (term weight) · (other active pods of the workload in
the pod's domain for the term's topology key that the term's selector matches); term weight =
``required_weight`` for a required term, ``preferred_weight`` · weight/100 for a preferred one.
Raw score = −penalty. A term's domain is the pod's node's label ``topology_key``
(``kubernetes.io/hostname`` falls back to the node name); a pod without one is not counted, as the
scheduler does not count nodes without the key. "Pods of the workload" includes the snapshot's
bystanders (pods its selectors match without owning them), as in the controller's rule 5; they are
counted, never scored. Anti-affinity against other workloads is out of reach: their pods are not
in the snapshot. Unscheduled and inactive pods score 0.
Callers: the registry, the combiner, the generic ranker.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import compress

from podcost_core.model import AffinityTerm, Pod, PodUID, Snapshot
from podcost_core.strategies.base import (
    ArgError,
    Strategy,
    active_pods,
    node_lookup,
    reading,
    require_finite,
    scores_by_uid,
)

NAME = "co-location"
HOSTNAME_KEY = "kubernetes.io/hostname"


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``co-location``."""

    same_node_weight: float = 1.0
    """Penalty per other pod of the workload on the same node."""
    required_weight: float = 10.0
    """Penalty per pod a required anti-affinity term matches in the pod's domain."""
    preferred_weight: float = 1.0
    """Penalty per matched pod of a preferred term of weight 100 (scaled by the term's weight)."""

    def __post_init__(self) -> None:
        for arg in ("same_node_weight", "required_weight", "preferred_weight"):
            require_finite(arg, getattr(self, arg), minimum=0.0)
        if not (self.same_node_weight or self.required_weight or self.preferred_weight):
            raise ArgError("same_node_weight", "at least one of the three weights must be positive")


def _matches(pod: Pod, term: AffinityTerm) -> bool:
    # A term whose selector could not be reduced is taken to select the pod's own workload.
    if not term.exact:
        return True
    labels = pod.labels
    return all(labels.get(key) == value for key, value in term.match_labels.items())


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """−(same-node doubling + weighted anti-affinity violations); higher = keep."""
    active = active_pods(snapshot)
    # Bystanders (pods the workload's selectors match but does not own) are counted, as the
    # controller's rule 5 counts them, but not scored.
    population = active + [pod for pod in snapshot.bystanders if pod.active]
    nodes = [pod.node for pod in population]
    # The doubling-up penalty depends on the node alone, and most pods are alone on theirs.
    # Scores are −penalty from the start (−0.0 for none) and each further penalty is subtracted:
    # the same floats as negating the sum at the end, since rounding is symmetric.
    weight = args.same_node_weight
    doubled = {node: -(weight * (count - 1)) for node, count in Counter(nodes).items() if count > 1}
    doubled.pop(None, None)  # unscheduled pods share a node with nobody
    alone = doubled.get
    scores = [alone(node, -0.0) for node in nodes[: len(active)]]
    if any([pod.anti_affinity for pod in active]):
        _subtract_anti_affinity(snapshot, population, args, scores)
    return scores_by_uid(snapshot, active, scores)


def _subtract_anti_affinity(
    snapshot: Snapshot, population: list[Pod], args: Args, scores: list[float]
) -> None:
    """Subtract each term's penalty from ``scores``, which covers the first pods of
    ``population`` (the active pods of the workload; bystanders follow them)."""
    node_of = node_lookup(snapshot)
    domains_by_key: dict[str, list[str | None]] = {}

    def domains(key: str) -> list[str | None]:
        found = domains_by_key.get(key)
        if found is None:
            if key == HOSTNAME_KEY:  # a node without the label (or unknown) is its own
                found = [
                    pod.node
                    if (node := node_of(pod.node)) is None
                    else node.labels.get(key, pod.node)
                    for pod in population
                ]
            else:
                found = [
                    None if (node := node_of(pod.node)) is None else node.labels.get(key)
                    for pod in population
                ]
            domains_by_key[key] = found
        return found

    # Pods of one workload share their terms (one template): group the pods by their tuple of
    # terms, then work term by term, computing once per distinct term which pods it matches and
    # how many of those each domain holds.
    holders: dict[int, tuple[tuple[AffinityTerm, ...], list[int]]] = {}
    for index, pod in enumerate(population[: len(scores)]):
        terms = pod.anti_affinity
        if terms:
            entry = holders.get(id(terms))
            if entry is None:
                holders[id(terms)] = (terms, [index])
            else:
                entry[1].append(index)
    by_content: dict[object, tuple[list[bool], dict[str | None, int]]] = {}
    for terms, indices in holders.values():
        for term in terms:
            if term.weight == 0:
                weight = args.required_weight
            else:
                weight = args.preferred_weight * term.weight / 100.0
            if not weight:
                continue
            where = domains(term.topology_key)
            selector = tuple(sorted(term.match_labels.items())) if term.exact else ()
            content = (term.topology_key, term.exact, selector)
            found = by_content.get(content)
            if found is None:
                found = by_content[content] = _matches_by_domain(population, term, where)
            matched, counts = found
            count = counts.get
            for index in indices:
                own = where[index]
                if own is not None:
                    scores[index] -= weight * (count(own, 0) - matched[index])


def _matches_by_domain(
    pods: list[Pod], term: AffinityTerm, where: list[str | None]
) -> tuple[list[bool], dict[str | None, int]]:
    """Which pods ``term`` selects, and how many selected pods each domain holds."""
    items = list(term.match_labels.items())
    if not term.exact or not items:
        matched = [True] * len(pods)
    elif len(items) == 1:  # the usual `app: name` selector, without a call per pod
        key, value = items[0]
        matched = [pod.labels.get(key) == value for pod in pods]
    else:
        matched = [_matches(pod, term) for pod in pods]
    counts: dict[str | None, int] = Counter(compress(where, matched))
    counts.pop(None, None)  # pods without a domain are not counted
    return matched, counts


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    unread=reading(pod=("labels", "anti_affinity"), node=("labels",)),
    description="Delete pods doubled up on a node or worsening anti-affinity first.",
)
