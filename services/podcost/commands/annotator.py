"""``podcost annotator [--dry-run]``: run the annotator service on its own, over Kafka.

Reads the settings from the environment (``PODCOST_*``, ``PODCOST_KAFKA*``,
``PODCOST_ANNOTATOR_*``, and the watcher's scope and opt-in settings
``PODCOST_WATCHER_NAMESPACE``, ``_NAMESPACE_SELECTOR`` and ``_DEFAULT_ENABLED``, which the
annotator verifies each decision against) and validates them before anything starts
(``podcost.commands.startup``: a bad value exits 2 with the variable named), then serves
the annotator with ``/healthz``, ``/readyz`` and ``/metrics`` until SIGINT/SIGTERM.
``podcost.cli`` registers it; ``podcost.annotator.bootstrap`` does the wiring.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from podcost.annotator import AnnotatorSettings, bootstrap
from podcost.annotator.plan import Scope
from podcost.commands.options import ContextOption, KubeconfigOption
from podcost.commands.startup import EXIT_FAILED, fail, load_settings, require_cluster
from podcost.runtime.heap import heap_dumps_on_signal
from podcost.runtime.logs import configure_logging
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import setup_tracing
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusError, BusSettings
from podcost_core.policy import PolicyError
from podcost_kube.client import KubeError, connect

COMMAND = "annotator"

log = logging.getLogger("podcost.annotator")


def annotator_command(
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Decide and log every write, write nothing (also PODCOST_DRY_RUN=true).",
        ),
    ] = False,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Write in these namespaces only, ns[,ns] (PODCOST_WATCHER_NAMESPACE); "
            "default: all.",
        ),
    ] = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """Apply the aggregator's desired costs to the pods, within a QPS budget."""
    settings = load_settings(COMMAND, ServiceSettings, **({"dry_run": True} if dry_run else {}))
    bus_settings = load_settings(COMMAND, BusSettings)
    config = load_settings(COMMAND, AnnotatorSettings)
    watch = load_settings(
        COMMAND, WatcherSettings, **({"namespace": namespace} if namespace else {})
    )
    require_cluster(COMMAND, settings, bus_settings)
    try:
        scope = Scope(watch.namespaces(), watch.opt_in_rules(settings))
    except (PolicyError, ValueError) as error:
        fail(COMMAND, str(error))
    configure_logging(settings.log_level, settings.log_format, service="podcost-annotator")
    setup_tracing("podcost-annotator")
    heap_dumps_on_signal()
    if not bus_settings.bootstrap_servers:
        log.warning(
            "PODCOST_KAFKA is not set: the annotator reads an in-process bus that nothing "
            "publishes to; run `podcost run` for embedded mode"
        )
    try:
        asyncio.run(_annotate(settings, bus_settings, config, scope, (kubeconfig, context)))
    except (KubeError, BusError) as error:
        fail(COMMAND, str(error), EXIT_FAILED)


async def _annotate(
    settings: ServiceSettings,
    bus_settings: BusSettings,
    config: AnnotatorSettings,
    scope: Scope,
    cluster: tuple[str | None, str | None],
) -> None:
    async with connect(*cluster) as kube:
        service = bootstrap(settings, bus_settings, config, kube=kube, scope=scope)
        await serve([service], settings, bus=service.bus)


def register(app: typer.Typer) -> None:
    """Add ``podcost annotator`` to ``app``."""
    app.command("annotator")(annotator_command)
