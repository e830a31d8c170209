"""``podcost simulate``: which pods go if a workload scales to N, with podcost or without.

A thin shell over ``podcost_core.simulate``: reads the dump files and the policy, parses the
options, prints a rich table, JSON or YAML (``--output``). ``podcost.cli`` registers it. Every
input error exits 2 with one line on stderr saying what is wrong; nothing here decides anything.

Who set a cost is read off the pods' ``managedFields``, which ``kubectl get -o json`` leaves out
unless given ``--show-managed-fields``. A cost on a pod without them cannot be told apart: it is
simulated as set by someone else (kept, podcost's own and the adopted managers' costs included),
a warning on stderr says so and how many pods it concerns, and the result says whether those
kept costs change the outcome (``--adopt-kept`` shows the outcome with them adopted).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from podcost.commands.options import DEFAULT_OUTPUT, OutputOption, emit
from podcost_core.combine import ScoreContractError
from podcost_core.kubejson import ConversionError, cost_managers
from podcost_core.model import DEFAULT_ADOPTED_MANAGERS, FIELD_MANAGER, PodUID, Snapshot
from podcost_core.policy import Policy, PolicyError, load_policy_file, policy_from_annotations
from podcost_core.rollout import rollout_for
from podcost_core.simulate import NO_DOMAIN, SimulationError, SimulationResult, simulate
from podcost_core.snapshots import ClusterObjects, load_objects, snapshot_for_workload
from podcost_core.tomodel import pod_from_json

EXIT_BAD_INPUT = 2


def _fail(message: str) -> NoReturn:
    """Say what is wrong in one line and exit 2."""
    typer.echo(f"podcost simulate: {' '.join(message.split())}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _read_dumps(paths: list[Path]) -> list[Any]:
    documents = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            _fail(f"cannot read {path}: {error.strerror or error}")
        try:
            documents.append(json.loads(text))
        except json.JSONDecodeError as error:
            _fail(f"{path} is not JSON ({error.msg} at line {error.lineno}, column {error.colno})")
        if not isinstance(documents[-1], dict):
            _fail(f"{path} is not a Kubernetes object or List")
    return documents


def _parse_now(value: str) -> float:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        _fail(f"--now {value!r} is not an RFC 3339 time (e.g. 2024-05-01T12:00:00Z)")
    if parsed.tzinfo is None:
        _fail(f"--now {value!r} has no time zone (add Z or an offset)")
    return parsed.timestamp()


def _split_workload(value: str) -> tuple[str, str]:
    namespace, slash, name = value.partition("/")
    if not slash or not namespace or not name or "/" in name:
        _fail(f"--workload {value!r} is not NAMESPACE/NAME")
    return namespace, name


def _setters(objects: ClusterObjects, view: Snapshot) -> dict[PodUID, tuple[str, ...]]:
    """Per pod of ``view``, the field managers that own its deletion cost."""
    found = {}
    for pod in view.pods:
        raw = objects.pods.get((pod.namespace, pod.name))
        if raw is not None:
            found[pod.uid] = cost_managers(raw.get("metadata", {}))
    return found


def _warn_unknown_setters(objects: ClusterObjects, view: Snapshot) -> None:
    """Say on stderr how many costs cannot be attributed, and what is assumed of them."""
    blind = [
        pod.name
        for pod in view.pods
        if pod.active
        and pod.deletion_cost_raw is not None
        and not objects.pods.get((pod.namespace, pod.name), {})
        .get("metadata", {})
        .get("managedFields")
    ]
    if blind:
        typer.echo(
            f"podcost simulate: warning: {len(blind)} pod(s) of the workload carry a deletion "
            "cost but no managedFields in the dump (kubectl get leaves them out without "
            "--show-managed-fields), so who set them is unknown: they are simulated as set by "
            "someone else and kept, podcost's own included; see kept_costs, or dump again with "
            "--show-managed-fields",
            err=True,
        )


def _print_table(result: SimulationResult, baseline: bool) -> None:
    console = Console()
    mode = "today (existing costs)" if baseline else "with podcost"
    console.print(
        f"[bold]{result.workload}[/bold] {result.replicas_before} → {result.replicas_after} "
        f"replicas, {mode}"
    )
    if result.replicasets:
        split = ", ".join(
            f"{name} {a} → {b}" for name, (a, b) in sorted(result.replicasets.items())
        )
        console.print(f"mid-rollout: the deployment controller scales {split} (proportionally)")
        if result.rollout_goes_on:
            console.print(
                "the rollout is not paused: after this scale-in it goes on and may move more "
                "replicas (not simulated)"
            )
    victims = Table(title="Deleted pods, first preferred first")
    for column in ("#", "pod", "node", result.topology_key, "cost"):
        victims.add_column(column)
    tied = {pod.uid for pod in result.tied}
    for position, pod in enumerate(result.victims, start=1):
        victims.add_row(
            str(position),
            pod.name + (" *" if pod.uid in tied else ""),
            pod.node or "-",
            result.pod_domains.get(pod.name, NO_DOMAIN),
            str(result.costs.get(pod.name, pod.deletion_cost)),
        )
    console.print(victims)
    if result.tie_picks:
        console.print(
            f"* the controller picks {result.tie_picks} of "
            f"{', '.join(pod.name for pod in result.tied)} at random (equal in every rule)"
        )
    domains = Table(title=f"Pods per {result.topology_key}")
    for column in ("domain", "before", "after"):
        domains.add_column(column)
    for domain, count in sorted(result.domains_before.items()):
        domains.add_row(domain, str(count), str(result.domains_after.get(domain, 0)))
    console.print(domains)
    console.print(f"skew {result.skew_before} → {result.skew_after}")
    if result.writes:
        console.print(f"podcost would write {len(result.writes)} cost(s) before scaling")
    if result.kept:
        kept = Table(
            title="Costs someone else set"
            + (", adopted here (--adopt-kept)" if result.adopted_kept else ", kept by podcost")
        )
        for column in ("pod", "cost", "set by", "in podcost's band"):
            kept.add_column(column)
        for entry in result.kept:
            set_by = ", ".join(entry.set_by) if entry.set_by else "unknown (no managedFields)"
            kept.add_row(entry.pod, str(entry.cost), set_by, "yes" if entry.in_band else "no")
        console.print(kept)
        other = "keeping" if result.adopted_kept else "adopting"
        console.print(
            f"{other} them {'changes' if result.kept_changes_outcome else 'does not change'} "
            "the outcome"
        )


def simulate_command(
    snapshot: Annotated[
        list[Path],
        typer.Option(
            "--snapshot",
            help="A `kubectl get pods,nodes,replicasets,deployments -A -o json` dump; repeatable.",
        ),
    ],
    workload: Annotated[str, typer.Option(help="NAMESPACE/NAME of a Deployment or ReplicaSet.")],
    replicas: Annotated[int, typer.Option(help="The replica count to scale in to.")],
    policy: Annotated[
        Path | None,
        typer.Option(help="A policy file (YAML or JSON); default: the workload's annotations."),
    ] = None,
    baseline: Annotated[
        bool,
        typer.Option("--baseline", help="Keep the existing costs: what Kubernetes does today."),
    ] = False,
    output: OutputOption = DEFAULT_OUTPUT,
    now: Annotated[
        str | None,
        typer.Option(
            help="The controller's clock, RFC 3339; default: the newest time in the dump."
        ),
    ] = None,
    topology_key: Annotated[
        str | None, typer.Option(help="The node label to report domains and skew by.")
    ] = None,
    kind: Annotated[
        str | None, typer.Option(help="Deployment or ReplicaSet, when both have the name.")
    ] = None,
    adopt_field_managers: Annotated[
        str,
        typer.Option(
            envvar="PODCOST_ADOPT_FIELD_MANAGERS",
            help="Comma-separated field managers whose costs podcost takes over, besides its "
            "own (as the running podcost's setting); empty: none.",
        ),
    ] = ",".join(DEFAULT_ADOPTED_MANAGERS),
    adopt_kept: Annotated[
        bool,
        typer.Option(
            "--adopt-kept",
            help="Show the outcome with the costs podcost would keep (set by anyone else) "
            "adopted too.",
        ),
    ] = False,
) -> None:
    """Show which pods the ReplicaSet controller deletes when WORKLOAD scales to REPLICAS."""
    namespace, name = _split_workload(workload)
    clock = _parse_now(now) if now is not None else None
    try:
        objects = load_objects(_read_dumps(snapshot))
        adopt = {FIELD_MANAGER, *(m.strip() for m in adopt_field_managers.split(",") if m.strip())}
        view = snapshot_for_workload(
            objects, namespace, name, kind=kind, convert_pod=partial(pod_from_json, adopt=adopt)
        )
        chosen: Policy | None = None
        if not baseline:
            chosen = (
                load_policy_file(policy)
                if policy is not None
                else policy_from_annotations(view.annotations)
            )
        result = simulate(
            view,
            replicas,
            clock if clock is not None else (view.taken_at or None),
            policy=chosen,
            topology_key=topology_key,
            setters=_setters(objects, view),
            adopt_kept=adopt_kept,
            rollout=rollout_for(objects, view),
        )
    except (ConversionError, PolicyError, SimulationError, ScoreContractError) as error:
        _fail(str(error))
    if not baseline:
        _warn_unknown_setters(objects, view)
    emit(result.to_json(), output, lambda: _print_table(result, baseline))


def register(app: typer.Typer) -> None:
    """Add ``simulate`` to the ``podcost`` app."""
    app.command("simulate")(simulate_command)
