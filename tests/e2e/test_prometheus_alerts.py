"""The chart's alerts fire on real faults and resolve after recovery, as a real Prometheus
evaluates them over real podcost processes.

The chart's agent mode (watcher and annotator of one cluster) runs as processes
(``chart_specs``) over the real broker and the real control plane; a real Prometheus
(``podcost_localinfra.prometheus``) scrapes them every second with the targets and labels of the
rendered ServiceMonitor (``tests/support/scrape.py``) and evaluates the rendered PrometheusRule,
unchanged (its ``for:`` durations included), every second.

The fault: the control plane's kube-apiserver stopped by its pid. ``PodcostApiServerUnreachable``
(the watcher's requests failing for more than 30 s, for 2 minutes) goes pending, then firing, for
the watcher's target; the API server is started again and the alert resolves. The times are
printed (the alert matrix of the runbooks). Minutes long by the rule's own ``for:``: ``-m long``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import ControlPlane, unavailable
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import fresh_kafka_settings
from tests.support.scrape import (
    alert_rule_groups,
    alert_states,
    monitor_targets,
    running_prometheus,
    wait_for,
)
from tests.support.services import assert_alive, chart_specs, processes
from tests.support.tools import require_helm

from podcost_localinfra import cluster

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(900)]

CLUSTER = "paged"
ALERT = "PodcostApiServerUnreachable"


@dataclasses.dataclass
class Seen:
    """When (seconds after the fault) each alert was first seen in each state."""

    at: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)

    def record(self, alerts: list[dict[str, Any]], since: float) -> None:
        for alert in alerts:
            key = (alert["labels"]["alertname"], alert["state"])
            self.at.setdefault(key, time.monotonic() - since)


async def test_the_api_server_stopped_pages_and_its_return_resolves_the_alert(
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    run_dir = control_plane.run_dir
    if run_dir is None:
        unavailable(
            "the control plane is not podcost_localinfra's: its API server cannot be stopped"
        )
    helm = require_helm()
    namespace = await kube.create_namespace(f"paged-{uuid.uuid4().hex[:6]}")
    bus = fresh_kafka_settings(kafka_bootstrap, "paged")
    values = {"mode": "agent", "clusterName": CLUSTER,
              "kafka": {"bootstrapServers": kafka_bootstrap},
              "watch": {"namespace": namespace}}  # fmt: skip
    kubeconfig = {"KUBECONFIG": str(control_plane.kubeconfig)}
    specs = [dataclasses.replace(spec, env={**spec.env, **kubeconfig})
             for spec in chart_specs(helm, values)]  # fmt: skip
    env = {
        "PODCOST_TOPIC_WORKLOADS": bus.topic_workloads, "PODCOST_TOPIC_RANKS": bus.topic_ranks,
        "PODCOST_TOPIC_COSTS": bus.topic_costs, "PODCOST_TOPIC_DEADLETTER": bus.topic_deadletter,
    }  # fmt: skip
    groups = alert_rule_groups(helm, values)
    seen = Seen()
    try:
        async with processes(specs, env=env, log_dir=tmp_path / "logs") as running:
            targets, path = monitor_targets(helm, values, running)
            assert {t.labels["job"] for t in targets} == {"watcher", "annotator"}, targets
            with running_prometheus(tmp_path / "prometheus", targets, groups,
                                    metrics_path=path) as server:  # fmt: skip

                def all_up_and_quiet() -> bool:
                    up = {s["metric"]["job"] for s in server.query("up == 1")}
                    rules = server.rules()
                    evaluated = all(r.get("lastEvaluation", "").startswith("2") for r in rules)
                    return up == {"watcher", "annotator"} and evaluated

                await wait_for(all_up_and_quiet, "every target up, every rule evaluated",
                               timeout=60)  # fmt: skip
                assert server.alerts() == []

                stopped_at = time.monotonic()
                await asyncio.to_thread(cluster.stop_apiserver, run_dir)
                try:

                    def firing() -> bool:
                        assert_alive(running)
                        alerts = server.alerts()
                        seen.record(alerts, stopped_at)
                        return any(a["state"] == "firing" for a in alert_states(server, ALERT))

                    try:
                        await wait_for(firing, f"{ALERT} firing", timeout=300, interval=1.0)
                    except AssertionError as error:
                        failing = server.query("podcost_api_server_failing_seconds or up == 0")
                        error.add_note(f"seen: {seen.at}; now: {failing}")
                        raise
                    [alert] = alert_states(server, ALERT)
                    assert alert["labels"]["job"] == "watcher", alert
                    assert alert["labels"]["severity"] == "critical"
                    watchers = {t.labels["pod"] for t in targets if t.labels["job"] == "watcher"}
                    assert alert["labels"]["pod"] in watchers, alert
                    assert float(alert["value"]) > 30
                finally:
                    restarted_at = time.monotonic()
                    back_in = await asyncio.to_thread(cluster.start_apiserver, run_dir)

                def resolved() -> bool:
                    assert_alive(running)
                    return alert_states(server, ALERT) == []

                await wait_for(resolved, f"{ALERT} resolved", timeout=120)
                resolved_in = time.monotonic() - restarted_at
                outage = restarted_at - stopped_at
    finally:
        await kube.delete_namespace(namespace)

    pending, fired = seen.at[(ALERT, "pending")], seen.at[(ALERT, "firing")]
    print(
        f"\n{ALERT}: pending {pending:.0f}s and firing {fired:.0f}s after the API server "
        f"stopped; resolved {resolved_in:.1f}s after it was started again ({back_in:.1f}s of "
        f"them until it was ready; {outage:.0f}s outage)"
    )
    print(f"every alert state seen during the outage: {sorted(seen.at.items())}")
    assert 25 <= pending < fired
    assert fired >= pending + 120 - 5  # the rule's for: 2m, evaluated every second
