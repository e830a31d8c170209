"""``podcost topics plan``: print every topic podcost uses with the settings of the topic contract
(``podcost_contracts.topic_contract``), for a platform team that creates topics itself.

Reads the topic names and partitions from the bus settings (``PODCOST_TOPIC_*``,
``PODCOST_KAFKA_PARTITIONS``); the replication factor is the production one unless
``--replication-factor`` says otherwise; ``--clusters-file`` (the fleet registry) lists each
registered cluster's costs topic instead of the pattern. Connects to nothing. Exit 0, or 2 on
bad settings or an unreadable registry. ``podcost.cli`` registers it.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from podcost.commands.options import DEFAULT_OUTPUT, OutputOption, emit
from podcost.commands.startup import fail, load_settings
from podcost_bus import BusSettings
from podcost_contracts.fleet import RegistryError, read_registry
from podcost_contracts.topic_contract import (
    DEFAULT_AGGREGATOR_APP_ID,
    PRODUCTION_REPLICATION_FACTOR,
    TopicSpec,
    topic_plan,
)

COMMAND = "topics"


class Action(StrEnum):
    PLAN = "plan"


def topics_command(
    action: Annotated[Action, typer.Argument(help="plan: print the topics and their settings.")],
    replication_factor: Annotated[
        int,
        typer.Option(
            "--replication-factor", min=1, help="Replicas of every topic (production default)."
        ),
    ] = PRODUCTION_REPLICATION_FACTOR,
    clusters_file: Annotated[
        Path | None,
        typer.Option(
            "--clusters-file",
            metavar="PATH",
            help="The fleet registry (one cluster name a line): list each registered cluster's "
            "costs topic instead of the pattern.",
        ),
    ] = None,
    app_id: Annotated[
        str, typer.Option("--app-id", help="The aggregator's app id (its changelogs' prefix).")
    ] = DEFAULT_AGGREGATOR_APP_ID,
    output: OutputOption = DEFAULT_OUTPUT,
) -> None:
    """Print every topic podcost uses and the settings it creates them with: partitions,
    replicas, cleanup policy, retention and min.insync.replicas."""
    settings = load_settings(COMMAND, BusSettings)
    clusters: tuple[str, ...] = ()
    if clusters_file is not None:
        try:
            clusters = tuple(sorted(read_registry(clusters_file.read_text(encoding="utf-8"))))
        except (OSError, RegistryError) as error:
            fail(COMMAND, f"cannot read the fleet registry {clusters_file}: {error}")
    plan = topic_plan(
        settings.topics,
        partitions=settings.partitions,
        replication_factor=replication_factor,
        aggregator_app_id=app_id,
        clusters=clusters,
    )
    specs = plan.expanded()
    emit([spec.to_json() for spec in specs], output, lambda: _print_table(specs))


def _print_table(specs: list[TopicSpec]) -> None:
    table = Table("topic", "partitions", "replicas", "configs", "writer", "readers")
    for spec in specs:
        configs = ", ".join(f"{name}={value}" for name, value in spec.configs().items())
        table.add_row(
            spec.name, str(spec.partitions), str(spec.replication_factor), configs, spec.writer,
            ", ".join(spec.readers),
        )  # fmt: skip
    Console(width=200).print(table)


def register(app: typer.Typer) -> None:
    """Add ``podcost topics`` to ``app``."""
    app.command("topics")(topics_command)
