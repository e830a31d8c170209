"""A workload that opts out gets its podcost costs removed, on the real control plane.

podcost (watcher, rankers, aggregator, annotator; over the in-memory bus and over the real Kafka
broker) writes the costs of an opted-in 4-replica Deployment; a person then sets one pod's cost
with ``kubectl annotate`` (field manager ``kubectl-annotate``). When the Deployment opts out
(``podcost.dev/enabled: "false"``), the watcher says it is gone, the aggregator asks for a
release, and the annotator removes the three costs podcost wrote, with a PATCH that tests each
value, and leaves the person's. The Deployment carries podcost's events, where ``kubectl
describe`` shows them: opted in, costs written. (podcost leaves a pod without a cost where the
0 it reads as is the cost podcost wants; the test waits until podcost has nothing left to
write.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
from kubernetes_asyncio import config
from tests.conftest import ControlPlane
from tests.support.kube import COST_ANNOTATION, KubeTestCluster

from podcost.embedded import bootstrap
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_core.kubejson import cost_managers
from podcost_core.model import FIELD_MANAGER
from podcost_core.policy import DEFAULT_POLICY, policy_from_annotations
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("mode", ["embedded", "kafka"])
async def test_opting_out_removes_the_costs_podcost_wrote_and_keeps_a_persons(
    control_plane: ControlPlane, kube: KubeTestCluster, request: pytest.FixtureRequest, mode: str
) -> None:
    prefix = f"o{uuid.uuid4().hex[:5]}"
    bus_settings = BusSettings()
    if mode == "kafka":
        bus_settings = BusSettings(
            bootstrap_servers=request.getfixturevalue("kafka_bootstrap"),
            topic_workloads=f"w-{prefix}", topic_ranks=f"r-{prefix}",
            topic_costs=f"c-{prefix}", topic_deadletter=f"d-{prefix}",
        )  # fmt: skip
    namespace = await kube.create_namespace(f"optout-{prefix}")
    zones = {f"{prefix}-{zone}": zone for zone in ("zone-a", "zone-b")}
    nodes = list(zones)
    for node, zone in zones.items():
        await kube.create_node(node, zone=zone, labels={"e2e": prefix})
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        pipeline = bootstrap(
            ServiceSettings(cluster="e2e", http_port=0), bus_settings, kube=Kube(api),
            bus=MemoryBus() if mode == "embedded" else None,
            watcher_settings=WatcherSettings(
                namespace=namespace, debounce_seconds=0.2, max_delay_seconds=1.0
            ),
        )  # fmt: skip
        task = asyncio.create_task(
            serve(pipeline.services, ServiceSettings(http_port=0), bus=pipeline.bus, stop=stop)
        )

        async def ready() -> bool:
            if task is not None and task.done():
                task.result()
            return all(service.ready() for service in pipeline.services)

        await kube.wait_for(ready, "every service ready", timeout=60)
        await kube.create_deployment(namespace, "web", 4, opt_in=True,
                                     node_selector={"e2e": prefix})  # fmt: skip
        await kube.wait_ready(namespace, "web", 4)

        async def costs() -> dict[str, tuple[str | None, tuple[str, ...]]]:
            if task is not None and task.done():
                task.result()
            return {
                pod["metadata"]["name"]: (
                    (pod["metadata"].get("annotations") or {}).get(COST_ANNOTATION),
                    cost_managers(pod["metadata"]),
                )
                for pod in await kube.raw_pods(namespace, "web")
            }

        async def costed() -> bool:
            """podcost has nothing left to write, and wrote at least two costs (a pod it leaves
            without one reads as 0, where 0 is the cost it wants)."""
            found = await costs()
            ours = [name for name, (_, owners) in found.items() if owners == (FIELD_MANAGER,)]
            return len(ours) >= 2 and not await _left_to_write(kube, namespace)

        await kube.wait_for(costed, "podcost's costs on the pods", timeout=60)
        uid = (await kube.apps.read_namespaced_deployment("web", namespace)).metadata.uid
        described = (f"involvedObject.kind=Deployment,involvedObject.name=web,"
                     f"involvedObject.namespace={namespace},involvedObject.uid={uid}")  # fmt: skip

        async def told() -> bool:
            """What `kubectl describe deployment web` shows: podcost's watcher ranks it, its
            annotator wrote the costs of a decision."""
            found = await kube.core.list_namespaced_event(namespace, field_selector=described)
            by = {(e.reason, e.reporting_component) for e in found.items}
            return {("OptedIn", "podcost.dev/watcher"),
                    ("CostsWritten", "podcost.dev/annotator")} <= by  # fmt: skip

        await kube.wait_for(told, "podcost's events on the Deployment", timeout=30)
        person = sorted(n for n, (_, owners) in (await costs()).items() if owners)[0]
        await kube.core.patch_namespaced_pod(
            person, namespace, {"metadata": {"annotations": {COST_ANNOTATION: "-7"}}},
            field_manager="kubectl-annotate",
        )  # fmt: skip

        await kube.apps.patch_namespaced_deployment(
            "web", namespace, {"metadata": {"annotations": {"podcost.dev/enabled": "false"}}}
        )

        async def released() -> bool:
            found = await costs()
            return all(value is None for name, (value, _) in found.items() if name != person)

        await kube.wait_for(released, "podcost's costs removed after the opt-out", timeout=60)
        after = await costs()
        assert after[person] == ("-7", ("kubectl-annotate",))
        assert all(after[name] == (None, ()) for name in after if name != person)
    finally:
        stop.set()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
        await api.close()
        await kube.delete_namespace(namespace)
        await kube.delete_nodes(nodes)


async def _left_to_write(kube: KubeTestCluster, namespace: str) -> dict[str, int]:
    """What podcost would still write on the workload's pods (empty once its costs are on)."""
    objects = load_objects(await Kube(kube.api).dump(namespace))
    snapshot = snapshot_for_workload(objects, namespace, "web", "Deployment")
    active = [pod for pod in snapshot.pods if pod.active]
    policy = policy_from_annotations(snapshot.annotations, default=DEFAULT_POLICY)
    return dict(simulate(snapshot, len(active), time.time(), policy=policy).writes)
