"""Prometheus metrics, declared once: every name a process exports and what it means.

A process has one registry (:class:`Families`) in which each family is declared once, with a
``component`` label first (``watcher``, ``ranker-<strategy>``, ``aggregator``, ``annotator``):
embedded mode runs every service in one process and they all record into the same families,
so one scrape has one ``# TYPE`` per family, never a family twice. Each service records
through its own :class:`Metrics`, a view bound to its component, so the framework code
(ranker, aggregator, annotator loops) never names the label; strategies record nothing.

Besides podcost's own families the registry holds ``podcost_build_info`` (the build that runs)
and the client library's process, platform and garbage-collector collectors (``process_*``,
``python_*``). ``/metrics`` serves :func:`render`.

Names follow Prometheus' conventions: counters end in ``_total`` (the client adds it), times are
in seconds and say so (``_seconds``), labels take a bounded set of values (topics, outcomes,
strategies, reasons; never a pod or workload name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from podcost.runtime.version import Build, build
from podcost_contracts.topic_contract import TopicDrift

# No ``<counter>_created`` gauges: Prometheus' text format has no creation time, so the client
# declares each as one more family (a time with no unit in its name) that nothing reads.
disable_created_metrics()  # type: ignore[no-untyped-call]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: The label naming the service of the process that recorded a sample. Not ``service``: the
#: Prometheus Operator sets that target label to the Kubernetes Service scraped.
COMPONENT = "component"

F = TypeVar("F", bound=MetricWrapperBase)


class Families:
    """Every metric family of one process, each declared once in one registry."""

    def __init__(self, *, identity: Build | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        c = COMPONENT
        identity = identity if identity is not None else build()
        self.build_info = Gauge(
            "podcost_build_info", "The build of podcost this process runs: always 1, its "
            "version, source revision and Python version as labels.",
            ["version", "revision", "python"], registry=r,
        )  # fmt: skip
        self.build_info.labels(**identity.labels()).set(1)
        self.consumed = Counter(
            "podcost_messages_consumed",
            "Records consumed, by topic and outcome (ok, dead_letter, future: stamped later "
            "than the reader's clock allows, dead-lettered; the annotator also other_cluster, "
            "refused: no pod it names backed by its view, stale: older than a decision it "
            "accepted, duplicate).",
            [c, "topic", "outcome"], registry=r,
        )  # fmt: skip
        self.produced = Counter(
            "podcost_messages_produced", "Records published, by topic (the aggregator's costs "
            "by each cluster's own costs topic: one series per cluster of the fleet).",
            [c, "topic"], registry=r,
        )  # fmt: skip
        self.consumer_lag = Gauge(
            "podcost_consumer_lag", "Records behind the end of the topic, by topic.",
            [c, "topic"], registry=r,
        )  # fmt: skip
        self.snapshots_published = Counter(
            "podcost_snapshots_published", "Workload snapshots the watcher published.",
            [c], registry=r,
        )  # fmt: skip
        self.leading = Gauge(
            "podcost_leading", "1 while this watcher publishes: it holds the Lease, or runs "
            "without leader election; 0 while it stands by.", [c], registry=r,
        )  # fmt: skip
        self.invalid_annotations = Counter(
            "podcost_invalid_annotations", "Pod versions seen with an annotation podcost reads "
            "that cannot be parsed, by source annotation (the pod is ranked as without it).",
            [c, "source"], registry=r,
        )  # fmt: skip
        self.snapshots_ranked = Counter(
            "podcost_snapshots_ranked", "Snapshots ranked, by strategy.", [c, "strategy"],
            registry=r,
        )  # fmt: skip
        self.strategy_duration = Histogram(
            "podcost_strategy_duration_seconds", "Time one strategy took on one snapshot.",
            [c, "strategy"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.combined = Counter(
            "podcost_combinations", "Cost decisions the aggregator made, by completeness "
            "(complete, deadline).", [c, "completeness"], registry=r,
        )  # fmt: skip
        self.patches = Counter(
            "podcost_patches", "Annotation writes, by result: how each ended (ok, unchanged, "
            "superseded, gone, skipped_foreign, dry_run, refused, revoked, error) and each request "
            "tried again (conflict, throttled, unavailable).", [c, "result"], registry=r,
        )  # fmt: skip
        self.refusals = Counter(
            "podcost_refusals", "Cost writes the annotator refused because its own view of the "
            "cluster does not back them, by reason (out_of_scope, uid_mismatch, "
            "unknown_owner, no_workload, other_workload, not_opted_in).", [c, "reason"],
            registry=r,
        )  # fmt: skip
        self.rate_limit_waits = Counter(
            "podcost_rate_limit_wait_seconds", "Time writes waited for the QPS budget.",
            [c], registry=r,
        )  # fmt: skip
        self.bus_send_waits = Counter(
            "podcost_bus_send_waits", "Embedded mode: sends the in-process bus held back "
            "until the slowest reader of their partition committed (backpressure instead of "
            "losing records past the bus's retention), by topic.", [c, "topic"],
            registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "podcost_queue_depth", "Pod writes queued in the annotator.", [c], registry=r
        )
        self.informer_synced = Gauge(
            "podcost_informer_synced", "1 once the watcher's informer cache holds its whole "
            "cluster (listed since the start), 0 before.", [c], registry=r,
        )  # fmt: skip
        self.api_server_failing = Gauge(
            "podcost_api_server_failing_seconds", "Seconds the API server has failed every "
            "request of the watcher's informer and Lease (0 while it answers).", [c], registry=r,
        )  # fmt: skip
        self.aggregator_stalled = Gauge(
            "podcost_aggregator_stalled", "1 while the aggregator's progress watchdog holds it "
            "not ready: records to process and none processed for half the stall bound (it "
            "exits at the bound, to be restarted).", [c], registry=r,
        )  # fmt: skip
        self.states_forgotten = Counter(
            "podcost_aggregator_states_forgotten", "Workload states the aggregator forgot, by "
            "reason (gone: its watcher said the workload is gone; unlisted: its watcher's live "
            "set after a sync left it out; removed: its cluster was removed from the fleet; "
            "expired: it held only answers for a snapshot that never came within the early-answer "
            "horizon, as a ranker's answers after their workload was gone do).",
            [c, "reason"], registry=r,
        )  # fmt: skip
        self.states = Gauge(
            "podcost_aggregator_states", "Workload states the aggregator holds (of the "
            "partitions assigned to it, standbys included).", [c], registry=r,
        )  # fmt: skip
        self.recovering = Gauge(
            "podcost_aggregator_recovering_seconds", "Seconds the aggregator has been "
            "rebuilding its states from the changelogs (after a start or a rebalance) without "
            "deciding for those partitions; 0 when it is not recovering.", [c], registry=r,
        )  # fmt: skip
        self.recovery_records = Counter(
            "podcost_aggregator_recovery_records", "Changelog records the aggregator's "
            "recovery applied to its states, by role of their partition (active: one it "
            "decides for, read after a start or a rebalance before it decides again; "
            "standby: a copy of another replica's, followed all along): with standby "
            "replicas, a takeover reads only what its standby did not have yet.",
            [c, "role"], registry=r,
        )  # fmt: skip
        self.event_to_annotation = Histogram(
            "podcost_event_to_annotation_seconds",
            "From the change that caused a snapshot to the patch that wrote its cost.",
            [c], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.topic_config_drift = Gauge(
            "podcost_topic_config_drift", "1 for each setting of an existing topic that differs "
            "from the topic contract (partitions, replication.factor, cleanup.policy, "
            "retention.ms, min.insync.replicas), by topic and setting, as found when the "
            "process made sure its topics exist; podcost changes no existing topic.",
            [c, "topic", "setting"], registry=r,
        )  # fmt: skip
        self.unregistered_records = Counter(
            "podcost_unregistered_records", "Records naming a cluster the fleet registry does "
            "not list, dead-lettered, by topic (the cluster is in the dead letter, never a "
            "label: an unbounded set of names).",
            [c, "topic"], registry=r,
        )  # fmt: skip
        # The process's CPU, memory, open files and start time; the Python version; the
        # garbage collector's work (the client library's own collectors).
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)


class Labelled(Generic[F]):
    """A family bound to one component: ``labels(...)`` takes the family's other labels."""

    __slots__ = ("_children", "_component", "family")

    def __init__(self, family: F, component: str) -> None:
        self.family: F = family
        self._component = component
        self._children: dict[tuple[str, ...], F] = {}
        """The children asked for so far: finding one in the family takes a lock and checks
        every label, and the services ask for the same few on every record."""

    def labels(self, *values: str) -> F:
        """The child of this component and ``values`` (the family's other labels, in order)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.family.labels(self._component, *values)
        return child


class Single(Generic[F]):
    """A family with no label but the component: its one child, made on first use, so a
    component exports only the families it records."""

    __slots__ = ("_child", "_component", "family")

    def __init__(self, family: F, component: str) -> None:
        self.family: F = family
        self._component = component
        self._child: F | None = None

    @property
    def child(self) -> F:
        if self._child is None:
            self._child = self.family.labels(self._component)
        return self._child


class SingleCounter(Single[Counter]):
    def inc(self, amount: float = 1.0) -> None:
        self.child.inc(amount)


class SingleGauge(Single[Gauge]):
    def set(self, value: float) -> None:
        self.child.set(value)

    def set_function(self, read: Callable[[], float]) -> None:
        """The gauge reads ``read()`` at each scrape."""
        self.child.set_function(read)


class SingleHistogram(Single[Histogram]):
    def observe(self, value: float) -> None:
        self.child.observe(value)


class Metrics:
    """What one service records: the process's families, bound to its ``component``.

    Without ``families`` the service gets a registry of its own (a service run alone, or a
    test's); the services of one process share the process's (:func:`podcost.embedded`)."""

    def __init__(self, component: str, families: Families | None = None) -> None:
        self.component = component
        self.families = f = families if families is not None else Families()
        self.registry = f.registry
        self.consumed = Labelled(f.consumed, component)
        self.produced = Labelled(f.produced, component)
        self.consumer_lag = Labelled(f.consumer_lag, component)
        self.snapshots_published = SingleCounter(f.snapshots_published, component)
        self.leading = SingleGauge(f.leading, component)
        self.invalid_annotations = Labelled(f.invalid_annotations, component)
        self.snapshots_ranked = Labelled(f.snapshots_ranked, component)
        self.strategy_duration = Labelled(f.strategy_duration, component)
        self.combined = Labelled(f.combined, component)
        self.patches = Labelled(f.patches, component)
        self.refusals = Labelled(f.refusals, component)
        self.rate_limit_waits = SingleCounter(f.rate_limit_waits, component)
        self.bus_send_waits = Labelled(f.bus_send_waits, component)
        self.queue_depth = SingleGauge(f.queue_depth, component)
        self.informer_synced = SingleGauge(f.informer_synced, component)
        self.api_server_failing = SingleGauge(f.api_server_failing, component)
        self.aggregator_stalled = SingleGauge(f.aggregator_stalled, component)
        self.event_to_annotation = SingleHistogram(f.event_to_annotation, component)
        self.states_forgotten = Labelled(f.states_forgotten, component)
        self.states = SingleGauge(f.states, component)
        self.recovering = SingleGauge(f.recovering, component)
        self.recovery_records = Labelled(f.recovery_records, component)
        self.topic_config_drift = Labelled(f.topic_config_drift, component)
        self.unregistered_records = Labelled(f.unregistered_records, component)

    def record_topic_drift(self, drift: Mapping[str, Sequence[TopicDrift]]) -> None:
        """Export ``drift`` (``Bus.topic_drift``) as ``podcost_topic_config_drift``."""
        for topic, differences in drift.items():
            for difference in differences:
                self.topic_config_drift.labels(topic, difference.setting).set(1)

    def get_sample_value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The registry's ``get_sample_value`` for this component: the value of sample ``name``
        with exactly ``labels`` besides the component, ``None`` when it has none yet."""
        return self.registry.get_sample_value(name, {COMPONENT: self.component, **(labels or {})})


def render(registries: Sequence[CollectorRegistry] | CollectorRegistry) -> bytes:
    """The text exposition format of ``registries``: one registry (a process's) as is; several
    (a benchmark's own next to the services') with each family's samples merged under one
    ``# HELP`` and ``# TYPE``, so no family is declared twice."""
    if isinstance(registries, CollectorRegistry):
        return generate_latest(registries)
    distinct = list({id(r): r for r in registries}.values())
    if len(distinct) == 1:
        return generate_latest(distinct[0])
    return generate_latest(_Merged(distinct))


class _Merged:
    """The families of several registries, each name once (what ``generate_latest`` reads)."""

    def __init__(self, registries: Iterable[CollectorRegistry]) -> None:
        self._registries = list(registries)

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for registry in self._registries:
            for family in registry.collect():
                known = merged.get(family.name)
                if known is None:
                    merged[family.name] = family
                else:
                    seen = {(s.name, tuple(sorted(s.labels.items()))) for s in known.samples}
                    known.samples.extend(
                        s
                        for s in family.samples
                        if (s.name, tuple(sorted(s.labels.items()))) not in seen
                    )
        return merged.values()
