"""The command line as a kubectl user expects it: ``--version``; shell completion;
``--output table|json|yaml`` (``-o``) with one default wherever a command prints a result;
``--kubeconfig``, ``--context`` and ``-n/--namespace`` wherever a command reads a cluster; a
``kubectl-podcost`` entry point, so ``kubectl podcost ...`` runs it as a plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from podcost.cli import app, load_command, prog_name, run_cli
from podcost.commands.options import DEFAULT_OUTPUT, Output
from podcost.runtime.version import package_version

ROOT = Path(__file__).resolve().parents[2]
DUMP = str(Path(__file__).parent / "data" / "shop-dump.json")
runner = CliRunner()

PRINTS_A_RESULT = ["simulate", "explain", "cleanup"]
READS_A_CLUSTER = ["run", "watcher", "annotator", "explain", "cleanup"]


def options(command: str) -> dict[str, Any]:
    """The options of ``command`` by each of their names (typer's own click's objects)."""
    found: dict[str, Any] = {}
    for param in load_command(command).params:
        if param.param_type_name == "option":
            found.update(dict.fromkeys(param.opts, param))
    return found


def test_version_prints_the_package_version_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"podcost {package_version()} (revision ")


def test_the_help_header_and_every_commands_help_name_the_version() -> None:
    assert f"podcost {package_version()}" in runner.invoke(app, ["--help"]).stdout
    for command in READS_A_CLUSTER:
        epilog = load_command(command).epilog
        assert epilog is not None
        assert f"(podcost {package_version()})" in epilog


def test_shell_completion_is_offered() -> None:
    root = typer.main.get_command(app)
    opts = {opt for param in root.params for opt in param.opts}
    assert {"--install-completion", "--show-completion", "--version"} <= opts


@pytest.mark.parametrize("command", PRINTS_A_RESULT)
def test_every_result_prints_as_table_json_or_yaml_with_the_same_default(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    found = options(command)
    output = found["--output"]
    assert found["-o"] is output
    assert output.default == DEFAULT_OUTPUT == Output.TABLE
    # Anything but the three is a usage error naming them.
    assert run_cli([command, "-o", "wide"]) == 2
    err = capsys.readouterr().err
    assert all(choice in err for choice in ("table", "json", "yaml")), err


@pytest.mark.parametrize("command", READS_A_CLUSTER)
def test_every_command_that_reads_a_cluster_takes_kubeconfig_context_and_namespace(
    command: str,
) -> None:
    assert {"--kubeconfig", "--context", "--namespace", "-n"} <= set(options(command))


def test_json_and_yaml_carry_the_same_result() -> None:
    args = ["simulate", "--snapshot", DUMP, "--workload", "shop/web", "--replicas", "4"]
    as_json = runner.invoke(app, [*args, "-o", "json"])
    as_yaml = runner.invoke(app, [*args, "-o", "yaml"])
    assert as_json.exit_code == as_yaml.exit_code == 0
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)


def test_a_context_the_kubeconfig_lacks_fails_with_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))  # fmt: skip
    code = run_cli(["explain", "-n", "shop", "web", "--kubeconfig", str(kubeconfig),
                    "--context", "elsewhere"])  # fmt: skip
    assert code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("podcost explain: no cluster access")
    assert "elsewhere" in line


def test_kubectl_finds_podcost_as_its_plugin() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-podcost"] == scripts["podcost"] == "podcost.cli:main"
    assert prog_name("/usr/local/bin/kubectl-podcost") == "kubectl podcost"
    assert prog_name("/usr/local/bin/podcost") == "podcost"


@pytest.mark.parametrize(
    ("words", "expected"),
    [("podcost si", ["simulate"]), ("podcost simulate -o ", ["table", "json", "yaml"])],
)
def test_the_shell_completes_commands_and_output_formats(words: str, expected: list[str]) -> None:
    env = {**os.environ, "_PODCOST_COMPLETE": "complete_bash", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split(" ")) - 1)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "podcost"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == expected
