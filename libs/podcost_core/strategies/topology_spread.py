"""Strategy ``topology-spread``: scale in without growing the skew across a node label's domains.

Seeds 002 (lablabs' zone algorithm) and 003 (the KEP's "balancing duplicates among topological
domains"). A domain is a value of the node label ``topology_key`` (default: the zone); pods that are
unscheduled, on a node missing from the snapshot or on a node without the label share one extra
domain of their own.

The rule. Only active pods count. Inside a domain of *c* pods, ordered by the controller's own
preferences (``controller_order_key``: unscheduled, pending, not ready, most recently ready, most
restarts, newest first), the pod at position *j* (0-based, first to go first) gets level *c − j*
and the score −level. Deleting the first *k* pods in ascending score (ties in any order) is then
exactly "delete from a currently-largest domain", for every *k* at once, which leaves the least
skew any *k* deletions can leave (proof in ``spread_levels``; tests in
``tests/unit/test_topology_spread.py``). Inactive pods score below every active pod.

Inside a policy the combiner does not use this within-domain order: it calls :func:`domains` and
orders each domain's pods by the rest of the policy (so that, say, the spot pod of a zone is that
zone's first to go), then applies the same levels. ``score`` is what a ranker running this strategy
alone publishes. Callers: the registry, the combiner, the generic ranker.
"""

from __future__ import annotations

from dataclasses import dataclass

from podcost_core.model import PodUID, Snapshot
from podcost_core.strategies.base import (
    Strategy,
    active_pods,
    controller_order_key,
    node_lookup,
    reading,
    require_label_key,
    spread_levels,
)

NAME = "topology-spread"
DEFAULT_TOPOLOGY_KEY = "topology.kubernetes.io/zone"


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``topology-spread``."""

    topology_key: str = DEFAULT_TOPOLOGY_KEY
    """The node label whose values are the domains (``podcost.dev/spread-by``)."""

    def __post_init__(self) -> None:
        require_label_key("topology_key", self.topology_key)


def domains(snapshot: Snapshot, args: Args) -> dict[PodUID, str | None]:
    """Each pod's domain: its node's ``topology_key`` value; ``None`` = the shared extra domain."""
    key = args.topology_key
    node_of = node_lookup(snapshot)
    return {
        pod.uid: None if (node := node_of(pod.node)) is None else node.labels.get(key)
        for pod in snapshot.pods
    }


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """−level of every pod (see the module docstring); inactive pods below all active ones."""
    domain_of = domains(snapshot, args)
    active = active_pods(snapshot)
    keys = [controller_order_key(pod) for pod in active]
    order = sorted(range(len(active)), key=keys.__getitem__)
    levels = spread_levels(order, [domain_of[pod.uid] for pod in active])
    out = {pod.uid: float(-level) for pod, level in zip(active, levels, strict=True)}
    if len(active) < len(snapshot.pods):
        floor = float(-(max(levels, default=0) + 1))
        for pod in snapshot.pods:
            if not pod.active:
                out[pod.uid] = floor
    return out


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    unread=reading(node=("labels",)),
    description="Delete from the largest domains of a node label first so skew never grows.",
    domains=domains,
)
