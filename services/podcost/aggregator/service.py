"""The aggregator service: every strategy's answers for a workload combined into desired costs.

Built by :func:`bootstrap` (the composition root ``podcost aggregator``, embedded mode and the
tests use) and run by ``podcost.runtime.runner.serve``. It reads the workloads and ranks topics
keyed by workload and publishes a ``DesiredCostsMessage`` to the costs topic once every enabled
strategy has answered for a snapshot version, or after the deadline with what there is (flagged
incomplete). What a record does is ``podcost.aggregator.processor``; what is decided is
``podcost_core.aggregate``; this module only picks the transport and reports on it:

- over Kafka, a faust-streaming app (``podcost_bus.faust_app``) whose tables keep every
  workload's state across restarts and rebalances (``PODCOST_AGGREGATOR_ENGINE=faust``, the
  default), or a plain consumer-group loop (``consumer``) that rebuilds the states by reading
  again the records its waiting states were built from;
- over the in-memory bus (embedded mode), the consumer loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from opentelemetry.sdk.trace import TracerProvider

from podcost.aggregator.processor import AggregationProcessor
from podcost.aggregator.settings import AggregatorSettings
from podcost.runtime.clock import Clock, WallClock
from podcost.runtime.fleet import FleetKeys, FleetRegistry
from podcost.runtime.heap import HeapKeeper, settle_heap
from podcost.runtime.metrics import Families, Metrics
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import tracer
from podcost_bus import (
    Bus,
    BusError,
    BusSettings,
    MemoryBus,
    TopicPartition,
    gzip_threshold,
    key_partitioner,
    open_bus,
)
from podcost_bus.keyed import KeyedConsumerLoop
from podcost_contracts.topics import Topics
from podcost_core.aggregate import DECISION_UNREAD, AggregationConfig, Aggregator, PolicyResolver
from podcost_core.policy import DEFAULT_POLICY, load_policy_file
from podcost_core.strategies.registry import Registry

log = logging.getLogger("podcost.aggregator")

#: How often the consumer lag gauge is refreshed (and, until it is, whether the transport is ready,
#: to settle the heap then).
LAG_EVERY_S = 1.0


class Transport(Protocol):
    """What the service needs of ``FaustKeyedApp`` and ``KeyedConsumerLoop``."""

    async def run(self) -> None: ...

    def ready(self) -> bool: ...

    async def lag(self) -> dict[TopicPartition, int]: ...


class AggregatorService:
    """The aggregator (the runner's ``Service``); built by :func:`bootstrap`."""

    name = "aggregator"

    def __init__(
        self,
        *,
        processor: AggregationProcessor,
        transport: Transport,
        bus: Bus,
        topics: Topics,
        metrics: Metrics,
        keeper: HeapKeeper | None = None,
        internal_topics: Sequence[str] = (),
    ) -> None:
        self.internal_topics = tuple(internal_topics)
        """The transport's own topics (faust's changelogs and assignor topic), created here to
        the topic contract before the transport would create them with its defaults."""
        self.processor = processor
        self.transport = transport
        self.bus = bus
        self.topics = topics
        self.metrics = metrics
        self.keeper = keeper
        """Keeps the states out of the collector's passes once settled (``None``: the heap is
        settled once; embedded mode, whose process also holds the watcher's cache)."""

    def ready(self) -> bool:
        return self.transport.ready()

    async def run(self) -> None:
        """Aggregate until cancelled; a transport failure stops the service (and the process)."""
        await self.bus.ensure_topics([*self.topics.shared(), *self.internal_topics])
        self.metrics.record_topic_drift(self.bus.topic_drift())
        # At 0 from the start, so the first dead letter is an increase an alert sees.
        for topic in (self.topics.workloads, self.topics.ranks):
            self.metrics.consumed.labels(topic, "dead_letter")
        reporter = asyncio.create_task(self._report_lag(), name="aggregator.lag")
        try:
            await self.transport.run()
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            if self.keeper is not None:
                self.keeper.stop()  # the process may go on without it (tests, `run --kafka`)

    async def _report_lag(self) -> None:
        settled = False
        while True:
            await asyncio.sleep(LAG_EVERY_S)
            if not settled and self.transport.ready():
                # The states recovered so far are the long-lived heap (``settle_heap``).
                settle_heap()
                settled = True
            elif settled and self.keeper is not None:
                self.keeper.tick()  # and so are the states decided since
            started = time.monotonic()
            try:
                lags = await self.transport.lag()
            except BusError as error:
                log.debug("lag unavailable: %s", error)
                continue
            for topic in (self.topics.workloads, self.topics.ranks):
                total = sum(lag for tp, lag in lags.items() if tp.topic == topic)
                self.metrics.consumer_lag.labels(topic).set(total)
            log.debug("lag %s read in %.3fs", lags, time.monotonic() - started)


def bootstrap(
    settings: ServiceSettings,
    bus_settings: BusSettings,
    *,
    config: AggregatorSettings | None = None,
    bus: Bus | None = None,
    clock: Clock | None = None,
    registry: Registry | None = None,
    tracer_provider: TracerProvider | None = None,
    whole_snapshots: bool = False,
    families: Families | None = None,
) -> AggregatorService:
    """The aggregator (composition root of ``podcost aggregator``, embedded mode and the tests).

    ``whole_snapshots``: decode snapshots whole, not without what no decision reads (embedded
    mode, where the rankers and the aggregator share one decode of each record). ``families``:
    the process's metric families (default: a registry of its own).

    A bad policy file is a ``PolicyError`` naming the culprit; a broken installed plugin a
    ``PluginError``. A plugin strategy a workload may enable is either installed here too or
    named in ``PODCOST_REMOTE_STRATEGIES``: the aggregator resolves the same policies as the
    rankers and normalizes their answers, which for a remote strategy needs only its name.
    """
    config = config if config is not None else AggregatorSettings()
    registry = registry if registry is not None else settings.strategy_registry()
    default = (
        load_policy_file(settings.policy_file, registry=registry)
        if settings.policy_file is not None
        else DEFAULT_POLICY
    )
    bus = bus if bus is not None else open_bus(bus_settings)
    clock = clock if clock is not None else WallClock()
    topics = bus_settings.topics
    metrics = Metrics("aggregator", families)
    aggregator = Aggregator(
        AggregationConfig(
            deadline_s=config.deadline_seconds,
            overwrite_foreign=config.overwrite_foreign,
            early_ttl_s=config.early_answer_seconds,
        ),
        PolicyResolver(default, registry=registry),
    )
    processor = AggregationProcessor(
        aggregator,
        bus=bus,
        topics=topics,
        group=config.app_id,
        metrics=metrics,
        tracer=tracer(tracer_provider),
        clock=clock,
        partition_of=key_partitioner(bus, bus_settings),
        unread=None if whole_snapshots else DECISION_UNREAD,
        backoff=settings.backoff(),
        clock_skew=settings.clock_skew_seconds,
        fleet=FleetRegistry.open(settings.fleet_file),
        keys=FleetKeys(settings.fleet_keys_file),
        # Left to the producer's batch compression, its costs records are not gzipped one by one
        # unless large.
        costs_gzip_above=gzip_threshold(bus, bus_settings),
    )
    if settings.fleet_file is None and not isinstance(bus, MemoryBus):
        log.warning("no fleet registry (PODCOST_FLEET_FILE): serving every cluster that "
                    "publishes, and making a costs topic for each")  # fmt: skip
    sources = (topics.workloads, topics.ranks)
    transport: Transport
    internal: list[str] = []
    if (
        config.engine == "faust"
        and bus_settings.bootstrap_servers
        and not isinstance(bus, MemoryBus)
    ):
        # Imported here: faust (and mode, croniter, ...) is a second of imports that embedded
        # mode and the consumer engine never use.
        from podcost_bus.faust_adaptations import ACTIVE, STANDBY
        from podcost_bus.faust_app import FaustKeyedApp

        transport = FaustKeyedApp(
            bus_settings,
            processor,
            app_id=config.app_id,
            topics=sources,
            data_dir=config.faust_data_dir(),
            tick_s=config.tick_seconds,
            commit_interval_s=config.commit_interval_seconds,
            standby_replicas=config.standby_replicas,
            stall_s=config.stall_seconds,
            start_timeout_s=config.start_timeout_seconds,
            on_recovery_read=lambda role, count: metrics.recovery_records.labels(role).inc(count),
        )
        internal = [*transport.changelog_topics(), transport.assignor_topic()]
        stalled = transport.stalled
        metrics.aggregator_stalled.set_function(lambda: 1.0 if stalled() else 0.0)
        metrics.states.set_function(transport.state_count)
        metrics.recovering.set_function(transport.recovering_for)
        for role in (ACTIVE, STANDBY):  # both series exported from the start, at 0
            metrics.recovery_records.labels(role)
    else:
        loop = transport = KeyedConsumerLoop(
            bus, sources, config.app_id, processor, tick_s=config.tick_seconds, sleep=clock.sleep
        )
        metrics.states.set_function(lambda: len(loop.states))
    return AggregatorService(
        processor=processor,
        transport=transport,
        bus=bus,
        topics=topics,
        metrics=metrics,
        internal_topics=internal,
        # Over the in-memory bus the process is `podcost run`'s, whose heap is mostly the
        # watcher's cache: a full pass over it every few minutes is what settling it avoids.
        keeper=None if isinstance(bus, MemoryBus) else HeapKeeper(),
    )
