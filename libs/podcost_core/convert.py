"""Raw Kubernetes JSON to the snapshot model: the one converter at the boundary.

Takes the shapes ``kubectl get -o json`` prints (and the API returns) as plain dicts and builds
``podcost_core.model`` values. The watcher calls ``pod_from_json`` / ``node_from_json`` for its
informer objects, ``podcost simulate`` calls ``load_objects`` and ``snapshot_for_workload`` on a
dump, and the bus encodes snapshots with ``SNAPSHOT_ADAPTER``. Nothing past this module sees raw
JSON. Every field is read as the component that acts on it reads it: QoS as ``GetPodQOS``,
restarts as the ReplicaSet controller's ``maxContainerRestarts``, quantities as
``resource.ParseQuantity``, the deletion cost as ``GetDeletionCostFromPodAnnotations``.

Raw objects are validated against ``TypedDict`` shapes by pydantic first, so a malformed dump
fails here with a ``ConversionError`` naming the object, never deeper with a ``KeyError``.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import sys
import types
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Annotated, Any, Final, Union, cast, get_args, get_origin, get_type_hints

import orjson
from pydantic import Field, TypeAdapter, ValidationError

# pydantic needs typing_extensions' TypedDict before Python 3.12 (it is pydantic's own dependency).
from typing_extensions import TypedDict, is_typeddict

from podcost_core.model import (
    DELETION_COST_ANNOTATION,
    FIELD_MANAGER,
    AffinityTerm,
    CostOwner,
    Node,
    NodeName,
    Phase,
    Pod,
    PodUID,
    QoSClass,
    ReplicaSetInfo,
    Resources,
    Snapshot,
    Taint,
    Toleration,
    WorkloadRef,
)
from podcost_core.victims import deletion_cost_error, parse_deletion_cost


class ConversionError(ValueError):
    """The input is not the Kubernetes JSON it should be. Permanent: report it, do not retry."""


class UnknownWorkload(ConversionError):
    """The requested workload is not in the objects given."""


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


_POD = TypeAdapter(PodJSON)
_NODE = TypeAdapter(NodeJSON)
_WORKLOAD = TypeAdapter(WorkloadJSON)

#: Validates and (de)serialises a whole snapshot; the bus payloads and ``simulate`` use it.
SNAPSHOT_ADAPTER: TypeAdapter[Snapshot] = TypeAdapter(Snapshot)


def _validate(adapter: TypeAdapter[Any], raw: object, what: str) -> Any:
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


# --- scalars --------------------------------------------------------------------------------

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|)"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
#: Bounds on the significant digits and the decimal exponent of a quantity string. The API server
#: serves quantities in canonical form, capped at 2^63 - 1 (19 digits, exponents up to 18), so
#: these only refuse hand-made input, and before ``int()`` (which refuses more than 4300 digits
#: with a ``ValueError``) or ``10 ** exponent`` (minutes for ``1e99999999``) meet it.
_MAX_QUANTITY_DIGITS = 100
_MAX_QUANTITY_EXPONENT = 100


def parse_quantity(value: Quantity) -> Fraction:
    """``resource.ParseQuantity``, exactly: ``500m`` = 1/2, ``1Gi`` = 2**30, ``1e3`` = 1000."""
    if isinstance(value, str):
        if len(value) <= QUANTITY_CACHED_LENGTH:
            return _cached_quantity_text(value)
        return _parse_quantity_text(value)  # kept out of the cache (hand-made input)
    if isinstance(value, bool):
        raise ConversionError(f"quantity {value!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConversionError(f"quantity {value!r} is not finite")
    if isinstance(value, int | float):
        if abs(value) >= 10**_MAX_QUANTITY_DIGITS:  # an int is compared as it is, never printed
            raise ConversionError(f"a quantity beyond 1e{_MAX_QUANTITY_DIGITS} is out of range")
        return Fraction(value) if isinstance(value, int) else Fraction(repr(value))
    raise ConversionError(f"quantity {value!r} is not a Kubernetes quantity")


#: Distinct quantity strings parsed once each: a cluster's pods request a few dozen of them
#: ("250m", "512Mi"), and the watcher sums a pod's requests for every version of it it
#: converts (a ``Fraction`` is immutable, so the same one can be handed out every time).
QUANTITY_CACHE_SIZE: Final = 4096
#: The longest string the cache keeps: the API server serves quantities in canonical form (a few
#: characters); a long one (leading zeros are allowed) is parsed every time, so that the cache
#: stays small whatever the input.
QUANTITY_CACHED_LENGTH: Final = 64


def _parse_quantity_text(value: str) -> Fraction:
    found = _QUANTITY.fullmatch(value)
    if not value or found is None:
        raise ConversionError(f"quantity {value!r} is not a Kubernetes quantity")
    # Leading zeros of the integer part and trailing zeros of the fraction change nothing.
    whole, frac = found["int"].lstrip("0"), (found["frac"] or "").rstrip("0")
    suffix = found["suffix"]
    exponent_text = "0" if suffix in _BINARY or suffix in _DECIMAL else suffix[1:]
    if (
        len(whole) + len(frac) > _MAX_QUANTITY_DIGITS
        or len(exponent_text.lstrip("+-").lstrip("0")) > 3
        or abs(int(exponent_text)) > _MAX_QUANTITY_EXPONENT
    ):
        shown = value if len(value) <= 40 else f"{value[:40]}..."
        raise ConversionError(f"quantity {shown!r} is out of range")
    number = Fraction(int(whole + frac or "0"), 10 ** len(frac))
    if suffix in _BINARY:
        number *= 2 ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= Fraction(10) ** _DECIMAL[suffix]
    else:  # a decimal exponent, e.g. e3 or E-2
        number *= Fraction(10) ** int(exponent_text)
    return -number if found["sign"] == "-" else number


_cached_quantity_text: Final = functools.lru_cache(maxsize=QUANTITY_CACHE_SIZE)(
    _parse_quantity_text
)


def quantity_milli(value: Quantity) -> int:
    """``Quantity.MilliValue()``: thousandths, rounded up."""
    return math.ceil(parse_quantity(value) * 1000)


def quantity_value(value: Quantity) -> int:
    """``Quantity.Value()``: rounded up to an integer."""
    return math.ceil(parse_quantity(value))


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


# --- pods -----------------------------------------------------------------------------------

_COST_FIELD = f"f:{DELETION_COST_ANNOTATION}"
_QOS_RESOURCES = ("cpu", "memory")


def _controller_ref(meta: ObjectMetaJSON) -> OwnerReferenceJSON | None:
    for ref in meta.get("ownerReferences", []):
        if ref.get("controller"):
            return ref
    return None


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
        owns = isinstance(annotations, Mapping) and _COST_FIELD in annotations
        if owns and manager not in managers:
            managers.append(manager)
    return tuple(managers)


def slim_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (changed in place, and returned) with of its ``metadata.managedFields`` only what
    podcost reads of them: which managers own the deletion cost (:func:`cost_managers`, in the
    same order), one minimal entry each; none when no manager owns it. What an informer keeps
    per object: the entries of a pod are about a third of its JSON, those of a node more."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    entries = meta["managedFields"]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return obj  # not what the API serves: left for the readers to refuse
    owners = cost_managers(cast(ObjectMetaJSON, meta))
    if owners:
        meta["managedFields"] = [
            {"manager": manager, "fieldsV1": {"f:metadata": {"f:annotations": {_COST_FIELD: {}}}}}
            for manager in owners
        ]
    else:
        del meta["managedFields"]
    return obj


# --- what an informer keeps of a pod ---------------------------------------------------------

#: A leaf of a shape whose strings are unique to one pod (its name, uid, version): never interned.
_UNIQUE = "unique"
#: A shape: a dict of the keys kept (each with the shape of its value), a one-item list (every
#: item has that shape), ``None`` (a leaf, kept as it is, its strings interned) or ``_UNIQUE``.
_Shape = dict[str, Any] | list[Any] | str | None
#: Strings longer than this are never interned (an annotation may carry kilobytes, once).
_INTERN_MAX = 256


def _shape_of(hint: Any) -> _Shape:
    """The shape of a value of type ``hint`` in the raw TypedDicts above."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):  # ``X | None``: the shape of X
        shapes = [shape for arg in get_args(hint) if (shape := _shape_of(arg)) is not None]
        return shapes[0] if shapes else None
    if origin is list:
        item = _shape_of(get_args(hint)[0])
        return [item] if item is not None else None
    if is_typeddict(hint):
        return {key: _shape_of(value) for key, value in get_type_hints(hint).items()}
    return None


def _pod_shape() -> dict[str, Any]:
    shape = cast(dict[str, Any], _shape_of(PodJSON))
    # What podcost reads of a pod besides what ``pod_from_json`` validates: the store compares
    # versions, the annotator the owner's apiVersion (in ``OwnerReferenceJSON`` already).
    shape["apiVersion"] = None
    meta = shape["metadata"]
    # Not the creation time: the pods a Deployment starts or replaces together mostly share it
    # (whole seconds), so it is interned like the condition times.
    meta.update(name=_UNIQUE, uid=_UNIQUE, resourceVersion=_UNIQUE)
    return shape


_POD_SHAPE = _pod_shape()


class _PodRoot:
    """Never kept itself: its ``__dict__`` is a pod's projection (see :data:`_SECTIONS`)."""


class _PodMetadata:
    """Never kept itself: its ``__dict__`` is the ``metadata`` of a pod's projection."""


class _PodSpec:
    """Never kept itself: its ``__dict__`` is the ``spec`` of a pod's projection."""


class _PodStatus:
    """Never kept itself: its ``__dict__`` is the ``status`` of a pod's projection."""


#: The four dicts every pod has one of (whole, metadata, spec, status), each made as the
#: ``__dict__`` of an instance of its own class: a plain ``dict`` (``type(d) is dict``; equal,
#: ordered, read and copied as any other) whose keys table is the class's, shared by the same
#: dicts of every pod (CPython's split dict, as instance dictionaries are): only the values are
#: the pod's own. 5 keys are 120 bytes instead of 184, 9 are 160 instead of 272 (Python 3.11):
#: about 0.25 KB a pod. A key of one pod missing from the others costs the others 8 bytes each.
_SECTIONS: dict[int, type] = {
    id(_POD_SHAPE): _PodRoot,
    id(_POD_SHAPE["metadata"]): _PodMetadata,
    id(_POD_SHAPE["spec"]): _PodSpec,
    id(_POD_SHAPE["status"]): _PodStatus,
}


def _seed_sections() -> None:
    """Put every key a section can hold into its class's keys table before any pod is kept.

    CPython 3.11 adds no key to a keys table that a few dozen dicts already share: a section
    that brings a key none of the first pods had (``affinity``, ``initContainers``, a pending
    pod's first ``nodeName``) became an ordinary dict, and so did every later one with that key,
    for the life of the process (the first 200 pods of a test without tolerations left every pod
    after them without the saving). A table holding every key of the shape from the start is
    never asked for a new one; a dict sharing it may leave any of them out, in any order. The
    price is 8 bytes a pod for each key of the shape a pod does not have: 748 → 797 bytes a pod
    in ``bench_store_memory.py --pods 5000`` (all pods alike), where 200 pods kept first without
    tolerations had made it 1,076 bytes a pod instead of 972 for the 5,000 after them."""
    for shape in (_POD_SHAPE, _POD_SHAPE["metadata"], _POD_SHAPE["spec"], _POD_SHAPE["status"]):
        keys = _SECTIONS[id(shape)]().__dict__
        for key in shape:
            keys[key] = None


_seed_sections()


def _intern(value: Any) -> Any:
    """``value`` with its strings interned: a string, or the keys and values of a map of strings
    (labels, annotations, requests). Keys too: orjson's cache of keys is direct-mapped, so a key
    whose slot another key took (``annotations``, ``resourceVersion`` ...) is a new string in
    every object parsed."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= _INTERN_MAX else value
    if isinstance(value, dict):
        interned: dict[Any, str] = {}
        for key, item in value.items():
            if not isinstance(item, str):
                return value
            interned[_intern_key(key)] = sys.intern(item) if len(item) <= _INTERN_MAX else item
        return interned
    return value


def _intern_key(key: Any) -> Any:
    return sys.intern(key) if type(key) is str and len(key) <= _INTERN_MAX else key


def _unread_condition(condition: object) -> bool:
    """Whether ``condition`` is a well-formed pod condition other than Ready: nothing reads it,
    and it would pass validation (so leaving it out changes no reader's answer)."""
    return (
        isinstance(condition, dict)
        and isinstance(condition.get("type"), str)
        and condition["type"] != "Ready"
        and isinstance(condition.get("status", ""), str)
        and isinstance(condition.get("lastTransitionTime"), str | None)
    )


def _projector(shape: _Shape) -> Callable[[Any], Any]:
    """What keeps of a value the fields ``shape`` names (see :data:`_Shape`), as a function
    made once per shape, rather than the shape walked again for every pod: each level looks up
    the value's keys in one table of the shape's own strings, each with what to do with its
    value. Counted by callgrind (``tests/bench/bench_watch_path.py --pods 300 --rounds 1``, its
    module docstring), taking in a watch line, the watcher's or the annotator's view's, costs
    8.5 % fewer instructions. The kept keys come in the pod's order, as before. A value of an
    unexpected type is kept as it is, for the readers to refuse."""
    if isinstance(shape, list):
        inner = _projector(shape[0])

        def project_list(value: Any) -> Any:
            if not isinstance(value, list):
                return value
            return [inner(item) for item in value]

        return project_list
    if not isinstance(shape, dict):
        return _as_it_is if shape == _UNIQUE else _intern
    section = _SECTIONS.get(id(shape))
    # Each key with the function its value goes through: ``None`` to keep it as it is,
    # ``_intern`` for a leaf, or a projector.
    fields: dict[str, tuple[str, Callable[[Any], Any] | None]] = {}
    for key, inner_shape in shape.items():
        name = sys.intern(key)
        project = _projector(inner_shape)
        fields[name] = (name, None if project is _as_it_is else project)
    intern, intern_max, intern_leaf = sys.intern, _INTERN_MAX, _intern

    def project_dict(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        kept: dict[str, Any] = section().__dict__ if section is not None else {}
        for key, item in value.items():
            field = fields.get(key)
            if field is None:
                continue
            name, project = field
            if project is None:
                kept[name] = item
            elif project is intern_leaf and type(item) is str:
                # ``_intern``'s own answer for a string, without the call (most leaves are).
                kept[name] = intern(item) if len(item) <= intern_max else item
            else:
                kept[name] = project(item)
        return kept

    return project_dict


def _as_it_is(value: Any) -> Any:
    return value


#: :func:`project_pod`'s projection of the whole pod (:func:`_projector` of :data:`_POD_SHAPE`).
_project_pod: Final = _projector(_POD_SHAPE)


#: Parts whose text is longer than this are not shared (no API serves such a pod part twice).
_SHARE_MAX = 4096


def _part_key(part: Any) -> bytes | None:
    """A key equal exactly for equal JSON values of equal types in the same key order: their
    compact JSON (``true`` is not ``1``, ``0.0`` not ``-0.0``, ``"1"`` not ``1``), or, when it
    holds a ``null`` (which orjson also writes for NaN and the infinities, where the part did
    not come from JSON text), ``r`` and the part's ``repr``, which tells them apart; ``None``
    when there is none to take (an int beyond 64 bits, a non-string key, nesting deeper than
    the limits) or it is too long to be worth it. orjson rather than ``repr`` for every part:
    3.8 µs instead of 16.7 for the 9 parts of a kwok pod."""
    try:
        key = orjson.dumps(part)
        if b"null" in key:
            key = b"r" + repr(part).encode()
    except (TypeError, ValueError, RecursionError):  # orjson.JSONEncodeError is a TypeError
        return None
    return key if len(key) <= _SHARE_MAX else None


class SharedParts:
    """Equal parts of many pods kept once: the pods of a workload have the same labels, owner,
    containers' requests, tolerations, managedFields, and mostly the same conditions (their
    times are whole seconds) and container statuses. :func:`project_pod` hands each list or map
    directly under ``metadata``, ``spec`` and ``status``, then the ``status`` itself, to
    :meth:`share`, which returns an equal one seen before if there is one. Readers of the store
    must not change what they read (``podcost_kube.store``): a shared part is many pods' part.

    At most ``limit`` distinct parts are remembered; when full, it forgets them all (the parts
    already shared stay so), so churn (new workloads, new condition times) cannot grow it."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._parts: dict[bytes, Any] = {}

    def __len__(self) -> int:
        return len(self._parts)

    def share(self, part: Any) -> Any:
        """An equal part seen before, or ``part`` (remembered)."""
        key = _part_key(part)
        if key is None:
            return part
        found = self._parts.get(key)
        if found is not None:
            return found
        if len(self._parts) >= self.limit:
            self._parts.clear()
        # A copy of its exact size: the bytes orjson returns keep the whole buffer it wrote in
        # (4 KB for a part of 100 bytes, as tracemalloc counts it).
        self._parts[bytes(memoryview(key))] = part
        return part


def project_pod(obj: dict[str, Any], shared: SharedParts | None = None) -> dict[str, Any]:
    """What an informer keeps of a pod (a new object; ``obj`` is left as it is): only the fields
    podcost reads, i.e. those of :class:`PodJSON` that ``pod_from_json`` validates, plus
    ``apiVersion`` and ``metadata.resourceVersion``; of the conditions only Ready (and any
    malformed one). Repeated strings (namespace, node, labels, owner, quantities, condition
    times) are interned, and with ``shared`` equal parts are shared with other pods
    (:class:`SharedParts`); the dicts every pod has its own of (the pod, its metadata, spec and
    status) share their keys tables with every other pod's (:data:`_SECTIONS`).

    Every reader (``pod_from_json``, ``pod_requests``, ``cost_owner``, the watcher's change
    filters, the annotator's verification) answers the same on the projection as on ``obj``: a
    value of an unexpected type is kept as it is, so a malformed pod is refused the same way
    (only the index of a list item in the error may differ). Apply it after
    :func:`slim_managed_fields`; ``tests/unit/test_project_pod.py`` checks the equivalence."""
    if not isinstance(obj, dict):
        return obj
    projected: dict[str, Any] = _project_pod(obj)
    status = projected.get("status")
    if isinstance(status, dict) and isinstance(status.get("conditions"), list):
        conditions = status["conditions"]
        status["conditions"] = [c for c in conditions if not _unread_condition(c)]
    if shared is not None:
        for section in ("metadata", "spec", "status"):
            parts = projected.get(section)
            if isinstance(parts, dict):
                for key, part in parts.items():
                    if isinstance(part, dict | list) and part:
                        parts[key] = shared.share(part)
        # The whole status too: what is kept of it (phase, QoS class, the Ready condition with its
        # time in whole seconds, restart counts) is mostly the same for the pods of a workload
        # started together, and one dict less a pod is 0.18 KB (``bench_store_memory``).
        status = projected.get("status")
        if isinstance(status, dict) and status:
            projected["status"] = shared.share(status)
    return projected


# --- what an informer keeps of a node, a ReplicaSet, a Deployment -----------------------------


def _validated_only(condition: object) -> bool:
    """Whether ``condition`` is a well-formed condition (``ConditionJSON``): of a node's or a
    workload's conditions nothing reads more than that they pass validation, which a well-formed
    one does alone (so leaving it out changes no reader's answer; a malformed one is kept for the
    readers to refuse)."""
    return (
        isinstance(condition, dict)
        and isinstance(condition.get("type", ""), str)
        and isinstance(condition.get("status", ""), str)
        and isinstance(condition.get("lastTransitionTime"), str | None)
    )


def _intern_maps(obj: dict[str, Any], section: str, keys: Sequence[str]) -> None:
    """The maps of strings ``obj[section][key]`` with their strings interned (``_intern``): a
    node's or a workload's labels and annotations repeat across objects (``amd64``, a zone,
    ``true``), each value a string of its own as parsed."""
    value = obj.get(section)
    if isinstance(value, dict):
        for key in keys:
            if isinstance(value.get(key), dict):
                value[key] = _intern(value[key])


def _without_valid_conditions(status: dict[str, Any]) -> None:
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        kept = [c for c in conditions if not _validated_only(c)]
        if kept:
            status["conditions"] = kept
        else:
            del status["conditions"]


#: What a node's status keeps: the one field any reader reads (``node_from_json``,
#: ``node_change_matters``), and the conditions (those that fail validation only).
_NODE_STATUS_KEPT = ("allocatable", "conditions")


def _share_parts(
    obj: dict[str, Any], shared: SharedParts, parts: Mapping[str, Sequence[str]]
) -> None:
    """Each map or list ``obj[section][key]`` of ``parts`` (section → keys), then each whole
    section named with no key, handed to ``shared`` (:class:`SharedParts`): the parts equal
    between many objects (a node's status, now its allocatable resources; a workload's strategy
    and status). Parts often unique in a cluster are not offered (labels with a hostname,
    annotations with a node's addresses or ``kubectl apply``'s last configuration): the text
    each remembered part is kept by would cost more than sharing saves."""
    for section, keys in parts.items():
        value = obj.get(section)
        if not isinstance(value, dict):
            continue
        for key in keys:
            part = value.get(key)
            if isinstance(part, dict | list) and part:
                value[key] = shared.share(part)
        if not keys and value:
            obj[section] = shared.share(value)


#: The parts of a node equal between nodes (:func:`_share_parts`).
_NODE_SHARED: dict[str, tuple[str, ...]] = {"status": ()}
#: The parts of a ReplicaSet or a Deployment equal between workloads (:func:`_share_parts`).
_WORKLOAD_SHARED: dict[str, tuple[str, ...]] = {"spec": ("strategy",), "status": ()}


def project_node(obj: dict[str, Any], shared: SharedParts | None = None) -> dict[str, Any]:
    """What an informer keeps of a node (``obj`` changed in place, and returned): all but its
    status, and of the status only ``allocatable`` and the conditions that would fail validation.
    Its addresses, capacity, daemon endpoints, node info, images and well-formed conditions are
    read by nothing. Its labels' and annotations' strings are interned. With ``shared``, its
    status is shared with other nodes' equal ones (:class:`SharedParts`; readers must not change
    it): a kwok node of 8.6 KB of Python objects keeps 1.8 KB, 0.2 KB a pod less at 30 pods a
    node (``bench_store_memory``).
    ``node_from_json`` and ``node_change_matters`` answer the same on the projection
    (``tests/unit/test_project_objects.py``). Apply it after :func:`slim_managed_fields`."""
    if not isinstance(obj, dict):
        return obj
    _intern_maps(obj, "metadata", ("labels", "annotations"))
    status = obj.get("status")
    if isinstance(status, dict):
        kept = {key: status[key] for key in _NODE_STATUS_KEPT if key in status}
        _without_valid_conditions(kept)
        obj["status"] = kept
    if shared is not None:
        _share_parts(obj, shared, _NODE_SHARED)
    return obj


def template_digest(template: object) -> object:
    """What a workload's kept ``spec.template`` is (:func:`project_workload`): 16 bytes equal
    for equal templates and different for different ones (a digest of its JSON with sorted
    keys, as ``orjson`` writes it: 2 µs a kwok template, ``json`` takes 10; a template whose
    only change is a number's JSON type, ``1`` to ``1.0``, reads as changed). A value ``orjson``
    cannot write (an int beyond 64 bits) is kept as it is; parsed JSON holds no NaN."""
    try:
        text = orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return template
    return hashlib.blake2b(text, digest_size=16).digest()


def project_workload(obj: dict[str, Any], shared: SharedParts | None = None) -> dict[str, Any]:
    """What an informer keeps of a ReplicaSet or a Deployment (``obj`` changed in place, and
    returned): all but its pod template, kept as :func:`template_digest` (equal for equal
    templates, so ``workload_change_matters`` still sees a template change), and the well-formed
    status conditions (read by nothing but validation). Nothing else reads the template: the
    snapshot reads the selector, replicas, strategy and status counts (``rollout``,
    ``WorkloadJSON``), and the watcher's change filter compares the spec. Its labels' and
    annotations' strings are interned. With ``shared``, its strategy and status are shared with
    other workloads' equal ones. A kwok Deployment (ReplicaSet) of 6.4 (5.1) KB of Python
    objects keeps 2.2 (2.8) KB (``bench_store_memory``); ``tests/unit/test_project_objects.py``
    checks every reader's answer."""
    if not isinstance(obj, dict):
        return obj
    _intern_maps(obj, "metadata", ("labels", "annotations"))
    spec = obj.get("spec")
    if isinstance(spec, dict) and "template" in spec:
        spec["template"] = template_digest(spec["template"])
    status = obj.get("status")
    if isinstance(status, dict):
        _without_valid_conditions(status)
    if shared is not None:
        _share_parts(obj, shared, _WORKLOAD_SHARED)
    return obj


def cost_owner(meta: ObjectMetaJSON, adopt: Collection[str] = ()) -> CostOwner:
    """Who set the deletion cost: podcost when its own field manager, or one of ``adopt`` (the
    managers whose costs podcost takes over), owns the annotation; anyone else is ``OTHER``."""
    if DELETION_COST_ANNOTATION not in meta.get("annotations", {}):
        return CostOwner.NONE
    for manager in cost_managers(meta):
        if manager == FIELD_MANAGER or manager in adopt:
            return CostOwner.PODCOST
    return CostOwner.OTHER


def own_cost(meta: ObjectMetaJSON) -> str | None:
    """The deletion cost exactly as found when podcost's own field manager alone owns it: what
    ``podcost cleanup`` may remove. ``None`` when there is none, or anyone else (an adopted
    manager included: podcost never wrote that value) owns it, or who does is unknown."""
    value = meta.get("annotations", {}).get(DELETION_COST_ANNOTATION)
    return value if value is not None and cost_managers(meta) == (FIELD_MANAGER,) else None


_ZERO: Final = Fraction(0)


def _sum_into(total: dict[str, Fraction], resources: Mapping[str, Quantity]) -> None:
    # A name seen first is its amount: no addition to a new zero (``Fraction`` arithmetic is
    # most of what summing one container's requests costs).
    for name, amount in resources.items():
        value = parse_quantity(amount)
        have = total.get(name)
        total[name] = value if have is None else have + value


def _max_into(total: dict[str, Fraction], resources: Mapping[str, Fraction]) -> None:
    for name, amount in resources.items():
        have = total.get(name, _ZERO)
        total[name] = amount if amount > have else have


def _ceil(amount: Fraction | None, scale: int = 1) -> int:
    """``math.ceil(amount * scale)`` in integers (0 for ``None``)."""
    return 0 if amount is None else -(-amount.numerator * scale // amount.denominator)


def _restartable(container: ContainerJSON) -> bool:
    return container.get("restartPolicy") == "Always"


def pod_requests(spec: PodSpecJSON) -> Resources:
    """The scheduler's view of what a pod requests (``resourcehelper.PodRequests``): regular
    containers and sidecars add up, each plain init container needs its own request plus the
    sidecars started before it, the larger wins, then the overhead. Pod-level requests, when
    set, replace the containers' for the resources they name."""
    total: dict[str, Fraction] = {}
    for container in spec.get("containers", []):
        _sum_into(total, container.get("resources", {}).get("requests", {}))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers", []):
        requests = container.get("resources", {}).get("requests", {})
        if _restartable(container):
            _sum_into(sidecars, requests)
            _max_into(init_peak, sidecars)
        else:
            during: dict[str, Fraction] = dict(sidecars)
            _sum_into(during, requests)
            _max_into(init_peak, during)
    for name, amount in sidecars.items():
        have = total.get(name)
        total[name] = amount if have is None else have + amount
    _max_into(total, init_peak)
    pod_level = spec.get("resources", {}).get("requests", {})
    for name in _QOS_RESOURCES:
        if name in pod_level:
            total[name] = parse_quantity(pod_level[name])
    _sum_into(total, spec.get("overhead", {}))
    return Resources(
        cpu_milli=_ceil(total.get("cpu"), 1000), memory_bytes=_ceil(total.get("memory")), pods=1
    )


def pod_requests_inputs(spec: PodSpecJSON) -> tuple[object, ...]:
    """What :func:`pod_requests` reads of ``spec``: two specs with equal inputs request the
    same (a cache compares them to skip parsing the quantities again)."""
    return (
        [c.get("resources", {}).get("requests") for c in spec.get("containers", [])],
        [
            (c.get("resources", {}).get("requests"), c.get("restartPolicy"))
            for c in spec.get("initContainers", [])
        ],
        spec.get("resources", {}).get("requests"),
        spec.get("overhead"),
    )


def compute_qos(spec: PodSpecJSON) -> QoSClass:
    """``qos.ComputePodQOS`` for a pod whose ``status.qosClass`` is not set yet."""
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True

    def positive(resources: Mapping[str, Quantity]) -> dict[str, Fraction]:
        found = {
            name: parse_quantity(resources[name]) for name in _QOS_RESOURCES if name in resources
        }
        return {name: amount for name, amount in found.items() if amount > 0}

    pod_level = spec.get("resources")
    if pod_level is not None and (pod_level.get("requests") or pod_level.get("limits")):
        # PodLevelResources (beta, on in 1.36): the pod-level resources decide alone.
        _max_into(requests, positive(pod_level.get("requests", {})))
        pod_limits = positive(pod_level.get("limits", {}))
        _max_into(limits, pod_limits)
        if pod_level.get("limits") and set(pod_limits) != set(_QOS_RESOURCES):
            guaranteed = False
    else:
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            resources = container.get("resources", {})
            for name, amount in positive(resources.get("requests", {})).items():
                requests[name] = requests.get(name, Fraction(0)) + amount
            container_limits = positive(resources.get("limits", {}))
            for name, amount in container_limits.items():
                limits[name] = limits.get(name, Fraction(0)) + amount
            if set(container_limits) != set(_QOS_RESOURCES):
                guaranteed = False
    if not requests and not limits:
        return QoSClass.BEST_EFFORT
    requests_match = all(limits.get(name) == amount for name, amount in requests.items())
    if guaranteed and requests_match and len(requests) == len(limits):
        return QoSClass.GUARANTEED
    return QoSClass.BURSTABLE


def _restarts(spec: PodSpecJSON, status: PodStatusJSON) -> tuple[int, int]:
    """``maxContainerRestarts``: the highest restart count of a regular container, and of a
    restartable init container (sidecar); plain init containers count for neither."""
    regular = max(
        (c.get("restartCount", 0) for c in status.get("containerStatuses", [])), default=0
    )
    sidecar_names = {c.get("name") for c in spec.get("initContainers", []) if _restartable(c)}
    sidecar = max(
        (
            c.get("restartCount", 0)
            for c in status.get("initContainerStatuses", [])
            if c.get("name") in sidecar_names
        ),
        default=0,
    )
    return regular, sidecar


def _reduce_selector(selector: LabelSelectorJSON) -> tuple[dict[str, str], bool]:
    """``matchLabels`` plus the one-value ``In`` expressions; exact when nothing else is left."""
    labels = dict(selector.get("matchLabels", {}))
    exact = True
    for requirement in selector.get("matchExpressions", []):
        values = requirement.get("values", [])
        if requirement.get("operator") == "In" and len(values) == 1:
            labels[requirement.get("key", "")] = values[0]
        else:
            exact = False
    return labels, exact


def _affinity_term(term: PodAffinityTermJSON, weight: int, namespace: str) -> AffinityTerm | None:
    selector = term.get("labelSelector")
    if selector is None:
        return None  # a null selector matches no pod: the term constrains nothing
    labels, exact = _reduce_selector(selector)
    namespaces = term.get("namespaces", [])
    if term.get("namespaceSelector") is not None or (namespaces and namespaces != [namespace]):
        exact = False
    return AffinityTerm(term.get("topologyKey", ""), labels, weight=weight, exact=exact)


def _anti_affinity(spec: PodSpecJSON, namespace: str) -> tuple[AffinityTerm, ...]:
    anti = spec.get("affinity", {}).get("podAntiAffinity", {})
    terms: list[AffinityTerm | None] = [
        _affinity_term(term, 0, namespace)
        for term in anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    ]
    for weighted in anti.get("preferredDuringSchedulingIgnoredDuringExecution", []):
        weight = weighted.get("weight", 1)
        terms.append(_affinity_term(weighted.get("podAffinityTerm", {}), weight, namespace))
    return tuple(term for term in terms if term is not None)


def _phase(value: str | None) -> Phase:
    try:
        return Phase(value or "")
    except ValueError:
        # An empty or unknown phase is active and reads as ordinal 0 in the controller's
        # podPhaseToOrdinal map, exactly like Pending.
        return Phase.PENDING


def _qos(spec: PodSpecJSON, status: PodStatusJSON) -> QoSClass:
    try:
        return QoSClass(status.get("qosClass", ""))
    except ValueError:
        return compute_qos(spec)


#: Most distinct ``spec.tolerations`` lists :func:`pod_from_json` keeps converted (then it starts
#: over): a Deployment's pods share theirs, so a cluster has about one per pod template.
_TOLERATIONS_KEPT = 4096
_tolerations: dict[tuple[tuple[Any, ...], ...], tuple[Toleration, ...]] = {}


def _tolerations_of(spec: PodSpecJSON) -> tuple[Toleration, ...]:
    """The pod's tolerations, one tuple shared by every pod whose tolerations are equal (they
    are frozen): about 0.2 KB a pod less in a cache of converted pods."""
    entries = spec.get("tolerations", [])
    if not entries:
        return ()
    key = tuple(
        (t.get("key", ""), t.get("operator", "Equal") or "Equal", t.get("value", ""),
         t.get("effect", ""))
        for t in entries
    )  # fmt: skip
    found = _tolerations.get(key)
    if found is None:
        if len(_tolerations) >= _TOLERATIONS_KEPT:
            _tolerations.clear()
        found = _tolerations[key] = tuple(
            Toleration(key=k, operator=o, value=v, effect=e) for k, o, v, e in key
        )
    return found


#: The labels or annotations of every pod without any that ``pod_from_json(shared=True)`` reads:
#: read-only, as the maps of the store it shares.
_NO_STRINGS: Mapping[str, str] = {}

#: ``parse_time`` for the times of pods: the pods started or replaced together share their
#: creation and Ready times (whole seconds), and with them one ``float`` each.
_pod_time = functools.lru_cache(maxsize=4096)(parse_time)


def pod_from_json(
    raw: Mapping[str, Any],
    *,
    adopt: Collection[str] = (),
    shared: bool = False,
    requests_of: Callable[[PodSpecJSON], Resources] = pod_requests,
) -> Pod:
    """One pod, as every component that acts on it reads it; a cost set by one of the field
    managers in ``adopt`` counts as podcost's own (``cost_owner``). ``shared``: ``raw`` is never
    changed (an informer's kept object, ``project_pod``'s, whose maps equal pods share), so the
    pod keeps its labels and annotations maps instead of a copy of each. ``requests_of``: what
    sums the validated spec's requests (``pod_requests``; a cache may hand out one
    ``Resources`` for equal sums)."""
    pod: PodJSON = _validate(_POD, raw, "pod")
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    name = meta.get("name", "")
    namespace = meta.get("namespace", "")
    if not name:
        raise ConversionError("pod without metadata.name")
    ready_condition = next(
        (c for c in status.get("conditions", []) if c.get("type") == "Ready"), None
    )
    ready = ready_condition is not None and ready_condition.get("status") == "True"
    owner = _controller_ref(meta)
    annotations = meta.get("annotations", {})
    labels = meta.get("labels", {})
    if shared:  # the maps of ``raw`` itself, which validation checked (but copied)
        kept = raw.get("metadata", {})
        # Without any, one empty map for every such pod (not a new one each: 64 bytes a pod).
        labels = kept.get("labels", _NO_STRINGS)
        annotations = kept.get("annotations", _NO_STRINGS)
    regular, sidecar = _restarts(spec, status)
    return Pod(
        # A pod always has a UID; hand-written dumps may not, and the UID is a tie-breaker.
        uid=PodUID(meta.get("uid") or f"{namespace}/{name}"),
        name=name,
        namespace=namespace,
        node=NodeName(spec["nodeName"]) if spec.get("nodeName") else None,
        phase=_phase(status.get("phase")),
        ready=ready,
        ready_since=(
            _pod_time(ready_condition.get("lastTransitionTime"))
            if ready and ready_condition is not None
            else None
        ),
        created=_pod_time(meta.get("creationTimestamp")),
        replicaset=owner.get("name")
        if owner is not None and owner.get("kind") == "ReplicaSet"
        else None,
        owner_uid=owner.get("uid") if owner is not None else None,
        restarts=regular,
        sidecar_restarts=sidecar,
        priority=spec.get("priority", 0),
        qos=_qos(spec, status),
        tolerations=_tolerations_of(spec),
        requests=requests_of(spec),
        labels=labels if shared else dict(labels),
        annotations=annotations if shared else dict(annotations),
        deletion_cost=parse_deletion_cost(annotations.get(DELETION_COST_ANNOTATION)),
        deletion_cost_raw=annotations.get(DELETION_COST_ANNOTATION),
        cost_owner=cost_owner(meta, adopt),
        deleting=meta.get("deletionTimestamp") is not None,
        anti_affinity=_anti_affinity(spec, namespace),
    )


def invalid_deletion_cost(pod: Pod) -> str | None:
    """Why the deletion cost found on ``pod`` is one the controller cannot read (not an integer,
    out of int32: it reads 0), ``None`` if it can or there is none. Such a pod counts as having
    no cost (``labels.current_costs``); the watcher reports it."""
    raw = pod.deletion_cost_raw
    return None if raw is None else deletion_cost_error(raw)


def node_from_json(raw: Mapping[str, Any], requested: Resources | None = None) -> Node:
    """One node; ``requested`` is the sum of the requests of the active pods on it, if known."""
    node: NodeJSON = _validate(_NODE, raw, "node")
    meta = node.get("metadata", {})
    spec = node.get("spec", {})
    allocatable = node.get("status", {}).get("allocatable", {})
    name = meta.get("name", "")
    if not name:
        raise ConversionError("node without metadata.name")
    return Node(
        name=NodeName(name),
        labels=dict(meta.get("labels", {})),
        annotations=dict(meta.get("annotations", {})),
        taints=tuple(
            Taint(key=t.get("key", ""), effect=t.get("effect", ""), value=t.get("value", ""))
            for t in spec.get("taints", [])
        ),
        allocatable=Resources(
            cpu_milli=quantity_milli(allocatable.get("cpu", 0)),
            memory_bytes=quantity_value(allocatable.get("memory", 0)),
            pods=quantity_value(allocatable.get("pods", 0)),
        ),
        requested=requested or Resources(),
        unschedulable=spec.get("unschedulable", False),
    )


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


# --- a dump of cluster objects --------------------------------------------------------------


@dataclass(slots=True)
class ClusterObjects:
    """The objects of one or more ``kubectl get pods,nodes,replicasets,deployments -o json``
    dumps, validated and sorted by kind; later dumps win for the same object."""

    pods: dict[tuple[str, str], PodJSON] = field(default_factory=dict)
    nodes: dict[str, NodeJSON] = field(default_factory=dict)
    replicasets: dict[tuple[str, str], WorkloadJSON] = field(default_factory=dict)
    deployments: dict[tuple[str, str], WorkloadJSON] = field(default_factory=dict)
    newest: float | None = None
    """The newest timestamp anywhere in the objects: "now" for a dump."""
    node_usage: dict[str, NodeUsage] = field(default_factory=dict)
    """What the active pods on a node request (:func:`node_usage`), for nodes every pod of
    which is in ``pods``, when the caller has it already (the watcher keeps it per node until
    the node's pods change); a snapshot sums the other nodes' from ``pods``."""

    def _seen(self, *stamps: str | None) -> None:
        for stamp in stamps:
            seconds = parse_time(stamp)
            if seconds is not None and (self.newest is None or seconds > self.newest):
                self.newest = seconds

    def _stamp_meta(self, meta: ObjectMetaJSON, conditions: Sequence[ConditionJSON]) -> None:
        self._seen(meta.get("creationTimestamp"), meta.get("deletionTimestamp"))
        self._seen(*(entry.get("time") for entry in meta.get("managedFields", [])))
        self._seen(*(c.get("lastTransitionTime") for c in conditions))

    def add(self, raw: Mapping[str, Any], kind_hint: str | None = None) -> None:
        """Add one object, or every item of a ``List`` / ``PodList`` / ... ."""
        if not isinstance(raw, Mapping):
            raise ConversionError(f"expected a JSON object, got {type(raw).__name__}")
        kind = raw.get("kind") or kind_hint
        if (isinstance(kind, str) and kind.endswith("List")) or (kind is None and "items" in raw):
            items = raw.get("items")
            if not isinstance(items, list):
                raise ConversionError(f"{kind or 'list'} without an items array")
            # Items of a typed list (PodList) come without their own kind.
            item_kind = kind[: -len("List")] if isinstance(kind, str) and kind != "List" else None
            for item in items:
                self.add(item, item_kind or None)
            return
        match kind:
            case "Pod":
                pod: PodJSON = _validate(_POD, raw, "pod")
                meta = pod.get("metadata", {})
                self._stamp_meta(meta, pod.get("status", {}).get("conditions", []))
                self.pods[(meta.get("namespace", ""), meta.get("name", ""))] = pod
            case "Node":
                node: NodeJSON = _validate(_NODE, raw, "node")
                meta = node.get("metadata", {})
                self._stamp_meta(meta, node.get("status", {}).get("conditions", []))
                self.nodes[meta.get("name", "")] = node
            case "ReplicaSet" | "Deployment":
                workload: WorkloadJSON = _validate(_WORKLOAD, raw, kind.lower())
                meta = workload.get("metadata", {})
                self._stamp_meta(meta, workload.get("status", {}).get("conditions", []))
                key = (meta.get("namespace", ""), meta.get("name", ""))
                (self.replicasets if kind == "ReplicaSet" else self.deployments)[key] = workload
            case _:
                pass  # other kinds (services, events, ...) do not matter here


def load_objects(documents: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> ClusterObjects:
    """Index one dump (a ``List``) or several dumps / objects."""
    objects = ClusterObjects()
    if isinstance(documents, Mapping):
        objects.add(documents)
    else:
        for document in documents:
            objects.add(document)
    return objects


def _refers_to(ref: OwnerReferenceJSON, kind: str, meta: ObjectMetaJSON) -> bool:
    if ref.get("kind") != kind:
        return False
    uid = meta.get("uid")
    if uid and ref.get("uid"):
        return ref.get("uid") == uid
    return ref.get("name") == meta.get("name")  # hand-written dumps without UIDs


def _owned_by(meta: ObjectMetaJSON, kind: str, owner: ObjectMetaJSON) -> bool:
    ref = _controller_ref(meta)
    return ref is not None and _refers_to(ref, kind, owner)


#: What a pod adds to its node in a snapshot (:func:`node_share`): the node's name, the request
#: fields it is summed from, whether it is a daemon pod.
NodeShare = tuple[str, tuple[object, ...], bool]


def node_share(pod: Mapping[str, Any]) -> NodeShare | None:
    """What ``pod`` adds to its node in a snapshot (:func:`_nodes_for`: ``Node.requested`` and
    ``Node.daemon_pods``): its node, the request fields it is summed from
    (:func:`pod_requests_inputs`) and whether it is a daemon pod; ``None`` when it adds nothing
    (unbound, finished or being deleted, or not an object podcost can read). Two versions of a
    pod with equal shares leave every snapshot's nodes as they were."""
    spec, meta = pod.get("spec"), pod.get("metadata")
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        return None
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return None
    try:
        if not _is_active(cast(PodJSON, pod)):
            return None
        inputs = pod_requests_inputs(cast(PodSpecJSON, spec))
        return node, inputs, _is_daemon(cast(ObjectMetaJSON, meta))
    except (AttributeError, TypeError):  # a part that is not an object where one belongs
        return None


def _is_active(pod: PodJSON) -> bool:
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed") and (
        pod.get("metadata", {}).get("deletionTimestamp") is None
    )


def _replicas(workload: WorkloadJSON) -> int:
    return workload.get("spec", {}).get("replicas", 1)


def _find_workload(
    objects: ClusterObjects, namespace: str, name: str, kind: str | None
) -> tuple[str, WorkloadJSON]:
    wanted = kind.lower() if kind else None
    if wanted in (None, "deployment", "deployments", "deploy"):
        found = objects.deployments.get((namespace, name))
        if found is not None:
            return "Deployment", found
    if wanted in (None, "replicaset", "replicasets", "rs"):
        found = objects.replicasets.get((namespace, name))
        if found is not None:
            return "ReplicaSet", found
    if wanted not in (
        None,
        "deployment",
        "deployments",
        "deploy",
        "replicaset",
        "replicasets",
        "rs",
    ):
        raise UnknownWorkload(f"unsupported workload kind {kind!r} (Deployment or ReplicaSet)")
    what = kind or "Deployment or ReplicaSet"
    raise UnknownWorkload(f"no {what} {namespace}/{name} in the objects given")


def snapshot_for_workload(
    objects: ClusterObjects | Mapping[str, Any] | Iterable[Mapping[str, Any]],
    namespace: str,
    name: str,
    kind: str | None = None,
    cluster: str = "local",
    *,
    include_inactive: bool = False,
    convert_pod: Callable[[Mapping[str, Any]], Pod] = pod_from_json,
    requests_of: Callable[[Mapping[str, Any]], Resources] | None = None,
    convert_node: Callable[[Mapping[str, Any], Resources], Node] | None = None,
) -> Snapshot:
    """The snapshot of one Deployment or ReplicaSet from a dump (``kind=None``: a Deployment if
    one has that name, else a ReplicaSet).

    A Deployment's pods are those of every ReplicaSet it controls (found by owner references),
    also of ReplicaSets scaled to zero. Orphan pods that a ReplicaSet's selector matches count as
    its own, since its controller adopts them before it scales. Pods that are finished or being
    deleted are left out unless ``include_inactive``: nothing ranks them and the controller
    neither deletes nor counts them. Active pods that a ReplicaSet selector matches without the
    workload owning them become ``bystanders``, which the controller counts in rule 5.
    ``convert_pod`` is ``pod_from_json`` or a cache of it, ``requests_of`` (a raw pod's
    ``pod_requests``, for the nodes' sums) and ``convert_node`` (``node_from_json``) too: the
    watcher's ``PodCache``.
    """
    if not isinstance(objects, ClusterObjects):
        objects = load_objects(objects)
    kind_found, workload = _find_workload(objects, namespace, name, kind)
    workload_meta = workload.get("metadata", {})

    if kind_found == "Deployment":
        replicasets = [
            rs
            for (rs_namespace, _), rs in sorted(objects.replicasets.items())
            if rs_namespace == namespace
            and _owned_by(rs.get("metadata", {}), "Deployment", workload_meta)
        ]
        own = replicasets
    else:
        controller = _controller_ref(workload_meta)
        own = [workload]
        if controller is None:
            replicasets = own
        else:
            # The ReplicaSet controller's related pods come from every ReplicaSet of the owner.
            replicasets = [
                rs
                for (rs_namespace, _), rs in sorted(objects.replicasets.items())
                if rs_namespace == namespace
                and _same_controller(_controller_ref(rs.get("metadata", {})), controller)
            ]
            if workload not in replicasets:
                replicasets.append(workload)

    namespace_pods = [
        pod
        for (pod_namespace, _), pod in sorted(objects.pods.items())
        if pod_namespace == namespace
    ]
    pods_of: dict[str, list[Pod]] = {}
    taken: set[tuple[str, str]] = set()
    for rs in own:
        rs_meta = rs.get("metadata", {})
        selector = rs.get("spec", {}).get("selector")
        for raw in namespace_pods:
            meta = raw.get("metadata", {})
            key = (namespace, meta.get("name", ""))
            if key in taken:
                continue
            labels = meta.get("labels", {})
            # claimPods releases an owned pod whose labels left the selector (a common way to
            # take a pod out of service for debugging): it is no longer the ReplicaSet's.
            owned = _owned_by(meta, "ReplicaSet", rs_meta) and (
                selector is None or selector_matches(selector, labels)
            )
            adoptable = (
                _controller_ref(meta) is None
                and _is_active(raw)
                and rs_meta.get("deletionTimestamp") is None
                and selector_matches(selector, labels)
            )
            if not (owned or adoptable):
                continue
            if not include_inactive and not _is_active(raw):
                continue
            taken.add(key)
            pod = convert_pod(raw)
            if adoptable:
                pod = _adopted(pod, rs_meta)
            pods_of.setdefault(rs_meta.get("name", ""), []).append(pod)

    bystanders: list[Pod] = []
    for raw in namespace_pods:
        meta = raw.get("metadata", {})
        if (namespace, meta.get("name", "")) in taken or not _is_active(raw):
            continue
        labels = meta.get("labels", {})
        if any(selector_matches(rs.get("spec", {}).get("selector"), labels) for rs in replicasets):
            bystanders.append(convert_pod(raw))
    if kind_found == "ReplicaSet" and _controller_ref(workload_meta) is None:
        bystanders = []  # without an owner the controller relates no pods at all

    pods = tuple(
        pod for rs in own for pod in pods_of.get(rs.get("metadata", {}).get("name", ""), [])
    )
    return Snapshot(
        workload=WorkloadRef(
            cluster=cluster,
            namespace=namespace,
            kind=kind_found,
            name=name,
            uid=workload_meta.get("uid", ""),
        ),
        pods=pods,
        nodes=_nodes_for(
            objects,
            [*pods, *bystanders],
            requests_of or _raw_requests,
            convert_node or node_from_json,
        ),
        replicas=_replicas(workload),
        annotations=dict(workload_meta.get("annotations", {})),
        taken_at=objects.newest or 0.0,
        replicasets={
            rs.get("metadata", {}).get("name", ""): _replicaset_info(rs) for rs in replicasets
        },
        bystanders=tuple(bystanders),
    )


def _same_controller(ref: OwnerReferenceJSON | None, controller: OwnerReferenceJSON) -> bool:
    if ref is None or ref.get("kind") != controller.get("kind"):
        return False
    if ref.get("uid") and controller.get("uid"):
        return ref.get("uid") == controller.get("uid")
    return ref.get("name") == controller.get("name")


def _adopted(pod: Pod, rs_meta: ObjectMetaJSON) -> Pod:
    return replace(pod, replicaset=rs_meta.get("name"), owner_uid=rs_meta.get("uid"))


def _replicaset_info(rs: WorkloadJSON) -> ReplicaSetInfo:
    meta = rs.get("metadata", {})
    controller = _controller_ref(meta)
    return ReplicaSetInfo(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        replicas=_replicas(rs),
        controller_uid=(controller.get("uid") or controller.get("name", ""))
        if controller
        else None,
        created=parse_time(meta.get("creationTimestamp")),
    )


def _raw_requests(raw: Mapping[str, Any]) -> Resources:
    return pod_requests(raw.get("spec", {}))


#: What the active pods on a node request, summed: CPU in millicores, memory in bytes, pods,
#: and how many of them are daemon pods (:func:`node_usage`).
NodeUsage = tuple[int, int, int, int]


def node_usage(
    pods: Iterable[Mapping[str, Any]],
    requests_of: Callable[[Mapping[str, Any]], Resources] | None = None,
) -> NodeUsage:
    """What the active ``pods`` of one node request, summed, as a snapshot gives it to the node
    (``Node.requested`` and ``Node.daemon_pods``); ``requests_of`` is ``pod_requests`` of a raw
    pod's spec or a cache of it. Raises :class:`ConversionError` for a pod it cannot read."""
    sums = [0, 0, 0, 0]
    add = requests_of or _raw_requests
    for raw in pods:
        if _is_active(cast(PodJSON, raw)):
            _add_usage(sums, raw, add)
    return sums[0], sums[1], sums[2], sums[3]


def _add_usage(
    sums: list[int],
    raw: Mapping[str, Any],
    requests_of: Callable[[Mapping[str, Any]], Resources],
) -> None:
    amount = requests_of(raw)
    sums[0] += amount.cpu_milli
    sums[1] += amount.memory_bytes
    sums[2] += amount.pods
    sums[3] += _is_daemon(raw.get("metadata", {}))


def _nodes_for(
    objects: ClusterObjects,
    pods: Sequence[Pod],
    requests_of: Callable[[Mapping[str, Any]], Resources],
    convert_node: Callable[[Mapping[str, Any], Resources], Node],
) -> dict[str, Node]:
    """The nodes the pods run on, each with the requests of every active pod on it (summed
    here from ``objects.pods``, unless ``objects.node_usage`` has them)."""
    wanted = {pod.node for pod in pods if pod.node is not None}
    usage = objects.node_usage
    requested: dict[str, list[int]] = {name: [0, 0, 0, 0] for name in wanted if name not in usage}
    if requested:
        for raw in objects.pods.values():
            node_name = raw.get("spec", {}).get("nodeName")
            if node_name in requested and _is_active(raw):
                _add_usage(requested[node_name], raw, requests_of)
    nodes: dict[str, Node] = {}
    for name in sorted(wanted):
        raw_node = objects.nodes.get(name)
        summed = requested.get(name)
        cpu, memory, count, daemons = usage[name] if summed is None else summed
        used = Resources(cpu_milli=cpu, memory_bytes=memory, pods=count)
        node = (
            convert_node(raw_node, used)
            if raw_node is not None
            else Node(name=NodeName(name), requested=used)  # the dump lacks the node
        )
        nodes[name] = replace(node, daemon_pods=daemons) if daemons else node
    return nodes


#: The annotation the kubelet puts on the API's mirror of a static pod.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def _is_daemon(meta: ObjectMetaJSON) -> bool:
    """Whether a pod is a DaemonSet's or a static pod's mirror: it goes with its node."""
    ref = _controller_ref(meta)
    if ref is not None and ref.get("kind") == "DaemonSet":
        return True
    return MIRROR_ANNOTATION in meta.get("annotations", {})
