"""Traces: the OpenTelemetry SDK set up once per process, and W3C trace context carried in
Kafka headers so one cost decision is one trace from the watcher's snapshot to the annotator's
patches.

Span and attribute names are declared here, once, and tested. Export follows the standard
``OTEL_*`` variables: with ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_TRACES_EXPORTER=otlp``)
spans go to an OTLP collector; tests pass an in-memory exporter instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)

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


def setup_tracing(
    service: str, exporters: Sequence[SpanExporter] = (), *, set_global: bool = True
) -> TracerProvider:
    """A tracer provider for ``service``; OTLP export when the ``OTEL_*`` variables ask for it.

    ``exporters`` are added with a synchronous processor (tests read spans right away).
    """
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_TRACES_EXPORTER", ""
    ).startswith("otlp"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


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
