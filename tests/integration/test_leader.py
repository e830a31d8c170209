"""Leader election against the real kube-apiserver: of two candidates for one Lease exactly one
leads; a leader stopped cleanly hands over at once; one that stops renewing is replaced a lease
duration later; and two watchers with election on publish each change once, and the standby
takes over, publishing every opted-in workload, when the leader stops.

Short timings (a 3 s lease) keep the tests quick; the rules are the same at client-go's 15 s.
The fake-clock timeline of the same rules, with failures the real server cannot be made to
produce, is in ``tests/unit/test_leader_election.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from tests.conftest import ControlPlane
from tests.support.kube import KubeTestCluster

from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherService, WatcherSettings, bootstrap
from podcost_bus import BusSettings, Consumer, MemoryBus
from podcost_contracts.messages import WorkloadSnapshotMessage, decode, is_live_set
from podcost_kube.client import Kube
from podcost_kube.leader import JITTER, LeaderElector

pytestmark = pytest.mark.integration

LEASE, DEADLINE, RETRY = 3.0, 2.0, 0.4
#: Longest a candidate waits between two tries, plus room for the requests themselves.
TRY_GAP = (1 + JITTER) * RETRY + 0.5
NAMESPACE = "default"


@pytest.fixture
async def api(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    async with api:
        yield api


@pytest.fixture
async def lease_name(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"test-leader-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        await client.CoordinationV1Api(api).delete_namespaced_lease(name, NAMESPACE)
    except ApiException as error:
        if error.status != 404:
            raise


class Candidates:
    """Electors for one Lease, each running in its own task."""

    def __init__(self, api: client.ApiClient, lease: str) -> None:
        self.api, self.lease = api, lease
        self.tasks: dict[LeaderElector, asyncio.Task[None]] = {}

    def start(self, identity: str, **options: Any) -> LeaderElector:
        elector = LeaderElector(
            Kube(self.api), self.lease, NAMESPACE, identity,
            lease_duration=LEASE, renew_deadline=DEADLINE, retry_period=RETRY, **options,
        )  # fmt: skip
        self.tasks[elector] = asyncio.create_task(elector.run(), name=f"elector-{identity}")
        return elector

    async def stop(self, elector: LeaderElector) -> None:
        task = self.tasks.pop(elector)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled(), f"{elector.identity} failed: {task.exception()!r}"

    async def first_leader(self, timeout: float = 10) -> LeaderElector:
        waits = {asyncio.create_task(e.wait_leading()): e for e in self.tasks}
        done, pending = await asyncio.wait(waits, timeout=timeout,
                                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        assert done, f"nobody led within {timeout}s"
        return waits[next(iter(done))]

    @staticmethod
    async def sees(elector: LeaderElector, holder: str) -> None:
        """Wait until ``elector`` has read the Lease held by ``holder``."""

        async def seen() -> bool:
            return elector.holder == holder

        await KubeTestCluster.wait_for(seen, f"{elector.identity} to read {holder}'s Lease", 10)

    async def read(self) -> Any:
        """The Lease as the API server holds it."""
        return (await client.CoordinationV1Api(self.api).read_namespaced_lease(
            self.lease, NAMESPACE)).spec  # fmt: skip


@pytest.fixture
async def candidates(api: client.ApiClient, lease_name: str) -> AsyncIterator[Candidates]:
    candidates = Candidates(api, lease_name)
    try:
        yield candidates
    finally:
        for elector in list(candidates.tasks):
            await candidates.stop(elector)


async def test_of_two_candidates_for_one_lease_exactly_one_leads(candidates: Candidates) -> None:
    a, b = candidates.start("a"), candidates.start("b")
    leader = await candidates.first_leader()
    other = b if leader is a else a
    # For longer than a lease duration the leader keeps renewing, and the other stands by.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(other.wait_leading(), timeout=LEASE + 2 * RETRY)
    assert leader.is_leader
    spec = await candidates.read()
    assert spec.holder_identity == leader.identity
    assert spec.lease_duration_seconds == 3
    assert spec.lease_transitions == 0
    assert spec.renew_time > spec.acquire_time
    assert other.holder == leader.identity


async def test_a_leader_stopped_cleanly_hands_over_at_once(candidates: Candidates) -> None:
    a = candidates.start("a")
    await asyncio.wait_for(a.wait_leading(), timeout=10)
    b = candidates.start("b")
    await candidates.sees(b, "a")
    stopped = time.monotonic()
    await candidates.stop(a)
    assert a.holder == ""  # a's release was written
    await asyncio.wait_for(b.wait_leading(), timeout=LEASE)
    # Sooner than any lease could lapse: b took the released Lease at its next try.
    assert time.monotonic() - stopped < min(TRY_GAP, LEASE - RETRY)
    spec = await candidates.read()
    assert (spec.holder_identity, spec.lease_transitions) == ("b", 1)


async def test_a_leader_that_stops_renewing_is_replaced_once_its_lease_lapses(
    candidates: Candidates,
) -> None:
    a = candidates.start("a", release_on_cancel=False)  # as if its process were killed
    await asyncio.wait_for(a.wait_leading(), timeout=10)
    b = candidates.start("b")
    await candidates.sees(b, "a")
    stopped = time.monotonic()
    await candidates.stop(a)
    assert (await candidates.read()).holder_identity == "a"
    await asyncio.wait_for(b.wait_leading(), timeout=LEASE + TRY_GAP)
    waited = time.monotonic() - stopped
    # a renewed at most one retry period before it stopped; b waited a lease duration from
    # the last renewal it saw, and took over at its first try after that.
    assert LEASE - 2 * RETRY <= waited <= LEASE + TRY_GAP
    spec = await candidates.read()
    assert (spec.holder_identity, spec.lease_transitions) == ("b", 1)


# --- two watchers, one bus ---------------------------------------------------------------------


@asynccontextmanager
async def two_watchers(
    control_plane: ControlPlane, kube: KubeTestCluster
) -> AsyncIterator[tuple[list[WatcherService], dict[str, asyncio.Task[None]], MemoryBus, str]]:
    namespace = await kube.create_namespace(f"lead-{uuid.uuid4().hex[:6]}")
    node = f"lead-node-{namespace}"
    await kube.create_node(node, zone="zone-a", labels={"lead": namespace})
    bus = MemoryBus()
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    tasks: dict[str, asyncio.Task[None]] = {}
    async with api:
        watchers = [
            bootstrap(
                ServiceSettings(cluster="test", http_port=0),
                BusSettings(),
                WatcherSettings(
                    namespace=namespace,
                    debounce_seconds=0.3,
                    max_delay_seconds=2.0,
                    leader_election=True,
                    lease_name="podcost-watcher",
                    lease_namespace=namespace,
                    leader_identity=identity,
                    lease_duration_seconds=LEASE,
                    renew_deadline_seconds=DEADLINE,
                    retry_period_seconds=RETRY,
                ),
                kube=Kube(api),
                bus=bus,
            )
            for identity in ("watcher-1", "watcher-2")
        ]
        await bus.start()
        for watcher in watchers:
            assert watcher.elector is not None
            tasks[watcher.elector.identity] = asyncio.create_task(watcher.run())
        try:
            yield watchers, tasks, bus, namespace
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await bus.stop()
            await kube.delete_namespace(namespace)
            await kube.delete_nodes([node])


def _all_ready(
    watchers: list[WatcherService], tasks: dict[str, asyncio.Task[None]]
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        for task in tasks.values():
            if task.done():
                task.result()
        return all(watcher.ready() for watcher in watchers)

    return check


async def _snapshots(consumer: Consumer, wait: float) -> list[WorkloadSnapshotMessage]:
    """What arrives within ``wait`` seconds of the last record (at least one poll)."""
    got: list[WorkloadSnapshotMessage] = []
    while records := await consumer.poll(max_wait=wait):
        await consumer.commit(records)
        got += [
            decode(WorkloadSnapshotMessage, r.value, r.headers, key=r.key)
            for r in records
            if not is_live_set(r.key)  # published after each sync (a takeover is one)
        ]
    return got


def _one(snapshots: list[WorkloadSnapshotMessage]) -> WorkloadSnapshotMessage:
    assert len(snapshots) == 1, (
        f"expected one snapshot, got {[(s.key, s.version) for s in snapshots]}"
    )
    return snapshots[0]


def _published(watcher: WatcherService) -> float:
    return watcher.metrics.get_sample_value("podcost_snapshots_published_total") or 0


async def test_two_watchers_with_election_on_publish_each_change_once_and_hand_over_on_stop(
    control_plane: ControlPlane, kube: KubeTestCluster
) -> None:
    async with two_watchers(control_plane, kube) as (watchers, tasks, bus, namespace):
        await kube.wait_for(_all_ready(watchers, tasks), "both watchers to sync", timeout=30)
        electors = {w.elector: w for w in watchers if w.elector is not None}
        waits = {asyncio.create_task(e.wait_leading()): e for e in electors}
        done, pending = await asyncio.wait(waits, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        for waiting in pending:
            waiting.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        assert done, "no watcher led"
        leader = electors[waits[next(iter(done))]]
        standby = next(w for w in watchers if w is not leader)
        assert standby.ready()
        assert not standby.leading()

        async with bus.consumer([leader.topics.workloads], group="t") as consumer:
            await kube.create_deployment(
                namespace, "web", 2, opt_in=True, node_selector={"lead": namespace}
            )
            pods = await kube.wait_ready(namespace, "web", 2)
            settled = await _snapshots(consumer, wait=1.5)
            assert settled, "no snapshot of the new Deployment"
            # One change, one snapshot: the leader's, not one from each watcher.
            await kube.set_deletion_cost(namespace, pods[0].name, -3)
            changed = _one(await _snapshots(consumer, wait=1.5))
            assert changed.key == f"test/{namespace}/Deployment/web"
            assert {p.name: p.deletion_cost for p in changed.snapshot.pods}[pods[0].name] == -3
            assert _published(leader) == len(settled) + 1
            assert _published(standby) == 0

            # The leader stops cleanly: the standby takes over at once and publishes every
            # opted-in workload, so nothing it saw while standing by is left unpublished.
            assert leader.elector is not None
            assert standby.elector is not None
            stopping = tasks[leader.elector.identity]
            stopping.cancel()
            await asyncio.gather(stopping, return_exceptions=True)
            await asyncio.wait_for(standby.elector.wait_leading(), timeout=LEASE)
            taken_over = _one(await _snapshots(consumer, wait=1.5))
            assert taken_over.key == changed.key
            assert taken_over.emitted_at > changed.emitted_at
            assert _published(standby) == 1
