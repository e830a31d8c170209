"""Per-strategy normalization of raw scores to integers in [0, MAX_SCORE], as the combiner needs.

Raw scores of different strategies have different units (levels, prices, seconds, counts); summing
them raw would let whichever has the biggest numbers win. Like kube-scheduler's
``NormalizeScore``, every strategy's raw scores are first mapped to integers in [0, 100], then
weighted. Called by ``podcost_core.combine`` (and by a plugin that wants the default behaviour
inside its own normalization).

The rule (table-tested in ``tests/unit/test_normalize.py``):

- Without a threshold: min-max over the workload. The lowest raw score maps to 0, the highest to
  100, linearly in between, rounded half up. If every score is equal (all zero included) all map
  to 0: a strategy that cannot tell the pods apart contributes nothing, which also keeps the
  per-pod breakdown honest (no phantom points).
- With a threshold *t* (the KEP's cap, *t* > 0): raw scores above *t* count as *t*, and the scale
  is fixed to [min(0, lowest), *t*] instead of the observed range. For a strategy whose scores are
  non-negative, a pod's normalized value then depends on its own score alone, not on the other
  pods, so adding or deleting a pod does not shift everybody's cost (the KEP's reason for the
  threshold); a workload where every score reaches *t* maps to 100 everywhere.

The mapping is monotone (a higher raw score never gets a lower value); distinct raw scores closer
than 1/100 of the range may share a value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

MAX_SCORE = 100
MIN_SCORE = 0

K = TypeVar("K")


def normalize(values: Sequence[float], threshold: float | None = None) -> list[int]:
    """Raw scores to ints in [0, MAX_SCORE] by the module's rule; ``ValueError`` on NaN/inf."""
    scaled = scale(values, threshold)
    if scaled is None:
        return [MIN_SCORE] * len(values)
    values, low, factor = scaled
    # floor(x + 0.5): round half up; math.floor is cheaper than round() and int(). Never above
    # 100, because (high - low) * factor rounds to at most 100.0000000001.
    floor = math.floor
    return [floor((value - low) * factor + 0.5) for value in values]


def scale(
    values: Sequence[float], threshold: float | None = None
) -> tuple[Sequence[float], float, float] | None:
    """The module's rule as an affine map, for callers that fuse it with more work.

    Returns ``(values', low, factor)`` such that the normalized score of each value is
    ``floor((v' - low) * factor + 0.5)`` for the matching ``v'``, or ``None`` when every score
    normalizes to 0. ``values'`` is ``values`` itself unless capping or scaling was needed.
    """
    if not values:
        return None
    # A finite sum proves every value finite (NaN and inf propagate) at a third of the cost of
    # testing each; only a huge but finite sum that overflows needs the value-by-value test.
    if not math.isfinite(sum(values)) and not all(map(math.isfinite, values)):
        raise ValueError("raw scores must be finite numbers")
    # Both ends from one sort: a list of floats sorts with a float-only comparison, which costs
    # less than the generic comparisons of min() and max() together.
    ordered = sorted(values)
    lowest, highest = ordered[0], ordered[-1]
    if threshold is not None:
        if not (math.isfinite(threshold) and threshold > 0.0):
            raise ValueError(f"threshold must be a positive finite number, got {threshold!r}")
        if highest > threshold:
            values = [value if value < threshold else threshold for value in values]
            lowest = lowest if lowest < threshold else threshold
        low, high = min(0.0, lowest), threshold
    else:
        low, high = lowest, highest
        if low == high:
            return None
    if not math.isfinite(high - low):
        # Scores near ±1.8e308 overflow the span; halving everything keeps the proportions.
        values = [value * 0.5 for value in values]
        low, high = low * 0.5, high * 0.5
    elif not math.isfinite(MAX_SCORE / (high - low)):
        # A subnormal span (scores within 1e-308 of each other near 0) overflows the factor;
        # scaling by a power of two is exact.
        values = [value * _UP for value in values]
        low, high = low * _UP, high * _UP
    return values, low, MAX_SCORE / (high - low)


_UP = 2.0**600


def normalize_scores(scores: Mapping[K, float], threshold: float | None = None) -> dict[K, int]:
    """:func:`normalize` over a mapping, keeping its keys."""
    return dict(zip(scores, normalize(list(scores.values()), threshold), strict=True))


def in_range(values: Sequence[int]) -> bool:
    """Whether every value is an ``int`` in [MIN_SCORE, MAX_SCORE]; what the combiner checks."""
    return all(type(value) is int and MIN_SCORE <= value <= MAX_SCORE for value in values)
