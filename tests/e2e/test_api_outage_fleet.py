"""A real API server outage with every podcost component its own process: the kube-apiserver is
stopped by its pid while 50+ of 60 pods wait for their costs, and started again (same port, etcd
and certificates) after 12 s (30 s under ``-m long``). With no change to the workload, every pod
then reaches the cost the pipeline decided, and no process gave up for good.

The fleet is the chart's (``tests/support/churn.py``'s ``fleet_specs``): the watcher and the
annotator of the ``agent`` mode, one ranker per strategy and the faust aggregator of the ``core``
mode, over the real broker, each its own OS process. The annotator is paced by the chart's
``annotator.qps``/``burst`` at 5 requests a second, so the writes of 60 pods (a read and a PATCH
each) take about 24 s and most are still to do when the server goes away; the watcher and the
annotator report an outage after 3 s (``PODCOST_WATCHER_UNREADY_AFTER_SECONDS``,
``PODCOST_ANNOTATOR_UNREADY_AFTER_SECONDS``). Each process's ``GET /readyz`` is polled all along:
while the server is away, the watcher and the annotator answer 503 (and log why) and the processes
that do not talk to it stay ready; after it, every process is ready again. A process that exits
is started again by the kubelet stand-in (``churn.Kubelet``), and printed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from tests.conftest import ControlPlane, unavailable
from tests.support.churn import Kubelet, Side, fleet_specs, left_to_write, run_env
from tests.support.kube import COST_ANNOTATION, KubeTestCluster
from tests.support.services import ServiceProcess
from tests.support.services import processes as started_processes
from tests.support.tools import require_helm

from podcost_localinfra import cluster

pytestmark = pytest.mark.e2e

PODS = 60
UNREADY_AFTER = 3.0
#: The processes that talk to the API server.
ON_API = ("a/watcher", "a/annotator")


async def _written(side: Side) -> bool:
    """Every pod is there and podcost would write nothing more (``False`` while the API server
    does not answer)."""
    try:
        if len(await side.kube.active_pods(side.namespace, "web")) != PODS:
            return False
        return not await left_to_write(side, ["web"])
    except Exception:  # the server is away, or a pooled connection died with it
        return False


async def _waiting(side: Side) -> int:
    """Active pods of ``web`` without a cost yet."""
    pods = await side.kube.active_pods(side.namespace, "web")
    return sum(COST_ANNOTATION not in (pod.raw.metadata.annotations or {}) for pod in pods)


async def _poll_readiness(
    procs: dict[str, ServiceProcess], seen: dict[str, list[tuple[float, int]]]
) -> None:
    """Every 0.5 s, each process's ``/readyz`` status (0: nothing answers), kept when it changes,
    with the ``time.monotonic()`` of the answer."""
    while True:
        for name, proc in procs.items():
            status = await proc.readyz()
            if not seen[name] or seen[name][-1][1] != status:
                seen[name].append((time.monotonic(), status))
        await asyncio.sleep(0.5)


def _during(history: list[tuple[float, int]], start: float, end: float) -> set[int]:
    """The statuses a process answered between ``start`` and ``end`` (the one it had at
    ``start`` included)."""
    before = [status for at, status in history if at <= start]
    return set(before[-1:]) | {status for at, status in history if start < at <= end}


@pytest.mark.parametrize(
    "outage_s",
    [
        pytest.param(12.0, id="12s"),
        pytest.param(30.0, id="30s", marks=[pytest.mark.long, pytest.mark.timeout(900)]),
    ],
)
async def test_an_api_server_outage_under_a_fleet_of_processes_loses_no_decision(
    outage_s: float,
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    run_dir = control_plane.run_dir
    if run_dir is None:
        unavailable(
            "the control plane is not podcost_localinfra's: its API server cannot be stopped"
        )
    run = f"apio-{uuid.uuid4().hex[:6]}"
    side = Side("a", kube, await kube.create_namespace(run))
    node = f"{run}-node"
    await kube.create_node(node, zone="zone-a", labels={"outage": run})
    paced = {"annotator": {"qps": 5, "burst": 1}}
    specs = fleet_specs(require_helm(), kafka_bootstrap, run, control_plane.kubeconfig, paced)
    env = {
        **run_env(run),
        "PODCOST_WATCHER_UNREADY_AFTER_SECONDS": str(UNREADY_AFTER),
        "PODCOST_ANNOTATOR_UNREADY_AFTER_SECONDS": str(UNREADY_AFTER),
    }
    seen: dict[str, list[tuple[float, int]]] = defaultdict(list)
    try:
        async with started_processes(specs, env=env, log_dir=tmp_path, ready_timeout=300) as procs:
            kubelet = Kubelet(list(procs.values()))
            supervising = asyncio.create_task(kubelet.run())
            polling = asyncio.create_task(_poll_readiness(procs, seen))
            annotator = procs["a/annotator"]
            try:
                await kube.create_deployment(run, "web", PODS, opt_in=True,
                                             node_selector={"outage": run})  # fmt: skip
                await kube.wait_ready(run, "web", PODS)

                async def some_written() -> bool:
                    return await annotator.sample("podcost_patches_total", result="ok") >= 3

                await kube.wait_for(some_written, "the first writes", timeout=120, interval=0.1)
                waiting = await _waiting(side)
                assert waiting >= 50, f"only {waiting} pods wait for their cost"

                stopped_at = time.monotonic()
                await asyncio.to_thread(cluster.stop_apiserver, run_dir)
                try:
                    await asyncio.sleep(max(0.0, outage_s - (time.monotonic() - stopped_at)))
                finally:  # a failing test leaves the API server up for the next
                    start_s = await asyncio.to_thread(cluster.start_apiserver, run_dir)
                back_at = time.monotonic()

                await kube.wait_for(lambda: _written(side), "every pod's decided cost",
                                    timeout=180, interval=0.5)  # fmt: skip
                written_after = time.monotonic() - back_at

                async def all_ready() -> bool:
                    return all([await p.is_ready() for p in procs.values()])

                await kube.wait_for(all_ready, "every process ready again", timeout=120)
                ready_after = time.monotonic() - back_at
            finally:  # never restart what the end of the test stops
                for task in (supervising, polling):
                    task.cancel()
                await asyncio.gather(supervising, polling, return_exceptions=True)
            during = {name: _during(seen[name], stopped_at, back_at) for name in procs}
            for exit in kubelet.exits:
                print(f"the kubelet restarted {exit}")
            print(f"\nAPI server away {back_at - stopped_at:.1f}s (starting took {start_s:.1f}s) "
                  f"with {waiting} of {PODS} pods waiting; every decided cost written "
                  f"{written_after:.1f}s and every process ready {ready_after:.1f}s after it "
                  f"was back; /readyz answers during the outage: {during}")  # fmt: skip
            for name in ON_API:
                assert 503 in during[name], f"{name} never reported the outage: {seen[name]}"
                log = procs[name].log_path.read_text(errors="replace")
                assert "not ready: the API server has failed" in log, name
            steady = {name: statuses for name, statuses in during.items()
                      if name not in ON_API and statuses != {200}}  # fmt: skip
            assert not steady, f"processes off the API server not ready in the outage: {steady}"
            if not any(e.startswith("a/annotator ") for e in kubelet.exits):
                assert await annotator.sample("podcost_patches_total", result="error") == 0
                assert await annotator.sample("podcost_patches_total", result="unavailable") > 0
    finally:
        await kube.delete_namespace(run)
        await kube.delete_nodes([node])
