"""The benchmark results table: rendered from its data file, and kept current with it.

``docs/benchmarks/results.md`` is what ``python -m tests.bench.record`` renders from
``docs/benchmarks/results.json``; a benchmark run under ``PODCOST_BENCH_RECORD=1`` replaces its own
row in the data file and re-renders the table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tests.bench import record

REGENERATE = "make bench-table (python -m tests.bench.record)"


def test_the_committed_table_is_rendered_from_the_committed_results() -> None:
    rows = record.load(record.RESULTS)
    expected = record.render(rows)
    actual = record.table_path(record.RESULTS).read_text()
    assert actual == expected, (
        "docs/benchmarks/results.md is not what docs/benchmarks/results.json renders to: "
        f"run `{REGENERATE}` and commit both"
    )


def test_the_committed_results_are_stored_in_canonical_order() -> None:
    text = record.RESULTS.read_text()
    assert text == record.dump(json.loads(text)["rows"]), f"rewrite it with `{REGENERATE}`"


def test_every_benchmark_of_make_bench_has_a_row_with_a_command_a_machine_and_a_date() -> None:
    rows = record.load(record.RESULTS)
    makefile = (record.ROOT / "Makefile").read_text()
    benched = re.findall(r"tests[./]bench[./](bench_\w+)", makefile)
    assert benched == list(record.ORDER)
    assert {row["benchmark"] for row in rows} >= set(record.ORDER)
    for row in rows:
        assert row["figures"], row["id"]
        assert row["command"].startswith("uv run python "), row["id"]
        assert row["benchmark"] in row["command"], row["id"]
        assert row["machine"]["cores"] >= 1, row["id"]
        assert re.fullmatch(r"3\.\d+\.\d+", row["machine"]["python"]), row["id"]
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row["id"]


def test_recording_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(record.RECORD_ENV, raising=False)
    monkeypatch.setenv(record.RESULTS_ENV, str(tmp_path / "results.json"))
    assert not record.record("bench_core", "a fleet", ["1 s"])
    assert not (tmp_path / "results.json").exists()


def test_a_recorded_run_replaces_its_own_row_and_re_renders_the_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    results = tmp_path / "results.json"
    monkeypatch.setenv(record.RECORD_ENV, "1")
    monkeypatch.setenv(record.RESULTS_ENV, str(results))
    argv = ["tests/bench/bench_labels.py", "--events", "10"]
    assert record.record("bench_labels", "churn", ["1.30 vs 43.49"], argv=argv)
    assert record.record("bench_core", "a fleet", ["0.68 s", "41 MiB"], argv=argv)
    assert record.record("bench_labels", "churn", ["1.31 vs 43.50"], argv=argv)
    assert record.record("bench_labels", "churn, 500 pods", ["1.84"], variant="big", argv=argv)

    rows = record.load(results)
    assert [(row["id"], row["figures"]) for row in rows] == [
        ("bench_core", ["0.68 s", "41 MiB"]),
        ("bench_labels", ["1.31 vs 43.50"]),
        ("bench_labels:big", ["1.84"]),
    ]
    assert rows[1]["command"] == "uv run python tests/bench/bench_labels.py --events 10"
    assert rows[1]["machine"] == record.machine()
    table = (tmp_path / "results.md").read_text()
    assert table == record.render(rows)
    assert "| `bench_core`: a fleet | 0.68 s<br>41 MiB | `uv run python " in table
    assert record.main(["--check"]) == 0
    (tmp_path / "results.md").write_text(table.replace("0.68 s", "0.50 s"))
    assert record.main(["--check"]) == 1
    assert record.main([]) == 0
    assert record.main(["--check"]) == 0


def test_a_pipe_in_a_figure_does_not_split_the_table_cell() -> None:
    row = {
        "id": "bench_x",
        "benchmark": "bench_x",
        "title": "a | b",
        "figures": ["p50 | p99"],
        "command": "uv run python -m tests.bench.bench_x",
        "machine": {"cores": 2, "cpu": None, "python": "3.11.7"},
        "date": "2026-11-28",
    }
    [line] = record.render([row]).splitlines()[-1:]
    assert line.count(" | ") == 4
    assert "2 cores, CPU model not recorded, Python 3.11.7" in line
