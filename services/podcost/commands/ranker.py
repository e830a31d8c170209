"""``podcost ranker --strategy NAME``: run one strategy's ranker on its own, over Kafka.

Reads the settings from the environment (``PODCOST_*``, ``PODCOST_KAFKA*``,
``PODCOST_RANKER_*``), validates them and
the strategy before anything starts (an unknown strategy, a broken plugin or a bad policy file
exits 2 naming the culprit), then serves the ranker with ``/healthz``, ``/readyz`` and
``/metrics`` until SIGINT/SIGTERM. ``podcost.cli`` registers it; ``podcost.ranker.bootstrap``
does the wiring.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from podcost.commands.startup import EXIT_FAILED, fail, load_settings
from podcost.ranker import RankerSettings, bootstrap
from podcost.runtime.heap import heap_dumps_on_signal
from podcost.runtime.logs import configure_logging
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import setup_tracing
from podcost_bus import BusError, BusSettings
from podcost_core.policy import PolicyError
from podcost_core.strategies.registry import PluginError, UnknownStrategyError

log = logging.getLogger("podcost.ranker")


def ranker_command(
    strategy: Annotated[
        str,
        typer.Option(
            "--strategy",
            help="The strategy to run: a built-in one or one an installed package registers.",
        ),
    ],
) -> None:
    """Rank every workload snapshot with one strategy and publish its scores."""
    settings = load_settings("ranker", ServiceSettings)
    bus_settings = load_settings("ranker", BusSettings)
    config = load_settings("ranker", RankerSettings)
    configure_logging(settings.log_level, settings.log_format, service=f"podcost-ranker-{strategy}")
    setup_tracing(f"podcost-ranker-{strategy}")
    heap_dumps_on_signal()
    try:
        service = bootstrap(settings, bus_settings, strategy=strategy, config=config)
    except (UnknownStrategyError, PluginError, PolicyError) as error:
        fail("ranker", str(error))
    if not bus_settings.bootstrap_servers:
        log.warning(
            "PODCOST_KAFKA is not set: the ranker reads an in-process bus that nothing "
            "publishes to; run `podcost run` for embedded mode"
        )
    try:
        asyncio.run(serve([service], settings, bus=service.bus))
    except BusError as error:
        fail("ranker", str(error), EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add ``podcost ranker`` to ``app``."""
    app.command("ranker")(ranker_command)
