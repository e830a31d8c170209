"""The annotator against the real control plane, over the real Kafka broker and over the
in-memory bus: exactly the pods whose cost differs are patched, once each, as field manager
``podcost``; a deleted pod is skipped; a cost set by hand is left alone unless
``overwrite_foreign``; dry-run writes nothing; offsets are committed only after the writes (a
restart between consuming and writing still writes exactly once); a tiny high-water mark
pauses consumption and everything is still written once it resumes; an older decision published
after a newer one (even while the newer one's writes are in flight) never rewinds a cost.

PATCH requests are counted by ``CountingPods`` around the real ``Kube`` adapter, so a count here
is what the API server received. Each test makes its own opted-in Deployment in this module's
namespace, on this module's node; each annotator verifies against its own informer view
(``InformerView``). Forged decisions are in ``test_annotator_verify_forged.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.support.costs import CountingPods, Desire, desired, publish_costs
from tests.support.kube import KubeTestCluster, PodView
from tests.support.pipeline import fresh_kafka_settings
from tests.support.tasks import leak_check

from podcost.annotator import AnnotatorService, AnnotatorSettings, bootstrap
from podcost.annotator.plan import Scope
from podcost.annotator.view import InformerView
from podcost.runtime.settings import ServiceSettings
from podcost_bus import Bus, BusSettings, KafkaBus, MemoryBus
from podcost_contracts.messages import DeadLetter, decode
from podcost_core.model import DELETION_COST_ANNOTATION, CostOwner
from podcost_core.tomodel import cost_owner
from podcost_kube.client import Kube, PodGone

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
NODE_LABEL = {"podcost-annotator-test": RUN}
#: Generous for a first poll over Kafka (the group forms); everything else is much faster.
WAIT_S = 30.0


@dataclass
class Space:
    namespace: str
    node: str


@pytest.fixture(scope="module")
async def space(kube: KubeTestCluster) -> AsyncIterator[Space]:
    namespace = await kube.create_namespace(f"annotator-{RUN}")
    node = f"annotator-{RUN}"
    await kube.create_node(node, zone="a", labels=NODE_LABEL)
    yield Space(namespace, node)
    await kube.delete_namespace(namespace)
    await kube.delete_nodes([node])


@dataclass
class Pipe:
    """The bus the test publishes on and the annotators read, with its settings."""

    kind: str
    bus: Bus
    settings: BusSettings

    async def dead_letters(self) -> list[DeadLetter]:
        topic = self.settings.topic_deadletter
        if isinstance(self.bus, MemoryBus):
            records = self.bus.records(topic)
        else:
            async with self.bus.consumer([topic], group=f"check-{uuid.uuid4().hex[:6]}") as reader:
                records = await reader.poll(max_wait=WAIT_S)
        return [decode(DeadLetter, record.value, record.headers) for record in records]


@pytest.fixture(params=["memory", "kafka"])
async def pipe(request: pytest.FixtureRequest) -> AsyncIterator[Pipe]:
    bus: Bus
    if request.param == "memory":
        settings = BusSettings(partitions=2)
        bus = MemoryBus(partitions=2)
    else:
        settings = fresh_kafka_settings(request.getfixturevalue("kafka_bootstrap"), "annotator")
        bus = KafkaBus(settings)
    async with bus:
        await bus.ensure_topics(settings.topics.shared())
        yield Pipe(request.param, bus, settings)


@dataclass
class Annotators:
    """Starts annotators on the pipe (one consumer group per test) and stops them."""

    pipe: Pipe
    group: str = field(default_factory=lambda: f"podcost-annotator-{uuid.uuid4().hex[:6]}")
    running: dict[AnnotatorService, asyncio.Task[None]] = field(default_factory=dict)

    async def start(
        self, pods: CountingPods, *, dry_run: bool = False, **config: Any
    ) -> AnnotatorService:
        options: dict[str, Any] = {"group": self.group, **config}
        assert isinstance(pods.inner, Kube), "the annotator's view lists the real cluster"
        service = bootstrap(
            ServiceSettings(http_port=0, dry_run=dry_run, retry_initial_seconds=0.05),
            self.pipe.settings,
            AnnotatorSettings(**options),
            bus=self.pipe.bus,
            kube=pods,
            view=InformerView(pods.inner, Scope()),
        )
        self.running[service] = asyncio.create_task(service.run(), name="annotator-under-test")
        await eventually(service.ready, "the annotator to start consuming")
        return service

    async def stop(self, service: AnnotatorService) -> None:
        task = self.running.pop(service)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if not task.cancelled() and task.exception() is not None:
            raise AssertionError("the annotator failed") from task.exception()

    async def publish(self, namespace: str, workload: str, *pods: Desire, version: int) -> None:
        message = desired(namespace, workload, pods, version=version)
        await publish_costs(self.pipe.bus, self.pipe.settings.topics.costs_for("local"), message)


@pytest.fixture
async def annotators(pipe: Pipe) -> AsyncIterator[Annotators]:
    async with leak_check():
        started = Annotators(pipe)
        yield started
        for service in list(started.running):
            await started.stop(service)


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = WAIT_S
) -> None:
    async def check() -> bool:
        outcome = condition()
        return bool(await outcome) if isinstance(outcome, Awaitable) else bool(outcome)

    await KubeTestCluster.wait_for(check, what, timeout=timeout, interval=0.02)


async def workload(kube: KubeTestCluster, space: Space, replicas: int) -> tuple[str, list[PodView]]:
    """A fresh Deployment of ``replicas`` pods on this module's node; its pods by name."""
    name = f"w-{uuid.uuid4().hex[:6]}"
    await kube.create_deployment(
        space.namespace, name, replicas, opt_in=True, node_selector=NODE_LABEL
    )
    pods: list[PodView] = []

    async def created() -> bool:
        nonlocal pods
        pods = await kube.active_pods(space.namespace, name)
        return len(pods) == replicas

    await kube.wait_for(created, f"{replicas} pods of {name}", timeout=WAIT_S, interval=0.05)
    return name, sorted(pods, key=lambda pod: pod.name)


async def costs_on(
    kube: KubeTestCluster, space: Space, app: str
) -> dict[str, tuple[str | None, CostOwner]]:
    """Per pod name: the deletion cost on it and who owns it, as the API says now."""
    return {
        pod["metadata"]["name"]: (
            (pod["metadata"].get("annotations") or {}).get(DELETION_COST_ANNOTATION),
            cost_owner(pod["metadata"]),
        )
        for pod in await kube.raw_pods(space.namespace, app)
    }


def sample(service: AnnotatorService, name: str, **labels: str) -> float:
    return service.metrics.get_sample_value(name, labels) or 0.0


def patches(service: AnnotatorService, result: str) -> float:
    return sample(service, "podcost_patches_total", result=result)


def committed_all(service: AnnotatorService, records: int) -> Callable[[], bool]:
    return lambda: sum(service.committed.values()) == records


async def test_exactly_the_pods_whose_cost_differs_are_patched_once_each_as_podcost(
    kube: KubeTestCluster, space: Space, annotators: Annotators, pipe: Pipe
) -> None:
    app, pods = await workload(kube, space, 6)
    real = Kube(kube.api)
    # Two pods already carry their costs, written by podcost earlier.
    await real.patch_deletion_cost(space.namespace, pods[0].name, 10)
    await real.patch_deletion_cost(space.namespace, pods[1].name, 20)
    await pipe.bus.publish(
        pipe.settings.topics.costs_for("local"),
        f"local/{space.namespace}/Deployment/{app}",
        b'{"schema_version": 1, "key": 42}',
    )
    # v1 is superseded by v2 before anything is written: only v2's values may reach the pods.
    await annotators.publish(
        space.namespace, app, *(Desire(p.name, p.uid, 99) for p in pods), version=1
    )
    final = [
        Desire(pods[0].name, pods[0].uid, 10, previous=10),  # the snapshot saw it: no request
        Desire(pods[1].name, pods[1].uid, 20, previous=None),  # stale snapshot: read, no write
        *(Desire(p.name, p.uid, cost, previous=None) for cost, p in enumerate(pods[2:], 1)),
    ]
    await annotators.publish(space.namespace, app, *final, version=2)
    counting = CountingPods(real)
    service = await annotators.start(counting)
    await eventually(committed_all(service, 3), "all three records committed")

    assert counting.patches == {f"{space.namespace}/{p.name}": 1 for p in pods[2:]}
    assert counting.total == 4  # the number of pods whose cost differed
    assert await costs_on(kube, space, app) == {
        desire.name: (str(desire.cost), CostOwner.PODCOST) for desire in final
    }
    # Both were on the topic past the committed offsets at the start: read ahead, v1 is stale
    # before any of its writes is queued.
    assert (
        patches(service, "ok"),
        patches(service, "superseded"),
        patches(service, "unchanged"),
    ) == (4, 0, 2)
    topic = pipe.settings.topics.costs_for("local")
    assert sample(service, "podcost_messages_consumed_total", topic=topic, outcome="stale") == 1
    assert sample(service, "podcost_event_to_annotation_seconds_count") == 4
    [letter] = await pipe.dead_letters()
    assert (letter.offset, letter.group, letter.error) == (
        0,
        f"{annotators.group}.local",
        "DecodeError",
    )
    assert "costs" in letter.reason


async def test_a_pod_deleted_before_its_write_is_skipped_and_the_others_are_written(
    kube: KubeTestCluster, space: Space, annotators: Annotators
) -> None:
    app, pods = await workload(kube, space, 3)
    real = Kube(kube.api)
    doomed = pods[0]
    await kube.core.delete_namespaced_pod(doomed.name, space.namespace, grace_period_seconds=0)

    async def deleted() -> bool:
        try:
            await real.read_pod(space.namespace, doomed.name)
        except PodGone:
            return True
        return False

    await eventually(deleted, f"pod {doomed.name} gone")
    await annotators.publish(
        space.namespace, app, *(Desire(p.name, p.uid, i) for i, p in enumerate(pods)), version=1
    )
    counting = CountingPods(real)
    service = await annotators.start(counting)
    await eventually(committed_all(service, 1), "the record committed")

    assert counting.patches == {f"{space.namespace}/{p.name}": 1 for p in pods[1:]}
    assert patches(service, "gone") == 1
    on_pods = await costs_on(kube, space, app)
    assert doomed.name not in on_pods  # and its replacement got no cost of the old pod
    assert {name: on_pods[name] for name in (pods[1].name, pods[2].name)} == {
        pods[1].name: ("1", CostOwner.PODCOST),
        pods[2].name: ("2", CostOwner.PODCOST),
    }


async def test_mid_write_a_hand_set_cost_wins_a_deletion_skips_a_status_change_is_no_obstacle(
    kube: KubeTestCluster, space: Space, annotators: Annotators
) -> None:
    app, pods = await workload(kube, space, 3)
    manual, doomed, busy = pods
    real = Kube(kube.api)
    counting = CountingPods(real)

    async def person_sets_a_cost() -> None:
        await kube.set_deletion_cost(space.namespace, manual.name, -3)

    async def pod_is_deleted() -> None:
        await kube.core.delete_namespaced_pod(doomed.name, space.namespace, grace_period_seconds=0)

        async def gone() -> bool:
            try:
                await real.read_pod(space.namespace, doomed.name)
            except PodGone:
                return True
            return False

        await eventually(gone, f"pod {doomed.name} gone")

    async def status_changes() -> None:
        condition = {"type": "podcost.dev/test", "status": "True"}
        await kube.patch_pod_status(space.namespace, busy.name, {"conditions": [condition]})

    counting.before_patch = {
        manual.name: person_sets_a_cost,
        doomed.name: pod_is_deleted,
        busy.name: status_changes,
    }
    await annotators.publish(
        space.namespace, app, *(Desire(p.name, p.uid, i + 1) for i, p in enumerate(pods)), version=1
    )
    service = await annotators.start(counting)
    await eventually(committed_all(service, 1), "the record committed")

    on_pods = await costs_on(kube, space, app)
    assert on_pods[manual.name] == ("-3", CostOwner.OTHER)  # the swap was refused, then left
    assert on_pods[busy.name] == ("3", CostOwner.PODCOST)  # one PATCH despite the status change
    assert doomed.name not in on_pods
    assert counting.patches == {f"{space.namespace}/{p.name}": 1 for p in pods}
    assert (patches(service, "conflict"), patches(service, "skipped_foreign"),
            patches(service, "gone"), patches(service, "ok")) == (1, 1, 1, 1)  # fmt: skip


async def test_a_cost_set_by_hand_is_left_alone_unless_overwrite_foreign_is_configured(
    kube: KubeTestCluster, space: Space, annotators: Annotators
) -> None:
    app, pods = await workload(kube, space, 2)
    manual, other = pods
    await kube.set_deletion_cost(space.namespace, manual.name, -7)  # a person, another manager
    assert (await costs_on(kube, space, app))[manual.name] == ("-7", CostOwner.OTHER)
    wanted = (Desire(manual.name, manual.uid, 1, previous=-7), Desire(other.name, other.uid, 2))
    await annotators.publish(space.namespace, app, *wanted, version=1)
    counting = CountingPods(Kube(kube.api))
    polite = await annotators.start(counting)
    await eventually(committed_all(polite, 1), "the record committed")
    assert counting.patches == {f"{space.namespace}/{other.name}": 1}
    assert patches(polite, "skipped_foreign") == 1
    assert (await costs_on(kube, space, app))[manual.name] == ("-7", CostOwner.OTHER)

    # `kubectl describe deployment` shows the write and the cost it kept.
    expected = {
        ("CostsWritten", "wrote 1 pod deletion costs for decision 1"),
        ("ForeignCostKept", "kept 1 pod deletion costs someone else set (decision 1); "
         "PODCOST_ANNOTATOR_OVERWRITE_FOREIGN would take them over"),
    }  # fmt: skip

    async def told() -> set[tuple[str, str]]:
        about = f"involvedObject.kind=Deployment,involvedObject.name={app}"
        found = await kube.core.list_namespaced_event(space.namespace, field_selector=about)
        return {
            (event.reason, event.message)
            for event in found.items
            if event.reporting_component == "podcost.dev/annotator"
        }

    async def all_told() -> bool:
        return await told() == expected

    with contextlib.suppress(AssertionError):  # the comparison below shows what differs
        await kube.wait_for(all_told, "the annotator's events on the Deployment", timeout=WAIT_S)
    assert await told() == expected
    await annotators.stop(polite)

    await annotators.publish(space.namespace, app, *wanted, version=2)
    forceful = await annotators.start(counting, overwrite_foreign=True)
    await eventually(committed_all(forceful, 2), "the second record committed")
    assert counting.patches == {f"{space.namespace}/{p.name}": 1 for p in pods}
    assert await costs_on(kube, space, app) == {
        manual.name: ("1", CostOwner.PODCOST),
        other.name: ("2", CostOwner.PODCOST),
    }


async def test_dry_run_writes_nothing_and_counts_what_it_would_write(
    kube: KubeTestCluster, space: Space, annotators: Annotators
) -> None:
    app, pods = await workload(kube, space, 3)
    await annotators.publish(
        space.namespace, app, *(Desire(p.name, p.uid, 5 + i) for i, p in enumerate(pods)), version=1
    )
    counting = CountingPods(Kube(kube.api))
    service = await annotators.start(counting, dry_run=True)
    await eventually(committed_all(service, 1), "the record committed")
    assert counting.total == 0
    assert patches(service, "dry_run") == 3
    assert await costs_on(kube, space, app) == {p.name: (None, CostOwner.NONE) for p in pods}


async def test_offsets_are_committed_only_after_the_write_so_a_restart_in_between_writes_once(
    kube: KubeTestCluster, space: Space, annotators: Annotators, pipe: Pipe
) -> None:
    app, pods = await workload(kube, space, 2)
    first_pod, second_pod = pods
    real = Kube(kube.api)
    await annotators.publish(
        space.namespace, app, Desire(first_pod.name, first_pod.uid, 5), version=1
    )

    held = CountingPods(real)
    held.gate = asyncio.Event()  # never opened: this annotator stops before it writes
    first = await annotators.start(held)
    await eventually(held.held.is_set, "the write to be about to go")
    assert first.committed == {}
    if isinstance(pipe.bus, MemoryBus):
        assert pipe.bus.committed(f"{annotators.group}.local") == {}
    await annotators.stop(first)  # a crash between consuming and writing
    assert held.total == 0

    again = CountingPods(real)
    second = await annotators.start(again)
    await eventually(committed_all(second, 1), "the record read again, written and committed")
    assert again.patches == {f"{space.namespace}/{first_pod.name}": 1}
    await annotators.stop(second)

    after = CountingPods(real)
    third = await annotators.start(after)
    await annotators.publish(
        space.namespace, app, Desire(second_pod.name, second_pod.uid, 6), version=2
    )
    await eventually(committed_all(third, 2), "the next record committed")
    # The committed record was not read a third time: only the new one was consumed.
    assert (
        sample(
            third,
            "podcost_messages_consumed_total",
            topic=pipe.settings.topics.costs_for("local"),
            outcome="ok",
        )
        == 1
    )
    assert after.patches == {f"{space.namespace}/{second_pod.name}": 1}
    assert await costs_on(kube, space, app) == {
        first_pod.name: ("5", CostOwner.PODCOST),
        second_pod.name: ("6", CostOwner.PODCOST),
    }


async def test_a_tiny_high_water_mark_pauses_consumption_and_everything_is_written_after(
    kube: KubeTestCluster, space: Space, annotators: Annotators
) -> None:
    app, pods = await workload(kube, space, 8)
    for version, pair in enumerate((pods[0:2], pods[2:4], pods[4:6], pods[6:8]), 1):
        await annotators.publish(
            space.namespace,
            app,
            *(Desire(p.name, p.uid, 100 + version) for p in pair),
            version=version,
        )
    counting = CountingPods(Kube(kube.api))
    counting.gate = asyncio.Event()
    service = await annotators.start(
        counting, high_water=3, low_water=1, max_in_flight=1, poll_records=1
    )
    await eventually(lambda: service.marks.paused, "consumption to pause")
    consumed = sample(
        service,
        "podcost_messages_consumed_total",
        topic=annotators.pipe.settings.topics.costs_for("local"),
        outcome="ok",
    )
    assert consumed == 2  # paused at 4 pending writes; records 3 and 4 wait on the bus
    assert service.committed == {}
    counting.gate.set()
    await eventually(committed_all(service, 4), "all four records written and committed")
    assert service.marks.resumes >= 1
    assert service.marks.deepest <= 3 + 2  # the high mark plus one poll of one 2-pod record
    assert counting.total == 8
    assert await costs_on(kube, space, app) == {
        p.name: (str(100 + index // 2 + 1), CostOwner.PODCOST) for index, p in enumerate(pods)
    }


def costs_topic(settings: BusSettings) -> str:
    """The costs topic this cluster's annotator reads."""
    return settings.topics.costs_for("local")


async def test_an_older_decision_published_after_a_newer_one_never_rewinds_the_costs(
    kube: KubeTestCluster, space: Space, annotators: Annotators, pipe: Pipe
) -> None:
    app, pods = await workload(kube, space, 3)
    now = time.time()
    newer = desired(space.namespace, app, [Desire(p.name, p.uid, 20 + i) for i, p in
                    enumerate(pods)], version=2, changed_at=now)  # fmt: skip
    older = desired(space.namespace, app, [Desire(p.name, p.uid, 10 + i) for i, p in
                    enumerate(pods)], version=1, changed_at=now - 5)  # fmt: skip
    topic = costs_topic(pipe.settings)
    counting = CountingPods(Kube(kube.api))
    counting.gate = asyncio.Event()  # v2's writes are held in flight while v1 arrives
    service = await annotators.start(counting)
    await publish_costs(pipe.bus, topic, newer)
    await eventually(counting.held.is_set, "v2's first write about to go")
    await publish_costs(pipe.bus, topic, older)  # a replay, a slow replica: after the newer one
    await publish_costs(pipe.bus, topic, newer)  # and the newer one again
    await eventually(
        lambda: (
            sample(service, "podcost_messages_consumed_total", topic=topic, outcome="stale") == 1
        ),
        "v1 skipped as stale",
    )
    assert service.committed == {}  # v1 is not committed past v2's writes in flight
    counting.gate.set()
    await eventually(committed_all(service, 3), "all three records committed")
    assert await costs_on(kube, space, app) == {
        p.name: (str(20 + i), CostOwner.PODCOST) for i, p in enumerate(pods)
    }
    assert counting.patches == {f"{space.namespace}/{p.name}": 1 for p in pods}
    assert (
        sample(service, "podcost_messages_consumed_total", topic=topic, outcome="duplicate"),
        patches(service, "error"),
    ) == (1, 0)


@pytest.mark.parametrize("pipe", ["memory"], indirect=True)
async def test_a_deleted_workload_leaves_nothing_of_it_or_its_pods_in_the_annotator(
    kube: KubeTestCluster, space: Space, annotators: Annotators
) -> None:
    app, pods = await workload(kube, space, 2)
    await annotators.publish(
        space.namespace, app, *(Desire(p.name, p.uid, i) for i, p in enumerate(pods)), version=1
    )
    service = await annotators.start(CountingPods(Kube(kube.api)))
    await eventually(committed_all(service, 1), "the record committed")
    kept = service.kept()
    assert (kept.decisions, kept.writes, kept.workloads, kept.done) == (2, 2, 1, 1)

    # The garbage collector deletes its ReplicaSet and pods after it, as in a cluster.
    await kube.apps.delete_namespaced_deployment(app, space.namespace)

    def forgotten() -> bool:
        kept = service.kept()
        return (kept.decisions, kept.writes, kept.workloads, kept.done) == (0, 0, 0, 0)

    await eventually(forgotten, "the annotator forgetting the workload and its pods")
    assert service.kept().deleted >= 2
    assert service.guard.latest(f"local/{space.namespace}/Deployment/{app}") is None
