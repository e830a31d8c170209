"""The Grafana dashboard (deploy/helm/podcost/dashboards/podcost.json, shipped by the Helm
chart) shows every metric the services export and names no metric they do not.

The metric names come from a process's real registry (``podcost.runtime.metrics.Families``:
podcost's own and the client library's process collectors) at test time, as Prometheus scrapes
them (a counter ``x`` is ``x_total``, a histogram ``x_bucket``, ``x_count`` and ``x_sum``), so a
podcost metric added there fails this test until a panel shows it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.deploy_files import ROOT

from podcost.annotator.plan import Result, Retry
from podcost.runtime.metrics import Families

DASHBOARD_FILE = ROOT / "deploy" / "helm" / "podcost" / "dashboards" / "podcost.json"

# The sample names each metric type exposes (the text exposition format).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}
# Sample names that only ever grow: the ones rate() and increase() make sense on.
GROWING = ("_total", "_bucket", "_count", "_sum")

# PromQL words that are not metric names.
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan",
}  # fmt: skip


def declared() -> dict[str, set[str]]:
    """Each metric family of a process's registry (podcost's own, the process and platform
    collectors') → the sample names Prometheus scrapes for it."""
    families = Families().registry.collect()
    return {f.name: {f"{f.name}{suffix}" for suffix in SUFFIXES[f.type]} for f in families}


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana ``label_values`` query) reads."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expression)  # string literals
    found = set(re.findall(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,", text))
    text = re.sub(r"label_values\([^)]*\)", " ", text)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    for match in re.finditer(r"(?<![\w:$.])([A-Za-z_:][\w:]*)(?!\w)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if not call and name.lower() not in KEYWORDS:
            found.add(name)
    return found


def load() -> dict[str, Any]:
    document = json.loads(DASHBOARD_FILE.read_text())
    assert isinstance(document, dict)
    return document


def panels(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in document["panels"]:
        yield panel
        yield from panel.get("panels", [])  # the panels of a collapsed row


def expressions(document: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expression) for every panel target and every query variable."""
    for panel in panels(document):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target['refId']}", target["expr"]
    for variable in document["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            yield f"variable ${variable['name']}", text


DASHBOARD = load()


def test_the_dashboard_is_a_grafana_dashboard_with_a_stable_uid() -> None:
    assert DASHBOARD["uid"] == "podcost"
    assert DASHBOARD["title"]
    assert isinstance(DASHBOARD["schemaVersion"], int)
    assert "id" not in DASHBOARD or DASHBOARD["id"] is None  # Grafana assigns it on import


def test_the_data_source_is_a_template_variable_every_query_uses() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    users = [p for p in panels(DASHBOARD) if p["type"] != "row"]
    users += [v for v in variables.values() if v["type"] == "query"]
    for user in users:
        assert user["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, user
        for target in user.get("targets", []):
            assert target["datasource"] == user["datasource"]


def test_every_declared_podcost_metric_is_on_some_panel() -> None:
    shown = set().union(*(metric_names(e) for _, e in expressions(DASHBOARD)))
    own = {name: samples for name, samples in declared().items() if name.startswith("podcost_")}
    missing = [family for family, samples in own.items() if not samples & shown]
    assert not missing, f"metrics with no panel: {missing}"


@pytest.mark.parametrize(("where", "expression"), list(expressions(DASHBOARD)))
def test_every_expression_reads_only_declared_metrics(where: str, expression: str) -> None:
    samples = set().union(*declared().values())
    names = metric_names(expression)
    assert names, f"{where}: no metric in {expression!r}"
    unknown = names - samples
    assert not unknown, f"{where}: {sorted(unknown)} are not exported by podcost"


@pytest.mark.parametrize(("where", "expression"), list(expressions(DASHBOARD)))
def test_rates_are_taken_of_growing_series_and_quantiles_of_buckets(
    where: str, expression: str
) -> None:
    assert expression.count("(") == expression.count(")"), f"{where}: unbalanced parentheses"
    for name in re.findall(r"\b(?:rate|irate|increase)\(\s*([A-Za-z_:][\w:]*)", expression):
        assert name.endswith(GROWING), f"{where}: rate of {name}, which is not a counter"
    for quantile in re.finditer(r"histogram_quantile\(([^,]+),", expression):
        assert 0 <= float(quantile.group(1)) <= 1, where
        assert "_bucket" in expression, f"{where}: histogram_quantile of no buckets"
        assert re.search(r"by \(([^)]*\b)?le\b", expression), f"{where}: buckets not summed by le"


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    ids = [p["id"] for p in panels(DASHBOARD)]
    assert len(ids) == len(set(ids))
    taken: dict[tuple[int, int], str] = {}
    for panel in DASHBOARD["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, f"{panel['title']!r} is wider than the grid"
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                other = taken.setdefault((x, y), panel["title"])
                assert other == panel["title"], f"{panel['title']!r} overlaps {other!r}"


def test_every_panel_has_a_query_with_a_unique_ref_id() -> None:
    for panel in panels(DASHBOARD):
        if panel["type"] == "row":
            continue
        refs = [t["refId"] for t in panel["targets"]]
        assert refs, f"{panel['title']!r} has no query"
        assert len(refs) == len(set(refs)), f"{panel['title']!r} repeats a refId"


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ('sum by (le, strategy) (rate(a_bucket{x="b c",y=~"$v"}[$__rate_interval]))', {"a_bucket"}),
        ("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m])))", {"a_bucket"}),
        ("sum(rate(a_sum[1m])) / sum(rate(a_count[1m])) > bool 0", {"a_sum", "a_count"}),
        ("label_values(podcost_queue_depth, namespace)", {"podcost_queue_depth"}),
        ("max without (pod) (g) offset 5m", {"g"}),
    ],
)
def test_the_expression_reader_finds_the_metric_names(expression: str, names: set[str]) -> None:
    assert metric_names(expression) == names


def test_the_patches_help_names_every_result_the_annotator_counts() -> None:
    # The annotator's own enums, not a copy: a result added there must be documented here.
    described = Families().patches._documentation
    named = set(re.findall(r"[a-z_]+", described.split("by result", 1)[1]))
    assert {r.value for r in (*Result, *Retry)} <= named
