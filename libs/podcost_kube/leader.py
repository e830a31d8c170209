"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's rules, so that two or
more replicas of a service can run and exactly one of them acts.

The watcher service (``podcost.watcher.service``) runs a :class:`LeaderElector` when
``PODCOST_WATCHER_LEADER_ELECTION`` is on and publishes snapshots only while it leads; the
tests build one directly. The Lease fields and their meaning are client-go's
(``k8s.io/client-go/tools/leaderelection``), so ``kubectl get lease`` shows who leads, and:

- A candidate reads the Lease. If there is none, it creates one naming itself and leads. If
  someone else holds it, the candidate waits until the record has stayed unchanged for the
  record's ``leaseDurationSeconds``, counted on the candidate's own monotonic clock from when it
  first saw that record (client-go's ``observedTime``: no comparison of clocks across machines;
  ``renewTime`` is written for people and tools), then takes it over with one more
  ``leaseTransitions``. A Lease with an empty ``holderIdentity`` (released) is taken at once.
- The leader writes a new ``renewTime`` every ``retry_period``. If no renewal succeeds within
  ``renew_deadline`` of the start of the last one that did, it steps down; since
  ``renew_deadline < lease_duration`` it has stopped acting before anyone may take over. If a
  renewal finds someone else holding the Lease, it steps down at once.
- Every write carries the ``resourceVersion`` it was decided on. A 409 means someone wrote in
  between: the elector reads the Lease again and decides again (:data:`CONFLICT_RETRIES` times,
  then it waits for its next try).
- On a clean stop (cancellation) a leader first steps down, then releases the Lease (an empty
  ``holderIdentity`` and ``leaseDurationSeconds: 1``, as client-go's ``ReleaseOnCancel``), so
  another replica takes over on its next try instead of a lease duration later.
- What a leader stamps with its wall clock must order after what the one before it stamped,
  even when the two clocks disagree: on taking over, the elector computes a floor
  (:func:`takeover_floor`, read from the record it took over, written with the previous
  holder's clock) and :attr:`LeaderElector.floor` gives it to the service, which stamps
  ``max(now, floor)``.

Deciding is pure (:func:`observe`, :func:`claim`, :func:`release` over :class:`LeaseRecord`) and
unit-tested on a fake clock; :class:`LeaderElector` does the waiting and the I/O through
:class:`Leases`, which :class:`KubeLeases` implements on the API server.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol, TypedDict, TypeVar, cast

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from podcost_core.model import FIELD_MANAGER
from podcost_kube.client import Kube, KubeError, _error, _unreachable
from podcost_kube.debounce import Clock, LoopClock

log = logging.getLogger(__name__)

T = TypeVar("T")

#: client-go's ``JitterFactor``: a candidate waits between ``retry_period`` and
#: ``(1 + JITTER) * retry_period`` between tries, so candidates do not ask in step.
JITTER: Final = 1.2
#: How many times one try reads again and decides again after a 409, before it waits.
CONFLICT_RETRIES: Final = 3
LEASE_API_VERSION: Final = "coordination.k8s.io/v1"


# --- the Lease as the API serves it ------------------------------------------------------------


class LeaseSpecJSON(TypedDict, total=False):
    """A Lease's ``spec``: the fields leader election reads and writes."""

    holderIdentity: str
    leaseDurationSeconds: int
    acquireTime: str
    renewTime: str
    leaseTransitions: int


class LeaseJSON(TypedDict, total=False):
    """A ``coordination.k8s.io/v1`` Lease, as ``kubectl get lease -o json`` prints it."""

    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    spec: LeaseSpecJSON


def format_micro_time(when: datetime) -> str:
    """``when`` as the API's ``MicroTime``: RFC 3339 in UTC with exactly six fractional digits
    (the API server refuses any other number of digits)."""
    if when.tzinfo is None:
        raise ValueError(f"a Lease time must be timezone-aware, got {when!r}")
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 time from the API; ``None`` when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


# --- deciding (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What a Lease says about its holder (client-go's ``LeaderElectionRecord``)."""

    holder: str = ""
    """``holderIdentity``; empty when nobody holds the Lease (it was released)."""
    duration: int = 0
    """``leaseDurationSeconds``: how long the others wait after they last saw the record change
    before they may take it over; 0 when absent."""
    acquired: datetime | None = None
    """``acquireTime``: when the holder took the Lease."""
    renewed: datetime | None = None
    """``renewTime``: when the holder last renewed it."""
    transitions: int = 0
    """``leaseTransitions``: how many times the Lease changed hands."""

    def spec(self) -> LeaseSpecJSON:
        """The Lease ``spec`` that says this."""
        spec: LeaseSpecJSON = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration,
            "leaseTransitions": self.transitions,
        }
        if self.acquired is not None:
            spec["acquireTime"] = format_micro_time(self.acquired)
        if self.renewed is not None:
            spec["renewTime"] = format_micro_time(self.renewed)
        return spec


def record_of(lease: Mapping[str, Any]) -> LeaseRecord:
    """The record a Lease (raw JSON) holds; missing fields read as empty."""
    spec = lease.get("spec")
    if not isinstance(spec, Mapping):
        spec = {}
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration=duration if isinstance(duration, int) else 0,
        acquired=parse_time(spec.get("acquireTime")),
        renewed=parse_time(spec.get("renewTime")),
        transitions=transitions if isinstance(transitions, int) else 0,
    )


@dataclass(frozen=True, slots=True)
class Observed:
    """A record, and when (on the observer's monotonic clock) it was first seen as it is."""

    record: LeaseRecord
    since: float


def observe(previous: Observed | None, record: LeaseRecord, now: float) -> Observed:
    """What is known after reading ``record`` at ``now``: the time it was first seen moves only
    when the record changed since ``previous``."""
    if previous is not None and previous.record == record:
        return previous
    return Observed(record, now)


def expired(observed: Observed, now: float, default_duration: float) -> bool:
    """Whether the holder of ``observed`` has let the Lease lapse by ``now``: the record has not
    changed for its ``leaseDurationSeconds`` (``default_duration`` when it has none)."""
    duration = observed.record.duration if observed.record.duration > 0 else default_duration
    return now >= observed.since + duration


def claim(
    observed: Observed | None, *, identity: str, duration: int, stamp: datetime, now: float
) -> LeaseRecord | None:
    """The record ``identity`` writes to lead (acquire or renew), or ``None`` while someone else
    validly holds the Lease.

    ``observed`` is ``None`` when there is no Lease (create it). Its own Lease is renewed keeping
    ``acquireTime`` and the transitions; a released one (no holder) or one whose holder let it
    lapse is taken over with one more transition. ``stamp`` is the wall-clock time written,
    ``now`` the monotonic time expiry is judged at.
    """
    if observed is None:
        return LeaseRecord(identity, duration, stamp, stamp, 0)
    current = observed.record
    if current.holder == identity:
        acquired = current.acquired or stamp
        return LeaseRecord(identity, duration, acquired, stamp, current.transitions)
    if current.holder and not expired(observed, now, duration):
        return None
    return LeaseRecord(identity, duration, stamp, stamp, current.transitions + 1)


def release(current: LeaseRecord, *, identity: str, stamp: datetime) -> LeaseRecord | None:
    """The record that gives up ``identity``'s Lease, as client-go writes it (no holder, a
    one-second duration, the transitions kept), or ``None`` when ``identity`` does not hold it."""
    if current.holder != identity:
        return None
    return LeaseRecord("", 1, stamp, stamp, current.transitions)


def takeover_floor(previous: LeaseRecord | None, identity: str) -> float:
    """POSIX seconds, on the previous holder's clock, after which everything ``identity`` stamps
    orders after what the previous holder stamped while it led; 0.0 when there is nothing to
    order after (no Lease, or its own).

    The previous holder wrote ``renewTime`` with its own wall clock. It acts only while a
    renewal succeeded within its ``renew_deadline``, which is shorter than the
    ``leaseDurationSeconds`` it wrote: what it stamped is at most ``renewTime`` plus that
    duration. One that released the Lease stopped acting before it wrote the release, so its
    ``renewTime`` alone bounds its stamps. Ordering by the takeover rather than by either clock
    keeps a new leader whose clock runs behind from being taken for the stale one.
    """
    if previous is None or previous.renewed is None or previous.holder == identity:
        return 0.0
    floor = previous.renewed.timestamp()
    if previous.holder:
        floor += max(previous.duration, 0)
    return floor


def check_timing(
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    *,
    names: tuple[str, str, str] = ("lease_duration", "renew_deadline", "retry_period"),
) -> None:
    """Raise ``ValueError`` unless ``lease_duration > renew_deadline > JITTER * retry_period >
    0``: a leader must give up before anyone may take over, and must get more than one try
    before it gives up. The message calls the three values by ``names`` (settings name their
    environment variables)."""
    lease_name, deadline_name, retry_name = names
    if retry_period <= 0:
        raise ValueError(f"{retry_name} must be positive, got {retry_period}")
    if renew_deadline <= JITTER * retry_period:
        raise ValueError(
            f"{deadline_name} ({renew_deadline}) must be greater than {JITTER} × {retry_name} "
            f"({retry_period})"
        )
    if lease_duration <= renew_deadline:
        raise ValueError(
            f"{lease_name} ({lease_duration}) must be greater than {deadline_name} "
            f"({renew_deadline})"
        )


# --- the Lease API -----------------------------------------------------------------------------


class LeaseConflict(KubeError):
    """409 (or the Lease vanished): someone wrote the Lease since it was read, and nothing was
    written. Read it again and decide again."""


class Leases(Protocol):
    """Reads and writes of Lease objects: what the elector needs of the API."""

    async def get(self, namespace: str, name: str) -> LeaseJSON | None:
        """The Lease, or ``None`` when there is none."""

    async def create(self, namespace: str, name: str, spec: LeaseSpecJSON) -> LeaseJSON:
        """Create the Lease with ``spec``; ``LeaseConflict`` when it exists already."""

    async def replace(self, lease: LeaseJSON, spec: LeaseSpecJSON) -> LeaseJSON:
        """Write ``spec`` into ``lease`` (as read: its ``resourceVersion`` is the condition);
        ``LeaseConflict`` when the Lease changed or vanished since."""


def _lease_error(error: ApiException, what: str) -> KubeError:
    if error.status == 409:
        return LeaseConflict(f"{what}: changed since it was read (HTTP 409)", status=409,
                             retriable=True)  # fmt: skip
    if error.status == 404:  # not a PodGone: the namespace is missing, which no retry mends
        return KubeError(f"{what}: HTTP 404 {error.reason or 'Not Found'}", status=404)
    return _error(error, what)


class KubeLeases:
    """:class:`Leases` on the API server, as podcost's field manager."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.api = client.CoordinationV1Api(kube.api)

    async def get(self, namespace: str, name: str) -> LeaseJSON | None:
        what = f"reading Lease {namespace}/{name}"
        try:
            lease = await self.api.read_namespaced_lease(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise _lease_error(error, what) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error
        return cast(LeaseJSON, self.kube.to_json(lease))

    async def create(self, namespace: str, name: str, spec: LeaseSpecJSON) -> LeaseJSON:
        what = f"creating Lease {namespace}/{name}"
        body: Any = {  # the client accepts plain JSON bodies
            "apiVersion": LEASE_API_VERSION,
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": dict(spec),
        }
        try:
            lease = await self.api.create_namespaced_lease(
                namespace, body, field_manager=FIELD_MANAGER
            )
        except ApiException as error:
            raise _lease_error(error, what) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error
        return cast(LeaseJSON, self.kube.to_json(lease))

    async def replace(self, lease: LeaseJSON, spec: LeaseSpecJSON) -> LeaseJSON:
        # Everything of the metadata as read (labels, owners, the resourceVersion that makes the
        # write conditional), but the managed fields, which the server keeps itself.
        meta = {k: v for k, v in lease.get("metadata", {}).items() if k != "managedFields"}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        what = f"writing Lease {namespace}/{name}"
        body: Any = {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": meta,
                     "spec": dict(spec)}  # fmt: skip
        try:
            written = await self.api.replace_namespaced_lease(
                name, namespace, body, field_manager=FIELD_MANAGER
            )
        except ApiException as error:
            if error.status == 404:
                raise LeaseConflict(f"{what}: deleted since it was read", status=404,
                                    retriable=True) from error  # fmt: skip
            raise _lease_error(error, what) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error
        return cast(LeaseJSON, self.kube.to_json(written))


# --- the elector -------------------------------------------------------------------------------


def _utc_now() -> datetime:
    # From time.time(), the clock the services stamp their messages with.
    return datetime.fromtimestamp(time.time(), UTC)


class LeaderElector:
    """Campaigns for Lease ``namespace/name`` as ``identity``, leads while it can renew, and tries
    again after it lost; :meth:`run` until cancelled.

    Whether it leads: :attr:`is_leader`, :meth:`wait_leading` / :meth:`wait_not_leading`, and
    the ``on_started_leading`` / ``on_stopped_leading`` callbacks, which run in :meth:`run`'s
    task right after the change (so must be quick; one that raises ends :meth:`run`).
    ``on_stopped_leading`` runs before the Lease is released, so whatever stops on it has
    stopped before another replica can start.

    Every identity must be unique among the candidates: two electors with one identity both
    believe they hold the Lease. ``lease_duration`` is written in whole seconds (rounded up).
    Timing follows ``clock`` (monotonic seconds, and sleeping); the times written in the Lease
    come from ``wall``. A permanent API error (403: no RBAC for Leases; 404: no such namespace)
    ends :meth:`run` with the :class:`KubeError`; anything else is tried again.
    """

    def __init__(
        self,
        kube: Kube | Leases,
        name: str,
        namespace: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        release_on_cancel: bool = True,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        clock: Clock | None = None,
        wall: Callable[[], datetime] = _utc_now,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not identity:
            raise ValueError("a leader elector needs a non-empty identity")
        if not name or not namespace:
            raise ValueError("a leader elector needs the Lease's name and namespace")
        check_timing(lease_duration, renew_deadline, retry_period)
        self.leases: Leases = KubeLeases(kube) if isinstance(kube, Kube) else kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_cancel = release_on_cancel
        self._duration = max(1, math.ceil(lease_duration))
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock: Clock = clock or LoopClock()
        self._wall = wall
        self._rng = rng
        self._lease: LeaseJSON | None = None
        """The Lease as last read or written (``None``: none, or not read yet)."""
        self._observed: Observed | None = None
        """Its record and since when it is as it is; ``None`` exactly when ``_lease`` is."""
        self._leading = False
        self._leading_event = asyncio.Event()
        self._not_leading_event = asyncio.Event()
        self._not_leading_event.set()
        self._running = False
        self._floor = 0.0
        self._failing_since: float | None = None
        """When (its clock) the API server began to fail every Lease request; ``None`` while
        they are answered."""

    # --- public -------------------------------------------------------------------------------

    def failing_for(self) -> float:
        """Seconds the API server has failed every Lease request (0 while they are answered,
        including with someone else's Lease): what a watcher whose watches are still open but
        whose server takes no new requests reads as an outage."""
        since = self._failing_since
        return 0.0 if since is None else max(0.0, self._clock.now() - since)

    @property
    def lease(self) -> str:
        """``namespace/name`` of the Lease."""
        return f"{self.namespace}/{self.name}"

    @property
    def is_leader(self) -> bool:
        """Whether this elector leads now."""
        return self._leading

    @property
    def floor(self) -> float:
        """POSIX seconds that what this elector's service stamps while it leads must not go
        below (see :func:`takeover_floor`); 0.0 when it took over nothing."""
        return self._floor

    @property
    def holder(self) -> str | None:
        """Who held the Lease when it was last read or written (``""``: nobody; ``None``: there
        is no Lease, or it was not read yet)."""
        return None if self._observed is None else self._observed.record.holder

    async def wait_leading(self) -> None:
        """Return once this elector leads (at once if it does)."""
        await self._leading_event.wait()

    async def wait_not_leading(self) -> None:
        """Return once this elector does not lead (at once if it does not)."""
        await self._not_leading_event.wait()

    async def run(self) -> None:
        """Campaign, lead, and campaign again after losing, until cancelled; then step down and,
        with ``release_on_cancel``, release the Lease."""
        if self._running:
            raise RuntimeError(f"the elector of Lease {self.lease} is already running")
        self._running = True
        try:
            while True:
                renewed_at = await self._acquire()
                await self._lead(renewed_at)
        finally:
            self._running = False
            self._step_down("stopping")
            if self.release_on_cancel:
                # Also when cancelled between a successful write and stepping up.
                await self._release()

    # --- campaigning and leading --------------------------------------------------------------

    async def _acquire(self) -> float:
        """Try until this elector holds the Lease; return when the successful try started."""
        while True:
            started = self._clock.now()
            if await self._attempt(self.renew_deadline):
                self._step_up()
                return started
            await self._clock.sleep(self.retry_period * (1 + JITTER * self._rng()))

    async def _lead(self, renewed_at: float) -> None:
        """Renew every retry period until a renewal fails for ``renew_deadline`` or finds
        someone else holding the Lease; then step down and return."""
        while True:
            await self._clock.sleep(self.retry_period)
            deadline = renewed_at + self.renew_deadline
            while True:
                started = self._clock.now()
                if started >= deadline:
                    self._step_down(f"no renewal succeeded within {self.renew_deadline}s")
                    return
                if await self._attempt(deadline - started):
                    renewed_at = started
                    break
                if self.holder not in (None, self.identity):
                    self._step_down(f"the Lease is held by {self.holder!r}")
                    return
                await self._clock.sleep(min(self.retry_period, deadline - self._clock.now()))

    async def _attempt(self, limit: float) -> bool:
        """One try to acquire or renew, given at most ``limit`` seconds; ``False`` when it did
        not succeed (someone else holds the Lease, or a retriable error, logged)."""
        try:
            answered = await self._within(self._try_acquire_or_renew(), limit)
        except TimeoutError:
            log.warning("Lease %s: no answer within %.1fs", self.lease, limit)
        except KubeError as error:
            if not error.retriable:
                raise
            log.warning("Lease %s: %s", self.lease, error)
        else:
            self._failing_since = None
            return answered
        if self._failing_since is None:
            self._failing_since = self._clock.now()
        return False

    async def _try_acquire_or_renew(self) -> bool:
        # A leader renews the Lease as it last wrote it; on a 409 it reads it like a candidate.
        lease = self._lease if self._leading else None
        read = lease is None
        for _ in range(1 + CONFLICT_RETRIES):
            if read:
                lease = await self.leases.get(self.namespace, self.name)
                self._see(lease)
            read = True
            record = claim(
                self._observed,
                identity=self.identity,
                duration=self._duration,
                stamp=self._wall(),
                now=self._clock.now(),
            )
            if record is None:
                return False
            previous = None if self._observed is None else self._observed.record
            try:
                if lease is None:
                    written = await self.leases.create(self.namespace, self.name, record.spec())
                else:
                    written = await self.leases.replace(lease, record.spec())
            except LeaseConflict as error:
                log.debug("Lease %s: %s; reading it again", self.lease, error)
                continue
            self._see(written)
            if not self._leading:
                self._floor = takeover_floor(previous, self.identity)
            return True
        log.info("Lease %s: %d conflicts in a row; trying again later", self.lease,
                 1 + CONFLICT_RETRIES)  # fmt: skip
        return False

    def _see(self, lease: LeaseJSON | None) -> None:
        self._lease = lease
        if lease is None:
            self._observed = None
        else:
            self._observed = observe(self._observed, record_of(lease), self._clock.now())

    async def _release(self) -> None:
        """Give the Lease up, if this elector still holds it; a failure is logged (the others
        then take over once the Lease has lapsed)."""
        lease = self._lease
        try:
            for _ in range(1 + CONFLICT_RETRIES):
                if lease is None:
                    return
                record = release(record_of(lease), identity=self.identity, stamp=self._wall())
                if record is None:
                    return
                try:
                    written = await self._within(
                        self.leases.replace(lease, record.spec()), self.renew_deadline
                    )
                except LeaseConflict:
                    lease = await self._within(
                        self.leases.get(self.namespace, self.name), self.renew_deadline
                    )
                    continue
                self._see(written)
                log.info("Lease %s released by %s", self.lease, self.identity)
                return
        except (KubeError, TimeoutError) as error:
            log.warning("Lease %s: could not release it (%s); the others take over once it "
                        "lapses", self.lease, error)  # fmt: skip

    # --- state and time -----------------------------------------------------------------------

    def _step_up(self) -> None:
        if self._leading:
            return
        self._leading = True
        self._not_leading_event.clear()
        self._leading_event.set()
        log.info("%s leads (Lease %s)", self.identity, self.lease)
        if self._on_started is not None:
            self._on_started()

    def _step_down(self, why: str) -> None:
        if not self._leading:
            return
        self._leading = False
        self._leading_event.clear()
        self._not_leading_event.set()
        log.info("%s stopped leading (Lease %s): %s", self.identity, self.lease, why)
        if self._on_stopped is not None:
            self._on_stopped()

    async def _within(self, work: Awaitable[T], seconds: float) -> T:
        """``work``'s result, or ``TimeoutError`` once ``seconds`` have passed on the clock
        (which a fake clock moves, unlike ``asyncio.timeout``)."""
        task = asyncio.ensure_future(work)
        timer = asyncio.ensure_future(self._clock.sleep(max(0.0, seconds)))
        try:
            await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            task.cancel()
            timer.cancel()
            await asyncio.gather(task, timer, return_exceptions=True)
        if task.cancelled():
            raise TimeoutError(f"Lease {self.lease}: no answer within {seconds:.1f}s")
        return task.result()
