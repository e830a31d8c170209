"""Deletion-cost labels with the fewest writes: turns a combined order into int32 costs.

The aggregator calls ``label_costs`` with the combiner's order and the costs now on the pods;
``podcost simulate`` calls it to show what podcost would write. ``dense_costs`` is the naive
baseline the benchmark (``tests/bench/bench_labels.py``) compares against.

Every changed cost is one API write, so ``label_costs`` keeps as many current costs as it can.
Only the relative order inside one ReplicaSet reaches the controller, so each ReplicaSet is
labelled on its own. Inside one, with its groups numbered ``0..k-1`` (ascending, first deleted
first; pods of one group may share a cost or differ, pods of different groups must be strictly
increasing), a set of pods can keep their values exactly when, sorted by (group, value), their
``value - group`` never decreases: that leaves ``j - i - 1`` free integers between a kept pod
of group ``i`` and one of group ``j``, one for each group between them, while a group holding a
kept pod lends its value to the group's other pods. With the band ``[low, high]`` as sentinels
that is a longest non-decreasing subsequence of ``value - group`` restricted to
``[low, high + 1 - k]``: O(n log n), and n minus its length writes, which is the minimum (the
unit tests check it against brute force). The others get values in the middle of their gaps
(or at a fixed step beyond the first or last kept cost), so later insertions find room; running
out of gaps only costs more writes, never failure.

A pod without the annotation already has a cost: the controller reads it as 0
(``GetDeletionCostFromPodAnnotations``), so ``current_costs`` says 0 and labelling may keep it
like any other cost. A workload whose pods all tie writes nothing, and a first labelling
anchors one group at 0 (the largest, the last of equal ones) and writes only the others,
``EDGE_STEP`` apart around it. An invalid value also reads as 0 but is replaced whatever the order.

Costs podcost writes stay inside ``DEFAULT_BAND`` (±1e9), or ``NON_NEGATIVE_BAND`` when the
policy sets ``non_negative_costs`` (for Karpenter), leaving the rest of int32 to people:
a pod set by hand beyond the band is deleted first or last whatever podcost ranks. Costs owned
by someone else are never rewritten (unless ``overwrite_foreign``); inside the band they are
constraints the others are fitted around, as many as can be satisfied together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

from podcost_core.model import CostOwner, Pod, PodUID
from podcost_core.victims import deletion_cost_error

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class CostBand:
    """The values podcost writes: ``low <= cost <= high``."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not INT32_MIN <= self.low <= self.high <= INT32_MAX:
            raise ValueError(f"band [{self.low}, {self.high}] is not an int32 interval")

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high


#: ±1e9: well inside int32, so a person can still force a pod first or last by hand.
DEFAULT_BAND = CostBand(-1_000_000_000, 1_000_000_000)

#: [0, 2^27 - 1]: the band of the policy option ``non_negative_costs``, for clusters that run
#: Karpenter. Karpenter adds ``cost / 2^27`` to a pod's eviction cost of 1.0 (``EvictionCost`` in
#: kubernetes-sigs/karpenter pkg/utils/disruption/disruption.go; the sum over a node's pods is
#: its disruption cost, lowest consolidated first). A negative cost would make a pod look cheaper
#: to disrupt than a pod without the annotation (down to 1 - 7.45 with ``DEFAULT_BAND``), so
#: Karpenter would prefer to consolidate the nodes podcost happened to rank first. Inside this
#: band every pod counts as 1.0 + [0, 1): never below an unannotated pod, never as much as two.
#: Costs below 0 or from 2^27 up stay free for people to force a pod first or last by hand.
NON_NEGATIVE_BAND = CostBand(0, 2**27 - 1)


def band_for(non_negative_costs: bool, default: CostBand = DEFAULT_BAND) -> CostBand:
    """The band a policy's costs are written in: ``NON_NEGATIVE_BAND`` when it asks for
    ``non_negative_costs``, else ``default``."""
    return NON_NEGATIVE_BAND if non_negative_costs else default


@dataclass(frozen=True, slots=True)
class CurrentCost:
    """The cost now on a pod as far as labelling cares."""

    value: int | None = None
    """What the controller reads (0 for a pod without the annotation), ``None`` when podcost
    must write one anyway (an invalid value, whoever set it, or one of ours it would not write
    that way)."""
    foreign: bool = False
    """Set by someone else: kept as it is unless ``overwrite_foreign``."""


#: The cost of a pod missing from the current costs (podcost writes one), and of a pod without
#: the annotation (read as 0): shared, not built for every lookup (they are frozen).
_NO_COST = CurrentCost()
_ZERO_COST = CurrentCost(0)


@dataclass(frozen=True, slots=True)
class Labelling:
    """The costs that realise an order, and what has to be written for them."""

    costs: Mapping[PodUID, int]
    """The cost of every pod of the order once the writes are done."""
    writes: Mapping[PodUID, int]
    """Only the pods whose annotation changes, with their new cost."""
    conflicts: tuple[PodUID, ...] = ()
    """Foreign pods inside the band whose fixed cost contradicts the order (not rewritten)."""


def current_costs(pods: Iterable[Pod]) -> dict[PodUID, CurrentCost]:
    """``CurrentCost`` per pod from what the converter read off the pods."""
    result: dict[PodUID, CurrentCost] = {}
    for pod in pods:
        raw = pod.deletion_cost_raw
        value = pod.deletion_cost
        if raw is None:
            # No annotation reads as 0: a cost like any other, kept when 0 is where it belongs.
            result[pod.uid] = _ZERO_COST
        elif raw == str(value) and INT32_MIN <= value <= INT32_MAX:
            # The usual case, without parsing: a value written as ``str`` writes an int32 is
            # valid (what ``deletion_cost_error`` would say), and it is the one read.
            result[pod.uid] = CurrentCost(value, foreign=pod.cost_owner is CostOwner.OTHER)
        elif deletion_cost_error(raw) is not None:
            # An invalid value (the controller reads 0 too), whoever set it: no cost to keep,
            # so podcost writes one.
            result[pod.uid] = _NO_COST
        elif pod.cost_owner is CostOwner.OTHER:
            result[pod.uid] = CurrentCost(value, foreign=True)
        else:
            result[pod.uid] = _NO_COST  # our own, valid but not as we write it: rewrite
    return result


def _check_order(order: Sequence[Sequence[PodUID]]) -> None:
    seen: set[PodUID] = set()
    for group in order:
        for uid in group:
            if uid in seen:
                raise ValueError(f"pod {uid} appears twice in the order")
            seen.add(uid)


def _by_replicaset(
    order: Sequence[Sequence[PodUID]], replicaset_of: Mapping[PodUID, str | None]
) -> dict[str | None, list[list[PodUID]]]:
    """The order restricted to each ReplicaSet, empty groups dropped."""
    result: dict[str | None, list[list[PodUID]]] = {}
    for group in order:
        if len(group) == 1:  # most groups: no split needed
            result.setdefault(replicaset_of.get(group[0]), []).append(list(group))
            continue
        parts: dict[str | None, list[PodUID]] = {}
        for uid in group:
            parts.setdefault(replicaset_of.get(uid), []).append(uid)
        for replicaset, part in parts.items():
            result.setdefault(replicaset, []).append(part)
    return result


def _heaviest_chain(keys: list[int], weights: list[int]) -> set[int]:
    """The items of a heaviest non-decreasing subsequence of ``keys`` (``weights`` aligned), by
    index: of equally heavy ones, the one ending latest.

    A Fenwick tree over the distinct keys keeps (best weight, item) prefix maxima, inlined in two
    parallel lists: this runs for every decision."""
    distinct = sorted(set(keys))
    position = {key: rank + 1 for rank, key in enumerate(distinct)}
    size = len(distinct) + 1
    tree_best = [0] * size
    tree_item = [-1] * size
    previous: list[int] = []
    scores: list[int] = []
    for item, key in enumerate(keys):
        spot = position[key]
        best, before = 0, -1
        while spot > 0:  # the best chain ending at a key <= this one
            if tree_best[spot] > best:
                best, before = tree_best[spot], tree_item[spot]
            spot -= spot & -spot
        best += weights[item]
        scores.append(best)
        previous.append(before)
        spot = position[key]
        while spot < size:
            if best > tree_best[spot]:
                tree_best[spot], tree_item[spot] = best, item
            spot += spot & -spot
    kept: set[int] = set()
    item = max(range(len(keys)), key=lambda i: (scores[i], i), default=-1)
    while item >= 0:
        kept.add(item)
        item = previous[item]
    return kept


#: The step between new values placed beyond the first or last kept cost. Moving pods to the
#: front or back is common (a node turns spot, a node is cordoned); halving the end gap each time
#: would exhaust it after ~30 moves, fixed steps last ~1000 before halving takes over.
EDGE_STEP = 2**20


def _edge(anchor: int, free: int, count: int, *, before: bool) -> list[int]:
    """``count`` increasing values next to ``anchor`` on one side, in a gap of ``free`` integers
    (``free >= count``), ``EDGE_STEP`` apart when there is room."""
    step = max(1, min(EDGE_STEP, free // (count + 1)))
    if before:
        return [anchor - step * (count - index) for index in range(count)]
    return [anchor + step * (index + 1) for index in range(count)]


def _spread(low: int, high: int, count: int) -> list[int]:
    """``count`` strictly increasing integers strictly between ``low`` and ``high``: the middles
    of ``count`` equal slices of the gap, so each keeps room on both sides (the caller
    guarantees ``high - low > count``)."""
    width = high - low - 1
    return [low + 1 + (2 * step + 1) * width // (2 * count) for step in range(count)]


def _label_replicaset(
    groups: list[list[PodUID]],
    current: Mapping[PodUID, CurrentCost],
    overwrite_foreign: bool,
    band: CostBand,
) -> tuple[dict[PodUID, int], list[PodUID]]:
    size = len(groups)
    if size > band.high - band.low + 1:
        raise ValueError(f"{size} groups do not fit in the band [{band.low}, {band.high}]")
    weight_foreign = sum(len(group) for group in groups) + 1
    low, high = band.low, band.high
    top = high + 1 - size
    candidates: list[tuple[int, int, PodUID, int]] = []  # (group, value, uid, weight)
    pinned: list[PodUID] = []  # the pods whose cost podcost must leave as it is, in order
    for index, group in enumerate(groups):
        for uid in group:
            cost = current.get(uid, _NO_COST)
            value = cost.value
            if value is None:
                continue
            foreign = cost.foreign and not overwrite_foreign  # _fixed, inlined
            if foreign:
                pinned.append(uid)
            if low <= value <= high and low <= value - index <= top:
                candidates.append((index, value, uid, weight_foreign if foreign else 1))
    candidates.sort(key=itemgetter(0, 1))

    # Weighted longest non-decreasing subsequence of value - group; foreign pods weigh more
    # than all podcost pods together, so the fewest foreign constraints are given up first.
    # Of equally good choices, the one ending latest in the order: a first costing then keeps
    # the last of equal groups at 0 and writes the others below it, first deleted lowest, so
    # writing them first-deleted first makes small scale-ins right early (``urgency``).
    kept = _heaviest_chain(
        [value - index for index, value, _, _ in candidates],
        [weight for _, _, _, weight in candidates],
    )

    anchors: dict[int, list[int]] = {}  # group -> kept values, ascending (as the candidates)
    costs: dict[PodUID, int] = {}
    for item, (index, value, uid, _) in enumerate(candidates):
        if item in kept:
            anchors.setdefault(index, []).append(value)
            costs[uid] = value
    conflicts = [uid for uid in pinned if uid not in costs]

    # Groups without a kept pod get fresh values, evenly spread in the gap they sit in.
    lower = band.low - 1
    pending: list[int] = []
    for index in range(size + 1):
        if index < size and index not in anchors:
            pending.append(index)
            continue
        upper = anchors[index][0] if index < size else band.high + 1
        if pending:
            free = upper - lower - 1
            if not anchors:
                # A first labelling takes the middle half of the band: the quarters beyond are
                # room for pods moved to the front or the back later, EDGE_STEP apart.
                quarter = (upper - lower) // 4
                if free - 2 * quarter < len(pending):
                    quarter = 0  # a band too narrow for that
                values = _spread(lower + quarter, upper - quarter, len(pending))
            elif lower < band.low:
                values = _edge(upper, free, len(pending), before=True)
            elif upper > band.high:
                values = _edge(lower, free, len(pending), before=False)
            else:
                values = _spread(lower, upper, len(pending))
            for gap_index, value in zip(pending, values, strict=True):
                for uid in groups[gap_index]:
                    costs.setdefault(uid, value)
            pending = []
        if index < size:
            for uid in groups[index]:
                costs.setdefault(uid, upper)
            lower = anchors[index][-1]

    for uid in conflicts:
        fixed = current[uid].value
        if fixed is not None:
            costs[uid] = fixed  # never rewritten, whatever the order wanted
    return costs, conflicts


def _fixed(cost: CurrentCost, overwrite_foreign: bool) -> bool:
    """Whether podcost must leave this cost as it is."""
    return cost.foreign and cost.value is not None and not overwrite_foreign


def label_costs(
    order: Sequence[Sequence[PodUID]],
    replicaset_of: Mapping[PodUID, str | None],
    current: Mapping[PodUID, CurrentCost],
    *,
    overwrite_foreign: bool = False,
    band: CostBand = DEFAULT_BAND,
) -> Labelling:
    """Costs realising ``order`` inside every ReplicaSet with the fewest changed pods.

    ``order`` is the combiner's ascending order of groups of pod UIDs, ``replicaset_of`` each
    pod's ReplicaSet, ``current`` the costs on the pods now (a pod missing from it gets a
    cost written; ``current_costs`` reads a pod without the annotation as 0, which may stay).
    """
    costs: dict[PodUID, int] = {}
    # A foreign value outside the band is a person's override (force first or last): kept,
    # and left out of the fitting, so its group claims no slot. (The same pass checks the
    # order, as ``_check_order``.)
    seen: set[PodUID] = set()
    for group in order:
        for uid in group:
            if uid in seen:
                raise ValueError(f"pod {uid} appears twice in the order")
            seen.add(uid)
            cost = current.get(uid, _NO_COST)
            value = cost.value
            if (
                cost.foreign
                and not overwrite_foreign
                and value is not None
                and not band.low <= value <= band.high
            ):
                costs[uid] = value
    fitted = [[uid for uid in group if uid not in costs] for group in order] if costs else order
    conflicts: list[PodUID] = []
    for groups in _by_replicaset(fitted, replicaset_of).values():
        labelled, clashing = _label_replicaset(groups, current, overwrite_foreign, band)
        costs.update(labelled)
        conflicts.extend(clashing)
    return Labelling(costs, _writes(costs, current, overwrite_foreign), tuple(conflicts))


def dense_costs(
    order: Sequence[Sequence[PodUID]],
    replicaset_of: Mapping[PodUID, str | None],
    current: Mapping[PodUID, CurrentCost],
    *,
    overwrite_foreign: bool = False,
    band: CostBand = DEFAULT_BAND,
) -> Labelling:
    """The naive baseline: the position of each pod's group in the whole order is its cost.

    ``replicaset_of`` is unused (the baseline does not exploit ReplicaSets) and kept for a
    signature interchangeable with ``label_costs``. Foreign costs are left alone, unfitted.
    """
    del replicaset_of
    _check_order(order)
    if len(order) > band.high - band.low + 1:
        raise ValueError(f"{len(order)} groups do not fit in the band [{band.low}, {band.high}]")
    costs: dict[PodUID, int] = {}
    for index, group in enumerate(order):
        for uid in group:
            cost = current.get(uid, _NO_COST)
            fixed = _fixed(cost, overwrite_foreign) and cost.value is not None
            costs[uid] = cost.value if fixed and cost.value is not None else band.low + index
    return Labelling(costs, _writes(costs, current, overwrite_foreign))


def _writes(
    costs: Mapping[PodUID, int], current: Mapping[PodUID, CurrentCost], overwrite_foreign: bool
) -> dict[PodUID, int]:
    writes: dict[PodUID, int] = {}
    for uid, value in costs.items():
        cost = current.get(uid, _NO_COST)
        if cost.value != value and not _fixed(cost, overwrite_foreign):
            writes[uid] = value
    return writes
