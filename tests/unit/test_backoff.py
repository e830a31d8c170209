"""The one retry policy (``podcost_core.backoff``): capped exponential backoff with full jitter,
a server's ``Retry-After`` as a floor, and a number of failures to give up after; and that every
retry of podcost waits by it, configured once per process (``ServiceSettings.backoff``)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podcost.runtime.settings import ServiceSettings
from podcost_core.backoff import Backoff

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 0.2), (2, 0.4), (3, 0.8), (6, 6.4), (7, 10.0), (50, 10.0), (10_000, 10.0)],
)
def test_the_ceiling_doubles_up_to_the_maximum(attempt: int, ceiling: float) -> None:
    assert Backoff(0.2, 10.0).ceiling(attempt) == pytest.approx(ceiling)


@pytest.mark.parametrize(("drawn", "delay"), [(0.0, 0.0), (0.5, 0.4), (0.999, 0.7992)])
def test_the_wait_is_drawn_uniformly_below_the_ceiling(drawn: float, delay: float) -> None:
    assert Backoff(0.2, 10.0).delay(3, lambda: drawn) == pytest.approx(delay)


@pytest.mark.parametrize(
    ("drawn", "retry_after", "delay"), [(0.1, 3.0, 3.0), (0.5, None, 0.1), (0.5, 0.0, 0.1)]
)
def test_a_longer_retry_after_from_the_server_wins(
    drawn: float, retry_after: float | None, delay: float
) -> None:
    assert Backoff(0.2, 10.0).delay(1, lambda: drawn, at_least=retry_after) == pytest.approx(delay)


@given(
    attempt=st.integers(min_value=1, max_value=100_000),
    initial=st.floats(min_value=0.001, max_value=10),
    growth=st.floats(min_value=1, max_value=1000),
    seed=st.integers(),
)
def test_every_wait_is_between_zero_and_the_cap(
    attempt: int, initial: float, growth: float, seed: int
) -> None:
    backoff = Backoff(initial, initial * growth)
    delay = backoff.delay(attempt, random.Random(seed).random)
    assert 0 <= delay <= backoff.maximum_seconds
    assert math.isfinite(delay)


def test_clients_that_failed_together_do_not_retry_in_step() -> None:
    # Full jitter: a hundred clients' tenth waits spread over the whole [0, cap) range.
    backoff = Backoff(0.2, 10.0)
    rng = random.Random(7)
    waits = sorted(backoff.delay(10, rng.random) for _ in range(100))
    assert waits[0] < 1.0
    assert waits[-1] > 9.0
    assert len({round(w, 3) for w in waits}) > 90


def test_the_backoff_gives_up_after_max_failures_unless_told_never_to() -> None:
    assert not Backoff(max_failures=3).exhausted(2)
    assert Backoff(max_failures=3).exhausted(3)
    assert not Backoff().exhausted(10_000)
    assert Backoff(0.5, 5.0).giving_up_after(2) == Backoff(0.5, 5.0, max_failures=2)


@pytest.mark.parametrize(
    "bad",
    [
        {"initial_seconds": 0},
        {"initial_seconds": 2, "maximum_seconds": 1},
        {"factor": 0.5},
        {"max_failures": 0},
    ],
)
def test_an_incoherent_backoff_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**bad)  # type: ignore[arg-type]


def test_attempts_are_counted_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        Backoff().ceiling(0)


def test_a_random_source_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="random source"):
        Backoff().delay(1, lambda: 1.5)


def test_the_process_configures_the_policy_once_from_its_settings() -> None:
    settings = ServiceSettings(retry_initial_seconds=0.5, retry_max_seconds=30.0)
    assert settings.backoff() == Backoff(0.5, 30.0)
    assert ServiceSettings().backoff() == Backoff()  # the defaults agree


def test_no_other_backoff_is_written_anywhere() -> None:
    # The bus retries, the informers and the annotator all wait by podcost_core.backoff.
    sources = [*ROOT.glob("libs/*/**/*.py"), *ROOT.glob("services/**/*.py")]
    others = [
        str(path.relative_to(ROOT))
        for path in sources
        if path.name != "backoff.py"
        and any(
            marker in path.read_text()
            for marker in ("class Backoff", "def backoff_delay", "2.0 ** (attempt", "factor **")
        )
    ]
    assert others == []
