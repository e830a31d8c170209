"""The topic contract as data: what each topic is created with, which existing settings count
as drift, how a topic's name finds its spec, and ``podcost topics plan``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from podcost.cli import app
from podcost_contracts.fleet import RegistryError, read_registry
from podcost_contracts.topic_contract import (
    CHANGELOG_SEGMENT_BYTES,
    CHANGELOG_SEGMENT_MS,
    DEADLETTER_RETENTION_MS,
    PIPELINE_RETENTION_MS,
    drift,
    min_insync_for,
    topic_plan,
)
from podcost_contracts.topics import DEFAULT_TOPICS

PLAN = topic_plan(DEFAULT_TOPICS, partitions=3)


@pytest.mark.parametrize(("replicas", "min_isr"), [(1, 1), (2, 1), (3, 2), (5, 2)])
def test_min_insync_replicas_is_one_less_than_the_replicas_between_one_and_two(
    replicas: int, min_isr: int
) -> None:
    assert min_insync_for(replicas) == min_isr


def test_every_topic_has_its_policy_and_the_changelogs_are_compacted_without_expiry() -> None:
    by_name = {spec.name: spec.configs() for spec in PLAN.specs}
    assert by_name["podcost.workloads"] == {
        "cleanup.policy": "delete",
        "min.insync.replicas": "2",
        "retention.ms": str(PIPELINE_RETENTION_MS),
    }
    assert by_name["podcost.deadletter"]["retention.ms"] == str(DEADLETTER_RETENTION_MS)
    for part in ("snapshot", "progress"):
        assert by_name[f"podcost-aggregator-{part}-changelog"] == {
            "cleanup.policy": "compact",
            "min.insync.replicas": "2",
            "segment.bytes": str(CHANGELOG_SEGMENT_BYTES),
            "segment.ms": str(CHANGELOG_SEGMENT_MS),
        }
    assert "podcost.costs.<cluster>" in by_name


def test_a_topic_name_finds_its_spec_by_pattern() -> None:
    costs = PLAN.spec_for("podcost.costs.prod-eu-1")
    assert costs is not None
    assert costs.role == "costs"
    assert costs.name == "podcost.costs.prod-eu-1"
    changelog = PLAN.spec_for("other-app-progress-changelog")
    assert changelog is not None
    assert changelog.cleanup_policy == "compact"
    assert PLAN.spec_for("someone-elses-topic") is None


def test_drift_names_each_setting_that_differs_and_only_those() -> None:
    spec = PLAN.spec_for("podcost-aggregator-snapshot-changelog")
    assert spec is not None
    same = {"cleanup.policy": "compact", "min.insync.replicas": "2", "retention.ms": "1"}
    assert drift(spec, partitions=3, replication_factor=3, configs=same) == []
    # More replicas than the contract is never less safe; policies compare as sets.
    assert drift(spec, partitions=3, replication_factor=5,
                 configs={**same, "cleanup.policy": "compact"}) == []  # fmt: skip
    found = drift(
        spec, partitions=1, replication_factor=1,
        configs={"cleanup.policy": "delete", "min.insync.replicas": "1"},
    )  # fmt: skip
    assert [(d.setting, d.expected, d.actual) for d in found] == [
        ("partitions", "3", "1"),
        ("replication.factor", "3", "1"),
        ("cleanup.policy", "compact", "delete"),
        ("min.insync.replicas", "2", "1"),
    ]


def test_the_registry_file_is_one_cluster_a_line_with_comments() -> None:
    text = "# the fleet\nprod-eu-1\n\n  prod-us-1  # added in May\nprod-eu-1\n"
    assert read_registry(text) == {"prod-eu-1", "prod-us-1"}
    with pytest.raises(RegistryError, match="line 2: 'Prod_EU' is not a valid cluster name"):
        read_registry("ok\nProd_EU\n")


def test_topics_plan_lists_each_registered_clusters_costs_topic(tmp_path: Path) -> None:
    registry = tmp_path / "clusters.txt"
    registry.write_text("prod-us-1\nprod-eu-1\n")
    result = CliRunner().invoke(
        app, ["topics", "plan", "-o", "json", "--clusters-file", str(registry),
              "--replication-factor", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    names = [topic["name"] for topic in plan]
    assert names[:5] == [
        "podcost.workloads", "podcost.ranks", "podcost.costs.prod-eu-1",
        "podcost.costs.prod-us-1", "podcost.deadletter",
    ]  # fmt: skip
    assert {topic["replication_factor"] for topic in plan} == {1}
    assert plan[0]["configs"]["min.insync.replicas"] == "1"


def test_topics_plan_refuses_a_registry_with_a_bad_name(tmp_path: Path) -> None:
    registry = tmp_path / "clusters.txt"
    registry.write_text("prod_eu\n")
    result = CliRunner().invoke(app, ["topics", "plan", "--clusters-file", str(registry)])
    assert result.exit_code == 2
    assert "line 1" in result.output
