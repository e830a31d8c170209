"""``/metrics`` of every mode, scraped from real processes and read strictly: embedded
``podcost run`` against the real control plane, and each service of the chart's agent and core
modes as its own process over the real broker. Every scrape parses, declares each family once
with its HELP, names its units, and says which build runs (``podcost_build_info``) next to the
process collectors; ``/healthz`` names the same build.

The processes are the chart's containers (``chart_specs`` reads the rendered chart), so what a
ServiceMonitor scrapes in a cluster is what is read here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from tests.conftest import ControlPlane
from tests.support.exposition import families, problems
from tests.support.pipeline import fresh_kafka_settings
from tests.support.services import ServiceProcess, ServiceSpec, chart_specs, processes
from tests.support.tools import require_helm

from podcost.runtime.version import package_version

pytestmark = pytest.mark.integration

# What every scrape declares besides podcost's own families.
PROCESS_FAMILIES = {"podcost_build_info", "process_cpu_seconds_total",
                    "process_resident_memory_bytes", "python_info"}  # fmt: skip


async def _strict_scrape(proc: ServiceProcess) -> str:
    status, text = await proc.get_listening("/metrics")
    assert status == 200, f"{proc.spec.name}: GET /metrics answered {status}"
    assert problems(text) == [], f"{proc.spec.name}: {problems(text)}"
    declared = families(text)
    assert len(declared) == len(set(declared))
    assert set(declared) >= PROCESS_FAMILIES, f"{proc.spec.name}: {sorted(declared)}"
    assert f'version="{package_version()}"' in text
    status, health = await proc.get_listening("/healthz")
    assert status == 200
    assert json.loads(health)["version"] == package_version()
    return text


async def test_embedded_run_serves_one_declaration_of_each_family(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    env = {"PODCOST_CLUSTER": "scrape", "PODCOST_LOG_FORMAT": "text"}
    spec = ServiceSpec("run", ("run",), env)
    async with processes([spec], env={"KUBECONFIG": str(control_plane.kubeconfig)},
                         log_dir=tmp_path) as running:  # fmt: skip
        text = await _strict_scrape(running["run"])
    # Every service of the process records under its own component label of the one family.
    assert 'podcost_leading{component="watcher"} 1.0' in text
    assert len([f for f in families(text) if f == "podcost_messages_consumed_total"]) == 1


async def test_each_service_of_the_agent_and_core_modes_serves_a_strict_scrape(
    control_plane: ControlPlane, kafka_bootstrap: str, tmp_path: Path
) -> None:
    helm = require_helm()
    bus = fresh_kafka_settings(kafka_bootstrap, "scrape")
    kafka = {"bootstrapServers": kafka_bootstrap}
    one_ranker = {"strategies": [{"name": "age"}]}
    core = chart_specs(helm, {"mode": "core", "kafka": kafka, "policy": one_ranker}, prefix="core/")
    agent_values = {"mode": "agent", "clusterName": "scrape", "kafka": kafka}
    kubeconfig = {"KUBECONFIG": str(control_plane.kubeconfig)}
    agent = [
        dataclasses.replace(spec, env={**spec.env, **kubeconfig})
        for spec in chart_specs(helm, agent_values, prefix="agent/")
    ]
    env = {
        "PODCOST_TOPIC_WORKLOADS": bus.topic_workloads, "PODCOST_TOPIC_RANKS": bus.topic_ranks,
        "PODCOST_TOPIC_COSTS": bus.topic_costs, "PODCOST_TOPIC_DEADLETTER": bus.topic_deadletter,
        "PODCOST_AGGREGATOR_APP_ID": f"{bus.topic_workloads}-aggregator",
    }  # fmt: skip
    specs = [*core, *agent]
    assert sorted(s.name for s in specs) == [
        "agent/annotator", "agent/watcher", "core/aggregator", "core/ranker-age",
    ]  # fmt: skip
    async with processes(specs, env=env, log_dir=tmp_path, ready_timeout=180) as running:
        for name, proc in running.items():
            text = await _strict_scrape(proc)
            # A process alone serves its own component's samples only.
            assert set(re.findall(r'component="([^"]+)"', text)) <= {name.split("/", 1)[1]}
