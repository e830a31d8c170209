"""The watcher's first pass over a filled cache, without a cluster (``WatcherService`` on a bus
whose deliveries the test acknowledges): every pod of the pass is converted before the first
snapshot goes out, and the heap is settled once the pass is delivered, not before (issue 14:
what the cache keeps is then not strewn among what publishing leaves behind)."""

from __future__ import annotations

import asyncio
import contextlib
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


async def test_the_first_pass_converts_every_pod_first_and_settles_once_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bus = HeldBus()
    watcher = bootstrap(
        ServiceSettings(cluster="test", http_port=0),
        BusSettings(),
        WatcherSettings(),
        kube=cast(Kube, None),  # the first pass reads the cache only
        bus=bus,
    )
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
        assert bus.converted_at_send == [8, 8]
        assert (watcher.pods.misses, len(watcher.pods._requests)) == (8, 0)
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
