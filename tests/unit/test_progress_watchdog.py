"""The progress watchdog's decision (``podcost_core.progress``)."""

from __future__ import annotations

from podcost_core.progress import Progress, progress_verdict


def verdict(now: float, **kwargs: object) -> Progress:
    args: dict[str, object] = {
        "began": 0.0,
        "started": True,
        "last_progress": None,
        "lag": 0,
        "stall_s": 60.0,
        "start_s": 120.0,
    }
    args.update(kwargs)
    return progress_verdict(now, **args).progress  # type: ignore[arg-type]


def test_an_idle_consumer_with_nothing_to_process_is_fine_forever() -> None:
    assert verdict(10_000.0, last_progress=5.0, lag=0) is Progress.OK
    assert verdict(10_000.0, last_progress=5.0, lag=None) is Progress.OK


def test_lag_without_progress_is_not_ready_from_half_the_bound_then_exits() -> None:
    assert verdict(129.0, last_progress=100.0, lag=3) is Progress.OK
    assert verdict(130.0, last_progress=100.0, lag=3) is Progress.NOT_READY
    assert verdict(159.0, last_progress=100.0, lag=3) is Progress.NOT_READY
    assert verdict(160.0, last_progress=100.0, lag=3) is Progress.EXIT


def test_progress_resets_the_stall() -> None:
    assert verdict(160.0, last_progress=159.0, lag=3) is Progress.OK


def test_records_arriving_after_a_long_idle_time_are_no_stall_until_they_waited() -> None:
    assert verdict(10_000.0, last_progress=5.0, lag=3, behind_since=9_999.0) is Progress.OK
    assert verdict(10_028.0, last_progress=5.0, lag=3, behind_since=9_999.0) is Progress.OK
    assert verdict(10_029.0, last_progress=5.0, lag=3, behind_since=9_999.0) is Progress.NOT_READY
    assert verdict(10_059.0, last_progress=5.0, lag=3, behind_since=9_999.0) is Progress.EXIT
    # Progress while behind restarts the count.
    assert verdict(10_059.0, last_progress=10_050.0, lag=3, behind_since=9_999.0) is Progress.OK


def test_the_stall_counts_from_the_start_when_nothing_ever_progressed() -> None:
    assert verdict(59.0, began=0.0, last_progress=None, lag=5) is Progress.NOT_READY
    assert verdict(60.0, began=0.0, last_progress=None, lag=5) is Progress.EXIT
    # Progress from before a restart of the watch (began later) does not count against it.
    assert verdict(60.0, began=50.0, last_progress=1.0, lag=5) is Progress.OK


def test_a_start_that_does_not_complete_exits_after_its_bound() -> None:
    assert verdict(59.0, started=False, lag=None) is Progress.OK
    assert verdict(60.0, started=False, lag=None) is Progress.NOT_READY
    assert verdict(120.0, started=False, lag=None) is Progress.EXIT


def test_a_long_start_that_progresses_goes_on() -> None:
    # A table recovery in the start-up: each changelog record applied is progress.
    assert verdict(1_000.0, started=False, last_progress=990.0) is Progress.OK
    assert verdict(1_120.0, started=False, last_progress=1_000.0) is Progress.EXIT


def test_a_started_consumer_unable_to_process_exits_after_the_start_bound_from_then() -> None:
    # Idle for hours, then unsettled (a rebalance, metadata lost): counted from then.
    assert verdict(10_000.0, last_progress=5.0, unsettled_since=9_990.0) is Progress.OK
    assert verdict(10_050.0, last_progress=5.0, unsettled_since=9_990.0) is Progress.NOT_READY
    assert verdict(10_110.0, last_progress=5.0, unsettled_since=9_990.0) is Progress.EXIT
    # A recovery that progresses keeps it going.
    assert verdict(10_110.0, last_progress=10_100.0, unsettled_since=9_990.0) is Progress.OK


def test_the_stall_nearest_its_bound_decides() -> None:
    kwargs: dict[str, object] = {"last_progress": 0.0, "unsettled_since": 0.0, "lag": 2}
    assert verdict(60.0, **kwargs) is Progress.EXIT  # the lag's 60 s, before the start's 120 s
    assert verdict(60.0, **{**kwargs, "lag": 0}) is Progress.NOT_READY


def test_the_reason_is_one_line_naming_the_lag_and_the_limit() -> None:
    result = progress_verdict(
        200.0, began=0.0, started=True, last_progress=100.0, lag=7, stall_s=60.0, start_s=120.0
    )
    assert result.progress is Progress.EXIT
    assert result.reason == "7 records to process and none processed for 100s (limit 60s)"
    assert "\n" not in result.reason
