"""``podcost aggregator``: run the aggregator on its own, over Kafka.

Reads the settings from the environment (``PODCOST_*``, ``PODCOST_KAFKA*``,
``PODCOST_AGGREGATOR_*``), validates them and the policy file before anything starts (a bad
value exits 2 naming it), then serves the aggregator with ``/healthz``, ``/readyz`` and
``/metrics`` until SIGINT/SIGTERM. ``podcost.cli`` registers it;
``podcost.aggregator.bootstrap`` does the wiring.
"""

from __future__ import annotations

import asyncio
import logging

import typer

from podcost.aggregator import AggregatorSettings, bootstrap
from podcost.commands.startup import EXIT_FAILED, fail, load_settings
from podcost.runtime.heap import heap_dumps_on_signal
from podcost.runtime.logs import configure_logging
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import setup_tracing
from podcost_bus import BusError, BusSettings
from podcost_bus.faust_app import FaustAppFailed
from podcost_core.policy import PolicyError
from podcost_core.strategies.registry import PluginError

log = logging.getLogger("podcost.aggregator")


def aggregator_command() -> None:
    """Combine every strategy's scores into desired costs and publish them."""
    settings = load_settings("aggregator", ServiceSettings)
    bus_settings = load_settings("aggregator", BusSettings)
    config = load_settings("aggregator", AggregatorSettings)
    configure_logging(settings.log_level, settings.log_format, service="podcost-aggregator")
    setup_tracing("podcost-aggregator")
    heap_dumps_on_signal()
    try:
        service = bootstrap(settings, bus_settings, config=config)
    except (PluginError, PolicyError) as error:
        fail("aggregator", str(error))
    if not bus_settings.bootstrap_servers:
        log.warning(
            "PODCOST_KAFKA is not set: the aggregator reads an in-process bus that nothing "
            "publishes to; run `podcost run` for embedded mode"
        )
    try:
        asyncio.run(serve([service], settings, bus=service.bus))
    except (BusError, FaustAppFailed) as error:
        fail("aggregator", str(error), EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add ``podcost aggregator`` to ``app``."""
    app.command("aggregator")(aggregator_command)
