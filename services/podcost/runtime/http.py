"""The HTTP face of a service: ``/healthz`` (the process is alive), ``/readyz`` (it is connected
and doing its job), ``/metrics`` (Prometheus), and the routes a service adds of its own (the
annotator's ``/explain/{namespace}/{pod}``). Built by ``runner.serve`` for each service."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from fastapi import APIRouter, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST

from podcost.runtime.metrics import Metrics, render


@runtime_checkable
class Routed(Protocol):
    """A service that serves routes of its own next to the health and metrics endpoints."""

    def routes(self) -> APIRouter:
        """Its routes (e.g. ``GET /explain/{namespace}/{pod}``)."""
        ...


def make_app(
    name: str,
    ready: Callable[[], bool],
    metrics: Sequence[Metrics],
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """A FastAPI app for one process; ``metrics`` of every service it runs are exported, and
    ``routers`` (the services' own routes) served."""
    app = FastAPI(title=f"podcost {name}", docs_url=None, redoc_url=None)
    for router in routers:
        app.include_router(router)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz(response: Response) -> dict[str, str]:
        if ready():
            return {"status": "ready"}
        response.status_code = 503
        return {"status": "not ready"}

    @app.get("/metrics")
    def prometheus() -> Response:
        body = b"".join(render(m) for m in metrics)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app
