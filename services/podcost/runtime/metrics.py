"""Prometheus metrics, declared once: every name a service exports and what it means.

Each service instance gets its own ``Metrics`` (its own registry), so the services of embedded
mode and of tests never collide; the framework code (ranker, aggregator, annotator loops)
records them, strategies never do. ``/metrics`` serves ``render(metrics)``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The metrics of one service process (or one embedded service)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.consumed = Counter(
            "podcost_messages_consumed",
            "Records consumed, by topic and outcome (ok, dead_letter; the annotator also "
            "other_cluster, stale: older than a decision it accepted, duplicate).",
            ["topic", "outcome"], registry=r,
        )  # fmt: skip
        self.produced = Counter(
            "podcost_messages_produced", "Records published, by topic (the aggregator's costs "
            "by each cluster's own costs topic: one series per cluster of the fleet).",
            ["topic"], registry=r,
        )  # fmt: skip
        self.consumer_lag = Gauge(
            "podcost_consumer_lag", "Records behind the end of the topic, by topic.",
            ["topic"], registry=r,
        )  # fmt: skip
        self.snapshots_published = Counter(
            "podcost_snapshots_published", "Workload snapshots the watcher published.", registry=r
        )
        self.leading = Gauge(
            "podcost_leading", "1 while this watcher publishes: it holds the Lease, or runs "
            "without leader election; 0 while it stands by.", registry=r,
        )  # fmt: skip
        self.invalid_annotations = Counter(
            "podcost_invalid_annotations", "Pod versions seen with an annotation podcost reads "
            "that cannot be parsed, by source annotation (the pod is ranked as without it).",
            ["source"], registry=r,
        )  # fmt: skip
        self.snapshots_ranked = Counter(
            "podcost_snapshots_ranked", "Snapshots ranked, by strategy.", ["strategy"], registry=r
        )
        self.strategy_duration = Histogram(
            "podcost_strategy_duration_seconds", "Time one strategy took on one snapshot.",
            ["strategy"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.combined = Counter(
            "podcost_combinations", "Cost decisions the aggregator made, by completeness "
            "(complete, deadline).", ["completeness"], registry=r,
        )  # fmt: skip
        self.patches = Counter(
            "podcost_patches", "Annotation writes, by result: how each ended (ok, unchanged, "
            "superseded, gone, skipped_foreign, dry_run, refused, error) and each request tried "
            "again (conflict, throttled, unavailable).", ["result"], registry=r,
        )  # fmt: skip
        self.refusals = Counter(
            "podcost_refusals", "Cost writes the annotator refused because its own view of the "
            "cluster does not back them, by reason (out_of_scope, uid_mismatch, "
            "unknown_owner, no_workload, other_workload, not_opted_in).", ["reason"], registry=r,
        )  # fmt: skip
        self.rate_limit_waits = Counter(
            "podcost_rate_limit_wait_seconds", "Time writes waited for the QPS budget.", registry=r
        )
        self.queue_depth = Gauge(
            "podcost_queue_depth", "Pod writes queued in the annotator.", registry=r
        )
        self.informer_synced = Gauge(
            "podcost_informer_synced", "1 once the watcher's informer cache holds its whole "
            "cluster (listed since the start), 0 before.", registry=r,
        )  # fmt: skip
        self.api_server_failing = Gauge(
            "podcost_api_server_failing_seconds", "Seconds the API server has failed every "
            "request of the watcher's informer and Lease (0 while it answers).", registry=r,
        )  # fmt: skip
        self.aggregator_stalled = Gauge(
            "podcost_aggregator_stalled", "1 while the aggregator's progress watchdog holds it "
            "not ready: records to process and none processed for half the stall bound (it "
            "exits at the bound, to be restarted).", registry=r,
        )  # fmt: skip
        self.event_to_annotation = Histogram(
            "podcost_event_to_annotation_seconds",
            "From the change that caused a snapshot to the patch that wrote its cost.",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip


def render(metrics: Metrics) -> bytes:
    """The text exposition format of ``metrics``."""
    return generate_latest(metrics.registry)
