"""Strategy ``capacity-type``: delete pods on spot and on expensive pay-as-you-go nodes first.

Seed 001's use case: a cluster mixes subscription (reserved) nodes with pay-as-you-go ones that an
autoscaler removes once idle; scale-in should empty the pay-as-you-go nodes so they can go. Spot
and preemptible nodes go first of all: they are pay-per-use too and the provider may take them
back at any moment, so the replicas worth keeping are the ones elsewhere.

The rule, two classes and a price inside each:

- spot: a node carrying one of :data:`SPOT_LABELS` (Karpenter, EKS, GKE spot and preemptible,
  AKS), or the custom ``label`` (with ``value``, if given);
- everything else: on-demand, reserved, or a node podcost knows nothing about (including pods not
  scheduled or on a node missing from the snapshot: nothing speaks against them).

Inside a class, the node's hourly price (annotation ``price_annotation``, a non-negative number)
orders the pods: the most expensive node's pods go first, because removing that node saves the
most; a node without a (valid) price counts as price 0, i.e. already paid for. Raw score: spot
pods in [0, 1], the others in [2, 3], ``class·2 + (1 − price / highest price in the snapshot)``;
the gap keeps the classes apart after normalization. Callers: the registry, the combiner, the
generic ranker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from podcost_core.model import Node, PodUID, Snapshot
from podcost_core.strategies.base import ArgError, Strategy, reading, require_label_key

NAME = "capacity-type"
DEFAULT_PRICE_ANNOTATION = "podcost.dev/hourly-price"

#: (label, value) pairs by which the clouds and Karpenter mark spot / preemptible nodes.
SPOT_LABELS: tuple[tuple[str, str], ...] = (
    ("karpenter.sh/capacity-type", "spot"),
    ("eks.amazonaws.com/capacityType", "SPOT"),
    ("cloud.google.com/gke-spot", "true"),
    ("cloud.google.com/gke-preemptible", "true"),
    ("kubernetes.azure.com/scalesetpriority", "spot"),
)


@dataclass(frozen=True, slots=True)
class Args:
    """Arguments of ``capacity-type``."""

    label: str = ""
    """A node label of your own that marks spot-like nodes (empty = none)."""
    value: str = ""
    """The value ``label`` must have; empty = any value."""
    price_annotation: str = DEFAULT_PRICE_ANNOTATION
    """Node annotation with the node's hourly price; empty = ignore prices."""
    known_labels: bool = True
    """Whether the cloud providers' labels in ``SPOT_LABELS`` count."""

    def __post_init__(self) -> None:
        if self.label:
            require_label_key("label", self.label)
        elif self.value:
            raise ArgError("value", "is only meaningful together with label")
        if self.price_annotation:
            require_label_key("price_annotation", self.price_annotation)


def is_spot(node: Node, args: Args) -> bool:
    """Whether ``node`` is a spot / preemptible node as ``args`` define it."""
    labels = node.labels
    if args.known_labels:
        for key, value in SPOT_LABELS:
            if labels.get(key) == value:
                return True
    if args.label:
        found = labels.get(args.label)
        return found is not None and (not args.value or found == args.value)
    return False


def price(node: Node, annotation: str) -> float:
    """The node's hourly price; 0 if the annotation is absent, not a number or negative."""
    raw = node.annotations.get(annotation) if annotation else None
    return 0.0 if raw is None else _parse_price(raw)


def score(snapshot: Snapshot, args: Args) -> dict[PodUID, float]:
    """``class·2 + 1 − price / highest price``: spot in [0, 1], others in [2, 3]; higher = keep."""
    # Per node, not per pod (pods share nodes), in one pass with the helpers inlined: this runs
    # for every node of every snapshot.
    spot_labels = SPOT_LABELS if args.known_labels else ()
    label, value, annotation = args.label, args.value, args.price_annotation
    base: dict[str | None, float] = {}
    prices: dict[str, float] = {}
    for name, node in snapshot.nodes.items():
        labels = node.labels
        spot = False
        for key, expected in spot_labels:
            if labels.get(key) == expected:
                spot = True
                break
        if not spot and label:
            found = labels.get(label)
            spot = found is not None and (not value or found == value)
        base[name] = 1.0 if spot else 3.0
        raw = node.annotations.get(annotation) if annotation else None
        if raw is not None:
            cost = _parse_price(raw)
            if cost > 0.0:
                prices[name] = cost
    if prices:
        highest = max(prices.values())
        for name, cost in prices.items():
            base[name] -= cost / highest
    # Unscheduled pods and nodes missing from the snapshot: nothing known against them.
    of = base.get
    return {pod.uid: of(pod.node, 3.0) for pod in snapshot.pods}


def _parse_price(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value > 0.0 else 0.0


STRATEGY: Strategy[Args] = Strategy(
    name=NAME,
    args_type=Args,
    score=score,
    unread=reading(node=("labels", "annotations")),
    description="Delete pods on spot/preemptible nodes, then on the most expensive nodes, first.",
)
