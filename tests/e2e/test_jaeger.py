"""One cost decision is one trace in a real Jaeger, with every service its own process.

The chart rendered by the real helm in ``core`` mode (one ranker per strategy of the default
policy, and the aggregator) and in ``agent`` mode for one cluster (watcher and annotator), its
``opentelemetry.endpoint`` set to a real Jaeger's OTLP/HTTP receiver
(``podcost_localinfra.jaeger``): each container is a ``python -m podcost`` process
(``tests/support/services.py``) over the real broker and the real control plane, exporting its
spans through the OpenTelemetry SDK's batch processor, as in a cluster.

For an opted-in Deployment, Jaeger's query API (``/api/traces``) returns, for a PATCH that wrote
a cost, ONE trace holding the watcher's ``podcost.snapshot`` (its only root), each ranker's
``podcost.strategy`` (strategy, weight), the aggregator's ``podcost.combine`` (each pod's rank and
cost) and the annotator's ``podcost.annotate`` and ``podcost.patch`` (pod, cost), each span from
the service that made it and with the parent that the record it consumed carried.
``podcost explain`` (its own process, asking the annotator process) prints, for a pod of that
trace, the trace id of the decision it explains, which Jaeger returns as that pod's decision's
trace, and with ``--trace-ui`` its link in Jaeger's UI.
The same processes serve the health gauges the chart's alert rules read
(``podcost_informer_synced``, ``podcost_api_server_failing_seconds``,
``podcost_aggregator_stalled``) with their healthy values.

Batches: a ranks record carries many answers and the aggregator decides many workloads per batch;
each answer and each decision carries its own snapshot's trace context in the payload, so each
decision's spans take the creation context of the message they process as their parent (the
messaging conventions' "process span per message"), rather than one span per batch with links,
which would cut every decision into a trace per batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import ControlPlane, unavailable
from tests.support.kube import KubeTestCluster, costed_by_podcost
from tests.support.services import ServiceSpec, assert_alive, chart_specs, processes
from tests.support.tools import require_helm

from podcost.runtime.telemetry import (
    ATTR_COST,
    ATTR_POD,
    ATTR_PODS,
    ATTR_RANK,
    ATTR_RESULT,
    ATTR_STRATEGY,
    ATTR_WEIGHT,
    ATTR_WORKLOAD,
    MESSAGING_SYSTEM,
    SPAN_ANNOTATE,
    SPAN_COMBINE,
    SPAN_PATCH,
    SPAN_SNAPSHOT,
    SPAN_STRATEGY,
)
from podcost_core.policy import DEFAULT_POLICY
from podcost_localinfra import build, jaeger, process

pytestmark = pytest.mark.e2e

CLUSTER = "a"
ZONES = ("zone-a", "zone-b", "zone-c")
#: The strategies whose rankers answer: a spread strategy's ranker publishes nothing (the
#: aggregator levels it), so it has no span in a decision's trace.
RANKED = tuple(b.name for b in DEFAULT_POLICY.bound if not b.strategy.spread)


@pytest.fixture
def jaeger_server(tmp_path: Path) -> Iterator[jaeger.Jaeger]:
    """A real Jaeger of its own for the test (built into the cache if missing)."""
    try:
        server = jaeger.start(tmp_path / "jaeger")
    except (build.BuildError, process.StartError, OSError) as error:
        unavailable(f"jaeger is unavailable: {error}")
    try:
        yield server
    finally:
        server.stop()


def tags(span: Mapping[str, Any]) -> dict[str, Any]:
    """A Jaeger span's tags (its attributes) as a dict."""
    return {tag["key"]: tag["value"] for tag in span.get("tags") or []}


def parent_id(span: Mapping[str, Any]) -> str | None:
    refs = [ref for ref in span.get("references") or [] if ref["refType"] == "CHILD_OF"]
    return refs[0]["spanID"] if refs else None


def service_of(trace: Mapping[str, Any], span: Mapping[str, Any]) -> str:
    return str(trace["processes"][span["processID"]]["serviceName"])


def describe(trace: Mapping[str, Any]) -> str:
    """The trace as a tree of ``service: span {key tags}`` lines (for failures and the log)."""
    spans = {span["spanID"]: span for span in trace["spans"]}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in sorted(trace["spans"], key=lambda s: s["startTime"]):
        parent = parent_id(span)
        children.setdefault(parent if parent in spans else None, []).append(span)
    shown = (ATTR_WORKLOAD, ATTR_STRATEGY, ATTR_WEIGHT, ATTR_POD, ATTR_COST, ATTR_RESULT)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in children.get(parent, []):
            attributes = {k: v for k, v in tags(span).items() if k in shown}
            lines.append(f"{'  ' * depth}{service_of(trace, span)}: {span['operationName']} "
                         f"{json.dumps(attributes)}")  # fmt: skip
            walk(span["spanID"], depth + 1)

    walk(None, 0)
    return "\n".join(lines)


async def test_a_decision_is_one_trace_in_jaeger_across_every_service_process(
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    kube: KubeTestCluster,
    jaeger_server: jaeger.Jaeger,
    tmp_path: Path,
) -> None:
    helm = require_helm()
    run = f"jaeger-{uuid.uuid4().hex[:6]}"
    namespace = run
    otel = {"endpoint": jaeger_server.otlp_http}
    kafka = {"bootstrapServers": kafka_bootstrap}
    specs: list[ServiceSpec] = chart_specs(
        helm, {"mode": "core", "kafka": kafka, "opentelemetry": otel}, prefix="core/"
    )
    agent = {"mode": "agent", "clusterName": CLUSTER, "kafka": kafka, "opentelemetry": otel,
             "watch": {"namespace": namespace}}  # fmt: skip
    for spec in chart_specs(helm, agent, prefix=f"{CLUSTER}/"):
        specs.append(ServiceSpec(spec.name, spec.args, {**spec.env,
                                 "KUBECONFIG": str(control_plane.kubeconfig)},
                                 spec.files, spec.scratch))  # fmt: skip
    assert all(s.env.get("OTEL_EXPORTER_OTLP_ENDPOINT") == otel["endpoint"] for s in specs)
    env = {
        "PODCOST_TOPIC_WORKLOADS": f"{run}.workloads",
        "PODCOST_TOPIC_RANKS": f"{run}.ranks",
        "PODCOST_TOPIC_COSTS": f"{run}.costs",
        "PODCOST_TOPIC_DEADLETTER": f"{run}.deadletter",
        "PODCOST_AGGREGATOR_APP_ID": f"{run}-aggregator",
        # The SDK's batch processor exports every 5 s by default: sooner, for the test's wait.
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    nodes = [f"{run}-{zone}" for zone in ZONES]
    workload = f"{CLUSTER}/{namespace}/Deployment/web"
    try:
        async with processes(specs, env=env, log_dir=tmp_path, ready_timeout=240) as running:
            await kube.create_namespace(namespace)
            await asyncio.gather(*(
                kube.create_node(node, zone=zone, labels={"jaeger": run})
                for node, zone in zip(nodes, ZONES, strict=True)
            ))  # fmt: skip
            await kube.create_deployment(
                namespace, "web", 3, opt_in=True, node_selector={"jaeger": run}
            )
            await kube.wait_ready(namespace, "web", 3)

            async def costed() -> bool:
                # A pod whose decided cost is 0 needs no write (no annotation reads as 0).
                assert_alive(running)
                pods = (await kube.core.list_namespaced_pod(namespace)).items
                return any(costed_by_podcost(pod) for pod in pods)

            await kube.wait_for(costed, "a pod costed by podcost", timeout=120)
            trace = await _whole_trace(jaeger_server, workload)
            annotator = running[f"{CLUSTER}/annotator"]
            explained = await _explain_in_jaeger(
                jaeger_server, control_plane, annotator.port, trace, workload
            )
            # The health gauges the alert rules read, as the processes serve them.
            watcher, aggregator = running[f"{CLUSTER}/watcher"], running["core/aggregator"]
            assert await watcher.sample("podcost_informer_synced") == 1
            assert await watcher.sample("podcost_api_server_failing_seconds") == 0
            assert await aggregator.sample("podcost_aggregator_stalled") == 0
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes(nodes)

    print(f"podcost explain {explained}")
    print(f"trace {trace['traceID']} as Jaeger returns it:\n{describe(trace)}")
    print(json.dumps([{"service": service_of(trace, s), "name": s["operationName"],
                       "parent": parent_id(s), "id": s["spanID"], "tags": tags(s)}
                      for s in trace["spans"]], indent=1, default=str))  # fmt: skip
    _check_conventions(trace, run, namespace)
    spans = trace["spans"]
    by_id = {span["spanID"]: span for span in spans}
    roots = [span for span in spans if parent_id(span) not in by_id]
    assert [(service_of(trace, s), s["operationName"]) for s in roots] == [
        ("podcost-watcher", SPAN_SNAPSHOT)
    ], describe(trace)
    [snapshot] = roots
    assert tags(snapshot)[ATTR_WORKLOAD] == workload

    def named(name: str) -> list[dict[str, Any]]:
        return [span for span in spans if span["operationName"] == name]

    strategies = {}
    for span in named(SPAN_STRATEGY):
        attributes = tags(span)
        strategies[attributes[ATTR_STRATEGY]] = attributes[ATTR_WEIGHT]
        assert service_of(trace, span) == f"podcost-ranker-{attributes[ATTR_STRATEGY]}"
        assert parent_id(span) == snapshot["spanID"]
        assert attributes[ATTR_WORKLOAD] == workload
    assert set(strategies) == set(RANKED), describe(trace)
    assert all(isinstance(weight, int) and weight > 0 for weight in strategies.values())

    [combine] = named(SPAN_COMBINE)
    assert service_of(trace, combine) == "podcost-aggregator"
    assert parent_id(combine) == snapshot["spanID"]
    combined = tags(combine)
    assert combined[ATTR_WORKLOAD] == workload
    for key in (ATTR_POD, ATTR_RANK, ATTR_COST):  # three aligned arrays, one entry per pod
        assert len(_array(combined[key])) == combined[ATTR_PODS], (key, combined[key])

    [annotate] = named(SPAN_ANNOTATE)
    assert service_of(trace, annotate) == "podcost-annotator"
    assert parent_id(annotate) == combine["spanID"]
    patches = [span for span in named(SPAN_PATCH) if tags(span).get(ATTR_RESULT) == "ok"]
    assert patches, describe(trace)
    decided = dict(zip(_array(combined[ATTR_POD]), _array(combined[ATTR_COST]), strict=True))
    for patch in patches:
        assert service_of(trace, patch) == "podcost-annotator"
        assert parent_id(patch) == annotate["spanID"]
        attributes = tags(patch)
        assert attributes[ATTR_POD].startswith(f"{namespace}/web-")
        assert attributes[ATTR_COST] == decided[attributes[ATTR_POD]]


async def _explain_in_jaeger(
    server: jaeger.Jaeger,
    control_plane: ControlPlane,
    annotator_port: int,
    trace: Mapping[str, Any],
    workload: str,
) -> str:
    """Run ``podcost explain`` for a pod the trace wrote, with Jaeger's UI as ``--trace-ui``;
    check that the trace id it prints is a trace Jaeger holds whose decision names that pod.
    Returns the command's trace line."""
    [pod, *_] = [tags(s)[ATTR_POD] for s in trace["spans"] if s["operationName"] == SPAN_PATCH]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PODCOST_", "OTEL_"))}
    env["KUBECONFIG"] = str(control_plane.kubeconfig)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "podcost", "explain", pod,
        "--url", f"http://127.0.0.1:{annotator_port}", "--trace-ui", server.query,
        "--output", "json",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    report = json.loads(out)
    trace_id = report["decision"]["trace_id"]
    assert isinstance(trace_id, str), report
    assert len(trace_id) == 32, report
    assert report["trace_url"] == f"{server.query}/trace/{trace_id}", report

    # The UI's route of that trace answers (the module build serves a placeholder page).
    def ui_status() -> int:
        with urllib.request.urlopen(report["trace_url"], timeout=10) as response:
            return int(response.status)

    assert await asyncio.to_thread(ui_status) == 200

    async def held() -> bool:
        found = await asyncio.to_thread(server.trace, trace_id)
        if found is None:
            return False
        roots = [s for s in found["spans"] if s["operationName"] == SPAN_SNAPSHOT]
        combines = [s for s in found["spans"] if s["operationName"] == SPAN_COMBINE]
        return (
            [tags(s).get(ATTR_WORKLOAD) for s in roots] == [workload]
            and any(pod in _array(tags(s)[ATTR_POD]) for s in combines)
        )  # fmt: skip

    await KubeTestCluster.wait_for(held, f"trace {trace_id} of {pod} in Jaeger", timeout=60)
    return f"{pod}: trace {trace_id}, {report['trace_url']}"


def _array(value: Any) -> list[Any]:
    """An array attribute as Jaeger's JSON model gives it (a JSON-encoded string)."""
    decoded = json.loads(value) if isinstance(value, str) else value
    assert isinstance(decoded, list), value
    return decoded


async def _whole_trace(server: jaeger.Jaeger, workload: str) -> dict[str, Any]:
    """The trace of a PATCH that wrote a cost of ``workload``, once Jaeger holds the spans of
    every service of it (each process exports its batches on its own schedule)."""
    wanted = {"podcost-watcher", "podcost-aggregator", "podcost-annotator",
              *(f"podcost-ranker-{name}" for name in RANKED)}  # fmt: skip
    last: dict[str, Any] = {}

    async def complete() -> bool:
        nonlocal last
        found = await asyncio.to_thread(
            server.traces, "podcost-annotator", operation=SPAN_PATCH,
            tags=json.dumps({ATTR_RESULT: "ok"}),
        )  # fmt: skip
        for candidate in found:
            trace = await asyncio.to_thread(server.trace, candidate["traceID"])
            if trace is None:
                continue
            services = {service_of(trace, span) for span in trace["spans"]}
            roots = [s for s in trace["spans"] if s["operationName"] == SPAN_SNAPSHOT]
            if roots and tags(roots[0]).get(ATTR_WORKLOAD) == workload:
                last = trace
                if wanted <= services and any(
                    s["operationName"] == SPAN_ANNOTATE for s in trace["spans"]
                ):
                    return True
        return False

    try:
        await KubeTestCluster.wait_for(complete, "a whole decision's trace in Jaeger", timeout=60)
    except AssertionError:
        shown = describe(last) if last else None
        raise AssertionError(f"incomplete trace in Jaeger:\n{shown}") from None
    return last


def _check_conventions(trace: Mapping[str, Any], run: str, namespace: str) -> None:
    """The messaging and Kubernetes semantic conventions, read off the spans Jaeger stores."""
    costs_topic = f"{run}.costs.{CLUSTER}"
    for span in trace["spans"]:
        attributes, name = tags(span), span["operationName"]
        where = f"{service_of(trace, span)}: {name} {attributes}"
        if name == SPAN_PATCH:
            assert attributes["span.kind"] == "client", where
            assert attributes["k8s.namespace.name"] == namespace, where
            assert attributes["k8s.pod.name"].startswith("web-"), where
            continue
        if name not in (SPAN_SNAPSHOT, SPAN_STRATEGY, SPAN_COMBINE, SPAN_ANNOTATE):
            continue
        assert attributes["messaging.system"] == MESSAGING_SYSTEM, where
        assert attributes["messaging.kafka.message.key"] == attributes[ATTR_WORKLOAD], where
        assert attributes["k8s.namespace.name"] == namespace, where
        assert attributes["k8s.deployment.name"] == "web", where
        if name in (SPAN_SNAPSHOT, SPAN_COMBINE):  # each publishes the record it names
            assert attributes["span.kind"] == "producer", where
            assert attributes["messaging.operation.type"] == "send", where
            assert attributes["messaging.operation.name"] == "send", where
            topic = f"{run}.workloads" if name == SPAN_SNAPSHOT else costs_topic
            assert attributes["messaging.destination.name"] == topic, where
        else:  # each processes one record it consumed
            assert attributes["span.kind"] == "consumer", where
            assert attributes["messaging.operation.type"] == "process", where
            assert attributes["messaging.operation.name"] == "process", where
            topic = f"{run}.workloads" if name == SPAN_STRATEGY else costs_topic
            assert attributes["messaging.destination.name"] == topic, where
            group = attributes["messaging.consumer.group.name"]
            suffix = attributes[ATTR_STRATEGY] if name == SPAN_STRATEGY else f".{CLUSTER}"
            assert group.endswith(suffix), where
            assert int(attributes["messaging.destination.partition.id"]) >= 0, where
            assert isinstance(attributes["messaging.kafka.offset"], int), where
