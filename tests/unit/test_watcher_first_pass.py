"""The watcher's first pass over a filled cache, without a cluster (``WatcherService`` on a bus
whose deliveries the test acknowledges): every pod of the pass is converted before the first
snapshot goes out, and the heap is settled once the pass is delivered, not before (so
that what the cache keeps is not strewn among what publishing leaves behind). And what the
watcher reports of the pods its cache converts."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Mapping
from typing import Any, cast

import pytest
from tests.unit.rawobjects import NS, raw_deployment, raw_node, raw_pod, raw_replicaset

from podcost.runtime.settings import ServiceSettings
from podcost.watcher import service as watcher_service
from podcost.watcher.service import WatcherSettings, bootstrap
from podcost_bus import BusSettings, MemoryBus
from podcost_bus.protocol import Delivery
from podcost_kube.client import Kube
from podcost_kube.podcache import PodCache
from podcost_kube.store import ChangeType

ENABLED = {"podcost.dev/enabled": "true"}


class HeldBus(MemoryBus):
    """A memory bus whose deliveries stay unacknowledged until :meth:`deliver`; records what the
    watcher's cache had converted when each snapshot was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[asyncio.Future[Delivery], Delivery]] = []
        self.converted_at_send: list[int] = []
        self.misses = lambda: 0

    async def send(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> asyncio.Future[Delivery]:
        self.converted_at_send.append(self.misses())
        delivered = await super().send(topic, key, value, headers)
        held: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        self.held.append((held, await delivered))
        return held

    def deliver(self) -> None:
        for held, delivery in self.held:
            held.set_result(delivery)


async def until(condition: Any) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


@pytest.mark.parametrize(("size", "converted"), [(4096, [8, 8]), (4, [4, 8])])
async def test_the_first_pass_converts_every_pod_first_and_settles_once_delivered(
    monkeypatch: pytest.MonkeyPatch, size: int, converted: list[int]
) -> None:
    # With a cache too small for the pass, converting first stops once it is full: the pods
    # after would push out those before (size 4: web's pods first, api's when published).
    bus = HeldBus()
    watcher = bootstrap(
        ServiceSettings(cluster="test", http_port=0),
        BusSettings(),
        WatcherSettings(),
        kube=cast(Kube, None),  # the first pass reads the cache only
        bus=bus,
    )
    watcher.pods = PodCache(on_convert=watcher._check_pod, size=size)
    bus.misses = lambda: watcher.pods.misses
    objects = [("Node", raw_node(f"n{index}", "a")) for index in range(3)]
    for app in ("web", "api"):
        objects += [
            ("Deployment", raw_deployment(app, ENABLED)),
            ("ReplicaSet", raw_replicaset(f"{app}-1", app, app)),
        ]
        objects += [
            ("Pod", raw_pod(f"{app}-1-{index}", rs=f"{app}-1", app=app, node=f"n{index % 3}"))
            for index in range(4)
        ]
    for kind, obj in objects:
        watcher.store.apply(kind, ChangeType.ADDED, obj)
    settled: list[int] = []
    monkeypatch.setattr(watcher_service, "settle_heap", lambda: settled.append(len(bus.held)))
    watcher._start_first_pass()
    task = asyncio.create_task(watcher._publish_forever())
    try:
        await until(lambda: watcher.first_pass() is not None)
        # Both snapshots out; the pods of both converted before the first went.
        assert bus.converted_at_send == converted
        assert (watcher.pods.misses, len(watcher.pods)) == (8, min(8, size))
        assert settled == []  # not while the bus still holds the pass
        bus.deliver()
        await until(lambda: settled)
        assert settled == [2]
        assert sorted(watcher.first_pass() or {}) == [f"test/{NS}/Deployment/{app}"
                                                      for app in ("api", "web")]  # fmt: skip
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_an_invalid_cost_is_reported_once_per_value_however_often_its_pod_is_converted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The cache keeps only the pods used last (PodCache's size): a pod it pushed out is
    # converted, and handed over, again; the watcher still reports its invalid cost once.
    watcher = bootstrap(
        ServiceSettings(cluster="test", http_port=0),
        BusSettings(),
        WatcherSettings(),
        kube=cast(Kube, None),
    )
    watcher.pods = PodCache(on_convert=watcher._check_pod, size=1)
    bad = raw_pod("web-1-a", rs="web-1", app="web", node="n1")
    bad["metadata"]["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": "abc"}
    other = raw_pod("web-1-b", rs="web-1", app="web", node="n1")

    def counted() -> float:
        labels = {"source": "controller.kubernetes.io/pod-deletion-cost"}
        sample = watcher.metrics.get_sample_value("podcost_invalid_annotations_total", labels)
        return sample or 0.0

    with caplog.at_level(logging.WARNING, logger="podcost.watcher"):
        for _ in range(3):
            watcher.pods.convert(bad)
            watcher.pods.convert(other)  # pushes the bad one out
        assert watcher.pods.misses == 6
        assert counted() == 1
        worse = copy.deepcopy(bad)
        worse["metadata"]["resourceVersion"] += "1"
        worse["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] = "1.5"
        watcher.pods.convert(worse)
        assert counted() == 2  # another invalid value: reported
        fixed = copy.deepcopy(worse)
        fixed["metadata"]["resourceVersion"] += "1"
        fixed["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] = "3"
        watcher.pods.convert(fixed)
        watcher.pods.convert(worse)  # invalid again after a valid one: reported again
        assert counted() == 3
    warnings = [r for r in caplog.records if "is not a cost the controller" in r.message]
    assert [getattr(r, "value", None) for r in warnings] == ["abc", "1.5", "1.5"]
