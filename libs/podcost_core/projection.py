"""What an informer keeps of an API object: only the fields podcost reads, strings interned,
equal parts shared.

The watcher's and the annotator's informers (``podcost_kube.informer``) keep every pod, node,
ReplicaSet and Deployment of a cluster; most of each object is read by nothing. Applied to each
object as it arrives: :func:`slim_managed_fields` (of the managed fields only who owns the
deletion cost), then :func:`project_pod`, :func:`project_node` or :func:`project_workload`.
Every reader (``tomodel``, ``quantities``, ``snapshots``, the watcher's change filters, the
annotator's verification) answers the same on the projection as on the whole object;
``tests/unit/test_project_pod.py`` and ``tests/unit/test_project_objects.py`` check it. The
tables that make a kept pod small live here once for the process: the shapes' key tables
(:data:`_SECTIONS`), and ``sys.intern``'s strings.
"""

from __future__ import annotations

import hashlib
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Union, cast, get_args, get_origin, get_type_hints

import msgspec
import orjson
from typing_extensions import TypedDict, is_typeddict

from podcost_core.kubejson import (
    COST_FIELD,
    ManagedFieldsEntryJSON,
    ObjectMetaJSON,
    PodJSON,
    cost_managers,
)

# --- what an informer keeps of an object's managed fields -----------------------------------


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
    _keep_cost_owners(meta, cost_managers(cast(ObjectMetaJSON, meta)))
    return obj


def _keep_cost_owners(meta: dict[str, Any], owners: Sequence[str]) -> None:
    """``meta``'s managed fields reduced to one minimal entry per owner of the cost, or none."""
    if owners:
        meta["managedFields"] = [
            {"manager": manager, "fieldsV1": {"f:metadata": {"f:annotations": {COST_FIELD: {}}}}}
            for manager in owners
        ]
    else:
        del meta["managedFields"]


# --- what an informer keeps of a pod ---------------------------------------------------------

#: A leaf of a shape whose strings are unique to one pod (its name, uid, version): never interned.
_UNIQUE = "unique"
#: A shape: a dict of the keys kept (each with the shape of its value), a one-item list (every
#: item has that shape), ``None`` (a leaf, kept as it is, its strings interned) or ``_UNIQUE``.
_Shape = dict[str, Any] | list[Any] | str | None
#: Strings longer than this are never interned (an annotation may carry kilobytes, once).
_INTERN_MAX = 256


def _shape_of(hint: Any) -> _Shape:
    """The shape of a value of type ``hint`` in the raw TypedDicts (``podcost_core.kubejson``)."""
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

    def share(self, part: Any, project: Callable[[Any], Any] | None = None) -> Any:
        """An equal part seen before, or ``part`` (remembered). With ``project``, ``part`` is
        one not yet projected, and what is remembered (and returned) is ``project(part)``, made
        only when no equal part was seen before: a projection keeps the part's keys in their
        order and its values equal (:func:`_projector`), so ``part`` and its projection have
        the same key, and a part seen before (a workload's containers, a condition of a pod
        started in the same second) is found without being projected again."""
        key = _part_key(part)
        if key is None:
            return part if project is None else project(part)
        found = self._parts.get(key)
        if found is not None:
            return found
        if project is not None:
            part = project(part)
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


# --- a pod's watch line, decoded only as far as it is kept, and kept next to its predecessor --


#: Types made at run time, from the raw TypedDicts' hints (opaque to the type checker).
_UNION: Any = Union
_TYPED_DICT: Any = TypedDict


def _decoded(hint: Any) -> Any:
    """The type msgspec decodes a value of type ``hint`` (a raw TypedDict's field) into: the same
    shape, each TypedDict with only its own keys (the others are skipped unread), its leaves of
    the types the hint names (a number's bounds are validation's: ``tomodel``)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return _UNION[tuple(_decoded(arg) for arg in get_args(hint))]
    if origin is list:
        return types.GenericAlias(list, (_decoded(get_args(hint)[0]),))
    if origin is dict:
        key, value = get_args(hint)
        return types.GenericAlias(dict, (key, _decoded(value)))
    if is_typeddict(hint):
        fields = {key: _decoded(value) for key, value in get_type_hints(hint).items()}
        if hint is ManagedFieldsEntryJSON:
            # Only who owns the cost is kept of them (``slim_managed_fields``): the rest of
            # ``fieldsV1``, a third of a pod's JSON, is skipped unread.
            fields = {"manager": str, "fieldsV1": _UNION[_COST_OWNED, None]}
        if hint is ObjectMetaJSON:
            fields["resourceVersion"] = Any
        if hint is PodJSON:
            fields["apiVersion"] = Any
        return _TYPED_DICT(f"Decoded{hint.__name__}", fields, total=False)
    return hint


def _only(name: str, key: str, value: Any) -> Any:
    """A TypedDict of one optional key (a key no class statement can name)."""
    return _TYPED_DICT(name, {key: value}, total=False)


#: What ``cost_managers`` reads of a ``managedFields`` entry's ``fieldsV1``.
_COST_OWNED = _only(
    "_CostOwned",
    "f:metadata",
    _UNION[
        _only("_CostMetadata", "f:annotations", _only("_CostAnnotations", COST_FIELD, Any)), None
    ],
)

_POD_LINE = msgspec.json.Decoder(
    _TYPED_DICT("_PodLine", {"type": Any, "object": _decoded(PodJSON)}, total=False)
)


def decode_pod_line(line: bytes | str) -> tuple[Any, dict[str, Any]] | None:
    """The type and the object of a watch line of pods (``{"type": ..., "object": ...}``), the
    object decoded only as far as an informer keeps it (:func:`keep_pod`'s input): the fields of
    :class:`PodJSON` and its ``apiVersion`` and ``resourceVersion``, of ``managedFields`` only
    who owns the deletion cost; every other field is skipped unread (parsing the whole line took
    longer than this and :func:`keep_pod` together).

    ``None`` when the line is not one this decodes: malformed JSON, an object missing, or a
    field of an unexpected type (a ``Status``, a malformed pod): the caller decodes it whole
    then, as it would have, so that it is refused, or kept malformed, as before. A number beyond
    64 bits is read as the integer it is (``orjson``: a float), which validation refuses the
    same."""
    try:
        event = _POD_LINE.decode(line)
    except msgspec.MsgspecError:
        return None
    obj = event.get("object")
    return (event.get("type"), obj) if isinstance(obj, dict) else None


#: Per section of a pod (``metadata``, ``spec``, ``status``): its class (:data:`_SECTIONS`), and
#: each key with what its value goes through as :func:`project_pod` keeps it: ``None`` kept as
#: it is, ``_intern``, or a projector of the part.
_KEEP_SECTIONS: Final[dict[str, tuple[type, dict[str, Callable[[Any], Any] | None]]]] = {
    section: (
        _SECTIONS[id(_POD_SHAPE[section])],
        {
            sys.intern(key): (None if (project := _projector(shape)) is _as_it_is else project)
            for key, shape in _POD_SHAPE[section].items()
        },
    )
    for section in ("metadata", "spec", "status")
}


def _slim_decoded_managed_fields(meta: dict[str, Any]) -> None:
    """:func:`slim_managed_fields` of a pod :func:`decode_pod_line` decoded (``meta``, its
    metadata, changed in place): the same owners of the cost in the same order, found without
    the checks of every level that a whole pod's free-form ``fieldsV1`` needs (decoded, each is
    an object or null)."""
    owners: list[str] = []
    for entry in meta["managedFields"]:
        fields = entry.get("fieldsV1")
        cost_metadata = fields.get("f:metadata") if fields else None
        annotations = cost_metadata.get("f:annotations") if cost_metadata else None
        if annotations and COST_FIELD in annotations:
            manager = entry.get("manager", "")
            if manager not in owners:
                owners.append(manager)
    _keep_cost_owners(meta, owners)


def _metadata_but_version(meta: dict[str, Any], before: dict[str, Any]) -> dict[str, Any] | None:
    """``before`` (a kept pod's metadata) with the resourceVersion of ``meta`` (a decoded one)
    when nothing else of them differs; else ``None``."""
    if len(meta) != len(before):
        return None
    for key, value in meta.items():
        if key != "resourceVersion" and (key not in before or before[key] != value):
            return None
    same = before.copy()  # a copy shares the keys table too (``_SECTIONS``)
    if "resourceVersion" in meta:
        same["resourceVersion"] = meta["resourceVersion"]
    return same


def slim_decoded_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod``, as :func:`decode_pod_line` decoded it, with of its managed fields only who owns
    the deletion cost and of its conditions only Ready (changed in place, and returned): equal
    then, by value, to what :func:`keep_pod` keeps of it, which only interns its strings and
    shares or reuses its parts. So the informer's store can tell that an update changes nothing
    it keeps from ``pod`` itself, before anything is kept of it (``Store.apply``). Slimming an
    already slim pod leaves it as it is."""
    meta = pod.get("metadata")
    if meta is not None and meta.get("managedFields") is not None:
        _slim_decoded_managed_fields(meta)
    status = pod.get("status")
    if status is not None and (conditions := status.get("conditions")) is not None:
        # Decoded as ``ConditionJSON``: every one is well-formed, so only its type tells
        # whether anything reads it (``_unread_condition``).
        status["conditions"] = [c for c in conditions if c.get("type", "Ready") == "Ready"]
    return pod


def keep_pod(
    pod: dict[str, Any],
    old: Mapping[str, Any] | None,
    shared: SharedParts | None = None,
    *,
    slimmed: bool = False,
) -> dict[str, Any]:
    """What an informer keeps of a pod that :func:`decode_pod_line` decoded (``pod``, whose
    managed fields and conditions are slimmed in place, :func:`slim_decoded_pod`, unless
    ``slimmed`` says they are already): equal to what :func:`project_pod` keeps of the whole pod
    after :func:`slim_managed_fields`, its strings interned and its dicts sharing their keys the
    same way; ``tests/unit/test_pod_lines.py`` checks it.

    ``old`` is the version of the pod the store holds (``None`` for a new pod): each section
    (``spec``, ``status``; ``metadata`` but for its resourceVersion) and each part of one (a map
    or a list under it) equal to the same of ``old`` is taken from ``old``, not interned nor
    offered to ``shared`` again; a watch event changes a part or two of a pod, if any
    (``Store.apply`` then finds that nothing it keeps changed by identity). The other parts
    are projected and shared as :func:`project_pod` does. Equal is Python's ``==``: ``1`` for
    ``1.0`` or ``true`` keeps the earlier of the two, which validation and the quantities read
    the same."""
    if not slimmed:
        slim_decoded_pod(pod)
    kept: dict[str, Any] = _PodRoot().__dict__
    old_get = old.get if isinstance(old, dict) else None
    intern, intern_max = sys.intern, _INTERN_MAX
    for name, value in pod.items():
        section = _KEEP_SECTIONS.get(name)
        if section is None or not isinstance(value, dict):
            kept[name] = _intern(value)
            continue
        cls, fields = section
        before = old_get(name) if old_get is not None else None
        if type(before) is dict:
            # Most events change one section, if any: the others are the version's before.
            if name != "metadata":
                if before == value:
                    kept[name] = before
                    continue
            elif (same := _metadata_but_version(value, before)) is not None:
                kept[name] = same
                continue
        before_get = before.get if isinstance(before, dict) else None
        part_of: dict[str, Any] = cls().__dict__
        for key, item in value.items():
            project = fields[key]
            if type(item) is dict or type(item) is list:
                if item:
                    if before_get is not None:
                        earlier = before_get(key)
                        if earlier is not None and type(earlier) is type(item) and earlier == item:
                            part_of[key] = earlier
                            continue
                    if shared is not None:
                        item = shared.share(item, project)
                    elif project is not None:
                        item = project(item)
                elif project is not None:
                    item = project(item)
            elif project is _intern and type(item) is str:
                item = intern(item) if len(item) <= intern_max else item
            elif project is not None:
                item = project(item)
            part_of[key] = item
        if name == "status" and part_of:
            if before is not None and type(before) is dict and before == part_of:
                part_of = before
            elif shared is not None:
                part_of = shared.share(part_of)
        kept[name] = part_of
    return kept


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
