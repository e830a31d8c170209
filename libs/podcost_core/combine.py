"""The combiner: raw per-strategy scores and a policy in, one explained deletion order out.

Callers: the aggregator (``combine`` with the answers that came back from the ranker processes,
possibly incomplete after a deadline), a single-process run and the CLI (``rank``, which runs the
policy's strategies itself). Its output goes to the cost labeller, which turns the order into
int32 costs.

How an order is made:

1. Only active pods are ranked (the ReplicaSet controller only deletes among those); inactive ones
   are listed in ``Combined.excluded``.
2. Every scoring strategy's raw scores are normalized to ints in [0, 100]
   (``podcost_core.normalize``, or the strategy's own ``normalize``, whose range is checked here),
   multiplied by the strategy's weight and summed per tier. The sums are kept packed: one int per
   pod, the tier sums as its digits (bases ``Policy.tier_spans``), which sorts like the tuple of
   sums, dominant tier first; ``Combined.points`` unpacks them on demand.
3. Spread strategies (``Strategy.domains``, e.g. ``topology-spread``) are levelled here, in the
   context of the policy: inside each domain the pods are ordered first by
   ``controller_class`` (the controller deletes unscheduled, pending and not-ready pods before it
   reads any cost), then by everything else the policy says (tier sums, dominant tier first),
   then by the rest of ``controller_order_key``; the pod at position *j* of a domain of *c* pods
   gets level *c − j* (``spread_levels``), and its raw score is −level. So the zone-balance
   guarantee holds for every *k* pods deleted in a row, and it is the other strategies that
   decide which pod of a zone goes (the spot one, the tainted one, ...), not an arbitrary order.
   Their ranker answers are not needed (``answers_needed``): the levels depend on the other
   strategies' scores, which only the combiner has. With several spread strategies, the least
   dominant is levelled first and the more dominant ones see its points. Normalization keeps
   levels apart while the largest domain has at most 101 pods; beyond that, neighbouring levels
   may share a value and the skew of a scale-in may exceed the least possible by a little.
4. Pods are sorted by their tuple of tier sums, dominant tier first, ascending: the first group is
   deleted first. Pods whose tuples are equal form one group (ties stay ties: they get equal
   costs); a group lists its pods by uid, so the output does not depend on the snapshot's order.
   ``Combined.breakdown`` explains any pod's sums strategy by strategy, with the normalized
   scores computed on the way (the aggregator explains every pod of every order it decides).

Every answer is checked: a strategy that leaves out an active pod, returns a non-finite raw
score, or whose own normalization leaves [0, 100] raises :class:`ScoreContractError` naming it.
A strategy of the policy with no answer is reported in ``Combined.missing`` and the order is made
from the others.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from podcost_core.model import Phase, Pod, PodUID, Snapshot
from podcost_core.normalize import MIN_SCORE, in_range, normalize, scale
from podcost_core.policy import DEFAULT_POLICY, BoundStrategy, Policy
from podcost_core.strategies.base import (
    Scores,
    active_pods,
    controller_class,
    controller_order_key,
    spread_levels,
)


class ScoreContractError(ValueError):
    """A strategy's answer breaks the score contract; ``strategy`` names it. Not retriable."""

    def __init__(self, strategy: str, reason: str) -> None:
        super().__init__(f"strategy {strategy!r}: {reason}")
        self.strategy = strategy
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Contribution:
    """What one strategy added to one pod's cost: the explanation of a cost, term by term."""

    strategy: str
    tier: int
    """The tier number of the policy (lower dominates)."""
    weight: int
    raw: float
    """The strategy's raw score (−level for a spread strategy)."""
    normalized: int
    """In [0, 100]."""

    @property
    def points(self) -> int:
        """``weight · normalized``: what this strategy added to the pod's tier sum."""
        return self.weight * self.normalized


@dataclass(frozen=True)
class Combined:
    """The combined order of one snapshot, with everything needed to explain it."""

    policy: Policy
    version: int
    """The snapshot version the order is for."""
    uids: tuple[PodUID, ...]
    """The ranked (active) pods, in snapshot order; ``packed`` and ``raw`` align with it."""
    order: tuple[tuple[PodUID, ...], ...]
    """Groups of tied pods, ascending: ``order[0]`` is deleted first."""
    packed: Sequence[int]
    """Per ranked pod: its tier sums packed into one int, the sums as digits in the bases
    ``policy.tier_spans``, dominant tier first; it sorts like the tuple (``points``, ``keys``)."""
    raw: Mapping[str, Sequence[float]]
    """Per strategy that took part: raw scores aligned with ``uids`` (−level for a spread)."""
    plugin_normalized: Mapping[str, Sequence[int]] = field(default_factory=dict)
    """Normalized scores of the strategies that normalize themselves (the rest: ``normalized``)."""
    missing: tuple[str, ...] = ()
    """Strategies of the policy whose answer was not there: the order was made without them."""
    ignored: tuple[str, ...] = ()
    """Answers that played no part: strategies not in the policy, and spread strategies."""
    excluded: tuple[PodUID, ...] = ()
    """Inactive pods (finished or being deleted): not ranked."""

    @property
    def complete(self) -> bool:
        """Whether every strategy of the policy took part."""
        return not self.missing

    @cached_property
    def points(self) -> tuple[Sequence[int], ...]:
        """Per tier, dominant first: each ranked pod's sum of weighted normalized scores.

        Unpacked from ``packed`` on first use.
        """
        tiers: list[Sequence[int]] = []
        rest = list(self.packed)
        for span in reversed(self.policy.tier_spans[1:]):
            tiers.append([value % span for value in rest])
            rest = [value // span for value in rest]
        tiers.append(rest)
        return tuple(reversed(tiers))

    @cached_property
    def normalized(self) -> Mapping[str, Sequence[int]]:
        """Per strategy that took part: normalized scores aligned with ``uids``.

        Those ``combine`` computed on the way; for a ``Combined`` made otherwise (a copy by
        ``dataclasses.replace``, say), computed from ``raw`` on first use by the same function.
        """
        out = dict(self.plugin_normalized)
        for bound in self.policy.bound:
            if bound.name in self.raw and bound.name not in out:
                out[bound.name] = normalize(self.raw[bound.name], bound.spec.threshold)
        return out

    @cached_property
    def keys(self) -> tuple[tuple[int, ...], ...]:
        """Per ranked pod: its tier sums, dominant tier first (what the order sorts by)."""
        return tuple(zip(*self.points, strict=True))

    @cached_property
    def _position(self) -> dict[PodUID, int]:
        return {uid: index for index, uid in enumerate(self.uids)}

    @cached_property
    def ranks(self) -> dict[PodUID, int]:
        """Each ranked pod's group index: 0 = deleted first; tied pods share it."""
        return {uid: rank for rank, group in enumerate(self.order) for uid in group}

    def key(self, uid: PodUID) -> tuple[int, ...]:
        """The pod's tier sums, dominant tier first; ``KeyError`` for a pod not ranked."""
        return self.keys[self._position[uid]]

    def breakdown(self, uid: PodUID) -> tuple[Contribution, ...]:
        """Every strategy's part in the pod's cost, in policy order; ``KeyError`` if not ranked."""
        index = self._position[uid]
        normalized = self.normalized
        return tuple(
            Contribution(
                strategy=bound.name,
                tier=bound.spec.tier,
                weight=bound.weight,
                raw=self.raw[bound.name][index],
                normalized=normalized[bound.name][index],
            )
            for bound in self.policy.bound
            if bound.name in normalized
        )

    def flat(self) -> list[PodUID]:
        """The order as one list, ties in uid order: a scale-in by *k* deletes the first *k*."""
        return [uid for group in self.order for uid in group]


def answers_needed(policy: Policy) -> tuple[str, ...]:
    """The strategies whose ranker answers ``combine`` uses: all but the spread strategies."""
    return policy.ranked


def rank(snapshot: Snapshot, policy: Policy = DEFAULT_POLICY) -> Combined:
    """Run every strategy of ``policy`` on ``snapshot`` and combine: the single-process path."""
    answers = {
        bound.name: bound.strategy.score(snapshot, bound.args)
        for bound in policy.bound
        if not bound.strategy.spread
    }
    return combine(snapshot, policy, answers)


def combine(
    snapshot: Snapshot, policy: Policy, scores_by_strategy: Mapping[str, Scores]
) -> Combined:
    """Combine raw scores by strategy name into the deletion order (module docstring)."""
    pods = active_pods(snapshot)
    uids = [pod.uid for pod in pods]
    if len(set(uids)) != len(uids):  # a malformed snapshot; rank each uid once
        first = {uid: index for index, uid in reversed(list(enumerate(uids)))}
        pods = [pod for index, pod in enumerate(pods) if first[pod.uid] == index]
        uids = [pod.uid for pod in pods]
    state = _State(policy, len(uids))
    missing: list[str] = []
    for bound in policy.bound:
        if bound.strategy.spread:
            continue
        answer = scores_by_strategy.get(bound.name)
        if answer is None:
            missing.append(bound.name)
        else:
            state.add(bound, _aligned(bound.name, answer, uids))

    spreads = [bound for bound in policy.bound if bound.strategy.spread]
    classes = _controller_classes(pods) if spreads else None
    # Least dominant first: a more dominant spread then orders its domains with these points.
    for bound in sorted(spreads, key=lambda bound: -bound.tier_index):
        domains = bound.strategy.domains
        assert domains is not None  # spread means domains is set
        order = _deletion_order(state.packed, classes, pods)
        levels = spread_levels(order, _domains(domains(snapshot, bound.args), uids))
        state.add(bound, [float(-level) for level in levels])

    in_policy = {bound.name for bound in policy.bound if not bound.strategy.spread}
    excluded: tuple[PodUID, ...] = ()
    if len(pods) < len(snapshot.pods):
        ranked = set(uids)
        excluded = tuple(pod.uid for pod in snapshot.pods if pod.uid not in ranked)
    combined = Combined(
        policy=policy,
        version=snapshot.version,
        uids=tuple(uids),
        order=_groups(state.packed, uids),
        packed=state.packed,
        raw=state.raw,
        plugin_normalized=state.plugin_normalized,
        missing=tuple(missing),
        ignored=tuple(sorted(name for name in scores_by_strategy if name not in in_policy)),
        excluded=excluded,
    )
    # The normalized scores computed on the way, handed to the cached property (what it would
    # compute from ``raw``, in its order): the aggregator explains every pod of every order it
    # decides, and normalizing again was a tenth of its decision. A copy made with
    # ``dataclasses.replace`` computes its own.
    normalized = dict(state.plugin_normalized)
    for bound in policy.bound:
        if bound.name in state.raw and bound.name not in normalized:
            normalized[bound.name] = state.normalized[bound.name]
    combined.__dict__["normalized"] = normalized
    return combined


class _State:
    """The packed tier sums while ``combine`` adds strategies, and what it keeps to explain them."""

    def __init__(self, policy: Policy, size: int) -> None:
        self.places = _places(policy.tier_spans)
        self.packed: list[int] = [0] * size
        self.raw: dict[str, Sequence[float]] = {}
        self.plugin_normalized: dict[str, Sequence[int]] = {}
        self.normalized: dict[str, Sequence[int]] = {}
        """The strategies' normalized scores, but those of ``plugin_normalized``."""

    def add(self, bound: BoundStrategy, raw: list[float]) -> None:
        """Normalize one strategy's raw scores and add its weighted points to its tier's digit."""
        self.raw[bound.name] = raw
        step = bound.weight * self.places[bound.tier_index]
        if bound.strategy.normalize is not None:
            normalized = _plugin_normalized(bound, raw)
            self.plugin_normalized[bound.name] = normalized
            pairs = zip(self.packed, normalized, strict=True)
            self.packed = [total + step * value for total, value in pairs]
            return
        try:
            scaled = scale(raw, bound.spec.threshold)
        except (TypeError, ValueError):
            bad = next((value for value in raw if not _finite(value)), None)
            reason = f"raw score {bad!r} is not a finite number"
            raise ScoreContractError(bound.name, reason) from None
        if scaled is None:  # every pod normalizes to 0: nothing to add
            self.normalized[bound.name] = [MIN_SCORE] * len(raw)
            return
        # normalize(), from the same scaling: floor((v - low) * factor + 0.5).
        values, low, factor = scaled
        floor = math.floor
        normalized = [floor((value - low) * factor + 0.5) for value in values]
        self.normalized[bound.name] = normalized
        totals = zip(self.packed, normalized, strict=True)
        self.packed = [total + step * value for total, value in totals]


@lru_cache(maxsize=256)
def _places(spans: tuple[int, ...]) -> tuple[int, ...]:
    """Per tier: what one point there adds to a packed key, the product of the later spans."""
    return tuple(math.prod(spans[tier + 1 :]) for tier in range(len(spans)))


def _aligned(name: str, answer: Scores, uids: list[PodUID]) -> list[float]:
    """The answer's raw scores in ``uids`` order; a pod without a score breaks the contract."""
    # Strategies build their dicts in snapshot order: then the values are already aligned.
    if isinstance(answer, dict) and len(answer) == len(uids) and list(answer) == uids:
        return list(answer.values())
    try:
        return [answer[uid] for uid in uids]
    except KeyError as error:
        raise ScoreContractError(name, f"no score for pod {error.args[0]!r}") from None


def _domains(domain_of: Mapping[PodUID, Hashable], uids: list[PodUID]) -> list[Hashable]:
    """A spread strategy's domains in ``uids`` order; a pod it leaves out has domain ``None``."""
    if isinstance(domain_of, dict) and len(domain_of) == len(uids) and list(domain_of) == uids:
        return list(domain_of.values())
    return [domain_of.get(uid) for uid in uids]


def _controller_classes(pods: Sequence[Pod]) -> list[int] | None:
    """Each pod's :func:`controller_class`, or ``None`` when they all share one."""
    running = Phase.RUNNING
    for pod in pods:
        if not (pod.ready and pod.node is not None and pod.phase is running):
            break
    else:
        return None  # the usual case: one class (scheduled, running, ready) for all
    classes = [controller_class(pod) for pod in pods]
    return classes if min(classes) != max(classes) else None


def _deletion_order(packed: list[int], classes: list[int] | None, pods: Sequence[Pod]) -> list[int]:
    """Pod indices in the order a spread strategy levels them, first to go first.

    By :func:`controller_class` first (``classes``, ``None`` when all pods share one): the
    controller deletes unscheduled, pending and not-ready pods before it reads any cost, so they
    are the first of their domain to go whatever podcost says, and levels that assumed otherwise
    would let the skew grow. Then by the tier sums, dominant tier first; pods still tied by the
    rest of :func:`controller_order_key`.
    """
    if classes is not None:
        span = max(packed) + 1
        packed = [cls * span + key for cls, key in zip(classes, packed, strict=True)]
    order = sorted(range(len(packed)), key=packed.__getitem__)
    if len(set(packed)) == len(packed):
        return order
    # Only runs of tied pods need the controller's full key (what costs here).
    start, size = 0, len(order)
    while start < size:
        key, end = packed[order[start]], start + 1
        while end < size and packed[order[end]] == key:
            end += 1
        if end - start > 1:
            order[start:end] = sorted(
                order[start:end], key=lambda index: controller_order_key(pods[index])
            )
        start = end
    return order


def _groups(packed: list[int], uids: list[PodUID]) -> tuple[tuple[PodUID, ...], ...]:
    """The pods in ascending packed key, tied pods grouped and listed by uid."""
    indices = sorted(range(len(uids)), key=packed.__getitem__)
    if len(set(packed)) == len(packed):
        return tuple([(uids[index],) for index in indices])
    groups: list[list[PodUID]] = []
    previous = -1  # packed keys are >= 0
    for index in indices:
        key = packed[index]
        if key == previous:
            groups[-1].append(uids[index])
        else:
            groups.append([uids[index]])
            previous = key
    return tuple([tuple(group if len(group) == 1 else sorted(group)) for group in groups])


def _plugin_normalized(bound: BoundStrategy, raw: list[float]) -> list[int]:
    own = bound.strategy.normalize
    assert own is not None
    normalized = list(own(raw, bound.spec.threshold))
    if len(normalized) != len(raw) or not in_range(normalized):
        raise ScoreContractError(
            bound.name, "its normalization must give one int in [0, 100] per pod"
        )
    return normalized


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
