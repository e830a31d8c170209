"""A restarted ``podcost run`` writes nothing where the costs in place are the ones it decides.

One real ``podcost run`` process (embedded mode), two opted-in Deployments of 30 pods, each on
six kwok nodes of its own, two per zone of three (zone-c spot). Once every cost is written and
nothing is left to write (``simulate`` over a fresh dump of the namespace finds no write), the
process is stopped (SIGTERM, or SIGKILL in the ``long`` variant) and started again; once it has
caught up ("caught up" in its log) it must have sent no PATCH (``podcost_patches_total{result=
"ok"}`` of the new process) and changed no cost.

The ``bystander`` variant (in ``make test``; the plain SIGTERM one is ``long``) also checks the
running process keeps up with other workloads' pods: once every cost is written, 15
pods of a workload that is not opted in land on one of app0's two nodes in each zone.
``node-consolidation`` orders a workload's nodes by every active pod on them
(``Node.requested``), so a fresh decision now swaps the two nodes of each zone: the watcher must
re-publish app0 when pods land on its nodes (``nodes_with_moved_load``; before, it did not, and
the running process kept its old decision for good while a restart wrote 15 of the 60 costs).
The running process must write them (its PATCH count grows and ``simulate`` finds nothing left
within 60 s), and the restart after must write nothing. The same staleness arose without a
bystander when Deployments shared nodes and their pods landed after each other's last
decisions, which is why each Deployment here has nodes of its own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from tests.conftest import ControlPlane
from tests.support.kube import COST_ANNOTATION, KubeTestCluster
from tests.support.services import ServiceProcess, ServiceSpec

from podcost_core.policy import DEFAULT_POLICY, policy_from_annotations
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube

pytestmark = pytest.mark.e2e

APPS = ["app0", "app1"]
REPLICAS = 30
#: Pods of a workload that is not opted in, on one of app0's two nodes in each zone (five each).
BYSTANDERS = 15


async def _left_to_write(admin: Kube, namespace: str) -> set[str]:
    """The pods a decision made now over the cluster as it is would write (by name)."""
    objects = load_objects(await admin.dump(namespace))
    left: set[str] = set()
    for app in APPS:
        snapshot = snapshot_for_workload(objects, namespace, app, "Deployment")
        active = [pod for pod in snapshot.pods if pod.active]
        policy = policy_from_annotations(snapshot.annotations, default=DEFAULT_POLICY)
        left |= set(simulate(snapshot, len(active), time.time(), policy=policy).writes)
    return left


async def _costs(kube: KubeTestCluster, namespace: str) -> dict[str, str]:
    return {
        pod.name: (pod.raw.metadata.annotations or {}).get(COST_ANNOTATION, "")
        for app in APPS
        for pod in await kube.pods(namespace, app)
    }


@pytest.mark.parametrize(
    ("stop", "bystander"),
    [
        ("sigterm", True),
        pytest.param("sigterm", False, marks=pytest.mark.long),
        pytest.param("sigkill", False, marks=pytest.mark.long),
    ],
)
async def test_a_restarted_podcost_run_rewrites_no_cost_in_place(
    stop: str,
    bystander: bool,
    control_plane: ControlPlane,
    kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    suffix = uuid.uuid4().hex[:6]
    namespace = await kube.create_namespace(f"rr-{suffix}")
    # Each Deployment on six nodes of its own (two per zone): see the module docstring.
    nodes = {f"rr{suffix}-{app}-{zone[-1]}{i}": (app, zone, i) for app in APPS
             for zone in ("zone-a", "zone-b", "zone-c") for i in range(2)}  # fmt: skip
    env = {
        "PODCOST_CLUSTER": "e2e",
        "PODCOST_LOG_FORMAT": "text",
        "PODCOST_WATCHER_NAMESPACE": namespace,
        "PODCOST_WATCHER_DEBOUNCE_SECONDS": "0.2",
        "PODCOST_WATCHER_MAX_DELAY_SECONDS": "1",
    }
    kubeconfig = {"KUBECONFIG": str(control_plane.kubeconfig)}
    proc = ServiceProcess(ServiceSpec("run", ("run",), env), env=kubeconfig, log_dir=tmp_path)
    admin = Kube(kube.api)
    try:
        for name, (app, zone, i) in nodes.items():
            labels = {"rr": f"{suffix}-{app}"}
            if app == APPS[0] and i == 0:
                labels["rr-bystander"] = suffix
            capacity = "spot" if zone == "zone-c" else "on-demand"
            await kube.create_node(name, zone=zone, capacity_type=capacity, labels=labels)
        await proc.start()
        await proc.wait_ready(120)
        for app in APPS:
            await kube.create_deployment(namespace, app, REPLICAS, opt_in=True,
                                         node_selector={"rr": f"{suffix}-{app}"})  # fmt: skip
        for app in APPS:
            await kube.wait_ready(namespace, app, REPLICAS, timeout=120)

        async def nothing_left() -> bool:
            return not await _left_to_write(admin, namespace)

        await kube.wait_for(nothing_left, "every cost written, nothing left", 120, interval=1)
        if bystander:
            written = await proc.sample("podcost_patches_total", result="ok")
            await kube.create_deployment(namespace, "bystander", BYSTANDERS,
                                         node_selector={"rr-bystander": suffix})  # fmt: skip
            await kube.wait_ready(namespace, "bystander", BYSTANDERS, timeout=120)
            # The running process re-decides app0 over its nodes' new counts and writes.
            await kube.wait_for(nothing_left, "app0 re-decided after the bystander landed", 60,
                                interval=1)  # fmt: skip
            grown = await proc.sample("podcost_patches_total", result="ok") - written
            assert grown > 0, "the bystander changed no decision: the variant shows nothing"
        await asyncio.sleep(3)  # the first process settles
        assert not await _left_to_write(admin, namespace)
        before = await _costs(kube, namespace)
        if stop == "sigkill":
            proc.kill()
            await proc.stop()
        else:
            assert await proc.stop(30) == 0, proc.log_tail()
        mark = proc.log_path.stat().st_size
        await proc.start()
        await proc.wait_ready(120)

        async def caught_up() -> bool:
            return "caught up" in proc.log_path.read_text()[mark:]

        await kube.wait_for(caught_up, "the restarted process caught up", 120, interval=0.5)
        await asyncio.sleep(3)  # any write the catch-up sent has landed
        patches = await proc.sample("podcost_patches_total", result="ok")
        after = await _costs(kube, namespace)
        changed = {pod for pod, cost in after.items() if before.get(pod) != cost}
        rewrites = [line for line in proc.log_path.read_text()[mark:].splitlines()
                    if "set pod" in line]  # fmt: skip
        assert patches == 0, (patches, rewrites)
        assert not changed, (changed, rewrites)
        assert not await _left_to_write(admin, namespace)
    finally:
        if proc.pid:
            await proc.stop()
        await kube.delete_namespace(namespace)
        await kube.delete_nodes(list(nodes))
