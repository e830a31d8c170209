"""A real Prometheus server on 127.0.0.1, scraping the targets and evaluating the rule files it
is given, for the tests that page on real faults.

Called by the test fixtures. The web port is a free port picked at start, so two runs never
collide; the run directory holds the configuration (written as JSON, which Prometheus reads as
YAML), the rule files, the TSDB, the log and the pid; ``stop`` ends it by its pid. The scrape and
evaluation intervals are the caller's (a test uses a second, not the minute a fleet uses); the
rules are what the caller hands over, unchanged.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import build, process

NAME = "prometheus"


@dataclass(frozen=True)
class Target:
    """One scrape target: ``host:port`` and the labels a service discovery would give it."""

    address: str
    labels: Mapping[str, str]
    """Target labels, e.g. ``job``, ``namespace``, ``pod`` (what a ServiceMonitor sets)."""


@dataclass(frozen=True)
class Prometheus:
    """A started Prometheus."""

    run_dir: Path
    pid: int
    url: str
    """The HTTP API's base URL, ``http://127.0.0.1:<port>``."""
    started_in: float

    def stop(self) -> None:
        process.stop_all(self.run_dir)

    def get(self, path: str, **params: str) -> Any:
        """GET ``path`` of the HTTP API with ``params``; the ``data`` of its JSON answer."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            answer = json.loads(response.read())
        if answer.get("status") != "success":
            raise RuntimeError(f"GET {path}: {answer}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant vector query: ``[{"metric": {labels}, "value": [t, "v"]}, ...]``."""
        data = self.get("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise RuntimeError(f"{expr!r} is a {data['resultType']}, not a vector")
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        """The active targets, each with ``labels``, ``health`` and ``lastError``."""
        return list(self.get("/api/v1/targets", state="active")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        """The pending and firing alerts, each with ``labels``, ``state`` and ``activeAt``."""
        return list(self.get("/api/v1/alerts")["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        """Every rule of every group: ``name``, ``health``, ``state``, ``lastError`` ..."""
        groups = self.get("/api/v1/rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]


def config(
    targets: Sequence[Target],
    rule_files: Sequence[Path],
    *,
    scrape_interval: float,
    evaluation_interval: float,
    metrics_path: str = "/metrics",
) -> dict[str, Any]:
    """The configuration: one scrape job of static targets (each keeping its own ``job`` label)
    and the rule files."""
    return {
        "global": {
            "scrape_interval": f"{int(scrape_interval * 1000)}ms",
            "scrape_timeout": f"{int(scrape_interval * 1000)}ms",
            "evaluation_interval": f"{int(evaluation_interval * 1000)}ms",
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": "podcost",
                "metrics_path": metrics_path,
                # The targets' own labels win over the ones Prometheus would set (job).
                "honor_labels": False,
                "static_configs": [
                    {"targets": [target.address], "labels": dict(target.labels)}
                    for target in targets
                ],
            }
        ],
    }


def start(
    run_dir: Path,
    targets: Sequence[Target],
    rule_groups: Sequence[Mapping[str, Any]] = (),
    *,
    scrape_interval: float = 1.0,
    evaluation_interval: float = 1.0,
    metrics_path: str = "/metrics",
    timeout: float = 60.0,
) -> Prometheus:
    """Build (if needed), configure and start Prometheus in ``run_dir``, scraping ``targets`` and
    evaluating ``rule_groups`` (Prometheus' ``groups`` list, e.g. a PrometheusRule's
    ``spec.groups``); wait until it is ready."""
    binary, _ = build.ensure_prometheus_tools()
    run_dir.mkdir(parents=True, exist_ok=True)
    rules = run_dir / "rules.yaml"
    rules.write_text(json.dumps({"groups": list(rule_groups)}))
    path = run_dir / "prometheus.yaml"
    path.write_text(
        json.dumps(
            config(
                targets,
                [rules],
                scrape_interval=scrape_interval,
                evaluation_interval=evaluation_interval,
                metrics_path=metrics_path,
            ),
            indent=1,
        )
    )
    port = process.free_port()
    argv = [str(binary), f"--config.file={path}", f"--storage.tsdb.path={run_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"]  # fmt: skip
    started = time.monotonic()
    daemon = process.start(run_dir, NAME, argv)
    url = f"http://127.0.0.1:{port}"
    process.wait_until(daemon, lambda: process.https_ok(f"{url}/-/ready"), timeout, "ready")
    return Prometheus(run_dir=run_dir, pid=daemon.pid, url=url,
                      started_in=time.monotonic() - started)  # fmt: skip
