"""podcost's Kubernetes Events (``podcost_kube.events``) on the real API server: where
``kubectl describe`` finds them, a repeat counted into a series instead of written again, and a
flood about one object bounded by its budget.

Read back the two ways a user sees them: the ``events.k8s.io/v1`` API, and the ``core/v1`` view
that ``kubectl describe`` lists (field selector on the involved object's kind, name, namespace
and uid).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from tests.support.kube import KubeTestCluster

from podcost_kube.client import Kube
from podcost_kube.events import EventRecorder, EventSettings, ObjectRef

pytestmark = pytest.mark.integration

CONTROLLER = "podcost.dev/annotator"


@pytest.fixture
async def namespace(kube: KubeTestCluster) -> AsyncIterator[str]:
    name = await kube.create_namespace(f"events-{uuid.uuid4().hex[:8]}")
    yield name
    await kube.delete_namespace(name)


async def deployment_ref(kube: KubeTestCluster, namespace: str, name: str) -> ObjectRef:
    await kube.create_deployment(namespace, name, 0, opt_in=True)
    raw = await kube.apps.read_namespaced_deployment(name, namespace)
    return ObjectRef("apps/v1", "Deployment", namespace, name, raw.metadata.uid)


async def recording(settings: EventSettings, kube: KubeTestCluster) -> tuple[EventRecorder, Any]:
    recorder = EventRecorder(Kube(kube.api), CONTROLLER, "annotator-0", settings)
    return recorder, asyncio.create_task(recorder.run())


async def events_about(kube: KubeTestCluster, ref: ObjectRef) -> list[Any]:
    found = await client.EventsV1Api(kube.api).list_namespaced_event(
        ref.namespace, field_selector=f"regarding.name={ref.name}"
    )
    return list(found.items)


async def described(kube: KubeTestCluster, ref: ObjectRef) -> list[Any]:
    """The events ``kubectl describe`` lists for the object."""
    selector = (
        f"involvedObject.name={ref.name},involvedObject.namespace={ref.namespace},"
        f"involvedObject.kind={ref.kind},involvedObject.uid={ref.uid}"
    )
    found = await kube.core.list_namespaced_event(ref.namespace, field_selector=selector)
    return list(found.items)


async def test_an_event_shows_where_kubectl_describe_looks_and_a_repeat_joins_its_series(
    kube: KubeTestCluster, namespace: str
) -> None:
    ref = await deployment_ref(kube, namespace, "web")
    recorder, task = await recording(EventSettings(series_flush_seconds=3600), kube)
    try:
        note = "wrote 3 deletion costs for decision 7"
        recorder.record(ref, type="Normal", reason="CostsWritten", action="WriteCosts", note=note)
        await recorder.idle()
        [event] = await events_about(kube, ref)
        assert (event.reason, event.type, event.note, event.action) == (
            "CostsWritten", "Normal", note, "WriteCosts",
        )  # fmt: skip
        assert event.reporting_controller == CONTROLLER
        assert event.regarding.uid == ref.uid
        assert event.series is None
        [shown] = await described(kube, ref)
        assert (shown.reason, shown.message) == ("CostsWritten", note)

        def again(times: int) -> None:
            for _ in range(times):
                recorder.record(ref, type="Normal", reason="CostsWritten", action="WriteCosts",
                                note="wrote 1 deletion cost")  # fmt: skip

        again(9)
        await recorder.idle()
        [event] = await events_about(kube, ref)
        assert event.series.count == 10, "the first repeat is written at once, with the count"
        again(5)
        await recorder.idle()
        [event] = await events_about(kube, ref)
        assert event.series.count == 10, "later repeats wait for the flush"
        await recorder.flush()
        [event] = await events_about(kube, ref)
        assert event.series.count == 15
        assert event.note == note, "a series keeps its first note"
        assert (recorder.counts["created"], recorder.counts["patched"]) == (1, 2)
        [shown] = await described(kube, ref)
        assert shown.series.count == 15
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_flood_about_one_object_is_bounded_by_its_budget(
    kube: KubeTestCluster, namespace: str
) -> None:
    ref = await deployment_ref(kube, namespace, "flooded")
    other = await deployment_ref(kube, namespace, "quiet")
    settings = EventSettings(burst=5, refill_seconds=3600, series_flush_seconds=3600)
    recorder, task = await recording(settings, kube)
    try:
        for n in range(200):  # 200 different events about one object
            recorder.record(ref, type="Warning", reason=f"Refused{n}", action="WriteCosts",
                            note=f"refusal {n}")  # fmt: skip
        for _ in range(500):  # and one event repeated
            recorder.record(other, type="Warning", reason="CostRefused", action="WriteCosts",
                            note="forged")  # fmt: skip
        await recorder.idle()
        await recorder.flush()
        flooded = await events_about(kube, ref)
        assert sorted(e.reason for e in flooded) == [f"Refused{n}" for n in range(5)]
        assert recorder.counts["dropped_budget"] == 195
        [repeated] = await events_about(kube, other)
        assert repeated.series.count == 500
        # Every write: 5 + 1 creates and one patch with the series' count (its repeats came
        # before its create was written, so the flush writes them all at once).
        assert (recorder.counts["created"], recorder.counts["patched"]) == (6, 1)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_nothing_is_written_when_events_are_off(
    kube: KubeTestCluster, namespace: str
) -> None:
    ref = await deployment_ref(kube, namespace, "silent")
    recorder, task = await recording(EventSettings(enabled=False), kube)
    recorder.record(ref, type="Normal", reason="OptedIn", action="Rank", note="ranked")
    await recorder.idle()
    await asyncio.sleep(0)
    # Off, it lasts as long as the service it runs in: a task that ended would end the service.
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await events_about(kube, ref) == []
