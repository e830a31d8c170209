"""``podcost run``: the whole pipeline in one process (embedded mode), or over Kafka.

Without ``--kafka`` (and without ``PODCOST_KAFKA``) the watcher, one ranker per strategy, the
aggregator and the annotator share an in-process bus: the default for a laptop, a demo or a
small cluster. ``--kafka HOST:PORT`` runs the same services over a Kafka broker. Settings come
from the environment (``PODCOST_*``), cluster access from ``$KUBECONFIG`` or the in-cluster
service account; bad settings exit 2 naming the culprit. ``podcost.cli`` registers it;
``podcost.embedded.bootstrap`` does the wiring.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from podcost.commands.options import ContextOption, KubeconfigOption
from podcost.commands.startup import EXIT_FAILED, fail, load_settings
from podcost.embedded import bootstrap
from podcost.runtime.heap import freeze_imports, heap_dumps_on_signal
from podcost.runtime.logs import configure_logging
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import setup_tracing
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusError, BusSettings
from podcost_core.policy import PolicyError
from podcost_core.strategies.registry import PluginError, UnknownStrategyError
from podcost_kube.client import KubeError, connect

log = logging.getLogger("podcost.run")


async def _run(
    settings: ServiceSettings,
    bus_settings: BusSettings,
    watcher_settings: WatcherSettings,
    strategies: list[str] | None,
    cluster: tuple[str | None, str | None] = (None, None),
) -> None:
    async with connect(*cluster) as kube:
        try:
            pipeline = bootstrap(
                settings, bus_settings, kube=kube, watcher_settings=watcher_settings,
                strategies=strategies,
            )  # fmt: skip
        except (UnknownStrategyError, PluginError, PolicyError, ValueError) as error:
            fail("run", str(error))
        mode = (
            f"Kafka at {bus_settings.bootstrap_servers}"
            if bus_settings.bootstrap_servers
            else ("the in-process bus (embedded mode)")
        )
        log.info("podcost running %d services over %s", len(pipeline.services), mode)
        await serve(pipeline.services, settings, bus=pipeline.bus)


def run_command(
    kafka: Annotated[
        str | None,
        typer.Option(help="Kafka bootstrap servers (HOST:PORT); default: the in-process bus."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Decide and log every write; write nothing.")
    ] = False,
    strategy: Annotated[
        list[str] | None,
        typer.Option(help="Run rankers for these strategies only (repeatable); default: all."),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Watch these namespaces only, ns[,ns] (PODCOST_WATCHER_NAMESPACE); default: all.",
        ),
    ] = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """Run the watcher, the rankers, the aggregator and the annotator in one process."""
    overrides = {"dry_run": True} if dry_run else {}
    settings = load_settings("run", ServiceSettings, **overrides)
    bus_settings = load_settings(
        "run", BusSettings, **({"bootstrap_servers": kafka} if kafka else {})
    )
    watcher_settings = load_settings(
        "run", WatcherSettings, **({"namespace": namespace} if namespace else {})
    )
    configure_logging(settings.log_level, settings.log_format, service="podcost")
    setup_tracing("podcost")
    freeze_imports()
    heap_dumps_on_signal()
    try:
        asyncio.run(
            _run(settings, bus_settings, watcher_settings, strategy or None, (kubeconfig, context))
        )
    except (BusError, KubeError) as error:
        fail("run", str(error), EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add ``podcost run`` to ``app``."""
    app.command("run")(run_command)
