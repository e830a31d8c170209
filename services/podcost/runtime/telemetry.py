"""Traces: the OpenTelemetry SDK set up once per process, and W3C trace context carried in
Kafka headers so one cost decision is one trace from the watcher's snapshot to the annotator's
patches.

Span and attribute names are declared here, once, and tested. Export follows the standard
``OTEL_*`` variables: with ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_TRACES_EXPORTER=otlp``)
spans go to an OTLP collector; tests pass an in-memory exporter instead. With nothing to export
to, spans are not recorded, but their ids are still made and carried (:func:`_sampler`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import (
    SERVICE_INSTANCE_ID,
    SERVICE_NAME,
    SERVICE_VERSION,
    Resource,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Sampler
from opentelemetry.util.types import AttributeValue

from podcost.runtime.version import build
from podcost_contracts.messages import trace_context

TRACER = "podcost"

# Span names: one per step of a decision.
SPAN_SNAPSHOT = "podcost.snapshot"
SPAN_RANK = "podcost.rank"
SPAN_STRATEGY = "podcost.strategy"
SPAN_COMBINE = "podcost.combine"
SPAN_ANNOTATE = "podcost.annotate"
SPAN_PATCH = "podcost.patch"

# Attribute names.
ATTR_WORKLOAD = "podcost.workload"
ATTR_VERSION = "podcost.version"
ATTR_STRATEGY = "podcost.strategy"
ATTR_WEIGHT = "podcost.weight"
ATTR_TIER = "podcost.tier"
ATTR_POD = "podcost.pod"
ATTR_RANK = "podcost.rank"
ATTR_COST = "podcost.cost"
ATTR_PODS = "podcost.pods"
ATTR_WRITES = "podcost.writes"
ATTR_COMPLETE = "podcost.complete"
ATTR_MISSING = "podcost.missing"
ATTR_RESULT = "podcost.result"

# OpenTelemetry's semantic conventions for messaging (Kafka) and Kubernetes resources, so that
# standard tooling reads podcost's spans. A span that publishes a record is a PRODUCER ("send");
# a span that processes one consumed record is a CONSUMER ("process") whose parent is the
# record's creation context; a span that writes a pod is a CLIENT of the API server.
ATTR_MESSAGING_SYSTEM = "messaging.system"
ATTR_DESTINATION = "messaging.destination.name"
ATTR_OPERATION_TYPE = "messaging.operation.type"
ATTR_OPERATION_NAME = "messaging.operation.name"
ATTR_CONSUMER_GROUP = "messaging.consumer.group.name"
ATTR_MESSAGE_KEY = "messaging.kafka.message.key"
ATTR_PARTITION = "messaging.destination.partition.id"
ATTR_OFFSET = "messaging.kafka.offset"
ATTR_K8S_NAMESPACE = "k8s.namespace.name"
ATTR_K8S_POD = "k8s.pod.name"
ATTR_K8S_DEPLOYMENT = "k8s.deployment.name"
ATTR_K8S_REPLICASET = "k8s.replicaset.name"
MESSAGING_SYSTEM = "kafka"


def sending(topic: str, key: str) -> dict[str, AttributeValue]:
    """The messaging attributes of a span that publishes the record ``key`` to ``topic``."""
    return {
        ATTR_MESSAGING_SYSTEM: MESSAGING_SYSTEM,
        ATTR_DESTINATION: topic,
        ATTR_OPERATION_TYPE: "send",
        ATTR_OPERATION_NAME: "send",
        ATTR_MESSAGE_KEY: key,
    }


def processing(
    topic: str, partition: int, offset: int, key: bytes | None, group: str
) -> dict[str, AttributeValue]:
    """The messaging attributes of a span that processes one record consumed by ``group``."""
    attributes: dict[str, AttributeValue] = {
        ATTR_MESSAGING_SYSTEM: MESSAGING_SYSTEM,
        ATTR_DESTINATION: topic,
        ATTR_OPERATION_TYPE: "process",
        ATTR_OPERATION_NAME: "process",
        ATTR_CONSUMER_GROUP: group,
        ATTR_PARTITION: str(partition),
        ATTR_OFFSET: offset,
    }
    if key is not None:
        attributes[ATTR_MESSAGE_KEY] = key.decode(errors="replace")
    return attributes


def workload_resource(key: str) -> dict[str, AttributeValue]:
    """The Kubernetes attributes of the workload a bus key (``cluster/namespace/kind/name``)
    names: its namespace, and its Deployment or ReplicaSet name."""
    parts = key.split("/")
    if len(parts) != 4:
        return {}
    _, namespace, kind, name = parts
    attributes: dict[str, AttributeValue] = {ATTR_K8S_NAMESPACE: namespace}
    if kind == "Deployment":
        attributes[ATTR_K8S_DEPLOYMENT] = name
    elif kind == "ReplicaSet":
        attributes[ATTR_K8S_REPLICASET] = name
    return attributes


def setup_tracing(
    service: str, exporters: Sequence[SpanExporter] = (), *, set_global: bool = True
) -> TracerProvider:
    """A tracer provider for ``service``; OTLP export when the ``OTEL_*`` variables ask for it.
    Its resource names the build and this process (``service.version``, ``service.instance.id``,
    ``vcs.revision``); ``OTEL_RESOURCE_ATTRIBUTES`` may add more.

    ``exporters`` are added with a synchronous processor (tests read spans right away).
    """
    otlp = bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")) or os.environ.get(
        "OTEL_TRACES_EXPORTER", ""
    ).startswith("otlp")
    identity = build()
    provider = TracerProvider(
        resource=Resource.create(
            {
                SERVICE_NAME: service,
                SERVICE_VERSION: identity.version,
                SERVICE_INSTANCE_ID: identity.instance,
                "vcs.revision": identity.revision,
            }
        ),
        sampler=_sampler(exporting=otlp or bool(exporters)),
    )
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def _sampler(*, exporting: bool) -> Sampler | None:
    """The sampler of a provider :func:`setup_tracing` sets up: ``None`` (the SDK's own choice:
    ``OTEL_TRACES_SAMPLER``, else parent-based, always on) when something exports the spans or
    that variable is set; else one that records nothing.

    A span nothing exports is never read, and recording it cost a decision of the aggregator
    a twentieth of its CPU (`micro_aggregator.py`: its attributes, every pod's rank and cost).
    Not recorded, it still has its trace id and span id, carried downstream in the W3C
    ``traceparent`` (flagged not sampled), so the logs, the annotator's decision log and
    ``podcost explain`` keep them. A service that exports under a parent flagged not sampled
    follows it (the SDK's parent-based default) and records nothing either: export from every
    service of a deployment (the chart's ``opentelemetry.endpoint`` is every component's) or
    set ``OTEL_TRACES_SAMPLER=always_on`` where it exports."""
    if exporting or os.environ.get("OTEL_TRACES_SAMPLER"):
        return None
    return ALWAYS_OFF


def tracer(provider: trace.TracerProvider | None = None) -> trace.Tracer:
    return (provider or trace.get_tracer_provider()).get_tracer(TRACER)


def inject(ctx: context.Context | None = None) -> dict[str, str]:
    """The W3C trace context of ``ctx`` (default: the current one) as header strings."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return carrier


def extract(headers: Mapping[str, bytes] | None) -> context.Context:
    """The trace context carried in Kafka headers (an empty context when there is none)."""
    return propagate.extract(trace_context(headers or {}))
