"""The ``podcost`` command line as a user meets it: every command's ``--help`` reads like
documentation (a description, help for every option, examples), and a failing invocation — bad
arguments, a bad setting, a missing file, an API server or a broker that cannot be reached — is
one line on stderr and exit 2 (bad input) or 1 (something failed), never a traceback. The
failures run ``python -m podcost`` in a subprocess, as a shell would."""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from podcost import cli as podcost_cli
from podcost.cli import EPILOGS, EXIT_CODES, app, load_command, run_cli

runner = CliRunner()
COMMANDS = [
    "run", "watcher", "ranker", "aggregator", "annotator", "simulate", "explain", "demo", "cleanup",
    "topics",
    "remove-cluster",
]  # fmt: skip


def _group() -> TyperGroup:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    return group


def test_one_entry_point_offers_every_command() -> None:
    group = _group()
    assert sorted(group.list_commands(typer.Context(group))) == sorted(COMMANDS)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_help_has_a_description_option_help_and_examples(command: str) -> None:
    result = runner.invoke(app, [*command.split(), "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    assert "Example" in result.stdout
    group = _group()
    cli = load_command(command) if command else group
    assert cli.help is not None
    assert len(cli.help.split()) >= 8, cli.help
    assert cli.epilog is not None
    assert cli.epilog.startswith(EPILOGS.get(command, cli.epilog).rstrip())
    assert cli.epilog.rstrip().endswith(EXIT_CODES), "every help documents the exit codes"
    for param in cli.params:
        if param.param_type_name == "option" and param.name != "help":
            assert getattr(param, "help", None), f"{command} {param.name} has no help"


def test_no_arguments_show_the_help() -> None:
    assert run_cli([]) == 0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: nothing listens there


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def _podcost(args: list[str], env: dict[str, str], home: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PODCOST_", "KUBECONFIG"))}
    base.update({"HOME": str(home), "PODCOST_HTTP_PORT": "0", "COLUMNS": "200", **env})
    return subprocess.run(
        [sys.executable, "-m", "podcost", *args],
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _error_lines(stderr: str) -> list[str]:
    """stderr without the services' JSON log lines (logs, not the error report)."""
    lines = []
    for line in stderr.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            lines.append(line)
            continue
        if not (isinstance(record, dict) and "level" in record):
            lines.append(line)
    return lines


def _substitute(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    port = _closed_port()
    closed_api = _kubeconfig(tmp_path / "closed.json", f"https://127.0.0.1:{port}")
    return {
        key: value.replace("{tmp}", str(tmp_path))
        .replace("{closed-api}", str(closed_api))
        .replace("{port}", str(port))
        for key, value in env.items()
    }


@pytest.mark.parametrize(
    ("args", "env", "code", "says"),
    [
        pytest.param(["nosuch"], {}, 2, "podcost: No such command 'nosuch'", id="bad arguments"),
        pytest.param(
            ["aggregator"],
            {"PODCOST_POLICY_FILE": "/no/such/policy.yaml"},
            2,
            "/no/such/policy.yaml: cannot be read",
            id="file not found",
        ),
        pytest.param(
            ["ranker", "--strategy", "age"],
            {"PODCOST_KAFKA": "127.0.0.1:{port}"},
            1,
            "cannot reach Kafka",
            id="Kafka unreachable",
        ),
        pytest.param(
            ["annotator"],
            {"PODCOST_KAFKA": "127.0.0.1:{port}", "KUBECONFIG": "{closed-api}"},
            2,
            "PODCOST_CLUSTER is not set",
            id="annotator over Kafka without a cluster name",
        ),
        pytest.param(
            ["watcher"],
            {"PODCOST_KAFKA": "127.0.0.1:{port}", "KUBECONFIG": "{closed-api}"},
            2,
            "PODCOST_CLUSTER is not set",
            id="watcher over Kafka without a cluster name",
        ),
        pytest.param(
            ["annotator"],
            {"PODCOST_KAFKA": "127.0.0.1:{port}", "PODCOST_CLUSTER": "EU_1"},
            2,
            "PODCOST_CLUSTER: Value error, 'EU_1' is not a valid cluster name",
            id="a cluster name that cannot name a topic",
        ),
    ],
)
def test_a_failing_podcost_process_says_one_line_and_exits_never_with_a_traceback(
    tmp_path: Path, args: list[str], env: dict[str, str], code: int, says: str
) -> None:
    result = _podcost(args, _substitute(env, tmp_path), tmp_path)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.returncode == code, result.stderr
    [line] = _error_lines(result.stderr)
    assert line.startswith("podcost"), line
    assert says in line
    assert result.stdout == ""


# The same path in-process (a subprocess costs seconds of imports): failures that stop before a
# command sets up logging or tracing, so nothing of the process's global state changes.
@pytest.mark.parametrize(
    ("args", "env", "code", "says"),
    [
        pytest.param(
            ["ranker"], {}, 2, "podcost ranker: Missing option '--strategy'", id="missing"
        ),
        pytest.param(
            ["simulate", "--snapshot", "x.json", "--workload", "a/b", "--replicas", "many"],
            {},
            2,
            "podcost simulate: Invalid value for '--replicas'",
            id="bad value",
        ),
        pytest.param(
            [
                "simulate",
                "--snapshot",
                "/no/such/dump.json",
                "--workload",
                "a/b",
                "--replicas",
                "1",
            ],
            {},
            2,
            "cannot read /no/such/dump.json",
            id="dump not found",
        ),
        pytest.param(
            ["ranker", "--strategy", "age"],
            {"PODCOST_HTTP_PORT": "70000"},
            2,
            "podcost ranker: invalid setting: PODCOST_HTTP_PORT",
            id="bad setting",
        ),
        pytest.param(
            ["annotator"],
            {"PODCOST_EXPLAIN_TOKEN": "guessable"},
            2,
            "podcost annotator: invalid setting: PODCOST_EXPLAIN_TOKEN: Value error, a token "
            "needs at least 16 characters",
            id="a short explain token",
        ),
        pytest.param(
            ["explain", "shop/web/x"], {}, 2, "'shop/web/x' is not NAMESPACE/POD", id="bad pod"
        ),
        pytest.param(
            ["explain", "shop/web"],
            {"KUBECONFIG": "{tmp}/missing"},
            1,
            "podcost explain: no cluster access",
            id="no kubeconfig",
        ),
        pytest.param(
            ["explain", "shop/web"],
            {"KUBECONFIG": "{closed-api}"},
            1,
            "Cannot connect to host",
            id="API server unreachable",
        ),
    ],
)
def test_a_failing_invocation_is_one_line_and_an_exit_code(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    env: dict[str, str],
    code: int,
    says: str,
) -> None:
    for name in list(os.environ):
        if name.startswith("PODCOST_"):
            monkeypatch.delenv(name)
    for name, value in _substitute(env, tmp_path).items():
        monkeypatch.setenv(name, value)
    assert run_cli(args) == code
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert says in line


def test_the_summaries_podcost_help_lists_are_the_commands_own_docstrings() -> None:
    for name, lazy in podcost_cli.COMMANDS.items():
        command = load_command(name)
        assert command.help is not None
        first = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
        assert lazy.summary == first, name


def test_podcost_help_and_one_command_import_only_that_commands_module() -> None:
    probe = (
        "import sys; from podcost.cli import run_cli; run_cli(sys.argv[1:]); "
        "print(sorted(m for m in sys.modules if m.startswith('podcost.commands.') "
        "or m in ('kubernetes_asyncio', 'aiokafka')))"
    )
    loaded = {}
    for args in ([], ["simulate", "--help"]):
        done = subprocess.run(
            [sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True
        )
        loaded[" ".join(args)] = done.stdout.strip().splitlines()[-1]
    assert loaded == {
        "": "['podcost.commands.startup']",
        # The command and what every command shares: its options and start-up checks.
        "simulate --help": "['podcost.commands.options', 'podcost.commands.simulate', "
        "'podcost.commands.startup']",
    }
