"""Whether a consumer still makes progress: the decision of the aggregator's progress watchdog.

A consumer can stop without failing: faust's was seen to stop consuming for good after a broker
outage ("Heartbeat session expired - marking coordinator dead", then nothing, while still
assigned and so still "ready"), and to hang in its start-up (a topic creation that waits for a
lost request for hours). Neither exits, so its supervisor never restarts it. The watchdog
(``podcost_bus.faust_app``) asks :func:`progress_verdict` every few seconds: a consumer with
records to process (lag > 0) that processed nothing for ``stall_s`` — or one that has not
started within ``start_s`` — is stalled; it is reported not ready first (from half that time),
then it exits and its restart reads again what it did not commit (at least once).

"Progress" is anything that moves the consumer forward: a record processed, a changelog
record applied during a table recovery (a long recovery that progresses is not a stall).
Pure: no clock, no Kafka; the caller passes monotonic timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Progress(Enum):
    """What the watchdog does: nothing, report not ready, or stop the process."""

    OK = "ok"
    NOT_READY = "not ready"
    EXIT = "exit"


@dataclass(frozen=True, slots=True)
class Verdict:
    progress: Progress
    reason: str = ""
    """Why (empty when OK): a one-line message for the log and the exit."""


OK = Verdict(Progress.OK)


def progress_verdict(
    now: float,
    *,
    began: float,
    started: bool,
    last_progress: float | None,
    lag: int | None,
    behind_since: float | None = None,
    unsettled_since: float | None = None,
    stall_s: float,
    start_s: float,
) -> Verdict:
    """The watchdog's decision at ``now`` (monotonic seconds).

    ``began``: when the consumer started starting; ``started``: whether its start completed;
    ``last_progress``: when it last moved forward (None: never); ``lag``: records it has to
    process on its assigned partitions (None: unknown, e.g. nothing assigned or no highwater
    seen yet); ``behind_since``: since when ``lag`` has been positive without a break (a record
    that arrives after a long idle time is not a stall until it waited ``stall_s``);
    ``unsettled_since``: since when the started consumer has been unable to process without a
    break (in a rebalance, a recovery, or without the metadata it needs; None: it is able).

    Stalled: not started and nothing moved for ``start_s`` since ``began`` (a recovery in the
    start-up that progresses keeps it going); started, unsettled and nothing moved for
    ``start_s`` since it became so; started, ``lag`` positive and nothing moved for ``stall_s``
    since it became so. Stalled means NOT_READY from half the bound, EXIT at the bound (the
    stall nearest its bound decides).
    """
    since = max(t for t in (began, last_progress) if t is not None)
    stalls: list[tuple[float, float, str]] = []  # (idle seconds, bound, what)
    if not started:
        stalls.append((now - since, start_s, "not started and no progress"))
    else:
        if unsettled_since is not None:
            what = "unable to process (rebalance, recovery or metadata) and no progress"
            stalls.append((now - max(since, unsettled_since), start_s, what))
        if lag is not None and lag > 0:
            what = f"{lag} records to process and none processed"
            stalls.append((now - max(since, behind_since or since), stall_s, what))
    if not stalls:
        return OK
    idle, bound, what = max(stalls, key=lambda stall: stall[0] / stall[1])
    if idle < bound / 2:
        return OK
    reason = f"{what} for {idle:.0f}s (limit {bound:.0f}s)"
    return Verdict(Progress.EXIT if idle >= bound else Progress.NOT_READY, reason)
