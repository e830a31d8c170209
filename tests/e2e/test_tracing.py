"""One cost decision is one trace: from the watcher's snapshot, through a span per strategy and
the aggregator's combination, to the annotator's patches — across the bus, whose records carry
the W3C trace context in their headers. Run in embedded mode against the real control plane,
with spans captured by an in-memory exporter."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from kubernetes_asyncio import config
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.conftest import ControlPlane
from tests.support.kube import KubeTestCluster

from podcost.embedded import bootstrap
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import (
    ATTR_COST,
    ATTR_POD,
    ATTR_STRATEGY,
    ATTR_WORKLOAD,
    SPAN_ANNOTATE,
    SPAN_COMBINE,
    SPAN_PATCH,
    SPAN_SNAPSHOT,
    SPAN_STRATEGY,
    setup_tracing,
)
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_kube.client import Kube

pytestmark = pytest.mark.e2e


async def test_a_cost_decision_is_one_trace_from_snapshot_to_patch(
    control_plane: ControlPlane, kube: KubeTestCluster
) -> None:
    exporter = InMemorySpanExporter()
    provider = setup_tracing("podcost-e2e", [exporter], set_global=False)
    namespace = await kube.create_namespace(f"trace-{uuid.uuid4().hex[:6]}")
    node = f"trace-node-{namespace}"
    await kube.create_node(node, zone="zone-a", labels={"trace": namespace})
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    async with api:
        pipeline = bootstrap(
            ServiceSettings(cluster="e2e", http_port=0),
            BusSettings(),
            kube=Kube(api),
            bus=MemoryBus(),
            watcher_settings=WatcherSettings(namespace=namespace, debounce_seconds=0.2),
            tracer_provider=provider,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(
            serve(pipeline.services, ServiceSettings(http_port=0), bus=pipeline.bus, stop=stop)
        )
        try:
            await kube.create_deployment(
                namespace, "web", 3, opt_in=True, node_selector={"trace": namespace}
            )
            await kube.wait_ready(namespace, "web", 3)

            def patched() -> list[object]:
                return [
                    span for span in exporter.get_finished_spans()
                    if span.name == SPAN_PATCH and span.attributes
                    and span.attributes.get("podcost.result") == "ok"
                ]  # fmt: skip

            async def some_patch() -> bool:
                if task.done():
                    task.result()
                return bool(patched())

            await kube.wait_for(some_patch, "a patch span", timeout=60)
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
            await kube.delete_namespace(namespace)
            await kube.delete_nodes([node])

    spans = exporter.get_finished_spans()
    patch = patched()[0]
    trace_id = patch.context.trace_id  # type: ignore[attr-defined]
    in_trace = [span for span in spans if span.context.trace_id == trace_id]
    names = {span.name for span in in_trace}
    assert {SPAN_SNAPSHOT, SPAN_STRATEGY, SPAN_COMBINE, SPAN_ANNOTATE, SPAN_PATCH} <= names, names
    roots = [span for span in in_trace if span.parent is None]
    assert [span.name for span in roots] == [SPAN_SNAPSHOT]
    workload = f"e2e/{namespace}/Deployment/web"
    assert roots[0].attributes[ATTR_WORKLOAD] == workload  # type: ignore[index]
    strategies = {
        span.attributes[ATTR_STRATEGY]  # type: ignore[index]
        for span in in_trace
        if span.name == SPAN_STRATEGY
    }
    assert len(strategies) >= 3, strategies
    patch_attributes = patch.attributes or {}
    assert patch_attributes[ATTR_POD]
    assert isinstance(patch_attributes[ATTR_COST], int)
