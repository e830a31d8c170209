"""Normalization of raw strategy scores to ints in [0, 100]: the table, the cap, the properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.unit.snapshots import PROPERTY

from podcost_core.normalize import MAX_SCORE, in_range, normalize, normalize_scores, scale

finite = st.floats(allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize(
    ("values", "threshold", "expected"),
    [
        pytest.param([], None, [], id="no pods"),
        pytest.param([0.0, 0.0, 0.0], None, [0, 0, 0], id="all zero maps to zero"),
        pytest.param([7.5, 7.5], None, [0, 0], id="all equal maps to zero"),
        pytest.param([-3.0], None, [0], id="a single pod maps to zero"),
        pytest.param([0.0, 10.0], None, [0, 100], id="lowest 0 highest 100"),
        pytest.param([0.0, 5.0, 10.0], None, [0, 50, 100], id="linear in between"),
        pytest.param([-4.0, -2.0, 0.0], None, [0, 50, 100], id="negative scores"),
        pytest.param([0.0, 1.0, 200.0], None, [0, 1, 100], id="half rounds up"),
        pytest.param([0.0, 0.004, 1.0], None, [0, 0, 100], id="close values may share a score"),
        pytest.param([1e308, -1e308, 0.0], None, [100, 0, 50], id="a span that overflows"),
        pytest.param([0.0, 50.0, 100.0], 200.0, [0, 25, 50], id="threshold fixes the scale"),
        pytest.param([50.0], 200.0, [25], id="threshold: a pod alone keeps its value"),
        pytest.param([10.0, 300.0, 500.0], 200.0, [5, 100, 100], id="above threshold capped"),
        pytest.param([300.0, 400.0], 200.0, [100, 100], id="all capped maps to max"),
        pytest.param([0.0, 0.0], 5.0, [0, 0], id="threshold and all zero"),
        pytest.param([-100.0, 0.0, 100.0], 100.0, [0, 50, 100], id="threshold: negative low"),
    ],
)
def test_normalize_maps_raw_scores_by_the_table(
    values: list[float], threshold: float | None, expected: list[int]
) -> None:
    assert normalize(values, threshold) == expected


@pytest.mark.parametrize(
    "values", [[1.0, math.nan], [math.inf, 0.0], [-math.inf], [1.0, "x"]], ids=str
)
def test_normalize_rejects_scores_that_are_not_finite_numbers(values: list[float]) -> None:
    with pytest.raises((ValueError, TypeError)):
        normalize(values)


@pytest.mark.parametrize("threshold", [0.0, -1.0, math.nan, math.inf])
def test_normalize_rejects_a_threshold_that_is_not_positive_and_finite(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        normalize([1.0, 2.0], threshold)


def test_normalize_scores_keeps_the_keys() -> None:
    assert normalize_scores({"a": 1.0, "b": 3.0, "c": 2.0}) == {"a": 0, "b": 100, "c": 50}


@pytest.mark.parametrize(
    ("values", "expected"),
    [([], True), ([0, 100, 50], True), ([101], False), ([-1], False), ([1.0], False)],
    ids=str,
)
def test_in_range_accepts_only_ints_from_0_to_100(values: list[int], expected: bool) -> None:
    assert in_range(values) is expected


@PROPERTY
@given(st.lists(finite, max_size=30), st.one_of(st.none(), st.floats(1e-3, 1e6)))
def test_normalized_scores_are_in_range_and_never_reverse_the_raw_order(
    values: list[float], threshold: float | None
) -> None:
    normalized = normalize(values, threshold)
    assert in_range(normalized)
    assert len(normalized) == len(values)
    for raw_a, norm_a in zip(values, normalized, strict=True):
        for raw_b, norm_b in zip(values, normalized, strict=True):
            if raw_a < raw_b:
                assert norm_a <= norm_b


@PROPERTY
@given(st.lists(finite, min_size=2, max_size=30).filter(lambda v: min(v) != max(v)))
def test_without_threshold_the_lowest_maps_to_0_and_the_highest_to_100(
    values: list[float],
) -> None:
    normalized = normalize(values)
    assert normalized[values.index(min(values))] == 0
    assert normalized[values.index(max(values))] == MAX_SCORE


@PROPERTY
@given(st.lists(st.floats(0, 1e6), max_size=20), st.floats(0, 1e6), st.floats(1, 1e6))
def test_with_threshold_a_non_negative_score_does_not_depend_on_the_other_pods(
    others: list[float], mine: float, threshold: float
) -> None:
    assert normalize([mine, *others], threshold)[0] == normalize([mine], threshold)[0]


@PROPERTY
@given(st.lists(finite, max_size=30), st.one_of(st.none(), st.floats(1e-3, 1e6)))
def test_scale_is_the_affine_map_normalize_applies(
    values: list[float], threshold: float | None
) -> None:
    scaled = scale(values, threshold)
    if scaled is None:
        assert normalize(values, threshold) == [0] * len(values)
    else:
        mapped, low, factor = scaled
        expected = [math.floor((value - low) * factor + 0.5) for value in mapped]
        assert normalize(values, threshold) == expected


@PROPERTY
@given(
    st.lists(st.floats(-1e6, 1e6), max_size=30),
    st.one_of(st.none(), st.floats(1e-3, 1e6)),
)
@example([0.0, 2.2250738585072014e-308], None)
@example([0.0, -2.2250738585072014e-308], None)
def test_normalize_is_the_rule_written_out_with_min_and_max(
    values: list[float], threshold: float | None
) -> None:
    if threshold is not None:
        values_ = [value if value < threshold else threshold for value in values]
        low, high = min([0.0, *values_]), threshold
    else:
        values_ = values
        low, high = min(values, default=0.0), max(values, default=0.0)
    if not values or (threshold is None and low == high):
        expected = [0] * len(values)
    else:
        if not math.isfinite(MAX_SCORE / (high - low)):
            # A subnormal span (scores within 1e-308 of each other): the same proportions, scaled
            # by a power of two (exact), so the factor is finite.
            up = 2.0**600
            values_, low, high = [value * up for value in values_], low * up, high * up
        factor = MAX_SCORE / (high - low)
        expected = [math.floor((value - low) * factor + 0.5) for value in values_]
    assert normalize(values, threshold) == expected
