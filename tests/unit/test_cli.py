"""``podcost simulate`` end to end through typer: JSON and table output, and exit 2 with one
line for every bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from podcost.cli import app

DATA = Path(__file__).parent / "data"
DUMP = str(DATA / "shop-dump.json")
runner = CliRunner()


def run(*args: str, output: str = "json") -> tuple[int, str, str]:
    result = runner.invoke(app, ["simulate", "--snapshot", DUMP, "--output", output, *args])
    return result.exit_code, result.stdout, result.stderr


def test_simulate_prints_the_json_contract() -> None:
    code, out, _ = run("--workload", "shop/web", "--replicas", "4", "--baseline")
    assert code == 0
    document = json.loads(out)
    assert document["victims"] == ["web-5d8f7-fffff", "web-5d8f7-ddddd"]
    assert document["replicas_before"] == 6
    assert document["replicas_after"] == 4
    assert document["costs"]["web-5d8f7-ccccc"] == 100
    assert document["skew_after"] == 3


def test_simulate_with_a_policy_file_keeps_the_zones_balanced() -> None:
    policy = str(DATA / "spread-policy.json")
    code, out, _ = run("--workload", "shop/web", "--replicas", "3", "--policy", policy)
    assert code == 0
    assert json.loads(out)["skew_after"] == 0


def test_simulate_takes_now_and_the_topology_key_from_the_command_line() -> None:
    code, out, _ = run(
        "--workload", "shop/web", "--replicas", "5", "--now", "2024-05-02T00:00:00Z",
        "--topology-key", "karpenter.sh/capacity-type",
    )  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert document["topology_key"] == "karpenter.sh/capacity-type"
    assert document["domains_before"] == {"on-demand": 5, "spot": 1}


def test_several_dump_files_are_read_together(tmp_path: Path) -> None:
    items = json.loads(Path(DUMP).read_text())["items"]
    pods = tmp_path / "pods.json"
    rest = tmp_path / "rest.json"
    pods.write_text(json.dumps({"kind": "List", "items": [i for i in items if i["kind"] == "Pod"]}))
    rest.write_text(json.dumps({"kind": "List", "items": [i for i in items if i["kind"] != "Pod"]}))
    args = ["simulate", "--snapshot", str(pods), "--snapshot", str(rest)]
    result = runner.invoke(app, [*args, "--workload", "shop/web", "--replicas", "4", "--baseline",
                                 "-o", "json"])  # fmt: skip
    assert result.exit_code == 0
    assert json.loads(result.stdout)["victims"] == ["web-5d8f7-fffff", "web-5d8f7-ddddd"]


def test_simulate_draws_a_table_by_default() -> None:
    result = runner.invoke(app, ["simulate", "--snapshot", DUMP, "--workload", "shop/web",
                                 "--replicas", "4"])  # fmt: skip
    code, out = result.exit_code, result.stdout
    assert code == 0
    assert "web-5d8f7-ccccc" in out
    assert "skew 2 → 1" in out or "skew 2 → 0" in out


def test_simulate_splits_a_deployment_mid_rollout_and_says_the_rollout_goes_on() -> None:
    code, out, _ = run("--workload", "shop/api", "--replicas", "1", "--baseline")
    assert code == 0
    document = json.loads(out)
    assert document["replicasets"] == {"api-new": {"before": 2, "after": 1}}
    assert document["rollout_goes_on"] is True
    assert len(document["victims"]) == 1
    code, out, _ = run("--workload", "shop/api", "--replicas", "1", "--output", "table")
    assert code == 0
    assert "mid-rollout: the deployment controller scales api-new 2 → 1" in out
    assert "the rollout is not paused" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "shop/nope", "--replicas", "1"], "no Deployment or ReplicaSet shop/nope"),
        (["--workload", "shop/web", "--replicas", "7"], "--replicas 7 is outside 0..6"),
        (["--workload", "shop/web", "--replicas", "-1"], "--replicas -1 is outside 0..6"),
        (["--workload", "shop/api", "--replicas", "5"], "hold 3 replicas mid-rollout"),
        (["--workload", "web", "--replicas", "1"], "is not NAMESPACE/NAME"),
        (["--workload", "shop/web", "--replicas", "1", "--now", "soon"], "not an RFC 3339"),
        (
            [
                "--workload",
                "shop/web",
                "--replicas",
                "1",
                "--policy",
                str(DATA / "bad-policy.json"),
            ],
            "unknown strategy 'no-such-strategy'",
        ),
        (
            ["--workload", "shop/web", "--replicas", "1", "--policy", str(DATA / "missing.json")],
            "cannot be read",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    code, out, err = run(*args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "is not JSON"),
        ("[1, 2]", "is not a Kubernetes object or List"),
        (
            '{"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "x"}, "spec": 3}]}',
            "pod x",
        ),
    ],
)
def test_a_malformed_dump_exits_2_with_one_line(tmp_path: Path, content: str, message: str) -> None:
    dump = tmp_path / "dump.json"
    dump.write_text(content)
    result = runner.invoke(
        app, ["simulate", "--snapshot", str(dump), "--workload", "a/b", "--replicas", "0"]
    )
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert message in result.stderr


def test_a_missing_dump_file_exits_2() -> None:
    result = runner.invoke(
        app,
        ["simulate", "--snapshot", "/no/such/file.json", "--workload", "a/b", "--replicas", "0"],
    )
    assert result.exit_code == 2
    assert "cannot read /no/such/file.json" in result.stderr


@pytest.fixture
def quiet_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command sets up logging on the runner's stderr; put the root logger back after."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)


def test_cleanup_is_a_command_that_removes_only_podcosts_own_costs() -> None:
    result = runner.invoke(app, ["cleanup", "--help"])
    assert result.exit_code == 0
    assert "only its own" in result.stdout
    assert "--namespace" in result.stdout
    assert "--dry-run" in result.stdout


def test_cleanup_with_a_bad_budget_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, quiet_logging: None
) -> None:
    monkeypatch.setenv("PODCOST_ANNOTATOR_QPS", "0")
    result = runner.invoke(app, ["cleanup"])
    assert result.exit_code == 2
    assert result.stderr.startswith("podcost cleanup: invalid setting: PODCOST_ANNOTATOR_QPS")
    assert len(result.stderr.strip().splitlines()) == 1


def test_cleanup_without_cluster_access_exits_1_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, quiet_logging: None
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    result = runner.invoke(app, ["cleanup", "--namespace", "shop"])
    assert result.exit_code == 1
    # The client library logs its own warning first; podcost's error is one line, the last.
    assert result.stderr.strip().splitlines()[-1].startswith("podcost cleanup: no cluster access")
