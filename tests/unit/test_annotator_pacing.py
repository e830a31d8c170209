"""The annotator's pacing on a fake timeline: the token bucket's burst and rate (and its hold
after a 429), the water marks' hysteresis, the retry backoff with ``Retry-After``, and how long
an API server outage lasts before readiness reports it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podcost.annotator.pacing import Flow, Outage, TokenBucket, WaterMarks


def start_times(bucket: TokenBucket, arrivals: list[float]) -> list[float]:
    """When each request may go, if each arrives at the given time and reserves then."""
    return [now + bucket.reserve(now) for now in arrivals]


def test_a_full_bucket_lets_the_burst_go_at_once_then_spaces_requests_by_the_rate() -> None:
    bucket = TokenBucket(rate=20, burst=40)
    starts = start_times(bucket, [0.0] * 60)
    assert starts[:40] == [0.0] * 40
    assert starts[40:] == pytest.approx([0.05 * n for n in range(1, 21)])


def test_a_quiet_spell_refills_the_bucket_up_to_the_burst_only() -> None:
    bucket = TokenBucket(rate=10, burst=5)
    start_times(bucket, [0.0] * 5)
    assert bucket.available(0.0) == 0
    assert bucket.available(0.3) == pytest.approx(3)
    assert bucket.available(100.0) == 5


@given(
    rate=st.floats(0.5, 200),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0, 0.5), min_size=1, max_size=200),
)
def test_no_window_ever_sees_more_than_burst_plus_rate_times_its_length(
    rate: float, burst: int, gaps: list[float]
) -> None:
    bucket = TokenBucket(rate=rate, burst=burst)
    arrivals, now = [], 0.0
    for gap in gaps:
        now += gap
        arrivals.append(now)
    starts = start_times(bucket, arrivals)
    assert all(start >= arrival for start, arrival in zip(starts, arrivals, strict=True))
    starts.sort()
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= burst + rate * (starts[j] - first) + 1e-6


def test_a_hold_delays_every_request_until_it_ends_and_then_allows_no_burst() -> None:
    bucket = TokenBucket(rate=10, burst=40)
    bucket.hold(until=2.0)
    starts = start_times(bucket, [0.5, 0.5, 0.5, 3.0])
    assert starts[:3] == pytest.approx([2.0, 2.1, 2.2])
    assert starts[3] == pytest.approx(3.0)  # refilled at the rate since the hold ended


def test_a_hold_that_ended_already_changes_nothing() -> None:
    bucket = TokenBucket(rate=10, burst=2)
    bucket.reserve(5.0)
    bucket.hold(until=1.0)
    assert bucket.reserve(5.0) == 0.0


@pytest.mark.parametrize(
    ("rate", "burst"), [(0, 1), (-1, 1), (float("inf"), 1), (float("nan"), 1), (1, 0)]
)
def test_a_bucket_refuses_a_rate_or_burst_it_cannot_honour(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        TokenBucket(rate=rate, burst=burst)


def test_water_marks_pause_at_the_high_mark_and_resume_only_at_the_low_one() -> None:
    marks = WaterMarks(high=10, low=4)
    depths = [0, 5, 9, 10, 12, 8, 5, 4, 3, 9, 10]
    flows = [marks.observe(depth) for depth in depths]
    assert flows == [None, None, None, Flow.PAUSE, None, None, None, Flow.RESUME, None, None,
                     Flow.PAUSE]  # fmt: skip
    assert (marks.pauses, marks.resumes, marks.deepest, marks.paused) == (2, 1, 12, True)


@pytest.mark.parametrize(("high", "low"), [(5, 5), (5, 6), (5, -1)])
def test_water_marks_need_the_low_mark_below_the_high_one(high: int, low: int) -> None:
    with pytest.raises(ValueError, match="low < high"):
        WaterMarks(high=high, low=low)


def test_an_outage_counts_from_its_first_failure_until_the_next_answer() -> None:
    outage = Outage(after=10.0)
    assert not outage.down(0.0)
    outage.failed(100.0)
    outage.failed(105.0)  # later failures do not move its start
    assert (outage.down(109.9), outage.down(110.0), outage.lasted(110.0)) == (False, True, 10.0)
    outage.reported = True
    assert outage.answered(112.5) == 12.5
    assert (outage.since, outage.reported, outage.down(200.0)) == (None, False, False)


def test_an_answer_after_a_blip_that_was_never_reported_is_no_outage_to_report() -> None:
    outage = Outage(after=10.0)
    outage.failed(1.0)
    assert outage.answered(2.0) is None
    assert outage.lasted(3.0) == 0.0
