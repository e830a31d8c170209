"""``podcost explain NAMESPACE/POD``: why a pod carries the deletion cost it carries.

Shows the pod's ``controller.kubernetes.io/pod-deletion-cost`` now (and who set it), and the
decision behind it: the workload and snapshot version, each strategy's raw and normalized score,
weight and tier, the tier sums and the pod's place in the combined deletion order, and the trace
id of the decision (and of the one whose write set the current value). The decision comes from
the annotator, which keeps the last one per pod (``GET /explain/{namespace}/{pod}`` on its HTTP
port, ``--url``; with the bearer token ``PODCOST_EXPLAIN_TOKEN`` when the annotator requires
one; or through the API server's proxy of its Service, ``--service``, as ``kubectl`` reaches a
Service, with no port-forward), or with ``--kafka`` from the latest desired-costs message for
the pod on the costs topic. With ``--trace-ui`` (``PODCOST_TRACE_UI_URL``), the base URL of a
Jaeger UI, each trace id comes with its link there (``<base>/trace/<id>``). When no decision is
known, it says so and shows what the pure core decides now from the workload as the cluster
holds it (the watcher's conversion, ``rank`` and ``label_costs``), labelled as computed now.
``podcost.cli`` registers it; it writes nothing anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, cast

import typer
from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console
from rich.table import Table

from podcost.aggregator.processor import desired_costs
from podcost.annotator.decisions import Explanation, explanations, trace_id_of
from podcost.commands.options import (
    DEFAULT_OUTPUT,
    ContextOption,
    KubeconfigOption,
    OutputOption,
    emit,
)
from podcost.commands.startup import EXIT_FAILED, fail, load_settings
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusError, BusSettings, open_bus
from podcost_contracts.messages import DecodeError, DesiredCostsMessage, InvalidKey, decode
from podcost_contracts.messages import WorkloadKey as BusKey
from podcost_core.aggregate import Decision
from podcost_core.combine import ScoreContractError, rank
from podcost_core.explain import Placement
from podcost_core.implied import drop_implied
from podcost_core.kubejson import ConversionError, ObjectMetaJSON
from podcost_core.labels import band_for, current_costs, label_costs
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_core.policy import PolicyError
from podcost_core.tomodel import cost_owner
from podcost_kube.client import Kube, KubeError, PodGone, connect
from podcost_kube.snapshots import workload_snapshot
from podcost_kube.store import Store
from podcost_kube.workloads import workload_policy, workloads_of_pod

COMMAND = "explain"
DEFAULT_URL = "http://127.0.0.1:8080"
#: How long reading the costs topic to its end may take.
KAFKA_TIMEOUT_S = 60.0

EPILOG = """**Examples**

```
podcost explain shop/web-5d8f7-x2x9k                 # the annotator on :8080
podcost explain shop/web-5d8f7-x2x9k --url http://podcost.podcost-system:8080
podcost explain shop/web-5d8f7-x2x9k --service podcost/podcost-annotator   # via the API server
podcost explain shop/web-5d8f7-x2x9k --kafka kafka:9092   # the costs topic
podcost explain shop/web-5d8f7-x2x9k --output json
podcost explain shop/web-5d8f7-x2x9k --trace-ui https://jaeger.example.com   # trace links
podcost explain -n shop web-5d8f7-x2x9k -o yaml --context prod
PODCOST_EXPLAIN_TOKEN=... podcost explain shop/web-5d8f7-x2x9k   # when the annotator has one
```

Cluster access: `$KUBECONFIG`, `~/.kube/config` or the in-cluster service account. Exits 1 with
one line when the pod, the cluster, the annotator or Kafka cannot be reached.
"""


class Report(BaseModel):
    """What ``podcost explain`` found; ``--output json`` prints it as it is."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    pod: str
    uid: str
    annotation: str | None
    """The deletion cost on the pod now, as written (``None``: none)."""
    set_by: str
    """``podcost`` (its own field manager, or one it adopts: ``PODCOST_ADOPT_FIELD_MANAGERS``),
    ``other`` (a person or another tool) or ``none``."""
    asked: str
    """Where the decision was looked up: the annotator's URL or the costs topic."""
    decision: Explanation | None
    """The last decision podcost made about the pod, if known there."""
    computed_now: Explanation | None = None
    """When no decision is known: what the pure core decides now (not a written decision)."""
    note: str | None = None
    """Why there is no decision, or why nothing could be computed."""
    trace_url: str | None = None
    """The decision's trace in the Jaeger UI (``--trace-ui``; ``None``: no UI given or no
    trace)."""
    written_trace_url: str | None = None
    """The trace of the write that set the current value, in the Jaeger UI."""


def trace_link(base: str | None, trace_id: str | None) -> str | None:
    """The Jaeger UI's page of a trace: ``<base>/trace/<id>`` (``None`` without both)."""
    if not base or not trace_id:
        return None
    return f"{base.rstrip('/')}/trace/{trace_id}"


# --- finding the decision -----------------------------------------------------------------------


def _split_pod(value: str) -> tuple[str, str]:
    namespace, slash, name = value.partition("/")
    if not slash or not namespace or not name or "/" in name:
        fail(COMMAND, f"{value!r} is not NAMESPACE/POD")
    return namespace, name


class TokenRefused(OSError):
    """The annotator answered 401: its ``/explain`` needs the token ``PODCOST_EXPLAIN_TOKEN``."""


def ask_annotator(
    url: str, namespace: str, pod: str, timeout: float = 10.0, *, token: str | None = None
) -> Explanation | None:
    """The annotator's last decision about the pod (``None`` on 404), sending ``token`` as a
    bearer token when given; ``OSError`` when the service cannot be reached or refuses the
    token, ``ValueError`` when its answer is not an explanation."""
    path = f"/explain/{urllib.parse.quote(namespace, safe='')}/{urllib.parse.quote(pod, safe='')}"
    request = urllib.request.Request(url.rstrip("/") + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        if error.code == 401:
            given = "a wrong" if token is not None else "no"
            raise TokenRefused(
                f"the annotator at {url} requires a bearer token (HTTP 401) and {given} "
                "PODCOST_EXPLAIN_TOKEN was given"
            ) from error
        raise OSError(f"HTTP {error.code} {error.reason}") from error
    try:
        return Explanation.model_validate_json(body)
    except ValidationError as error:
        raise ValueError(
            f"the answer is not an explanation: {error.error_count()} errors"
        ) from error


async def read_costs_topic(
    bus_settings: BusSettings,
    cluster: str,
    namespace: str,
    pod: str,
    uid: str,
    limit_s: float = KAFKA_TIMEOUT_S,
) -> Explanation | None:
    """The latest decision about the pod on ``cluster``'s costs topic, read to its end as a
    consumer group of its own that commits nothing. Only the pod's namespace's records are
    decoded."""
    topic = bus_settings.topics.costs_for(cluster)
    best: tuple[float, Explanation] | None = None
    deadline = time.monotonic() + limit_s
    async with open_bus(bus_settings) as bus:
        group = f"podcost-explain-{uuid.uuid4().hex[:12]}"
        async with bus.consumer([topic], group=group, offset_reset="earliest") as consumer:
            while True:
                for record in await consumer.poll(max_wait=0.5):
                    try:
                        if BusKey.parse(record.key).namespace != namespace:
                            continue
                        message = decode(
                            DesiredCostsMessage, record.value, record.headers, key=record.key
                        )
                    except (InvalidKey, DecodeError):
                        continue  # not ours to judge: the annotator dead-letters it
                    if not any(cost.uid == uid for cost in message.costs):
                        continue
                    if best is None or message.emitted_at >= best[0]:
                        trace_id = trace_id_of(record.headers)
                        found = explanations(message, trace_id=trace_id, source="costs topic")
                        mine = next(item for item in found if item.uid == uid)
                        best = (message.emitted_at, mine)
                assigned = consumer.assignment()
                lags = await consumer.lag()
                if assigned and set(lags) == set(assigned) and not any(lags.values()):
                    return best[1] if best is not None else None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not read topic {topic} to its end in {limit_s:.0f}s")


def split_service(value: str, default_namespace: str) -> tuple[str, str, str]:
    """``[NAMESPACE/]NAME[:PORT]`` as (namespace, name, port); port ``http`` (the chart's)."""
    where, _, port = value.partition(":")
    namespace, slash, name = where.rpartition("/")
    if not name or (slash and not namespace) or "/" in namespace:
        fail(COMMAND, f"--service {value!r} is not [NAMESPACE/]NAME[:PORT]")
    return namespace or default_namespace, name, port or "http"


async def ask_through_api_server(
    kube: Kube, service: tuple[str, str, str], namespace: str, pod: str
) -> Explanation | None:
    """The annotator's last decision about the pod, asked through the API server's proxy of
    ``service`` (namespace, name, port): no port-forward, the user's own credentials."""
    path = f"/explain/{urllib.parse.quote(namespace, safe='')}/{urllib.parse.quote(pod, safe='')}"
    try:
        answer = await kube.get_through_service(*service, path)
    except KubeError as error:
        if error.status == 401:
            raise TokenRefused(
                "the annotator requires its bearer token, which the API server's proxy cannot "
                "pass on (the API server takes the Authorization header for itself): ask it with "
                "--url over a port-forward, or read the costs topic with --kafka"
            ) from error
        raise
    if answer is None:
        return None
    try:
        return Explanation.model_validate(answer)
    except ValidationError as error:
        raise ValueError(
            f"the answer is not an explanation: {error.error_count()} errors"
        ) from error


async def compute_now(
    kube: Kube, namespace: str, pod: dict[str, Any], settings: ServiceSettings
) -> tuple[Explanation | None, str | None]:
    """What the pure core decides for the pod now, from the cluster as it is: its workload's
    snapshot as the watcher builds it, ranked with its policy; or why that cannot be done."""
    watcher = load_settings(COMMAND, WatcherSettings)
    try:
        rules = watcher.opt_in_rules(settings)
    except (PolicyError, ValueError) as error:
        fail(COMMAND, str(error))
    store = Store()
    # What the watcher sees: its namespace, or every namespace (pods of other workloads on the
    # same nodes count for node-consolidation).
    for kind, items in _by_kind(await kube.dump(watcher.namespace)).items():
        store.replace(kind, items)
    if rules.namespace_selector is not None:
        try:
            raw_namespace = kube.to_json(await kube.core.read_namespace(namespace))
        except Exception as error:  # the client's ApiException, which only podcost_kube names
            raise KubeError(f"reading namespace {namespace}: {error}") from error
        store.replace("Namespace", [{"kind": "Namespace", **raw_namespace}])
    keys = sorted(workloads_of_pod(store, pod))
    if not keys:
        return None, "the pod belongs to no Deployment or ReplicaSet podcost could rank"
    key = keys[0]
    policy = workload_policy(store, key, rules)
    name = f"{key.kind} {key.namespace}/{key.name}"
    if policy.error is not None:
        return None, f"{name} has an invalid policy: {policy.error}"
    if not policy.enabled or policy.policy is None:
        return None, f"{name} is not opted in ({policy.source})"
    now = time.time()
    try:
        snapshot = workload_snapshot(store, key, cluster=settings.cluster, taken_at=now)
        combined = rank(snapshot, policy.policy)
    except (ConversionError, ScoreContractError) as error:
        return None, f"{name} cannot be ranked now: {error}"
    current = current_costs(snapshot.pods)
    replicaset_of = {p.uid: p.replicaset for p in snapshot.pods}
    band = band_for(policy.policy.non_negative_costs)
    labelling = label_costs(combined.order, replicaset_of, current, band=band)
    labelling = drop_implied(labelling, combined.order, snapshot, current, band=band)
    decision = Decision(key.bus_key(settings.cluster), snapshot, combined, labelling, current)
    message = desired_costs(decision, emitted_at=now)
    uid = str(pod.get("metadata", {}).get("uid", ""))
    found = [e for e in explanations(message, trace_id=None, source="computed now") if e.uid == uid]
    if not found:
        return None, f"the pod is not ranked in {name} (it is finished or being deleted)"
    return found[0], None


def _by_kind(dump: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {
        "Pod": [],
        "Node": [],
        "ReplicaSet": [],
        "Deployment": [],
    }
    for item in dump.get("items", []):
        kinds.setdefault(str(item.get("kind")), []).append(item)
    return kinds


async def explain(
    namespace: str,
    name: str,
    *,
    url: str,
    bus_settings: BusSettings | None,
    settings: ServiceSettings,
    kubeconfig: str | None = None,
    context: str | None = None,
    trace_ui: str | None = None,
    service: tuple[str, str, str] | None = None,
) -> Report:
    """Everything ``podcost explain`` shows (see the module docstring)."""
    async with connect(kubeconfig, context) as kube:
        pod = dict(await kube.read_pod(namespace, name))
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if bus_settings is not None:
            topic = bus_settings.topics.costs_for(settings.cluster)
            asked = f"topic {topic} at {bus_settings.bootstrap_servers}"
            decision = await read_costs_topic(bus_settings, settings.cluster, namespace, name, uid)
        elif service is not None:
            asked = "the annotator at service {}/{}:{} through the API server".format(*service)
            decision = await ask_through_api_server(kube, service, namespace, name)
            if decision is not None and decision.uid != uid:
                decision = None  # about an earlier pod of the same name
        else:
            asked = f"the annotator at {url}"
            try:
                token = settings.explain_token
                decision = await asyncio.to_thread(
                    ask_annotator, url, namespace, name,
                    token=token.get_secret_value() if token is not None else None,
                )  # fmt: skip
            except TokenRefused:
                raise
            except OSError as error:
                reason = getattr(error, "reason", None) or error
                raise OSError(
                    f"cannot reach the podcost annotator at {url} ({reason}); "
                    "point --url at it, or read the costs topic with --kafka HOST:PORT"
                ) from error
            if decision is not None and decision.uid != uid:
                decision = None  # about an earlier pod of the same name
        report = Report(
            namespace=namespace,
            pod=name,
            uid=uid,
            annotation=(meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION),
            set_by=cost_owner(cast(ObjectMetaJSON, meta), settings.adopted).value,
            asked=asked,
            decision=decision,
        )
        if decision is not None:
            written = decision.written.trace_id if decision.written is not None else None
            return report.model_copy(update={
                "trace_url": trace_link(trace_ui, decision.trace_id),
                "written_trace_url": trace_link(trace_ui, written),
            })  # fmt: skip
        computed, why = await compute_now(kube, namespace, pod, settings)
        note = f"no decision known for pod {namespace}/{name} at {asked}"
        if why is not None:
            note += f"; nothing computed now: {why}"
        return report.model_copy(update={"computed_now": computed, "note": note})


# --- rendering ----------------------------------------------------------------------------------


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def render(report: Report, console: Console) -> None:
    """The report as text and rich tables."""
    console.print(f"[bold]pod {report.namespace}/{report.pod}[/bold]  uid {report.uid}")
    if report.annotation is None:
        console.print("  deletion cost now: none")
    else:
        console.print(f"  deletion cost now: {report.annotation} (set by {report.set_by})")
    if report.note is not None:
        console.print(report.note, highlight=False)
    explanation = report.decision or report.computed_now
    if explanation is None:
        return
    if report.decision is not None:
        console.print(f"Last decision (from {report.asked}):", highlight=False)
    else:
        console.print("[bold yellow]Computed now, not the written decision:[/bold yellow]")
    _render_explanation(explanation, report, console)


def _render_explanation(item: Explanation, report: Report, console: Console) -> None:
    annotation = report.annotation
    decided = datetime.fromtimestamp(item.decided_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="dim")
    summary.add_column()
    summary.add_row("workload", item.workload)
    summary.add_row("snapshot version", str(item.version))
    summary.add_row("decided at", decided)
    previous = "none" if item.previous is None else str(item.previous)
    summary.add_row("cost", f"{item.cost} (was {previous})")
    if annotation is not None and item.source != "computed now":
        same = annotation.strip() == str(item.cost)
        summary.add_row("on the pod", "the same" if same else f"{annotation}: not this decision's")
    if item.result is not None:
        summary.add_row("write", item.result)
    summary.add_row("position", Placement(item.position, item.tied, item.of).describe())
    tiers = sorted({term.tier for term in item.terms})
    sums = zip(tiers, item.tier_sums, strict=False)
    summary.add_row("tier sums", ", ".join(f"tier {tier}: {points}" for tier, points in sums))
    if item.complete:
        summary.add_row("strategies", "all answered")
    else:
        summary.add_row("strategies", f"decided without {', '.join(item.missing)}")
    if item.source != "computed now":
        summary.add_row("trace id", item.trace_id or "none (the decision carried no trace)")
        if report.trace_url is not None:
            summary.add_row("trace", report.trace_url)
    if item.written is not None:
        summary.add_row(
            "cost written by",
            f"version {item.written.version}, cost {item.written.cost}, "
            f"trace {item.written.trace_id or 'none'}",
        )
        if report.written_trace_url is not None:
            summary.add_row("its trace", report.written_trace_url)
    console.print(summary)
    terms = Table(title="Each strategy's part (pods are deleted lowest tier sums first)")
    for column, justify in (
        ("strategy", "left"), ("tier", "right"), ("weight", "right"), ("raw", "right"),
        ("normalized", "right"), ("points", "right"),
    ):  # fmt: skip
        terms.add_column(column, justify=justify)  # type: ignore[arg-type]
    for term in sorted(item.terms, key=lambda t: (t.tier, -t.points, t.strategy)):
        terms.add_row(
            term.strategy, str(term.tier), str(term.weight), _number(term.raw),
            str(term.normalized), str(term.points),
        )  # fmt: skip
    console.print(terms)


# --- the command ----------------------------------------------------------------------------------


def explain_command(
    pod: Annotated[
        str,
        typer.Argument(
            metavar="[NAMESPACE/]POD",
            help="The pod to explain; its namespace from -n when not given here, else default.",
        ),
    ],
    url: Annotated[
        str,
        typer.Option(
            envvar="PODCOST_EXPLAIN_URL",
            help="Where the annotator (or `podcost run`) serves its HTTP port.",
        ),
    ] = DEFAULT_URL,
    kafka: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="Read the latest decision off this cluster's costs topic of this Kafka instead "
            "of asking the annotator (cluster, topic and TLS/SASL settings: PODCOST_CLUSTER, "
            "PODCOST_TOPIC_COSTS, PODCOST_KAFKA_*).",
        ),
    ] = None,
    service: Annotated[
        str | None,
        typer.Option(
            metavar="[NAMESPACE/]NAME[:PORT]",
            help="Ask the annotator through the API server's proxy of its Service (the chart's "
            "<release>-annotator, or <release>-embedded; port http), with your kubeconfig's "
            "credentials (get on services/proxy): no port-forward. Namespace: the pod's.",
        ),
    ] = None,
    output: OutputOption = DEFAULT_OUTPUT,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", help="The pod's namespace (or give NAMESPACE/POD)."),
    ] = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    trace_ui: Annotated[
        str | None,
        typer.Option(
            envvar="PODCOST_TRACE_UI_URL",
            metavar="URL",
            help="Base URL of the Jaeger UI that holds podcost's traces: each trace id is "
            "shown with its link, URL/trace/<id>.",
        ),
    ] = None,
) -> None:
    """Show why a pod carries its deletion cost: every strategy's score, weight and tier, its
    place in the deletion order, and the trace of the decision.

    The decision comes from the annotator's memory of the last decision per pod, or with
    --kafka from the costs topic. When podcost has made none, it says so and shows what it
    would decide now, labelled as computed now.
    """
    if "/" not in pod:  # kubectl's way: -n, else the default namespace
        pod = f"{namespace or 'default'}/{pod}"
    namespace, name = _split_pod(pod)
    # The client library warns before failing ("Config not found"); the error line says it all.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.ERROR)
    settings = load_settings(COMMAND, ServiceSettings)
    bus_settings = None
    if kafka is not None:
        bus_settings = load_settings(COMMAND, BusSettings, bootstrap_servers=kafka)
    try:
        report = asyncio.run(
            explain(
                namespace, name, url=url, bus_settings=bus_settings, settings=settings,
                kubeconfig=kubeconfig, context=context, trace_ui=trace_ui,
                service=split_service(service, namespace) if service is not None else None,
            )
        )  # fmt: skip
    except PodGone:
        fail(COMMAND, f"pod {namespace}/{name} not found", EXIT_FAILED)
    except (KubeError, BusError, OSError, TimeoutError, ValueError) as error:
        fail(COMMAND, str(error), EXIT_FAILED)
    emit(report.model_dump(mode="json"), output, lambda: render(report, Console()))


def register(app: typer.Typer) -> None:
    """Add ``podcost explain`` to ``app``."""
    app.command("explain", epilog=EPILOG)(explain_command)
