"""Two watcher processes of one cluster, started as the chart's ``agent`` mode starts them with
``watcher.replicaCount: 2`` and the production lease timings (10 s lease, 7 s renew deadline,
1 s retry period): only the leader publishes, and when it goes the other one takes over.

The real control plane and the real broker; the test reads the workloads topic as the core
does. A snapshot's version is ``incarnation * 10**6 + count`` (the incarnation is the process's
start time), so each record names the process that published it, and the aggregator keeps, per
workload, the snapshot with the greatest ``(emitted_at, version)``
(``podcost_core.aggregate.Aggregator.on_snapshot``): a snapshot ordered below one already kept
is dropped as stale.

- SIGKILL of the leader: the standby publishes every opted-in workload once the Lease has lapsed;
  the gap from the kill to its first snapshot is measured and printed; nothing of the killed
  process is read after the takeover, and every snapshot of the new leader orders after all of
  the old one's.
- A clean handover (SIGTERM: the leader steps down and releases the Lease) to a standby whose
  wall clock runs 5 s behind the leader's (``tests/support/skewed_clock.py`` moves one process's
  clock; no real server here can skew a clock): the new leader's snapshots, including the one
  answering a scale-out right after the takeover, still order after the old leader's, so the
  aggregator takes them (stamped by the clock alone, they would be 3-5 s "older" and dropped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from tests.conftest import ControlPlane
from tests.support.kube import KubeTestCluster
from tests.support.services import ServiceProcess, ServiceSpec, chart_specs
from tests.support.tools import require_helm

from podcost_contracts.messages import WorkloadSnapshotMessage, decode_workload_record
from podcost_kube.leader import JITTER

pytestmark = pytest.mark.e2e

VERSION_SPAN = 10**6
LEASE_SECONDS, RETRY_SECONDS = 10, 1


@dataclass(frozen=True)
class Seen:
    """One snapshot read from the workloads topic, and when (monotonic) the test read it."""

    at: float
    key: str
    incarnation: int
    order: tuple[float, int]
    """``(emitted_at, version)``: the aggregator's order of a workload's snapshots."""


class Reader:
    """Every snapshot on the run's workloads topic, as it arrives."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.seen: list[Seen] = []
        self._consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
            enable_auto_commit=False, fetch_max_wait_ms=50, metadata_max_age_ms=1000,
        )  # fmt: skip

    async def run(self) -> None:
        await self._consumer.start()
        try:
            while True:
                batches = await self._consumer.getmany(timeout_ms=200)
                now = time.monotonic()
                for records in batches.values():
                    for record in records:
                        headers = {name: bytes(value) for name, value in record.headers}
                        message = decode_workload_record(record.value or b"", headers,
                                                         key=record.key)  # fmt: skip
                        if isinstance(message, WorkloadSnapshotMessage):
                            self.seen.append(Seen(
                                now, message.key, message.version // VERSION_SPAN,
                                (message.emitted_at, message.version),
                            ))  # fmt: skip
        finally:
            await self._consumer.stop()

    def incarnations(self) -> list[int]:
        """The publishing processes, in the order their first snapshot was read."""
        return list(dict.fromkeys(seen.incarnation for seen in self.seen))


@asynccontextmanager
async def reading(bootstrap: str, topic: str) -> AsyncIterator[Reader]:
    reader = Reader(bootstrap, topic)
    task = asyncio.create_task(reader.run())
    try:
        yield reader
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until(check: Callable[[], bool | Awaitable[bool]], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if await result if inspect.isawaitable(result) else result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


@dataclass
class Setup:
    namespace: str
    topic: str
    specs: list[ServiceSpec]
    env: dict[str, str]
    nodes: list[str]


@pytest.fixture
async def setup(
    kafka_bootstrap: str, control_plane: ControlPlane, kube: KubeTestCluster
) -> AsyncIterator[Setup]:
    helm = require_helm()
    run = f"failover-{uuid.uuid4().hex[:6]}"
    values = {
        "mode": "agent", "clusterName": "a", "kafka": {"bootstrapServers": kafka_bootstrap},
        "watch": {"namespace": run}, "watcher": {"replicaCount": 2},
        "leaderElection": {"leaseName": f"{run}-watcher"},
    }  # fmt: skip
    specs = [s for s in chart_specs(helm, values, prefix="a/") if "/watcher" in s.name]
    assert [s.name for s in specs] == ["a/watcher#1", "a/watcher#2"]
    # The production timings, as the chart renders them by default.
    assert specs[0].env["PODCOST_WATCHER_LEASE_DURATION_SECONDS"] == str(LEASE_SECONDS)
    assert specs[0].env["PODCOST_WATCHER_RETRY_PERIOD_SECONDS"] == str(RETRY_SECONDS)
    specs = [
        dataclasses.replace(s, env={**s.env, "KUBECONFIG": str(control_plane.kubeconfig)})
        for s in specs
    ]
    topic = f"{run}.workloads"
    env = {"PODCOST_TOPIC_WORKLOADS": topic, "PODCOST_TOPIC_DEADLETTER": f"{run}.deadletter"}
    zones = {f"{run}-{zone}": zone for zone in ("zone-a", "zone-b", "zone-c")}
    nodes = list(zones)
    await kube.create_namespace(run)
    await asyncio.gather(*(
        kube.create_node(node, zone=zone, labels={"failover": run}) for node, zone in zones.items()
    ))  # fmt: skip
    for app in ("web", "api"):
        await kube.create_deployment(run, app, 4, opt_in=True, node_selector={"failover": run})
    await asyncio.gather(*(kube.wait_ready(run, app, 4) for app in ("web", "api")))
    try:
        yield Setup(run, topic, specs, env, nodes)
    finally:
        await kube.delete_namespace(run)
        await kube.delete_nodes(nodes)


@asynccontextmanager
async def started(
    spec: ServiceSpec, env: dict[str, str], log_dir: Path
) -> AsyncIterator[ServiceProcess]:
    process = ServiceProcess(spec, env=env, log_dir=log_dir)
    await process.start()
    try:
        await process.wait_ready(timeout=120)
        yield process
    finally:
        if process.pid:
            await process.stop()


async def _leading(process: ServiceProcess) -> bool:
    return await process.sample("podcost_leading") == 1


def _skewed(spec: ServiceSpec, seconds: float) -> ServiceSpec:
    return dataclasses.replace(
        spec, module="tests.support.skewed_clock", args=(str(seconds), *spec.args)
    )


def _assert_new_orders_after_old(reader: Reader, old: int, new: int) -> None:
    """Per workload, every snapshot of process ``new`` orders after every one of ``old``."""
    keys = {seen.key for seen in reader.seen}
    for key in keys:
        olds = [s.order for s in reader.seen if s.key == key and s.incarnation == old]
        news = [s.order for s in reader.seen if s.key == key and s.incarnation == new]
        assert olds, (key, news)
        assert news, (key, olds)
        assert min(news) > max(olds), (
            f"{key}: the new leader's snapshots {news} do not all order after the old "
            f"leader's {olds}; the aggregator would drop them as stale"
        )


async def test_a_killed_leader_is_replaced_and_nothing_of_it_is_read_after_the_takeover(
    setup: Setup, kafka_bootstrap: str, tmp_path: Path
) -> None:
    first, second = setup.specs
    async with (
        reading(kafka_bootstrap, setup.topic) as reader,
        started(first, setup.env, tmp_path) as leader,
    ):
        await _until(lambda: _leading(leader), "the first watcher to lead", 60)
        async with started(second, setup.env, tmp_path) as standby:
            await _until(lambda: len(reader.seen) >= 2, "snapshots", 60)
            assert not await _leading(standby)
            (old,) = reader.incarnations()
            killed_at = time.monotonic()
            leader.kill()

            async def new_leader_published() -> bool:
                return len(reader.incarnations()) == 2

            await _until(new_leader_published, "the standby's first snapshot", 60)
            new = reader.incarnations()[1]
            takeover = next(s.at for s in reader.seen if s.incarnation == new)
            gap = takeover - killed_at
            print(f"SIGKILL of the leader to the new leader's first snapshot: {gap:.1f}s "
                  f"(lease {LEASE_SECONDS}s, retry period {RETRY_SECONDS}s)")  # fmt: skip
            assert await _leading(standby)
            # Both workloads published by the new leader.
            await _until(
                lambda: (
                    {s.key for s in reader.seen if s.incarnation == new}
                    == {s.key for s in reader.seen if s.incarnation == old}
                ),
                "every workload from the new leader",
                30,
            )
            await asyncio.sleep(1.0)
    after = [s for s in reader.seen if s.at >= takeover]
    assert {s.incarnation for s in after} == {new}, "a snapshot of the killed leader was read"
    _assert_new_orders_after_old(reader, old, new)
    # It could not take over before the Lease lapsed, and took it at its first try after.
    assert (
        LEASE_SECONDS - JITTER * RETRY_SECONDS - 1
        < gap
        < LEASE_SECONDS + 2 * JITTER * RETRY_SECONDS + 3
    )


async def test_a_new_leader_whose_clock_runs_5s_behind_is_not_taken_for_the_stale_one(
    setup: Setup, kafka_bootstrap: str, kube: KubeTestCluster, tmp_path: Path
) -> None:
    ahead, behind = setup.specs
    async with (
        reading(kafka_bootstrap, setup.topic) as reader,
        started(_skewed(ahead, 5.0), setup.env, tmp_path) as leader,
    ):
        await _until(lambda: _leading(leader), "the watcher 5 s ahead to lead", 60)
        async with started(behind, setup.env, tmp_path) as standby:
            await _until(lambda: len(reader.seen) >= 2, "snapshots", 60)
            (old,) = reader.incarnations()
            # A change the old leader publishes just before it hands over...
            await kube.scale(setup.namespace, "web", 5)
            await _until(
                lambda: sum(s.key.endswith("/web") for s in reader.seen) >= 2,
                "the old leader's snapshot of the scale-out",
                30,
            )
            assert await leader.stop() == 0  # SIGTERM: steps down, releases the Lease
            await _until(lambda: _leading(standby), "the standby to lead", 30)
            # ... and one the new leader publishes right after it took over.
            await kube.scale(setup.namespace, "web", 6)
            await kube.wait_ready(setup.namespace, "web", 6)

            async def answered() -> bool:
                return len(reader.incarnations()) == 2 and any(
                    s.incarnation == reader.incarnations()[1] and s.key.endswith("/web")
                    for s in reader.seen
                )

            await _until(answered, "the new leader's snapshots", 30)
            await asyncio.sleep(2.0)
    new = reader.incarnations()[1]
    _assert_new_orders_after_old(reader, old, new)
