"""Runs one or more services in one event loop, with the HTTP endpoints, until a signal.

``podcost run`` (embedded: every service, one in-memory bus) and the per-service commands
(``podcost ranker`` ...) call ``serve``. A service that fails stops the others, so the process
exits non-zero and its supervisor restarts it; nothing fails silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from typing import Protocol

import uvicorn

from podcost.runtime.http import Routed, make_app
from podcost.runtime.metrics import Metrics
from podcost.runtime.settings import ServiceSettings
from podcost_bus import Bus

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
    server: uvicorn.Server | None = None
    try:
        if settings.http_port:
            name = "+".join(service.name for service in services)
            app = make_app(
                name,
                lambda: all(service.ready() for service in services),
                [service.metrics for service in services],
                [service.routes() for service in services if isinstance(service, Routed)],
                token=(
                    settings.explain_token.get_secret_value()
                    if settings.explain_token is not None
                    else None
                ),
            )
            config = uvicorn.Config(
                app, host=settings.http_host, port=settings.http_port, log_level="warning",
                lifespan="off",
            )  # fmt: skip
            server = uvicorn.Server(config)
            tasks.append(asyncio.create_task(server.serve(), name="http"))
        for service in services:
            tasks.append(asyncio.create_task(service.run(), name=service.name))
        stopper = asyncio.create_task(stop.wait(), name="stop")
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and not task.cancelled() and task.exception() is not None:
                log.error("service %s failed", task.get_name(), exc_info=task.exception())
                raise task.exception()  # type: ignore[misc]
        stopper.cancel()
    finally:
        http = [task for task in tasks if task.get_name() == "http"]
        for task in reversed(tasks):
            if task not in http:
                task.cancel()
        await asyncio.gather(*tasks[len(http) :], return_exceptions=True)
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
