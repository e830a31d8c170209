"""What a Prometheus Operator would scrape of a podcost release, for the tests that run a real
Prometheus over real podcost processes.

:func:`monitor_targets` reads the chart as ``helm template`` renders it with its ServiceMonitor on:
the Services the ServiceMonitor selects (its ``selector`` and ``namespaceSelector``), the
Deployment each Service selects, and the endpoint's named port and path. Each running process of
such a Deployment (``tests/support/services.py`` names them after the component) becomes one
target at its local port, with the labels the operator gives a target: ``job`` (the Service's
``jobLabel`` label, the component), ``namespace``, ``service``, ``pod``, ``container`` and
``endpoint``. The chart's alert rules group by exactly those, so they evaluate here as they do
in a cluster. :func:`alert_rule_groups` is the chart's PrometheusRule's ``spec.groups``.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from podcost_localinfra import build, process, prometheus
from podcost_localinfra.prometheus import Prometheus, Target
from tests.conftest import unavailable
from tests.support.services import CHART, NAMESPACE, RELEASE, ServiceProcess, pod_name


def _render(helm: Path, values: Mapping[str, Any], namespace: str) -> list[dict[str, Any]]:
    rendered = subprocess.run(
        [str(helm), "template", RELEASE, str(CHART), "--namespace", namespace, "--values", "-"],
        input=yaml.safe_dump(dict(values)), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if rendered.returncode != 0:
        raise AssertionError(f"helm template failed: {rendered.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def _with(values: Mapping[str, Any], section: str, key: str) -> dict[str, Any]:
    """``values`` with ``metrics.<section>.<key>: true``."""
    metrics = dict(values.get("metrics") or {})
    metrics[section] = {**(metrics.get(section) or {}), key: True}
    return {**values, "metrics": metrics}


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def monitor_targets(
    helm: Path,
    values: Mapping[str, Any],
    running: Mapping[str, ServiceProcess],
    *,
    prefix: str = "",
    namespace: str = NAMESPACE,
) -> tuple[list[Target], str]:
    """The scrape targets of ``running`` (processes named ``<prefix><component>...`` as
    ``chart_specs`` names them) that the chart's ServiceMonitor selects with ``values``, and the
    metrics path of its endpoint."""
    objects = _render(helm, _with(values, "serviceMonitor", "enabled"), namespace)
    [monitor] = [obj for obj in objects if obj["kind"] == "ServiceMonitor"]
    spec = monitor["spec"]
    [endpoint] = spec["endpoints"]
    namespaces = set(spec["namespaceSelector"]["matchNames"])
    selected = [
        obj
        for obj in objects
        if obj["kind"] == "Service"
        and obj["metadata"].get("namespace", namespace) in namespaces
        and _matches(obj["metadata"].get("labels") or {}, spec["selector"]["matchLabels"])
    ]
    deployments = [obj for obj in objects if obj["kind"] == "Deployment"]
    targets: list[Target] = []
    for service in selected:
        meta = service["metadata"]
        [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        job = (meta.get("labels") or {}).get(spec.get("jobLabel", ""), meta["name"])
        for deployment in deployments:
            template = deployment["spec"]["template"]
            if not _matches(template["metadata"]["labels"], service["spec"]["selector"]):
                continue
            component = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
            for container in template["spec"]["containers"]:
                # The Service's targetPort names a container port; that container is scraped.
                if port["targetPort"] not in {p["name"] for p in container.get("ports") or []}:
                    continue
                base = f"{prefix}{component}"
                for name, proc in running.items():
                    if name != base and not name.startswith((f"{base}#", f"{base}/")):
                        continue
                    labels = {
                        "job": job,
                        "namespace": meta.get("namespace", namespace),
                        "service": meta["name"],
                        "pod": pod_name(name),
                        "container": container["name"],
                        "endpoint": endpoint["port"],
                    }
                    targets.append(Target(f"127.0.0.1:{proc.port}", labels))
    return targets, str(endpoint.get("path", "/metrics"))


def alert_rule_groups(
    helm: Path, values: Mapping[str, Any], namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """The rule groups of the chart's PrometheusRule, rendered with ``values`` (turned on)."""
    objects = _render(helm, _with(values, "prometheusRule", "enabled"), namespace)
    [rule] = [obj for obj in objects if obj["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


@contextlib.contextmanager
def running_prometheus(
    run_dir: Path,
    targets: Sequence[Target],
    groups: Sequence[Mapping[str, Any]],
    *,
    metrics_path: str = "/metrics",
    interval: float = 1.0,
) -> Iterator[Prometheus]:
    """A real Prometheus scraping ``targets`` and evaluating ``groups`` every ``interval``
    seconds, stopped at the end; skipped (failed under ``CI=true``) if it cannot be built."""
    try:
        server = prometheus.start(
            run_dir, targets, groups, scrape_interval=interval,
            evaluation_interval=interval, metrics_path=metrics_path,
        )  # fmt: skip
    except (build.BuildError, process.StartError, OSError) as error:
        unavailable(f"prometheus is unavailable: {error}")
    try:
        yield server
    finally:
        server.stop()


def alert_states(server: Prometheus, name: str) -> list[dict[str, Any]]:
    """The pending and firing alerts called ``name``."""
    return [alert for alert in server.alerts() if alert["labels"].get("alertname") == name]


async def wait_for(
    check: Callable[[], bool], what: str, *, timeout: float, interval: float = 0.25
) -> float:
    """Wait until ``check()`` (run in a thread: it calls Prometheus' API) holds; the seconds it
    took. Fails naming ``what`` after ``timeout`` seconds."""
    started = time.monotonic()
    while not await asyncio.to_thread(check):
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not {what} after {timeout:.0f}s")
        await asyncio.sleep(interval)
    return time.monotonic() - started
