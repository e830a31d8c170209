"""The pure helpers of the scale benchmark (``tests/bench/bench_scale.py``): histogram
quantiles from bucket deltas, summing the samples of an embedded process's several registries,
CPU per 1,000 events/s, the cluster layout per size, and log timestamps."""

from __future__ import annotations

import math

import pytest
from tests.bench.bench_scale import (
    Step,
    bucket_deltas,
    deployment_body,
    histogram_quantile,
    layout,
    log_interval,
    namespaces,
    parse_summed,
    patches_by_result,
    per_thousand,
    summary,
)

INF = math.inf


def test_quantile_interpolates_inside_a_bucket_as_prometheus_does() -> None:
    buckets = [(0.1, 10.0), (0.5, 50.0), (1.0, 90.0), (INF, 100.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.5)
    assert histogram_quantile(buckets, 0.3) == pytest.approx(0.1 + 0.4 * 20 / 40)
    assert histogram_quantile(buckets, 0.05) == pytest.approx(0.05)


def test_quantile_in_the_inf_bucket_is_beyond_the_last_bound() -> None:
    assert histogram_quantile([(1.0, 1.0), (30.0, 1.0), (INF, 3.0)], 0.99) == INF
    assert histogram_quantile([(1.0, 1.0), (30.0, 1.0), (INF, 3.0)], 0.3) == pytest.approx(0.9)


def test_quantile_of_an_empty_histogram_is_none() -> None:
    assert histogram_quantile([(1.0, 0.0), (INF, 0.0)], 0.5) is None
    assert histogram_quantile([], 0.5) is None


def test_bucket_deltas_subtract_the_window_start() -> None:
    name = "podcost_event_to_annotation_seconds"
    before = {f'{name}_bucket{{le="0.5"}}': 2.0, f'{name}_bucket{{le="+Inf"}}': 3.0}
    after = {f'{name}_bucket{{le="0.5"}}': 5.0, f'{name}_bucket{{le="+Inf"}}': 9.0,
             f"{name}_count": 9.0}  # fmt: skip
    assert sorted(bucket_deltas(before, after, name)) == [(0.5, 3.0), (INF, 6.0)]


def test_parse_summed_adds_the_samples_of_each_registry_and_filters_names() -> None:
    text = (
        "# HELP podcost_queue_depth Pod writes queued.\n# TYPE podcost_queue_depth gauge\n"
        "podcost_queue_depth 0.0\n"
        "# HELP podcost_queue_depth Pod writes queued.\n# TYPE podcost_queue_depth gauge\n"
        "podcost_queue_depth 7.0\n"
        "# HELP other_total x\n# TYPE other_total counter\nother_total 1.0\n"
    )
    assert parse_summed(text)["podcost_queue_depth"] == 7.0
    assert parse_summed(text, ["podcost_queue"]) == {"podcost_queue_depth": 7.0}


def test_per_thousand_is_the_extra_cpu_over_the_extra_rate() -> None:
    assert per_thousand(0.5, 0.1, 410.0, 10.0) == pytest.approx(1.0)
    assert per_thousand(0.5, 0.1, 10.0, 10.0) is None


def test_layout_rounds_up_to_whole_deployments_and_nodes() -> None:
    got = layout(1000, 30, 30)
    assert (got.pods, got.deployments, got.nodes) == (1020, 34, 34)
    assert layout(150_000, 30, 30).nodes == 5000


def test_log_interval_reads_the_log_timestamps() -> None:
    text = (
        "2026-11-24T02:18:07.357Z INFO podcost.run podcost running 13 services\n"
        "2026-11-24T02:18:10.225Z INFO podcost.watcher watcher synced: 600 pods, 20 nodes\n"
    )
    assert log_interval(text, "podcost running", "watcher synced") == pytest.approx(2.868)
    assert log_interval(text, "podcost running", "absent") is None


def test_summary_names_the_largest_size_reached_and_what_stopped_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    small = Step(layout(300, 30, 30), {"podcost bytes/pod": 1200.0}, grown=True, converged=True)
    big = Step(layout(600, 30, 30), grown=True, failure="TimeoutError: x")
    summary([small, big], "measuring podcost at 600 pods: TimeoutError: x")
    out = capsys.readouterr().out
    assert "podcost converged up to 300 pods / 10 nodes" in out
    assert out.rstrip().endswith(
        "largest reached: 600 pods / 20 nodes; stopped by: measuring podcost at 600 pods: "
        "TimeoutError: x"
    )
    assert "1,200" in out
    assert "n/a" in out


def test_patches_by_result_are_the_moves_of_each_result() -> None:
    before = {'podcost_patches_total{result="ok"}': 5.0}
    after = {
        'podcost_patches_total{result="ok"}': 7.0,
        'podcost_patches_total{result="gone"}': 3.0,
        'podcost_patches_total{result="conflict"}': 0.0,
    }
    assert patches_by_result(before, after) == {"ok": 2.0, "gone": 3.0}


def test_namespaces_are_scale_alone_or_numbered() -> None:
    assert namespaces(1) == ["scale"]
    assert namespaces(3) == ["scale-0", "scale-1", "scale-2"]
    body = deployment_body(7, 30)
    assert body["metadata"]["labels"] == {"app": "d7", "podcost-bench": "scale"}
    # The bench's label is on the Deployment, not on its pods or in its selector.
    assert body["spec"]["selector"]["matchLabels"] == {"app": "d7"}
    assert body["spec"]["template"]["metadata"]["labels"] == {"app": "d7"}
