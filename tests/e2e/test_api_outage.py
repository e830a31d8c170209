"""A real API server outage in the middle of the writes loses no decision: the kube-apiserver of
the real control plane is stopped by its pid while 60 pods wait for their costs, and started
again (same port, etcd and certificates) after 12 s (30 s under ``-m long``). With no change to
the workload, every pod then reaches the cost the pipeline decided, and no service gave up:
the annotator retried its writes all along, the watcher's informer relisted, and both reported
the outage in their readiness while it lasted (and are ready again after it).

The whole pipeline runs over the real Kafka broker; the annotator is paced at 5 requests a
second, so the writes of 60 pods (a read and a PATCH each) take about 24 s and most of them are
still to do when the server goes away.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from kubernetes_asyncio import config
from tests.conftest import ControlPlane, unavailable
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import fresh_kafka_settings

from podcost.annotator.service import AnnotatorService
from podcost.annotator.settings import AnnotatorSettings
from podcost.embedded import bootstrap
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube
from podcost_localinfra import cluster

pytestmark = pytest.mark.e2e

PODS = 60


def _patches(annotator: AnnotatorService, result: str) -> float:
    labels = {"result": result}
    return annotator.metrics.get_sample_value("podcost_patches_total", labels) or 0.0


#: Seconds without an answer before the annotator and the watcher report not ready.
UNREADY_AFTER = 3.0


async def _costs(kube: Kube, namespace: str) -> dict[str, str | None]:
    """Per active pod of ``web``: its deletion cost (``{}`` while the API does not answer)."""
    try:
        dump = await kube.dump(namespace)
    except Exception:  # the server is away, or a pooled connection died with it
        return {}
    return {
        item["metadata"]["name"]: (item["metadata"].get("annotations") or {}).get(
            DELETION_COST_ANNOTATION
        )
        for item in dump["items"]
        if item["kind"] == "Pod" and not item["metadata"].get("deletionTimestamp")
    }


async def _decided_costs_written(kube: Kube, namespace: str) -> bool:
    """Every pod is there and podcost would write nothing more: each carries its decided cost
    (a pod without the annotation reads as 0, which podcost may leave it)."""
    try:
        objects = load_objects(await kube.dump(namespace))
    except Exception:
        return False
    snapshot = snapshot_for_workload(objects, namespace, "web", "Deployment")
    active = [pod for pod in snapshot.pods if pod.active]
    result = simulate(snapshot, len(active), time.time(), policy=DEFAULT_POLICY)
    return len(active) == PODS and not result.writes


@pytest.mark.parametrize(
    "outage_s",
    [
        pytest.param(12.0, id="12s"),
        pytest.param(30.0, id="30s", marks=[pytest.mark.long, pytest.mark.timeout(600)]),
    ],
)
async def test_an_api_server_outage_mid_write_loses_no_decision_and_nothing_gives_up(
    outage_s: float,
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    kube: KubeTestCluster,
) -> None:
    run_dir = control_plane.run_dir
    if run_dir is None:
        unavailable(
            "the control plane is not podcost_localinfra's: its API server cannot be stopped"
        )
    bootstrap_servers = request.getfixturevalue("kafka_bootstrap")
    namespace = await kube.create_namespace(f"outage-{uuid.uuid4().hex[:6]}")
    node = f"{namespace}-node"
    await kube.create_node(node, zone="zone-a", labels={"outage": namespace})
    await kube.create_deployment(
        namespace, "web", PODS, opt_in=True, node_selector={"outage": namespace}
    )
    await kube.wait_ready(namespace, "web", PODS)
    bus_settings = fresh_kafka_settings(bootstrap_servers, "outage")
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    tasks: dict[str, asyncio.Task[None]] = {}
    async with api:
        client = Kube(api)
        pipeline = bootstrap(
            ServiceSettings(cluster="e2e", http_port=0),
            bus_settings,
            kube=client,
            watcher_settings=WatcherSettings(
                namespace=namespace, debounce_seconds=0.2, unready_after_seconds=UNREADY_AFTER
            ),
            annotator_settings=AnnotatorSettings(
                qps=5, burst=1, unready_after_seconds=UNREADY_AFTER
            ),
        )
        annotator = pipeline.annotator
        assert isinstance(annotator, AnnotatorService)
        await pipeline.bus.start()
        try:
            for service in pipeline.services:
                tasks[service.name] = asyncio.create_task(service.run(), name=service.name)

            def nothing_gave_up() -> None:
                for task in tasks.values():
                    if task.done():
                        task.result()
                        raise AssertionError(f"{task.get_name()} stopped by itself")

            async def some_written() -> bool:
                nothing_gave_up()
                return _patches(annotator, "ok") >= 3

            await kube.wait_for(some_written, "the first writes", timeout=90, interval=0.05)
            costs = await _costs(client, namespace)
            waiting = sum(cost is None for cost in costs.values())
            assert waiting >= 50, f"only {waiting} pods wait for their cost"
            assert not annotator.caught_up  # the first pass is not written yet: not ready

            stopped_at = time.monotonic()
            await asyncio.to_thread(cluster.stop_apiserver, run_dir)
            try:

                async def both_report_it() -> bool:
                    nothing_gave_up()
                    return not annotator.ready() and not pipeline.watcher.ready()

                await kube.wait_for(both_report_it, "readiness to report the outage", timeout=30)
                assert annotator.outage.reported
                await asyncio.sleep(max(0.0, outage_s - (time.monotonic() - stopped_at)))
                nothing_gave_up()
            finally:
                await asyncio.to_thread(cluster.start_apiserver, run_dir)
            back_at = time.monotonic()

            async def all_written() -> bool:
                nothing_gave_up()
                return await _decided_costs_written(client, namespace)

            await kube.wait_for(all_written, "every pod's decided cost", timeout=120, interval=0.5)
            written_after = time.monotonic() - back_at

            async def ready_again() -> bool:
                nothing_gave_up()
                return all(service.ready() for service in pipeline.services)

            await kube.wait_for(ready_again, "every service ready again", timeout=90)
            assert _patches(annotator, "error") == 0
            assert _patches(annotator, "unavailable") > 0
            print(
                f"\noutage {back_at - stopped_at:.1f}s with {waiting} of {PODS} pods waiting; "
                f"all costs written {written_after:.1f}s after the API server was back"
            )
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await pipeline.bus.stop()
            await kube.delete_namespace(namespace)
            await kube.delete_nodes([node])
