"""What the Kubernetes Events recorder (``podcost_kube.events``) remembers follows the objects
told of lately: a series is forgotten once its window has passed, a budget once it has refilled,
however many objects were ever told of. The events themselves on the real API server are in
``tests/integration/test_events.py``; here the sink is a list and the clock a number."""

from __future__ import annotations

from typing import Any

from tests.support.tasks import leak_check

from podcost_kube.events import EventRecorder, EventSettings, ObjectRef


class ListSink:
    """Events written, in order."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append(body)
        return body

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return patch


async def test_series_and_budgets_of_objects_told_of_long_ago_are_forgotten() -> None:
    now = [0.0]
    settings = EventSettings(burst=2, refill_seconds=10.0, series_window_seconds=30.0)
    recorder = EventRecorder(ListSink(), "podcost.dev/annotator", "a-0", settings,
                             monotonic=lambda: now[0])  # fmt: skip
    async with leak_check():
        for index in range(100):  # workloads that come and go under new names
            ref = ObjectRef("apps/v1", "Deployment", "shop", f"app-{index}", f"uid-{index}")
            recorder.record(ref, type="Normal", reason="OptedIn", action="Rank", note="ranked")
            now[0] += 1.0
        assert recorder.tracked == (100, 100)
        # At 100 s: the series of the first 71 closed (30 s windows), and the budgets of the
        # first 91 refilled (one event each, one token back in 10 s).
        await recorder.flush()
        assert recorder.tracked == (29, 9)
        now[0] = 1000.0
        await recorder.flush()
        assert recorder.tracked == (0, 0)
