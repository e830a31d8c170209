"""Leader election on a Lease: the pure rules (who may write what, when a Lease has lapsed, the
API's time format), and the elector's timeline on a fake clock over an in-memory Lease API.

``FakeLeases`` answers as the API server does for the three requests the elector makes (a new
``resourceVersion`` per write, 409 when a create finds a Lease or a replace carries an old
version) and can fail or hang on demand, which the real server cannot be made to do. The same
scenarios that it can show, against the real kube-apiserver, are in
``tests/integration/test_leader.py``.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.clock import FakeClock
from tests.support.tasks import leak_check

from podcost_kube.client import KubeError
from podcost_kube.leader import (
    LeaderElector,
    LeaseConflict,
    LeaseJSON,
    LeaseRecord,
    LeaseSpecJSON,
    Observed,
    check_timing,
    claim,
    expired,
    format_micro_time,
    observe,
    parse_time,
    record_of,
    release,
    takeover_floor,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
NS, NAME = "podcost", "podcost-watcher"
LEASE, DEADLINE, RETRY = 15.0, 10.0, 2.0


def at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


# --- the pure rules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimCase:
    name: str
    observed: Observed | None
    now: float
    expected: LeaseRecord | None


MINE = LeaseRecord("me", 15, at(0), at(40), 3)
THEIRS = LeaseRecord("them", 15, at(0), at(40), 3)

CLAIMS = [
    ClaimCase(
        "without a Lease the candidate creates one naming itself, with no transition",
        None, 100.0, LeaseRecord("me", 15, at(100), at(100), 0),
    ),
    ClaimCase(
        "the holder renews its own Lease, keeping when it acquired it and the transitions",
        Observed(MINE, 90.0), 100.0, LeaseRecord("me", 15, at(0), at(100), 3),
    ),
    ClaimCase(
        "a holder renews its own Lease even after it lapsed (nobody took it meanwhile)",
        Observed(MINE, 10.0), 100.0, LeaseRecord("me", 15, at(0), at(100), 3),
    ),
    ClaimCase(
        "someone else's Lease seen changing less than its duration ago is left alone",
        Observed(THEIRS, 86.0), 100.0, None,
    ),
    ClaimCase(
        "someone else's Lease unchanged for its whole duration is taken over, one more transition",
        Observed(THEIRS, 85.0), 100.0, LeaseRecord("me", 15, at(100), at(100), 4),
    ),
    ClaimCase(
        "the Lease's own duration counts, not the candidate's",
        Observed(LeaseRecord("them", 60, at(0), at(40), 3), 85.0), 100.0, None,
    ),
    ClaimCase(
        "a Lease without a duration lapses after the candidate's",
        Observed(LeaseRecord("them", 0, None, None, 0), 85.0), 100.0,
        LeaseRecord("me", 15, at(100), at(100), 1),
    ),
    ClaimCase(
        "a released Lease (no holder) is taken at once, one more transition",
        Observed(LeaseRecord("", 1, at(99), at(99), 3), 99.5), 100.0,
        LeaseRecord("me", 15, at(100), at(100), 4),
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CLAIMS, ids=[case.name for case in CLAIMS])
def test_what_a_candidate_writes_to_lead(case: ClaimCase) -> None:
    got = claim(case.observed, identity="me", duration=15, stamp=at(case.now), now=case.now)
    assert got == case.expected


def test_the_time_a_record_was_first_seen_moves_only_when_the_record_changes() -> None:
    first = observe(None, THEIRS, 10.0)
    assert first == Observed(THEIRS, 10.0)
    assert observe(first, THEIRS, 14.0) is first
    renewed = LeaseRecord("them", 15, at(0), at(44), 3)
    assert observe(first, renewed, 16.0) == Observed(renewed, 16.0)


def test_a_lease_lapses_exactly_its_duration_after_it_was_last_seen_changing() -> None:
    seen = Observed(THEIRS, 10.0)
    assert not expired(seen, 24.999, default_duration=99)
    assert expired(seen, 25.0, default_duration=99)


def test_releasing_clears_the_holder_keeps_the_transitions_and_shortens_the_duration() -> None:
    assert release(MINE, identity="me", stamp=at(50)) == LeaseRecord("", 1, at(50), at(50), 3)


def test_a_new_leader_stamps_after_all_the_last_holder_could_have_stamped() -> None:
    held = LeaseRecord("a", 15, at(0), at(30), 2)
    # A lapsed holder acted until at most its renewTime plus its lease duration, on its clock.
    assert takeover_floor(held, "b") == at(45).timestamp()
    # One that released the Lease had stopped acting before it wrote the release.
    assert takeover_floor(LeaseRecord("", 1, at(9), at(9), 2), "b") == at(9).timestamp()
    # Nothing to order after: no Lease, its own Lease, a record without a renewTime.
    assert takeover_floor(None, "b") == 0.0
    assert takeover_floor(held, "a") == 0.0
    assert takeover_floor(LeaseRecord("a", 15), "b") == 0.0


def test_a_lease_someone_else_holds_is_not_released() -> None:
    assert release(THEIRS, identity="me", stamp=at(50)) is None


@pytest.mark.parametrize(
    ("lease", "deadline", "retry", "culprit"),
    [
        (15, 10, 0, "retry_period"),
        (15, 10, -1, "retry_period"),
        (15, 2.4, 2, "renew_deadline"),
        (10, 10, 2, "lease_duration"),
        (9, 10, 2, "lease_duration"),
    ],
)
def test_timings_that_would_let_two_lead_at_once_are_refused_naming_the_culprit(
    lease: float, deadline: float, retry: float, culprit: str
) -> None:
    with pytest.raises(ValueError, match=f"^{culprit}"):
        check_timing(lease, deadline, retry)


def test_client_gos_default_timings_are_accepted() -> None:
    check_timing(15, 10, 2)


def test_lease_times_are_written_in_utc_with_exactly_six_fractional_digits() -> None:
    assert format_micro_time(at(0)) == "2026-01-01T00:00:00.000000Z"
    two_hours_east = timezone(timedelta(hours=2))
    when = datetime(2026, 1, 1, 2, 0, 0, 5, tzinfo=two_hours_east)
    assert format_micro_time(when) == "2026-01-01T00:00:00.000005Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        format_micro_time(datetime(2026, 1, 1))


def test_lease_times_are_read_in_every_form_the_api_and_the_client_write() -> None:
    expected = datetime(2026, 1, 1, 0, 0, 1, 500000, tzinfo=UTC)
    assert parse_time("2026-01-01T00:00:01.500000Z") == expected
    assert parse_time("2026-01-01T00:00:01.500000+00:00") == expected
    assert parse_time("2026-01-01T01:00:01.5+01:00") == expected
    assert parse_time("not a time") is None
    assert parse_time(None) is None


def test_a_lease_without_a_spec_reads_as_held_by_nobody() -> None:
    assert record_of({"metadata": {"name": NAME}}) == LeaseRecord()
    assert record_of({"spec": {"leaseDurationSeconds": "15"}}) == LeaseRecord()


micro_times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@given(
    holder=st.text(min_size=0, max_size=30),
    duration=st.integers(min_value=1, max_value=3600),
    acquired=micro_times,
    renewed=micro_times,
    transitions=st.integers(min_value=0, max_value=10**6),
)
def test_every_record_reads_back_as_it_was_written(
    holder: str, duration: int, acquired: datetime, renewed: datetime, transitions: int
) -> None:
    record = LeaseRecord(holder, duration, acquired, renewed, transitions)
    assert record_of({"spec": record.spec()}) == record


# --- the elector on a fake clock ---------------------------------------------------------------


class FakeLeases:
    """Leases in memory, answering as the API server does; ``failures`` scripts errors for the
    next requests, ``hang`` makes every request wait until it is cancelled."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], LeaseJSON] = {}
        self.failures: deque[KubeError] = deque()
        self.failing: KubeError | None = None
        self.hang = False
        self.requests: list[str] = []
        self._versions = itertools.count(1)

    def record(self) -> LeaseRecord:
        return record_of(self.leases[(NS, NAME)])

    def write_behind_its_back(self, spec: LeaseSpecJSON | None = None) -> None:
        """Another writer: a new resourceVersion (a label, say), or a whole new spec."""
        lease = self.leases[(NS, NAME)]
        lease["metadata"]["resourceVersion"] = str(next(self._versions))
        if spec is not None:
            lease["spec"] = spec

    async def _answer(self, request: str) -> None:
        self.requests.append(request)
        if self.hang:
            await asyncio.get_running_loop().create_future()
        if self.failures:
            raise self.failures.popleft()
        if self.failing is not None:
            raise self.failing

    async def get(self, namespace: str, name: str) -> LeaseJSON | None:
        await self._answer("get")
        lease = self.leases.get((namespace, name))
        return copy.deepcopy(lease) if lease is not None else None

    async def create(self, namespace: str, name: str, spec: LeaseSpecJSON) -> LeaseJSON:
        await self._answer("create")
        if (namespace, name) in self.leases:
            raise LeaseConflict("already exists", status=409, retriable=True)
        meta = {"name": name, "namespace": namespace, "resourceVersion": str(next(self._versions))}
        self.leases[(namespace, name)] = {"metadata": meta, "spec": copy.deepcopy(spec)}
        return copy.deepcopy(self.leases[(namespace, name)])

    async def replace(self, lease: LeaseJSON, spec: LeaseSpecJSON) -> LeaseJSON:
        await self._answer("replace")
        meta = lease["metadata"]
        key = (meta["namespace"], meta["name"])
        current = self.leases.get(key)
        if current is None or current["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            raise LeaseConflict("changed since it was read", status=409, retriable=True)
        current["metadata"]["resourceVersion"] = str(next(self._versions))
        current["spec"] = copy.deepcopy(spec)
        return copy.deepcopy(current)


@dataclass
class Candidate:
    """One elector running in a task, with what its callbacks saw."""

    elector: LeaderElector
    task: asyncio.Task[None]
    events: list[tuple[float, str, str | None]]
    """(time, "started" or "stopped", the Lease's holder in the API at that moment)."""

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


class Election:
    """Candidates for one Lease in ``FakeLeases``, on one ``FakeClock``."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.leases = FakeLeases()
        self.candidates: list[Candidate] = []

    def start(self, identity: str, **options: Any) -> Candidate:
        events: list[tuple[float, str, str | None]] = []

        def note(what: str) -> Callable[[], None]:
            def callback() -> None:
                lease = self.leases.leases.get((NS, NAME))
                holder = record_of(lease).holder if lease is not None else None
                events.append((self.clock.now(), what, holder))

            return callback

        elector = LeaderElector(
            self.leases,
            NAME,
            NS,
            identity,
            lease_duration=LEASE,
            renew_deadline=DEADLINE,
            retry_period=RETRY,
            on_started_leading=note("started"),
            on_stopped_leading=note("stopped"),
            clock=self.clock,
            wall=options.pop("wall", lambda: at(self.clock.now())),
            rng=lambda: 0.0,  # candidates retry every RETRY seconds exactly
            **options,
        )
        task = asyncio.create_task(elector.run(), name=f"elector-{identity}")
        candidate = Candidate(elector, task, events)
        self.candidates.append(candidate)
        return candidate

    async def until(self, when: float) -> None:
        await self.clock.advance_to(when)


@pytest.fixture
async def election() -> AsyncIterator[Election]:
    async with leak_check():
        election = Election()
        try:
            yield election
        finally:
            # Let the API answer again, so that a leader's release does not wait on the clock.
            election.leases.hang, election.leases.failing = False, None
            election.leases.failures.clear()
            for candidate in election.candidates:
                await candidate.stop()


async def test_a_lone_candidate_creates_the_lease_leads_at_once_and_renews_every_retry_period(
    election: Election,
) -> None:
    a = election.start("a")
    await election.until(0)
    assert a.elector.is_leader
    assert a.events == [(0, "started", "a")]
    await asyncio.wait_for(a.elector.wait_leading(), timeout=1)
    assert election.leases.record() == LeaseRecord("a", 15, at(0), at(0), 0)
    await election.until(2 * RETRY)
    assert election.leases.record() == LeaseRecord("a", 15, at(0), at(2 * RETRY), 0)
    # A leader renews the Lease as it wrote it: one write per period, no read.
    assert election.leases.requests == ["get", "create", "replace", "replace"]


async def test_a_second_candidate_stands_by_while_the_leader_renews(
    election: Election,
) -> None:
    a = election.start("a")
    await election.until(0)
    b = election.start("b")
    await election.until(60)
    assert a.elector.is_leader
    assert not b.elector.is_leader
    assert b.elector.holder == "a"
    assert b.events == []


async def test_a_leader_that_stops_renewing_is_replaced_a_lease_duration_after_its_last_renewal(
    election: Election,
) -> None:
    a = election.start("a", release_on_cancel=False)
    await election.until(0)
    b = election.start("b")  # tries at 0, 2, 4, ...
    await election.until(30)  # a renewed at 30; b saw that renewal at 30
    await a.stop()
    await election.until(30 + LEASE - 0.001)
    assert not b.elector.is_leader
    # The Lease lapsed at 45; b's first try after that is at 46.
    await election.until(46)
    assert b.elector.is_leader
    assert election.leases.record() == LeaseRecord("b", 15, at(46), at(46), 1)
    assert a.events == [(0, "started", "a"), (30, "stopped", "a")]


async def test_a_leader_stopped_cleanly_releases_the_lease_and_the_other_takes_it_at_its_next_try(
    election: Election,
) -> None:
    a = election.start("a")
    await election.until(0)
    b = election.start("b")
    await election.until(9)
    await a.stop()
    # a stopped acting before it let go: its callback still saw it holding the Lease.
    assert a.events == [(0, "started", "a"), (9, "stopped", "a")]
    assert election.leases.record() == LeaseRecord("", 1, at(9), at(9), 0)
    await election.until(10)
    assert b.elector.is_leader
    assert election.leases.record() == LeaseRecord("b", 15, at(10), at(10), 1)


async def test_a_new_leader_whose_clock_runs_behind_stamps_after_the_old_leader_all_the_same(
    election: Election,
) -> None:
    # a's wall clock runs 5 s ahead of b's; a renews at 0, 2, ..., 30, then stops renewing.
    a = election.start("a", release_on_cancel=False, wall=lambda: at(election.clock.now() + 5))
    await election.until(0)
    assert a.elector.floor == 0.0  # it created the Lease: nobody before it
    b = election.start("b")
    await election.until(30)
    await a.stop()
    await election.until(46)
    assert b.elector.is_leader
    # a stamped at most until its last renewTime (35 on its clock) plus its lease duration;
    # b's own clock says 46, which is less than that 50: b stamps from 50.
    assert b.elector.floor == at(30 + 5 + LEASE).timestamp()


async def test_after_a_clean_handover_the_new_leader_stamps_after_the_release(
    election: Election,
) -> None:
    a = election.start("a", wall=lambda: at(election.clock.now() + 5))
    await election.until(0)
    b = election.start("b")
    await election.until(9)
    await a.stop()  # released at 9, written as 14 by a's clock
    await election.until(10)
    assert b.elector.is_leader
    assert b.elector.floor == at(14).timestamp()
    # Renewing its own Lease keeps the floor it took over with.
    await election.until(20)
    assert b.elector.floor == at(14).timestamp()


async def test_a_leader_that_cannot_renew_steps_down_at_the_renew_deadline_and_leads_again_later(
    election: Election,
) -> None:
    a = election.start("a")
    await election.until(RETRY)  # renewed at 2
    election.leases.failing = KubeError("HTTP 503", status=503, retriable=True)
    await election.until(RETRY + DEADLINE - 0.001)
    assert a.elector.is_leader
    await election.until(RETRY + DEADLINE)
    # Stepped down at 12: before anyone could take over (not before 2 + LEASE = 17).
    assert not a.elector.is_leader
    assert a.events == [(0, "started", "a"), (RETRY + DEADLINE, "stopped", "a")]
    # Since its first failed request, what the watcher's readiness reads as an outage.
    assert 0 < a.elector.failing_for() <= DEADLINE
    election.leases.failing = None
    # Nobody took the Lease meanwhile: it is still a's, which a renews at its next try.
    await election.until(RETRY + DEADLINE + RETRY)
    assert a.elector.is_leader
    assert a.elector.failing_for() == 0
    assert election.leases.record() == LeaseRecord("a", 15, at(0), at(14), 0)


async def test_a_renewal_that_gets_no_answer_counts_against_the_renew_deadline(
    election: Election,
) -> None:
    a = election.start("a")
    await election.until(RETRY)
    election.leases.hang = True
    await election.until(RETRY + DEADLINE - 0.001)
    assert a.elector.is_leader
    await election.until(RETRY + DEADLINE)
    assert not a.elector.is_leader
    await asyncio.wait_for(a.elector.wait_not_leading(), timeout=1)


async def test_a_renewal_that_meets_a_conflict_reads_the_lease_again_and_renews_at_once(
    election: Election,
) -> None:
    a = election.start("a")
    await election.until(0)
    election.leases.write_behind_its_back()
    await election.until(RETRY)
    assert a.elector.is_leader
    assert election.leases.record().renewed == at(RETRY)
    assert election.leases.requests[2:] == ["replace", "get", "replace"]


async def test_a_leader_that_finds_someone_else_holding_the_lease_steps_down_at_once(
    election: Election,
) -> None:
    a = election.start("a")
    await election.until(0)
    election.leases.write_behind_its_back(LeaseRecord("z", 15, at(1), at(1), 1).spec())
    await election.until(RETRY)
    assert not a.elector.is_leader
    assert a.events == [(0, "started", "a"), (RETRY, "stopped", "z")]
    assert a.elector.holder == "z"


async def test_two_candidates_starting_together_elect_exactly_one(election: Election) -> None:
    a, b = election.start("a"), election.start("b")
    await election.until(60)
    assert [a.elector.is_leader, b.elector.is_leader].count(True) == 1
    assert election.leases.record().transitions == 0


async def test_a_permanent_error_ends_the_run_with_it(election: Election) -> None:
    election.leases.failures.append(KubeError("HTTP 403 Forbidden", status=403))
    a = election.start("a")
    await election.until(0)
    assert a.task.done()
    with pytest.raises(KubeError, match="403"):
        a.task.result()
    assert not a.elector.is_leader


async def test_a_standby_stopped_writes_nothing(election: Election) -> None:
    election.start("a")
    await election.until(0)
    b = election.start("b")
    await election.until(1)
    writes = len(election.leases.requests)
    await b.stop()
    assert len(election.leases.requests) == writes
    assert election.leases.record().holder == "a"


@pytest.mark.parametrize(
    ("identity", "options", "message"),
    [
        ("", {}, "identity"),
        ("a", {"lease_duration": 5.0}, "lease_duration"),
        ("a", {"retry_period": 9.0}, "renew_deadline"),
    ],
)
def test_an_elector_with_no_identity_or_unsafe_timings_is_refused(
    identity: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LeaderElector(FakeLeases(), NAME, NS, identity, **options)
