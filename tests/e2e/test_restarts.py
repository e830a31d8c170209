"""Restarting any one service mid-run loses no decision: the pipeline still converges to the
costs an undisturbed run writes (podcost then has nothing left to write), in embedded mode and
over the real Kafka broker.

Each service runs as its own task here, so one can be stopped while the others go on, and a
fresh instance (same bus, same consumer group) started in its place, as a supervisor would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable

import pytest
from kubernetes_asyncio import config
from tests.conftest import ControlPlane
from tests.support.kube import KubeTestCluster

from podcost.annotator.service import AnnotatorService
from podcost.embedded import Pipeline, bootstrap
from podcost.runtime.runner import Service
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import Bus, BusSettings, MemoryBus
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube

pytestmark = pytest.mark.e2e

PICK: dict[str, Callable[[Pipeline], Service]] = {
    "watcher": lambda p: p.watcher,
    "ranker": lambda p: next(r for r in p.rankers if r.name.endswith("capacity-type")),
    "aggregator": lambda p: p.aggregator,
    "annotator": lambda p: p.annotator,
}


async def _nothing_left_to_write(kube: Kube, namespace: str) -> bool:
    objects = load_objects(await kube.dump(namespace))
    snapshot = snapshot_for_workload(objects, namespace, "web", "Deployment")
    active = [pod for pod in snapshot.pods if pod.active]
    result = simulate(snapshot, len(active), time.time(), policy=DEFAULT_POLICY)
    return not result.writes  # a pod left without the annotation has the 0 podcost decided


@pytest.mark.parametrize("transport", ["embedded", "kafka"])
@pytest.mark.parametrize("victim", list(PICK))
async def test_restarting_one_service_mid_run_loses_no_decision(
    transport: str,
    victim: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    control_plane: ControlPlane,
    kube: KubeTestCluster,
) -> None:
    namespace = await kube.create_namespace(f"restart-{uuid.uuid4().hex[:6]}")
    # Consumer groups of this run only, as its topics are: the default groups are the same for
    # every test on the session's broker, and a member another test left behind (still in its
    # session, or its group's rebalance) would hold this run's joins up; a replacement built
    # below reads the same settings, so it joins the group of the service it replaces.
    monkeypatch.setenv("PODCOST_RANKER_GROUP", f"ranker-{namespace}")
    monkeypatch.setenv("PODCOST_AGGREGATOR_APP_ID", f"aggregator-{namespace}")
    monkeypatch.setenv("PODCOST_ANNOTATOR_GROUP", f"annotator-{namespace}")
    zones = {f"{namespace}-{zone}": zone for zone in ("zone-a", "zone-b", "zone-c")}
    nodes = list(zones)
    for name, zone in zones.items():
        capacity = "spot" if zone == "zone-c" else "on-demand"
        await kube.create_node(
            name, zone=zone, capacity_type=capacity, labels={"restart": namespace}
        )
    if transport == "kafka":
        bootstrap_servers = request.getfixturevalue("kafka_bootstrap")
        bus_settings = BusSettings(
            bootstrap_servers=bootstrap_servers,
            topic_workloads=f"w-{namespace}", topic_ranks=f"r-{namespace}",
            topic_costs=f"c-{namespace}", topic_deadletter=f"d-{namespace}",
        )  # fmt: skip
        bus: Bus | None = None
    else:
        bus_settings, bus = BusSettings(), MemoryBus()
    settings = ServiceSettings(cluster="e2e", http_port=0)
    watcher_settings = WatcherSettings(namespace=namespace, debounce_seconds=0.2)
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    tasks: dict[str, asyncio.Task[None]] = {}
    async with api:
        client = Kube(api)

        def build(shared: Bus | None) -> Pipeline:
            return bootstrap(settings, bus_settings, kube=client, bus=shared,
                             watcher_settings=watcher_settings)  # fmt: skip

        pipeline = build(bus)
        await pipeline.bus.start()
        try:
            for service in pipeline.services:
                tasks[service.name] = asyncio.create_task(service.run(), name=service.name)
            await kube.create_deployment(namespace, "web", 9, opt_in=True,
                                         node_selector={"restart": namespace})  # fmt: skip
            # Mid-run: the victim is up and working, and the pods are still being created and
            # made ready, when it stops.
            stopped = PICK[victim](pipeline)

            async def victim_ready() -> bool:
                return stopped.ready()

            await kube.wait_for(victim_ready, f"the {victim} ready", timeout=60)
            tasks[stopped.name].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tasks[stopped.name]
            await kube.wait_ready(namespace, "web", 9)
            # In one process the annotator verifies against the watcher's cache (SharedView):
            # the watcher runs again over its cache (relisting into it), and a fresh annotator
            # gets the view of the watcher that runs. A fresh watcher with a cache of its own is
            # a fresh process, which tests/e2e/test_sigkill.py kills for real.
            replacement = stopped if victim == "watcher" else PICK[victim](build(pipeline.bus))
            if isinstance(replacement, AnnotatorService):
                replacement.view = pipeline.annotator.view
            tasks[stopped.name] = asyncio.create_task(replacement.run(), name=stopped.name)

            async def converged() -> bool:
                for task in tasks.values():
                    if task.done():
                        task.result()
                return await _nothing_left_to_write(client, namespace)

            await kube.wait_for(converged, f"convergence after restarting the {victim}", 90)
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await pipeline.bus.stop()
            await kube.delete_namespace(namespace)
            await kube.delete_nodes(nodes)
