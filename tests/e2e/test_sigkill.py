"""SIGKILL, for real: one podcost process of a cluster is killed at a seeded random moment of
steady churn and started again, and the cluster ends where an undisturbed twin ends. (The pair
of clusters, the scenario's play and the judgement are ``tests/support/churn.py``'s, shared with
the fleet broker outage test.)

Two real control planes and the real broker. Cluster ``a`` runs the pipeline under test; cluster
``b``, the twin, runs its own complete pipeline, undisturbed: ``podcost run`` in one process, as
the chart's ``all`` mode runs it without Kafka, so nothing of ``a``'s (topics, consumer groups,
faust tables) is shared with it. Both get the same seeded scenario (``tests/support/twin.py``):
the same nodes (same names, zones, capacities), the same Deployments placed by node capacity,
then the same churn steps, step by step on both (scale-outs onto new nodes, pod deletions, a
taint, a zone turned spot, scale-ins last).

- The fleet variant: ``a`` runs every component as the chart does, each its own process (the
  watcher and annotator of the ``agent`` mode, one ranker per strategy and the faust aggregator
  of the ``core`` mode, with this test's own topics and app id). Seeds visit the victims in turn
  (watcher, annotator, aggregator, a ranker); the kill comes while the Deployments are created
  or 0-2.5 s into a churn step, the restart at once or after a pause, and in about half the
  seeds the new process is killed again during its start-up (before ``/readyz``; for the
  aggregator, during faust's table recovery).
- The ``podcost run`` variant: ``a`` runs ``podcost run`` as one process, embedded or with
  ``--kafka``; the one process is the victim.

A process that exits by itself is started again, as the kubelet restarts a container
(``Kubelet``); each such exit is printed with its last log line. (The faust aggregator exits on
purpose when it finds faust skipped records after a restart, ``podcost_bus.faust_app.
SkippedRecords``, so that a restart reads them.)

Once both clusters are quiet, ``tests.support.churn.judge`` judges them: ``a`` converged, the
twin's verdict for every Deployment and every ``k``, no decision lost and no cost rewound (Kafka
variants); the time from the kill to ``a`` having nothing left to write again is printed per
seed, with p50 and max over the seeds of the test.

``make test`` runs three fleet seeds and one seed per ``podcost run`` transport; the ``long``
variants (``make test-long``) run 24 fleet seeds and 4 per transport.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.conftest import ControlPlane
from tests.support.churn import Kubelet, play_seed, twin_pair
from tests.support.kube import KubeTestCluster
from tests.support.services import ServiceProcess
from tests.support.twin import Fault, Scenario, percentile, scenario

pytestmark = pytest.mark.e2e

#: The fleet variant's victims, visited in turn by consecutive seeds (the ranker: by seed).
FLEET_VICTIMS = ("a/watcher", "a/annotator", "a/aggregator", "a/ranker")


# --- the fault -----------------------------------------------------------------------------------


@dataclass
class Crash:
    """What became of a fault: whether each kill came before the process was ready."""

    before_ready: list[bool] = field(default_factory=list)
    ready_after: float = 0.0
    """Seconds from the last start of the victim until it was ready."""


async def _crash(proc: ServiceProcess, fault: Fault, crash: Crash, kubelet: Kubelet) -> float:
    """SIGKILL ``proc`` as ``fault`` says and start it again; once it is ready, the time of the
    first kill."""
    killed_at = 0.0
    kills = [fault.pause] if fault.again is None else [fault.pause, fault.pause]
    for number, pause in enumerate(kills):
        if number:
            assert fault.again is not None
            await asyncio.sleep(fault.again)
        crash.before_ready.append(not await proc.is_ready())
        kubelet.held.add(proc)
        proc.kill()
        await proc.stop()  # reaps it: SIGTERM to a dead process is nothing
        if not number:
            killed_at = time.monotonic()
        await asyncio.sleep(pause)
        await proc.start()
        kubelet.held.discard(proc)

    async def ready() -> bool:  # the kubelet starts it again should it exit by itself
        return await proc.is_ready()

    await KubeTestCluster.wait_for(ready, f"{proc.spec.name} ready after its restart", 180, 0.25)
    crash.ready_after = time.monotonic() - proc.started_at
    return killed_at


# --- the tests -----------------------------------------------------------------------------------


async def _seeds(
    shape: str,
    seeds: Sequence[int],
    kafka_bootstrap: str,
    planes: tuple[ControlPlane, ControlPlane],
    kubes: tuple[KubeTestCluster, KubeTestCluster],
    tmp_path: Path,
) -> None:
    kubeconfigs = (planes[0].kubeconfig, planes[1].kubeconfig)
    times: list[float] = []
    async with twin_pair(shape, kafka_bootstrap, kubeconfigs, kubes, tmp_path, "kill") as pair:
        rankers = sorted(name for name in pair.a.procs if "/ranker-" in name)
        for seed in seeds:
            plan = scenario(seed, FLEET_VICTIMS if shape == "fleet" else ("a/embedded",))
            victim = plan.fault.victim
            if victim == "a/ranker":
                victim = rankers[seed % len(rankers)]
                plan = dataclasses.replace(plan, fault=dataclasses.replace(
                    plan.fault, victim=victim))  # fmt: skip
            reads = None if shape == "embedded" else (kafka_bootstrap, pair.topics.costs_for("a"))
            crash = Crash()

            def kill(plan: Scenario = plan, crash: Crash = crash) -> Awaitable[float]:
                proc = pair.a.procs[plan.fault.victim]
                return _crash(proc, plan.fault, crash, pair.kubelet)

            seconds, _ = await play_seed(pair, plan, kill, reads)
            times.append(seconds)
            print(f"seed {plan.seed}: {plan.fault} kills before ready {crash.before_ready}; "
                  f"the last start ready after {crash.ready_after:.1f}s; "
                  f"kill → nothing left to write {seconds:.1f}s")  # fmt: skip
    print(f"{shape}: seeds {list(seeds)}: kill → every cost current again: "
          f"p50 {percentile(times, 0.5):.1f}s, max {max(times):.1f}s")  # fmt: skip


FLEET_SHORT = [0, 2, 5]
FLEET_LONG = list(range(100, 124))


@pytest.mark.parametrize(
    "seeds",
    [
        pytest.param(FLEET_SHORT, id="3-seeds"),
        pytest.param(
            FLEET_LONG, id="24-seeds", marks=[pytest.mark.long, pytest.mark.timeout(5400)]
        ),
    ],
)
async def test_a_sigkilled_fleet_process_ends_where_its_undisturbed_twin_ends(
    seeds: list[int],
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    second_control_plane: ControlPlane,
    kube: KubeTestCluster,
    second_kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    await _seeds("fleet", seeds, kafka_bootstrap, (control_plane, second_control_plane),
                 (kube, second_kube), tmp_path)  # fmt: skip


RUN_LONG = [200, 201, 202, 203]
#: The ``podcost run --kafka`` variant: one seed in ``make test``, the others with the long
#: seeds. It covers a decision made from a snapshot older than the annotator's own last write to
#: the pod (the annotator's ``WriteQueue`` reads the pod and writes it again instead of taking the
#: decision at its word), and a faust aggregator whose start hangs creating its
#: ``__assignor-__leader`` topic or whose idle producer lost a changelog topic's metadata (the
#: aggregator's progress watchdog re-fetches that metadata and bounds the start,
#: ``PODCOST_AGGREGATOR_START_TIMEOUT_SECONDS``).


@pytest.mark.parametrize(
    ("transport", "seeds"),
    [
        pytest.param("embedded", [7], id="embedded-1-seed"),
        pytest.param("kafka", [7], id="kafka-1-seed"),  # in make test: 35 s measured
        pytest.param("embedded", RUN_LONG, id="embedded-4-seeds",
                     marks=[pytest.mark.long, pytest.mark.timeout(3600)]),
        pytest.param("kafka", RUN_LONG, id="kafka-4-seeds",
                     marks=[pytest.mark.long, pytest.mark.timeout(3600)]),
    ],
)  # fmt: skip
async def test_a_sigkilled_podcost_run_ends_where_its_undisturbed_twin_ends(
    transport: str,
    seeds: list[int],
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    second_control_plane: ControlPlane,
    kube: KubeTestCluster,
    second_kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    await _seeds(transport, seeds, kafka_bootstrap, (control_plane, second_control_plane),
                 (kube, second_kube), tmp_path)  # fmt: skip
