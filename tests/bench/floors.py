"""The floor of each hop of the pipeline: the least CPU its work can take, measured in the
benchmark's own process beside the hop, so that a benchmark prints the ratio of the code to its
floor (a ratio is steadier than a rate on a shared machine).

- the watcher's floor per watch event: ``orjson.loads`` of the same watch lines;
- a ranker's floor per snapshot: decoding the snapshot record as that ranker decodes it (what its
  strategy never reads left out) and running its strategy;
- the aggregator's floor per decision: the pure core's ``combine`` of the answers and
  ``label_costs`` of its order, for the same snapshots (no bus, no decoding);
- the core's floor per snapshot: the same decisions in one process without Kafka: one decode of
  the record, every strategy, ``combine`` and ``label_costs``.

All are process CPU (``time.process_time``), the best of a few passes, per item.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from podcost_contracts.messages import (
    WorkloadSnapshotMessage,
    decode,
    encode,
    snapshot_validator,
)
from podcost_core.combine import combine
from podcost_core.labels import current_costs, label_costs
from podcost_core.model import Snapshot
from podcost_core.policy import DEFAULT_POLICY, Policy
from podcost_core.strategies.registry import default_registry


def best_cpu(work: Callable[[], object], items: int, passes: int = 5) -> float:
    """CPU seconds per item of ``work`` (which handles ``items`` items), best of ``passes``."""
    best = float("inf")
    for _ in range(passes):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best / max(items, 1)


def watcher_floor(lines: Sequence[bytes]) -> float:
    """CPU seconds per watch line of ``orjson.loads``."""
    loads = orjson.loads

    def work() -> None:
        for line in lines:
            loads(line)

    return best_cpu(work, len(lines))


@dataclass(frozen=True)
class CoreFloors:
    """CPU seconds per snapshot of each piece of the core's work, without a bus."""

    decode_whole: float
    """One decode of the record, whole (what one process serving every reader pays)."""
    rankers: dict[str, float]
    """Per ranked strategy: its ranker's decode (``Strategy.unread`` left out) and its score."""
    aggregator: float
    """``combine`` of every answer and ``label_costs`` of the order (per decision)."""

    @property
    def core(self) -> float:
        """The same decisions in one process: one decode, every strategy, combine, labels."""
        return self.decode_whole + self.scoring + self.aggregator

    scoring: float = 0.0
    """Every ranked strategy's score, the snapshot already decoded."""


def core_floors(snapshots: Sequence[Snapshot], policy: Policy = DEFAULT_POLICY) -> CoreFloors:
    """The floors of the core's hops for ``snapshots`` (encoded as the watcher encodes them)."""
    registry = default_registry()
    records = [
        encode(WorkloadSnapshotMessage.of(item, emitted_at=time.time())) for item in snapshots
    ]
    ranked = [bound for bound in policy.bound if not bound.strategy.spread]

    def decode_all(validator: object = None) -> list[WorkloadSnapshotMessage]:
        return [
            decode(WorkloadSnapshotMessage, r.value, r.headers, validator=validator)  # type: ignore[arg-type]
            for r in records
        ]

    count = len(records)
    decode_whole = best_cpu(decode_all, count)
    rankers = {}
    for bound in ranked:
        unread = registry.get_strategy(bound.name).unread
        validator = snapshot_validator(unread) if unread is not None else None

        def rank_one(bound: object = bound, validator: object = validator) -> None:
            for message in decode_all(validator):
                bound.strategy.score(message.snapshot, bound.args)  # type: ignore[attr-defined]

        rankers[bound.name] = best_cpu(rank_one, count)

    def score_all() -> None:
        for item in snapshots:
            for bound in ranked:
                bound.strategy.score(item, bound.args)

    return CoreFloors(
        decode_whole=decode_whole,
        rankers=rankers,
        aggregator=aggregator_floor(snapshots, policy),
        scoring=best_cpu(score_all, count),
    )


def aggregator_floor(snapshots: Sequence[Snapshot], policy: Policy = DEFAULT_POLICY) -> float:
    """CPU seconds per decision of the pure core's ``combine`` of every ranked strategy's answer
    and ``label_costs`` of its order (the answers computed beforehand, not timed)."""
    ranked = [bound for bound in policy.bound if not bound.strategy.spread]
    answers = [
        {bound.name: bound.strategy.score(item, bound.args) for bound in ranked}
        for item in snapshots
    ]

    def aggregate() -> None:
        for item, scores in zip(snapshots, answers, strict=True):
            combined = combine(item, policy, scores)
            label_costs(
                combined.order,
                {pod.uid: pod.replicaset for pod in item.pods},
                current_costs(item.pods),
            )

    return best_cpu(aggregate, len(snapshots))


def ratio(code: float, floor: float) -> str:
    return f"{code / floor:,.1f}x" if floor > 0 else "n/a"
