"""Every service's HTTP face, served by the runner: ``/healthz`` answers while the process lives,
``/readyz`` follows the services' readiness, ``/metrics`` exports every service's metrics, each
family once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import platform
import socket
import urllib.error
import urllib.request

from tests.support.exposition import problems

from podcost.runtime.metrics import Families, Metrics
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.version import build, package_version
from podcost_bus import MemoryBus


class Idle:
    """A service that does nothing until cancelled, ready when told."""

    def __init__(self, name: str, families: Families) -> None:
        self.name = name
        self.metrics = Metrics(name, families)
        self.is_ready = False

    async def run(self) -> None:
        await asyncio.Event().wait()

    def ready(self) -> bool:
        return self.is_ready


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def _until_serving(base: str) -> None:
    for _ in range(200):
        with contextlib.suppress(OSError):
            await asyncio.to_thread(_get, f"{base}/healthz")
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the HTTP server never answered")


async def test_the_runner_serves_health_readiness_and_every_services_metrics() -> None:
    port = _free_port()
    shared = Families()
    services = [Idle("ranker-age", shared), Idle("aggregator", shared)]
    services[0].metrics.snapshots_ranked.labels("age").inc(3)
    stop = asyncio.Event()
    settings = ServiceSettings(http_host="127.0.0.1", http_port=port)
    task = asyncio.create_task(serve(services, settings, bus=MemoryBus(), stop=stop))
    base = f"http://127.0.0.1:{port}"
    try:
        await _until_serving(base)
        status, health = await asyncio.to_thread(_get, f"{base}/healthz")
        identity = build()
        assert (status, json.loads(health)) == (200, {
            "status": "ok", "version": package_version(), "revision": identity.revision,
            "python": platform.python_version(), "instance": identity.instance,
        })  # fmt: skip
        assert (await asyncio.to_thread(_get, f"{base}/readyz"))[0] == 503
        services[0].is_ready = True
        assert (await asyncio.to_thread(_get, f"{base}/readyz"))[0] == 503
        services[1].is_ready = True
        assert await asyncio.to_thread(_get, f"{base}/readyz") == (200, '{"status":"ready"}')
        status, metrics = await asyncio.to_thread(_get, f"{base}/metrics")
        assert status == 200
        line = 'podcost_snapshots_ranked_total{component="ranker-age",strategy="age"} 3.0'
        assert line in metrics
        assert problems(metrics) == []
        assert "podcost_build_info{" in metrics
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_gauge_read_on_the_event_loop_s_clock_is_served() -> None:
    """``/metrics`` renders on the event loop: a gauge whose function reads the running loop's
    clock (the watcher's Lease failing time) is served, never an error of a worker thread."""
    port = _free_port()
    shared = Families()
    service = Idle("watcher", shared)
    service.metrics.api_server_failing.set_function(lambda: asyncio.get_running_loop().time())
    stop = asyncio.Event()
    settings = ServiceSettings(http_host="127.0.0.1", http_port=port)
    task = asyncio.create_task(serve([service], settings, bus=MemoryBus(), stop=stop))
    base = f"http://127.0.0.1:{port}"
    try:
        await _until_serving(base)
        status, metrics = await asyncio.to_thread(_get, f"{base}/metrics")
        assert status == 200, metrics
        assert 'podcost_api_server_failing_seconds{component="watcher"}' in metrics
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
