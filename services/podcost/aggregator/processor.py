"""The aggregator's processor: what a record and a tick do, as a thin shell around the pure
aggregation (``podcost_core.aggregate``).

Both transports run it (``podcost_bus.faust_app.FaustKeyedApp`` over Kafka,
``podcost_bus.keyed.KeyedConsumerLoop`` over the in-memory bus); ``podcost.aggregator.service``
builds it. Per record (:meth:`AggregationProcessor.split`): decode it as a snapshot (workloads
topic; without the fields no decision reads, ``podcost_core.aggregate.DECISION_UNREAD``, whose
invalid values are therefore the rankers' to dead-letter) or a ranker's answers (ranks topic: a
``StrategyRanksBatchMessage`` of one strategy or a ``RanksBatchMessage`` of several, one step
per answer, each answer's workload in the record's partition; or one ``StrategyRanksMessage``),
an undecodable one, a batch with an answer of another partition's workload, or a snapshot whose
workload policy is invalid, going to the dead-letter topic with the reason. Per step
(:meth:`AggregationProcessor.on_record`): apply the transition; ask whether a decision is due and,
if so, queue the desired costs for the costs topic of the workload's cluster (created on first
use), in a ``podcost.combine`` span, child of the snapshot's trace (every pod's rank and cost in
its attributes), with the span's context in the record headers. A ``WorkloadGoneMessage`` on the
workloads topic drops the key's state instead (the transport forgets it), so states do not pile up;
unless the workload was deleted, it also queues a ``ReleaseCostsMessage`` naming the pods of its
latest snapshot for the costs topic, so the annotator removes the costs podcost wrote on them.
Per tick (:meth:`AggregationProcessor.on_tick`): a due decision as for a record, and a state left
describing nothing (answers that waited in vain for their snapshot: a ranker's answers that came
after their workload's gone message) dropped too.

Records come in batches (``podcost_bus.keyed``): :meth:`AggregationProcessor.on_record` only
decides and queues what to publish; :meth:`AggregationProcessor.flush`, once per batch, sends
everything queued at once (the producer batches it) and returns when all of it is acknowledged,
retrying transient bus errors and dead-lettering the record whose costs the bus refuses for good
(the span then says why, and ends with the acknowledgement). The transport persists the states
and commits the batch only after that (at least once). Deciding is the core's; nothing here does
anything but decode, call, encode and observe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.util.types import AttributeValue
from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError, to_json

from podcost.runtime.clock import Clock
from podcost.runtime.fleet import FleetKeys, FleetRegistry
from podcost.runtime.metrics import Metrics
from podcost.runtime.retry import DEFAULT_BACKOFF, retry_transient
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
    sending,
    workload_resource,
)
from podcost_bus import Bus, BusError, Delivery, Record
from podcost_bus.keyed import DROP, MAX_STATE_RECORD_BYTES, UNKNOWN, Drop, EveryKey, Unknown
from podcost_bus.messaging import dead_letter_of
from podcost_contracts.messages import (
    CONTENT_ENCODING,
    DEFAULT_GZIP_THRESHOLD,
    GONE_DELETED,
    GONE_REMOVED,
    GONE_UNLISTED,
    SCHEMA_HEADER,
    DecodeError,
    DesiredCostsMessage,
    Encoded,
    EncodeError,
    PodCost,
    PodRef,
    RankedWorkload,
    RanksBatchMessage,
    ReleaseCostsMessage,
    StrategyAnswer,
    StrategyRanksBatchMessage,
    StrategyRanksMessage,
    StrategyTerm,
    WorkloadGoneMessage,
    WorkloadKey,
    WorkloadSnapshotMessage,
    decode,
    decode_ranks_record,
    decode_workload_record,
    encode,
    encode_json,
    is_live_set,
    snapshot_validator,
    trace_context,
)
from podcost_contracts.signing import SIGNATURE_HEADER
from podcost_contracts.stamps import DEFAULT_CLOCK_SKEW, future_stamp
from podcost_contracts.topics import Topics
from podcost_core.aggregate import (
    DECISION_UNREAD,
    PROGRESS_PART,
    SNAPSHOT_PART,
    STATE_PARTS,
    Aggregator,
    Arrival,
    Decision,
    Latest,
    Outcome,
    StateDecodeError,
    WorkloadState,
    dump_latest,
    dump_parts,
    load_latest,
    load_parts,
)
from podcost_core.backoff import Backoff
from podcost_core.model import Snapshot, Unread
from podcost_core.policy import PolicyError

log = logging.getLogger("podcost.aggregator")

#: Seconds between two warnings about records of clusters not in the fleet registry.
UNREGISTERED_LOG_EVERY_S = 60.0

#: Pods whose rank and cost a decision's span lists: enough to follow a workload, bounded for a
#: huge one.
MAX_POD_ATTRIBUTES = 1000


def desired_costs(decision: Decision, *, emitted_at: float) -> DesiredCostsMessage:
    """The message of ``decision``: every ranked pod's cost, previous cost and breakdown, in the
    decided order (first deleted first), which is the order the annotator writes them in.

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
        for pod in sorted(decision.pods(), key=lambda pod: pod.rank)
    )
    return DesiredCostsMessage(
        key=decision.key,
        version=decision.version,
        costs=costs,
        complete=decision.complete,
        missing=decision.missing,
        emitted_at=emitted_at,
        changed_at=decision.changed_at,
        first_wrong=decision.first_wrong,
    )


def desired_costs_json(decision: Decision, *, emitted_at: float) -> bytes:
    """``desired_costs(decision, emitted_at=...).model_dump_json()``, built without the
    message's models: the same bytes (the unit tests compare them), at a fraction of the cost of
    one model per pod and strategy, which was most of deciding. Valid for the same reasons as
    :func:`desired_costs` (the core builds decisions consistent with the message's checks).

    Assembled from JSON fragments rather than serialized as one tree of dicts: a dict per pod
    and strategy term was most of the cost again (pydantic serializes a small dict slower than
    its values). Every float is still written by pydantic's ``to_json`` (its float format), and
    so is every string, unless the pods' names, namespaces and uids are all plain text (printable
    ASCII without quotes or backslashes, what Kubernetes allows), which JSON writes as it is
    between quotes: only the fixed keys, the punctuation, the ints and that plain text are
    written here."""
    combined = decision.combined
    by_uid = {pod.uid: pod for pod in decision.snapshot.pods}
    costs = decision.labelling.costs
    current = decision.current
    normalized = combined.normalized
    ranks = combined.ranks
    uids = combined.uids
    size = len(uids)
    changed_at = decision.changed_at
    try:
        # A pod's JSON is its fields, then its breakdown: a template with each strategy's
        # normalized score and raw score left out, filled per pod from columns aligned with
        # ``uids`` (zipped into one row per pod).
        terms: list[bytes] = []
        columns: list[Sequence[int] | list[bytes]] = []
        bounds = [bound for bound in combined.policy.bound if bound.name in normalized]
        raws = _floats_json([combined.raw[bound.name] for bound in bounds])
        for position, bound in enumerate(bounds):
            name = to_json(bound.name).replace(b"%", b"%%")
            terms.append(b'%s:{"normalized":%%d,"weight":%d,"tier":%d,"raw":%%s}'
                         % (name, bound.weight, bound.spec.tier))  # fmt: skip
            columns += (normalized[bound.name], raws[position * size : (position + 1) * size])
        breakdown = b'"breakdown":{%s}}' % b",".join(terms)
        rows = list(zip(*columns, strict=True)) if columns else [()] * size
        order = sorted(range(size), key=lambda index: ranks[uids[index]])
        pods = [by_uid[uid] for uid in uids]
        if _plain("".join([pod.namespace + pod.name for pod in pods]) + "".join(uids)):
            template = (
                b'{"namespace":"%s","name":"%s","uid":"%s","cost":%d,"previous":%s,' + breakdown
            )
            # One format of the template repeated: a format per pod scanned it as often.
            values: list[bytes | int] = []
            for index in order:
                uid, pod = uids[index], pods[index]
                now = current.get(uid)
                previous = None if now is None else now.value
                values += (
                    pod.namespace.encode(), pod.name.encode(), uid.encode(), costs[uid],
                    b"null" if previous is None else b"%d" % previous, *rows[index],
                )  # fmt: skip
            entries = [b",".join([template] * size) % tuple(values)] if size else []
        else:
            template = b"%s," + breakdown
            entries = []
            for index in order:
                uid, pod = uids[index], pods[index]
                now = current.get(uid)
                fields = to_json(
                    {
                        "namespace": pod.namespace,
                        "name": pod.name,
                        "uid": uid,
                        "cost": costs[uid],
                        "previous": None if now is None else now.value,
                    }
                )
                entries.append(template % (fields[:-1], *rows[index]))
        head = to_json({"schema_version": 1, "key": decision.key, "version": decision.version})
        tail = to_json(
            {
                "complete": decision.complete,
                "missing": decision.missing,
                "emitted_at": float(emitted_at),
                "changed_at": None if changed_at is None else float(changed_at),
                "first_wrong": decision.first_wrong,
            }
        )
    except PydanticSerializationError as error:  # text that is not Unicode (a lone surrogate)
        kind = DesiredCostsMessage.KIND
        raise EncodeError(f"the {kind} message cannot be encoded: {error}") from error
    return b'%s,"costs":[%s],%s' % (head[:-1], b",".join(entries), tail[1:])


#: The characters JSON writes as they are that :func:`_plain` accepts: printable ASCII but the
#: quote and the backslash.
_PLAIN: Final = bytes(range(0x20, 0x7F)).replace(b'"', b"").replace(b"\\", b"")


def _plain(text: str) -> bool:
    """Whether JSON writes ``text`` as it is between quotes, as pydantic's ``to_json`` does
    (it escapes only quotes, backslashes and control characters, and writes non-ASCII as
    UTF-8): printable ASCII without quotes or backslashes. (Deleting those from the bytes is
    several times faster than ``str.isprintable``.)"""
    return text.isascii() and not text.encode().translate(None, _PLAIN)


def _floats_json(columns: Sequence[Sequence[float]]) -> list[bytes]:
    """Each value of ``columns``, one after the other, as JSON of a float, as pydantic writes
    it: one ``to_json`` for all of them (a float's JSON never holds a comma)."""
    floats = [float(value) for values in columns for value in values]
    if not floats:
        return []
    return to_json(floats)[1:-1].split(b",")


@dataclass(slots=True)
class _Outgoing:
    """A record queued for :meth:`AggregationProcessor.flush`: a decision's costs, or a dead
    letter."""

    topic: str
    encoded: Encoded
    record: Record | None
    """The record it answers: dead-lettered if a decision's costs are refused for good (a tick's
    decision has none); the record a dead letter is of."""
    decision: Decision | None = None
    """The decision whose costs these are (``None``: a dead letter)."""
    span: Span | None = None
    """The decision's span, ended once the costs are acknowledged or refused."""
    reason: str = ""
    """A dead letter's reason."""
    outcome: str = "dead_letter"
    """A dead letter's ``outcome`` in ``podcost_messages_consumed``."""
    release: ReleaseCostsMessage | None = None
    """A release of a workload no longer ranked (a costs record that is no decision)."""
    error: BusError | None = None
    """Why sending it failed at once (``bus.send`` itself raised)."""


@dataclass(frozen=True, slots=True)
class _Step:
    """What one decoded record does to one workload's state (see
    :meth:`AggregationProcessor.split`)."""

    record: Record
    message: WorkloadSnapshotMessage | WorkloadGoneMessage | StrategyRanksMessage | RankedWorkload
    strategy: str = ""
    """The strategy a batch's answer (``RankedWorkload``, or ``StrategyAnswer``) is of."""
    live: frozenset[str] = frozenset()
    """A live set's keys (``WorkloadGoneMessage.live``)."""


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
        partition_of: Callable[[bytes], int] | None = None,
        unread: Unread | None = DECISION_UNREAD,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
        fleet: FleetRegistry | None = None,
        keys: FleetKeys | None = None,
        costs_gzip_above: int = DEFAULT_GZIP_THRESHOLD,
    ) -> None:
        self.costs_gzip_above = costs_gzip_above
        """Costs records of more JSON bytes than this are gzipped one by one; smaller ones are
        left to the producer's batch compression, if it has one (``podcost_bus.gzip_threshold``)."""
        self.fleet = fleet if fleet is not None else FleetRegistry(None)
        """The clusters served: a record of any other is dead-lettered before it is decoded."""
        self.keys = keys if keys is not None else FleetKeys(None)
        """Each cluster's signing keys: a workloads record not signed with one of its
        cluster's is dead-lettered before it is decoded."""
        self.aggregator = aggregator
        self.clock_skew = clock_skew
        """How far (seconds) a record's stamp may lie ahead of ``clock`` (``future_stamp``)."""
        self.unread = unread
        """What of a snapshot is not decoded (``None``: decode it whole)."""
        self.partition_of = partition_of
        """The partition of the source topics the bus gives a key: a ranker's batch must hold
        only workloads of the partition it is on (``None``: not checked)."""
        self.bus = bus
        self.topics = topics
        self.group = group
        self.metrics = metrics
        self.tracer = tracer
        self.clock = clock
        self.backoff = backoff
        self._queue: list[_Outgoing] = []
        """What decisions and dead letters wait for the next :meth:`flush`."""
        self._ok: dict[str, Any] = {}
        self._costs_topics: set[str] = set()
        """The per-cluster costs topics this process has made sure exist."""
        self._topic_of: dict[str, str] = {}
        """The costs topic of each cluster met (:meth:`_costs_topic`)."""
        self._received: dict[str, _Received] = {}
        """The snapshot records accepted since the last flush, by workload key."""
        self._storable: dict[str, _Received] = {}
        """Those of the batch last flushed: what :meth:`dump` stores as they came."""
        self._unregistered = 0
        """Records of unregistered clusters since the last warning about them."""
        self._unregistered_logged = float("-inf")

    def split(self, record: Record) -> list[tuple[bytes | EveryKey | None, _Step]]:
        """Decode ``record`` into its steps: one for a snapshot, a gone workload or one answer,
        one per answer of a ranker's batch, each with the key of the workload whose state it
        changes. An undecodable record, or a batch with an answer for a workload another
        partition holds, is dead-lettered (no step)."""
        if record.topic not in (self.topics.workloads, self.topics.ranks):
            raise ValueError(f"the aggregator does not read {record.topic!r}")
        if record.key is None:
            reason = "the record has no key (expected cluster/namespace/kind/name)"
            self._dead_letter(record, reason, None)
            return []
        # `podcost remove-cluster`'s marker for a cluster that left the fleet (out of the
        # registry, its keys withdrawn) is taken unsigned: only the empty live set, below.
        removal = (
            record.topic == self.topics.workloads
            and is_live_set(record.key)
            and self._left_fleet(record.key)
        )
        if record.topic == self.topics.workloads and not removal and not self._serves(record.key):
            # Before decoding: a flood of invented clusters costs a dead letter each, no state.
            cluster = record.key.partition(b"/")[0].decode("utf-8", "replace")
            reason = f"the cluster {cluster[:100]!r} is not in the fleet registry"
            self._dead_letter(record, reason, None, outcome="unregistered")
            self.metrics.unregistered_records.labels(record.topic).inc()
            self._report_unregistered(reason)
            return []
        if (
            record.topic == self.topics.workloads
            and not removal
            and not self._signed(record, record.key)
        ):
            cluster = record.key.partition(b"/")[0].decode("utf-8", "replace")
            reason = (
                f"the record is not signed with a key of cluster {cluster[:100]!r} "
                f"({SIGNATURE_HEADER} header missing or wrong)"
            )
            self._dead_letter(record, reason, None, outcome="forged")
            return []
        message: WorkloadSnapshotMessage | WorkloadGoneMessage | StrategyRanksMessage
        try:
            if record.topic == self.topics.workloads:
                message = decode_workload_record(
                    record.value, record.headers, key=record.key, unread=self.unread
                )
            else:
                ranks = decode_ranks_record(record.value, record.headers, key=record.key)
                if isinstance(ranks, StrategyRanksBatchMessage | RanksBatchMessage):
                    return self._split_batch(record, ranks)
                if not self._serves(record.key):
                    # The answer to a snapshot dead-lettered already: counted, not kept.
                    self.metrics.consumed.labels(record.topic, "unregistered").inc()
                    self.metrics.unregistered_records.labels(record.topic).inc()
                    return []
                message = ranks
        except DecodeError as error:
            self._dead_letter(record, error.reason, error)
            return []
        if isinstance(message, WorkloadSnapshotMessage) and (
            len(record.value) > MAX_STORED_SNAPSHOT_VALUE_BYTES
        ):
            reason = (
                f"the snapshot's record is {len(record.value)} bytes, more than the "
                f"{MAX_STORED_SNAPSHOT_VALUE_BYTES} the aggregator's stored state can hold"
            )
            self._dead_letter(record, reason, None)
            return []
        future = future_stamp(message, now=self.clock.now(), allowance=self.clock_skew)
        if future is not None:
            # Its workload's state is ordered by emitted_at and stored: admitted, it would make
            # every genuine snapshot stale, across restarts.
            self._dead_letter(record, future, None, outcome="future")
            return []
        if removal and not (
            isinstance(message, WorkloadGoneMessage)
            and message.live == ()
            and message.reason == GONE_REMOVED
        ):
            cluster = record.key.partition(b"/")[0].decode("utf-8", "replace")
            reason = (f"the cluster {cluster[:100]!r} left the fleet: only its removal (an empty "
                      "live set) is taken")  # fmt: skip
            self._dead_letter(record, reason, None, outcome="unregistered")
            return []
        if isinstance(message, WorkloadGoneMessage) and message.live is not None:
            return self._split_live_set(record, message)
        return [(record.key, _Step(record, message))]  # counted consumed once processed

    def _split_live_set(
        self, record: Record, message: WorkloadGoneMessage
    ) -> list[tuple[bytes | EveryKey | None, _Step]]:
        """A cluster's live set: one step for every state of that cluster in the record's
        partition (the watcher sends the set to every partition)."""
        prefix = f"{message.workload.cluster}/".encode()
        partition_of, partition = self.partition_of, record.partition

        def select(key: bytes) -> bool:
            return key.startswith(prefix) and (
                partition_of is None or partition_of(key) == partition
            )

        self._consumed_ok(record.topic).inc()  # the record (every state it selects is a step)
        live = frozenset(message.live or ())
        return [(EveryKey(select), _Step(record, message, live=live))]

    def _split_batch(
        self, record: Record, batch: StrategyRanksBatchMessage | RanksBatchMessage
    ) -> list[tuple[bytes | EveryKey | None, _Step]]:
        steps: list[tuple[bytes | EveryKey | None, _Step]] = []
        shared = batch.strategy if isinstance(batch, StrategyRanksBatchMessage) else ""
        answers: tuple[RankedWorkload, ...] = batch.answers
        for answer in answers:
            key = answer.key.encode()
            if not self._serves(key):
                # The answer to a snapshot dead-lettered already: counted, not kept.
                self.metrics.unregistered_records.labels(record.topic).inc()
                continue
            if self.partition_of is not None and self.partition_of(key) != record.partition:
                # Its workload's state is another partition's, perhaps another aggregator's:
                # a ranker, which groups its answers by their workload's partition, never
                # sends it.
                reason = (
                    f"the batch answers {answer.key!r}, a workload of partition "
                    f"{self.partition_of(key)}, on partition {record.partition}"
                )
                self._dead_letter(record, reason, None)
                return []
            strategy = answer.strategy if isinstance(answer, StrategyAnswer) else shared
            steps.append((key, _Step(record, answer, strategy)))
        self._consumed_ok(record.topic).inc()  # the record (its answers are its steps)
        return steps

    def _report_unregistered(self, reason: str) -> None:
        """One warning a minute at most about records of unregistered clusters (each is
        dead-lettered with its reason and counted): a flood of them must not flood the log."""
        self._unregistered += 1
        now = self.clock.now()
        if now >= self._unregistered_logged + UNREGISTERED_LOG_EVERY_S:
            log.warning("%d records of clusters not in the fleet registry dead-lettered since "
                        "the last report; the latest: %s", self._unregistered, reason)  # fmt: skip
            self._unregistered, self._unregistered_logged = 0, now

    def _signed(self, record: Record, key: bytes) -> bool:
        """Whether ``record`` carries its cluster's watcher's signature (or none is asked)."""
        if not self.keys.required:
            return True
        cluster = key.partition(b"/")[0].decode("utf-8", "replace")
        header = record.headers.get(SIGNATURE_HEADER)
        return self.keys.verified(cluster, key, record.value, header)

    def _left_fleet(self, key: bytes) -> bool:
        """Whether the cluster of ``key`` left the fleet: the registry no longer lists it, or the
        keys file no longer holds a key of it."""
        cluster = key.partition(b"/")[0].decode("utf-8", "replace")
        return self.fleet.left(cluster) or self.keys.left(cluster)

    def _serves(self, key: bytes) -> bool:
        """Whether the fleet registry lists the cluster of workload key ``key``."""
        return self.fleet.serves(key.partition(b"/")[0].decode("utf-8", "replace"))

    def on_record(self, step: _Step, state: WorkloadState | None) -> WorkloadState | Drop | None:
        started = time.time_ns()
        record, message = step.record, step.message
        if isinstance(message, WorkloadGoneMessage):
            if message.live is not None:
                return self._unlisted(message, step.live, state)
            return self._gone(record, message, state)
        now = self.clock.now()
        current = state if state is not None else WorkloadState(message.key)
        if isinstance(message, WorkloadSnapshotMessage):
            try:
                transition = self.aggregator.on_snapshot(
                    current,
                    message.snapshot,
                    emitted_at=message.emitted_at,
                    now=now,
                    trace=trace_context(record.headers),
                    changed_at=message.changed_at,
                )
            except PolicyError as error:
                reason = f"the workload's policy is invalid: {error}"
                self._dead_letter(record, reason, error)
                return None
            if transition.outcome is Outcome.ACCEPTED and transition.state.latest is not None:
                self._received[message.key] = _Received(transition.state.latest, record)
        else:
            transition = self.aggregator.on_ranks(
                current,
                strategy=step.strategy if isinstance(message, RankedWorkload) else message.strategy,
                version=message.version,
                scores=message.scores,
                now=now,
            )
        if not isinstance(message, RankedWorkload):  # a batch was counted as it was split
            self._consumed_ok(record.topic).inc()
        log.debug("%s v%d from %s: %s", message.key, message.version, record.topic,
                  transition.outcome)  # fmt: skip
        new = self._decide(transition.state, now, started, record)
        return None if new is current else new

    def _gone(
        self, record: Record, message: WorkloadGoneMessage, state: WorkloadState | None
    ) -> Drop | None:
        self._consumed_ok(record.topic).inc()
        outcome = (
            Outcome.ACCEPTED
            if state is None
            else self.aggregator.on_gone(state, emitted_at=message.emitted_at,
                                         version=message.version)
        )  # fmt: skip
        log.debug("%s gone (%s): %s", message.key, message.reason, outcome)
        latest = state.latest if state is not None else None
        # A deleted workload's pods go with it: only one that opted out keeps costs to remove.
        if outcome is Outcome.ACCEPTED and latest is not None and message.reason != GONE_DELETED:
            self._queue_release(message, latest.snapshot)
        if outcome is Outcome.ACCEPTED and state is not None:
            self.metrics.states_forgotten.labels("gone").inc()
            return DROP
        return None

    def _unlisted(
        self, message: WorkloadGoneMessage, live: frozenset[str], state: WorkloadState | None
    ) -> Drop | None:
        """A live set of the state's cluster: forget the state if the set leaves its workload
        out (``Aggregator.on_unlisted``), and ask the annotator to remove the costs podcost
        wrote on its pods. The set does not say whether the workload was deleted or opted out
        while no watcher saw it; the annotator verifies each pod against its own view, and a
        pod that is gone is left alone."""
        if state is None or state.key in live:
            return None
        outcome = self.aggregator.on_unlisted(state, listed_at=message.emitted_at)
        if outcome is not Outcome.ACCEPTED:
            return None
        if message.reason == GONE_REMOVED:  # its agent is gone too: nobody to release to
            self.metrics.states_forgotten.labels("removed").inc()
            log.info("%s: its cluster is removed from the fleet: forgotten", state.key)
            return DROP
        self.metrics.states_forgotten.labels("unlisted").inc()
        log.info("%s is not in its watcher's live set: forgotten", state.key)
        if state.latest is not None:
            gone = WorkloadGoneMessage(
                key=state.key, version=state.latest.version, reason=GONE_UNLISTED,
                emitted_at=message.emitted_at, changed_at=message.changed_at,
            )  # fmt: skip
            self._queue_release(gone, state.latest.snapshot)
        return DROP

    def _queue_release(self, message: WorkloadGoneMessage, snapshot: Snapshot) -> None:
        """Tell the annotator to remove podcost's costs from the pods of a workload that opted
        out (or whose policy became invalid): every pod of its latest snapshot, whatever cost
        it showed then (podcost's own writes come after the snapshot that caused them, and the
        watcher ignores them); the annotator reads each pod and decides."""
        pods = tuple(
            PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid) for pod in snapshot.pods
        )
        if not pods:
            return
        release = ReleaseCostsMessage(
            key=message.key, version=message.version, pods=pods, reason=message.reason,
            emitted_at=self.clock.now(), changed_at=message.changed_at,
        )  # fmt: skip
        try:
            encoded = encode(release)
        except EncodeError as error:
            log.error("%s: the release of its costs cannot be encoded: %s", message.key, error)
            return
        topic = self._costs_topic(message.key)
        self._queue.append(_Outgoing(topic, encoded, None, release=release))

    def on_tick(self, key: bytes | None, state: WorkloadState) -> WorkloadState | Drop | None:
        new = self._decide(state, self.clock.now(), time.time_ns(), None)
        if self.aggregator.describes_nothing(new):
            return self._expired(state)
        return None if new is state else new

    def _expired(self, state: WorkloadState) -> Drop:
        """Forget a state that describes nothing (``Aggregator.describes_nothing``): answers that
        waited for a snapshot that never came (a ranker's answers after its workload was gone),
        or a state stored before such states were forgotten."""
        self.metrics.states_forgotten.labels("expired").inc()
        versions = sorted({waiting.version for waiting in state.progress.early})
        if versions:
            log.info("%s: answers for version(s) %s waited %gs for a snapshot that never came: "
                     "forgotten", state.key, ", ".join(map(str, versions)),
                     self.aggregator.config.early_ttl_s)  # fmt: skip
        else:
            log.info("%s: its state holds nothing (no snapshot, no answer): forgotten", state.key)
        return DROP

    def wakeup(self, state: WorkloadState) -> float | None:
        return self.aggregator.next_wakeup(state)

    def now(self) -> float:
        return self.clock.now()

    def waiting(self, state: WorkloadState) -> bool:
        return self.aggregator.waiting(state)

    def dump(self, old: WorkloadState | None, new: WorkloadState) -> Mapping[str, bytes]:
        def trimmed(what: str) -> None:
            log.warning("%s: its stored progress leaves out %s (larger than one state record)",
                        new.key, what)  # fmt: skip

        return dump_parts(
            old, new, write_latest=self._write_latest,
            max_progress_bytes=MAX_STORED_PROGRESS_BYTES, on_trimmed=trimmed,
        )  # fmt: skip

    def _write_latest(self, latest: Latest) -> bytes:
        received = self._storable.pop(latest.snapshot.workload.key, None)
        if received is None or received.latest is not latest:
            return dump_latest(latest)
        return _record_part(latest, received.record)

    def stored_wakeup(
        self, key: bytes | None, parts: Mapping[str, bytes | None]
    ) -> float | Unknown | None:
        """The wake-up of the state ``parts`` hold, from the progress part and the snapshot
        part's header, without decoding the snapshot (:class:`podcost_bus.keyed.StoredWakeup`)."""
        raw = parts.get(SNAPSHOT_PART)
        arrival = None if raw is None else _read_arrival(raw)
        if raw is not None and arrival is None:
            return UNKNOWN
        text = (key or b"").decode("utf-8", "replace")
        try:
            return self.aggregator.stored_wakeup(text, parts.get(PROGRESS_PART), arrival)
        except StateDecodeError:
            return UNKNOWN  # decoded, it is logged and started afresh (``load``)

    def load(self, key: bytes | None, parts: Mapping[str, bytes | None]) -> WorkloadState:
        text = (key or b"").decode("utf-8", "replace")
        try:
            state = load_parts(
                text,
                parts,
                read_latest=_read_latest,
                on_torn=lambda progress, snapshot: log.warning(
                    "the stored state of %r was torn (the progress of version %s with the "
                    "snapshot of version %s): version %s is pending again",
                    text,
                    progress,
                    snapshot,
                    snapshot,
                ),
            )
        except StateDecodeError as error:
            # Written by an incompatible version: start this workload afresh (its next snapshot
            # rebuilds it) rather than stop every workload's aggregation.
            log.error("%s; starting it afresh", error)
            return WorkloadState(text)
        return self._forget_future(state)

    def _forget_future(self, state: WorkloadState) -> WorkloadState:
        """``state``, or a fresh one if its snapshot is stamped later than the clock allows:
        stored before such records were refused, it would keep every genuine snapshot stale."""
        latest = state.latest
        future = None if latest is None else future_stamp(
            latest, now=self.clock.now(), allowance=self.clock_skew
        )  # fmt: skip
        if future is None:
            return state
        log.warning("%s: the stored snapshot is %s; forgotten, the next snapshot rebuilds it",
                    state.key, future)  # fmt: skip
        return WorkloadState(state.key)

    def _consumed_ok(self, topic: str) -> Any:
        counter = self._ok.get(topic)
        if counter is None:
            counter = self._ok[topic] = self.metrics.consumed.labels(topic, "ok")
        return counter

    # --- deciding -----------------------------------------------------------------------------

    def _decide(
        self, state: WorkloadState, now: float, started: int, record: Record | None
    ) -> WorkloadState:
        state, decision = self.aggregator.due(state, now)
        if decision is not None:
            self._queue_costs(decision, started, record)
        return state

    def _queue_costs(self, decision: Decision, started: int, record: Record | None) -> None:
        parent = extract({name: value.encode() for name, value in decision.trace.items()})
        writes = decision.labelling.writes
        combined = decision.combined
        attributes: dict[str, AttributeValue] = {
            ATTR_WORKLOAD: decision.key,
            ATTR_VERSION: decision.version,
            ATTR_COMPLETE: decision.complete,
            ATTR_MISSING: list(decision.missing),
            ATTR_PODS: len(combined.uids),
            ATTR_WRITES: len(writes),
            # The creation context of the costs record it publishes (its PRODUCER span).
            **sending(self._costs_topic(decision.key), decision.key),
            **workload_resource(decision.key),
        }
        # Ended in flush, once the costs are acknowledged (or refused).
        span = self.tracer.start_span(
            SPAN_COMBINE,
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            start_time=started,
        )
        if decision.rejected:
            log.warning("%s v%d: answers left out: %s", decision.key, decision.version,
                        decision.rejected)  # fmt: skip
        if span.is_recording():
            # Every ranked pod's rank and cost, as three aligned arrays on the span rather than
            # an event per pod: the same facts, at a quarter of the cost of 25 events.
            by_uid = {pod.uid: pod for pod in decision.snapshot.pods}
            ranks, costs = combined.ranks, decision.labelling.costs
            uids = combined.uids[:MAX_POD_ATTRIBUTES]
            span.set_attributes(
                {
                    ATTR_POD: [f"{by_uid[uid].namespace}/{by_uid[uid].name}" for uid in uids],
                    ATTR_RANK: [ranks[uid] for uid in uids],
                    ATTR_COST: [costs[uid] for uid in uids],
                }
            )
        item = _Outgoing(self._costs_topic(decision.key), _NOTHING, record, decision, span)
        try:
            body = desired_costs_json(decision, emitted_at=self.clock.now())
            item.encoded = encode_json(
                DesiredCostsMessage, body, key=decision.key.encode(), schema_version=1,
                trace=inject(set_span_in_context(span)), gzip_threshold=self.costs_gzip_above,
            )  # fmt: skip
        except EncodeError as error:  # too large, or text that is not Unicode
            self._refused(item, error)
            return
        self._queue.append(item)

    def _dead_letter(
        self, record: Record, reason: str, error: BaseException | None, *,
        outcome: str = "dead_letter",
    ) -> None:  # fmt: skip
        letter = dead_letter_of(record, reason, error, group=self.group, failed_at=self.clock.now())
        encoded = encode(letter, trace=trace_context(record.headers))
        self._queue.append(
            _Outgoing(self.topics.deadletter, encoded, record, reason=reason, outcome=outcome)
        )

    # --- publishing ---------------------------------------------------------------------------

    async def flush(self) -> None:
        """Send everything queued, then wait for every acknowledgement (see the module
        docstring). Raises ``BusError`` if a dead letter itself is refused for good: the
        transport stops before committing, and the records are read again."""
        # The transport stores the states of what was decided since the last flush right after
        # it (or never: the consumer loop keeps its states in memory), so that is all kept.
        self._storable, self._received = self._received, {}
        while self._queue:
            queued, self._queue = self._queue, []
            await self._ensure_costs_topics(queued)
            sent: list[tuple[_Outgoing, Awaitable[Delivery] | None]] = []
            for item in queued:  # all queued before any is awaited: the producer batches them
                sent.append((item, await self._send(item)))
            for item, acked in sent:
                await self._settle(item, acked)
            # Dead letters of refused costs were queued meanwhile: the loop sends them too.

    def _costs_topic(self, key: str) -> str:
        """The costs topic of ``key``'s cluster (``Topics.costs_for``); :meth:`flush` creates
        it the first time this process publishes to it, so a new cluster of the fleet needs no
        set-up here. Kept per cluster (the key's first part; keys come from decoded, so valid,
        messages): parsing and checking the names again cost as much for every decision."""
        cluster = key.partition("/")[0]
        topic = self._topic_of.get(cluster)
        if topic is None:
            topic = self._topic_of[cluster] = self.topics.costs_for(WorkloadKey.parse(key).cluster)
        return topic

    async def _ensure_costs_topics(self, queued: list[_Outgoing]) -> None:
        costs = [item for item in queued if item.decision is not None or item.release is not None]
        for topic in {item.topic for item in costs}:
            if topic in self._costs_topics:
                continue

            async def create(topic: str = topic) -> None:
                await self.bus.ensure_topics([topic])

            await retry_transient(
                create, what=f"create the costs topic {topic}", sleep=self.clock.sleep,
                backoff=self.backoff,
            )  # fmt: skip
            self._costs_topics.add(topic)
            self.metrics.record_topic_drift(self.bus.topic_drift())

    async def _send(self, item: _Outgoing) -> Awaitable[Delivery] | None:
        encoded = item.encoded
        try:
            return await self.bus.send(item.topic, encoded.key, encoded.value, encoded.headers)
        except BusError as error:
            item.error = error  # settled below: published again if transient, else refused
            return None

    async def _settle(self, item: _Outgoing, acked: Awaitable[Delivery] | None) -> None:
        error = item.error
        if acked is not None:
            try:
                await acked
            except BusError as failed:
                error = failed
        if error is not None and error.retriable:
            encoded = item.encoded

            async def publish() -> Delivery:
                return await self.bus.publish(
                    item.topic, encoded.key, encoded.value, encoded.headers
                )

            try:
                await retry_transient(
                    publish, what=f"publish to {item.topic}", sleep=self.clock.sleep,
                    backoff=self.backoff,
                )  # fmt: skip
                error = None
            except BusError as failed:
                error = failed
        if error is not None:
            self._refused(item, error)
        elif item.decision is not None:
            self.metrics.combined.labels("complete" if item.decision.complete else "deadline").inc()
            # Its cluster's own costs topic: one series per cluster served, as many as topics.
            self.metrics.produced.labels(item.topic).inc()
            if item.span is not None:
                item.span.end()
        elif item.release is not None:
            self.metrics.produced.labels(self.topics.costs).inc()
            log.info("%s is no longer ranked (%s): asked the annotator to remove its %d "
                     "pods' costs", item.release.key, item.release.reason,
                     len(item.release.pods))  # fmt: skip
        else:
            record = item.record
            assert record is not None  # a dead letter is always of a record
            # Records of unregistered clusters are reported once a minute, not one by one.
            log.log(
                logging.DEBUG if item.outcome == "unregistered" else logging.WARNING,
                "dead-lettered %s[%d]@%d (key %r) to %s: %s",
                record.topic, record.partition, record.offset, record.key, item.topic,
                item.reason,
            )  # fmt: skip
            self.metrics.consumed.labels(record.topic, item.outcome).inc()
            self.metrics.produced.labels(item.topic).inc()

    def _refused(self, item: _Outgoing, error: EncodeError | BusError) -> None:
        """The bus will never take ``item``: a decision's record is dead-lettered instead; a
        dead letter that cannot be published stops the transport."""
        decision = item.decision
        if item.release is not None:
            log.error("%s: the release of its costs cannot be published: %s", item.release.key,
                      error)  # fmt: skip
            return
        if decision is None:
            raise error
        if item.span is not None:
            item.span.record_exception(error)
            item.span.set_status(Status(StatusCode.ERROR, str(error)))
            item.span.end()
        reason = f"the costs decided for version {decision.version} cannot be published"
        log.error("%s: %s: %s", decision.key, reason, error)
        if item.record is not None:
            self._dead_letter(item.record, f"{reason}: {error}", error)


#: A placeholder for an item's encoding until it is made.
_NOTHING: Final = Encoded(key=None, value=b"", headers={}, json_size=0)


# --- the stored snapshot part ---------------------------------------------------------------
#
# A snapshot is stored as the record it came in (its value, already compressed, and the headers
# that say how to read it) with what the state adds (when it arrived, its trace context), rather
# than serialised again from the decoded snapshot: a 25-pod snapshot is 28 KB of JSON, whose
# dump and gzip were 150 us of every snapshot's processing. It is read back (after a restart or
# a rebalance) with the same checks as any record of the workloads topic; a part written in the
# core's own format (``dump_latest``, when the record is not at hand) is read as before.


@dataclass(frozen=True, slots=True)
class _Received:
    """A snapshot accepted into a state, and the record it came in."""

    latest: Latest
    record: Record


@dataclass(frozen=True, slots=True)
class _RecordHeader:
    """What the stored snapshot part holds besides the record's value."""

    emitted_at: float
    arrived_at: float
    trace: dict[str, str]
    changed_at: float | None
    headers: dict[str, str]
    """The record headers its value is read with (schema, content encoding)."""
    version: int | None = None
    """The snapshot's version, which a state's wake-up needs (absent from parts stored by a
    version before it: those are decoded to learn it)."""


#: The largest snapshot record value the aggregator takes: its stored part (the value, a header
#: of at most about 2 KB: two trace headers of at most 512 bytes, the schema and encoding
#: headers, three times) under a key of at most 1,015 bytes must fit in one state record
#: (``MAX_STATE_RECORD_BYTES``). A watcher's snapshot (at most ``MAX_MESSAGE_BYTES``) always
#: does; a larger record is dead-lettered rather than stop the aggregator at its state write.
MAX_STORED_SNAPSHOT_VALUE_BYTES: Final = MAX_STATE_RECORD_BYTES - 8 * 1024

#: The largest progress part stored (``podcost_core.aggregate.dump_parts``): one state record
#: less room for the key and the record's framing.
MAX_STORED_PROGRESS_BYTES: Final = MAX_STATE_RECORD_BYTES - 8 * 1024

#: Starts a snapshot part stored as its record; core parts start with ``{`` or the gzip magic.
_RECORD_PART: Final = b"podcost-record/1\n"
_RECORD_HEADER: TypeAdapter[_RecordHeader] = TypeAdapter(_RecordHeader)
_READ_WITH: Final = (SCHEMA_HEADER, CONTENT_ENCODING)


def _record_part(latest: Latest, record: Record) -> bytes:
    headers = {
        name: record.headers[name].decode("ascii", "replace")
        for name in _READ_WITH
        if name in record.headers
    }
    header = _RecordHeader(
        latest.emitted_at, latest.arrived_at, dict(latest.trace), latest.changed_at, headers,
        latest.version,
    )  # fmt: skip
    # Compact JSON has no newline: the first one ends the header.
    return b"".join((_RECORD_PART, _RECORD_HEADER.dump_json(header), b"\n", record.value))


def _read_arrival(raw: bytes) -> Arrival | None:
    """The snapshot version and arrival a stored snapshot part's header holds, without its
    value; ``None`` for a part that does not say (the core's own format, or stored before the
    header had the version)."""
    if not raw.startswith(_RECORD_PART):
        return None
    start = len(_RECORD_PART)
    end = raw.find(b"\n", start)
    if end < 0:
        return None
    try:
        header = _RECORD_HEADER.validate_json(raw[start:end])
    except ValueError:
        return None
    return None if header.version is None else Arrival(header.version, header.arrived_at)


def _read_latest(raw: bytes) -> Latest:
    if not raw.startswith(_RECORD_PART):
        return load_latest(raw)
    header_json, _, value = raw[len(_RECORD_PART) :].partition(b"\n")
    header = _RECORD_HEADER.validate_json(header_json)  # a ValidationError is a ValueError
    headers = {name: text.encode("ascii") for name, text in header.headers.items()}
    validator = snapshot_validator(DECISION_UNREAD)
    # A DecodeError is a ValueError too.
    message = decode(WorkloadSnapshotMessage, value, headers, validator=validator)
    # Bounded as a record's trace context is: a part stored before the bound may carry more.
    trace = trace_context({name: text.encode() for name, text in header.trace.items()})
    return Latest(message.snapshot, header.emitted_at, header.arrived_at, trace, header.changed_at)
