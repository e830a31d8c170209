"""What a workload's snapshot is built from, in one place: how objects name each other, the
indexes of the informer cache that find a workload's objects, and the builder that reads them.

The watcher service asks :func:`workload_snapshot` for each workload it publishes (after
``podcost_kube.workloads.workload_policy`` says it is ranked), and :func:`convert_snapshot_pods`
for the pods of its first pass; ``podcost explain`` asks for one snapshot. The builder
(:func:`workload_objects`) finds the workload's ReplicaSets, pods and nodes through
:class:`WorkloadIndexes`, takes the objects themselves from the cache (``Store.get``), and hands
them to ``podcost_core.snapshots.snapshot_for_workload``, which makes the model of them. Read it
top to bottom: the references (:func:`controller_of`, :func:`selector_of`), the index entries,
:class:`WorkloadIndexes`, the builder.

:class:`WorkloadIndexes` holds pods by the node they are bound to, and within their namespace by
their controller and by their set of labels, so that a snapshot finds its pods without reading
every pod of the namespace: the pods of a workload share one labels map, so a namespace has
about as many label sets as ReplicaSets, and a selector runs once per label set. It holds
ReplicaSets by their controller too, and a stamp per node that changes with its pods. The cache
(``podcost_kube.store.Store``) owns one and keeps it current on every write
(:meth:`WorkloadIndexes.index`, :meth:`~WorkloadIndexes.reindex`,
:meth:`~WorkloadIndexes.unindex`); the watcher's decisions over a change
(``podcost_kube.workloads``) read its pods by node and the references too. This module imports
no store (the store imports it): the builder reads the cache through :class:`Cache`.

Pure (no I/O, no client library, no clock: the caller passes "now"). Objects are shared with
the cache, not copied: read-only here.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol, cast

from podcost_core.kubejson import (
    LabelSelectorJSON,
    NodeJSON,
    PodJSON,
    WorkloadJSON,
    selector_matches,
)
from podcost_core.model import Resources, Snapshot
from podcost_core.snapshots import (
    ClusterObjects,
    NodeShare,
    NodeUsage,
    UnknownWorkload,
    node_share,
    snapshot_for_workload,
)
from podcost_core.tomodel import pod_from_json
from podcost_kube.objects import DEPLOYMENT, REPLICASET, ObjectKey, RawObject, WorkloadKey
from podcost_kube.podcache import PodCache

#: Where every cache takes its node stamps from (:meth:`WorkloadIndexes.node_stamp`): one count
#: for all the caches of the process, so that no two, nor two states of one node's pods, share
#: a stamp.
_STAMPS = itertools.count(1)

# --- how objects name each other --------------------------------------------------------------


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``obj``'s metadata; empty when it has none, or none that is a map."""
    meta = obj.get("metadata")
    # ``type`` first: the objects the store keeps are dicts, and an ABC's check is slow.
    return meta if type(meta) is dict or isinstance(meta, Mapping) else {}


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with ``controller: true``, if any."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if type(meta) is dict or isinstance(meta, Mapping) else None
    for ref in refs or []:
        if (type(ref) is dict or isinstance(ref, Mapping)) and ref.get("controller"):
            return ref
    return None


def same_object(ref: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    """Whether the owner reference ``ref`` may name ``obj``: their uids agree, or one is
    missing (the name was checked, or is checked, by the caller)."""
    uid, ref_uid = metadata(obj).get("uid"), ref.get("uid")
    return not (uid and ref_uid) or uid == ref_uid


def selector_of(workload: Mapping[str, Any]) -> LabelSelectorJSON | None:
    """``spec.selector`` of a ReplicaSet or Deployment; ``None`` when it has none that is a map."""
    selector = workload.get("spec", {}).get("selector")
    return cast(LabelSelectorJSON, selector) if isinstance(selector, Mapping) else None


# --- the index entries -------------------------------------------------------------------------


def _node_of(kind: str, obj: Mapping[str, Any]) -> str | None:
    if kind != "Pod":
        return None
    spec = obj.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None  # a malformed pod's too
    return node if isinstance(node, str) and node else None


@dataclass(slots=True)
class _SortedPods:
    """The names of the pods of one index entry (a node's in one namespace, a ReplicaSet's, a
    label set's), sorted: 8 bytes a pod where a map by name took 28-36 (its table for a node's or
    a ReplicaSet's 30 pods, allocated outside pymalloc), searched by ``bisect``. The pods
    themselves are the store's, found by name in their namespace when read
    (:meth:`WorkloadIndexes.pods_on_node` ...): an update that leaves a pod in the same entries
    (a status change, most of them) changes no entry at all. A list (a relist) puts its pods in
    name order, at the end, without a search."""

    names: list[str] = field(default_factory=list)
    """The names the store holds the pods under (the pods' own strings)."""

    def put(self, name: str) -> None:
        """Put ``name`` in, if it is not in already."""
        names = self.names
        if not names or names[-1] < name:
            names.append(name)
            return
        index = bisect_left(names, name)
        if index == len(names) or names[index] != name:
            names.insert(index, name)

    def of(self, held: Mapping[str, RawObject]) -> Iterator[tuple[str, RawObject]]:
        """Each pod with its name, in name order, taken from ``held`` (its namespace's pods)."""
        names = self.names
        return zip(names, map(held.__getitem__, names), strict=True)

    def drop(self, name: str) -> None:
        """Drop ``name``, if it is in."""
        index = bisect_left(self.names, name)
        if index < len(self.names) and self.names[index] == name:
            del self.names[index]


#: A pod's labels as a dictionary key: its ``(name, value)`` pairs.
LabelSet = frozenset[tuple[str, str]]


@dataclass(slots=True)
class _LabelGroup:
    """The pods of one namespace with one set of labels."""

    labels: dict[str, str]
    pods: _SortedPods = field(default_factory=_SortedPods)


@dataclass(slots=True)
class _NamespacePods:
    """The pods of one namespace by controller and by label set.

    A pod whose name is not a string, whose labels are not a map of strings, whose
    ownerReferences are not a list, or whose controller's kind or uid cannot be a key is
    *irregular* (no API server serves one): it is in neither index, and while the namespace
    holds one, :meth:`WorkloadIndexes.pods_indexed` says no, and readers read every pod as before.
    """

    by_controller: dict[tuple[Any, Any], _SortedPods] = field(default_factory=dict)
    """(controller kind, controller uid) → its pods."""
    by_labels: dict[LabelSet, _LabelGroup] = field(default_factory=dict)
    by_pair: dict[tuple[str, str], list[LabelSet]] = field(default_factory=dict)
    """(label, value) → the label sets of ``by_labels`` that hold it (a list: most pairs are
    in one or two label sets, and a set of one took 0.2 KB)."""
    irregular: set[Any] = field(default_factory=set)
    """The names of the irregular pods."""


#: What :meth:`WorkloadIndexes.node_load` says of a node without pods held for others.
_NO_LOAD: Final[Mapping[str, Mapping[Any, int]]] = {}

#: Most entries of :attr:`WorkloadIndexes.owners` (then it starts over): about one per
#: ReplicaSet with pods.
OWNERS_KEPT = 4096

#: The kinds whose objects are also indexed by their controller
#: (:meth:`WorkloadIndexes.controlled_by`).
CONTROLLED_KINDS = frozenset({"ReplicaSet"})


@dataclass(slots=True)
class _Controlled:
    """The objects of one kind in one namespace by their controller reference: by the owner's
    uid, and by its name (whatever its kind: readers check it; a key of the reference's own
    strings, no tuple, and a list of a name or two, no set, about 0.4 KB a ReplicaSet less).
    An object whose reference cannot be a key (no API server serves one) is *irregular*: while
    the namespace holds one, readers read them all."""

    by_uid: dict[Any, list[str]] = field(default_factory=dict)
    by_name: dict[Any, list[str]] = field(default_factory=dict)
    irregular: set[str] = field(default_factory=set)


class _Irregular:
    """What :func:`_controller_keys` says of an object whose controller reference cannot be a
    key (:data:`_IRREGULAR`)."""


_IRREGULAR: Final = _Irregular()

#: An object's controller as keys of a :class:`_Controlled`: its uid and its name.
_ControllerKeys = tuple[Any, Any]


def _controller_keys(obj: Mapping[str, Any]) -> _ControllerKeys | _Irregular | None:
    """Where ``obj`` goes in its :class:`_Controlled`: its controller's uid and name; ``None``
    without a controller, :data:`_IRREGULAR` when it cannot be indexed."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return _IRREGULAR
    refs = meta.get("ownerReferences")
    if refs and not isinstance(refs, list):
        return _IRREGULAR
    ref = controller_of(obj)
    if ref is None:
        return None
    keys = ref.get("uid"), ref.get("name")
    try:
        hash(keys)
    except TypeError:
        return _IRREGULAR
    return keys


def _pod_index_keys(pod: Mapping[str, Any]) -> tuple[tuple[Any, Any] | None, LabelSet] | None:
    """Where ``pod`` goes in its namespace's :class:`_NamespacePods`: its controller's kind and
    uid (``None`` without a controller) and its label set; ``None`` when it is irregular."""
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name", ""), str):
        return None
    refs = meta.get("ownerReferences")
    if refs and not isinstance(refs, list):
        return None
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(name, str) and isinstance(value, str) for name, value in labels.items()
    ):
        return None
    controller = None
    ref = controller_of(pod)
    if ref is not None:
        controller = (ref.get("kind"), ref.get("uid"))
        try:
            hash(controller)
        except TypeError:
            return None
    return controller, frozenset(labels.items())


#: The phases of a pod that holds its node no longer (``podcost_core.snapshots._is_active``).
_FINISHED: Final = ("Succeeded", "Failed")


def same_node_share(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two versions of a pod have equal shares of their node (``node_share``) for sure:
    what it reads (the spec, whether it is being deleted, its owners and annotations) is the
    same objects or values in both, and its phase holds the node in both or in neither
    (``Pending`` to ``Running``, a pod started, moves nothing). A status update, the most
    frequent, leaves the informer's kept spec and metadata parts the same objects
    (``keep_pod``)."""
    old_meta, new_meta = old.get("metadata"), new.get("metadata")
    old_status, new_status = old.get("status"), new.get("status")
    return (
        old.get("spec") is new.get("spec")
        and type(old_meta) is dict
        and type(new_meta) is dict
        and old_meta.get("ownerReferences") is new_meta.get("ownerReferences")
        and old_meta.get("annotations") is new_meta.get("annotations")
        and old_meta.get("deletionTimestamp") == new_meta.get("deletionTimestamp")
        and type(old_status) is dict
        and type(new_status) is dict
        and (old_status.get("phase") in _FINISHED) == (new_status.get("phase") in _FINISHED)
    )


#: Whose pods a node's load count (:meth:`WorkloadIndexes.node_load`) holds, in the namespace
#: their workloads are looked up in: a ReplicaSet's controlled pods as the name and uid their
#: controller reference gives (``("rs", name, uid)``), any other pod as itself, by the
#: namespace and name the store holds it under (``("pod", namespace, name)``). The workloads of
#: the first are the ReplicaSet's, found without a pod; those of the others depend on their
#: labels, read from the pod.
LoadGroup = tuple[str, str, str | None]


def _load_group(namespace: str, name: str, pod: Mapping[str, Any]) -> tuple[str, LoadGroup]:
    """The namespace ``workloads_of_pod`` looks ``pod``'s workloads up in, and the
    :data:`LoadGroup` it is counted in there (the pod stored under ``namespace`` and
    ``name``)."""
    meta = metadata(pod)
    ref = controller_of(pod)
    looked_up = str(meta.get("namespace", ""))
    if ref is not None and ref.get("kind") == REPLICASET:
        owner, uid = ref.get("name", ""), ref.get("uid")
        if type(owner) is str and (uid is None or type(uid) is str):
            return looked_up, ("rs", owner, uid)
    return looked_up, ("pod", namespace, name)


# --- the indexes -------------------------------------------------------------------------------


@dataclass(slots=True)
class WorkloadIndexes:
    """Pods by the node they are bound to, and within their namespace by controller and by
    label set; the :data:`CONTROLLED_KINDS` by controller; a stamp per node. Written by the
    cache that owns them (``Store``), on every write; read by the builder below."""

    _objects: Mapping[str, Mapping[str, Mapping[str, RawObject]]]
    """The owner's objects, kind → namespace → name → object (shared, not copied): where
    :meth:`controlled_by` takes the objects it finds."""
    _pods_by_node: dict[str, dict[str, _SortedPods]] = field(default_factory=dict)
    """node name → namespace → its pods there (no key object of its own per pod)."""
    _pods_by_namespace: dict[str, _NamespacePods] = field(default_factory=dict)
    """namespace → its pods by controller and by label set."""
    _controlled: dict[tuple[str, str], _Controlled] = field(default_factory=dict)
    """(kind, namespace) → its objects by controller, for the :data:`CONTROLLED_KINDS`."""
    _node_stamps: dict[str, int] = field(default_factory=dict)
    """node name → the stamp of the last change of the pods bound to it (:meth:`node_stamp`);
    none for a node without pods."""
    _node_load: dict[str, tuple[list[int], dict[str, dict[LoadGroup, int]]]] = field(
        default_factory=dict
    )
    """node name → how many pods it holds for others (in a list of one, changed in place) and
    how many of them each :data:`LoadGroup` of each namespace has (:meth:`node_load`); none
    for a node without such pods."""
    _shares_seen: list[tuple[RawObject, NodeShare | None]] = field(default_factory=list)
    """The pods the last writes counted, with their ``node_share`` (:meth:`share_of`): two."""
    load_groups: dict[tuple[str, str, str | None], tuple[RawObject, frozenset[WorkloadKey]]] = (
        field(default_factory=dict)
    )
    """What ``podcost_kube.workloads.node_load_neighbours`` found for a ReplicaSet's
    :data:`LoadGroup` by its namespace, name and uid: that ReplicaSet as the store held it, and
    its workloads. Good while the
    store holds that object (the reader checks); at most :data:`OWNERS_KEPT` entries."""
    owners: dict[tuple[str, int], tuple[object, str, RawObject, frozenset[WorkloadKey]]] = field(
        default_factory=dict
    )
    """What ``podcost_kube.workloads.workloads_of_pod`` found for the pods of a namespace with
    one owner references list (by its identity: the informer shares equal lists between pods):
    that list (kept, so that no other takes its identity), the name of the ReplicaSet it names,
    that ReplicaSet as the store held it, and the workloads. Good while the store holds that
    ReplicaSet object (the reader checks); at most :data:`OWNERS_KEPT` entries."""

    # --- reading ------------------------------------------------------------------------------

    def _pods_of(self, namespace: str) -> Mapping[str, RawObject]:
        """The pods of ``namespace`` by name (the store's own map, read-only here)."""
        return self._objects.get("Pod", {}).get(namespace, {})

    def pods_on_node(self, node: str) -> list[RawObject]:
        """The pods bound to ``node`` (any phase), sorted by namespace and name."""
        by_namespace = self._pods_by_node.get(node, {})
        return [
            pod
            for ns in sorted(by_namespace)
            for pod in map(self._pods_of(ns).__getitem__, by_namespace[ns].names)
        ]

    def each_pod_on_node(self, node: str) -> Iterator[RawObject]:
        """:meth:`pods_on_node`, one at a time: for a reader that may stop after a few."""
        by_namespace = self._pods_by_node.get(node, {})
        for ns in sorted(by_namespace):
            yield from map(self._pods_of(ns).__getitem__, by_namespace[ns].names)

    def keyed_pods_on_node(self, node: str) -> list[tuple[str, str, RawObject]]:
        """:meth:`pods_on_node` with each pod's namespace and name (as strings), in that order."""
        by_namespace = self._pods_by_node.get(node, {})
        return [
            (ns, name, pod)
            for ns in sorted(by_namespace)
            for name, pod in by_namespace[ns].of(self._pods_of(ns))
        ]

    def controlled_by(
        self, kind: str, namespace: str, owner_name: Any, owner_uid: Any
    ) -> list[RawObject] | None:
        """The objects of ``kind`` (one of the :data:`CONTROLLED_KINDS`) in ``namespace`` whose
        controller reference names an owner by ``owner_uid`` (when it is not empty) or by
        ``owner_name``, sorted by name: every object that a check of the reference by uid, or
        by name where a uid is missing, could accept, and some it may not (of an owner of
        another kind, say: the caller checks each). ``None`` when the namespace holds an object
        of ``kind`` whose reference cannot be indexed, or the owner cannot be looked up: read
        them all."""
        index = self._controlled.get((kind, namespace))
        if index is None:
            return []
        if index.irregular:
            return None
        try:
            names = set(index.by_name.get(owner_name, ()))
            if owner_uid:
                names.update(index.by_uid.get(owner_uid, ()))
        except TypeError:  # an owner whose name or uid cannot be a key
            return None
        held = self._objects.get(kind, {}).get(namespace, {})
        return [held[name] for name in sorted(names)]

    def node_stamp(self, node: str) -> int:
        """A number that changes whenever a pod bound to ``node`` is added, replaced or removed,
        or is bound to it or leaves it: what is computed from a node's pods (what they request,
        ``PodCache.node_usage``) holds as long as its stamp does. Unique in the process, never
        reused; 0 while no pod is bound to the node."""
        return self._node_stamps.get(node, 0)

    def _touch(self, node: str) -> None:
        self._node_stamps[node] = next(_STAMPS)

    def node_load(self, node: str) -> tuple[int, Mapping[str, Mapping[LoadGroup, int]]]:
        """How many pods ``node`` holds for others, and how many of them each
        :data:`LoadGroup` of each namespace has: the pods bound to it whose ``node_share`` is
        not ``None`` (active, readable) and not a daemon pod's, counted as a snapshot counts a
        node's other pods (``podcost_core.snapshots._nodes_for``). Kept current on every write,
        so that whether a pod change makes a node start or stop holding other workloads' pods
        (``podcost_kube.workloads.node_load_neighbours``) is read from a few counts rather than
        from every pod on the node. Read-only."""
        found = self._node_load.get(node)
        return (found[0][0], found[1]) if found is not None else (0, _NO_LOAD)

    def share_of(self, pod: Mapping[str, Any]) -> NodeShare | None:
        """``node_share(pod)``, not computed again for a version of a pod the last write
        counted in or out of its node's load (the change a handler is called with)."""
        for seen, share in self._shares_seen:
            if seen is pod:
                return share
        return node_share(pod)

    def _count_load(self, node: str, namespace: str, name: str, pod: RawObject, step: int) -> None:
        """Count ``pod`` (bound to ``node``) in or out (``step``) of the node's load."""
        share = node_share(pod)
        seen = self._shares_seen
        if len(seen) >= 2:
            del seen[0]
        seen.append((pod, share))
        if share is None or share[2]:
            return
        namespace, group = _load_group(namespace, name, pod)
        load = self._node_load.get(node)
        if load is None:
            load = self._node_load[node] = ([0], {})
        total, by_namespace = load
        total[0] += step
        groups = by_namespace.get(namespace)
        if groups is None:
            groups = by_namespace[namespace] = {}
        count = groups.get(group, 0) + step
        if count:
            groups[group] = count
            return
        del groups[group]
        if not groups:
            del by_namespace[namespace]
            if not by_namespace:
                del self._node_load[node]

    def pods_indexed(self, namespace: str) -> bool:
        """Whether :meth:`pods_controlled_by` and :meth:`pod_label_sets` hold every pod of
        ``namespace``: no pod of it is irregular (see ``_NamespacePods``)."""
        index = self._pods_by_namespace.get(namespace)
        return index is None or not index.irregular

    def pods_controlled_by(
        self, namespace: str, kind: Any, uid: Any
    ) -> Iterable[tuple[str, RawObject]]:
        """The pods of ``namespace`` whose controller owner reference has ``kind`` and ``uid``,
        with their names, sorted by name; only when :meth:`pods_indexed`."""
        index = self._pods_by_namespace.get(namespace)
        found = index.by_controller.get((kind, uid)) if index is not None else None
        return found.of(self._pods_of(namespace)) if found is not None else ()

    def pod_label_sets(
        self, namespace: str
    ) -> Iterator[tuple[Mapping[str, str], Iterable[tuple[str, RawObject]]]]:
        """Each distinct set of labels of the pods of ``namespace`` (missing labels are empty
        ones) with its pods and their names, sorted by name, the sets unsorted; only when
        :meth:`pods_indexed`."""
        index = self._pods_by_namespace.get(namespace)
        if index is not None:
            held = self._pods_of(namespace)
            for group in index.by_labels.values():
                yield group.labels, group.pods.of(held)

    def pod_label_sets_with(
        self, namespace: str, pairs: Iterable[tuple[str, str]]
    ) -> Iterator[tuple[Mapping[str, str], Iterable[tuple[str, RawObject]]]]:
        """:meth:`pod_label_sets` of the label sets holding at least one of ``pairs`` (a label
        and its value), each once: all a selector that requires one of them can match."""
        index = self._pods_by_namespace.get(namespace)
        if index is None:
            return
        chosen: set[LabelSet] = set()
        for pair in pairs:
            chosen.update(index.by_pair.get(pair, ()))
        held = self._pods_of(namespace)
        for labels in chosen:
            group = index.by_labels[labels]
            yield group.labels, group.pods.of(held)

    # --- writing (by the cache, on every write) -----------------------------------------------

    def index(self, key: ObjectKey, new: RawObject) -> None:
        """Index ``new``, stored under ``key`` in place of nothing, or of an object
        :meth:`unindex` took out (nothing for the kinds not indexed)."""
        if key.kind in CONTROLLED_KINDS:
            self._index_controlled(key, new)
        if key.kind != "Pod":
            return
        node = _node_of(key.kind, new)
        if node is not None:
            by_namespace = self._pods_by_node.get(node)
            if by_namespace is None:
                by_namespace = self._pods_by_node[node] = {}
            on_node = by_namespace.get(key.namespace)
            if on_node is None:
                on_node = by_namespace[key.namespace] = _SortedPods()
            on_node.put(key.name)
            self._touch(node)
            self._count_load(node, key.namespace, key.name, new, 1)
        index = self._pods_by_namespace.get(key.namespace)
        if index is None:
            index = self._pods_by_namespace[key.namespace] = _NamespacePods()
        keys = _pod_index_keys(new)
        if keys is None:
            index.irregular.add(key.name)
            return
        controller, labels = keys
        if controller is not None:
            controlled = index.by_controller.get(controller)
            if controlled is None:
                controlled = index.by_controller[controller] = _SortedPods()
            controlled.put(key.name)
        group = index.by_labels.get(labels)
        if group is None:
            group = index.by_labels[labels] = _LabelGroup(dict(labels))
            for pair in labels:
                index.by_pair.setdefault(pair, []).append(labels)
        group.pods.put(key.name)

    def reindex(self, key: ObjectKey, old: RawObject, new: RawObject) -> bool:
        """Whether ``new``, stored under ``key`` in the place of ``old``, goes in the same index
        entries (same node, controller and labels: most updates), which then stay as they are
        (they hold names); its node's stamp moves on."""
        if key.kind in CONTROLLED_KINDS:
            return _controller_keys(new) == _controller_keys(old)
        if key.kind != "Pod":
            return True
        node = _node_of(key.kind, new)
        if node != _node_of(key.kind, old):
            return False
        old_meta, new_meta = old.get("metadata"), new.get("metadata")
        same_parts = (
            type(old_meta) is dict
            and type(new_meta) is dict
            and old_meta.get("name") is new_meta.get("name")
            and old_meta.get("labels") is new_meta.get("labels")
            and old_meta.get("ownerReferences") is new_meta.get("ownerReferences")
        )  # what the keys are made of, the same objects (the informer keeps them so): same keys
        if not same_parts:
            keys = _pod_index_keys(new)
            if keys is None or keys != _pod_index_keys(old):
                return False
        if node is not None:
            self._touch(node)
            if not same_node_share(old, new):
                self._count_load(node, key.namespace, key.name, old, -1)
                self._count_load(node, key.namespace, key.name, new, 1)
        return True

    def _index_controlled(self, key: ObjectKey, obj: RawObject) -> None:
        keys = _controller_keys(obj)
        if keys is None:
            return
        index = self._controlled.get((key.kind, key.namespace))
        if index is None:
            index = self._controlled[(key.kind, key.namespace)] = _Controlled()
        if isinstance(keys, _Irregular):
            index.irregular.add(key.name)
            return
        for table, entry in zip((index.by_uid, index.by_name), keys, strict=True):
            names = table.get(entry)
            if names is None:
                table[entry] = [key.name]
            elif key.name not in names:
                names.append(key.name)

    def _unindex_controlled(self, key: ObjectKey, old: RawObject) -> None:
        index = self._controlled.get((key.kind, key.namespace))
        keys = _controller_keys(old)  # unchanged since it was indexed: the same keys
        if index is None or keys is None:
            return
        if isinstance(keys, _Irregular):
            index.irregular.discard(key.name)
        else:
            for table, entry in zip((index.by_uid, index.by_name), keys, strict=True):
                names = table.get(entry)
                if names is not None and key.name in names:
                    names.remove(key.name)
                    if not names:
                        del table[entry]
        if not index.by_uid and not index.by_name and not index.irregular:
            del self._controlled[(key.kind, key.namespace)]

    def unindex(self, key: ObjectKey, old: RawObject) -> None:
        """Take ``old``, stored under ``key``, out of every index entry it is in."""
        if key.kind in CONTROLLED_KINDS:
            self._unindex_controlled(key, old)
        if key.kind != "Pod":
            return
        node = _node_of(key.kind, old)
        if node is not None:
            self._count_load(node, key.namespace, key.name, old, -1)
            by_namespace = self._pods_by_node.get(node, {})
            on_node = by_namespace.get(key.namespace)
            if on_node is not None:
                on_node.drop(key.name)
                if not on_node.names:
                    del by_namespace[key.namespace]
            if by_namespace:
                self._touch(node)
            else:
                self._pods_by_node.pop(node, None)
                self._node_stamps.pop(node, None)
        index = self._pods_by_namespace.get(key.namespace)
        if index is None:
            return
        # The object is unchanged since it was indexed, so it has the same keys now.
        keys = _pod_index_keys(old)
        if keys is None:
            index.irregular.discard(key.name)
        else:
            controller, labels = keys
            if controller is not None and controller in index.by_controller:
                controlled = index.by_controller[controller]
                controlled.drop(key.name)
                if not controlled.names:
                    del index.by_controller[controller]
            group = index.by_labels.get(labels)
            if group is not None:
                group.pods.drop(key.name)
                if not group.pods.names:
                    del index.by_labels[labels]
                    for pair in labels:
                        holding = index.by_pair[pair]
                        holding.remove(labels)
                        if not holding:
                            del index.by_pair[pair]
        if not index.by_labels and not index.irregular:
            del self._pods_by_namespace[key.namespace]


# --- the builder -------------------------------------------------------------------------------


class Cache(Protocol):
    """What the builder reads of the informer cache (``podcost_kube.store.Store``): its objects
    by kind, namespace and name, and the indexes it keeps of them."""

    @property
    def indexes(self) -> WorkloadIndexes: ...

    def get(self, kind: str, namespace: str, name: str) -> RawObject | None: ...

    def objects(self, kind: str, namespace: str | None = None) -> list[RawObject]: ...


#: What :func:`workload_objects` asks for a node's usage: the node, its stamp
#: (:meth:`WorkloadIndexes.node_stamp`) and its pods (``PodCache.node_usage``).
UsageOf = Callable[[str, int, Sequence[RawObject]], NodeUsage]


def workload_objects(
    store: Cache, key: WorkloadKey, *, with_nodes: bool = True, usage: UsageOf | None = None
) -> ClusterObjects:
    """The objects the snapshot of ``key`` is built from, and no others.

    The workload; the ReplicaSets of its namespace related to it (``_replicasets_related``);
    the pods its ReplicaSets control or whose labels one of their selectors matches (adoptable
    orphans and bystanders); the nodes of those pods and every pod on those nodes (for
    ``Node.requested``; not with ``with_nodes=False``, which leaves the snapshot's pods as they
    are and its nodes without what they hold). With ``usage``, each node's usage is asked of it
    and handed over (``ClusterObjects.node_usage``), so that the snapshot does not sum it again.
    Objects come from the API, so they are taken as they are; ``pod_from_json`` validates every
    pod it converts.

    The pods are found through the store's indexes (by controller, and one selector run per
    distinct label set, only on the label sets holding a label the selectors require when each
    requires one: :func:`_required_pairs`), not by reading every pod of the namespace. A
    namespace holding a pod the indexes cannot stand for, or an object that makes the indexed
    way fail, is read pod by pod as before (:func:`_workload_objects_by_scan`): the answer, or
    the error, is the same.
    """
    if store.indexes.pods_indexed(key.namespace):
        try:
            return _workload_objects_indexed(store, key, with_nodes=with_nodes, usage=usage)
        except Exception:  # a malformed object (or no workload): the scan answers or raises
            pass
    return _workload_objects_by_scan(store, key, with_nodes=with_nodes, usage=usage)


def _pod_rules(
    store: Cache, key: WorkloadKey
) -> tuple[ClusterObjects, set[Any], list[LabelSelectorJSON | None]]:
    """The workload's objects without pods or nodes, the uids of the ReplicaSets whose pods are
    the workload's, and the selectors of the ReplicaSets related to it."""
    workload = store.get(key.kind, key.namespace, key.name)
    if workload is None:
        raise UnknownWorkload(f"no {key.kind} {key.namespace}/{key.name} in the cache")
    objects = ClusterObjects()
    replicasets = _replicasets_related(store, key, workload)
    for rs in replicasets:
        objects.replicasets[(key.namespace, _name(rs))] = cast(WorkloadJSON, rs)
    # The ReplicaSets whose pods the workload owns, and those whose selectors count (for a
    # ReplicaSet, every ReplicaSet of its controller: the ReplicaSet controller relates them).
    if key.kind == DEPLOYMENT:
        objects.deployments[(key.namespace, key.name)] = cast(WorkloadJSON, workload)
        mine = [rs for rs in replicasets if _controlled_by(rs, DEPLOYMENT, workload)]
        related = mine
    else:
        mine = [workload]
        owner = controller_of(workload)
        related = [
            rs
            for rs in replicasets
            if owner is not None
            and (ref := controller_of(rs)) is not None
            and _same_ref(ref, owner)
        ] or mine
    uids = {metadata(rs).get("uid") for rs in mine}
    selectors = [selector_of(rs) for rs in related]
    return objects, uids, selectors


def _replicasets_related(store: Cache, key: WorkloadKey, workload: RawObject) -> list[RawObject]:
    """The ReplicaSets of the namespace that a snapshot of ``key`` may read, sorted by name:
    for a Deployment, those whose controller reference names it; for a ReplicaSet, itself and
    those whose controller reference names its controller (the ReplicaSet controller relates
    them). Found through the store's index of ReplicaSets by controller, a superset that the
    reference checks here and in ``snapshot_for_workload`` narrow as they did over every
    ReplicaSet of the namespace (which a namespace of 1,334 Deployments made most of a
    snapshot's time); every ReplicaSet of the namespace where the index cannot say."""
    indexes = store.indexes
    if key.kind == DEPLOYMENT:
        meta = metadata(workload)
        found = indexes.controlled_by(REPLICASET, key.namespace, meta.get("name"), meta.get("uid"))
    else:
        owner = controller_of(workload)
        found = (
            []
            if owner is None
            else indexes.controlled_by(
                REPLICASET, key.namespace, owner.get("name"), owner.get("uid")
            )
        )
        if found is not None and not any(rs is workload for rs in found):
            found = sorted([*found, workload], key=_name)
    return store.objects(REPLICASET, key.namespace) if found is None else found


def _workload_objects_indexed(
    store: Cache, key: WorkloadKey, *, with_nodes: bool = True, usage: UsageOf | None = None
) -> ClusterObjects:
    objects, uids, selectors = _pod_rules(store, key)
    indexes = store.indexes
    found: dict[str, RawObject] = {}
    for uid in uids:
        found.update(indexes.pods_controlled_by(key.namespace, REPLICASET, uid))
    pairs = _required_pairs(selectors)
    groups = (
        indexes.pod_label_sets(key.namespace)
        if pairs is None
        else indexes.pod_label_sets_with(key.namespace, pairs)
    )
    for labels, pods in groups:
        if any(selector_matches(selector, labels) for selector in selectors):
            found.update(pods)
    nodes: set[str] = set()
    for name in sorted(found):
        pod = found[name]
        objects.pods[(key.namespace, name)] = cast(PodJSON, pod)
        node = pod.get("spec", {}).get("nodeName")
        if node:
            nodes.add(node)
    if with_nodes:
        _add_nodes(store, objects, nodes, usage)
    return objects


def _required_pairs(selectors: list[LabelSelectorJSON | None]) -> set[tuple[str, str]] | None:
    """A label and value each of ``selectors`` requires (the first of its ``matchLabels``; a
    missing selector matches nothing and requires none), so that only the label sets holding
    one of them need its check: a namespace of 1,334 Deployments has as many label sets, and
    the check of each was a third of a snapshot's time. ``None`` when a selector requires none
    that way (``matchExpressions`` alone, or empty, or malformed): every label set is checked."""
    pairs: set[tuple[str, str]] = set()
    for selector in selectors:
        if selector is None:
            continue
        wanted = selector.get("matchLabels") if isinstance(selector, Mapping) else None
        if not isinstance(wanted, Mapping) or not wanted:
            return None
        label, value = next(iter(wanted.items()))
        if not (isinstance(label, str) and isinstance(value, str)):
            return None
        pairs.add((label, value))
    return pairs


def _workload_objects_by_scan(
    store: Cache, key: WorkloadKey, *, with_nodes: bool = True, usage: UsageOf | None = None
) -> ClusterObjects:
    """:func:`workload_objects` reading every pod of the namespace: what it did before the
    store's pod indexes, and what it still does where they cannot stand for every pod."""
    objects, uids, selectors = _pod_rules(store, key)
    nodes: set[str] = set()
    for pod in store.objects("Pod", key.namespace):
        ref = controller_of(pod)
        labels = metadata(pod).get("labels") or {}
        if (ref is not None and ref.get("kind") == REPLICASET and ref.get("uid") in uids) or any(
            selector_matches(selector, labels) for selector in selectors
        ):
            objects.pods[(key.namespace, _name(pod))] = cast(PodJSON, pod)
            node = pod.get("spec", {}).get("nodeName")
            if node:
                nodes.add(node)
    if with_nodes:
        _add_nodes(store, objects, nodes, usage)
    return objects


def _add_nodes(
    store: Cache, objects: ClusterObjects, nodes: set[str], usage: UsageOf | None = None
) -> None:
    """Add ``nodes`` and every pod bound to them (for ``Node.requested``), and with ``usage``
    each node's usage."""
    indexes = store.indexes
    for node in sorted(nodes):
        raw_node = store.get("Node", "", node)
        if raw_node is not None:
            objects.nodes[node] = cast(NodeJSON, raw_node)
        on_node = indexes.keyed_pods_on_node(node)
        for namespace, name, pod in on_node:
            objects.pods.setdefault((namespace, name), cast(PodJSON, pod))
        if usage is not None:
            objects.node_usage[node] = usage(
                node, indexes.node_stamp(node), [pod for _, _, pod in on_node]
            )


def _controlled_by(obj: Mapping[str, Any], kind: str, owner: Mapping[str, Any]) -> bool:
    ref = controller_of(obj)
    return (
        ref is not None
        and ref.get("kind") == kind
        and ref.get("name") == metadata(owner).get("name")
        and same_object(ref, owner)
    )


def _same_ref(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.get("kind") != b.get("kind"):
        return False
    if a.get("uid") and b.get("uid"):
        return bool(a.get("uid") == b.get("uid"))
    return bool(a.get("name") == b.get("name"))


def _name(obj: RawObject) -> str:
    return str(metadata(obj).get("name", ""))


def workload_snapshot(
    store: Cache,
    key: WorkloadKey,
    *,
    cluster: str = "local",
    version: int = 0,
    taken_at: float = 0.0,
    pods: PodCache | None = None,
) -> Snapshot:
    """The whole current view of workload ``key``, as ``snapshot_for_workload`` builds it, with
    the per-workload ``version`` and ``taken_at`` ("now") the caller gives; pods are converted
    through ``pods`` when given (the watcher's cache).

    Raises ``UnknownWorkload`` when the workload is not in the store, ``ConversionError`` when
    an object cannot be read.
    """
    objects = workload_objects(store, key, usage=pods.node_usage if pods is not None else None)
    snapshot = snapshot_for_workload(
        objects,
        key.namespace,
        key.name,
        key.kind,
        cluster,
        convert_pod=pods.convert if pods is not None else pod_from_json,
        requests_of=pods.requests if pods is not None else None,
        convert_node=pods.node if pods is not None else None,
    )
    return replace(snapshot, version=version, taken_at=taken_at)


def _no_sum(raw: Mapping[str, Any]) -> Resources:
    return Resources()


def convert_snapshot_pods(store: Cache, key: WorkloadKey, pods: PodCache) -> None:
    """Convert through ``pods`` exactly the pods :func:`workload_snapshot` of ``key`` converts
    (and reports), without summing the requests of the other pods on their nodes, and build no
    snapshot: what the watcher's first pass does for every workload before it publishes any.

    Summing, as a snapshot does, the requests of the pods on its nodes that no snapshot has
    converted yet keeps a summed entry per pod in ``pods`` until that pod is converted
    (``PodCache.requests``): thousands of short-lived entries, while the first pass converts,
    strewn among the ``Pod`` objects the cache keeps, left holes the allocator could not give
    back (10,000 pods: 1.2 MB of free pool blocks, ``tests.bench.bench_scale --service watcher
    --heap-dump``). Once every pod of the pass is converted, publishing sums each pod's
    requests from its ``Pod``. Nor are the nodes read: the pods a snapshot converts are those of
    the workload's ReplicaSets and selectors, whatever their nodes hold.

    Raises ``UnknownWorkload`` without the workload, ``ConversionError`` for a pod it cannot
    read."""
    snapshot_for_workload(
        workload_objects(store, key, with_nodes=False),
        key.namespace,
        key.name,
        key.kind,
        convert_pod=pods.convert,
        requests_of=_no_sum,
    )
