"""The ranker: one generic service that runs one strategy on every workload snapshot.

``podcost ranker --strategy NAME`` runs it, one process per strategy, each in its own consumer
group ``<PODCOST_RANKER_GROUP>-<strategy>`` (``podcost-ranker-<strategy>`` by default); embedded
mode runs one per strategy in-process; the tests build it with :func:`bootstrap`. The same loop
runs any strategy the registry knows, built-in or installed by a package through the
``podcost.strategies`` entry points: adding a strategy never copies this code.

For each snapshot read from the workloads topic (a ``WorkloadGoneMessage`` there is skipped:
there is nothing left to rank): decode it (an undecodable record goes to the
dead-letter topic with the reason, and the ranker goes on), resolve the workload's policy (its
annotations over the cluster default, with the aggregator's own resolver so both agree), and if
the policy needs this strategy's answer, run the strategy in a span (``podcost.strategy``, a
child of the snapshot's trace) and the ``strategy_duration`` histogram. The raw scores for each
snapshot version go out together, through the process's ``podcost.ranker.outbox.RanksOutbox``:
per partition of the answered workloads (the partition their snapshots are on), one record with
their answers in the order read (several if they do not fit in one), a
``StrategyRanksBatchMessage``, or, in a process of several strategies' rankers sharing one
outbox, a ``RanksBatchMessage`` with every strategy's answers to the same records. A record per
answer was most of what the aggregator spent on each decision in faust's per-record path. The
batch's offsets are committed only once every answer is acknowledged (at least once: a ranker
that dies before re-reads and re-publishes the same answers, which the aggregator treats as
duplicates). A snapshot the strategy cannot rank (it raises, or breaks the score contract) or
whose policy is invalid is dead-lettered too: retrying cannot help, and the aggregator decides
without this answer after its deadline.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from podcost.ranker.outbox import RanksOutbox
from podcost.ranker.settings import RankerSettings
from podcost.runtime.clock import Clock, WallClock
from podcost.runtime.metrics import Families, Metrics
from podcost.runtime.retry import DEFAULT_BACKOFF, retry_transient
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import (
    ATTR_PODS,
    ATTR_STRATEGY,
    ATTR_TIER,
    ATTR_VERSION,
    ATTR_WEIGHT,
    ATTR_WORKLOAD,
    SPAN_STRATEGY,
    extract,
    inject,
    processing,
    tracer,
    workload_resource,
)
from podcost_bus import (
    Bus,
    BusError,
    BusSettings,
    Consumer,
    Delivery,
    Record,
    gzip_threshold,
    key_partitioner,
    open_bus,
)
from podcost_bus.messaging import dead_letter
from podcost_contracts.messages import (
    DecodeError,
    RankedWorkload,
    WorkloadGoneMessage,
    WorkloadSnapshotMessage,
    decode_workload_record,
)
from podcost_contracts.topics import Topics
from podcost_core.aggregate import PolicyResolver, score_problem
from podcost_core.backoff import Backoff
from podcost_core.policy import DEFAULT_POLICY, BoundStrategy, PolicyError, load_policy_file
from podcost_core.strategies.base import Strategy
from podcost_core.strategies.registry import Registry, RemoteStrategyError

log = logging.getLogger("podcost.ranker")

#: How often the consumer lag gauge is refreshed (asking Kafka costs a round trip).
LAG_EVERY_S = 1.0


def group_of(strategy: str) -> str:
    """The consumer group of the rankers of ``strategy`` with the default settings."""
    return RankerSettings().group_for(strategy)


def together_bus_settings(settings: BusSettings) -> BusSettings:
    """The bus settings of a process that runs several strategies' rankers: a client id of the
    process's own, ``<client id>-<8 hex digits>``.

    The broker names a group member ``<client id>-<uuid>``, and the assignor deals the
    partitions out to the members in the order of their names: with a client id per process,
    every strategy's group orders the processes alike and gives each process the same
    partitions, so that what a process fetches is read, and decoded once, by all of its
    strategies. With one client id for all, each group orders the processes at random, and a
    process's strategies read different partitions (each decoding what it alone reads)."""
    return settings.model_copy(update={"client_id": f"{settings.client_id}-{secrets.token_hex(4)}"})


@dataclass(frozen=True, slots=True)
class _Answer:
    """A record's answer."""

    record: Record
    ranked: RankedWorkload


class RankerService:
    """One strategy's ranker (the runner's ``Service``); built by :func:`bootstrap`."""

    def __init__(
        self,
        strategy: Strategy[Any],
        *,
        policies: PolicyResolver,
        bus: Bus,
        topics: Topics,
        metrics: Metrics,
        tracer: Tracer,
        clock: Clock,
        poll_s: float = 1.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        group: str | None = None,
        partition_of: Callable[[bytes], int] | None = None,
        whole_snapshots: bool = False,
        outbox: RanksOutbox | None = None,
    ) -> None:
        self.strategy = strategy
        self.shares_decode = whole_snapshots
        """Whether this ranker decodes whole snapshots, one decode serving every reader of its
        process."""
        self.unread = None if whole_snapshots else strategy.unread
        """What of a snapshot this ranker does not decode: what its strategy never reads
        (``Strategy.unread``), unless it is to decode whole snapshots (services sharing a
        process: one whole decode of a record then serves every reader)."""
        self.name = f"ranker-{strategy.name}"
        self.group = group if group is not None else group_of(strategy.name)
        self.policies = policies
        self.bus = bus
        self.topics = topics
        self.metrics = metrics
        self.tracer = tracer
        self.clock = clock
        self.poll_s = poll_s
        self.backoff = backoff
        self.outbox = (
            outbox
            if outbox is not None
            else RanksOutbox(
                bus, topics.ranks, metrics=metrics, clock=clock, partition_of=partition_of,
                backoff=backoff,
            )
        )  # fmt: skip
        """Where its answers are published: the process's, shared by its strategies' rankers,
        or one of its own. ``partition_of``, the partition the bus gives a workload's key
        (``podcost_bus.key_partitioner``), groups the answers of its own into records."""
        self.outbox.join(strategy.name)
        self._consumer: Consumer | None = None
        self._lag_at = float("-inf")

    def ready(self) -> bool:
        """Joined the group and given partitions to read."""
        return self._consumer is not None and bool(self._consumer.assignment())

    async def run(self) -> None:
        """Rank what the workloads topic brings until cancelled."""
        self.outbox.join(self.strategy.name)
        try:
            await self.bus.ensure_topics(self.topics.shared())
            self.metrics.record_topic_drift(self.bus.topic_drift())
            # At 0 from the start, so the first dead letter is an increase an alert sees.
            self.metrics.consumed.labels(self.topics.workloads, "dead_letter")
            async with self.bus.consumer([self.topics.workloads], group=self.group) as consumer:
                self._consumer = consumer
                try:
                    while True:
                        records = await consumer.poll(max_wait=self.poll_s)
                        if records:
                            await self.process(records)
                            await self._commit(consumer, records)
                        await self._report_lag(consumer)
                finally:
                    self._consumer = None
        finally:
            # The other strategies sharing its outbox no longer wait for its answers.
            self.outbox.leave(self.strategy.name)

    async def process(self, records: list[Record]) -> None:
        """Rank ``records`` and publish every answer; returns once all are acknowledged (or
        dead-lettered: refused for good)."""
        answers = []
        for record in records:
            if answer := await self._rank(record):
                answers.append(answer)
            # Let the loop turn between records: a batch ranked in one go would hold up every
            # service sharing the loop (embedded mode, or several in one process) for all of it.
            await asyncio.sleep(0)
        fates = await self.outbox.publish(self.strategy.name, [answer.ranked for answer in answers])
        for answer, fate in zip(answers, fates, strict=True):
            if fate is not None:
                await self._dead_letter(answer.record, fate.reason, fate.error)

    async def _rank(self, record: Record) -> _Answer | None:
        """The answer to one record, or ``None`` if there is none to publish."""
        if self.strategy.spread and not self.shares_decode:
            # A spread strategy never answers (the aggregator levels it), whatever the record
            # holds: decoding it was most of this process's CPU, for nothing. The aggregator and
            # the other rankers verify the record (and dead-letter it if it is bad). A ranker
            # sharing its process decodes anyway: that decode is shared, and costs it nothing.
            self.metrics.consumed.labels(record.topic, "ok").inc()
            return None
        try:
            message = decode_workload_record(
                record.value, record.headers, key=record.key, unread=self.unread
            )
        except DecodeError as error:
            await self._dead_letter(record, error.reason, error)
            return None
        if isinstance(message, WorkloadGoneMessage):
            self.metrics.consumed.labels(record.topic, "ok").inc()
            return None  # nothing to rank: the aggregator forgets the workload
        snapshot = message.snapshot
        try:
            policy = self.policies.of(snapshot)
        except PolicyError as error:
            await self._dead_letter(record, f"the workload's policy is invalid: {error}", error)
            return None
        bound = next((b for b in policy.bound if b.name == self.strategy.name), None)
        if bound is None or bound.strategy.spread:
            # Not enabled for this workload, or a spread strategy (the aggregator levels those).
            self.metrics.consumed.labels(record.topic, "ok").inc()
            return None
        return await self._score(record, message, bound)

    async def _score(
        self, record: Record, message: WorkloadSnapshotMessage, bound: BoundStrategy
    ) -> _Answer | None:
        snapshot, name = message.snapshot, bound.name
        attributes: dict[str, AttributeValue] = {
            ATTR_WORKLOAD: message.key,
            ATTR_VERSION: message.version,
            ATTR_STRATEGY: name,
            ATTR_WEIGHT: bound.weight,
            ATTR_TIER: bound.spec.tier,
            ATTR_PODS: len(snapshot.pods),
            **processing(record.topic, record.partition, record.offset, record.key, self.group),
            **workload_resource(message.key),
        }
        parent = extract(record.headers)
        with self.tracer.start_as_current_span(
            SPAN_STRATEGY, context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        ) as span:
            started = time.perf_counter()
            try:
                scores = bound.strategy.score(snapshot, bound.args)
            except Exception as error:  # the strategy's own failure on this snapshot
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                await self._dead_letter(record, f"strategy {name!r} failed: {error!r}", error)
                return None
            duration = time.perf_counter() - started
            self.metrics.strategy_duration.labels(name).observe(duration)
            problem = score_problem(snapshot, scores)
            if problem is not None:
                span.set_status(Status(StatusCode.ERROR, problem))
                await self._dead_letter(
                    record, f"strategy {name!r} broke the score contract: {problem}", None
                )
                return None
            # Built without validation: the contract was just checked (score_problem), and
            # the key and version are the decoded snapshot's.
            ranked = RankedWorkload.model_construct(
                key=message.key,
                version=message.version,
                scores=dict(scores),
                duration_seconds=duration,
                changed_at=message.changed_at,
                trace=inject(),
            )
        self.metrics.snapshots_ranked.labels(name).inc()
        self.metrics.consumed.labels(record.topic, "ok").inc()
        return _Answer(record, ranked)

    async def _dead_letter(self, record: Record, reason: str, error: BaseException | None) -> None:
        async def publish() -> Delivery:
            return await dead_letter(
                self.bus, record, reason, error, topic=self.topics.deadletter, group=self.group,
                clock=self.clock.now,
            )  # fmt: skip

        await retry_transient(
            publish, what=f"{self.name}: dead-letter", sleep=self.clock.sleep, backoff=self.backoff
        )
        self.metrics.consumed.labels(record.topic, "dead_letter").inc()
        self.metrics.produced.labels(self.topics.deadletter).inc()

    async def _commit(self, consumer: Consumer, records: list[Record]) -> None:
        try:
            await consumer.commit(records)
        except BusError as error:
            if not error.retriable:
                raise
            # The next batch's commit covers these offsets; a restart before it re-ranks them.
            log.warning("%s: commit failed, will be covered by the next: %s", self.name, error)

    async def _report_lag(self, consumer: Consumer) -> None:
        now = time.monotonic()
        if now - self._lag_at < LAG_EVERY_S:
            return
        self._lag_at = now
        try:
            lags = await consumer.lag()
        except BusError as error:
            log.debug("%s: lag unavailable: %s", self.name, error)
            return
        self.metrics.consumer_lag.labels(self.topics.workloads).set(sum(lags.values()))


def bootstrap(
    settings: ServiceSettings,
    bus_settings: BusSettings,
    *,
    strategy: str,
    config: RankerSettings | None = None,
    bus: Bus | None = None,
    clock: Clock | None = None,
    registry: Registry | None = None,
    tracer_provider: TracerProvider | None = None,
    whole_snapshots: bool = False,
    families: Families | None = None,
    outbox: RanksOutbox | None = None,
) -> RankerService:
    """The ranker of ``strategy`` (composition root of ``podcost ranker`` and the tests).

    ``whole_snapshots``: decode snapshots whole, not without what the strategy never reads
    (embedded mode, where the rankers and the aggregator share one decode of each record).
    ``families``: the process's metric families (default: a registry of its own).
    ``outbox``: the process's :func:`shared_outbox`, when its rankers' answers are to share
    records (default: an outbox of its own, whose records hold this strategy's answers alone).

    Start-up errors name their culprit: ``UnknownStrategyError`` (an unknown name, with the known
    ones), ``RemoteStrategyError`` (a strategy this image knows by name only: its ranker runs
    the image that has it), ``PluginError`` (a broken installed plugin) and ``PolicyError`` (a
    bad policy file, e.g. bad args for a strategy). The policies it resolves may name remote
    strategies (``PODCOST_REMOTE_STRATEGIES``); the one it runs must be installed.
    """
    config = config if config is not None else RankerSettings()
    registry = registry if registry is not None else settings.strategy_registry()
    found = registry.get_strategy(strategy)
    if found.remote:
        raise RemoteStrategyError(strategy)
    default = (
        load_policy_file(settings.policy_file, registry=registry)
        if settings.policy_file is not None
        else DEFAULT_POLICY
    )
    if found.spread:
        log.info(
            "%s is a spread strategy: the aggregator levels it, this ranker publishes nothing",
            strategy,
        )
    bus = bus if bus is not None else open_bus(bus_settings)
    metrics = Metrics(f"ranker-{strategy}", families)
    clock = clock if clock is not None else WallClock()
    partition_of = key_partitioner(bus, bus_settings)
    if outbox is None:  # one of its own: its records hold this strategy's answers alone
        outbox = RanksOutbox(
            bus, bus_settings.topics.ranks, metrics=metrics, clock=clock,
            partition_of=partition_of, backoff=settings.backoff(),
            gzip_above=gzip_threshold(bus, bus_settings),
        )  # fmt: skip
    return RankerService(
        found,
        policies=PolicyResolver(default, registry=registry),
        bus=bus,
        topics=bus_settings.topics,
        metrics=metrics,
        tracer=tracer(tracer_provider),
        clock=clock,
        group=config.group_for(found.name),
        partition_of=partition_of,
        whole_snapshots=whole_snapshots,
        backoff=settings.backoff(),
        outbox=outbox,
    )


def shared_outbox(
    settings: ServiceSettings,
    bus_settings: BusSettings,
    *,
    bus: Bus,
    families: Families | None = None,
    clock: Clock | None = None,
    config: RankerSettings | None = None,
) -> RanksOutbox:
    """The outbox the rankers of several strategies in one process share (``podcost ranker
    --strategy A --strategy B``): their answers to the same records go out in one record. Its
    records are counted as component ``rankers`` in ``families``."""
    return RanksOutbox(
        bus, bus_settings.topics.ranks, metrics=Metrics("rankers", families),
        clock=clock if clock is not None else WallClock(),
        partition_of=key_partitioner(bus, bus_settings), backoff=settings.backoff(),
        linger_s=(config if config is not None else RankerSettings()).linger_ms / 1000,
        gzip_above=gzip_threshold(bus, bus_settings),
    )  # fmt: skip
