"""``setup_tracing``: spans are recorded when something exports them, not when nothing does; their
ids are made and carried either way (the logs, the decision log and ``podcost explain`` read them).
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import TraceFlags, set_span_in_context

from podcost.runtime.telemetry import SPAN_COMBINE, extract, inject, setup_tracing, tracer

PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = {"traceparent": f"00-{PARENT_TRACE}-00f067aa0ba902b7-01".encode()}


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER"):
        monkeypatch.delenv(name, raising=False)


def test_nothing_exporting_records_nothing_but_makes_and_carries_the_ids() -> None:
    provider = setup_tracing("podcost-test", set_global=False)
    try:
        root = tracer(provider).start_span(SPAN_COMBINE)
        assert not root.is_recording()
        context = root.get_span_context()
        assert context.is_valid
        assert not context.trace_flags.sampled  # so flagged downstream
        # A child under a record's context keeps the record's trace, with a span id of its own.
        child = tracer(provider).start_span(SPAN_COMBINE, context=extract(PARENT))
        assert not child.is_recording()
        assert format(child.get_span_context().trace_id, "032x") == PARENT_TRACE
        assert child.get_span_context().span_id != 0x00F067AA0BA902B7
        carried = inject(set_span_in_context(child))["traceparent"]
        assert carried.startswith(f"00-{PARENT_TRACE}-")
        assert not int(carried.rsplit("-", 1)[1], 16) & TraceFlags.SAMPLED
    finally:
        provider.shutdown()


def test_an_exporter_records_every_span_with_its_attributes() -> None:
    exporter = InMemorySpanExporter()
    provider = setup_tracing("podcost-test", [exporter], set_global=False)
    try:
        span = tracer(provider).start_span(SPAN_COMBINE, context=extract(PARENT))
        assert span.is_recording()
        span.set_attribute("podcost.pods", 3)
        span.end()
        (finished,) = exporter.get_finished_spans()
        assert finished.attributes == {"podcost.pods": 3}
        assert format(finished.context.trace_id, "032x") == PARENT_TRACE
    finally:
        provider.shutdown()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # An endpoint nobody listens on: nothing is sent before shutdown, which drops it.
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
        ("OTEL_TRACES_SAMPLER", "always_on"),
    ],
)
def test_an_otlp_endpoint_or_a_sampler_in_the_environment_records(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    provider = setup_tracing("podcost-test", set_global=False)
    try:
        assert tracer(provider).start_span(SPAN_COMBINE).is_recording()
    finally:
        provider.shutdown()
