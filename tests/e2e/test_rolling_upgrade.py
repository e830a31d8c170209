"""A rolling upgrade, for real: a fleet of the previous release is replaced one Deployment at a
time by this one while its cluster churns, and ends where an undisturbed twin ends.

The previous release is the commit ``tests/previous-release.toml`` names, built from ``git
archive`` into its own environment (``tests/support/previous.py``); its processes run with its
interpreter and the arguments and environment of its own chart, this release's with this
checkout's. Two real control planes and the real broker, as the fault tests have them
(``tests/support/churn.py``): cluster ``a`` runs the fleet, every component its own process
(watcher and annotator of the ``agent`` mode, a ranker per strategy and the faust aggregator of
the ``core`` mode); the twin ``b`` runs this release's ``podcost run`` in one process, without
Kafka, undisturbed. Both get the same seeded nodes, Deployments and churn steps.

1. The fleet starts on the previous release and costs every pod of both Deployments.
2. A record of a newer schema version is published on each topic (workloads, ranks, ``a``'s
   costs): every release dead-letters it with the reason, and goes on.
3. Each Deployment of ``a`` is replaced as a ``RollingUpdate`` of one replica replaces it
   (``maxSurge`` 1, ``maxUnavailable`` 0): this release's process is started, and once it is
   ready the previous one gets SIGTERM. One churn step runs during each replacement; scale-ins
   come last, once both clusters have nothing left to write. The order crosses the releases on
   every topic (:data:`ORDER`): the watcher first, so that previous rankers and aggregator read
   this release's snapshots; then one ranker, so that the previous aggregator reads this
   release's ranks beside the previous rankers'; then the aggregator, so that it reads the
   previous release's state from its changelogs and the previous annotator reads its costs;
   the other rankers; the annotator last.

Judged as the fault tests judge (``churn.judge``): ``a`` converged, the zones the real
controller's victim selection would leave for every ``k`` equal the twin's, no decision lost and
no cost rewound. Besides: no process stopped by itself (the kubelet restarted none), every
previous process exited 0 on SIGTERM, each process ran the release it was meant to
(``podcost_build_info``'s revision), and the dead-letter topic holds exactly the newer-version
records of step 2, each with its reason: nothing of either release was refused by the other.

About two minutes on this two-core machine when nothing else runs (eleven processes, ten of them
replaced), about twenty under other test runs' load, so it runs in ``make test-long``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from tests.conftest import ControlPlane, unavailable
from tests.support import churn
from tests.support.churn import Kubelet, Side, Watch
from tests.support.kube import KubeTestCluster
from tests.support.previous import Previous, PreviousUnavailable, ensure_previous
from tests.support.services import ServiceProcess, ServiceSpec, chart_policy, chart_specs, series
from tests.support.services import processes as started_processes
from tests.support.tools import require_helm
from tests.support.twin import Scenario, Step, scenario

from podcost_contracts.messages import SCHEMA_HEADER, DeadLetter, decode

pytestmark = [pytest.mark.e2e, pytest.mark.long]

SEED = 3
#: What ``podcost_build_info`` says of this checkout's processes.
THIS_REVISION = "this-checkout"
#: The reason every release gives a record of schema version 2.
NEWER_REASON = "unsupported schema version 2 for "
NEWER_COSTS = "desired-costs"


@pytest.fixture(scope="module")
def previous() -> Previous:
    try:
        return ensure_previous()
    except PreviousUnavailable as error:
        unavailable(str(error))


def rollout_order(names: Sequence[str]) -> list[str]:
    """The replacements, one Deployment at a time: the watcher, one ranker, the aggregator, the
    other rankers, the annotator."""
    rankers = sorted(name for name in names if "/ranker-" in name)
    order = ["a/watcher", rankers[0], "a/aggregator", *rankers[1:], "a/annotator"]
    assert sorted(order) == sorted(names), names
    return order


def _release(specs: Sequence[ServiceSpec], revision: str, python: Path | None) -> list[ServiceSpec]:
    return [
        dataclasses.replace(
            spec,
            env={**spec.env, "PODCOST_REVISION": revision},
            python=None if python is None else str(python),
        )
        for spec in specs
    ]


def _with_churn(plan: Scenario, stages: int) -> Scenario:
    """``plan`` with a pod deletion added before its scale-ins for each replacement the churn
    steps do not cover: one step runs during each replacement, the scale-ins during the last."""
    churning = [step for step in plan.steps if step.kind != "scale-in"]
    scale_ins = [step for step in plan.steps if step.kind == "scale-in"]
    extra = max(0, stages - len(churning) - len(scale_ins))
    deletions = [
        Step("delete-pod", plan.apps[i % len(plan.apps)].name,
             node=(i // len(plan.apps)) % len(plan.apps[i % len(plan.apps)].nodes))
        for i in range(extra)
    ]  # fmt: skip
    return dataclasses.replace(plan, steps=(*churning, *deletions, *scale_ins))


async def _revision(proc: ServiceProcess) -> str:
    found = series(await proc.metrics(), "podcost_build_info")
    assert len(found) == 1, (proc.spec.name, found)
    return found[0][0]["revision"]


def _newer_key(run: str, kind: str) -> str:
    return f"a/{run}/Deployment/newer-{kind}"


async def _publish_newer(bootstrap: str, run: str, topics: Mapping[str, str]) -> list[str]:
    """A schema-version-2 record on each topic, each under a key of its own; the keys."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    keys = []
    try:
        for kind, topic in topics.items():
            key = _newer_key(run, kind)
            value = json.dumps({"schema_version": 2, "key": key, "version": 1}).encode()
            header = (SCHEMA_HEADER, f"{kind}/2".encode())
            await producer.send_and_wait(topic, value, key=key.encode(), headers=[header])
            keys.append(key)
    finally:
        await producer.stop()
    return keys


async def _dead_letters(bootstrap: str, topic: str) -> list[DeadLetter]:
    """Every record of the dead-letter topic, decoded: read from the beginning, by a consumer of
    no group (which is given every partition), up to the end offsets."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")  # fmt: skip
    await consumer.start()
    letters: list[DeadLetter] = []

    async def fetch() -> None:
        for records in (await consumer.getmany(timeout_ms=200)).values():
            for record in records:
                headers = {name: bytes(value) for name, value in record.headers}
                letters.append(decode(DeadLetter, record.value or b"", headers))

    try:
        deadline = time.monotonic() + 60
        while not consumer.assignment():  # the partitions come with the topic's metadata
            assert time.monotonic() < deadline, f"no partition of {topic} assigned"
            await fetch()
        ends = await consumer.end_offsets(list(consumer.assignment()))
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            await fetch()
        return letters
    finally:
        await consumer.stop()


async def _replace(
    a: Side, kubelet: Kubelet, name: str, spec: ServiceSpec, env: Mapping[str, str], logs: Path
) -> tuple[float, int]:
    """``a``'s process ``name`` replaced by one of ``spec`` as a rolling update of one replica
    does it: the new one started and ready, then SIGTERM to the old one. The seconds the new one
    took to be ready, and the old one's exit code."""
    old = a.procs[name]
    new = ServiceProcess(spec, env=env, log_dir=logs)
    await new.start()
    kubelet.procs = [*kubelet.procs, new]  # a new list: the kubelet may be iterating the old one
    await new.wait_ready(600)
    kubelet.held.add(old)
    code = await old.stop(timeout=30)
    kubelet.procs = [proc for proc in kubelet.procs if proc is not old]
    a.procs[name] = new
    assert await _revision(new) == THIS_REVISION, name
    return new.ready_after or 0.0, code


async def test_a_fleet_upgraded_one_deployment_at_a_time_under_churn_ends_as_its_twin(
    previous: Previous,
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    second_control_plane: ControlPlane,
    kube: KubeTestCluster,
    second_kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    helm = require_helm()
    started = time.monotonic()
    run = f"upgrade-{int(time.time() * 1000) % 10**8:08d}"
    topics, env = churn.run_topics(run), churn.run_env(run)
    plane_a, plane_b = control_plane.kubeconfig, second_control_plane.kubeconfig
    was = _release(
        churn.fleet_specs(helm, kafka_bootstrap, run, plane_a, chart=previous.chart),
        previous.commit[:12],
        previous.python,
    )
    # The previous release writes costs in the wide band (its chart had no non-negative
    # default): this release keeps that policy, so the upgrade changes the version alone.
    same = {"policy": {"nonNegativeCosts": False}}
    now = {s.name: s for s in _release(churn.fleet_specs(helm, kafka_bootstrap, run, plane_a,
                                                         common=same),
                                       THIS_REVISION, None)}  # fmt: skip
    order = rollout_order([spec.name for spec in was])
    assert sorted(now) == sorted(order), "this release deploys other components: add them here"
    twin = chart_specs(helm, {"mode": "all", "clusterName": "b", "watch": {"namespace": run},
                              "leaderElection": {"leaseName": f"{run}-watcher"}, **same},
                       prefix="b/")  # fmt: skip
    twin = _release([dataclasses.replace(s, env={**s.env, "KUBECONFIG": str(plane_b)})
                     for s in twin], THIS_REVISION, None)  # fmt: skip
    plan = _with_churn(scenario(SEED, ("a/watcher",)), len(order))
    apps = [app.name for app in plan.apps]
    wide = chart_policy(non_negative=False)
    a, b = Side("a", kube, run, policy=wide), Side("b", second_kube, run, policy=wide)
    await asyncio.gather(a.kube.create_namespace(run), b.kube.create_namespace(run))
    logs = tmp_path / "this-release"
    try:
        async with started_processes(
            [*was, *twin], env=env, log_dir=tmp_path / "previous", ready_timeout=600
        ) as procs:
            for name, proc in procs.items():
                (a if name.startswith("a/") else b).procs[name] = proc
            for name in order:
                assert await _revision(a.procs[name]) == previous.commit[:12], name
            kubelet = Kubelet(list(procs.values()))
            supervising = asyncio.create_task(kubelet.run())
            watch = Watch()
            readers = (
                churn.watch_costs(a, watch),
                churn.read_decisions(
                    kafka_bootstrap,
                    topics.costs_for("a"),
                    watch,
                    skip={_newer_key(run, NEWER_COSTS).encode()},
                ),
            )
            never = asyncio.get_running_loop().create_future()  # quiet() asks for a fault
            try:
                async with churn.background(*readers):
                    # 1. The previous release costs every pod.
                    await asyncio.gather(*(churn.prepare(side, run, plan) for side in (a, b)))
                    await churn.quiet(a, b, apps, "on the previous release", never)
                    # 2. A newer schema version on every topic.
                    newer = await _publish_newer(kafka_bootstrap, run, {
                        "workload-snapshot": topics.workloads, "strategy-ranks": topics.ranks,
                        NEWER_COSTS: topics.costs_for("a"),
                    })  # fmt: skip
                    # 3. One Deployment at a time, a churn step during each replacement.
                    replicas = {app.name: app.replicas for app in plan.apps}
                    stages: dict[str, tuple[float, int]] = {}
                    for index, step in enumerate(plan.steps):
                        name = order[index] if index < len(order) else None
                        if step.kind == "scale-in":
                            await churn.quiet(a, b, apps, f"before step {index} ({step})", never)
                        work = [churn.apply_step(side, run, plan, index, replicas)
                                for side in (a, b)]  # fmt: skip
                        if name is not None:
                            work.append(_replace(a, kubelet, name, now[name], env, logs))
                        done = await asyncio.gather(*work)
                        if name is not None:
                            stages[name] = done[-1]
                        replicas = churn.replicas_after(replicas, step)
                    for name in order[len(plan.steps) :]:
                        stages[name] = await _replace(a, kubelet, name, now[name], env, logs)
                    await churn.quiet(a, b, apps, "at the end", never)
                    await churn.judge(plan, a, b, apps, watch, topic=True)
            finally:
                supervising.cancel()
                await asyncio.gather(supervising, return_exceptions=True)
            print(f"rolling upgrade from {previous.commit[:12]}: (ready after s, old exit) "
                  f"{ {n: (round(s, 1), c) for n, (s, c) in stages.items()} }; "
                  f"{time.monotonic() - started:.0f} s in all")  # fmt: skip
            assert not kubelet.exits, f"processes stopped by themselves: {kubelet.exits}"
            assert all(code == 0 for _, code in stages.values()), stages
            for name in order:
                assert a.procs[name].alive, a.procs[name].log_tail()
            letters = await _dead_letters(kafka_bootstrap, topics.deadletter)
            refused = [(d.group, d.topic, d.key, d.reason) for d in letters]
            assert all(d.key in newer and d.reason.startswith(NEWER_REASON) for d in letters), (
                f"records refused besides the newer versions: {refused}"
            )
            # Every reader of each topic refused its newer record (rankers and aggregator the
            # snapshot, the aggregator the ranks, the annotator the costs).
            assert {d.key for d in letters} == set(newer), refused
            rankers = [name for name in order if "/ranker-" in name]
            assert len({d.group for d in letters if d.key == newer[0]}) == len(rankers) + 1, refused
    finally:
        await asyncio.gather(churn.clean(a, plan), churn.clean(b, plan), return_exceptions=True)
        await asyncio.gather(a.kube.delete_namespace(run), b.kube.delete_namespace(run))
