"""Aggregation: the rankers' answers for one workload turned into one cost decision, purely.

The aggregator service (``podcost.aggregator``) keeps one :class:`WorkloadState` per workload key
and feeds it what it reads: the watcher's snapshots (:meth:`Aggregator.on_snapshot`), one
strategy's raw scores from a ranker (:meth:`Aggregator.on_ranks`) and the passing of time
(:meth:`Aggregator.due`, which returns a :class:`Decision` when one is due). The ranker resolves
policies with the same :class:`PolicyResolver`, so both agree on which strategies must answer.
Nothing here does I/O or reads a clock: callers pass ``now`` (POSIX seconds, so that a state
persisted by one process keeps its meaning in the next). The service's two transports (a
faust-streaming table in Kafka mode, a dict over the in-memory bus) persist states with
:func:`dump_parts` / :func:`load_parts`.

The rules:

- **The latest snapshot wins**, in the order the watcher emitted them (``emitted_at``, then the
  version: a restarted watcher whose versions start again is still heard). An older one is stale,
  the same one again (a redelivery) a duplicate; both are ignored. A newer one supersedes the
  pending one, whether or not it was decided.
- **Answers** (one strategy's scores for one version) for the latest version are kept per
  strategy; those for an older version are stale. Those for a version not seen yet wait for their
  snapshot (a ranker can be faster than the aggregator's read of the workloads topic), at most
  ``early_versions`` versions and ``early_ttl_s`` seconds. Answers the workload's policy does not
  need (a strategy it does not enable, or a spread strategy, which the combiner levels itself:
  ``combine.answers_needed``) are ignored.
- **A workload gone** (deleted or opted out, said by the watcher after its last snapshot) is
  forgotten: its state is dropped, so states do not pile up. One older than the latest snapshot
  (the workload came back since) is stale.
- **A state that describes nothing** (no snapshot, no answer waiting for one:
  :meth:`Aggregator.describes_nothing`) is due at once, to be forgotten. That is what a ranker's
  answer arriving after its workload's gone message leaves once ``early_ttl_s`` has passed: the
  gone message dropped the state, so nothing tells the answer from a legitimately early one, and
  it waits like one; no snapshot came, so nothing is left. A state is never forgotten so while
  an answer in it may still meet its snapshot.
- **A decision is due** when every needed strategy has answered for the latest version
  (complete), or once ``deadline_s`` has passed since the snapshot arrived, with what there is
  (incomplete; ``missing`` names the others). After an incomplete decision, answers that arrive
  late still make a complete one; after a complete one, nothing more happens for that version.
- **The decision** is ``combine`` of the answers and ``label_costs`` of its order against the
  costs on the snapshot's pods (fewest writes), without the writes the controller's own order
  makes unnecessary (``implied.drop_implied``). An answer that breaks the score contract (a pod
  without a score, a plugin normalization out of range) is left out and counted as missing.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from math import isfinite
from typing import Final, NamedTuple

from pydantic import TypeAdapter

from podcost_core.combine import Combined, Contribution, ScoreContractError, answers_needed, combine
from podcost_core.implied import drop_implied
from podcost_core.labels import (
    DEFAULT_BAND,
    CostBand,
    CurrentCost,
    Labelling,
    band_for,
    current_costs,
    label_costs,
)
from podcost_core.model import Pod, PodUID, Snapshot
from podcost_core.policy import (
    DEFAULT_POLICY,
    ENABLED,
    LABLABS_ENABLED,
    Policy,
    policy_from_annotations,
)
from podcost_core.strategies.base import reading
from podcost_core.strategies.registry import Registry
from podcost_core.urgency import first_wrong
from podcost_core.victims import ReplicaSetViews

Scores = Mapping[PodUID, float]
"""One strategy's raw scores for the pods of one snapshot version."""


# --- policies ---------------------------------------------------------------------------------

#: The annotation prefixes a policy is read from (podcost's own and lablabs').
_POLICY_PREFIXES: Final = tuple(key.rpartition("/")[0] + "/" for key in (ENABLED, LABLABS_ENABLED))


#: The most snapshots' annotations :meth:`PolicyResolver.of` remembers (and so keeps alive,
#: superseded snapshots' too: a workload's annotations can hold kilobytes, ``kubectl apply``'s
#: last configuration). A ranker's batch answers up to 100 workloads, so the steps of one
#: decision are at most about 100 snapshots apart.
_SEEN_AT_MOST: Final = 256


class PolicyResolver:
    """The policy of a workload: its annotations over a cluster default, cached.

    Called for every snapshot by every ranker and the aggregator, so that they agree on which
    strategies rank a workload. Raises ``PolicyError`` (naming the culprit) for invalid
    annotations.

    Cached twice: by the policy annotations' items (what decides the policy), and, for
    :meth:`of`, by the identity of a snapshot's annotations mapping. The aggregator asks for the
    policy of the same snapshot at every step of a decision (its snapshot, then each answer and
    each check for a decision due: 14 times for the default policy), and sorting the
    annotations each time was most of what resolving cost.
    """

    def __init__(
        self,
        default: Policy = DEFAULT_POLICY,
        *,
        registry: Registry | None = None,
        size: int = 1024,
    ) -> None:
        if size < 1:
            raise ValueError("the policy cache needs a size of at least 1")
        self.default = default
        self.registry = registry
        self._size = size
        self._cache: OrderedDict[tuple[tuple[str, str], ...], Policy] = OrderedDict()
        self._seen: dict[int, tuple[Mapping[str, str], Policy]] = {}
        """By ``id`` of a snapshot's annotations: the mapping (kept, so that its ``id`` is not
        reused while it is here) and its policy; the latest (at most ``size`` and
        ``_SEEN_AT_MOST``), oldest first."""
        self._seen_size = min(size, _SEEN_AT_MOST)

    def __call__(self, annotations: Mapping[str, str]) -> Policy:
        relevant = _relevant(annotations)
        cached = self._cache.get(relevant)
        if cached is not None:
            self._cache.move_to_end(relevant)
            return cached
        policy = policy_from_annotations(
            dict(relevant), default=self.default, registry=self.registry
        )
        self._cache[relevant] = policy
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return policy

    def of(self, snapshot: Snapshot) -> Policy:
        """The policy of the workload ``snapshot`` is of.

        Its annotations are resolved once while they are among the ``size`` latest met here: a
        snapshot is a frozen value, its annotations are never changed in place."""
        annotations = snapshot.annotations
        seen = self._seen.get(id(annotations))
        if seen is not None and seen[0] is annotations:
            return seen[1]
        policy = self(annotations)
        self._seen[id(annotations)] = (annotations, policy)
        if len(self._seen) > self._seen_size:
            del self._seen[next(iter(self._seen))]
        return policy


def _relevant(annotations: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The annotations a policy is read from, sorted: what :class:`PolicyResolver` caches by."""
    return tuple(
        sorted(item for item in annotations.items() if item[0].startswith(_POLICY_PREFIXES))
    )


def score_problem(snapshot: Snapshot, scores: Scores) -> str | None:
    """Why ``scores`` cannot be one strategy's answer for ``snapshot`` (``None`` if they can):
    the ranker checks its strategy's output with this before publishing it."""
    for pod in snapshot.pods:
        if pod.active and pod.uid not in scores:
            return f"no score for pod {pod.uid!r}"
    for uid, value in scores.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not isfinite(value):
            return f"the score of pod {uid!r} is {value!r}, not a finite number"
    return None


#: The fields of a snapshot that no decision reads: the pods' tolerations, requests, annotations
#: and anti-affinity and the nodes' annotations, taints and resources are the rankers' (their
#: strategies score them), while a decision reads each pod's identity, owner, node, state and
#: cost (``combine``, ``label_costs``, the victim model) and the nodes' labels (a spread
#: strategy's domains, levelled by the combiner; a spread strategy of a plugin may read the
#: pods' labels too, so they are kept). The aggregator decodes snapshots without them
#: (``podcost_contracts.messages.decode_workload_record``): building them was about half of
#: decoding a snapshot, the largest part of the aggregator's work per decision.
#: ``tests/unit/test_decision_unread.py`` checks that decisions on snapshots decoded so equal
#: those on whole snapshots.
DECISION_UNREAD: Final = reading(pod=("labels",), node=("labels",))


# --- state ------------------------------------------------------------------------------------


class Verdict(StrEnum):
    """How far the latest snapshot's decision went."""

    PENDING = "pending"
    """Not decided yet."""
    PARTIAL = "partial"
    """Decided at the deadline without every answer; late answers can still complete it."""
    COMPLETE = "complete"
    """Decided with every answer: nothing more to do for this version."""


@dataclass(frozen=True, slots=True)
class Latest:
    """The latest snapshot of a workload, with when it was emitted and when it arrived."""

    snapshot: Snapshot
    emitted_at: float
    """When the watcher published it (POSIX seconds): the order snapshots are taken in."""
    arrived_at: float
    """When the aggregator read it: the deadline counts from here."""
    trace: Mapping[str, str] = field(default_factory=dict)
    """The W3C trace context it came with (``traceparent``, ``tracestate``): a decision's span
    is a child of the snapshot's."""
    changed_at: float | None = None
    """When the watcher saw the change the snapshot answers (``None``: not said)."""

    @property
    def version(self) -> int:
        return self.snapshot.version


@dataclass(frozen=True, slots=True)
class Arrival:
    """What a state's wake-up needs of its snapshot part: the snapshot's version and when it
    arrived (:meth:`Aggregator.stored_wakeup`)."""

    version: int
    arrived_at: float


@dataclass(frozen=True, slots=True)
class Waiting:
    """Answers for a version whose snapshot has not arrived yet."""

    version: int
    since: float
    """When the first of them arrived."""
    answers: Mapping[str, Scores] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Progress:
    """What the latest snapshot has received and where its decision stands (the small part of a
    state, written on every answer)."""

    verdict: Verdict = Verdict.PENDING
    answers: Mapping[str, Scores] = field(default_factory=dict)
    """By strategy, for the latest version (emptied once decided complete)."""
    early: tuple[Waiting, ...] = ()
    """Answers for later versions, ascending."""
    derived: bool = field(default=False, compare=False)
    """Made from the snapshot and the progress before it (:meth:`Aggregator.on_snapshot`, or
    :func:`load_parts` for a snapshot part newer than the progress part) and not changed since:
    what :func:`load_parts` rebuilds from the snapshot part and the progress stored before, so
    :func:`dump_parts` need not write it with the snapshot (see there)."""


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """Everything the aggregator keeps about one workload."""

    key: str
    """``cluster/namespace/kind/name``."""
    latest: Latest | None = None
    progress: Progress = Progress()

    @property
    def version(self) -> int | None:
        """The latest snapshot's version, ``None`` before the first."""
        return None if self.latest is None else self.latest.version


class Outcome(StrEnum):
    """What became of one input."""

    ACCEPTED = "accepted"
    """It changed the state: a newer snapshot, or an answer for the latest version."""
    EARLY = "early"
    """An answer for a version not seen yet: kept until its snapshot arrives."""
    STALE = "stale"
    """Older than the latest snapshot: ignored."""
    DUPLICATE = "duplicate"
    """Already had (a redelivery), or the version is already decided complete: ignored."""
    UNUSED = "unused"
    """An answer the workload's policy does not need: ignored."""


class Step(NamedTuple):
    """The result of a transition."""

    state: WorkloadState
    outcome: Outcome


# --- decisions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodDecision:
    """One ranked pod's cost and why."""

    pod: Pod
    cost: int
    """The cost the pod should carry."""
    previous: int | None
    """The cost on the pod when the snapshot was taken, ``None`` if it had none podcost can
    keep (no annotation, or an invalid one of podcost's own)."""
    rank: int
    """Its group in the order: 0 = deleted first."""
    breakdown: tuple[Contribution, ...]
    """Every strategy's part in its cost."""

    @property
    def changes(self) -> bool:
        """Whether its annotation must be written."""
        return self.cost != self.previous


@dataclass(frozen=True)
class Decision:
    """The costs decided for one snapshot version, with everything needed to explain them."""

    key: str
    snapshot: Snapshot
    combined: Combined
    labelling: Labelling
    current: Mapping[PodUID, CurrentCost]
    trace: Mapping[str, str] = field(default_factory=dict)
    """The snapshot's trace context."""
    rejected: Mapping[str, str] = field(default_factory=dict)
    """Answers left out because they broke the score contract: strategy → reason."""
    changed_at: float | None = None
    """When the watcher saw the change the decided snapshot answers (``None``: not said)."""
    views: ReplicaSetViews | None = field(default=None, compare=False, repr=False)
    """The snapshot's ReplicaSet views, as the decision's labelling read them (``first_wrong``
    reads the same ones rather than compute them again)."""

    @property
    def version(self) -> int:
        return self.snapshot.version

    @property
    def complete(self) -> bool:
        """Whether every strategy the policy needs took part."""
        return self.combined.complete

    @property
    def missing(self) -> tuple[str, ...]:
        """The needed strategies that did not take part (no answer, or a rejected one)."""
        return self.combined.missing

    @property
    def first_wrong(self) -> int | None:
        """The smallest scale-in that would now, before these writes, delete a pod the order
        keeps (``urgency.first_wrong``): how urgent the writes are."""
        return first_wrong(self.combined.order, self.snapshot, self.views, self.combined.ranks)

    def pods(self) -> list[PodDecision]:
        """Every ranked pod, in snapshot order."""
        by_uid = {pod.uid: pod for pod in self.snapshot.pods}
        ranks = self.combined.ranks
        costs = self.labelling.costs
        return [
            PodDecision(
                pod=by_uid[uid],
                cost=costs[uid],
                previous=self.current[uid].value if uid in self.current else None,
                rank=ranks[uid],
                breakdown=self.combined.breakdown(uid),
            )
            for uid in self.combined.uids
        ]


# --- the transitions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AggregationConfig:
    """How the aggregator decides; validated on construction."""

    deadline_s: float = 5.0
    """How long after a snapshot arrives a decision is made with the answers there are."""
    overwrite_foreign: bool = False
    """Whether costs someone else set may be rewritten (else they are fixed constraints)."""
    band: CostBand = DEFAULT_BAND
    """The values podcost writes, unless the workload's policy sets ``non_negative_costs``
    (then ``NON_NEGATIVE_BAND``)."""
    early_ttl_s: float = 60.0
    """How long answers for a version not seen yet wait for their snapshot; a state holding
    nothing else is then forgotten (:meth:`Aggregator.describes_nothing`). An answer comes
    before its snapshot only as far as the aggregator's read of the workloads topic lags the
    ranker's (under a second while it keeps up; its backlog on that topic after an outage or a
    failover): a minute covers that with room, and bounds how long a late answer's state is
    kept."""
    early_versions: int = 4
    """How many versions not seen yet may have answers waiting (the newest are kept)."""

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be positive, got {self.deadline_s!r}")
        if not self.early_ttl_s > 0:
            raise ValueError(f"early_ttl_s must be positive, got {self.early_ttl_s!r}")
        if self.early_versions < 1:
            raise ValueError(f"early_versions must be at least 1, got {self.early_versions!r}")


#: The wake-up of a state that describes nothing (:meth:`Aggregator.next_wakeup`): the epoch,
#: before any clock's ``now``.
AT_ONCE: Final = 0.0


class Aggregator:
    """The pure transitions of a :class:`WorkloadState` (see the module docstring)."""

    def __init__(
        self, config: AggregationConfig | None = None, policies: PolicyResolver | None = None
    ) -> None:
        self.config = config or AggregationConfig()
        self.policies = policies or PolicyResolver()

    def on_snapshot(
        self,
        state: WorkloadState,
        snapshot: Snapshot,
        *,
        emitted_at: float,
        now: float,
        trace: Mapping[str, str] | None = None,
        changed_at: float | None = None,
    ) -> Step:
        """A snapshot arrived. Raises ``PolicyError`` (state unchanged) if the workload's
        annotations ask for an invalid policy: nothing can be decided for it."""
        if snapshot.workload.key != state.key:
            raise ValueError(f"a snapshot of {snapshot.workload.key!r} given to {state.key!r}")
        needed = answers_needed(self.policies.of(snapshot))
        latest = state.latest
        if latest is not None:
            order, current = (emitted_at, snapshot.version), (latest.emitted_at, latest.version)
            if order == current:
                return Step(state, Outcome.DUPLICATE)
            if order < current:
                return Step(state, Outcome.STALE)
        answers: Mapping[str, Scores] = {}
        early = []
        for waiting in state.progress.early:
            if waiting.version == snapshot.version:
                answers = {name: s for name, s in waiting.answers.items() if name in needed}
            elif waiting.version > snapshot.version:
                early.append(waiting)
        fresh = WorkloadState(
            state.key,
            Latest(snapshot, emitted_at, now, dict(trace or {}), changed_at),
            Progress(Verdict.PENDING, answers, tuple(early), derived=True),
        )
        return Step(fresh, Outcome.ACCEPTED)

    @staticmethod
    def on_gone(state: WorkloadState, *, emitted_at: float, version: int) -> Outcome:
        """The watcher said the workload is no longer ranked (deleted or opted out).
        ``ACCEPTED``: forget its state; ``STALE``: the state holds a later snapshot (the
        workload came back), keep it."""
        latest = state.latest
        if latest is not None and (emitted_at, version) < (latest.emitted_at, latest.version):
            return Outcome.STALE
        return Outcome.ACCEPTED

    @staticmethod
    def on_unlisted(state: WorkloadState, *, listed_at: float) -> Outcome:
        """The watcher's live set of the workload's cluster, as its cache showed it at
        ``listed_at``, leaves the workload out. ``ACCEPTED``: forget its state; ``STALE``: keep
        it, its snapshot is later than the set (the workload came since), or, with no snapshot
        yet, answers came after it (for a workload that came since, whose snapshot is on its
        way)."""
        latest = state.latest
        if latest is not None:
            return Outcome.STALE if latest.emitted_at >= listed_at else Outcome.ACCEPTED
        if any(waiting.since >= listed_at for waiting in state.progress.early):
            return Outcome.STALE
        return Outcome.ACCEPTED

    def on_ranks(
        self, state: WorkloadState, *, strategy: str, version: int, scores: Scores, now: float
    ) -> Step:
        """One strategy's answer for one version arrived."""
        latest, progress = state.latest, state.progress
        if latest is None or version > latest.version:
            return self._wait(state, strategy, version, scores, now)
        if version < latest.version:
            return Step(state, Outcome.STALE)
        if strategy not in answers_needed(self.policies.of(latest.snapshot)):
            return Step(state, Outcome.UNUSED)
        if progress.verdict is Verdict.COMPLETE or progress.answers.get(strategy) == scores:
            return Step(state, Outcome.DUPLICATE)
        answers = {**progress.answers, strategy: scores}
        # Built directly, not by dataclasses.replace (which costs several times more): this
        # runs for every answer.
        progress = Progress(progress.verdict, answers, progress.early)
        return Step(WorkloadState(state.key, latest, progress), Outcome.ACCEPTED)

    def _wait(
        self, state: WorkloadState, strategy: str, version: int, scores: Scores, now: float
    ) -> Step:
        early = {waiting.version: waiting for waiting in state.progress.early}
        waiting = early.get(version, Waiting(version, now))
        if waiting.answers.get(strategy) == scores:
            return Step(state, Outcome.DUPLICATE)
        early[version] = replace(waiting, answers={**waiting.answers, strategy: scores})
        kept = tuple(early[v] for v in sorted(early)[-self.config.early_versions :])
        progress = replace(state.progress, early=kept, derived=False)
        return Step(replace(state, progress=progress), Outcome.EARLY)

    def due(self, state: WorkloadState, now: float) -> tuple[WorkloadState, Decision | None]:
        """The state at ``now``, and the decision that is due then, if any (module docstring).

        Call it after every transition (a last answer makes a decision due at once) and when
        :meth:`next_wakeup` has passed.
        """
        progress = state.progress
        if progress.early:
            ttl = self.config.early_ttl_s
            early = tuple(waiting for waiting in progress.early if now < waiting.since + ttl)
            if early != progress.early:
                progress = replace(progress, early=early, derived=False)
                state = replace(state, progress=progress)
        latest = state.latest
        if latest is None or progress.verdict is Verdict.COMPLETE:
            return state, None
        policy = self.policies.of(latest.snapshot)
        missing = [name for name in answers_needed(policy) if name not in progress.answers]
        expired = now >= latest.arrived_at + self.config.deadline_s
        if missing and not (progress.verdict is Verdict.PENDING and expired):
            return state, None
        decision = self._decide(state.key, latest, policy, progress.answers)
        if decision.complete:
            progress = Progress(Verdict.COMPLETE, {}, progress.early)
        else:
            kept = {n: s for n, s in progress.answers.items() if n not in decision.rejected}
            progress = Progress(Verdict.PARTIAL, kept, progress.early)
        return WorkloadState(state.key, latest, progress), decision

    @staticmethod
    def describes_nothing(state: WorkloadState) -> bool:
        """Whether ``state`` holds nothing worth keeping, so that a transport may forget it: no
        snapshot, and no answer waiting for one (:meth:`due` let those that waited
        ``early_ttl_s`` go). Answers of the latest version without its snapshot (a torn stored
        state) do not count: a snapshot, when it comes, starts from the waiting ones only."""
        return state.latest is None and not state.progress.early

    def next_wakeup(self, state: WorkloadState) -> float | None:
        """When :meth:`due` may next change ``state`` without any new input (``None``: never);
        :data:`AT_ONCE` for a state that :meth:`describes_nothing`, which is to be forgotten."""
        arrived = None if state.latest is None else state.latest.arrived_at
        return self._wakeup(state.progress.verdict, state.progress.early, arrived)

    def stored_wakeup(
        self, key: str, raw_progress: bytes | None, arrival: Arrival | None
    ) -> float | None:
        """:meth:`next_wakeup` of the state :func:`load_parts` reads from the progress part
        ``raw_progress`` and a snapshot part of which only ``arrival`` is known (``None``: no
        snapshot part), without decoding the snapshot: a transport that restored many states
        learns which of them are due without decoding them all. Raises
        :class:`StateDecodeError` as :func:`load_parts` does."""
        verdict, early = _stored_verdict(
            key, raw_progress, None if arrival is None else arrival.version
        )
        return self._wakeup(verdict, early, None if arrival is None else arrival.arrived_at)

    def _wakeup(
        self, verdict: Verdict, early: Sequence[Waiting], arrived_at: float | None
    ) -> float | None:
        if arrived_at is None and not early:
            return AT_ONCE  # describes nothing: stored before such states were forgotten
        times = [waiting.since + self.config.early_ttl_s for waiting in early]
        if arrived_at is not None and verdict is Verdict.PENDING:
            times.append(arrived_at + self.config.deadline_s)
        return min(times, default=None)

    @staticmethod
    def waiting(state: WorkloadState) -> bool:
        """Whether ``state`` still waits for a first decision or for a snapshot (what a transport
        that replays records after a restart must be able to read again)."""
        pending = state.latest is not None and state.progress.verdict is Verdict.PENDING
        return pending or bool(state.progress.early)

    def _decide(
        self, key: str, latest: Latest, policy: Policy, answers: Mapping[str, Scores]
    ) -> Decision:
        snapshot = latest.snapshot
        usable = dict(answers)
        rejected: dict[str, str] = {}
        while True:
            try:
                combined = combine(snapshot, policy, usable)
                break
            except ScoreContractError as error:
                if error.strategy not in usable:
                    raise  # not an answer's fault: a spread strategy of the policy broke
                rejected[error.strategy] = error.reason
                del usable[error.strategy]
        current = current_costs(snapshot.pods)
        band = band_for(policy.non_negative_costs, self.config.band)
        labelling = label_costs(
            combined.order,
            {pod.uid: pod.replicaset for pod in snapshot.pods},
            current,
            overwrite_foreign=self.config.overwrite_foreign,
            band=band,
        )
        views = ReplicaSetViews(snapshot)
        labelling = drop_implied(
            labelling, combined.order, snapshot, current, band=band, views=views,
            group_of=combined.ranks,
        )  # fmt: skip
        return Decision(
            key, snapshot, combined, labelling, current, latest.trace, rejected,
            latest.changed_at, views,
        )  # fmt: skip


# --- persistence ------------------------------------------------------------------------------

#: The parts a state is stored in, each written only when it changes: the snapshot once per
#: version, the progress on every answer.
SNAPSHOT_PART: Final = "snapshot"
PROGRESS_PART: Final = "progress"
STATE_PARTS: Final = (SNAPSHOT_PART, PROGRESS_PART)


@dataclass(frozen=True, slots=True)
class _StoredProgress:
    """:class:`Progress` as stored: the answers for the latest version as lists of scores in the
    order of its snapshot's pods, without the pod uids (a 10,000-pod workload's seven answers
    keyed by uid would not fit in one Kafka record)."""

    verdict: Verdict
    version: int | None
    """The snapshot version ``aligned`` follows the pods of."""
    aligned: Mapping[str, list[float]]
    answers: Mapping[str, Scores]
    """Answers that do not score exactly the snapshot's pods, kept as they came."""
    early: tuple[Waiting, ...]


_LATEST: TypeAdapter[Latest] = TypeAdapter(Latest)
_PROGRESS: TypeAdapter[_StoredProgress] = TypeAdapter(_StoredProgress)
#: Parts larger than this are gzip-compressed: a 10,000-pod snapshot must fit in one Kafka record.
_GZIP_ABOVE: Final = 16 * 1024
_GZIP_MAGIC: Final = b"\x1f\x8b"
_GZIP_LEVEL: Final = 1


class StateDecodeError(ValueError):
    """A stored state part cannot be read back (written by an incompatible version)."""


def dump_latest(latest: Latest) -> bytes:
    """The snapshot part as this module stores it: the latest snapshot as JSON, gzipped when
    large."""
    return _pack(_LATEST.dump_json(latest))


def load_latest(raw: bytes) -> Latest:
    """:func:`dump_latest`'s reverse; raises ``ValueError`` or ``zlib.error``."""
    return _LATEST.validate_json(_unpack(raw))


def dump_parts(
    old: WorkloadState | None,
    new: WorkloadState,
    *,
    write_latest: Callable[[Latest], bytes] = dump_latest,
    max_progress_bytes: int | None = None,
    on_trimmed: Callable[[str], None] | None = None,
) -> dict[str, bytes]:
    """The parts of ``new`` that differ from ``old`` (all of them when ``old`` is ``None``).

    ``write_latest`` stores the snapshot part: a caller that holds the snapshot as it was received
    can store that rather than have it serialised again (and pass the matching loader to
    :func:`load_parts`). A progress part larger than ``max_progress_bytes`` is stored without
    what it can best do without (:func:`_bounded_progress`; ``on_trimmed`` is told what)."""
    parts: dict[str, bytes] = {}
    if new.latest is not None and (old is None or old.latest is not new.latest):
        parts[SNAPSHOT_PART] = write_latest(new.latest)
        if _implied(old, new.latest, new.progress):
            return parts
    if old is None or old.progress is not new.progress or SNAPSHOT_PART in parts:
        parts[PROGRESS_PART] = _bounded_progress(_stored(new), max_progress_bytes, on_trimmed)
    return parts


def _bounded_progress(
    stored: _StoredProgress, limit: int | None, on_trimmed: Callable[[str], None] | None
) -> bytes:
    """The progress part, at most ``limit`` bytes: the answers for later versions are left out
    first (a 10,000-pod workload's seven answers keyed by uid are 2.3 MB of JSON), then the
    answers that do not score the snapshot's pods, then the aligned ones. A state stored so
    lacks those answers once it is read back (after a restart or a rebalance): its decision
    waits for the deadline and says what was missing, where a part the transport cannot store
    would stop it on every restart."""
    packed = _pack(_PROGRESS.dump_json(stored))
    steps: list[tuple[str, Callable[[_StoredProgress], _StoredProgress]]] = [
        ("the answers for later versions", lambda kept: replace(kept, early=tuple(
            Waiting(waiting.version, waiting.since) for waiting in kept.early))),
        ("the answers that do not score the snapshot's pods",
         lambda kept: replace(kept, answers={})),
        ("every answer", lambda kept: replace(kept, aligned={})),
    ]  # fmt: skip
    for what, leave_out in steps:
        if limit is None or len(packed) <= limit:
            break
        stored = leave_out(stored)
        packed = _pack(_PROGRESS.dump_json(stored))
        if on_trimmed is not None:
            on_trimmed(what)
    return packed


def _implied(old: WorkloadState | None, latest: Latest, progress: Progress) -> bool:
    """Whether :func:`load_parts` rebuilds ``progress`` from ``latest``'s snapshot part and the
    progress part stored for ``old`` (``old`` is the state as stored before, ``None`` if nothing
    is), so that it need not be written: a new snapshot's progress, with no answer since.

    That is most snapshots (their answers come in later records): one changelog record fewer for
    most decisions in the faust transport (``bench_aggregator.py``: 3.3 → 2.8–2.9 a workload).
    A process killed between the two parts' writes leaves the same parts, and always
    did (the torn state of :func:`load_parts`). Only when it is sure: the progress before must
    be the stored one (not itself left unwritten), and a snapshot of a version not above the
    stored progress's (a restarted watcher's) is written in full: :func:`load_parts` takes a
    progress of the same version as the snapshot's own, and warns of a later one."""
    if not progress.derived:
        return False
    if old is None:
        return progress == Progress()
    if old.progress.derived or old.version is None or old.version >= latest.version:
        return False
    return _torn_progress(latest.version, old.version, old.progress.early) == progress


def load_parts(
    key: str,
    parts: Mapping[str, bytes | None],
    *,
    read_latest: Callable[[bytes], Latest] = load_latest,
    on_torn: Callable[[int | None, int], None] | None = None,
) -> WorkloadState:
    """The state of ``key`` from its stored parts (missing parts: the empty state's);
    ``read_latest`` reads the snapshot part (it raises ``ValueError`` if it cannot).
    ``on_torn(progress_version, snapshot_version)`` is told when the stored progress is a
    later snapshot's than the stored one, whose snapshot part was lost (see
    :func:`_torn_progress`); an earlier snapshot's is what :func:`dump_parts` leaves, and a
    process killed between the two writes, and is not told."""
    raw_latest, raw_progress = parts.get(SNAPSHOT_PART), parts.get(PROGRESS_PART)
    try:
        latest = None if raw_latest is None else read_latest(raw_latest)
    except (ValueError, zlib.error) as error:  # pydantic's ValidationError is a ValueError
        raise StateDecodeError(f"the stored state of {key!r} cannot be read: {error}") from error
    stored = _load_progress(key, raw_progress)
    if stored is None:
        return WorkloadState(key, latest)
    if latest is None or stored.version == latest.version:
        answers = dict(stored.answers)
        if latest is not None:
            uids = [pod.uid for pod in latest.snapshot.pods]
            for name, values in stored.aligned.items():
                if len(values) == len(uids):
                    answers[name] = dict(zip(uids, values, strict=True))
        return WorkloadState(key, latest, Progress(stored.verdict, answers, stored.early))
    if on_torn is not None and stored.version is not None and stored.version > latest.version:
        on_torn(stored.version, latest.version)
    return WorkloadState(key, latest, _torn_progress(latest.version, stored.version, stored.early))


def _load_progress(key: str, raw_progress: bytes | None) -> _StoredProgress | None:
    try:
        return None if raw_progress is None else _PROGRESS.validate_json(_unpack(raw_progress))
    except (ValueError, zlib.error) as error:  # pydantic's ValidationError is a ValueError
        raise StateDecodeError(f"the stored state of {key!r} cannot be read: {error}") from error


def _stored_verdict(
    key: str, raw_progress: bytes | None, version: int | None
) -> tuple[Verdict, tuple[Waiting, ...]]:
    """The verdict and the waiting answers of the state :func:`load_parts` reads from
    ``raw_progress`` and a snapshot part of ``version`` (``None``: none), the same branches
    without the snapshot."""
    stored = _load_progress(key, raw_progress)
    if stored is None:
        return Verdict.PENDING, ()
    if version is None or stored.version == version:
        return stored.verdict, stored.early
    torn = _torn_progress(version, stored.version, stored.early)
    return torn.verdict, torn.early


def _torn_progress(
    version: int, stored_version: int | None, stored_early: tuple[Waiting, ...]
) -> Progress:
    """The progress of the latest snapshot (of ``version``) when the stored progress is another
    snapshot's (its version and its answers for later versions).

    An older one is what :func:`dump_parts` leaves when the new snapshot's progress is
    implied (:func:`_implied`). Both are also what a process killed between the two parts'
    writes leaves (two faust tables: two changelog topics); the records that wrote them were
    not committed and are read again. Neither the stored verdict nor the stored answers are the
    latest snapshot's: a verdict of ``COMPLETE`` kept from the previous version made the latest one
    look decided, so that the records read again were all duplicates and its decision was never
    made (the loss seen in ``tests/integration/test_core_replicas.py`` around the SIGKILL of an
    aggregator). The latest snapshot is pending, as :meth:`Aggregator.on_snapshot` would have
    left it: with the answers that waited for it (an older progress's ``early``) and the later
    versions' waiting answers. A progress newer than the snapshot (its snapshot part lost)
    leaves the latest version pending without answers: at worst decided again (at least once),
    never taken for decided; the newer snapshot is read again and replaces it.
    """
    answers: Mapping[str, Scores] = {}
    early = []
    if stored_version is None or stored_version < version:
        for waiting in stored_early:
            if waiting.version == version:
                answers = dict(waiting.answers)
            elif waiting.version > version:
                early.append(waiting)
    else:
        early = [waiting for waiting in stored_early if waiting.version > version]
    return Progress(Verdict.PENDING, answers, tuple(early), derived=True)


def _stored(state: WorkloadState) -> _StoredProgress:
    progress, latest = state.progress, state.latest
    aligned: dict[str, list[float]] = {}
    unaligned: dict[str, Scores] = {}
    uids = [] if latest is None else [pod.uid for pod in latest.snapshot.pods]
    for name, scores in progress.answers.items():
        if len(scores) == len(uids) and all(uid in scores for uid in uids):
            aligned[name] = [scores[uid] for uid in uids]
        else:
            unaligned[name] = scores
    version = None if latest is None else latest.version
    return _StoredProgress(progress.verdict, version, aligned, unaligned, progress.early)


def _pack(body: bytes) -> bytes:
    if len(body) <= _GZIP_ABOVE:
        return body  # JSON never starts with the gzip magic bytes
    # The fastest level: a snapshot part is written once per version, on the hot path, and
    # level 6 took three times as long for a tenth less.
    compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(body) + compressor.flush()


def _unpack(blob: bytes) -> bytes:
    if blob[:2] == _GZIP_MAGIC:
        return zlib.decompress(blob, 16 + zlib.MAX_WBITS)
    return blob
