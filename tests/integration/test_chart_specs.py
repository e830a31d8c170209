"""The process harness (``tests/support/services.py``): what ``chart_specs`` reads out of the real
``helm template`` for the fleet's two modes, and one of those specs run as a real process
against the real broker (ready, metrics, a clean stop on SIGTERM, a crash on SIGKILL).

helm comes from ``make tools`` (``tests.support.tools.require_helm``: built if missing, a
failure under ``CI=true``); the broker from the session's ``kafka_bootstrap`` fixture.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from tests.support.pipeline import fresh_kafka_settings
from tests.support.services import (
    ServiceProcess,
    chart_specs,
    metric_key,
    parse_metrics,
    processes,
    sample,
)
from tests.support.tools import require_helm

from podcost_core.policy import DEFAULT_POLICY

pytestmark = pytest.mark.integration

KAFKA = {"bootstrapServers": "kafka.example:9092"}


@pytest.fixture(scope="module")
def helm() -> Path:
    return require_helm()


def test_agent_mode_runs_exactly_a_watcher_and_an_annotator_of_the_named_cluster(
    helm: Path,
) -> None:
    specs = chart_specs(helm, {"mode": "agent", "clusterName": "eu-1", "kafka": KAFKA},
                        prefix="eu-1/")  # fmt: skip
    assert [(s.name, s.args) for s in specs] == [
        ("eu-1/watcher", ("watcher",)),
        ("eu-1/annotator", ("annotator",)),
    ]
    for spec in specs:
        assert spec.env["PODCOST_CLUSTER"] == "eu-1"
        assert spec.env["PODCOST_KAFKA"] == KAFKA["bootstrapServers"]
        assert "/tmp" in spec.scratch
    watcher = specs[0]
    # The downward API's values, given locally: the Lease identity and namespace.
    assert watcher.env["POD_NAME"] == "eu-1-watcher"
    assert watcher.env["POD_NAMESPACE"] == "default"
    assert watcher.env["PODCOST_POLICY_FILE"] in watcher.files


def test_core_mode_runs_one_ranker_per_default_strategy_and_the_aggregator(helm: Path) -> None:
    specs = chart_specs(helm, {"mode": "core", "kafka": KAFKA})
    rankers = {s.name: s.args for s in specs if s.args[0] == "ranker"}
    assert rankers == {
        f"ranker-{name}": ("ranker", "--strategy", name) for name in DEFAULT_POLICY.names
    }
    assert [s.name for s in specs if s.args[0] != "ranker"] == ["aggregator"]
    for spec in specs:
        assert spec.env["PODCOST_KAFKA"] == KAFKA["bootstrapServers"]
        assert spec.files, f"{spec.name} has no policy file"
        # The core serves every cluster of the fleet: it has no cluster name of its own.
        assert "PODCOST_CLUSTER" not in spec.env


def test_replicas_become_one_numbered_process_each(helm: Path) -> None:
    values = {"mode": "core", "kafka": KAFKA, "aggregator": {"replicaCount": 2},
              "policy": {"strategies": [{"name": "age"}]}}  # fmt: skip
    specs = chart_specs(helm, values)
    assert sorted(s.name for s in specs) == ["aggregator#1", "aggregator#2", "ranker-age"]


def test_metrics_are_keyed_by_name_and_sorted_labels_and_summed_by_label_subset() -> None:
    text = (
        "# TYPE podcost_patches counter\n"
        'podcost_patches_total{result="ok"} 3.0\n'
        'podcost_patches_total{result="gone"} 1.0\n'
        "# TYPE podcost_queue_depth gauge\n"
        "podcost_queue_depth 0.0\n"
    )
    parsed = parse_metrics(text)
    assert parsed[metric_key("podcost_patches_total", result="ok")] == 3.0
    assert parsed["podcost_queue_depth"] == 0.0
    assert metric_key("m", b="2", a="1") == 'm{a="1",b="2"}'
    assert sample(parsed, "podcost_patches_total") == 4.0
    assert sample(parsed, "podcost_patches_total", result="gone") == 1.0
    assert sample(parsed, "podcost_patches_total", result="error") == 0.0


async def test_a_chart_spec_runs_as_a_real_process_that_stops_cleanly_or_crashes(
    helm: Path, kafka_bootstrap: str, tmp_path: Path
) -> None:
    bus = fresh_kafka_settings(kafka_bootstrap, "specs")
    values = {"mode": "core", "kafka": {"bootstrapServers": kafka_bootstrap},
              "policy": {"strategies": [{"name": "age"}, {"name": "capacity-type"}]}}  # fmt: skip
    specs = [s for s in chart_specs(helm, values) if s.args[0] == "ranker"]
    env = {"PODCOST_TOPIC_WORKLOADS": bus.topic_workloads, "PODCOST_TOPIC_RANKS": bus.topic_ranks,
           "PODCOST_TOPIC_COSTS": bus.topic_costs,
           "PODCOST_TOPIC_DEADLETTER": bus.topic_deadletter}  # fmt: skip
    async with processes(specs, env=env, log_dir=tmp_path) as running:
        age, capacity = running["ranker-age"], running["ranker-capacity-type"]
        assert age.alive
        assert age.port != capacity.port
        assert await age.sample("podcost_snapshots_ranked_total") == 0.0
        capacity.kill()
        assert await capacity.stop() == -signal.SIGKILL
        assert not capacity.alive
        assert await age.stop() == 0
        assert age.log_path.exists()
    # The policy ConfigMap was given as a file the process could read.
    assert (age.root / "etc/podcost/policy/policy.json").exists()


async def test_a_process_that_exits_before_it_is_ready_fails_with_its_log(tmp_path: Path) -> None:
    spec = chart_specs(require_helm(), {"mode": "agent", "clusterName": "x", "kafka": KAFKA})[0]
    # Over Kafka without PODCOST_CLUSTER the agent refuses to start (exit 2, one line).
    proc = ServiceProcess(spec, env={"PODCOST_CLUSTER": ""}, log_dir=tmp_path)
    await proc.start()
    with pytest.raises(AssertionError, match="exited with 2 before it was ready"):
        await proc.wait_ready(timeout=60)
    assert await proc.stop() == 2
