"""Runs one or more services in one event loop, with the HTTP endpoints, until a signal.

``podcost run`` (embedded: every service, one in-memory bus) and the per-service commands
(``podcost ranker`` ...) call ``serve``. A service that fails stops the others, so the process
exits non-zero and its supervisor restarts it; nothing fails silently.

The services start first: the HTTP stack (FastAPI, uvicorn: a few tenths of a second of imports)
is imported in a worker thread while they list the cluster, so serving ``/healthz`` does not
delay the first cost write; ``/readyz`` says whether the services are ready either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from podcost.runtime.metrics import Metrics
from podcost.runtime.settings import ServiceSettings
from podcost_bus import Bus

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("podcost.runner")


class Service(Protocol):
    """What the runner needs of a service."""

    name: str
    metrics: Metrics

    async def run(self) -> None:
        """Do the work until cancelled."""

    def ready(self) -> bool:
        """Whether the service is connected and processing."""


async def serve(
    services: Sequence[Service],
    settings: ServiceSettings,
    *,
    bus: Bus | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Start ``bus``, run ``services`` and the HTTP server until ``stop`` is set or a signal
    comes; then stop everything in reverse order. Re-raises the first service failure."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if bus is not None:
        await bus.start()
    tasks: list[asyncio.Task[None]] = []
    http: list[asyncio.Task[None]] = []
    server: uvicorn.Server | None = None
    try:
        for service in services:
            tasks.append(asyncio.create_task(service.run(), name=service.name))
        if settings.http_port:
            server = await _http_server(services, settings)
            http.append(asyncio.create_task(server.serve(), name="http"))
        stopper = asyncio.create_task(stop.wait(), name="stop")
        done, _ = await asyncio.wait([stopper, *http, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and not task.cancelled() and task.exception() is not None:
                log.error("service %s failed", task.get_name(), exc_info=task.exception())
                raise task.exception()  # type: ignore[misc]
        stopper.cancel()
    finally:
        for task in reversed(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            # Let uvicorn close its sockets itself; cancelling it would leak them.
            server.should_exit = True
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.gather(*http), 5)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        if bus is not None:
            await bus.stop()


async def _http_server(services: Sequence[Service], settings: ServiceSettings) -> uvicorn.Server:
    """The HTTP server of ``services`` (``/healthz``, ``/readyz``, ``/metrics`` and their
    routes), not started; its modules are imported in a worker thread, so the services that are
    already running go on meanwhile."""
    http, server_lib = await asyncio.to_thread(_import_http)
    name = "+".join(service.name for service in services)
    app = http.make_app(
        name,
        lambda: all(service.ready() for service in services),
        [service.metrics for service in services],
        [service.routes() for service in services if isinstance(service, http.Routed)],
        token=(
            settings.explain_token.get_secret_value()
            if settings.explain_token is not None
            else None
        ),
    )
    config = server_lib.Config(
        app, host=settings.http_host, port=settings.http_port, log_level="warning", lifespan="off"
    )
    server: uvicorn.Server = server_lib.Server(config)
    return server


def _import_http() -> tuple[ModuleType, ModuleType]:
    # One thread, one module after the other: two threads importing modules that import each
    # other could deadlock on their import locks.
    return importlib.import_module("podcost.runtime.http"), importlib.import_module("uvicorn")
