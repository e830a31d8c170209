"""The workload snapshot: the one value every strategy, the combiner and the victim model read.

Built once at the boundary from raw Kubernetes JSON (``podcost_core.snapshots``, from pods and
nodes as ``podcost_core.tomodel`` reads them) or decoded from a bus message; never holds a
client-library object. Everything here is a frozen, slotted dataclass so that a snapshot can be
shared between strategies without copies and validated/serialised by pydantic's ``TypeAdapter``
(``podcost_core.snapshots.SNAPSHOT_ADAPTER``) without a second schema.

Times are POSIX seconds (``float``). The API server stores object timestamps with one-second
precision; the victim model relies on that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import NewType

PodUID = NewType("PodUID", str)
NodeName = NewType("NodeName", str)

#: The annotation the ReplicaSet controller reads as rule 4 of its victim ordering.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
#: The field manager podcost writes the annotation with; how it recognises its own writes.
FIELD_MANAGER = "podcost"
#: The field manager of the lablabs pod-deletion-cost-controller's writes. It patches pods with
#: controller-runtime's client without a field owner (internal/zone/handler.go,
#: ``h.client.Patch(ctx, pod, patch)``), so the API server names the manager after the user
#: agent's first word, which client-go takes from the binary's name: ``manager``, as kubebuilder
#: builds it (the project's Makefile: ``go build -o bin/manager cmd/main.go``).
LABLABS_FIELD_MANAGER = "manager"
#: The field managers whose deletion costs podcost takes over by default, besides its own: a
#: controller it replaces. Anything else (kubectl, a person, an unknown tool) is kept.
DEFAULT_ADOPTED_MANAGERS: tuple[str, ...] = (LABLABS_FIELD_MANAGER,)


class Phase(StrEnum):
    """``status.phase`` of a pod."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class QoSClass(StrEnum):
    """``status.qosClass``; ordered from first to go to last to go (seed 004)."""

    BEST_EFFORT = "BestEffort"
    BURSTABLE = "Burstable"
    GUARANTEED = "Guaranteed"


class CostOwner(StrEnum):
    """Who set the deletion cost now on a pod, as far as podcost can tell."""

    NONE = "none"
    """No annotation."""
    PODCOST = "podcost"
    """Written by podcost's field manager, or by one whose costs podcost adopts (a retired
    controller it replaces): podcost's to rewrite."""
    OTHER = "other"
    """Set by a person or another tool: podcost leaves it alone unless told otherwise."""


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource amount: CPU in millicores, memory in bytes, a pod count."""

    cpu_milli: int = 0
    memory_bytes: int = 0
    pods: int = 0


@dataclass(frozen=True, slots=True)
class Taint:
    """One ``spec.taints`` entry of a node."""

    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class Toleration:
    """One ``spec.tolerations`` entry of a pod. Empty ``key`` with ``Exists`` tolerates all."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Whether this toleration tolerates ``taint`` (``v1.Toleration.ToleratesTaint``)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        # "Equal" (or empty, which the API defaults to Equal); an empty key requires Exists.
        return bool(self.key) and self.value == taint.value


@dataclass(frozen=True, slots=True)
class AffinityTerm:
    """A pod (anti-)affinity term reduced to what scoring needs.

    ``match_labels`` is the term's ``labelSelector.matchLabels`` plus every ``In`` expression with
    one value; a term whose selector cannot be reduced that way is kept with ``exact=False`` and
    treated as matching the pod's own workload.
    """

    topology_key: str
    match_labels: Mapping[str, str] = field(default_factory=dict)
    weight: int = 0
    """0 for a required term, 1..100 for a preferred one."""
    exact: bool = True


@dataclass(frozen=True, slots=True)
class Pod:
    """One pod of a workload, with every fact a strategy or the victim model reads."""

    uid: PodUID
    name: str
    namespace: str
    node: NodeName | None
    """``spec.nodeName``; ``None`` while unscheduled."""
    phase: Phase
    ready: bool
    ready_since: float | None
    """``lastTransitionTime`` of the Ready condition when the pod is ready."""
    created: float | None
    """``metadata.creationTimestamp``."""
    replicaset: str | None = None
    """Name of the owning ReplicaSet, if owned by one."""
    owner_uid: str | None = None
    """UID of the controlling owner reference."""
    restarts: int = 0
    """The highest ``restartCount`` of a regular container."""
    sidecar_restarts: int = 0
    """The highest ``restartCount`` of a restartable init container (sidecar)."""
    priority: int = 0
    qos: QoSClass = QoSClass.BEST_EFFORT
    tolerations: tuple[Toleration, ...] = ()
    requests: Resources = Resources()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    deletion_cost: int = 0
    """The cost the controller sees: the annotation parsed as the controller parses it (0 if absent
    or invalid)."""
    deletion_cost_raw: str | None = None
    """The annotation exactly as found, ``None`` if absent."""
    cost_owner: CostOwner = CostOwner.NONE
    deleting: bool = False
    """``metadata.deletionTimestamp`` is set."""
    anti_affinity: tuple[AffinityTerm, ...] = ()

    @property
    def active(self) -> bool:
        """``controller.IsPodActive``: not finished and not being deleted."""
        return self.phase not in (Phase.SUCCEEDED, Phase.FAILED) and not self.deleting


@dataclass(frozen=True, slots=True)
class Node:
    """A node some pod of the snapshot runs on."""

    name: NodeName
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Resources = Resources()
    requested: Resources = Resources()
    """Sum of the requests of every active pod on the node (all workloads), when known."""
    unschedulable: bool = False
    daemon_pods: int = 0
    """How many of the active pods in ``requested.pods`` are DaemonSet or mirror (static) pods:
    they run on every node and leave with it, so Karpenter and the cluster autoscaler call a node
    holding only those empty."""


@dataclass(frozen=True, slots=True)
class WorkloadRef:
    """Which workload a snapshot is of; ``key`` is the bus key ``cluster/namespace/kind/name``."""

    cluster: str
    namespace: str
    kind: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.namespace}/{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class ReplicaSetInfo:
    """One ReplicaSet of the workload, with what the ReplicaSet controller reads about it."""

    name: str
    uid: str = ""
    replicas: int = 1
    """``spec.replicas`` (the API defaults it to 1)."""
    controller_uid: str | None = None
    """UID of its controlling owner (a Deployment). The controller counts co-located pods across
    all ReplicaSets of the same owner (rule 5); a ReplicaSet without an owner counts none."""
    created: float | None = None
    """``metadata.creationTimestamp``."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole current view of one workload: its pods and the nodes they run on."""

    workload: WorkloadRef
    pods: tuple[Pod, ...]
    nodes: Mapping[str, Node] = field(default_factory=dict)
    replicas: int | None = None
    """``spec.replicas`` of the workload, when known."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The workload's annotations (its opt-in and policy)."""
    version: int = 0
    """Per-workload snapshot version; grows with every published change."""
    taken_at: float = 0.0
    """When the snapshot was taken (POSIX seconds): "now" for age-based strategies."""
    replicasets: Mapping[str, ReplicaSetInfo] = field(default_factory=dict)
    """The workload's ReplicaSets by name (for a Deployment, every one it owns, also those
    scaled to zero), when known."""
    bystanders: tuple[Pod, ...] = ()
    """Active pods the workload does not own but that its ReplicaSets' selectors match. Not to be
    ranked; the ReplicaSet controller counts them in its co-location rank (rule 5)."""

    def node_of(self, pod: Pod) -> Node | None:
        """The node ``pod`` runs on, if scheduled and known."""
        return self.nodes.get(pod.node) if pod.node is not None else None


@dataclass(frozen=True, slots=True)
class Unread:
    """The fields of a snapshot's pods and nodes that a reader never reads, so that its decoder
    may leave them at their defaults instead of building them (``podcost_contracts.messages.
    decode_workload_record``): what the aggregator's decisions read is much less than what the
    rankers read (``podcost_core.aggregate.DECISION_UNREAD``). Only fields with a default can be
    left unread; a name that is not one is an error here, not a silent no-op."""

    pod: frozenset[str] = frozenset()
    node: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for cls, names in ((Pod, self.pod), (Node, self.node)):
            defaulted = {
                item.name
                for item in fields(cls)
                if item.default is not MISSING or item.default_factory is not MISSING
            }
            unknown = sorted(names - defaulted)
            if unknown:
                raise ValueError(f"{cls.__name__} has no field with a default named {unknown}")
