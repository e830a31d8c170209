"""Runs one or more services in one event loop, with the HTTP endpoints, until a signal.

``podcost run`` (embedded: every service, one in-memory bus) and the per-service commands
(``podcost ranker`` ...) call ``serve``. A service that fails stops the others, so the process
exits non-zero and its supervisor restarts it; nothing fails silently.

The services start first. The HTTP server (FastAPI and uvicorn: a few tenths of a second of
imports, which would block the event loop the services share) starts once every service is
ready, or :data:`HTTP_DEFER_S` after the start if that comes first: after a restart of
``podcost run`` that is once the first pass's costs are written, so serving ``/healthz`` does
not delay the first cost writes. Until then nothing listens on the port, which probes read as
not ready (the chart's startup probe allows a minute).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from podcost.runtime.metrics import Metrics
from podcost.runtime.settings import ServiceSettings
from podcost_bus import Bus

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("podcost.runner")

#: The longest the HTTP server waits for the services to be ready before it starts anyway.
HTTP_DEFER_S = 2.0


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
    servers: list[uvicorn.Server] = []
    try:
        for service in services:
            tasks.append(asyncio.create_task(service.run(), name=service.name))
        if settings.http_port:
            http.append(asyncio.create_task(_serve_http(services, settings, servers), name="http"))
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
        if servers:
            # Let uvicorn close its sockets itself; cancelling it would leak them.
            servers[0].should_exit = True
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.gather(*http), 5)
        else:  # still waiting to start
            for task in http:
                task.cancel()
            await asyncio.gather(*http, return_exceptions=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        if bus is not None:
            await bus.stop()


async def _serve_http(
    services: Sequence[Service], settings: ServiceSettings, servers: list[uvicorn.Server]
) -> None:
    """Serve the HTTP endpoints of ``services`` (``/healthz``, ``/readyz``, ``/metrics`` and
    their routes) once they are ready or :data:`HTTP_DEFER_S` has passed; the server goes into
    ``servers`` when it starts."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HTTP_DEFER_S
    # ``ready()`` is a predicate each service answers; none signals a change, so it is polled.
    while loop.time() < deadline and not all(service.ready() for service in services):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    import uvicorn

    from podcost.runtime.http import Routed, make_app

    name = "+".join(service.name for service in services)
    app = make_app(
        name,
        lambda: all(service.ready() for service in services),
        [service.metrics.registry for service in services],
        [service.routes() for service in services if isinstance(service, Routed)],
        token=(
            settings.explain_token.get_secret_value()
            if settings.explain_token is not None
            else None
        ),
    )
    config = uvicorn.Config(
        app, host=settings.http_host, port=settings.http_port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    servers.append(server)
    await server.serve()
