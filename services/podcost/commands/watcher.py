"""``podcost watcher``: watch the cluster and publish opted-in workloads' snapshots over Kafka.

Reads the settings from the environment (``PODCOST_*``, ``PODCOST_WATCHER_*``,
``PODCOST_KAFKA*``) and the cluster access from ``$KUBECONFIG`` or the in-cluster service
account, validates them before anything starts (exit 2 naming the culprit), then serves the
watcher with ``/healthz``, ``/readyz`` and ``/metrics`` until SIGINT/SIGTERM. ``podcost.cli``
registers it; ``podcost.watcher.service.bootstrap`` does the wiring.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from podcost.commands.options import ContextOption, KubeconfigOption
from podcost.commands.startup import EXIT_FAILED, fail, load_settings, require_cluster
from podcost.runtime.heap import heap_dumps_on_signal
from podcost.runtime.logs import configure_logging
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import setup_tracing
from podcost.watcher.service import WatcherSettings, bootstrap
from podcost_bus import BusError, BusSettings
from podcost_kube.client import KubeError, connect

log = logging.getLogger("podcost.watcher")


async def _watch(
    settings: ServiceSettings,
    bus_settings: BusSettings,
    watcher_settings: WatcherSettings,
    cluster: tuple[str | None, str | None] = (None, None),
) -> None:
    async with connect(*cluster) as kube:
        try:
            service = bootstrap(settings, bus_settings, watcher_settings, kube=kube)
        except ValueError as error:
            fail("watcher", str(error))
        await serve([service], settings, bus=service.bus)


def watcher_command(
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
    """Watch pods, nodes, ReplicaSets and Deployments; publish each opted-in workload's
    snapshot whenever something that matters to it changes."""
    settings = load_settings("watcher", ServiceSettings)
    bus_settings = load_settings("watcher", BusSettings)
    watcher_settings = load_settings(
        "watcher", WatcherSettings, **({"namespace": namespace} if namespace else {})
    )
    require_cluster("watcher", settings, bus_settings)
    configure_logging(settings.log_level, settings.log_format, service="podcost-watcher")
    setup_tracing("podcost-watcher")
    heap_dumps_on_signal()
    if not bus_settings.bootstrap_servers:
        log.warning(
            "PODCOST_KAFKA is not set: snapshots go to an in-process bus nobody reads; "
            "run `podcost run` for embedded mode"
        )
    try:
        asyncio.run(_watch(settings, bus_settings, watcher_settings, (kubeconfig, context)))
    except (BusError, KubeError) as error:
        fail("watcher", str(error), EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add ``podcost watcher`` to ``app``."""
    app.command("watcher")(watcher_command)
