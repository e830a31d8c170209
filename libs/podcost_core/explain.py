"""Explaining one pod's cost: its terms, its tier sums and its place in the combined order.

The aggregator publishes, with every pod's cost, each strategy's term of it (normalized score,
weight, tier, raw score). From those terms alone the combined order can be told again: a pod's
tier sums (Σ weight · normalized per tier, dominant tier first) are what the combiner sorted the
pods by (``podcost_core.combine``), so its place among the other pods of the same decision
follows. Callers: the annotator's decision log (``podcost.annotator.decisions``), which keeps
the last decision per pod for ``podcost explain``, and ``podcost explain`` itself when it reads a
decision from the costs topic or computes one now. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


class TermLike(Protocol):
    """What a strategy's term of a cost carries (``combine.Contribution``, the message's
    ``StrategyTerm``)."""

    @property
    def tier(self) -> int: ...

    @property
    def weight(self) -> int: ...

    @property
    def normalized(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod stands in the combined deletion order of its decision."""

    position: int
    """1 = among the first to be deleted; pods tied with it share its position."""
    tied: int
    """How many other pods have exactly its tier sums (the controller picks among them)."""
    of: int
    """How many pods the decision ranked."""

    def describe(self) -> str:
        """E.g. ``3rd of 12 to be deleted (tied with 1 other)``."""
        ties = ""
        if self.tied:
            ties = f" (tied with {self.tied} other{'s' if self.tied > 1 else ''})"
        return f"{ordinal(self.position)} of {self.of} to be deleted{ties}"


def ordinal(number: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``21st`` ..."""
    if 10 <= number % 100 <= 20:
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def tier_sums(terms: Iterable[TermLike], tiers: Iterable[int] | None = None) -> tuple[int, ...]:
    """Σ weight · normalized per tier, dominant (lowest-numbered) tier first.

    ``tiers``: the tiers to report (default: those of ``terms``); a tier without a term sums 0,
    so pods of one decision compare tier by tier even if one lacks a term.
    """
    sums: dict[int, int] = {}
    for term in terms:
        sums[term.tier] = sums.get(term.tier, 0) + term.weight * term.normalized
    every = sorted(set(tiers) | set(sums)) if tiers is not None else sorted(sums)
    return tuple(sums.get(tier, 0) for tier in every)


def placements(sums: Mapping[K, tuple[int, ...]]) -> dict[K, Placement]:
    """Every pod's :class:`Placement`, from every pod's tier sums in one decision.

    Ascending tier sums = deleted first, as the combiner orders them; equal sums tie.
    """
    ordered = sorted(sums.values())
    count: dict[tuple[int, ...], int] = {}
    first: dict[tuple[int, ...], int] = {}
    for index, key in enumerate(ordered):
        count[key] = count.get(key, 0) + 1
        first.setdefault(key, index + 1)
    total = len(ordered)
    return {pod: Placement(first[key], count[key] - 1, total) for pod, key in sums.items()}
