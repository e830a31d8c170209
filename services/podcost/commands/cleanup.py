"""``podcost cleanup``: remove every deletion cost podcost wrote, from the whole cluster or one
namespace; what the Helm chart runs as its uninstall (pre-delete) hook.

Reads ``PODCOST_*`` (logs, ``PODCOST_DRY_RUN``) and the annotator's budget
(``PODCOST_ANNOTATOR_QPS``, ``_BURST``, ``_MAX_IN_FLIGHT``, backoff, ``_MAX_ATTEMPTS``) from the
environment, cluster access from ``$KUBECONFIG`` or the in-cluster service account; does the
work with ``podcost.annotator.cleanup.clean_up`` and prints its counts and seconds (``--output``:
a table, JSON or YAML; the chart's hook asks for JSON).
Exit 0 when every cost podcost owned is removed (or found changed by someone else, and left),
1 when some could not be removed, 2 on bad settings. ``podcost.cli`` registers it.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from podcost.annotator.cleanup import CleanupReport, Outcome, clean_up
from podcost.annotator.settings import AnnotatorSettings
from podcost.commands.options import (
    DEFAULT_OUTPUT,
    ContextOption,
    KubeconfigOption,
    OutputOption,
    emit,
)
from podcost.commands.startup import EXIT_FAILED, fail, load_settings
from podcost.runtime.logs import configure_logging
from podcost.runtime.settings import ServiceSettings
from podcost_kube.client import KubeError, connect

COMMAND = "cleanup"


async def _clean(
    settings: ServiceSettings,
    config: AnnotatorSettings,
    namespace: str | None,
    cluster: tuple[str | None, str | None],
) -> CleanupReport:
    async with connect(*cluster) as kube:
        return await clean_up(
            kube, config, namespace=namespace, dry_run=settings.dry_run, backoff=settings.backoff()
        )


def cleanup_command(
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Clean these namespaces only (one, or a comma-separated list); default: every "
            "namespace.",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Count and log what would be removed, remove nothing."),
    ] = False,
    output: OutputOption = DEFAULT_OUTPUT,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """Remove every deletion cost podcost wrote (only its own, only where the value is still
    podcost's), within the annotator's write budget."""
    settings = load_settings(COMMAND, ServiceSettings, **({"dry_run": True} if dry_run else {}))
    config = load_settings(COMMAND, AnnotatorSettings)
    configure_logging(settings.log_level, settings.log_format, service="podcost-cleanup")
    try:
        report = asyncio.run(_clean(settings, config, namespace, (kubeconfig, context)))
    except KubeError as error:
        fail(COMMAND, str(error), EXIT_FAILED)
    emit(report.to_json(), output, lambda: _print_table(report))
    if report.outcomes[Outcome.ERROR]:
        raise typer.Exit(EXIT_FAILED)


def _print_table(report: CleanupReport) -> None:
    table = Table("pods", "podcost's costs", *(outcome.value for outcome in Outcome), "seconds")
    counts = report.to_json()
    table.add_row(*(str(counts[key]) for key in counts))
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add ``podcost cleanup`` to ``app``."""
    app.command("cleanup")(cleanup_command)
