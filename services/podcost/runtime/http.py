"""The HTTP face of a service: ``/healthz`` (the process is alive), ``/readyz`` (it is connected
and doing its job), ``/metrics`` (Prometheus), and the routes a service adds of its own (the
annotator's ``/explain/{namespace}/{pod}``). Built by ``runner.serve`` for each service.

Health, readiness and metrics are always open: the kubelet's probes and Prometheus carry no
credentials, and they show nothing about workloads. A service's own routes show pods (names,
uids, scores), so with a token (``PODCOST_EXPLAIN_TOKEN``) they answer only requests that carry
``Authorization: Bearer <token>``, and 401 to any other.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from typing import Annotated, Protocol, runtime_checkable

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from podcost.runtime.metrics import render
from podcost.runtime.version import build


@runtime_checkable
class Routed(Protocol):
    """A service that serves routes of its own next to the health and metrics endpoints."""

    def routes(self) -> APIRouter:
        """Its routes (e.g. ``GET /explain/{namespace}/{pod}``)."""
        ...


def bearer_check(token: str) -> Callable[[str | None], None]:
    """A FastAPI dependency that lets a request through only with ``Authorization: Bearer
    <token>`` (compared in constant time), else answers 401 with ``WWW-Authenticate: Bearer``."""
    expected = token.encode()

    def check(authorization: Annotated[str | None, Header()] = None) -> None:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise HTTPException(
                401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )

    return check


def make_app(
    name: str,
    ready: Callable[[], bool],
    registries: Sequence[CollectorRegistry],
    routers: Sequence[APIRouter] = (),
    *,
    token: str | None = None,
) -> FastAPI:
    """A FastAPI app for one process; its metric ``registries`` (one per process, but for a
    benchmark's own) are exported, ``/healthz`` names the build and this process, and
    ``routers`` (the services' own routes) served, behind ``token`` when one is given."""
    app = FastAPI(title=f"podcost {name}", docs_url=None, redoc_url=None)
    guard = [Depends(bearer_check(token))] if token is not None else []
    for router in routers:
        app.include_router(router, dependencies=guard)

    identity = build()
    health = {"status": "ok", **identity.labels(), "instance": identity.instance}

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return health

    @app.get("/readyz")
    def readyz(response: Response) -> dict[str, str]:
        if ready():
            return {"status": "ready"}
        response.status_code = 503
        return {"status": "not ready"}

    @app.get("/metrics")
    async def prometheus() -> Response:
        # On the event loop, not in a worker thread: the gauges read at each scrape read the
        # services' state, and some of it on the loop's clock (the Lease's failing time).
        return Response(render(registries), media_type=CONTENT_TYPE_LATEST)

    return app
