"""The ``podcost`` command line: one typer app that every command module registers itself on.

The ``podcost`` entry point (pyproject ``podcost = "podcost.cli:main"``) runs ``main``. Each
command lives in ``podcost.commands.<name>`` with a ``register(app)`` function, so adding a
command is one module and one line here (:data:`COMMANDS`); tests drive ``app`` with typer's
``CliRunner``. The examples and environment variables every ``--help`` ends with are kept here,
in one place (:data:`EPILOGS`).

Commands are imported lazily (:class:`LazyCommands`): only the module of the command that runs
is imported, so ``podcost simulate`` does not pay for kubernetes-asyncio and aiokafka, nor
``podcost run`` for the demo; ``podcost --help`` lists every command from the one-line summaries
of :data:`COMMANDS` (a unit test keeps them equal to the commands' own docstrings).

``main`` is where errors stop: a command reports what it expects itself (one line, exit 2 for
bad input or settings, 1 when something it needs fails); whatever still reaches ``main`` — a
bad argument, an error of a kind a command did not catch — becomes one line on stderr too, never
a traceback (:func:`exit_code_for`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from typer import _click as click  # typer's own click, which its groups are built on
from typer.core import TyperCommand, TyperGroup
from typer.exceptions import TyperException

from podcost.commands.startup import EXIT_BAD_CONFIG, EXIT_FAILED
from podcost.runtime.version import build, package_version
from podcost_core.kubejson import ConversionError
from podcost_core.policy import PolicyError
from podcost_core.strategies.registry import (
    BUILTIN,
    PluginError,
    RemoteStrategyError,
    UnknownStrategyError,
)

#: Exit code after Ctrl-C, as shells report SIGINT.
EXIT_INTERRUPTED = 130

HELP = f"""podcost {package_version()}: steer Kubernetes scale-in with
`controller.kubernetes.io/pod-deletion-cost`.

podcost watches the cluster, ranks the pods of every opted-in workload with pluggable
strategies, combines the ranks and writes each pod's deletion cost, so that a scale-in removes
the pods you would have chosen. Opt a Deployment in with the annotation
`podcost.dev/enabled: "true"`; `podcost.dev/strategies` picks the strategies and weights.
"""

_ENV = (
    "Settings are environment variables, validated at start (a bad value exits 2 naming it): "
    "`PODCOST_CLUSTER`, `PODCOST_HTTP_PORT` (`/healthz`, `/readyz`, `/metrics`), "
    "`PODCOST_LOG_LEVEL`, `PODCOST_LOG_FORMAT`, `PODCOST_POLICY_FILE`, `PODCOST_DRY_RUN`"
)
_KAFKA = "`PODCOST_KAFKA` (bootstrap servers), `PODCOST_KAFKA_*` (TLS, SASL), `PODCOST_TOPIC_*`"

EPILOGS: dict[str, str] = {
    "": """**Examples**

```
podcost run                          # the whole pipeline, one process
podcost run --kafka kafka:9092       # the same services over Kafka
podcost simulate --snapshot dump.json --workload shop/web --replicas 6
podcost explain shop/web-5d8f7-x2x9k
```

Run `podcost COMMAND --help` for a command's options, settings and examples. Installed on the
`PATH`, `kubectl-podcost` makes each command a kubectl plugin: `kubectl podcost simulate ...`.
Shell completion: `podcost --install-completion`. Commands that print a result take
`--output table|json|yaml` (default table); commands that read a cluster take `--kubeconfig`,
`--context` and, where a namespace narrows them, `-n/--namespace`.
""",
    "run": f"""**Examples**

```
podcost run                          # in-process bus (embedded mode)
podcost run --kafka kafka:9092       # over Kafka
podcost run --dry-run                # decide and log, write nothing
podcost run --strategy topology-spread --strategy age
```

{_ENV}; {_KAFKA}; `PODCOST_WATCHER_*`, `PODCOST_AGGREGATOR_*`, `PODCOST_ANNOTATOR_*`,
`PODCOST_EXPLAIN_TOKEN` (a bearer token `/explain` then requires). Cluster access:
`$KUBECONFIG`, `~/.kube/config` or the in-cluster service account.
""",
    "watcher": f"""**Example**

```
PODCOST_KAFKA=kafka:9092 podcost watcher
```

{_ENV}; {_KAFKA}; `PODCOST_WATCHER_NAMESPACE` (one namespace or `a,b`),
`PODCOST_WATCHER_NAMESPACE_SELECTOR`,
`PODCOST_WATCHER_DEFAULT_ENABLED`, `PODCOST_WATCHER_DEBOUNCE_SECONDS`,
`PODCOST_WATCHER_LEADER_ELECTION` (and the Lease settings). Cluster access: `$KUBECONFIG`,
`~/.kube/config` or the in-cluster service account.
""",
    "ranker": f"""**Examples**

```
PODCOST_KAFKA=kafka:9092 podcost ranker --strategy capacity-type
PODCOST_KAFKA=kafka:9092 podcost ranker --strategy restarts   # a plugin
```

One ranker per strategy, consumer group `podcost-ranker-NAME` (`PODCOST_RANKER_GROUP` changes
the prefix). Built-in strategies:
{", ".join(BUILTIN)}; installed packages add more through the `podcost.strategies` entry
points. {_ENV}; {_KAFKA}.
""",
    "aggregator": f"""**Example**

```
PODCOST_KAFKA=kafka:9092 podcost aggregator
```

{_ENV}; {_KAFKA}; `PODCOST_AGGREGATOR_DEADLINE_SECONDS` (how long to wait for every strategy),
`PODCOST_AGGREGATOR_ENGINE` (faust or consumer) and the other `PODCOST_AGGREGATOR_*`.
""",
    "annotator": f"""**Examples**

```
PODCOST_KAFKA=kafka:9092 podcost annotator
PODCOST_KAFKA=kafka:9092 podcost annotator --dry-run
```

Serves `GET /explain/NAMESPACE/POD` on its HTTP port for `podcost explain`; with
`PODCOST_EXPLAIN_TOKEN` set only to `Authorization: Bearer <token>`. {_ENV}; {_KAFKA};
`PODCOST_ANNOTATOR_QPS`, `PODCOST_ANNOTATOR_BURST`, `PODCOST_ANNOTATOR_MAX_IN_FLIGHT`,
`PODCOST_ANNOTATOR_OVERWRITE_FOREIGN` and the other `PODCOST_ANNOTATOR_*`.
""",
    "simulate": """**Examples**

```
kubectl get pods,nodes,replicasets,deployments -A -o json --show-managed-fields > dump.json
podcost simulate --snapshot dump.json --workload shop/web --replicas 6
podcost simulate --snapshot dump.json --workload shop/web --replicas 6 --baseline
podcost simulate ... --policy policy.yaml --output table
podcost simulate ... --adopt-kept
```

`--baseline` keeps the costs the pods carry now: what Kubernetes does today. With podcost, the
costs someone else set are kept and named (`kept_costs`, with who set them from the pods'
`managedFields`; a dump without them gets a warning) and `--adopt-kept` shows the outcome were
they taken over. Bad input exits 2 with one line saying what is wrong.
""",
    "cleanup": f"""**Examples**

```
podcost cleanup                      # every namespace
podcost cleanup --namespace shop --dry-run
```

Removes a cost only where podcost's field manager alone owns it, with a JSON patch that tests
the value first, so a cost someone set or changed stays. Prints one JSON line of counts; exit 1
when some cost could not be removed. The Helm chart runs it on uninstall. {_ENV};
`PODCOST_ANNOTATOR_QPS`, `PODCOST_ANNOTATOR_BURST`, `PODCOST_ANNOTATOR_MAX_IN_FLIGHT` (the
budget). Cluster access: `$KUBECONFIG`, `~/.kube/config` or the in-cluster service account.
""",
    "topics": """**Examples**

```
podcost topics plan                  # a table of every topic and its settings
podcost topics plan -o yaml --clusters-file clusters.txt
```

The topic contract, for a platform team that creates topics itself: podcost creates a missing
topic with these settings and reports an existing one that differs (a warning and
`podcost_topic_config_drift`), never changing it. Connects to nothing. `PODCOST_TOPIC_*` (the
names), `PODCOST_KAFKA_PARTITIONS`.
""",
    "remove-cluster": f"""**Examples**

```
podcost remove-cluster prod-eu-1               # the plan: what would go, or why not
podcost remove-cluster prod-eu-1 --yes -o json
```

Refused (exit 1) while the cluster's watcher published within `--quiet-for` (default 900 s,
longer than the watcher's resync period) or its annotators' group has members. {_KAFKA};
`PODCOST_AGGREGATOR_APP_ID`, `PODCOST_ANNOTATOR_GROUP`.
""",
    "demo": """**Example**

```
make demo        # builds the local servers once, then runs this
```
""",
}


@dataclass(frozen=True)
class Command:
    """Where a command lives, and the summary ``podcost --help`` shows for it."""

    module: str
    """``podcost.commands.<name>``, with a ``register(app)`` function."""
    summary: str
    """The first paragraph of the command's docstring, on one line."""


#: Every command, in the order ``podcost --help`` lists them.
COMMANDS: dict[str, Command] = {
    "simulate": Command(
        "podcost.commands.simulate",
        "Show which pods the ReplicaSet controller deletes when WORKLOAD scales to REPLICAS.",
    ),
    "explain": Command(
        "podcost.commands.explain",
        "Show why a pod carries its deletion cost: every strategy's score, weight and tier, its "
        "place in the deletion order, and the trace of the decision.",
    ),
    "demo": Command(
        "podcost.commands.demo",
        "Run podcost embedded on a local control plane it starts and stops itself, and compare "
        "a scale-in with and without it.",
    ),
    "annotator": Command(
        "podcost.commands.annotator",
        "Apply the aggregator's desired costs to the pods, within a QPS budget.",
    ),
    "ranker": Command(
        "podcost.commands.ranker",
        "Rank every workload snapshot with one strategy (or several) and publish its scores.",
    ),
    "aggregator": Command(
        "podcost.commands.aggregator",
        "Combine every strategy's scores into desired costs and publish them.",
    ),
    "watcher": Command(
        "podcost.commands.watcher",
        "Watch pods, nodes, ReplicaSets and Deployments; publish each opted-in workload's "
        "snapshot whenever something that matters to it changes.",
    ),
    "run": Command(
        "podcost.commands.run",
        "Run the watcher, the rankers, the aggregator and the annotator in one process.",
    ),
    "cleanup": Command(
        "podcost.commands.cleanup",
        "Remove every deletion cost podcost wrote (only its own, only where the value is still "
        "podcost's), within the annotator's write budget.",
    ),
    "topics": Command(
        "podcost.commands.topics",
        "Print every topic podcost uses and the settings it creates them with: partitions, "
        "replicas, cleanup policy, retention and min.insync.replicas.",
    ),
    "remove-cluster": Command(
        "podcost.commands.remove_cluster",
        "Remove a cluster that left the fleet: its states in the aggregator, its costs topic and "
        "its annotators' consumer group (refused while its agent still runs).",
    ),
}


def load_command(name: str) -> click.Command:
    """The click command ``name``, its module imported now (with its epilog from here)."""
    single = typer.Typer(
        add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="markdown"
    )
    importlib.import_module(COMMANDS[name].module).register(single)
    [info] = single.registered_commands
    info.epilog = with_exit_codes(info.epilog if info.epilog is not None else EPILOGS.get(name))
    command = typer.main.get_command(single)  # one command and no callback: that command
    command.name = name
    return command


class LazyCommands(TyperGroup):
    """The ``podcost`` group: imports a command's module only when that command is resolved;
    its own ``--help`` lists the commands from :data:`COMMANDS` without importing any."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._listing = False
        self._loaded: dict[str, click.Command] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        if self._listing:
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].summary)
        if cmd_name not in self._loaded:
            self._loaded[cmd_name] = load_command(cmd_name)
        return self._loaded[cmd_name]

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


#: What every ``--help`` ends with: the exit codes, the same for every command.
EXIT_CODES = f"""**Exit codes**: 0 done; 1 something podcost needs failed (the API server, the
broker, a file it reads, a write it gave up on); 2 bad input (arguments, a setting, a policy or
dump file); 130 interrupted. (podcost {package_version()})"""


def with_exit_codes(epilog: str | None) -> str:
    """``epilog`` followed by :data:`EXIT_CODES`."""
    return f"{(epilog or '').rstrip()}\n\n{EXIT_CODES}\n".lstrip()


def _print_version(value: bool) -> None:
    if value:
        identity = build()
        typer.echo(f"podcost {identity.version} (revision {identity.revision}, "
                   f"Python {identity.python})")  # fmt: skip
        raise typer.Exit(0)


app = typer.Typer(
    name="podcost",
    help=HELP,
    epilog=with_exit_codes(EPILOGS[""]),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    cls=LazyCommands,
)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version, the revision it was built from and the Python, and exit.",
        ),
    ] = False,
) -> None:
    # A callback keeps typer in group mode: with a single command it would otherwise run that
    # command bare, and ``podcost simulate ...`` would stop working.
    pass


#: Errors a command may let through that say what is wrong with the input or the settings
#: (exit 2), and errors of the outside world: an API server, a broker, a file (exit 1).
BAD_INPUT: tuple[type[BaseException], ...] = (
    PolicyError, PluginError, UnknownStrategyError, RemoteStrategyError, ConversionError,
    ValidationError,
    FileNotFoundError, IsADirectoryError, NotADirectoryError,
)  # fmt: skip
FAILED: tuple[type[BaseException], ...] = (TimeoutError, OSError)
#: The adapters' errors (exit 1), named rather than imported: a command that never loaded an
#: adapter cannot have raised its error, and importing it would cost what lazy commands save.
ADAPTER_ERRORS = (
    ("podcost_kube.client", "KubeError"),
    ("podcost_bus.protocol", "BusError"),
    ("podcost_bus.faust_app", "FaustAppFailed"),  # `podcost run --kafka`'s aggregator
)


def failed_kinds() -> tuple[type[BaseException], ...]:
    """:data:`FAILED` and the errors of every adapter loaded so far."""
    loaded = tuple(
        getattr(sys.modules[module], name) for module, name in ADAPTER_ERRORS
        if module in sys.modules
    )  # fmt: skip
    return (*FAILED, *loaded)


def exit_code_for(error: BaseException) -> int:
    """The exit code of an error that reached ``main``: 2 for bad input, else 1."""
    return EXIT_BAD_CONFIG if isinstance(error, BAD_INPUT) else EXIT_FAILED


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _command_of(args: Sequence[str]) -> str:
    """``podcost NAME`` when ``args`` start with a known command, else ``podcost``."""
    names = set(COMMANDS)
    first = next((arg for arg in args if not arg.startswith("-")), None)
    return f"podcost {first}" if first in names else "podcost"


def prog_name(argv0: str) -> str:
    """How the command is called in usage lines: ``kubectl podcost`` when kubectl runs it as
    its plugin (the ``kubectl-podcost`` entry point), else ``podcost``."""
    return "kubectl podcost" if Path(argv0).name.startswith("kubectl-") else "podcost"


def run_cli(args: Sequence[str] | None = None) -> int:
    """Run the command line on ``args`` (default: ``sys.argv[1:]``); the exit code."""
    argv = list(sys.argv[1:] if args is None else args)
    if not argv:
        argv = ["--help"]  # what no_args_is_help does, without click's exit code 2
    try:
        result = app(args=argv, prog_name=prog_name(sys.argv[0]), standalone_mode=False)
    except TyperException as error:  # bad arguments: a usage error names its command
        context = getattr(error, "ctx", None)
        where = str(getattr(context, "command_path", "")) or _command_of(argv)
        message = _one_line(error.format_message())
        typer.echo(f"{where}: {message} (see '{where} --help')", err=True)
        return error.exit_code
    except (typer.Abort, KeyboardInterrupt):
        typer.echo(f"{_command_of(argv)}: interrupted", err=True)
        return EXIT_INTERRUPTED
    except Exception as error:
        if not isinstance(error, (*BAD_INPUT, *failed_kinds())):  # a bug: still one line
            typer.echo(
                f"{_command_of(argv)}: internal error, {type(error).__name__}: "
                f"{_one_line(str(error))} (please report it)",
                err=True,
            )
            return EXIT_FAILED
        reason = _one_line(str(error)) or type(error).__name__
        typer.echo(f"{_command_of(argv)}: {reason}", err=True)
        return exit_code_for(error)
    return result if isinstance(result, int) else 0


def main() -> None:
    """Run the command line and exit with its code (the ``podcost`` and ``kubectl-podcost``
    entry points)."""
    sys.exit(run_cli())
