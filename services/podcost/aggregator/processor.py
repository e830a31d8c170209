"""The aggregator's processor: what a record and a tick do, as a thin shell around the pure
aggregation (``podcost_core.aggregate``).

Both transports run it (``podcost_bus.faust_app.FaustKeyedApp`` over Kafka,
``podcost_bus.keyed.KeyedConsumerLoop`` over the in-memory bus); ``podcost.aggregator.service``
builds it. Per record: decode it as a snapshot (workloads topic) or a strategy's answer (ranks
topic), an undecodable one, or one whose workload policy is invalid, going to the dead-letter
topic with the reason; apply the transition; ask whether a decision is due and, if so, publish
the desired costs to the costs topic of the workload's cluster (created on first use) in a
``podcost.combine`` span, child of the snapshot's trace, with the span's context in the record
headers. A ``WorkloadGoneMessage`` on the workloads topic drops the key's
state instead (the transport forgets it), so states do not pile up. Publishing retries
transient bus errors until acknowledged, and returns only then: the transport persists the
state and commits the record after that (at least once). Deciding is the core's; nothing here
does anything but decode, call, encode and observe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from opentelemetry.trace import Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from podcost.runtime.clock import Clock
from podcost.runtime.metrics import Metrics
from podcost.runtime.retry import DEFAULT_BACKOFF, Backoff, retry_transient
from podcost.runtime.telemetry import (
    ATTR_COMPLETE,
    ATTR_COST,
    ATTR_MISSING,
    ATTR_POD,
    ATTR_PODS,
    ATTR_RANK,
    ATTR_VERSION,
    ATTR_WORKLOAD,
    ATTR_WRITES,
    SPAN_COMBINE,
    extract,
    inject,
)
from podcost_bus import Bus, BusError, Delivery, Record
from podcost_bus.keyed import DROP, Drop
from podcost_bus.messaging import dead_letter
from podcost_contracts.messages import (
    DecodeError,
    DesiredCostsMessage,
    MessageTooLarge,
    PodCost,
    StrategyRanksMessage,
    StrategyTerm,
    WorkloadGoneMessage,
    WorkloadKey,
    WorkloadSnapshotMessage,
    decode,
    decode_workload_record,
    encode,
    trace_context,
)
from podcost_contracts.topics import Topics
from podcost_core.aggregate import (
    STATE_PARTS,
    Aggregator,
    Decision,
    Outcome,
    StateDecodeError,
    WorkloadState,
    dump_parts,
    load_parts,
)
from podcost_core.policy import PolicyError

log = logging.getLogger("podcost.aggregator")

#: Span events per decision, one per pod: enough to follow a workload, bounded for a huge one.
MAX_POD_EVENTS = 1000
POD_EVENT = "podcost.pod-cost"


def desired_costs(decision: Decision, *, emitted_at: float) -> DesiredCostsMessage:
    """The message of ``decision``: every ranked pod's cost, previous cost and breakdown.

    The per-pod parts are built without validation (``model_construct``): they come from the
    core, which keeps costs in int32 and normalized scores in [0, 100] by construction, and
    validating a term per pod and strategy was the largest part of deciding. The message itself
    is validated (its consistency checks), and so is every record the annotator decodes.
    """
    costs = tuple(
        PodCost.model_construct(
            namespace=pod.pod.namespace,
            name=pod.pod.name,
            uid=pod.pod.uid,
            cost=pod.cost,
            previous=pod.previous,
            breakdown={
                term.strategy: StrategyTerm.model_construct(
                    normalized=term.normalized, weight=term.weight, tier=term.tier, raw=term.raw
                )
                for term in pod.breakdown
            },
        )
        for pod in decision.pods()
    )
    return DesiredCostsMessage(
        key=decision.key,
        version=decision.version,
        costs=costs,
        complete=decision.complete,
        missing=decision.missing,
        emitted_at=emitted_at,
        changed_at=decision.changed_at,
    )


class AggregationProcessor:
    """The aggregator's ``KeyedProcessor`` (see the module docstring)."""

    parts = STATE_PARTS

    def __init__(
        self,
        aggregator: Aggregator,
        *,
        bus: Bus,
        topics: Topics,
        group: str,
        metrics: Metrics,
        tracer: Tracer,
        clock: Clock,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self.aggregator = aggregator
        self.bus = bus
        self.topics = topics
        self.group = group
        self.metrics = metrics
        self.tracer = tracer
        self.clock = clock
        self.backoff = backoff
        self._costs_topics: set[str] = set()
        """The per-cluster costs topics this process has made sure exist."""

    async def on_record(
        self, record: Record, state: WorkloadState | None
    ) -> WorkloadState | Drop | None:
        started = time.time_ns()
        if record.topic not in (self.topics.workloads, self.topics.ranks):
            raise ValueError(f"the aggregator does not read {record.topic!r}")
        if record.key is None:
            reason = "the record has no key (expected cluster/namespace/kind/name)"
            await self._dead_letter(record, reason, None)
            return None
        message: WorkloadSnapshotMessage | WorkloadGoneMessage | StrategyRanksMessage
        try:
            if record.topic == self.topics.workloads:
                message = decode_workload_record(record.value, record.headers, key=record.key)
            else:
                message = decode(StrategyRanksMessage, record.value, record.headers, key=record.key)
        except DecodeError as error:
            await self._dead_letter(record, error.reason, error)
            return None
        if isinstance(message, WorkloadGoneMessage):
            return self._gone(record, message, state)
        now = self.clock.now()
        current = state if state is not None else WorkloadState(message.key)
        if isinstance(message, WorkloadSnapshotMessage):
            try:
                step = self.aggregator.on_snapshot(
                    current,
                    message.snapshot,
                    emitted_at=message.emitted_at,
                    now=now,
                    trace=trace_context(record.headers),
                    changed_at=message.changed_at,
                )
            except PolicyError as error:
                reason = f"the workload's policy is invalid: {error}"
                await self._dead_letter(record, reason, error)
                return None
        else:
            step = self.aggregator.on_ranks(
                current,
                strategy=message.strategy,
                version=message.version,
                scores=message.scores,
                now=now,
            )
        self.metrics.consumed.labels(record.topic, "ok").inc()
        log.debug("%s v%d from %s: %s", message.key, message.version, record.topic, step.outcome)
        new = await self._decide(step.state, now, started, record)
        return None if new is current else new

    def _gone(
        self, record: Record, message: WorkloadGoneMessage, state: WorkloadState | None
    ) -> Drop | None:
        self.metrics.consumed.labels(record.topic, "ok").inc()
        outcome = (
            Outcome.ACCEPTED
            if state is None
            else self.aggregator.on_gone(state, emitted_at=message.emitted_at,
                                         version=message.version)
        )  # fmt: skip
        log.debug("%s gone (%s): %s", message.key, message.reason, outcome)
        return DROP if outcome is Outcome.ACCEPTED and state is not None else None

    async def on_tick(self, key: bytes | None, state: WorkloadState) -> WorkloadState | None:
        new = await self._decide(state, self.clock.now(), time.time_ns(), None)
        return None if new is state else new

    def due(self, state: WorkloadState) -> bool:
        wakeup = self.aggregator.next_wakeup(state)
        return wakeup is not None and self.clock.now() >= wakeup

    def waiting(self, state: WorkloadState) -> bool:
        return self.aggregator.waiting(state)

    def dump(self, old: WorkloadState | None, new: WorkloadState) -> Mapping[str, bytes]:
        return dump_parts(old, new)

    def load(self, key: bytes | None, parts: Mapping[str, bytes | None]) -> WorkloadState:
        text = (key or b"").decode("utf-8", "replace")
        try:
            return load_parts(text, parts)
        except StateDecodeError as error:
            # Written by an incompatible version: start this workload afresh (its next snapshot
            # rebuilds it) rather than stop every workload's aggregation.
            log.error("%s; starting it afresh", error)
            return WorkloadState(text)

    # --- deciding and publishing --------------------------------------------------------------

    async def _decide(
        self, state: WorkloadState, now: float, started: int, record: Record | None
    ) -> WorkloadState:
        state, decision = self.aggregator.due(state, now)
        if decision is not None:
            await self._publish(decision, started, record)
        return state

    async def _publish(self, decision: Decision, started: int, record: Record | None) -> None:
        parent = extract({name: value.encode() for name, value in decision.trace.items()})
        writes = decision.labelling.writes
        attributes: dict[str, AttributeValue] = {
            ATTR_WORKLOAD: decision.key,
            ATTR_VERSION: decision.version,
            ATTR_COMPLETE: decision.complete,
            ATTR_MISSING: list(decision.missing),
            ATTR_PODS: len(decision.combined.uids),
            ATTR_WRITES: len(writes),
        }
        with self.tracer.start_as_current_span(
            SPAN_COMBINE, context=parent, attributes=attributes, start_time=started
        ) as span:
            if decision.rejected:
                log.warning("%s v%d: answers left out: %s", decision.key, decision.version,
                            decision.rejected)  # fmt: skip
            message = desired_costs(decision, emitted_at=self.clock.now())
            for pod in message.costs[:MAX_POD_EVENTS]:
                span.add_event(
                    POD_EVENT,
                    {
                        ATTR_POD: f"{pod.namespace}/{pod.name}",
                        ATTR_RANK: decision.combined.ranks[pod.uid],
                        ATTR_COST: pod.cost,
                    },
                )
            try:
                encoded = encode(message, trace=inject())
                topic = await self._costs_topic(decision.key)

                async def publish() -> Delivery:
                    return await self.bus.publish(
                        topic, encoded.key, encoded.value, encoded.headers
                    )

                await retry_transient(
                    publish, what=f"publish the costs of {decision.key}", sleep=self.clock.sleep,
                    backoff=self.backoff,
                )  # fmt: skip
            except (MessageTooLarge, BusError) as error:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, str(error)))
                reason = f"the costs decided for version {decision.version} cannot be published"
                log.error("%s: %s: %s", decision.key, reason, error)
                if record is not None:
                    await self._dead_letter(record, f"{reason}: {error}", error)
                return
        self.metrics.combined.labels("complete" if decision.complete else "deadline").inc()
        self.metrics.produced.labels(self.topics.costs).inc()

    async def _costs_topic(self, key: str) -> str:
        """The costs topic of ``key``'s cluster (``Topics.costs_for``), created the first time
        this process publishes to it, so a new cluster of the fleet needs no set-up here."""
        topic = self.topics.costs_for(WorkloadKey.parse(key).cluster)
        if topic not in self._costs_topics:

            async def create() -> None:
                await self.bus.ensure_topics([topic])

            await retry_transient(
                create, what=f"create the costs topic {topic}", sleep=self.clock.sleep,
                backoff=self.backoff,
            )  # fmt: skip
            self._costs_topics.add(topic)
        return topic

    async def _dead_letter(self, record: Record, reason: str, error: BaseException | None) -> None:
        async def publish() -> Delivery:
            return await dead_letter(
                self.bus, record, reason, error, topic=self.topics.deadletter, group=self.group,
                clock=self.clock.now,
            )  # fmt: skip

        await retry_transient(
            publish, what="dead-letter", sleep=self.clock.sleep, backoff=self.backoff
        )
        self.metrics.consumed.labels(record.topic, "dead_letter").inc()
        self.metrics.produced.labels(self.topics.deadletter).inc()
