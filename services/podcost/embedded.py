"""Embedded mode: every service of the pipeline in one process, sharing one bus.

``podcost run`` (and the end-to-end tests) call :func:`bootstrap`: one watcher, one ranker per
strategy the registry knows (built-in and plugins; a strategy no workload enables costs nothing,
its ranker publishes nothing), the aggregator and the annotator. Without ``PODCOST_KAFKA`` they
share an in-process ``MemoryBus`` — the default for a laptop, a demo or a small cluster; with it,
they talk over Kafka exactly as separate processes would. The pure logic is the same either way;
only the transport differs.

Readiness after a start: the annotator is not ready until it has written the decisions of the
watcher's first pass (every opted-in workload once, after the sync): until then the costs on the
pods may be older than the cluster, and ``/readyz`` says so (503, "not ready").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import TracerProvider

from podcost import aggregator, ranker
from podcost.aggregator.settings import AggregatorSettings
from podcost.annotator.plan import Scope
from podcost.annotator.service import PodAPI
from podcost.annotator.service import bootstrap as bootstrap_annotator
from podcost.annotator.settings import AnnotatorSettings
from podcost.annotator.view import SharedView
from podcost.runtime.clock import Clock
from podcost.runtime.metrics import Families
from podcost.runtime.runner import Service
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherService, WatcherSettings
from podcost.watcher.service import bootstrap as bootstrap_watcher
from podcost_bus import Bus, BusSettings, MemoryBus, open_bus
from podcost_core.strategies.registry import Registry, default_registry
from podcost_kube.client import Kube


@dataclass(frozen=True)
class Pipeline:
    """The services of one embedded process and the bus they share."""

    bus: Bus
    watcher: WatcherService
    rankers: Sequence[Service]
    aggregator: Service
    annotator: Service

    @property
    def services(self) -> list[Service]:
        return [self.watcher, *self.rankers, self.aggregator, self.annotator]


def bootstrap(
    settings: ServiceSettings,
    bus_settings: BusSettings,
    *,
    kube: Kube,
    bus: Bus | None = None,
    watcher_settings: WatcherSettings | None = None,
    aggregator_settings: AggregatorSettings | None = None,
    annotator_settings: AnnotatorSettings | None = None,
    strategies: Sequence[str] | None = None,
    registry: Registry | None = None,
    clock: Clock | None = None,
    tracer_provider: TracerProvider | None = None,
    families: Families | None = None,
) -> Pipeline:
    """The whole pipeline over one bus (composition root of ``podcost run`` and the e2e tests).

    ``strategies`` limits the rankers (default: every strategy of the registry). Start-up
    errors of any service (bad policy file, unknown strategy, broken plugin) raise here.
    Every service records into one registry, ``families`` (default: a new one), so the
    process's ``/metrics`` declares each family once.
    """
    registry = registry if registry is not None else default_registry()
    bus = bus if bus is not None else open_bus(bus_settings)
    names = list(strategies) if strategies is not None else sorted(registry)
    pods: PodAPI = kube
    families = families if families is not None else Families()
    watcher = bootstrap_watcher(
        settings, bus_settings, watcher_settings, kube=kube, bus=bus,
        tracer_provider=tracer_provider, families=families,
    )  # fmt: skip
    # One cache of the cluster: the annotator verifies against the watcher's (both list and
    # watch the same objects of the same scope from the same API server).
    scope = Scope(watcher.settings.namespaces(), watcher.rules)
    view = SharedView(scope, store=watcher.store, synced=watcher.synced)
    watcher.observers.append(view.observe)
    if isinstance(bus, MemoryBus):
        # The process's own bus: its backpressure is counted once, with the watcher's metrics.
        waits = watcher.metrics.bus_send_waits
        bus.on_wait = lambda topic: waits.labels(topic).inc()
    return Pipeline(
        bus=bus,
        watcher=watcher,
        rankers=[
            # Whole snapshots: one decode of each record, shared in the process, serves the
            # rankers and the aggregator (each leaving out what it never reads would decode
            # every record several times).
            ranker.bootstrap(
                settings, bus_settings, strategy=name, bus=bus, clock=clock, registry=registry,
                tracer_provider=tracer_provider, whole_snapshots=True, families=families,
            )
            for name in names
        ],
        aggregator=aggregator.bootstrap(
            settings, bus_settings, config=aggregator_settings, bus=bus, clock=clock,
            registry=registry, tracer_provider=tracer_provider, whole_snapshots=True,
            families=families,
        ),
        annotator=bootstrap_annotator(
            settings, bus_settings, annotator_settings or AnnotatorSettings(), bus=bus,
            kube=pods, tracer_provider=tracer_provider, catch_up=watcher.first_pass,
            scope=scope, view=view, families=families,
        ),
    )  # fmt: skip
