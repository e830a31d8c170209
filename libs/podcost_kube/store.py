"""The informer cache: raw Kubernetes objects by (kind, namespace, name), with the indexes the
watcher asks for, and the changes each write makes.

Pure data structure (no I/O, no client library): ``podcost_kube.informer`` writes into it from
list and watch responses and calls its handlers with the :class:`Change` each write returns;
``podcost_kube.workloads`` reads it to find the workloads a change touches and to build their
snapshots. Objects are stored as the API serves them (``kubectl get -o json`` shapes; the informer
keeps of a pod only the fields podcost reads, ``podcost_core.convert.project_pod``) and are
shared, not copied: readers must treat them as read-only.

Pods are also indexed by the node they are bound to, and within their namespace by their
controller and by their set of labels, so that a workload's snapshot finds its pods without
reading every pod of the namespace: the pods of a workload share one labels map, so a
namespace has about as many label sets as ReplicaSets, and a selector runs once per label set.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

#: One object as the API serves it.
RawObject = dict[str, Any]

#: Where every store takes its node stamps from (:meth:`Store.node_stamp`): one count for all the
#: stores of the process, so that no two stores, nor two states of one node's pods, share a stamp.
_STAMPS = itertools.count(1)


class ChangeType(StrEnum):
    """What happened to an object, as a watch names it."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True, order=True)
class ObjectKey:
    """Where an object lives in the store. ``namespace`` is ``""`` for cluster-scoped kinds."""

    kind: str
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Change:
    """One change of the store, handed to the informer's handlers.

    ``old`` is the object before (``None`` when added), ``new`` after (``None`` when deleted).
    """

    kind: str
    type: ChangeType
    old: RawObject | None
    new: RawObject | None

    @property
    def obj(self) -> RawObject:
        """The object as it is now, or as it was last seen when deleted."""
        found = self.new if self.new is not None else self.old
        assert found is not None, "a change has an old or a new object"
        return found

    @property
    def key(self) -> ObjectKey:
        return object_key(self.kind, self.obj)


def object_key(kind: str, obj: Mapping[str, Any]) -> ObjectKey:
    """The store key of ``obj`` of ``kind``: text, whatever a malformed object holds (a name
    that is a number would otherwise be compared with names, and sorting raised TypeError)."""
    meta = obj.get("metadata", {})
    return ObjectKey(kind, _text(meta.get("namespace")), _text(meta.get("name")))


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def resource_version(obj: Mapping[str, Any]) -> str:
    """``metadata.resourceVersion``; ``""`` when absent."""
    version = obj.get("metadata", {}).get("resourceVersion", "")
    return str(version)


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with ``controller: true``, if any."""
    meta = obj.get("metadata")
    for ref in (meta.get("ownerReferences") if isinstance(meta, Mapping) else None) or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def _node_of(kind: str, obj: Mapping[str, Any]) -> str | None:
    if kind != "Pod":
        return None
    node = obj.get("spec", {}).get("nodeName")
    return node if isinstance(node, str) and node else None


@dataclass(slots=True)
class _SortedPods:
    """Pods of one index entry (a node's in one namespace, a ReplicaSet's, a label set's) sorted
    by name, their names alongside: 16 bytes a pod where a map by name took 28-36 (its table for
    a node's or a ReplicaSet's 30 pods, allocated outside pymalloc), searched by
    ``bisect`` on the names. A list (a relist) puts its pods in name order, at the end, without
    a search."""

    names: list[str] = field(default_factory=list)
    """The names the store holds the pods under (the pods' own strings)."""
    pods: list[RawObject] = field(default_factory=list)

    def put(self, name: str, pod: RawObject) -> None:
        """Put ``pod`` under ``name``, in place of the one held under it if there is one."""
        names = self.names
        if not names or names[-1] < name:
            names.append(name)
            self.pods.append(pod)
            return
        index = bisect_left(names, name)
        if index < len(names) and names[index] == name:
            self.pods[index] = pod
        else:
            names.insert(index, name)
            self.pods.insert(index, pod)

    def __iter__(self) -> Iterator[tuple[str, RawObject]]:
        """Each pod with its name, in name order."""
        return zip(self.names, self.pods, strict=True)

    def drop(self, name: str) -> None:
        """Drop the pod held under ``name``, if there is one."""
        index = bisect_left(self.names, name)
        if index < len(self.names) and self.names[index] == name:
            del self.names[index]
            del self.pods[index]


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
    holds one, :meth:`Store.pods_indexed` says no, and readers read every pod as before.
    """

    by_controller: dict[tuple[Any, Any], _SortedPods] = field(default_factory=dict)
    """(controller kind, controller uid) → its pods."""
    by_labels: dict[LabelSet, _LabelGroup] = field(default_factory=dict)
    by_pair: dict[tuple[str, str], list[LabelSet]] = field(default_factory=dict)
    """(label, value) → the label sets of ``by_labels`` that hold it (a list: most pairs are
    in one or two label sets, and a set of one took 0.2 KB)."""
    irregular: set[Any] = field(default_factory=set)
    """The names of the irregular pods."""


#: The kinds whose objects the store also indexes by their controller (:meth:`Store.controlled_by`).
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


@dataclass(slots=True)
class Store:
    """Raw objects by kind, namespace and name; pods also by the node they are bound to, and
    within their namespace by controller and by label set."""

    _objects: dict[str, dict[str, dict[str, RawObject]]] = field(default_factory=dict)
    """kind → namespace → name → object."""
    _pods_by_node: dict[str, dict[str, _SortedPods]] = field(default_factory=dict)
    """node name → namespace → its pods there (no key object of its own per pod)."""
    _pods_by_namespace: dict[str, _NamespacePods] = field(default_factory=dict)
    """namespace → its pods by controller and by label set."""
    _controlled: dict[tuple[str, str], _Controlled] = field(default_factory=dict)
    """(kind, namespace) → its objects by controller, for the :data:`CONTROLLED_KINDS`."""
    _node_stamps: dict[str, int] = field(default_factory=dict)
    """node name → the stamp of the last change of the pods bound to it (:meth:`node_stamp`);
    none for a node without pods."""

    # --- reading ------------------------------------------------------------------------------

    def get(self, kind: str, namespace: str, name: str) -> RawObject | None:
        """One object, or ``None``."""
        return self._objects.get(kind, {}).get(namespace, {}).get(name)

    def objects(self, kind: str, namespace: str | None = None) -> list[RawObject]:
        """The objects of ``kind`` (in one namespace if given), sorted by namespace and name."""
        by_namespace = self._objects.get(kind, {})
        if namespace is not None:
            chosen = by_namespace.get(namespace, {})
            return [chosen[name] for name in sorted(chosen)]
        return [
            by_namespace[ns][name]
            for ns in sorted(by_namespace)
            for name in sorted(by_namespace[ns])
        ]

    def keys(self, kind: str) -> Iterator[ObjectKey]:
        """The keys of every object of ``kind``, unsorted."""
        for namespace, named in self._objects.get(kind, {}).items():
            for name in named:
                yield ObjectKey(kind, namespace, name)

    def pods_on_node(self, node: str) -> list[RawObject]:
        """The pods bound to ``node`` (any phase), sorted by namespace and name."""
        by_namespace = self._pods_by_node.get(node, {})
        return [pod for ns in sorted(by_namespace) for pod in by_namespace[ns].pods]

    def keyed_pods_on_node(self, node: str) -> list[tuple[str, str, RawObject]]:
        """:meth:`pods_on_node` with each pod's namespace and name (as strings), in that order."""
        by_namespace = self._pods_by_node.get(node, {})
        return [
            (ns, name, pod)
            for ns in sorted(by_namespace)
            for name, pod in zip(by_namespace[ns].names, by_namespace[ns].pods, strict=True)
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
        return found if found is not None else ()

    def pod_label_sets(
        self, namespace: str
    ) -> Iterator[tuple[Mapping[str, str], Iterable[tuple[str, RawObject]]]]:
        """Each distinct set of labels of the pods of ``namespace`` (missing labels are empty
        ones) with its pods and their names, sorted by name, the sets unsorted; only when
        :meth:`pods_indexed`."""
        index = self._pods_by_namespace.get(namespace)
        if index is not None:
            for group in index.by_labels.values():
                yield group.labels, group.pods

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
        for labels in chosen:
            group = index.by_labels[labels]
            yield group.labels, group.pods

    def count(self, kind: str) -> int:
        """How many objects of ``kind`` the store holds."""
        return sum(len(named) for named in self._objects.get(kind, {}).values())

    # --- writing ------------------------------------------------------------------------------

    def apply(self, kind: str, change_type: ChangeType, obj: RawObject) -> Change | None:
        """Apply one watch event; the change it makes, or ``None`` when it changes nothing.

        ``ADDED`` and ``MODIFIED`` both upsert (which one the change is depends on what the store
        held, so a replayed event cannot corrupt it); an event carrying the resourceVersion
        already stored is a duplicate and changes nothing; deleting an unknown object too.
        """
        key = object_key(kind, obj)
        old = self.get(kind, key.namespace, key.name)
        if change_type is ChangeType.DELETED:
            if old is None:
                return None
            self._remove(key, old)
            return Change(kind, ChangeType.DELETED, old, None)
        if old is not None and resource_version(old) == resource_version(obj):
            return None
        self._put(key, old, obj)
        return Change(kind, ChangeType.MODIFIED if old is not None else ChangeType.ADDED, old, obj)

    def replace(
        self, kind: str, objects: Iterable[RawObject], *, namespace: str | None = None
    ) -> list[Change]:
        """Make ``kind`` hold exactly ``objects`` (a relist); the changes that makes.

        Objects gone from the list are deleted, new ones added, and the ones whose
        resourceVersion differs modified; the rest are left alone, so a relist after a 410
        reports only what changed while the watch was down. With ``namespace``, the list is of
        that namespace only: objects of other namespaces stay (informers of several namespaces
        share one store). The changes come in key order, the deletions first.

        Every change is made before the first :class:`Change` is built, and no key object is
        kept per listed object: what the store keeps of a list (its index entries, a node's or
        a ReplicaSet's maps) is then not laid out among thousands of short-lived objects, whose
        memory the allocator could not give back while one of them lives (10,000
        pods listed left 1.3 MB of such holes).
        """
        listed: dict[str, dict[str, RawObject]] = {}
        for obj in objects:
            meta = obj.get("metadata", {})
            namespace_of = _text(meta.get("namespace"))
            named = listed.get(namespace_of)
            if named is None:
                named = listed[namespace_of] = {}
            named[_text(meta.get("name"))] = obj
        held = self._objects.get(kind, {})
        scopes = sorted(held) if namespace is None else [namespace] if namespace in held else []
        gone: list[RawObject] = []
        for scope in scopes:
            kept = listed.get(scope, {})
            for name in sorted(name for name in held[scope] if name not in kept):
                deleted = held[scope][name]
                self._remove(ObjectKey(kind, scope, name), deleted)
                gone.append(deleted)
        olds: list[RawObject | None] = []
        news: list[RawObject] = []
        for scope in sorted(listed):
            named = listed[scope]
            for name in sorted(named):
                new = named[name]
                old = self.get(kind, scope, name)
                if old is not None and resource_version(old) == resource_version(new):
                    continue
                self._put(ObjectKey(kind, scope, name), old, new)
                olds.append(old)
                news.append(new)
        changes = [Change(kind, ChangeType.DELETED, old, None) for old in gone]
        changes += [
            Change(kind, ChangeType.MODIFIED if old is not None else ChangeType.ADDED, old, new)
            for old, new in zip(olds, news, strict=True)
        ]
        return changes

    def _put(self, key: ObjectKey, old: RawObject | None, new: RawObject) -> None:
        if old is not None and self._reindexed(key, old, new):
            self._objects[key.kind][key.namespace][key.name] = new
            return
        if old is not None:
            self._unindex(key, old)
        self._objects.setdefault(key.kind, {}).setdefault(key.namespace, {})[key.name] = new
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
            on_node.put(key.name, new)
            self._touch(node)
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
            controlled.put(key.name, new)
        group = index.by_labels.get(labels)
        if group is None:
            group = index.by_labels[labels] = _LabelGroup(dict(labels))
            for pair in labels:
                index.by_pair.setdefault(pair, []).append(labels)
        group.pods.put(key.name, new)

    def _reindexed(self, key: ObjectKey, old: RawObject, new: RawObject) -> bool:
        """Put ``new`` in the place of ``old`` in every index entry when it goes in the same
        ones (same node, controller and labels: most updates); whether it did."""
        if key.kind in CONTROLLED_KINDS:
            return _controller_keys(new) == _controller_keys(old)
        if key.kind != "Pod":
            return True
        node = _node_of(key.kind, new)
        if node != _node_of(key.kind, old):
            return False
        keys = _pod_index_keys(new)
        if keys is None or keys != _pod_index_keys(old):
            return False
        index = self._pods_by_namespace[key.namespace]
        controller, labels = keys
        index.by_labels[labels].pods.put(key.name, new)
        if controller is not None:
            index.by_controller[controller].put(key.name, new)
        if node is not None:
            self._pods_by_node[node][key.namespace].put(key.name, new)
            self._touch(node)
        return True

    def _remove(self, key: ObjectKey, old: RawObject) -> None:
        self._unindex(key, old)
        named = self._objects[key.kind][key.namespace]
        del named[key.name]
        if not named:
            del self._objects[key.kind][key.namespace]

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

    def _unindex(self, key: ObjectKey, old: RawObject) -> None:
        if key.kind in CONTROLLED_KINDS:
            self._unindex_controlled(key, old)
        if key.kind != "Pod":
            return
        node = _node_of(key.kind, old)
        if node is not None:
            by_namespace = self._pods_by_node.get(node, {})
            on_node = by_namespace.get(key.namespace)
            if on_node is not None:
                on_node.drop(key.name)
                if not on_node.pods:
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
                if not controlled.pods:
                    del index.by_controller[controller]
            group = index.by_labels.get(labels)
            if group is not None:
                group.pods.drop(key.name)
                if not group.pods.pods:
                    del index.by_labels[labels]
                    for pair in labels:
                        holding = index.by_pair[pair]
                        holding.remove(labels)
                        if not holding:
                            del index.by_pair[pair]
        if not index.by_labels and not index.irregular:
            del self._pods_by_namespace[key.namespace]
