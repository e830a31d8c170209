"""``podcost explain`` against the real control plane and the embedded pipeline: for a pod podcost
annotated, the command (run as a user runs it, in its own process) shows the cost the pod
carries and the trace that wrote it, as the annotator's spans recorded it; for a pod of a
workload podcost has not decided, it says so and shows what the pure core decides now — the
costs ``rank`` and ``label_costs`` give the workload as the cluster holds it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import config
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.conftest import ControlPlane
from tests.support.kube import COST_ANNOTATION, KubeTestCluster
from tests.support.pipeline import expected_costs

from podcost.annotator.service import AnnotatorService
from podcost.embedded import bootstrap
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import ATTR_COST, ATTR_POD, ATTR_RESULT, SPAN_PATCH, setup_tracing
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube, KubeError

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _host_address() -> str:
    """This machine's address on its network (not loopback): what the API server's proxy may
    dial, as it dials a pod's IP (it refuses loopback and link-local endpoints)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("198.51.100.1", 9))  # no packet is sent: it picks the route's address
        address: str = sock.getsockname()[0]
    assert not address.startswith("127."), f"no address but loopback: {address}"
    return address


async def _annotator_service(kube: KubeTestCluster, namespace: str, port: int) -> str:
    """A Service named as the chart names the annotator's, port ``http``, whose endpoint is this
    process's HTTP port; once the API server's proxy reaches it.

    The API server proxies a Service only to an endpoint whose target is a Pod of that address
    (``isValidAddress`` of the service REST storage), never to a loopback one. So a Pod stands
    in for the annotator's, as kwok's nodes stand in for kubelets: gated from scheduling, its
    status given :func:`_host_address` (where this process listens), and the Service's
    Endpoints point at it, as the endpoints controller writes them for a Service that selects
    the chart's annotator pods."""
    name, address = "podcost-annotator", _host_address()
    stand_in = f"{name}-0"
    await kube.core.create_namespaced_pod(namespace, {
        "metadata": {"name": stand_in, "labels": {"app.kubernetes.io/component": "annotator"}},
        "spec": {"schedulingGates": [{"name": "podcost.dev/stand-in"}],
                 "containers": [{"name": "annotator", "image": "registry.local/podcost:test"}]},
    })  # fmt: skip
    await kube.core.patch_namespaced_pod_status(
        stand_in, namespace, {"status": {"podIP": address, "podIPs": [{"ip": address}]}}
    )
    await kube.core.create_namespaced_service(namespace, {
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": port}]},
    })  # fmt: skip
    await kube.core.create_namespaced_endpoints(namespace, {
        "metadata": {"name": name},
        "subsets": [{
            "addresses": [{"ip": address, "targetRef": {
                "kind": "Pod", "namespace": namespace, "name": stand_in}}],
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        }],
    })  # fmt: skip

    last: list[str] = []

    async def proxied() -> bool:
        try:
            answer = await Kube(kube.api).get_through_service(namespace, name, "http", "/healthz")
        except KubeError as error:
            last[:] = [str(error)]
            return False  # the API server's cache has not the slice yet
        return answer is not None and answer.get("status") == "ok"

    try:
        await kube.wait_for(proxied, "the API server to proxy to the annotator", timeout=30)
    except AssertionError as error:
        raise AssertionError(f"{error}; last answer: {last}") from error
    return f"{namespace}/{name}"


async def _explain(control_plane: ControlPlane, *args: str) -> dict[str, Any]:
    """``podcost explain ARGS --output json`` in its own process; its JSON report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCOST_")}
    env.update({"KUBECONFIG": str(control_plane.kubeconfig), "PODCOST_CLUSTER": "e2e"})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "podcost", "explain", *args, "--output", "json",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    report: dict[str, Any] = json.loads(out)
    return report


async def test_explain_shows_the_written_cost_and_the_trace_that_wrote_it(
    control_plane: ControlPlane, kube: KubeTestCluster
) -> None:
    exporter = InMemorySpanExporter()
    provider = setup_tracing("podcost-e2e", [exporter], set_global=False)
    namespace = await kube.create_namespace(f"explain-{uuid.uuid4().hex[:6]}")
    zones = ("zone-a", "zone-b", "zone-c")
    nodes = [f"{namespace}-{zone}" for zone in zones]
    for node, zone in zip(nodes, zones, strict=True):
        await kube.create_node(node, zone=zone, labels={"explain": namespace})
    port = _free_port()
    # Every interface: the API server's proxy reaches it at the host's address.
    settings = ServiceSettings(cluster="e2e", http_host="0.0.0.0", http_port=port)
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    async with api:
        pipeline = bootstrap(
            settings,
            BusSettings(),
            kube=Kube(api),
            bus=MemoryBus(),
            watcher_settings=WatcherSettings(
                namespace=namespace, debounce_seconds=0.2, max_delay_seconds=1.0
            ),
            tracer_provider=provider,
        )
        annotator = pipeline.annotator
        assert isinstance(annotator, AnnotatorService)
        stop = asyncio.Event()
        task = asyncio.create_task(serve(pipeline.services, settings, bus=pipeline.bus, stop=stop))
        try:
            await kube.create_deployment(
                namespace, "web", 4, opt_in=True, node_selector={"explain": namespace}
            )
            await kube.wait_ready(namespace, "web", 4)

            async def settled() -> bool:
                """Every pod carries the cost of the annotator's last decision about it."""
                if task.done():
                    task.result()
                for pod in await kube.active_pods(namespace, "web"):
                    known = annotator.decisions.get(namespace, pod.name)
                    # No annotation reads as 0, and podcost leaves it so where 0 is wanted.
                    cost = (pod.raw.metadata.annotations or {}).get(COST_ANNOTATION, "0")
                    if known is None or known.result not in ("ok", "unchanged"):
                        return False
                    if cost != str(known.cost):
                        return False
                return True

            await kube.wait_for(settled, "every pod annotated with its last decision", 90)
            # A pod whose cost podcost wrote (not one it left at the 0 it reads as).
            pod = next(
                p.name
                for p in await kube.active_pods(namespace, "web")
                if COST_ANNOTATION in (p.raw.metadata.annotations or {})
            )
            report = await _explain(
                control_plane, f"{namespace}/{pod}", "--url", f"http://127.0.0.1:{port}"
            )
            # The same answer through the API server, as a user with only a kubeconfig asks.
            service = await _annotator_service(kube, namespace, port)
            proxied = await _explain(control_plane, f"{namespace}/{pod}", "--service", service)
            [raw] = [
                p for p in await kube.raw_pods(namespace, "web") if p["metadata"]["name"] == pod
            ]
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
            await kube.delete_namespace(namespace)
            await kube.delete_nodes(nodes)

    annotation = raw["metadata"]["annotations"][COST_ANNOTATION]
    decision = report["decision"]
    assert proxied["asked"] == (
        f"the annotator at service {namespace}/podcost-annotator:http through the API server"
    )
    assert proxied["decision"] == decision
    assert report["computed_now"] is None
    assert (report["annotation"], report["set_by"]) == (annotation, "podcost")
    assert str(decision["cost"]) == annotation
    assert decision["workload"] == f"e2e/{namespace}/Deployment/web"
    assert decision["source"] == "annotator"
    assert decision["complete"] is True
    names = [term["strategy"] for term in decision["terms"]]
    assert set(names) <= set(DEFAULT_POLICY.names)
    weights = {bound.name: bound.weight for bound in DEFAULT_POLICY.bound}
    assert all(term["weight"] == weights[term["strategy"]] for term in decision["terms"])
    assert 1 <= decision["position"] <= decision["of"] == 4

    # The trace that wrote the cost: the annotator's patch span that set it on this pod.
    writes = [
        span for span in exporter.get_finished_spans()
        if span.name == SPAN_PATCH and span.attributes is not None
        and span.attributes.get(ATTR_POD) == f"{namespace}/{pod}"
        and span.attributes.get(ATTR_RESULT) == "ok"
    ]  # fmt: skip
    assert writes, "no patch span wrote the pod's cost"
    last = max(writes, key=lambda span: span.end_time or 0)
    assert last.attributes is not None
    assert str(last.attributes[ATTR_COST]) == annotation
    assert decision["written"]["trace_id"] == format(last.context.trace_id, "032x")  # type: ignore[union-attr]
    assert decision["written"]["cost"] == int(annotation)


async def test_explain_without_a_decision_shows_what_the_core_decides_now(
    control_plane: ControlPlane, kube: KubeTestCluster
) -> None:
    namespace = await kube.create_namespace(f"explain-{uuid.uuid4().hex[:6]}")
    nodes = [f"{namespace}-a", f"{namespace}-b"]
    for node, zone in zip(nodes, ("zone-a", "zone-b"), strict=True):
        await kube.create_node(node, zone=zone, labels={"explain": namespace})
    port = _free_port()
    settings = ServiceSettings(cluster="e2e", http_host="127.0.0.1", http_port=port)
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    async with api:
        # A pipeline that watches another namespace: it never decides about these pods.
        pipeline = bootstrap(
            settings, BusSettings(), kube=Kube(api), bus=MemoryBus(),
            watcher_settings=WatcherSettings(namespace=f"{namespace}-elsewhere"),
        )  # fmt: skip
        stop = asyncio.Event()
        task = asyncio.create_task(serve(pipeline.services, settings, bus=pipeline.bus, stop=stop))
        try:
            await kube.create_deployment(
                namespace, "web", 3, opt_in=True, node_selector={"explain": namespace}
            )
            await kube.wait_ready(namespace, "web", 3)
            pod = (await kube.active_pods(namespace, "web"))[0]
            report = await _explain(
                control_plane, f"{namespace}/{pod.name}", "--url", f"http://127.0.0.1:{port}"
            )
            dump = await Kube(api).dump(namespace)
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
            await kube.delete_namespace(namespace)
            await kube.delete_nodes(nodes)

    assert report["decision"] is None
    assert report["note"].startswith(f"no decision known for pod {namespace}/{pod.name}")
    now = report["computed_now"]
    assert now["source"] == "computed now"
    assert now["trace_id"] is None
    snapshot = snapshot_for_workload(load_objects(dump), namespace, "web", "Deployment", "e2e")
    assert now["cost"] == expected_costs(snapshot, DEFAULT_POLICY)[pod.uid]
    assert now["of"] == 3
