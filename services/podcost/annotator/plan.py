"""The annotator's decisions, free of I/O: which cost to write to which pod, and when not to.

The annotator's parts are the callers: ``intake`` (``verify``, the version guard,
``superseded``), ``backlog`` (the write queue, the ledger, ``write_priority``) and ``writer``
(``pod_state``, ``decide``, ``verify``, ``gives_up``; ``cleanup`` uses ``gives_up`` too). The
unit tests drive everything here directly. The pieces:

- :func:`decide`: given the cost a pod should carry and the pod as the API holds it now
  (:class:`PodState`, read by :func:`pod_state` from the pod's JSON), write, leave it (already
  right), leave it (someone else's cost), or skip it (the pod is gone).
- :func:`write_priority`: the order the writes wait in, most urgent decision first
  (``podcost_core.urgency``), which is the order a first costing spends the write budget in.
- :class:`WriteQueue`: the pending writes, one slot per pod uid. A newer desired cost for a pod
  supersedes a queued older one, so only the newest is ever written; a desired cost the snapshot
  already saw on the pod is no write at all, unless this annotator has since set out to write
  another cost there (the snapshot may predate that write); a pod with a write in flight gets its
  next write only after that one is done, so writes to one pod never race each other.
- :class:`Ledger`: which consumed records are fully handled, so that offsets are committed only
  past records whose every write is done (or definitively skipped), in partition order.
- :class:`VersionGuard`: the newest decision accepted per workload, so that an older one that
  arrives after it (a replay, a rebalance, a slow aggregator replica) is skipped as stale and the
  same one again as a duplicate, even while the newer one's writes are still in flight.
- :func:`gives_up`: which failed requests end as an error, and which are retried for as long as
  they fail (an API server outage loses no decision).
- :func:`verify`: whether the annotator's own view of its own cluster backs a decision about one
  pod (the pod exists with that uid, is owned by the workload the record's key names, and that
  workload is opted in and in :class:`Scope`); anything else is a :class:`Refused` write.

Superseding a queued write settles the older record at once. That is safe for at-least-once:
the record that superseded it is later in its partition (same workload, same key) and stays
uncommitted until its own write is done, so a crash replays the newer value, never loses it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar, cast

from podcost_contracts.messages import WorkloadKey as BusKey
from podcost_core.kubejson import ObjectMetaJSON
from podcost_core.model import DELETION_COST_ANNOTATION, CostOwner, PodUID
from podcost_core.tomodel import cost_owner
from podcost_core.victims import deletion_cost_error, parse_deletion_cost
from podcost_kube.store import Store
from podcost_kube.workloads import OptInRules, WorkloadKey, owning_workload, workload_policy

T = TypeVar("T")


class Result(StrEnum):
    """How the write of one desired cost ended; the ``result`` label of ``podcost_patches``."""

    OK = "ok"
    """Written."""
    UNCHANGED = "unchanged"
    """The pod already carries that cost: no write."""
    SUPERSEDED = "superseded"
    """A newer desired cost for the same pod arrived before this one was written."""
    GONE = "gone"
    """The pod no longer exists (404, or its name now belongs to another pod)."""
    FOREIGN = "skipped_foreign"
    """The pod carries a cost someone else set, and ``overwrite_foreign`` is off."""
    DRY_RUN = "dry_run"
    """Would have been written; dry-run mode writes nothing."""
    REFUSED = "refused"
    """Not backed by the annotator's own view of the cluster (:func:`verify`): no write, the
    reason counted in ``podcost_refusals``."""
    REVOKED = "revoked"
    """Not written here: a rebalance gave the partition of its record to another annotator,
    which reads the record again from the last commit (the write is fenced by the assignment
    the record was read under)."""
    ERROR = "error"
    """Given up: a permanent API error (403, 422 ...), or conflicts past the retry limit
    (logged). An unavailable or throttling API server never ends a write as an error."""


class Retry(StrEnum):
    """Why one request is tried again; counted in ``podcost_patches`` under these results."""

    CONFLICT = "conflict"
    """409: the pod changed between the read and the write."""
    THROTTLED = "throttled"
    """429: the API server asked to slow down (with ``Retry-After``)."""
    UNAVAILABLE = "unavailable"
    """5xx, a timeout or no answer at all."""


def gives_up(reason: Retry, attempt: int, max_attempts: int) -> bool:
    """Whether a request that failed for ``reason`` on attempt number ``attempt`` ends here.

    Only conflicts are capped (at ``max_attempts``): each retry reads the pod again, and one
    that conflicts every time is fought over by another writer. An unavailable or throttling
    API server is waited out however long it takes: giving up would commit past the record and
    lose its decision until the workload changes again. (Permanent errors never get here.)
    """
    return reason is Retry.CONFLICT and attempt >= max_attempts


class Verdict(StrEnum):
    """What :func:`decide` says to do with one pod."""

    WRITE = "write"
    UNCHANGED = "unchanged"
    FOREIGN = "foreign"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class PodState:
    """A pod as the API holds it now, reduced to what deciding a cost write needs."""

    uid: str
    value: str | None
    """The deletion-cost annotation exactly as found; ``None`` when absent."""
    owner: CostOwner
    """Who set it: podcost's field manager, someone else, or nobody."""
    deleting: bool = False
    """``metadata.deletionTimestamp`` is set: the pod is on its way out."""

    @property
    def invalid(self) -> str | None:
        """Why the value is not a cost the controller can read, ``None`` if it is (or absent)."""
        return None if self.value is None else deletion_cost_error(self.value)


def pod_state(raw: Mapping[str, Any], adopt: Collection[str] = ()) -> PodState:
    """The :class:`PodState` of a pod's JSON (as ``Kube.read_pod`` returns it); a cost set by a
    field manager in ``adopt`` counts as podcost's own, to rewrite."""
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return PodState(
        uid=str(meta.get("uid", "")),
        value=annotations.get(DELETION_COST_ANNOTATION),
        owner=cost_owner(cast(ObjectMetaJSON, meta), adopt),
        deleting=meta.get("deletionTimestamp") is not None,
    )


def decide(
    cost: int, uid: str, state: PodState | None, *, overwrite_foreign: bool = False
) -> Verdict:
    """What to do to give pod ``uid`` the deletion cost ``cost``, the pod being ``state`` now
    (``None``: there is no pod of that name)."""
    if state is None or state.uid != uid or state.deleting:
        # A recreated pod under the same name is another pod; a terminating one needs no cost.
        return Verdict.GONE
    if state.invalid is None and parse_deletion_cost(state.value) == cost:
        # What the controller reads already, a missing annotation being 0: nothing to write.
        return Verdict.UNCHANGED
    # An invalid value is no cost (the controller reads 0), whoever set it: it is replaced.
    if state.owner is CostOwner.OTHER and state.invalid is None and not overwrite_foreign:
        return Verdict.FOREIGN
    return Verdict.WRITE


# --- verifying --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scope:
    """What this annotator may write: the watcher's namespace and opt-in rules, the same
    settings (``PODCOST_WATCHER_NAMESPACE``, ``_NAMESPACE_SELECTOR``, ``_DEFAULT_ENABLED``,
    ``PODCOST_POLICY_FILE``) read by the same functions (``podcost_kube.workloads``)."""

    namespaces: tuple[str, ...] | None = None
    """The namespaces served (``WatcherSettings.namespaces()``); ``None``: every namespace."""
    rules: OptInRules = field(default_factory=OptInRules)

    def covers(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


class Refusal(StrEnum):
    """Why a decision about one pod is not written; the ``reason`` of ``podcost_refusals``."""

    OUT_OF_SCOPE = "out_of_scope"
    """The pod or the workload is in a namespace this annotator does not serve."""
    UNKNOWN_POD = "unknown_pod"
    """No pod of that name in the view. The annotator reads the pod (404 is ``gone``) and
    verifies what the read returns, up to its budget of such reads per record; past it, this
    is the refusal."""
    UID_MISMATCH = "uid_mismatch"
    """The pod of that name has another uid."""
    UNKNOWN_OWNER = "unknown_owner"
    """The pod's controlling ReplicaSet, or that ReplicaSet's Deployment, is not in the view."""
    NO_WORKLOAD = "no_workload"
    """No ReplicaSet controls the pod (a bare pod, a static pod, a DaemonSet's or a Job's)."""
    OTHER_WORKLOAD = "other_workload"
    """The pod belongs to another workload than the record's key names."""
    NOT_OPTED_IN = "not_opted_in"
    """The workload is not opted in (or its policy annotations are invalid)."""
    STILL_OPTED_IN = "still_opted_in"
    """A release (remove podcost's costs) for a workload the view shows opted in and in scope:
    its costs stay."""

    @property
    def may_catch_up(self) -> bool:
        """Whether the view may just not have seen yet what the watcher saw (the pod's owners,
        or the workload's opt-in): worth another look for a little while, where every other
        refusal is final."""
        return self in (Refusal.UNKNOWN_OWNER, Refusal.NOT_OPTED_IN)


@dataclass(frozen=True, slots=True)
class Refused:
    """A refused write: the reason, and what the view says instead (for the log)."""

    reason: Refusal
    detail: str


def verify(
    key: BusKey,
    namespace: str,
    name: str,
    uid: str,
    pod: Mapping[str, Any] | None,
    store: Store,
    scope: Scope,
) -> Refused | None:
    """Whether the decision ``key`` about pod ``namespace/name`` with ``uid`` may be written,
    ``pod`` being that pod as the view holds it (``None``: no such pod) and ``store`` the view
    of the pod's owners (ReplicaSets, Deployments, and Namespaces for a namespace selector);
    ``None`` when it may, else why not. The cluster of ``key`` is checked before (its topic).
    """
    for where in (namespace, key.namespace):
        if not scope.covers(where):
            served = ", ".join(scope.namespaces or ())
            return Refused(Refusal.OUT_OF_SCOPE, f"namespace {where} is not one of {served}")
    if pod is None:
        return Refused(Refusal.UNKNOWN_POD, "no such pod")
    found = str((pod.get("metadata") or {}).get("uid", ""))
    if found != uid:
        return Refused(Refusal.UID_MISMATCH, f"the pod's uid is {found}")
    owner = owning_workload(store, pod)
    if owner.workload is None:
        if owner.missing is not None:
            return Refused(Refusal.UNKNOWN_OWNER, f"{owner.missing} is not known")
        return Refused(Refusal.NO_WORKLOAD, "no ReplicaSet controls the pod")
    named = WorkloadKey(key.namespace, key.kind, key.name)
    if owner.workload != named:
        return Refused(
            Refusal.OTHER_WORKLOAD, f"it belongs to {owner.workload.bus_key(key.cluster)}"
        )
    policy = workload_policy(store, owner.workload, scope.rules)
    if not policy.enabled:
        why = str(policy.error) if policy.error is not None else f"decided by {policy.source}"
        return Refused(Refusal.NOT_OPTED_IN, f"the workload is not opted in ({why})")
    return None


def verify_release(
    key: BusKey,
    namespace: str,
    name: str,
    uid: str,
    pod: Mapping[str, Any] | None,
    store: Store,
    scope: Scope,
) -> Refused | None:
    """Whether the release ``key`` (its workload is no longer ranked) may remove podcost's cost
    from pod ``namespace/name`` with ``uid``; ``None`` when it may. The pod must be the
    workload's, as for a write, and the view must agree the workload is no longer podcost's:
    not opted in, or out of scope. A pod the view does not show is left to the removal, which
    reads it (404 is ``gone``) and removes only a cost podcost's own field manager set."""
    refused = verify(key, namespace, name, uid, pod, store, scope)
    if refused is None:
        return Refused(Refusal.STILL_OPTED_IN, "the workload is opted in and in scope")
    if refused.reason in (Refusal.NOT_OPTED_IN, Refusal.OUT_OF_SCOPE, Refusal.UNKNOWN_POD):
        return None
    return refused


# --- coalescing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Want(Generic[T]):
    """One desired cost for one pod, and where it came from (``origin``: the record's ticket)."""

    uid: PodUID
    namespace: str
    name: str
    cost: int
    previous: int | None
    """The cost the snapshot saw on the pod (0 without the annotation, ``None``: an invalid
    one, or one of ours not written as podcost writes it)."""
    origin: T
    remove: bool = False
    """Remove the cost podcost wrote instead (its workload is no longer ranked); ``cost`` is
    then unused."""
    first_wrong: int | None = None
    """The decision's ``first_wrong``: the smallest scale-in that goes wrong until its costs
    are written (``None``: none does). Orders the writes (:func:`write_priority`)."""
    position: int = 0
    """The pod's place in its decision, first deleted first (0-based)."""


#: The priority of a decision no scale-in goes wrong without: after every other.
NOT_URGENT = 2**31


def write_priority(first_wrong: int | None, position: int = 0, *, rising: bool = False) -> int:
    """Where a pod's write goes in the annotator's line, lowest first: the smallest scale-in it
    can help set right. A pod whose cost goes down (or stays) waits too long now: that is the
    scale-in its place in the order first reaches (``position + 1``). A ``rising`` one (its
    cost goes up) may go too early now, at any scale-in: its decision's ``first_wrong``. Never
    below ``first_wrong``: smaller scale-ins are right already. So a first costing, every
    workload waiting at once, writes the first pod to go of every workload where a scale-in of
    one would now do harm, then the second, and so on: scale-ins of one are right everywhere
    after about one write per workload, not after all of them (``labels`` keeps the last of
    equal groups at 0 and writes the others below it, so the pods written first are deleted
    first). A decision no scale-in needs goes last. Writes of equal priority keep the order
    they came in."""
    if first_wrong is None:
        return NOT_URGENT
    return min(first_wrong if rising else max(position + 1, first_wrong), NOT_URGENT - 1)


@dataclass(frozen=True, slots=True)
class Settled(Generic[T]):
    """A desired cost settled without a request, and why."""

    want: Want[T]
    result: Result


@dataclass(frozen=True, slots=True)
class Offer(Generic[T]):
    """What :meth:`WriteQueue.offer` did with one desired cost."""

    settled: tuple[Settled[T], ...]
    """Desired costs settled now (the superseded older one, or this one if unchanged)."""
    ready: bool
    """The pod's uid just became ready for a writer: hand it to one."""


@dataclass(slots=True)
class _Slot(Generic[T]):
    queued: Want[T] | None = None
    running: Want[T] | None = None


#: How many pods' last write :class:`WriteQueue` remembers (the oldest is forgotten first). A
#: snapshot older than the write is one still in the pipeline when it was made: seconds; this
#: many writes at the annotator's QPS take far longer.
REMEMBERED_WRITES = 100_000


class WriteQueue(Generic[T]):
    """Pending cost writes, at most one queued and one running per pod uid.

    A uid is *ready* when it has a queued write and none running; :meth:`offer` and
    :meth:`finish` say when a uid becomes ready, and a writer then calls :meth:`take` for it.
    A uid may be announced ready once and then have its queued write settled (superseded by an
    unchanged value); :meth:`take` then returns ``None``.

    A desired cost equal to the cost its snapshot saw on the pod is settled ``unchanged``
    without a request only when no write of this queue since could have changed the pod: the
    last write taken for that pod (any outcome; at most ``remember`` pods are remembered) was of
    that very cost, or there was none. The watcher ignores podcost's own cost writes, so a
    snapshot made before one of them landed (or before the watcher's cache saw it) still shows
    the cost the pod had before, and the decision made from it arrives after the write is done
    (over Kafka, the watcher-to-annotator hops take long enough for that); skipping it would
    leave the written cost in place for good, with no later snapshot to set it right.
    """

    def __init__(self, remember: int = REMEMBERED_WRITES) -> None:
        if remember < 1:
            raise ValueError(f"remember must be at least 1, got {remember}")
        self._slots: dict[PodUID, _Slot[T]] = {}
        self._queued = 0
        self._running = 0
        self._taken: dict[PodUID, int | None] = {}
        """Per pod, the cost of the last write taken (``None``: a removal), oldest first."""
        self._remember = remember

    @property
    def depth(self) -> int:
        """Writes queued or running: what the water marks watch."""
        return self._queued + self._running

    @property
    def running(self) -> int:
        return self._running

    def offer(self, want: Want[T]) -> Offer[T]:
        """Queue ``want``, superseding the pod's queued write if any."""
        slot = self._slots.setdefault(want.uid, _Slot())
        settled: list[Settled[T]] = []
        announced = slot.queued is not None and slot.running is None
        if slot.queued is not None:
            settled.append(Settled(slot.queued, Result.SUPERSEDED))
            slot.queued = None
            self._queued -= 1
        if (
            slot.running is None
            and not want.remove
            and want.previous == want.cost
            and self._taken.get(want.uid, want.cost) == want.cost
        ):
            # The snapshot saw this very cost on the pod, nothing of ours is in flight that
            # could change it, and nothing of ours since can have (the last write we took for
            # it, if any, was of this cost): no request at all. A change by someone else since
            # then makes the watcher publish a new snapshot, and the aggregator a new decision.
            settled.append(Settled(want, Result.UNCHANGED))
            self._drop_if_idle(want.uid, slot)
            return Offer(tuple(settled), ready=False)
        slot.queued = want
        self._queued += 1
        return Offer(tuple(settled), ready=slot.running is None and not announced)

    def queued(self, uid: PodUID) -> Want[T] | None:
        """The write of ``uid`` waiting for its turn, if any."""
        slot = self._slots.get(uid)
        return None if slot is None else slot.queued

    def take(self, uid: PodUID) -> Want[T] | None:
        """Start the queued write of ``uid`` (a writer calls this for a ready uid)."""
        slot = self._slots.get(uid)
        if slot is None or slot.queued is None or slot.running is not None:
            return None
        slot.running, slot.queued = slot.queued, None
        self._queued -= 1
        self._running += 1
        self._taken.pop(uid, None)  # re-inserted: the newest last
        self._taken[uid] = None if slot.running.remove else slot.running.cost
        if len(self._taken) > self._remember:
            del self._taken[next(iter(self._taken))]
        return slot.running

    def finish(self, uid: PodUID) -> bool:
        """The running write of ``uid`` is done; ``True`` if another is queued (ready again)."""
        slot = self._slots.get(uid)
        if slot is None or slot.running is None:
            raise KeyError(f"no write of pod {uid} is running")
        slot.running = None
        self._running -= 1
        if slot.queued is not None:
            return True
        self._drop_if_idle(uid, slot)
        return False

    def forget(self, uid: PodUID) -> None:
        """Forget the last write taken for ``uid`` (the pod is gone: no snapshot of it is to
        come), so that what is remembered follows the pods that live, not every pod written."""
        self._taken.pop(uid, None)

    @property
    def remembered(self) -> int:
        """How many pods' last write taken is remembered."""
        return len(self._taken)

    def purge(self, keep: Callable[[Want[T]], bool]) -> list[Want[T]]:
        """Remove the queued (not running) writes ``keep`` says no to, and return them."""
        purged: list[Want[T]] = []
        for uid, slot in list(self._slots.items()):
            if slot.queued is not None and not keep(slot.queued):
                purged.append(slot.queued)
                slot.queued = None
                self._queued -= 1
                self._drop_if_idle(uid, slot)
        return purged

    def _drop_if_idle(self, uid: PodUID, slot: _Slot[T]) -> None:
        if slot.queued is None and slot.running is None:
            del self._slots[uid]


# --- stale and duplicate decisions --------------------------------------------------------------


class Freshness(StrEnum):
    """What :meth:`VersionGuard.admit` says of one decision; ``stale`` and ``duplicate`` are
    outcomes of ``podcost_messages_consumed``."""

    NEW = "new"
    """Newer than any decision accepted for its workload: write it."""
    STALE = "stale"
    """Older than one already accepted: writing it would rewind the costs."""
    DUPLICATE = "duplicate"
    """The very decision accepted already (a redelivery): its writes are done or under way."""


@dataclass(frozen=True, slots=True)
class Decided:
    """Where one decision stands in its workload's order (``DesiredCostsMessage`` fields)."""

    version: int
    """The snapshot version decided."""
    changed_at: float | None
    """When the watcher saw the change (it stamps the snapshot's ``emitted_at`` with it)."""
    complete: bool
    """A complete decision follows an incomplete (deadline) one of the same version."""


def _compare(a: Decided, b: Decided) -> int:
    """-1, 0 or 1 as ``a`` is older than, the same as, or newer than ``b``.

    The aggregator's order of snapshots (``podcost_core.aggregate``): when the change was seen,
    then the version, so that a new watcher leader (another incarnation, whose versions may be
    lower) is heard; the version alone when a decision does not say when (an older producer).
    Then an incomplete decision before the complete one of the same version.
    """
    both = a.changed_at is not None and b.changed_at is not None
    keys_a = (a.changed_at if both else 0.0, a.version, a.complete)
    keys_b = (b.changed_at if both else 0.0, b.version, b.complete)
    return (keys_a > keys_b) - (keys_a < keys_b)


class VersionGuard:
    """The newest decision accepted per workload key (see :class:`Freshness`), for as long as
    the workload exists (:meth:`forget`).

    It lives as long as one run of the annotator. A restart begins empty and learns again from
    the records it reads: the uncommitted tail of each partition, in the order the aggregator
    published them, so a stale record after a newer one in that tail is still refused. What it
    cannot refuse is a stale record published after a newer one that was committed before the
    restart: nothing it reads says a newer decision exists (the costs on the pods carry no
    version).
    """

    def __init__(self) -> None:
        self._latest: dict[str, Decided] = {}

    def __len__(self) -> int:
        return len(self._latest)

    def admit(self, key: str, decided: Decided) -> Freshness:
        """Accept ``decided`` for workload ``key`` if it is newer than what was accepted."""
        known = self._latest.get(key)
        order = 1 if known is None else _compare(decided, known)
        if order < 0:
            return Freshness.STALE
        if order == 0:
            return Freshness.DUPLICATE
        self._latest[key] = decided
        return Freshness.NEW

    def latest(self, key: str) -> Decided | None:
        """The newest decision accepted for ``key``."""
        return self._latest.get(key)

    def forget(self, key: str) -> None:
        """Forget ``key``'s newest decision: its workload is gone. A decision about it read
        later is refused by the view (its pods are gone with it), and one about a workload
        created again under that name is later than any of the one gone."""
        self._latest.pop(key, None)


@dataclass(frozen=True, slots=True)
class TailDecision:
    """One decision read ahead after a start: its workload, its order and the pods it names."""

    key: str
    decided: Decided
    pods: frozenset[str]


def superseded(decisions: Sequence[TailDecision | None]) -> dict[int, frozenset[str]]:
    """Per index of ``decisions`` (``None`` for a record that does not decode), the pods it
    names that a newer decision of the same workload in ``decisions`` names too.

    The annotator asks this of the records a start finds already on its topic past the committed
    offsets, read in full before any is written: the run before may have written a newer
    decision of that tail and been killed before it committed, so writing an older one again in
    partition order would rewind those pods' costs until the newer one is read again. A pod's
    cost from an older decision is therefore dropped when a newer one names the pod; a
    duplicate of a decision supersedes nothing.
    """
    by_key: dict[str, list[int]] = {}
    for index, entry in enumerate(decisions):
        if entry is not None:
            by_key.setdefault(entry.key, []).append(index)
    dropped: dict[int, frozenset[str]] = {}
    for indexes in by_key.values():
        for index in indexes:
            older = decisions[index]
            assert older is not None
            covered: set[str] = set()
            for other in indexes:
                newer = decisions[other]
                assert newer is not None
                if _compare(newer.decided, older.decided) > 0:
                    covered |= newer.pods & older.pods
            if covered:
                dropped[index] = frozenset(covered)
    return dropped


# --- commit ledger ----------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Ticket(Generic[T]):
    """One consumed record and how many of its pod writes are still outstanding."""

    partition: Hashable
    offset: int
    outstanding: int
    item: T
    """What the caller commits once this and every earlier record of the partition is done."""

    @property
    def done(self) -> bool:
        return self.outstanding == 0


@dataclass(slots=True)
class _Partition(Generic[T]):
    open: deque[Ticket[T]] = field(default_factory=deque)
    last_offset: int = -1


class Ledger(Generic[T]):
    """Consumed records in offset order per partition, and which of them are fully handled.

    :meth:`committable` gives, per partition, the newest record whose every predecessor is
    done too: committing past it loses nothing, because whatever is still outstanding comes
    after it and will be read again if the process stops now.
    """

    def __init__(self) -> None:
        self._partitions: dict[Hashable, _Partition[T]] = {}

    def open(self, partition: Hashable, offset: int, writes: int, item: T) -> Ticket[T]:
        """Track a record with ``writes`` pod writes to wait for (0: done already)."""
        if writes < 0:
            raise ValueError(f"a record cannot wait for {writes} writes")
        entry = self._partitions.setdefault(partition, _Partition())
        if offset <= entry.last_offset:
            # Read again (a rebalance gave the partition back, or the consumer rewound): what
            # was tracked from here on will be handled again; forget it so it blocks nothing.
            entry.open = deque(t for t in entry.open if t.offset < offset)
        entry.last_offset = offset
        ticket = Ticket(partition, offset, writes, item)
        entry.open.append(ticket)
        return ticket

    def partitions(self) -> list[Hashable]:
        """The partitions with records tracked."""
        return list(self._partitions)

    def forget(self, partition: Hashable) -> None:
        """Stop tracking ``partition``'s records (its owner changed): none of them will ever be
        committable here, whatever becomes of their writes."""
        self._partitions.pop(partition, None)

    def settle(self, ticket: Ticket[T]) -> bool:
        """One write of ``ticket``'s record is done; ``True`` when that was its last."""
        if ticket.outstanding <= 0:
            raise ValueError(f"record {ticket.partition}@{ticket.offset} has nothing outstanding")
        ticket.outstanding -= 1
        return ticket.done

    def committable(self) -> list[T]:
        """Per partition, the item of the newest record with nothing outstanding before it or
        in it; those records are forgotten (a later call returns only newer ones)."""
        ready: list[T] = []
        for entry in self._partitions.values():
            last: Ticket[T] | None = None
            while entry.open and entry.open[0].done:
                last = entry.open.popleft()
            if last is not None:
                ready.append(last.item)
        return ready

    @property
    def pending(self) -> int:
        """Records consumed but not yet committable."""
        return sum(len(entry.open) for entry in self._partitions.values())
