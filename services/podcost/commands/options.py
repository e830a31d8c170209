"""The options every command shares, spelled as kubectl spells them: ``--output`` (``-o``)
``table|json|yaml`` with one default for every command that prints a result (``table``, as
``kubectl get``), and ``--kubeconfig`` / ``--context`` wherever a command reads a cluster.
``podcost.commands.*`` use them; kept free of heavy imports (``podcost --help`` loads none)."""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

import typer
import yaml


class Output(StrEnum):
    """How a command prints its result."""

    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


#: The one default of ``--output``: people read tables; scripts ask for json or yaml.
DEFAULT_OUTPUT = Output.TABLE

OutputOption = Annotated[
    Output,
    typer.Option(
        "--output", "-o", help="table (for people), json or yaml (for scripts; the same fields)."
    ),
]
KubeconfigOption = Annotated[
    str | None,
    typer.Option(
        "--kubeconfig",
        metavar="PATH",
        help="The kubeconfig to use; default $KUBECONFIG, ~/.kube/config, else the in-cluster "
        "service account.",
    ),
]
ContextOption = Annotated[
    str | None,
    typer.Option(
        "--context", metavar="NAME", help="The kubeconfig context to use; default its current."
    ),
]


def emit(data: Any, output: Output, table: Callable[[], None]) -> None:
    """Print ``data`` (plain JSON types) as ``output`` asks; ``table`` draws it for people."""
    if output is Output.JSON:
        typer.echo(json.dumps(data, indent=2))
    elif output is Output.YAML:
        typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)
    else:
        table()
