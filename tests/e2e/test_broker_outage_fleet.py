"""A real broker outage with every podcost component its own process: the Kafka broker is stopped
by its pid at a seeded moment of steady churn, and started again (same ports, node id and log
dirs) after 15 s or 30 s, and the cluster ends where an undisturbed twin ends. The 15 s outage of
one seed is in ``make test`` (about a minute); three seeds of a 30 s outage run under ``-m long``.

The pair of clusters and the judgement are ``tests/support/churn.py``'s, as for the SIGKILL test:
cluster ``a`` runs the fleet as the chart deploys it (the watcher and annotator of the ``agent``
mode, one ranker per strategy and the faust aggregator of the ``core`` mode, this test's own
topics and app id), the twin ``b`` runs ``podcost run`` embedded (no Kafka: the outage cannot
touch it), both play the same seeded scenario (``tests/support/twin.py``) step by step. The
outage starts ``fault.delay`` seconds after the scenario's fault step was issued (the seeds are
ones whose fault comes during the set-up or the first two steps); the churn goes on while the
broker is away (a scale-in waits until both clusters have nothing left to write, so after the
broker is back).

Every process either rides the outage out or exits and is started again by the kubelet stand-in
(``churn.Kubelet``); either way it is printed. (The watcher exits when the bus loses a snapshot
it queued, by design: its restart publishes every workload again. Records queued while the
broker is away can be refused as it comes back, ``LeaderNotAvailableError``.)

After the broker is back: ``a`` has nothing left to write and the consumer groups' lag on
``a``'s topics drains to 0 (asked of the broker); nothing is dead-lettered; ``a``'s final costs
pass the twin's verdict, no decision is lost and no cost is rewound (``churn.judge``). The time
from the broker's return to lag 0 and nothing left to write is printed per seed, with p50 and max.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tests.conftest import Broker, ControlPlane, unavailable
from tests.support.broker import consumer_lag, records_on
from tests.support.churn import play_seed, twin_pair
from tests.support.kube import KubeTestCluster
from tests.support.twin import percentile, scenario

from podcost_localinfra import kafka

pytestmark = pytest.mark.e2e


async def _outage(run_dir: Path, seconds: float, took: dict[str, float]) -> float:
    """Stop the broker by its pid, start it again ``seconds`` after the stop began; the time it
    serves again."""
    stopped_at = time.monotonic()
    await asyncio.to_thread(kafka.stop_broker, run_dir)
    took["stop"] = time.monotonic() - stopped_at
    try:
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - stopped_at)))
    finally:  # a failing test leaves the broker up for the next
        took["start"] = await asyncio.to_thread(kafka.start_broker, run_dir)
    took["away"] = time.monotonic() - stopped_at
    return time.monotonic()


@pytest.mark.parametrize(
    ("outage_s", "seeds"),
    [
        # In one run of seed 10 (load average 30) faust's consumer lost its group session while
        # the broker was away and never consumed again (alive, nothing exited), so a decision
        # was never made. The aggregator's progress watchdog (podcost_core.progress) now makes
        # it unready, then exit for its supervisor; the hang did not recur in 3 runs since.
        # In make test: 58 s (and 16 s of servers' start) measured on a loaded 2-core machine.
        pytest.param(15.0, [10], id="15s-1-seed"),
        pytest.param(
            30.0, [300, 301, 302], id="30s-3-seeds",
            marks=[pytest.mark.long, pytest.mark.timeout(1800)],
        ),
    ],
)  # fmt: skip
async def test_a_broker_outage_under_a_fleet_of_processes_ends_where_its_twin_ends(
    outage_s: float,
    seeds: list[int],
    kafka_broker: Broker,
    control_plane: ControlPlane,
    second_control_plane: ControlPlane,
    kube: KubeTestCluster,
    second_kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    run_dir = kafka_broker.run_dir
    if run_dir is None:
        unavailable("the broker is not podcost_localinfra's: it cannot be stopped")
    bootstrap = kafka_broker.bootstrap
    planes = (control_plane.kubeconfig, second_control_plane.kubeconfig)
    times: list[float] = []
    async with twin_pair("fleet", bootstrap, planes, (kube, second_kube), tmp_path, "bo") as pair:
        topics = pair.topics
        consumed = (topics.workloads, topics.ranks, topics.costs_for("a"))

        async def drained() -> bool:
            return await consumer_lag(bootstrap, consumed) == 0

        for seed in seeds:
            plan = scenario(seed, ("broker",))
            took: dict[str, float] = {}

            async def outage(took: dict[str, float] = took) -> float:
                return await _outage(run_dir, outage_s, took)

            seconds, restarted = await play_seed(
                pair, plan, outage, (bootstrap, topics.costs_for("a")), drained
            )
            times.append(seconds)
            dead = await records_on(bootstrap, [topics.deadletter])
            assert dead == 0, f"seed {seed}: {dead} records dead-lettered"
            print(
                f"seed {seed}: broker stopped {plan.fault.delay}s after step {plan.fault.at} "
                f"(stopping took {took['stop']:.1f}s, starting {took['start']:.1f}s, away "
                f"{took['away']:.1f}s); {len(restarted)} exits restarted; broker back → lag 0 "
                f"and nothing left to write {seconds:.1f}s"
            )
    print(f"broker outage {outage_s:.0f}s, seeds {seeds}: broker back → lag 0 and nothing left "
          f"to write: p50 {percentile(times, 0.5):.1f}s, max {max(times):.1f}s")  # fmt: skip
