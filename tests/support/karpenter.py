"""Karpenter in the loop: its node pools, and a ledger of what it and the controller did.

Used by the node-autoscaler e2e tests (``tests/e2e/test_karpenter_consolidation.py``) and their
benchmark (``tests/bench/bench_karpenter.py``). A control plane of its own (``cluster.start``) runs
Karpenter with its kwok provider (``podcost_localinfra.karpenter``): every node there is one
Karpenter made, so a scenario's node count is Karpenter's.

The oracle is the API server, not podcost's model: :class:`Ledger` watches Karpenter's nodes
(zone, capacity type, when made, when tainted ``karpenter.sh/disrupted``, when gone) and the
scenario's pods (which node, and whether a pod went by the Eviction API — the API server marks
such a pod ``DisruptionTarget`` / ``EvictionByEvictionAPI`` — or by the ReplicaSet controller's
delete). A node that left without one eviction was removed empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from podcost_localinfra import cluster, karpenter
from podcost_localinfra.karpenter import ZONES as ZONES
from tests.support.kube import CAPACITY_LABEL, COST_ANNOTATION, ZONE_LABEL, KubeTestCluster

NODEPOOL_LABEL = "karpenter.sh/nodepool"
DISRUPTED_TAINT = "karpenter.sh/disrupted"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
KARPENTER = ("karpenter.sh", "v1")
KWOK = ("karpenter.kwok.sh", "v1alpha1")
NODE_CLASS = "default"
#: What one scenario pod requests: four fit on a node of the offered type (3.9 allocatable CPUs).
POD_CPU = "900m"
POD_MEMORY = "1Gi"
#: The window over which :attr:`Outcome.node_minutes_saved` counts, seconds.
SAVINGS_HORIZON = 600.0
EVALUATIONS = "karpenter_voluntary_disruption_decision_evaluation_duration_seconds_count"


@dataclass(frozen=True)
class Autoscaled:
    """A control plane of its own with Karpenter running against it."""

    plane: cluster.Cluster
    karpenter: karpenter.Karpenter

    def stop(self) -> None:
        """Karpenter first (so it makes no node while the control plane goes), then the rest."""
        self.karpenter.stop()
        self.plane.stop()


def start_autoscaled(run_dir: Path) -> Autoscaled:
    """Start a control plane in ``run_dir/plane`` and Karpenter against it in
    ``run_dir/karpenter``; stop what started if the rest fails."""
    plane = cluster.start(run_dir / "plane")
    try:
        return Autoscaled(plane, karpenter.start(run_dir / "karpenter", plane.run_dir))
    except BaseException:
        plane.stop()
        raise


async def node_class(api: ApiClient) -> None:
    """The KWOKNodeClass every pool uses (its CRD defaults its status to Ready)."""
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": "/".join(KWOK), "kind": "KWOKNodeClass", "metadata": {"name": NODE_CLASS}}
    with contextlib.suppress(ApiException):
        await custom.create_cluster_custom_object(*KWOK, "kwoknodeclasses", body)


async def node_pool(
    api: ApiClient,
    name: str,
    *,
    capacity_types: Sequence[str] = ("spot", "on-demand"),
    zones: Sequence[str] | None = None,
    consolidate_after: str = "5s",
    budget: str = "100%",
    weight: int | None = None,
    cpu_limit: str | None = None,
) -> None:
    """A NodePool over the KWOKNodeClass: consolidation ``WhenEmptyOrUnderutilized`` after
    ``consolidate_after``, ``budget`` of its nodes disruptable at once, nodes of
    ``capacity_types`` in ``zones`` (default: every zone offered)."""
    requirements: list[dict[str, Any]] = [
        {"key": CAPACITY_LABEL, "operator": "In", "values": list(capacity_types)}
    ]
    if zones:
        requirements.append({"key": ZONE_LABEL, "operator": "In", "values": list(zones)})
    spec: dict[str, Any] = {
        "template": {
            "spec": {
                "nodeClassRef": {"group": KWOK[0], "kind": "KWOKNodeClass", "name": NODE_CLASS},
                "requirements": requirements,
                "expireAfter": "Never",
            }
        },
        "disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": consolidate_after,
            "budgets": [{"nodes": budget}],
        },
    }
    if weight is not None:
        spec["weight"] = weight
    if cpu_limit is not None:
        spec["limits"] = {"cpu": cpu_limit}
    body = {"apiVersion": "/".join(KARPENTER), "kind": "NodePool",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip
    await client.CustomObjectsApi(api).create_cluster_custom_object(*KARPENTER, "nodepools", body)


async def delete_node_pools(api: ApiClient, kube: KubeTestCluster) -> None:
    """Delete every NodePool and wait until Karpenter has removed all its nodes."""
    custom = client.CustomObjectsApi(api)
    pools = await custom.list_cluster_custom_object(*KARPENTER, "nodepools")
    for pool in pools["items"]:
        with contextlib.suppress(ApiException):
            await custom.delete_cluster_custom_object(
                *KARPENTER, "nodepools", pool["metadata"]["name"]
            )

    async def none_left() -> bool:
        claims = await custom.list_cluster_custom_object(*KARPENTER, "nodeclaims")
        return not claims["items"] and not await karpenter_nodes(kube)

    await kube.wait_for(none_left, "Karpenter's nodes and NodeClaims gone", timeout=180)


async def karpenter_nodes(kube: KubeTestCluster) -> list[Any]:
    """The nodes Karpenter made (``V1Node``), those being deleted included."""
    return list((await kube.core.list_node(label_selector=NODEPOOL_LABEL)).items)


def pod_spec(app: str = "web", *, spread_zones: bool = False) -> dict[str, Any]:
    """The scenario pods' extra spec: requests that fit four to a node; with ``spread_zones`` a
    zone topology spread constraint (max skew 1), which Karpenter provisions nodes to meet."""
    resources = {"requests": {"cpu": POD_CPU, "memory": POD_MEMORY}}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "app", "image": "registry.local/podcost/app:1", "resources": resources}
        ]
    }
    if spread_zones:
        spec["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": ZONE_LABEL, "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": app}}}
        ]  # fmt: skip
    return spec


def karpenter_evaluations(metrics_url: str) -> float:
    """How many disruption loops Karpenter has run through to its last method, single-node
    consolidation, without acting (its own counter; a loop that acts stops before it)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(EVALUATIONS) and 'consolidation_type="single"' in line
    )


DISRUPTED = "karpenter_nodeclaims_disrupted_total"


def karpenter_disrupted(metrics_url: str, reason: str) -> float:
    """How many NodeClaims Karpenter has disrupted for ``reason`` (``empty``, ``underutilized``,
    ``drifted`` ...), by its own counter."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(DISRUPTED) and f'reason="{reason}"' in line
    )


def eviction_cost(pod: Any) -> float:
    """Karpenter's cost of evicting ``pod`` (``V1Pod``), as its ``EvictionCost`` reads the
    pod's deletion cost and priority: ``clamp(1 + cost/2^27 + priority/2^25, -10, 10)``."""
    cost = 1.0
    raw = (pod.metadata.annotations or {}).get(COST_ANNOTATION)
    if raw is not None:
        with contextlib.suppress(ValueError):
            cost += float(raw) / 2**27
    if pod.spec.priority is not None:
        cost += pod.spec.priority / 2**25
    return min(10.0, max(-10.0, cost))


def reschedule_cost(pods: Sequence[Any]) -> float:
    """Karpenter's ``RescheduleDisruptionCost`` of a node running ``pods``: 1 + the sum of the
    positive eviction costs. At 1 or below Karpenter calls the node empty (``IsEmpty``) and its
    Emptiness method deletes it, pods and all."""
    return 1.0 + sum(max(0.0, eviction_cost(pod)) for pod in pods)


@dataclass
class NodeRecord:
    """One node Karpenter made, as the API server told it."""

    name: str
    zone: str
    capacity_type: str
    pool: str
    claim: str
    """Its NodeClaim (the kwok provider names the node's hostname label after it)."""
    created: float
    disrupted: float | None = None
    """When it was first seen tainted ``karpenter.sh/disrupted`` (monotonic)."""
    deleted: float | None = None


@dataclass(frozen=True)
class PodDeletion:
    """One scenario pod gone: where it ran and how it went."""

    name: str
    node: str | None
    evicted: bool
    """Deleted through the Eviction API (Karpenter's drain), not by the ReplicaSet controller."""
    at: float


@dataclass
class Ledger:
    """What Karpenter and the controller did during a scenario (see the module docstring)."""

    kube: KubeTestCluster
    namespace: str
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    deletions: dict[str, PodDeletion] = field(default_factory=dict)
    last_change: float = field(default_factory=time.monotonic)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def __aenter__(self) -> Ledger:
        core = self.kube.core
        self._tasks = [
            asyncio.create_task(
                self._follow(core.list_node, {"label_selector": NODEPOOL_LABEL}, self._on_node)
            ),
            asyncio.create_task(
                self._follow(core.list_namespaced_pod, {"namespace": self.namespace}, self._on_pod)
            ),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(
        self,
        listing: Callable[..., Any],
        args: dict[str, str],
        handle: Callable[[str, Any], None],
    ) -> None:
        """List, then watch from the list's resource version on, resuming each watch where the
        last one ended, so no event is lost between two watches; relist (and reconcile) only
        when the API server has compacted that version away."""
        version: str | None = None
        while True:
            if version is None:
                listed = await listing(**args)
                handle("LISTED", listed.items)
                version = listed.metadata.resource_version
            # The API function itself (not a wrapper): the watch reads its return type from it
            # to decode the events' objects.
            stream = watch.Watch().stream(
                listing, resource_version=version, timeout_seconds=60, **args
            )
            try:
                async with stream:
                    async for event in stream:
                        if event["type"] == "ERROR":
                            version = None
                            break
                        handle(event["type"], event["object"])
                        version = event["object"].metadata.resource_version
            except ApiException as error:
                if error.status != 410:
                    raise
                version = None

    def _on_node(self, kind: str, node: Any) -> None:
        if kind == "LISTED":
            present = {item.metadata.name for item in node}
            for record in self.live_nodes():
                if record.name not in present:
                    record.deleted = time.monotonic()
                    self.last_change = record.deleted
            for item in node:
                self._node(item)
            return
        self._node(node, deleted=kind == "DELETED")

    def _on_pod(self, kind: str, pod: Any) -> None:
        if kind == "DELETED":
            self._pod_gone(pod)

    def _node(self, node: Any, deleted: bool = False) -> None:
        labels = node.metadata.labels or {}
        name = node.metadata.name
        now = time.monotonic()
        record = self.nodes.get(name)
        if record is None:
            record = NodeRecord(
                name, labels.get(ZONE_LABEL, ""), labels.get(CAPACITY_LABEL, ""),
                labels.get(NODEPOOL_LABEL, ""), labels.get("kubernetes.io/hostname", ""), now,
            )  # fmt: skip
            self.nodes[name] = record
            self.last_change = now
        taints = (node.spec.taints if node.spec else None) or []
        if record.disrupted is None and any(t.key == DISRUPTED_TAINT for t in taints):
            record.disrupted = now
            self.last_change = now
        if deleted and record.deleted is None:
            record.deleted = now
            self.last_change = now

    def _pod_gone(self, pod: Any) -> None:
        conditions = (pod.status.conditions if pod.status else None) or []
        evicted = any(
            c.type == "DisruptionTarget" and c.reason == "EvictionByEvictionAPI" for c in conditions
        )
        name = pod.metadata.name
        self.deletions[name] = PodDeletion(name, pod.spec.node_name, evicted, time.monotonic())

    def live_nodes(self) -> list[NodeRecord]:
        return [record for record in self.nodes.values() if record.deleted is None]

    def evictions(self, since: float = 0.0) -> list[PodDeletion]:
        return [d for d in self.deletions.values() if d.evicted and d.at >= since]

    def removed(self, since: float) -> list[NodeRecord]:
        return [r for r in self.nodes.values() if r.deleted is not None and r.deleted >= since]

    def removed_empty(self, since: float) -> list[NodeRecord]:
        """Nodes gone since ``since`` without one of the scenario's pods evicted from them."""
        evicted_from = {d.node for d in self.evictions(since)}
        return [r for r in self.removed(since) if r.name not in evicted_from]


async def wait_stable(
    ledger: Ledger,
    metrics_url: str,
    *,
    quiet: float,
    since: float = 0.0,
    rounds: int = 2,
    timeout: float = 600,
) -> float:
    """Wait until Karpenter's nodes stop changing: ``quiet`` seconds (the pool's
    ``consolidateAfter``) since the last node made, tainted or removed (or since ``since``, the
    pods' last change, when later), and then ``rounds`` more of Karpenter's disruption loops
    that found nothing to do. Returns the monotonic time of the last change."""
    deadline = time.monotonic() + timeout
    while True:
        mark = ledger.last_change
        start = max(mark, since)
        while time.monotonic() < start + quiet:
            await asyncio.sleep(0.5)
            if ledger.last_change != mark:
                mark = start = ledger.last_change
        base = await asyncio.to_thread(karpenter_evaluations, metrics_url)
        while (
            ledger.last_change == mark
            and await asyncio.to_thread(karpenter_evaluations, metrics_url) < base + rounds
        ):
            if time.monotonic() > deadline:
                raise AssertionError("Karpenter's node count never settled")
            await asyncio.sleep(0.5)
        if ledger.last_change == mark and not any(
            r.disrupted is not None for r in ledger.live_nodes()
        ):
            return mark
        if time.monotonic() > deadline:
            raise AssertionError("Karpenter's node count never settled")


async def disruption_reasons(kube: KubeTestCluster) -> dict[str, str]:
    """Node name → the reason Karpenter's own ``DisruptionTerminating`` event gives for
    disrupting it (``Empty``, ``Underutilized``, ...), read from its message
    ``Disrupting Node: <reason>``."""
    listed = await kube.core.list_event_for_all_namespaces(
        field_selector="reason=DisruptionTerminating,involvedObject.kind=Node"
    )
    return {
        event.involved_object.name: (event.message or "").rpartition(": ")[2]
        for event in listed.items
    }


def zone_skew(counts: Mapping[str, int]) -> int:
    """Max minus min over the zones (a zone absent from ``counts`` counts 0)."""
    return max(counts.values()) - min(counts.values()) if counts else 0


@dataclass(frozen=True)
class Outcome:
    """One scale-in and Karpenter's answer to it, as the API server recorded them."""

    nodes_before: int
    nodes_after: int
    removed: int
    removed_empty: int
    """Nodes Karpenter removed without evicting one of the scenario's pods."""
    evictions: int
    """The scenario's pods Karpenter evicted (drains), after the scale-in."""
    settle_seconds: float
    """From the scale-in to the last change of Karpenter's nodes."""
    pod_zone_skew: int
    """Max minus min of the workload's pods per offered zone, once settled."""
    deleted: frozenset[str]
    """The pods the ReplicaSet controller deleted for the scale-in."""
    removed_empty_capacity: tuple[str, ...] = ()
    """The capacity types of the nodes removed empty, sorted."""
    kept_capacity: tuple[str, ...] = ()
    """The capacity types of the nodes left, sorted."""
    node_minutes_saved: float = 0.0
    """Node-minutes the scale-in saved in the 10 minutes after it: each node removed counts the
    minutes left of the 10 when it went, each node made after it (a replacement) the minutes
    it ran."""
    seen_empty: int = 0
    """Nodes still running pods of the workload after the controller's scale-in that Karpenter
    reads as empty (their pods' deletion costs bring its reschedule cost to 1 or below)."""
    podcost: str = "none"
    """How podcost ran, and the band of its costs (e.g. ``fleet, [0, 2^27)``)."""

    def row(self) -> dict[str, float | int | str]:
        return {
            "podcost": self.podcost,
            "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
            "removed": self.removed, "removed_empty": self.removed_empty,
            "evictions": self.evictions, "settle_s": round(self.settle_seconds, 1),
            "pod_zone_skew": self.pod_zone_skew, "seen_empty": self.seen_empty,
            "node_min_saved_10m": round(self.node_minutes_saved, 1),
        }  # fmt: skip


async def scale_in(
    ledger: Ledger,
    metrics_url: str,
    app: str,
    replicas: int,
    *,
    zones: Sequence[str],
    quiet: float,
    timeout: float = 600,
    after_scale_in: Callable[[], Awaitable[None]] | None = None,
) -> Outcome:
    """Scale ``app`` of the ledger's namespace to ``replicas``, wait until the controller is
    done (then ``after_scale_in``) and Karpenter's nodes are stable (:func:`wait_stable`), and
    say what happened."""
    kube, namespace = ledger.kube, ledger.namespace
    before = len(ledger.live_nodes())
    started = time.monotonic()
    deleted = await kube.scale_and_observe(namespace, app, replicas, timeout=120)
    by_node: dict[str, list[Any]] = {}
    for pod in await kube.active_pods(namespace, app):
        by_node.setdefault(pod.node or "", []).append(pod.raw)
    seen_empty = sum(1 for pods in by_node.values() if reschedule_cost(pods) <= 1.0)
    if after_scale_in is not None:
        await after_scale_in()
    last = await wait_stable(
        ledger, metrics_url, quiet=quiet, since=time.monotonic(), timeout=timeout
    )
    await kube.wait_ready(namespace, app, replicas, timeout=120)
    zone_of = {record.name: record.zone for record in ledger.live_nodes()}
    per_zone = dict.fromkeys(zones, 0)
    for pod in await kube.active_pods(namespace, app):
        per_zone[zone_of[pod.node or ""]] += 1
    horizon = started + SAVINGS_HORIZON
    saved = sum(max(0.0, horizon - (r.deleted or horizon)) for r in ledger.removed(started))
    spent = sum(
        max(0.0, horizon - r.created) for r in ledger.nodes.values() if r.created >= started
    )
    return Outcome(
        nodes_before=before,
        nodes_after=len(ledger.live_nodes()),
        removed=len(ledger.removed(started)),
        removed_empty=len(ledger.removed_empty(started)),
        evictions=len(ledger.evictions(started)),
        settle_seconds=max(0.0, last - started),
        pod_zone_skew=zone_skew(per_zone),
        deleted=frozenset(deleted),
        removed_empty_capacity=tuple(
            sorted(r.capacity_type for r in ledger.removed_empty(started))
        ),
        kept_capacity=tuple(sorted(r.capacity_type for r in ledger.live_nodes())),
        seen_empty=seen_empty,
        node_minutes_saved=(saved - spent) / 60,
    )
