"""A faithful model of the ReplicaSet controller's victim selection, as of Kubernetes v1.36.

Answers "if this ReplicaSet scales in by ``diff``, which pods go?" exactly as
kube-controller-manager does. ``podcost simulate`` (``podcost_core.simulate``) calls it, the cost
labelling tests use it to prove that written costs produce the intended order, and the
differential tests hold it against the real controller. Pure: pods in, pods out.

What it models, and where it is in the Kubernetes v1.36 source:

- ``pkg/controller/replicaset/replica_set.go``: ``manageReplicas`` deletes at most
  ``BurstReplicas`` (500) pods per sync; ``getPodsToDelete`` sorts only when it keeps some pods;
  ``getPodsRankedByRelatedPodsOnSameNode`` ranks each pod by the number of *active* (not ready)
  related pods on its node, the pod itself included, unscheduled pods all sharing the node "";
  ``getIndirectlyRelatedPods`` takes the related pods from every ReplicaSet with the same
  controlling owner, so a ReplicaSet without one has no related pods and every rank is 0.
- ``pkg/controller/controller_utils.go``: ``ActivePodsWithRanks.Less`` (the 8 rules),
  ``logarithmicRankDiff``, ``podReadyTime``, ``maxContainerRestarts`` /
  ``compareMaxContainerRestarts`` (sidecars only break ties of regular containers),
  ``afterOrZero``, ``IsPodActive``.
- ``pkg/apis/core/helper/helpers.go``: ``GetDeletionCostFromPodAnnotations``.

``sort.Sort`` is not stable and ``Less`` is not even a strict weak order (the UID tie-break of
LogarithmicScaleDown only applies to *different* times in the same bucket, equal times fall
through to later rules, which makes cycles possible). So the model returns, beside one valid
order, the ordered classes of pods that every comparison sort must keep in that order; a
differential test can then demand exactness wherever Kubernetes is deterministic
(``VictimChoice.admits``). The controller's ``Now`` is its wall clock at sort time, which a test
only knows to within an interval: pass a ``NowWindow`` and every comparison that could go
either way inside it is treated as a tie.
"""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from podcost_core.model import Phase, Pod, PodUID, Snapshot

#: ``BurstReplicas`` in replica_set.go: the most pods one sync creates or deletes.
BURST_REPLICAS = 500

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

_NS_PER_SECOND = 1_000_000_000

# ``podPhaseToOrdinal``; a phase missing from the Go map reads as its zero value, 0.
_PHASE_ORDINAL = {Phase.PENDING: 0, Phase.UNKNOWN: 1, Phase.RUNNING: 2}

_DIGITS = re.compile(r"-?[0-9]+")


# --- rule 4: the deletion-cost annotation ---------------------------------------------------


def deletion_cost_error(value: str) -> str | None:
    """Why the API server would reject ``value`` as a deletion cost, or ``None`` if valid.

    ``GetDeletionCostFromPodAnnotations``: the first character must be ``-``, a digit 1-9, or the
    whole value ``0`` (so ``+1`` and ``007`` are invalid but ``-007`` is valid), then
    ``strconv.ParseInt(value, 10, 32)`` must succeed: ASCII digits after an optional sign, within
    int32.
    """
    if not value:
        return "empty"
    first = value[0]
    if not (first == "-" or value == "0" or "1" <= first <= "9"):
        return f"invalid value {value!r}"
    # fullmatch on an ASCII class, not int(): int() also takes spaces, "_" and non-ASCII digits.
    if not _DIGITS.fullmatch(value):
        return f"invalid syntax {value!r}"
    if not INT32_MIN <= _int_of_digits(value) <= INT32_MAX:
        return f"value out of int32 range {value!r}"
    return None


def _int_of_digits(value: str) -> int:
    """``value`` (``-?[0-9]+``) as an int, or one past the int32 range when it has more digits
    than any int32. Bounded before ``int()``, which refuses more than 4300 digits with a
    ``ValueError``; leading zeros, which ``ParseInt`` accepts (``-007``), do not count."""
    magnitude = value.removeprefix("-").lstrip("0")
    if len(magnitude) > len(str(INT32_MAX)):
        return INT32_MAX + 1
    number = int(magnitude or "0")
    return -number if value.startswith("-") else number


def parse_deletion_cost(value: str | None) -> int:
    """The cost the controller reads from the annotation value: 0 when absent or invalid."""
    if value is None or deletion_cost_error(value) is not None:
        return 0
    return _int_of_digits(value)


# --- LogarithmicScaleDown -------------------------------------------------------------------


def _bits(pattern: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", pattern))[0])


# The constants of Go's math.Log (src/math/log_amd64.s), by bit pattern so nothing is rounded.
_LN2_HI = _bits(0x3FE62E42FEE00000)
_LN2_LO = _bits(0x3DEA39EF35793C76)
_L1 = _bits(0x3FE5555555555593)
_L2 = _bits(0x3FD999999997FA04)
_L3 = _bits(0x3FD2492494229359)
_L4 = _bits(0x3FCC71C51D8E78AF)
_L5 = _bits(0x3FC7466496CB03DE)
_L6 = _bits(0x3FC39A09D078C69F)
_L7 = _bits(0x3FC2F112DF3E5244)
_HALF_SQRT2 = 7.07106781186547524401e-01
_INV_LN2 = 1 / math.log(2)  # Go's constant expression 1/Ln2, rounded once to float64


def _go_log(x: float) -> float:
    """Go's ``math.Log`` on amd64 for a positive normal ``x``, operation for operation.

    Python evaluates each ``+ - * /`` as one IEEE double operation without fused multiply-add,
    like the SSE2 code, so the result is bit-identical. libm's ``log`` may differ in the last
    bit, which can move a bucket boundary by a few nanoseconds.
    """
    f1, ki = math.frexp(x)
    k = float(ki)
    # The assembly compares with CMPNLT, i.e. f1 <= Sqrt2/2 (log.go says <; amd64 runs the .s).
    if f1 <= _HALF_SQRT2:
        k -= 1.0
        f1 *= 2.0
    f = f1 - 1.0
    s = f / (2.0 + f)
    s2 = s * s
    s4 = s2 * s2
    t1 = s2 * (_L1 + s4 * (_L3 + s4 * (_L5 + s4 * _L7)))
    t2 = s4 * (_L2 + s4 * (_L4 + s4 * _L6))
    r = t1 + t2
    hfsq = 0.5 * f * f
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


def go_log2(x: float) -> float:
    """Go's ``math.Log2`` (src/math/log10.go) for a positive finite ``x``."""
    frac, exp = math.frexp(x)
    if frac == 0.5:  # exact powers of two give exact answers
        return float(exp - 1)
    return _go_log(frac) * _INV_LN2 + float(exp)


@functools.lru_cache(maxsize=1 << 16)
def log_rank(age_ns: int) -> int:
    """The bucket ``logarithmicRankDiff`` gives an age: ``int64(math.Log2(float64(d)))``, or -1
    when ``d <= 0``. Ages are ``time.Duration``s: nanoseconds."""
    if age_ns <= 0:
        return -1
    # float(int) rounds to nearest-even like Go's int64->float64 conversion.
    return math.trunc(go_log2(float(age_ns)))


def _first_age_with_rank(rank: int, low: int, high: int) -> int:
    """The smallest age in ``(low, high]`` whose ``log_rank`` is at least ``rank`` (it exists)."""
    while high - low > 1:
        middle = (low + high) // 2
        if log_rank(middle) >= rank:
            high = middle
        else:
            low = middle
    return high


def to_ns(seconds: float) -> int:
    """POSIX seconds to integer nanoseconds, exact for whole seconds."""
    whole = math.floor(seconds)
    return whole * _NS_PER_SECOND + round((seconds - whole) * _NS_PER_SECOND)


@dataclass(frozen=True, slots=True)
class NowWindow:
    """The controller's clock at sort time is somewhere in ``[earliest, latest]`` (POSIX s)."""

    earliest: float
    latest: float

    def __post_init__(self) -> None:
        if self.latest < self.earliest:
            raise ValueError(f"empty window: latest {self.latest} < earliest {self.earliest}")


#: What ``now`` may be: a point in time, a window, or ``None`` for a zero ``Now`` (then
#: LogarithmicScaleDown falls back to plain ``afterOrZero`` comparisons).
Now = float | NowWindow | None


# --- the comparison -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankedPod:
    """A pod with its co-location rank, as ``ActivePodsWithRanks`` pairs ``Pods[i]``/``Rank[i]``."""

    pod: Pod
    rank: int


@dataclass(frozen=True, slots=True)
class _View:
    """The fields ``Less`` reads, precomputed once per pod."""

    pod: Pod
    uid: str
    node: str
    phase: int
    ready: bool
    cost: int
    rank: int
    ready_ns: int | None  # podReadyTime; None is Go's zero time
    restarts: int
    sidecar_restarts: int
    created_ns: int | None
    rank_low: int = 0
    """The lowest rank the pod may have when the controller sorts (``rank`` when certain)."""


def _view(ranked: RankedPod) -> _View:
    pod = ranked.pod
    return _View(
        pod=pod,
        uid=pod.uid,
        node=pod.node or "",
        phase=_PHASE_ORDINAL.get(pod.phase, 0),
        ready=pod.ready,
        cost=pod.deletion_cost,
        rank=ranked.rank,
        ready_ns=to_ns(pod.ready_since) if pod.ready and pod.ready_since is not None else None,
        restarts=pod.restarts,
        sidecar_restarts=pod.sidecar_restarts,
        created_ns=to_ns(pod.created) if pod.created is not None else None,
        rank_low=ranked.rank,
    )


def _after_or_zero(t1: int | None, t2: int | None) -> bool:
    """``afterOrZero``: a zero time counts as after any other."""
    if t1 is None or t2 is None:
        return t1 is None
    return t1 > t2


def _time_less(a: _View, b: _View, t1: int | None, t2: int | None, now_ns: int | None) -> bool:
    """Rules 6 and 8 once the two times differ, with LogarithmicScaleDown (GA, locked on)."""
    if now_ns is None or t1 is None or t2 is None:
        return _after_or_zero(t1, t2)
    rank_diff = log_rank(now_ns - t1) - log_rank(now_ns - t2)
    if rank_diff == 0:
        return a.uid < b.uid  # Go compares strings bytewise; so does str for valid UTF-8
    return rank_diff < 0


def _less(a: _View, b: _View, now_ns: int | None, cost_enabled: bool) -> bool:
    # 1. Unassigned < assigned.
    if a.node != b.node and (not a.node or not b.node):
        return not a.node
    # 2. Pending < Unknown < Running.
    if a.phase != b.phase:
        return a.phase < b.phase
    # 3. Not ready < ready.
    if a.ready != b.ready:
        return not a.ready
    # 4. Lower pod-deletion-cost < higher (PodDeletionCost is beta, on by default).
    if cost_enabled and a.cost != b.cost:
        return a.cost < b.cost
    # 5. Doubled up < not doubled up: the higher co-location rank goes first.
    if a.rank != b.rank:
        return a.rank > b.rank
    # 6. Both ready: ready for a shorter time < longer, in log2 buckets.
    if a.ready and b.ready and a.ready_ns != b.ready_ns:
        return _time_less(a, b, a.ready_ns, b.ready_ns, now_ns)
    # 7. More restarts < fewer; sidecar restarts only break ties of regular containers.
    if a.restarts != b.restarts:
        return a.restarts > b.restarts
    if a.sidecar_restarts != b.sidecar_restarts:
        return a.sidecar_restarts > b.sidecar_restarts
    # 8. Newer < older, in log2 buckets.
    if a.created_ns != b.created_ns:
        return _time_less(a, b, a.created_ns, b.created_ns, now_ns)
    return False


def clockless_key(pod: Pod, rank: int, cost: int | None = None) -> tuple[int, int, int, int, int]:
    """Rules 1-5 of ``Less`` as a key, ascending = deleted first: assigned, phase, ready, the
    deletion cost (``cost``, else the pod's), the co-location ``rank``. Two pods whose keys
    differ are ordered by them whatever the controller's clock says and whichever sort it runs;
    with equal keys the clock (rules 6 and 8) and the restarts decide, which a decision made now
    cannot count on for later. ``podcost_core.implied`` relies on it to leave some costs to the
    controller."""
    return (
        1 if pod.node else 0,
        _PHASE_ORDINAL.get(pod.phase, 0),
        1 if pod.ready else 0,
        pod.deletion_cost if cost is None else cost,
        -rank,
    )


def _now_ns(now: float | None) -> int | None:
    return None if now is None else to_ns(now)


def less(a: RankedPod, b: RankedPod, now: float | None, *, cost_enabled: bool = True) -> bool:
    """``ActivePodsWithRanks.Less``: whether ``a`` is deleted before ``b`` at time ``now``."""
    return _less(_view(a), _view(b), _now_ns(now), cost_enabled)


def comparator(
    now: float | None, *, cost_enabled: bool = True
) -> Callable[[RankedPod, RankedPod], int]:
    """A three-way comparison built from ``less`` for ``functools.cmp_to_key``."""
    now_ns = _now_ns(now)

    def compare(a: RankedPod, b: RankedPod) -> int:
        va, vb = _view(a), _view(b)
        if _less(va, vb, now_ns, cost_enabled):
            return -1
        if _less(vb, va, now_ns, cost_enabled):
            return 1
        return 0

    return compare


def sort_key(now: float | None, *, cost_enabled: bool = True) -> Callable[[RankedPod], object]:
    """A ``key=`` for ``sorted``: first to be deleted first."""
    return functools.cmp_to_key(comparator(now, cost_enabled=cost_enabled))


# --- ranks ----------------------------------------------------------------------------------


def colocation_ranks(pods: Iterable[Pod], related_pods: Iterable[Pod]) -> dict[PodUID, int]:
    """``getPodsRankedByRelatedPodsOnSameNode``: per pod, the active related pods on its node.

    Counts *active* pods (``IsPodActive``), ready or not, the pod itself included when it is
    among ``related_pods``; unscheduled pods all count on the node "".
    """
    on_node: dict[str, int] = {}
    for related in related_pods:
        if related.active:
            on_node[related.node or ""] = on_node.get(related.node or "", 0) + 1
    return {pod.uid: on_node.get(pod.node or "", 0) for pod in pods}


def victim_inputs(snapshot: Snapshot, replicaset: str) -> tuple[list[Pod], list[Pod]]:
    """``(filteredPods, relatedPods)`` for one ReplicaSet of a snapshot, as ``syncReplicaSet``
    and ``getIndirectlyRelatedPods`` compute them.

    The related pods are every pod of the snapshot plus its bystanders when the ReplicaSet has a
    controlling owner, and none otherwise. Without ReplicaSet information in the snapshot, a
    Deployment's ReplicaSets are taken to be owned and a lone ReplicaSet not.
    """
    info = snapshot.replicasets.get(replicaset)
    if info is not None:
        owned = info.controller_uid is not None
    else:
        owned = snapshot.workload.kind == "Deployment"
    pods = [pod for pod in snapshot.pods if pod.replicaset == replicaset and pod.active]
    related = [*snapshot.pods, *snapshot.bystanders] if owned else []
    return pods, related


class ReplicaSetViews:
    """Per ReplicaSet of one snapshot, what the controller's victim selection reads: its
    filtered pods (:func:`victim_inputs`) and their :func:`colocation_ranks`, each computed on
    first use and kept. A decision reads them twice (``implied.drop_implied`` and
    ``urgency.first_wrong``): the aggregator passes both the same views."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self._views: dict[str, tuple[list[Pod], dict[PodUID, int]]] = {}

    @classmethod
    def of(cls, snapshot: Snapshot, views: ReplicaSetViews | None) -> ReplicaSetViews:
        """``views`` when they are ``snapshot``'s, else new views of ``snapshot`` (a decision
        copied with another snapshot does not read the first one's)."""
        if views is not None and views.snapshot is snapshot:
            return views
        return cls(snapshot)

    def __call__(self, replicaset: str) -> tuple[list[Pod], dict[PodUID, int]]:
        """The filtered pods of ``replicaset`` and their co-location ranks."""
        view = self._views.get(replicaset)
        if view is None:
            pods, related = victim_inputs(self.snapshot, replicaset)
            view = self._views[replicaset] = (pods, colocation_ranks(pods, related))
        return view


# --- the choice -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VictimChoice:
    """The pods one ``getPodsToDelete`` call deletes, and how certain that is."""

    victims: tuple[Pod, ...]
    """One outcome Kubernetes can produce, in sort order (the controller deletes them in
    parallel, so this is the order of preference, not of deletion)."""
    certain: tuple[Pod, ...]
    """Deleted in every outcome."""
    tied: tuple[Pod, ...]
    """The class at the cut: ``tie_picks`` of these are deleted, which ones is up to the sort."""
    tie_picks: int
    classes: tuple[tuple[Pod, ...], ...]
    """All candidates as ordered classes: every pod of a class is sorted before every pod of a
    later class in every outcome; inside a class any order can come out."""

    def admits(self, deleted: Iterable[PodUID | str]) -> bool:
        """Whether the real controller deleting exactly ``deleted`` agrees with the model."""
        chosen = set(deleted)
        certain = {pod.uid for pod in self.certain}
        drawn = chosen - certain
        return (
            certain <= chosen
            and drawn <= {pod.uid for pod in self.tied}
            and len(drawn) == self.tie_picks
        )


def _critical_nows(
    views: Sequence[_View], now: Now
) -> tuple[int | None, dict[str, tuple[int, ...]]]:
    """The reference ``now`` and, per pod, the instants inside the window where one of its
    buckets changes. Between such instants every comparison is constant."""
    if not isinstance(now, NowWindow):
        return _now_ns(now), {}
    low, high = to_ns(now.earliest), to_ns(now.latest)
    breaks: dict[str, tuple[int, ...]] = {}
    for view in views:
        instants: set[int] = set()
        for t in (view.ready_ns, view.created_ns):
            if t is None:
                continue
            age_low, age_high = low - t, high - t
            for rank in range(log_rank(age_low) + 1, log_rank(age_high) + 1):
                instants.add(t + _first_age_with_rank(rank, age_low, age_high))
        breaks[view.uid] = tuple(sorted(instants))
    return low, breaks


def _coarse_keys(
    views: Sequence[_View], ref_now: int | None, breaks: dict[str, tuple[int, ...]], cost: bool
) -> dict[str, tuple[int, ...]]:
    """A key per pod such that pods with different keys compare by key under every ``now``.

    Rules 1-5 are keys already. Below them: for ready pods the bucket of the ready time, for
    the others the restarts and then the bucket of the creation time; buckets whose ranges over
    the window overlap are merged into one cluster, so the key never claims more than is true.
    """

    def bucket_range(t: int | None, uid: str) -> tuple[int, int] | None:
        if t is None or ref_now is None:
            return None
        last = max((ref_now, *breaks.get(uid, ())))
        return log_rank(ref_now - t), log_rank(last - t)

    def clusters(ranges: dict[str, tuple[int, int]]) -> dict[str, int]:
        ordered = sorted(ranges.items(), key=lambda item: item[1])
        cluster_of: dict[str, int] = {}
        index, reach = -1, None
        for uid, (low, high) in ordered:
            if reach is None or low > reach:
                index += 1
                reach = high
            else:
                reach = max(reach, high)
            cluster_of[uid] = index
        return cluster_of

    ready_ranges: dict[str, tuple[int, int]] = {}
    created_ranges: dict[str, tuple[int, int]] = {}
    for view in views:
        if view.ready:
            found = bucket_range(view.ready_ns, view.uid)
            if found is not None:
                ready_ranges[view.uid] = found
        else:
            found = bucket_range(view.created_ns, view.uid)
            if found is not None:
                created_ranges[view.uid] = found
    ready_cluster = clusters(ready_ranges)
    created_cluster = clusters(created_ranges)
    # Rule 5 by clusters of the ranks a pod may have: a certain rank is a cluster of its own.
    rank_cluster = clusters({view.uid: (view.rank_low, view.rank) for view in views})

    keys: dict[str, tuple[int, ...]] = {}
    for view in views:
        head = (
            1 if view.node else 0,
            view.phase,
            1 if view.ready else 0,
            view.cost if cost else 0,
            -rank_cluster[view.uid],
        )
        if ref_now is None:
            tail: tuple[int, ...] = ()  # a zero Now: no buckets; leave it all to pairwise
        elif view.ready:
            # A zero ready time sorts first (afterOrZero); equal times may fall to rule 7.
            tail = (-1,) if view.ready_ns is None else (ready_cluster[view.uid],)
        else:
            created = -1 if view.created_ns is None else created_cluster[view.uid]
            tail = (-view.restarts, -view.sidecar_restarts, created)
        keys[view.uid] = (*head, *tail)
    return keys


def _ordered_classes(
    group: list[_View], ref_now: int | None, breaks: dict[str, tuple[int, ...]], cost: bool
) -> list[list[_View]]:
    """Sort one coarse group at ``ref_now`` and cut it where no later pod can ever precede an
    earlier one: the segments between cuts are the classes (the strongly connected components
    of "may come before"), which every comparison sort emits in this order."""
    if len(group) == 1:
        return [group]
    certain_ranks = all(view.rank_low == view.rank == group[0].rank for view in group)
    if certain_ranks and ref_now is not None and not any(breaks.get(v.uid) for v in group):
        # Fast path for the common big group: one bucket (no window, so a coarse cluster is one
        # bucket) and all the deciding times distinct, so the UID alone orders every pair.
        times = {view.ready_ns if view.ready else view.created_ns for view in group}
        if None not in times and len(times) == len(group):
            return [[view] for view in sorted(group, key=lambda view: view.uid)]

    def less_at(a: _View, b: _View, now_ns: int | None) -> bool:
        return _less(a, b, now_ns, cost)

    def compare(a: _View, b: _View) -> int:
        if less_at(a, b, ref_now):
            return -1
        return 1 if less_at(b, a, ref_now) else 0

    ordered = sorted(group, key=functools.cmp_to_key(compare))

    def may_precede_at_ranks(a: _View, b: _View) -> bool:
        if not less_at(b, a, ref_now):
            return True
        instants = (*breaks.get(a.uid, ()), *breaks.get(b.uid, ()))
        return any(not less_at(b, a, instant) for instant in instants)

    def may_precede(a: _View, b: _View) -> bool:
        """Whether ``a`` may be sorted before ``b``: ``b`` is not certainly less than ``a``,
        for any ``now`` in the window and any ranks the two may have."""
        if a.rank_low == a.rank and b.rank_low == b.rank:
            return may_precede_at_ranks(a, b)
        if a.rank > b.rank_low:
            return True  # rule 5 can put ``a`` first
        if max(a.rank_low, b.rank_low) <= min(a.rank, b.rank):
            # The ranks may be equal: rule 5 falls through to the later rules.
            rank = max(a.rank_low, b.rank_low)
            return may_precede_at_ranks(replace(a, rank=rank), replace(b, rank=rank))
        return False

    size = len(ordered)
    # earliest[j]: the first position i < j that ordered[j] may precede (j if none).
    earliest = list(range(size))
    for j in range(1, size):
        for i in range(j):
            if may_precede(ordered[j], ordered[i]):
                earliest[j] = i
                break
    result: list[list[_View]] = []
    end = size
    reach = size
    # Walk from the back: a cut before p is valid when no pod at p or later reaches before p.
    for p in range(size - 1, -1, -1):
        reach = min(reach, earliest[p])
        if reach >= p:
            result.append(ordered[p:end])
            end = p
    result.reverse()
    return result


def pods_to_delete(
    pods: Sequence[Pod],
    related_pods: Sequence[Pod],
    diff: int,
    now: Now,
    *,
    cost_enabled: bool = True,
    maybe_gone: Mapping[str, int] | None = None,
) -> VictimChoice:
    """``getPodsToDelete(filteredPods, relatedPods, diff)``: the ``diff`` pods one sync deletes.

    ``pods`` are the ReplicaSet's active pods (``filteredPods``), ``related_pods`` those of every
    ReplicaSet with the same owner (empty for a ReplicaSet without one), ``now`` the
    controller's clock (``metav1.Now()`` when it sorts). ``diff`` is not capped here: the
    controller caps it at ``BURST_REPLICAS`` before the call (see ``scale_in``).

    ``maybe_gone``: per node name ("" for unscheduled pods), how many of the related pods there
    may already be deleted when the controller sorts (another ReplicaSet of the same owner
    shrinking at the same time, mid-rollout): a pod's rank is then anywhere from its rank less
    that many up to its rank, and pods whose rule 5 could go either way count as tied.
    """
    if not 0 <= diff <= len(pods):
        raise ValueError(f"diff {diff} outside 0..{len(pods)}")
    inactive = [pod.name for pod in pods if not pod.active]
    if inactive:
        raise ValueError(f"only active pods can be chosen, not {', '.join(inactive)}")
    if len({pod.uid for pod in pods}) != len(pods):
        raise ValueError("pods must have distinct UIDs (the controller's tie-breaker)")
    if diff == len(pods):
        # No sort: the controller takes them all, in whatever order it holds them.
        everyone = tuple(pods)
        return VictimChoice(everyone, everyone, (), 0, (everyone,) if everyone else ())

    ranks = colocation_ranks(pods, related_pods)
    views = [_view(RankedPod(pod, ranks[pod.uid])) for pod in pods]
    if maybe_gone:
        views = [
            replace(view, rank_low=max(0, view.rank - maybe_gone.get(view.node, 0)))
            for view in views
        ]
    ref_now, breaks = _critical_nows(views, now)
    keys = _coarse_keys(views, ref_now, breaks, cost_enabled)
    groups: dict[tuple[int, ...], list[_View]] = {}
    for view in views:
        groups.setdefault(keys[view.uid], []).append(view)
    classes: list[tuple[Pod, ...]] = []
    for key in sorted(groups):
        for segment in _ordered_classes(groups[key], ref_now, breaks, cost_enabled):
            classes.append(tuple(view.pod for view in segment))

    order = [pod for members in classes for pod in members]
    certain: list[Pod] = []
    tied: tuple[Pod, ...] = ()
    for members in classes:
        if len(certain) + len(members) <= diff:
            certain.extend(members)
            if len(certain) == diff:
                break
        else:
            tied = members
            break
    return VictimChoice(
        victims=tuple(order[:diff]),
        certain=tuple(certain),
        tied=tied,
        tie_picks=diff - len(certain),
        classes=tuple(classes),
    )


def scale_in(
    pods: Sequence[Pod],
    related_pods: Sequence[Pod],
    replicas: int,
    now: Now,
    *,
    burst: int = BURST_REPLICAS,
    cost_enabled: bool = True,
    maybe_gone: Mapping[str, int] | None = None,
) -> tuple[VictimChoice, ...]:
    """The syncs of ``manageReplicas`` that bring ``pods`` down to ``replicas``, one choice each.

    Each sync deletes at most ``burst`` pods; the next one sorts the rest again with the
    deleted pods no longer active (their deletion timestamp is set), so ranks change. A later
    round assumes the earlier rounds deleted the model's ``victims``; a test that saw other tie
    picks should replay round by round.
    """
    if replicas < 0:
        raise ValueError(f"replicas {replicas} < 0")
    remaining = [pod for pod in pods if pod.active]
    related = list(related_pods)
    rounds: list[VictimChoice] = []
    while len(remaining) > replicas:
        diff = min(len(remaining) - replicas, burst)
        choice = pods_to_delete(
            remaining, related, diff, now, cost_enabled=cost_enabled, maybe_gone=maybe_gone
        )
        rounds.append(choice)
        gone = {pod.uid for pod in choice.victims}
        remaining = [pod for pod in remaining if pod.uid not in gone]
        related = [pod for pod in related if pod.uid not in gone]
    return tuple(rounds)
