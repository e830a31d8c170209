"""Whether a message's time stamps can be true: none may lie in the reader's future.

Readers order a workload's records by their stamps: the annotator's version guard by a
decision's ``changed_at``, the aggregator's state by a snapshot's ``emitted_at``. A stamp
decodes as any finite float, so one record stamped far ahead would make every genuine record
after it look older, for as long as the reader remembers it (the aggregator stores it in its
changelog). Every consumer that orders by a stamp asks :func:`future_stamp` of each decoded
message first, with its own clock and ``PODCOST_CLOCK_SKEW_SECONDS`` as the allowance, and
dead-letters a record it names a stamp for. Pure: no clock is read here.
"""

from __future__ import annotations

from typing import Final

#: How far (seconds) a stamp may lie ahead of the reader's clock by default: the clocks of the
#: fleet's machines drift apart by less; a forged stamp within it freezes a workload at most
#: this long.
DEFAULT_CLOCK_SKEW: Final = 300.0

#: The stamp fields of the contract messages, in the order they are checked.
STAMPS: Final = ("emitted_at", "changed_at")


def future_stamp(message: object, *, now: float, allowance: float) -> str | None:
    """Why ``message`` cannot be admitted (a stamp later than ``now + allowance``, POSIX
    seconds), or ``None`` when none of its stamps is. Fields it does not have, or that are
    ``None``, are not checked."""
    for name in STAMPS:
        stamp = getattr(message, name, None)
        if isinstance(stamp, float | int) and stamp > now + allowance:
            return (
                f"stamped in the future: {name} {stamp:.6g} is {stamp - now:.6g}s ahead of the "
                f"reader's clock, more than the {allowance:g}s allowed"
            )
    return None
