"""``podcost ranker --strategy NAME``: run one strategy's ranker on its own, over Kafka.

``--strategy`` may be repeated (or name several, comma-separated): the process then runs one
ranker per strategy, each in its own consumer group as it would on its own, every snapshot
record is decoded once for all of them (decoding is most of what a ranker spends per record),
and, with ``PODCOST_RANKER_COMBINE_STRATEGIES=true``, their answers to the same records share a
ranks record (``podcost.ranker.outbox``).

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
from podcost.ranker import RankerSettings, bootstrap, shared_outbox, together_bus_settings
from podcost.runtime.heap import heap_dumps_on_signal
from podcost.runtime.logs import configure_logging
from podcost.runtime.metrics import Families
from podcost.runtime.runner import serve
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import setup_tracing
from podcost_bus import BusError, BusSettings, open_bus
from podcost_contracts.messages import keep_decoded_snapshots
from podcost_core.policy import PolicyError
from podcost_core.strategies.registry import PluginError, UnknownStrategyError

log = logging.getLogger("podcost.ranker")


def ranker_command(
    strategy: Annotated[
        list[str],
        typer.Option(
            "--strategy",
            help="The strategy to run: a built-in one or one an installed package registers. "
            "Repeat it (or separate names with commas) to run several strategies' rankers in "
            "this process, each in its own consumer group, sharing one decode of each snapshot.",
        ),
    ],
) -> None:
    """Rank every workload snapshot with one strategy (or several) and publish its scores."""
    names = list(
        dict.fromkeys(n.strip() for item in strategy for n in item.split(",") if n.strip())
    )
    if not names:
        fail("ranker", "--strategy names no strategy")
    settings = load_settings("ranker", ServiceSettings)
    bus_settings = load_settings("ranker", BusSettings)
    config = load_settings("ranker", RankerSettings)
    service_name = f"podcost-ranker-{names[0]}" if len(names) == 1 else "podcost-rankers"
    configure_logging(settings.log_level, settings.log_format, service=service_name)
    setup_tracing(service_name)
    heap_dumps_on_signal()
    shared = len(names) > 1
    if shared:
        # Every strategy's consumer reads the same records, as far apart as what each has
        # fetched ahead (several polls): the first decode of a record must outlive the others'
        # arrival at it, and is let go once every one of them has read it.
        keep_decoded_snapshots(8 * bus_settings.max_poll_records + 64, readers=len(names))
        # And they read the same partitions, whatever the replicas: one decode serves them all.
        bus_settings = together_bus_settings(bus_settings)
    bus = open_bus(bus_settings)
    families = Families() if shared else None
    # One record per partition for every strategy's answers to the same snapshots.
    outbox = (
        shared_outbox(settings, bus_settings, bus=bus, families=families, config=config)
        if shared and config.combine_strategies
        else None
    )
    try:
        services = [
            bootstrap(
                settings, bus_settings, strategy=name, config=config, bus=bus,
                whole_snapshots=shared, families=families, outbox=outbox,
            )
            for name in names
        ]  # fmt: skip
    except (UnknownStrategyError, PluginError, PolicyError) as error:
        fail("ranker", str(error))
    if not bus_settings.bootstrap_servers:
        log.warning(
            "PODCOST_KAFKA is not set: the ranker reads an in-process bus that nothing "
            "publishes to; run `podcost run` for embedded mode"
        )
    try:
        asyncio.run(serve(services, settings, bus=bus))
    except BusError as error:
        fail("ranker", str(error), EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add ``podcost ranker`` to ``app``."""
    app.command("ranker")(ranker_command)
