"""The metrics a process exports: one registry in which each family is declared once, whatever
the number of services the process runs, with the build it runs and the process collectors;
names by Prometheus' conventions and labels from bounded sets. Each checked on the text a scrape
reads, with the strict reader ``tests/support/exposition.py`` (itself checked here on broken
scrapes)."""

from __future__ import annotations

import platform
import re

import pytest
from tests.support.exposition import families, problems

from podcost.runtime.metrics import COMPONENT, Families, Metrics, render
from podcost.runtime.version import build, package_version

# Every label a podcost family may carry, and why each is bounded: a pod, workload or node
# name would make a series per object of the cluster.
BOUNDED_LABELS = {
    COMPONENT: "one per service, rankers one per strategy",
    "topic": "the bus's topics, one costs topic per cluster of the fleet",
    "outcome": "a fixed set of outcomes",
    "strategy": "the strategies installed",
    "source": "the annotations podcost reads",
    "completeness": "complete, deadline",
    "result": "the annotator's Result and Retry values",
    "reason": "the refusal reasons",
    "version": "build_info: one value per process",
    "revision": "build_info: one value per process",
    "python": "build_info: one value per process",
    "setting": "the settings of the topic contract",
    "role": "a changelog partition's role in a recovery: active, standby",
    "le": "histogram buckets",
}

COMPONENTS = ["watcher", "ranker-age", "ranker-capacity-type", "aggregator", "annotator"]


def scrape_of_a_busy_embedded_process() -> str:
    """What ``podcost run`` serves once every service recorded something."""
    shared = Families()
    for component in COMPONENTS:
        metrics = Metrics(component, shared)
        metrics.consumed.labels("podcost.workloads", "ok").inc()
        metrics.produced.labels("podcost.ranks").inc()
        metrics.consumer_lag.labels("podcost.workloads").set(3)
        metrics.snapshots_published.inc()
        metrics.leading.set(1)
        metrics.invalid_annotations.labels("controller.kubernetes.io/pod-deletion-cost").inc()
        metrics.snapshots_ranked.labels("age").inc()
        metrics.strategy_duration.labels("age").observe(0.01)
        metrics.combined.labels("complete").inc()
        metrics.patches.labels("ok").inc()
        metrics.refusals.labels("uid_mismatch").inc()
        metrics.rate_limit_waits.inc(0.5)
        metrics.queue_depth.set(2)
        metrics.event_to_annotation.observe(0.2)
    return render(shared.registry).decode()


def test_the_services_of_one_process_declare_each_family_once() -> None:
    text = scrape_of_a_busy_embedded_process()
    declared = families(text)
    assert len(declared) == len(set(declared))
    assert problems(text) == []
    # Each service's series apart, by its component label.
    lines = [line for line in text.splitlines() if line.startswith("podcost_patches_total{")]
    assert sorted(re.findall(r'component="([^"]+)"', "\n".join(lines))) == sorted(COMPONENTS)


def test_a_service_exports_only_the_families_it_records() -> None:
    shared = Families()
    Metrics("watcher", shared).leading.set(1)
    Metrics("annotator", shared).queue_depth.set(0)
    text = render(shared.registry).decode()
    assert 'podcost_leading{component="watcher"} 1.0' in text
    assert 'podcost_queue_depth{component="annotator"} 0.0' in text
    assert 'podcost_queue_depth{component="watcher"}' not in text
    assert 'podcost_leading{component="annotator"}' not in text


def test_build_info_names_the_package_version_the_revision_and_python() -> None:
    text = render(Families().registry).decode()
    identity = build()
    line = next(x for x in text.splitlines() if x.startswith("podcost_build_info{"))
    assert f'version="{package_version()}"' in line
    assert f'revision="{identity.revision}"' in line
    assert f'python="{platform.python_version()}"' in line
    assert line.endswith(" 1.0")


def test_the_process_and_platform_collectors_are_exported() -> None:
    declared = set(families(render(Families().registry).decode()))
    expected = {"process_cpu_seconds_total", "process_resident_memory_bytes",
                "process_start_time_seconds", "python_info",
                "python_gc_collections_total"}  # fmt: skip
    assert expected <= declared


def test_no_created_series_are_exported() -> None:
    text = scrape_of_a_busy_embedded_process()
    assert "_created" not in text


def test_every_podcost_label_is_from_a_bounded_set() -> None:
    shared = Families()
    for name, value in vars(shared).items():
        labels = getattr(value, "_labelnames", None)
        if labels is None:
            continue
        unbounded = set(labels) - set(BOUNDED_LABELS)
        assert not unbounded, f"{name}: labels {sorted(unbounded)} are not known to be bounded"


def test_several_registries_render_as_one_declaration_per_family() -> None:
    # A benchmark serves its own registry next to its services'.
    first, second = Metrics("annotator"), Metrics("annotator-2")
    first.patches.labels("ok").inc()
    second.patches.labels("ok").inc(2)
    text = render([first.registry, second.registry]).decode()
    assert problems(text) == []
    assert 'podcost_patches_total{component="annotator",result="ok"} 1.0' in text
    assert 'podcost_patches_total{component="annotator-2",result="ok"} 2.0' in text


def test_a_component_reads_its_own_samples_only() -> None:
    shared = Families()
    one, other = Metrics("ranker-age", shared), Metrics("aggregator", shared)
    one.consumed.labels("t", "ok").inc(2)
    other.consumed.labels("t", "ok").inc(5)
    labels = {"topic": "t", "outcome": "ok"}
    assert one.get_sample_value("podcost_messages_consumed_total", labels) == 2
    assert other.get_sample_value("podcost_messages_consumed_total", labels) == 5
    assert one.get_sample_value("podcost_queue_depth") is None


GOOD = "# HELP a_total A count.\n# TYPE a_total counter\na_total 1.0\n"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (GOOD + GOOD, "a_total: # TYPE declared 2 times"),
        ("# TYPE a_total counter\na_total 1.0\n", "a_total: no # HELP"),
        ("# HELP w Time writes waited.\n# TYPE w counter\nw_total 1.0\n", "lacks _seconds"),
        ("# HELP d_ms Duration.\n# TYPE d_ms gauge\nd_ms 1.0\n", "other than the base unit"),
        ("# HELP m Memory in use.\n# TYPE m gauge\nm 1.0\n", "lacks _bytes"),
        ("# HELP g A gauge.\n# TYPE g gauge\ng 1.0\nstray 2.0\n", "stray: a sample of no"),
    ],
)
def test_the_strict_reader_rejects_what_prometheus_conventions_forbid(
    text: str, complaint: str
) -> None:
    assert any(complaint in problem for problem in problems(text)), problems(text)


def test_the_strict_reader_accepts_a_clean_scrape() -> None:
    assert problems(GOOD) == []
