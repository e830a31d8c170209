"""The annotator verifies before it writes, on the real control plane and the real Kafka broker:
forged decisions published to the cluster's own costs topic name (a) a kube-system pod, (b) a
pod of a workload that never opted in, (c) a pod under a uid it does not have, (d) a pod of
another workload than the record's key names, (e) a pod in a namespace outside the annotator's
scope. Each is refused with its reason in ``podcost_refusals``, without a single request for
that pod (``CountingPods`` around the real ``Kube`` adapter counts the reads and PATCHes that
reach the API server), its annotations and managed fields stay as they were, and its record is
committed; the genuine decisions in the same stream are written.

The annotator's view is its own informer (``InformerView``) over the real API server, as in
production.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
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
from podcost_bus import BusSettings, KafkaBus
from podcost_core.model import DELETION_COST_ANNOTATION, FIELD_MANAGER
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
NODE_LABEL = {"podcost-verify-test": RUN}
WAIT_S = 60.0
REFUSAL_REASONS = ("out_of_scope", "unknown_pod", "uid_mismatch", "unknown_owner", "no_workload",
                   "other_workload", "not_opted_in")  # fmt: skip


@dataclass
class Space:
    inside: str
    """The namespace of the workloads the decisions are about."""
    outside: str
    """Another namespace, outside a one-namespace scope."""
    node: str


@pytest.fixture(scope="module")
async def space(kube: KubeTestCluster) -> AsyncIterator[Space]:
    inside = await kube.create_namespace(f"verify-in-{RUN}")
    outside = await kube.create_namespace(f"verify-out-{RUN}")
    node = f"verify-{RUN}"
    await kube.create_node(node, zone="a", labels=NODE_LABEL)
    yield Space(inside, outside, node)
    await kube.delete_namespace(inside)
    await kube.delete_namespace(outside)
    await kube.delete_nodes([node])


@dataclass
class Stream:
    """The real broker, this test's topics, and the annotator under test on them."""

    bus: KafkaBus
    settings: BusSettings

    @property
    def topic(self) -> str:
        return self.settings.topics.costs_for("local")

    async def annotator(
        self, kube: KubeTestCluster, scope: Scope
    ) -> tuple[AnnotatorService, CountingPods, asyncio.Task[None]]:
        real = Kube(kube.api)
        counting = CountingPods(real)
        group = f"podcost-verify-{uuid.uuid4().hex[:6]}"
        service = bootstrap(
            # The default cluster, "local": the forged records are on its own costs topic.
            ServiceSettings(http_port=0, retry_initial_seconds=0.05),
            self.settings,
            AnnotatorSettings(group=group),
            bus=self.bus,
            kube=counting,
            scope=scope,
            view=InformerView(real, scope),
        )
        task = asyncio.create_task(service.run(), name="annotator-under-test")
        await until(service.ready, "the annotator to consume with a synced view")
        return service, counting, task


@pytest.fixture
async def stream(kafka_bootstrap: str) -> AsyncIterator[Stream]:
    settings = fresh_kafka_settings(kafka_bootstrap, "verify")
    bus = KafkaBus(settings)
    async with bus:
        await bus.ensure_topics([*settings.topics.shared(), settings.topics.costs_for("local")])
        yield Stream(bus, settings)


async def until(condition: Callable[[], bool], what: str) -> None:
    async def check() -> bool:
        return bool(condition())

    await KubeTestCluster.wait_for(check, what, timeout=WAIT_S, interval=0.05)


async def deployment(
    kube: KubeTestCluster, namespace: str, name: str, replicas: int, *, opt_in: bool
) -> list[PodView]:
    await kube.create_deployment(namespace, name, replicas, opt_in=opt_in, node_selector=NODE_LABEL)
    pods: list[PodView] = []

    async def created() -> bool:
        nonlocal pods
        pods = await kube.active_pods(namespace, name)
        return len(pods) == replicas

    await kube.wait_for(created, f"{replicas} pods of {name}", timeout=WAIT_S, interval=0.1)
    return sorted(pods, key=lambda pod: pod.name)


async def bare_pod(kube: KubeTestCluster, namespace: str, name: str) -> PodView:
    """A pod no controller owns, as a static pod's mirror or a pod made by hand."""
    created = await kube.core.create_namespaced_pod(namespace, {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [{"name": "app", "image": "registry.local/podcost/app:1"}],
                 "nodeSelector": NODE_LABEL, "terminationGracePeriodSeconds": 0},
    })  # fmt: skip
    return PodView(name, created.metadata.uid, None, False, False, created)


async def metadata_of(kube: KubeTestCluster, namespace: str, name: str) -> dict[str, Any]:
    """The pod's annotations and the managers of its fields, as the API says now."""
    raw = await Kube(kube.api).read_pod(namespace, name)
    meta = raw["metadata"]
    return {
        "annotations": meta.get("annotations") or {},
        "managers": sorted({entry.get("manager") for entry in meta.get("managedFields") or []}),
    }


def sample(service: AnnotatorService, name: str, **labels: str) -> float:
    return service.metrics.get_sample_value(name, labels) or 0.0


def refused(service: AnnotatorService) -> dict[str, float]:
    found = {
        reason: sample(service, "podcost_refusals_total", reason=reason)
        for reason in REFUSAL_REASONS
    }
    return {reason: count for reason, count in found.items() if count}


async def told(kube: KubeTestCluster, namespace: str, kind: str, name: str) -> set[tuple[str, ...]]:
    """podcost's events about ``kind`` ``name``, as ``kubectl describe`` finds them: (type,
    reason, the reason for a refusal as the note names it)."""
    found = await kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    )
    return {
        (event.type, event.reason, *(r for r in REFUSAL_REASONS if f": {r}," in event.message))
        for event in found.items
        if event.reporting_component == "podcost.dev/annotator"
    }


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_forged_decisions_are_refused_by_reason_without_a_request_and_genuine_ones_written(
    kube: KubeTestCluster, space: Space, stream: Stream
) -> None:
    ns = space.inside
    web = await deployment(kube, ns, f"web-{RUN}", 2, opt_in=True)
    api = await deployment(kube, ns, f"api-{RUN}", 2, opt_in=True)
    legacy = await deployment(kube, ns, f"legacy-{RUN}", 1, opt_in=False)
    system = await bare_pod(kube, "kube-system", f"static-{RUN}")
    bystanders = [("kube-system", system), (ns, legacy[0]), (ns, web[1]), (ns, api[0])]
    before = {pod.name: await metadata_of(kube, where, pod.name) for where, pod in bystanders}
    assert all(DELETION_COST_ANNOTATION not in meta["annotations"] for meta in before.values())
    try:
        # One record for web: its genuine pod, and (c) its other pod under a uid it does not have.
        mixed = [Desire(web[0].name, web[0].uid, 5), Desire(web[1].name, f"{web[1].uid}-x", 6)]
        forged = [
            desired(ns, f"web-{RUN}", mixed),
            desired(ns, f"web-{RUN}", [Desire(api[0].name, api[0].uid, 7)], version=2),  # (d)
            desired(ns, f"legacy-{RUN}", [Desire(legacy[0].name, legacy[0].uid, 8)]),  # (b)
        ]
        kube_system = desired(ns, f"web-{RUN}", [Desire(system.name, system.uid, 9)], version=3)
        kube_system = kube_system.model_copy(  # (a) the entry names the kube-system pod
            update={"costs": tuple(c.model_copy(update={"namespace": "kube-system"})
                                   for c in kube_system.costs)}
        )  # fmt: skip
        genuine = desired(ns, f"api-{RUN}", [Desire(api[1].name, api[1].uid, 11)])
        for message in (*forged, kube_system, genuine):
            await publish_costs(stream.bus, stream.topic, message)
        service, counting, task = await stream.annotator(kube, Scope())
        try:
            await until(lambda: sum(service.committed.values()) == 5, "all 5 records committed")
            assert refused(service) == {
                "uid_mismatch": 1, "other_workload": 1, "not_opted_in": 1, "no_workload": 1,
            }  # fmt: skip
            assert sample(service, "podcost_patches_total", result="refused") == 4
            # No request at all for a forged entry: only the genuine pods were read and patched.
            assert counting.patches == {f"{ns}/{web[0].name}": 1, f"{ns}/{api[1].name}": 1}
            assert set(counting.reads) == {f"{ns}/{web[0].name}", f"{ns}/{api[1].name}"}
            # Each refused pod is told why, where `kubectl describe pod` looks; each workload
            # whose genuine costs were written is told so.
            expected = {
                (ns, "Pod", web[1].name): {("Warning", "CostRefused", "uid_mismatch")},
                (ns, "Pod", api[0].name): {("Warning", "CostRefused", "other_workload")},
                (ns, "Pod", legacy[0].name): {("Warning", "CostRefused", "not_opted_in")},
                ("kube-system", "Pod", system.name): {("Warning", "CostRefused", "no_workload")},
                (ns, "Deployment", f"web-{RUN}"): {("Normal", "CostsWritten")},
                (ns, "Deployment", f"api-{RUN}"): {("Normal", "CostsWritten")},
            }

            async def events() -> dict[tuple[str, str, str], set[tuple[str, ...]]]:
                return {where: await told(kube, *where) for where in expected}

            async def all_told() -> bool:
                return await events() == expected

            with contextlib.suppress(AssertionError):  # the comparison below shows what differs
                await kube.wait_for(all_told, "podcost's events on each pod and workload",
                                    timeout=WAIT_S, interval=0.2)  # fmt: skip
            assert await events() == expected
        finally:
            await stop(task)
        after = {pod.name: await metadata_of(kube, where, pod.name) for where, pod in bystanders}
        # Their annotations as they were, and no field of theirs managed by podcost (other
        # managers, the scheduler's binding and kwok's status, come and go meanwhile).
        assert {name: meta["annotations"] for name, meta in after.items()} == {
            name: meta["annotations"] for name, meta in before.items()
        }
        assert all(FIELD_MANAGER not in meta["managers"] for meta in after.values())
        for where, pod, cost in ((ns, web[0], "5"), (ns, api[1], "11")):
            written = await metadata_of(kube, where, pod.name)
            assert written["annotations"].get(DELETION_COST_ANNOTATION) == cost
            assert FIELD_MANAGER in written["managers"]
    finally:
        await kube.core.delete_namespaced_pod(system.name, "kube-system", grace_period_seconds=0)


async def test_a_decision_outside_the_annotators_namespace_is_refused_and_one_inside_written(
    kube: KubeTestCluster, space: Space, stream: Stream
) -> None:
    inside = await deployment(kube, space.inside, f"shop-{RUN}", 1, opt_in=True)
    outside = await deployment(kube, space.outside, f"shop-{RUN}", 1, opt_in=True)
    before = await metadata_of(kube, space.outside, outside[0].name)
    # (e) a decision about an opted-in workload, valid in every way but its namespace.
    await publish_costs(stream.bus, stream.topic, desired(
        space.outside, f"shop-{RUN}", [Desire(outside[0].name, outside[0].uid, 3)]))  # fmt: skip
    await publish_costs(stream.bus, stream.topic, desired(
        space.inside, f"shop-{RUN}", [Desire(inside[0].name, inside[0].uid, 4)]))  # fmt: skip
    async with leak_check():
        service, counting, task = await stream.annotator(kube, Scope(namespaces=(space.inside,)))
        try:
            await until(lambda: sum(service.committed.values()) == 2, "both records committed")
            assert refused(service) == {"out_of_scope": 1}
            assert counting.patches == {f"{space.inside}/{inside[0].name}": 1}
            assert set(counting.reads) == {f"{space.inside}/{inside[0].name}"}

            # The event about the write inside is recorded after the refusal outside would be.
            async def written_told() -> bool:
                shop = f"shop-{RUN}"
                return await told(kube, space.inside, "Deployment", shop) == {
                    ("Normal", "CostsWritten")
                }

            await kube.wait_for(written_told, "CostsWritten on the Deployment inside",
                                timeout=WAIT_S, interval=0.2)  # fmt: skip
            # Nothing written outside the namespaces it serves, not even an event.
            assert await told(kube, space.outside, "Pod", outside[0].name) == set()
        finally:
            await stop(task)
    after = await metadata_of(kube, space.outside, outside[0].name)
    assert after["annotations"] == before["annotations"]
    assert FIELD_MANAGER not in after["managers"]
    written = await metadata_of(kube, space.inside, inside[0].name)
    assert written["annotations"].get(DELETION_COST_ANNOTATION) == "4"
