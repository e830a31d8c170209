"""A complete decision of the pure aggregation, for unit tests of what is built from one (the
costs message, the decoding a decision tolerates)."""

from __future__ import annotations

from podcost_core.aggregate import Aggregator, Decision, WorkloadState
from podcost_core.combine import answers_needed
from podcost_core.model import Snapshot


def complete_decision(snapshot: Snapshot, *, answers_from: Snapshot | None = None) -> Decision:
    """The decision on ``snapshot`` once every answer its policy needs has come, each computed
    by the real strategy on ``answers_from`` (default: ``snapshot`` itself; the rankers' own
    decode of the same record, say)."""
    answers_from = snapshot if answers_from is None else answers_from
    aggregator = Aggregator()
    state = aggregator.on_snapshot(
        WorkloadState(snapshot.workload.key), snapshot, emitted_at=1.0, now=1.0
    ).state
    policy = aggregator.policies.of(answers_from)
    needed = answers_needed(policy)
    for bound in policy.bound:
        if bound.name in needed:
            scores = bound.strategy.score(answers_from, bound.args)
            state = aggregator.on_ranks(
                state, strategy=bound.name, version=snapshot.version, scores=scores, now=1.0
            ).state
    _, decision = aggregator.due(state, 1.0)
    assert decision is not None
    assert decision.complete
    return decision
