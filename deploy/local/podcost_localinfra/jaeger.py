"""A real Jaeger (the all-in-one binary: OTLP receiver, in-memory storage, query API) on
127.0.0.1, for the tracing tests.

Called by the test fixtures. Ports are free ports picked at start (OTLP gRPC and HTTP, the
query API's HTTP and gRPC, the health check), so two runs never collide; the run directory holds
the config, the log and the pid; ``stop`` ends it by its pid. Jaeger's own telemetry is off
(no metrics port, no traces of its own queries in its storage).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import build, process

NAME = "jaeger"

CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: info

extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{health_port}
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query_port}
    grpc:
      endpoint: 127.0.0.1:{query_grpc_port}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc_port}
      http:
        endpoint: 127.0.0.1:{otlp_http_port}

processors:
  batch:
    timeout: 200ms

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


@dataclass(frozen=True)
class Jaeger:
    """A started Jaeger."""

    run_dir: Path
    pid: int
    otlp_grpc: str
    """The OTLP/gRPC endpoint, ``http://127.0.0.1:<port>`` (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    otlp_http: str
    """The OTLP/HTTP endpoint, ``http://127.0.0.1:<port>``."""
    query: str
    """The query API's base URL (``/api/services``, ``/api/traces``, ``/api/v3/...``)."""
    started_in: float

    def stop(self) -> None:
        process.stop_all(self.run_dir)

    def get(self, path: str, **params: str) -> Any:
        """GET ``path`` of the query API with ``params``; the decoded JSON."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.query}{path}{query}", timeout=10) as response:
            return json.loads(response.read())

    def services(self) -> list[str]:
        """The service names Jaeger has spans of."""
        return list(self.get("/api/services").get("data") or [])

    def traces(self, service: str, limit: int = 100, **params: str) -> list[dict[str, Any]]:
        """The traces (Jaeger's JSON model) with a span of ``service``, newest first."""
        return list(
            self.get("/api/traces", service=service, limit=str(limit), **params).get("data") or []
        )

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """One trace by its id (32 hex digits), or ``None`` while Jaeger has none of it."""
        try:
            data = self.get(f"/api/traces/{trace_id}").get("data") or []
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise
        return data[0] if data else None


def start(run_dir: Path, timeout: float = 60.0) -> Jaeger:
    """Build (if needed), configure and start Jaeger in ``run_dir``; wait until it is healthy."""
    binary = build.ensure_jaeger_tool()
    run_dir.mkdir(parents=True, exist_ok=True)
    ports = {
        name: process.free_port()
        for name in ("health_port", "query_port", "query_grpc_port", "otlp_grpc_port",
                     "otlp_http_port")
    }  # fmt: skip
    config = run_dir / "jaeger.yaml"
    config.write_text(CONFIG.format(**ports))
    started = time.monotonic()
    daemon = process.start(run_dir, NAME, [str(binary), "--config", str(config)])
    health = f"http://127.0.0.1:{ports['health_port']}/status"
    process.wait_until(
        daemon,
        lambda: (
            process.tcp_open(ports["otlp_grpc_port"])
            and process.tcp_open(ports["query_port"])
            and process.https_ok(health)
        ),
        timeout,
        "healthy",
    )
    return Jaeger(
        run_dir=run_dir,
        pid=daemon.pid,
        otlp_grpc=f"http://127.0.0.1:{ports['otlp_grpc_port']}",
        otlp_http=f"http://127.0.0.1:{ports['otlp_http_port']}",
        query=f"http://127.0.0.1:{ports['query_port']}",
        started_in=time.monotonic() - started,
    )
