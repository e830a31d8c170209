"""``podcost remove-cluster NAME``: remove a cluster that left the fleet from the core: the
aggregator's states of its workloads, its costs topic and its annotators' consumer group.

Without ``--yes`` it prints the plan and changes nothing. It refuses (exit 1) while the
cluster's agent looks alive: a record of the cluster on the workloads topic within
``--quiet-for`` (longer than the watcher's resync period, so an idle watcher still shows), or
members in its annotators' group. With ``--yes`` it then:

1. publishes an empty live set of the cluster (``GONE_REMOVED``) to every partition of the
   workloads topic: the aggregator forgets every state of the cluster, with the tombstones in
   its changelogs written as its own (through its tables' path, not by hand), and asks no
   annotator to remove costs;
2. waits until the aggregator's consumer group (``PODCOST_AGGREGATOR_APP_ID``) has committed
   past that record on every partition (so no decision of the cluster is on its way to the
   costs topic), at most ``--timeout``;
3. deletes the costs topic and the annotators' consumer group.

Settings from the environment (``PODCOST_KAFKA*``, ``PODCOST_TOPIC_*``,
``PODCOST_AGGREGATOR_APP_ID``, ``PODCOST_ANNOTATOR_GROUP``). Exit 0 when done (or the plan
printed), 1 when refused or when a step failed, 2 on bad input or settings. ``podcost.cli``
registers it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from podcost.aggregator import AggregatorSettings
from podcost.annotator.settings import AnnotatorSettings
from podcost.commands.options import DEFAULT_OUTPUT, OutputOption, emit
from podcost.commands.startup import EXIT_FAILED, fail, load_settings
from podcost.runtime.logs import configure_logging
from podcost.runtime.settings import ServiceSettings
from podcost_bus import BusError, BusSettings, KafkaBus
from podcost_bus.admin import FleetAdmin, wait_until_read
from podcost_contracts.messages import GONE_REMOVED, WorkloadGoneMessage, encode, live_set_key
from podcost_contracts.topics import cluster_name_problem

COMMAND = "remove-cluster"

#: The default quiet period: longer than the watcher's default resync period (600 s ± 10 %),
#: so a watcher that runs but sees no change still shows as alive.
DEFAULT_QUIET_S = 900.0


@dataclass
class Plan:
    """What removing a cluster does, and whether it may."""

    cluster: str
    costs_topic: str
    costs_topic_exists: bool
    annotator_group: str
    annotator_group_exists: bool
    annotator_members: int
    aggregator_group: str
    last_published_at: float | None
    """The newest record of the cluster on the workloads topic within the quiet period."""
    refused: str | None = None
    """Why not (the agent looks alive), else ``None``."""
    done: bool = False
    states: str = "to forget"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Groups:
    """The consumer groups involved: the core's aggregator and the cluster's annotators."""

    aggregator: str
    annotators: str


async def _plan(
    admin: FleetAdmin, bus_settings: BusSettings, cluster: str, groups: Groups, quiet_s: float
) -> Plan:
    topics = bus_settings.topics
    annotators, aggregator = groups.annotators, groups.aggregator
    costs = topics.costs_for(cluster)
    group = await admin.group(annotators)
    now = time.time()
    last = await admin.last_published(
        topics.workloads, f"{cluster}/".encode(), now - quiet_s,
        ignore=live_set_key(cluster).encode(),
    )  # fmt: skip
    plan = Plan(
        cluster=cluster, costs_topic=costs, costs_topic_exists=costs in await admin.topics(),
        annotator_group=annotators, annotator_group_exists=group.exists,
        annotator_members=group.members, aggregator_group=aggregator, last_published_at=last,
    )  # fmt: skip
    if last is not None:
        plan.refused = (
            f"the cluster's watcher published {now - last:.0f}s ago (within the quiet period "
            f"of {quiet_s:.0f}s): stop its agent first"
        )
    elif group.members:
        plan.refused = f"its annotators' group {annotators!r} has {group.members} member(s)"
    return plan


async def _remove(bus_settings: BusSettings, cluster: str, groups: Groups, quiet_s: float,
                  yes: bool, within: float) -> Plan:  # fmt: skip
    topics = bus_settings.topics
    async with FleetAdmin(bus_settings) as admin:
        plan = await _plan(admin, bus_settings, cluster, groups, quiet_s)
        if plan.refused is not None or not yes:
            return plan
        removal = WorkloadGoneMessage(
            key=live_set_key(cluster).text(), version=0, reason=GONE_REMOVED,
            emitted_at=time.time(), live=(),
        )  # fmt: skip
        encoded = encode(removal)
        async with KafkaBus(bus_settings) as bus:
            deliveries = await bus.broadcast(
                topics.workloads, encoded.key, encoded.value, encoded.headers
            )
        marks = {delivery.partition: delivery.offset for delivery in deliveries}
        if not await wait_until_read(
            admin, plan.aggregator_group, topics.workloads, marks, within=within
        ):
            plan.refused = (
                f"the aggregator (group {plan.aggregator_group!r}) did not read the removal "
                f"within {within:.0f}s; nothing deleted (run the command again once it runs)"
            )
            return plan
        plan.states = "forgotten"
        if plan.costs_topic_exists:
            await admin.delete_topics([plan.costs_topic])
        await admin.delete_group(plan.annotator_group)
        plan.done = True
        return plan


def remove_cluster_command(
    cluster: Annotated[str, typer.Argument(help="The cluster's name (PODCOST_CLUSTER).")],
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do it; without it, print the plan only.")
    ] = False,
    quiet_for: Annotated[
        float,
        typer.Option(
            "--quiet-for",
            metavar="SECONDS",
            help="Refuse if the cluster's watcher published within this many seconds.",
        ),
    ] = DEFAULT_QUIET_S,
    timeout: Annotated[
        float,
        typer.Option("--timeout", metavar="SECONDS", help="How long to wait for the aggregator."),
    ] = 120.0,
    output: OutputOption = DEFAULT_OUTPUT,
) -> None:
    """Remove a cluster that left the fleet: its states in the aggregator, its costs topic and
    its annotators' consumer group (refused while its agent still runs)."""
    settings = load_settings(COMMAND, ServiceSettings)
    bus_settings = load_settings(COMMAND, BusSettings)
    aggregator = load_settings(COMMAND, AggregatorSettings)
    annotators = load_settings(COMMAND, AnnotatorSettings)
    configure_logging(settings.log_level, settings.log_format, service="podcost-remove-cluster")
    problem = cluster_name_problem(cluster)
    if problem:
        fail(COMMAND, problem)
    if not bus_settings.bootstrap_servers:
        fail(COMMAND, "PODCOST_KAFKA is not set: the fleet's broker is needed")
    if quiet_for < 0 or timeout <= 0:
        fail(COMMAND, "--quiet-for must be at least 0 and --timeout positive")
    try:
        groups = Groups(aggregator.app_id, annotators.group_for(cluster))
        plan = asyncio.run(_remove(bus_settings, cluster, groups, quiet_for, yes, timeout))
    except BusError as error:
        fail(COMMAND, str(error), EXIT_FAILED)
    emit(plan.to_json(), output, lambda: _print_table(plan, yes))
    if plan.refused is not None:
        raise typer.Exit(EXIT_FAILED)


def _print_table(plan: Plan, yes: bool) -> None:
    verb = "removed" if plan.done else "to remove" if plan.refused is None else "refused"
    table = Table("what", "name", verb if yes or plan.refused else "plan")
    table.add_row("aggregator states", f"{plan.cluster}/*", plan.states)
    exists = "exists" if plan.costs_topic_exists else "absent"
    table.add_row("costs topic", plan.costs_topic, exists)
    members = f"{plan.annotator_members} member(s)" if plan.annotator_group_exists else "absent"
    table.add_row("annotator group", plan.annotator_group, members)
    Console().print(table)
    if plan.refused is not None:
        Console(stderr=True).print(f"podcost {COMMAND}: refused: {plan.refused}")
    elif not yes:
        Console().print("Nothing changed: run again with --yes to remove.")


def register(app: typer.Typer) -> None:
    """Add ``podcost remove-cluster`` to ``app``."""
    app.command(COMMAND)(remove_cluster_command)
