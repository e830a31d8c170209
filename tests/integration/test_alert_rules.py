"""The chart's alert rules (``templates/prometheusrule.yaml``) as the real helm renders them,
checked by the real promtool and against the metrics registry.

- ``promtool check rules`` accepts the rendered rule groups (PromQL, durations, the annotation
  templates).
- ``promtool test rules`` runs ``alert_rules_test.yaml``: input series for every alert, each
  expected to fire where and when it must and nowhere else. The annotations are left out of
  that run (promtool compares them verbatim; their templates are checked above).
- Every alert expression reads only metrics the services export (the registry of
  ``podcost.runtime.metrics``, as the dashboard's test reads it), every alert has a runbook
  whose anchor is a section of ``docs/runbooks.md``, and the rule is off by default.

helm and promtool are built into the cache if missing (``make tools``,
``make observability-tools``); under ``CI=true`` a missing tool fails.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.test_helm_chart import CHART, KUBE_VERSION, NAMESPACE, RELEASE
from tests.support.deploy_files import ROOT
from tests.support.tools import require_helm, require_promtool
from tests.unit.test_dashboard import declared, metric_names

UNIT_TESTS = Path(__file__).with_name("alert_rules_test.yaml")
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def render(helm: Path, *values: str) -> list[dict[str, Any]]:
    argv = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--kube-version", KUBE_VERSION, "--show-only", "templates/prometheusrule.yaml",
            *(arg for value in values for arg in ("--set", value))]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        # helm fails --show-only of a template that renders nothing.
        assert "could not find template" in result.stderr, result.stderr
        return []
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def helm() -> Path:
    return require_helm()


@pytest.fixture(scope="module")
def groups(helm: Path) -> list[dict[str, Any]]:
    """The rule groups of the PrometheusRule the chart renders when turned on."""
    [rule] = render(helm, "metrics.prometheusRule.enabled=true")
    assert rule["kind"] == "PrometheusRule"
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def alerts(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def promtool(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = require_promtool()
    return subprocess.run([str(tool), *argv], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_the_alert_rules_are_off_by_default(helm: Path) -> None:
    assert render(helm) == []


def test_promtool_accepts_the_rendered_rules(groups: list[dict[str, Any]], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    result = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts(groups))} rules found" in result.stdout + result.stderr


def test_every_alert_fires_when_it_must_and_not_otherwise(
    groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    def without_annotations(rule: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in rule.items() if key != "annotations"}

    bare = [{**g, "rules": [without_annotations(r) for r in g["rules"]]} for g in groups]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": bare}))
    (tmp_path / "tests.yaml").write_text(UNIT_TESTS.read_text())
    result = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # Every alert is exercised, each at a time it fires and at a time it does not.
    cases = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alerts(groups)}
    assert firing == names, f"never seen firing: {sorted(names - firing)}"
    assert quiet == names, f"never seen quiet: {sorted(names - quiet)}"


def test_every_alert_expression_reads_only_exported_metrics(
    groups: list[dict[str, Any]],
) -> None:
    samples = set().union(*declared().values())
    for rule in alerts(groups):
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']}: no metric in {rule['expr']!r}"
        unknown = names - samples
        assert not unknown, f"{rule['alert']}: {sorted(unknown)} are not exported by podcost"


def test_every_alert_has_a_severity_and_a_runbook_section(
    groups: list[dict[str, Any]],
) -> None:
    sections = {
        re.sub(r"[^a-z0-9_-]", "", line.removeprefix("## ").strip().lower().replace(" ", "-"))
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in alerts(groups):
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"], rule["alert"]
        assert annotations["description"], rule["alert"]
        url = annotations["runbook_url"]
        assert url == f"https://podcost.dev/runbooks/#{rule['alert'].lower()}", url
        assert url.rsplit("#", 1)[1] in sections, f"docs/runbooks.md has no section for {url}"
    assert len(sections) == len(alerts(groups)), "a runbook section for no alert"
