"""Raw Kubernetes JSON as podcost reads it: the shapes, their validation, and what the API
machinery means by a few of their fields.

Every module that turns API objects into something else starts here: ``projection`` (what an
informer keeps of an object), ``quantities`` (resource amounts), ``tomodel`` (one pod or node as
the model) and ``snapshots`` (a workload's snapshot from a dump). The objects are the shapes
``kubectl get -o json`` prints (and the API returns) as plain dicts, typed here with
``TypedDict`` and validated by pydantic first, so a malformed dump fails with a
:class:`ConversionError` naming the object, never deeper with a ``KeyError``. Fields read the
way the component that acts on them reads them: timestamps in the API server's whole seconds,
the controller reference as ``metav1.GetControllerOf``, label selectors as
``metav1.LabelSelectorAsSelector``, the deletion cost's owners from ``managedFields``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

# pydantic needs typing_extensions' TypedDict before Python 3.12 (it is pydantic's own dependency).
from typing_extensions import TypedDict

from podcost_core.model import DELETION_COST_ANNOTATION


class ConversionError(ValueError):
    """The input is not the Kubernetes JSON it should be. Permanent: report it, do not retry."""


# --- raw shapes (only the fields podcost reads; pydantic drops the rest) -------------------

Quantity = str | int | float
#: An integer field of the API (``int32`` or ``int64`` there). Bounded here so that a number no
#: API server serves is refused at the boundary instead of riding along in a snapshot that every
#: consumer refuses (JSON parsers stop at 4300 digits).
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class OwnerReferenceJSON(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class ManagedFieldsEntryJSON(TypedDict, total=False):
    manager: str
    operation: str
    time: str
    fieldsType: str
    fieldsV1: dict[str, Any]


class ObjectMetaJSON(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    creationTimestamp: str | None
    deletionTimestamp: str | None
    ownerReferences: list[OwnerReferenceJSON]
    managedFields: list[ManagedFieldsEntryJSON]


class LabelSelectorRequirementJSON(TypedDict, total=False):
    key: str
    operator: str
    values: list[str]


class LabelSelectorJSON(TypedDict, total=False):
    matchLabels: dict[str, str]
    matchExpressions: list[LabelSelectorRequirementJSON]


class ResourceRequirementsJSON(TypedDict, total=False):
    requests: dict[str, Quantity]
    limits: dict[str, Quantity]


class ContainerJSON(TypedDict, total=False):
    name: str
    resources: ResourceRequirementsJSON
    restartPolicy: str


class TolerationJSON(TypedDict, total=False):
    key: str
    operator: str
    value: str
    effect: str


class PodAffinityTermJSON(TypedDict, total=False):
    labelSelector: LabelSelectorJSON | None
    topologyKey: str
    namespaces: list[str]
    namespaceSelector: LabelSelectorJSON | None


class WeightedPodAffinityTermJSON(TypedDict, total=False):
    weight: Int64
    podAffinityTerm: PodAffinityTermJSON


class PodAntiAffinityJSON(TypedDict, total=False):
    requiredDuringSchedulingIgnoredDuringExecution: list[PodAffinityTermJSON]
    preferredDuringSchedulingIgnoredDuringExecution: list[WeightedPodAffinityTermJSON]


class AffinityJSON(TypedDict, total=False):
    podAntiAffinity: PodAntiAffinityJSON


class PodSpecJSON(TypedDict, total=False):
    nodeName: str
    priority: Int64
    tolerations: list[TolerationJSON]
    containers: list[ContainerJSON]
    initContainers: list[ContainerJSON]
    affinity: AffinityJSON
    resources: ResourceRequirementsJSON
    overhead: dict[str, Quantity]


class ConditionJSON(TypedDict, total=False):
    type: str
    status: str
    lastTransitionTime: str | None


class ContainerStatusJSON(TypedDict, total=False):
    name: str
    restartCount: Int64


class PodStatusJSON(TypedDict, total=False):
    phase: str
    conditions: list[ConditionJSON]
    containerStatuses: list[ContainerStatusJSON]
    initContainerStatuses: list[ContainerStatusJSON]
    qosClass: str


class PodJSON(TypedDict, total=False):
    kind: str
    metadata: ObjectMetaJSON
    spec: PodSpecJSON
    status: PodStatusJSON


class TaintJSON(TypedDict, total=False):
    key: str
    value: str
    effect: str


class NodeSpecJSON(TypedDict, total=False):
    taints: list[TaintJSON]
    unschedulable: bool


class NodeStatusJSON(TypedDict, total=False):
    allocatable: dict[str, Quantity]
    conditions: list[ConditionJSON]


class NodeJSON(TypedDict, total=False):
    kind: str
    metadata: ObjectMetaJSON
    spec: NodeSpecJSON
    status: NodeStatusJSON


class RollingUpdateJSON(TypedDict, total=False):
    maxSurge: Int64 | str | None
    maxUnavailable: Int64 | str | None


class StrategyJSON(TypedDict, total=False):
    type: str
    rollingUpdate: RollingUpdateJSON | None


class WorkloadSpecJSON(TypedDict, total=False):
    replicas: Int64
    selector: LabelSelectorJSON | None
    # A Deployment's, for the deployment controller's scaling mid-rollout (``rollout``).
    strategy: StrategyJSON
    paused: bool


class WorkloadStatusJSON(TypedDict, total=False):
    conditions: list[ConditionJSON]
    replicas: Int64
    availableReplicas: Int64


class WorkloadJSON(TypedDict, total=False):
    """A Deployment or a ReplicaSet: the same few fields matter."""

    kind: str
    metadata: ObjectMetaJSON
    spec: WorkloadSpecJSON
    status: WorkloadStatusJSON


#: Validate a raw pod, node or workload (:func:`validate`): built once, they are what costs.
POD_ADAPTER = TypeAdapter(PodJSON)
NODE_ADAPTER = TypeAdapter(NodeJSON)
WORKLOAD_ADAPTER = TypeAdapter(WorkloadJSON)


def validate(adapter: TypeAdapter[Any], raw: object, what: str) -> Any:
    """``raw`` validated by ``adapter``, or a :class:`ConversionError` naming the object
    (``what``, then its namespace and name when it has them) and the first field refused."""
    try:
        return adapter.validate_python(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        name = _name_hint(raw)
        raise ConversionError(f"{what}{name}: {where}: {first['msg']}") from None


def _name_hint(raw: object) -> str:
    if isinstance(raw, Mapping):
        meta = raw.get("metadata")
        if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
            # Only a string namespace is shown: the hint names an object that failed validation.
            namespace = meta.get("namespace")
            namespace = namespace if isinstance(namespace, str) else ""
            return f" {namespace}/{meta['name']}".replace(" /", " ")
    return ""


# --- scalars and references -----------------------------------------------------------------


def parse_time(value: str | None) -> float | None:
    """An RFC 3339 API timestamp in POSIX seconds, truncated to whole seconds: the API server
    stores and serves object times with one-second precision, so that is what the controller
    compares. ``None`` (Go's zero time) when absent."""
    if value is None or value == "":
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ConversionError(f"timestamp {value!r} is not RFC 3339") from None
    if parsed.tzinfo is None:
        raise ConversionError(f"timestamp {value!r} has no time zone")
    try:
        return float(math.floor(parsed.astimezone(UTC).timestamp()))
    except OverflowError:  # e.g. year 1 at +14:00 is before datetime.min in UTC
        raise ConversionError(f"timestamp {value!r} is out of range") from None


def controller_ref(meta: ObjectMetaJSON) -> OwnerReferenceJSON | None:
    """``metav1.GetControllerOf``: the owner reference marked as the controller, if any."""
    for ref in meta.get("ownerReferences", []):
        if ref.get("controller"):
            return ref
    return None


def restartable(container: ContainerJSON) -> bool:
    """Whether an init container is a sidecar (``restartPolicy: Always``)."""
    return container.get("restartPolicy") == "Always"


#: The deletion-cost annotation's key in a ``managedFields`` entry's ``fieldsV1``.
COST_FIELD = f"f:{DELETION_COST_ANNOTATION}"


def cost_managers(meta: ObjectMetaJSON) -> tuple[str, ...]:
    """The field managers that own the deletion-cost annotation, in ``managedFields`` order
    (empty when the pod has none, or when ``managedFields`` are absent, as in a ``kubectl get``
    dump without ``--show-managed-fields``)."""
    managers: list[str] = []
    for entry in meta.get("managedFields", []):
        # fieldsV1 is free-form JSON: every level is checked before it is read.
        fields = entry.get("fieldsV1", {})
        metadata = fields.get("f:metadata", {}) if isinstance(fields, Mapping) else {}
        annotations = metadata.get("f:annotations", {}) if isinstance(metadata, Mapping) else {}
        manager = entry.get("manager", "")
        owns = isinstance(annotations, Mapping) and COST_FIELD in annotations
        if owns and manager not in managers:
            managers.append(manager)
    return tuple(managers)


# --- label selectors ------------------------------------------------------------------------


def selector_matches(selector: LabelSelectorJSON | None, labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelectorAsSelector(selector).Matches(labels)``: a missing selector matches
    nothing, an empty one everything; an unknown operator makes the selector invalid, and the
    ReplicaSet controller treats an invalid selector as matching nothing."""
    if selector is None:
        return False
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for requirement in selector.get("matchExpressions", []):
        key = requirement.get("key", "")
        values = requirement.get("values", [])
        match requirement.get("operator"):
            case "In":
                ok = key in labels and labels[key] in values
            case "NotIn":
                ok = key not in labels or labels[key] not in values
            case "Exists":
                ok = key in labels
            case "DoesNotExist":
                ok = key not in labels
            case _:
                return False
        if not ok:
            return False
    return True
