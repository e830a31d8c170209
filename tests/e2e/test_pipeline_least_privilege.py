"""The whole pipeline with nothing but the chart's rights: ``podcost run`` as a real process whose
only cluster credential is a service-account token, bound by the chart's RBAC and admission
policy, steers a real scale-in.

The chart's ``templates/rbac.yaml`` and ``templates/admission-policy.yaml`` are rendered by the
real helm with ``watch.namespace`` listing two namespaces (so pods, ReplicaSets and Deployments
are granted by a Role in each, and cost writes are admitted there only) and created on the real
control plane; the process gets a kubeconfig holding the
account's token (from the TokenRequest API), the server and the CA, and leader election on, as
the chart deploys it. An opted-in 12-replica Deployment fills four nodes of three pods each,
unevenly over three zones (zone-a 6, zone-b 3, zone-c 3); podcost writes the deletion costs;
the real kube-controller-manager scales in to 6, then to 3, and the zones stay even (skew 0,
the least possible). A second opted-in Deployment in the second watched namespace gets its
costs too. The watcher's Lease is held in the release namespace while it runs and
released when it stops, and no request of the process was refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from tests.conftest import ControlPlane
from tests.support.kube import KubeTestCluster
from tests.support.least_privilege import ServiceAccount, install
from tests.support.tools import require_helm

from podcost_core.policy import DEFAULT_POLICY, policy_from_annotations
from podcost_core.simulate import simulate
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_kube.client import Kube

pytestmark = pytest.mark.e2e

#: Node → zone; every node takes three pods, so 12 replicas land exactly 6 / 3 / 3.
NODES = {"a0": "zone-a", "a1": "zone-a", "b0": "zone-b", "c0": "zone-c"}
IDENTITY = "podcost-e2e-0"


@contextlib.asynccontextmanager
async def podcost_process(
    kubeconfig: Path, account: ServiceAccount, lease: str, watch: str, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m podcost run`` (embedded mode) with only the account's kubeconfig; stopped by
    SIGTERM at the end, and it must exit cleanly."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PODCOST_", "KUBECONFIG", "POD_"))}  # fmt: skip
    env.update(
        KUBECONFIG=str(kubeconfig),
        PODCOST_CLUSTER="e2e",
        PODCOST_HTTP_PORT="0",
        PODCOST_LOG_FORMAT="text",
        PODCOST_WATCHER_NAMESPACE=watch,
        PODCOST_WATCHER_DEBOUNCE_SECONDS="0.2",
        PODCOST_WATCHER_MAX_DELAY_SECONDS="1",
        PODCOST_WATCHER_LEADER_ELECTION="true",
        PODCOST_WATCHER_LEASE_NAME=lease,
        POD_NAMESPACE=account.namespace,
        POD_NAME=IDENTITY,
    )
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "podcost", "run", "--strategy", "topology-spread",
            env=env, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            yield process
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    process.kill()
                    await process.wait()


def _tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text().splitlines()[-lines:])


def _alive(process: asyncio.subprocess.Process, log: Path) -> None:
    if process.returncode is not None:
        raise AssertionError(f"podcost exited with {process.returncode}:\n{log.read_text()}")


async def _converged(admin: Kube, namespace: str, process: asyncio.subprocess.Process,
                     log: Path, timeout: float = 60, workload: str = "web") -> None:  # fmt: skip
    """Wait until podcost has nothing more to write: every active pod of ``workload`` carries
    the cost the current ranking and labelling give it."""
    deadline = time.monotonic() + timeout
    while True:
        _alive(process, log)
        objects = load_objects(await admin.dump(namespace))
        snapshot = snapshot_for_workload(objects, namespace, workload, "Deployment")
        active = [pod for pod in snapshot.pods if pod.active]
        policy = policy_from_annotations(snapshot.annotations, default=DEFAULT_POLICY)
        result = simulate(snapshot, len(active), time.time(), policy=policy)
        if not result.writes:  # a pod left without the annotation has the 0 podcost decided
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"podcost did not converge: still to write {result.writes}; its log ends:\n"
                + _tail(log)
            )
        await asyncio.sleep(0.25)


async def _zones(kube: KubeTestCluster, namespace: str, nodes: dict[str, str]) -> dict[str, int]:
    counts = dict.fromkeys(sorted(set(nodes.values())), 0)
    for pod in await kube.active_pods(namespace, "web"):
        assert pod.node is not None
        counts[nodes[pod.node]] += 1
    return counts


async def _holder(kube: KubeTestCluster, namespace: str, lease: str) -> str:
    read = await client.CoordinationV1Api(kube.api).read_namespaced_lease(lease, namespace)
    return str(read.spec.holder_identity or "")


async def test_the_pipeline_steers_scale_in_with_only_the_charts_rights(
    control_plane: ControlPlane, kube: KubeTestCluster, tmp_path: Path
) -> None:
    require_helm()
    suffix = uuid.uuid4().hex[:6]
    release_ns = await kube.create_namespace(f"podcost-{suffix}")
    workload_ns = await kube.create_namespace(f"shop-{suffix}")
    second_ns = await kube.create_namespace(f"api-{suffix}")
    watched = f"{workload_ns},{second_ns}"
    nodes = {f"lp{suffix}-{name}": zone for name, zone in NODES.items()}
    second_node = f"lp{suffix}-x0"
    taint = {"key": "podcost.dev/e2e", "value": suffix, "effect": "NoSchedule"}
    account: ServiceAccount | None = None
    try:
        account = await install(
            kube.api, control_plane.kubeconfig, release_ns, {"watch.namespace": watched}
        )
        lease = account.lease
        kubeconfig = await account.kubeconfig(tmp_path / "kubeconfig")
        for name, zone in nodes.items():
            # Tainted for this test alone, three pods each: the layout is exact, not likely.
            await kube.create_node(name, zone=zone, capacity_type="on-demand", pods="3",
                                   labels={"e2e": suffix}, taints=[taint])  # fmt: skip
        await kube.create_node(second_node, zone="zone-x", capacity_type="on-demand", pods="2",
                               labels={"e2e-api": suffix}, taints=[taint])  # fmt: skip
        log = tmp_path / "podcost.log"
        async with podcost_process(kubeconfig, account, lease, watched, log) as process:
            await kube.create_deployment(
                second_ns, "api", 2, opt_in=True, node_selector={"e2e-api": suffix},
                annotations={"podcost.dev/strategies": "topology-spread"},
                pod_spec_extra={"tolerations": [{**taint, "operator": "Equal"}]},
            )  # fmt: skip
            await kube.create_deployment(
                workload_ns, "web", 12, opt_in=True, node_selector={"e2e": suffix},
                annotations={"podcost.dev/strategies": "topology-spread"},
                pod_spec_extra={"tolerations": [{**taint, "operator": "Equal"}]},
            )  # fmt: skip
            await kube.wait_ready(workload_ns, "web", 12)
            assert await _zones(kube, workload_ns, nodes) == {"zone-a": 6, "zone-b": 3,
                                                              "zone-c": 3}  # fmt: skip
            admin = Kube(kube.api)
            await kube.wait_ready(second_ns, "api", 2)
            await _converged(admin, second_ns, process, log, workload="api")
            for replicas, even in ((6, 2), (3, 1)):
                await _converged(admin, workload_ns, process, log)
                await kube.scale_and_observe(workload_ns, "web", replicas)
                zones = await _zones(kube, workload_ns, nodes)
                assert zones == dict.fromkeys(zones, even), zones  # skew 0, the least possible

            async def leading() -> bool:
                _alive(process, log)
                return await _holder(kube, release_ns, lease) == IDENTITY

            await kube.wait_for(leading, f"{IDENTITY} holding Lease {release_ns}/{lease}", 30)
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 30) == 0, log.read_text()
        assert await _holder(kube, release_ns, lease) == "", "the Lease was not released"
        output = log.read_text()
        assert "HTTP 403" not in output, output
        assert "Forbidden" not in output, output
    finally:
        await kube.delete_namespace(workload_ns)
        await kube.delete_namespace(second_ns)
        await kube.delete_nodes([*nodes, second_node])
        if account is not None:
            await account.uninstall()
        await kube.delete_namespace(release_ns)
