"""The informer cache: raw Kubernetes objects by (kind, namespace, name), with the indexes the
watcher asks for, and the changes each write makes.

Pure data structure (no I/O, no client library): ``podcost_kube.informer`` writes into it from
list and watch responses and calls its handlers with the :class:`Change` each write returns;
``podcost_kube.workloads`` reads it to find the workloads a change touches and to build their
snapshots. Objects are stored as the API serves them (``kubectl get -o json`` shapes; the informer
keeps of a pod only the fields podcost reads, ``podcost_core.convert.project_pod``) and are
shared, not copied: readers must treat them as read-only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: One object as the API serves it.
RawObject = dict[str, Any]


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
        meta = self.obj.get("metadata", {})
        return ObjectKey(self.kind, meta.get("namespace", ""), meta.get("name", ""))


def object_key(kind: str, obj: Mapping[str, Any]) -> ObjectKey:
    """The store key of ``obj`` of ``kind``."""
    meta = obj.get("metadata", {})
    return ObjectKey(kind, meta.get("namespace", ""), meta.get("name", ""))


def resource_version(obj: Mapping[str, Any]) -> str:
    """``metadata.resourceVersion``; ``""`` when absent."""
    version = obj.get("metadata", {}).get("resourceVersion", "")
    return str(version)


def _node_of(kind: str, obj: Mapping[str, Any]) -> str | None:
    if kind != "Pod":
        return None
    node = obj.get("spec", {}).get("nodeName")
    return node if isinstance(node, str) and node else None


@dataclass(slots=True)
class Store:
    """Raw objects by kind, namespace and name; pods also by the node they are bound to."""

    _objects: dict[str, dict[str, dict[str, RawObject]]] = field(default_factory=dict)
    """kind → namespace → name → object."""
    _pods_by_node: dict[str, dict[str, dict[str, RawObject]]] = field(default_factory=dict)
    """node name → namespace → name → pod (no key object of its own per pod)."""

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
        return [
            by_namespace[ns][name]
            for ns in sorted(by_namespace)
            for name in sorted(by_namespace[ns])
        ]

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
        share one store).
        """
        listed = {object_key(kind, obj): obj for obj in objects}
        held = set(self.keys(kind))
        if namespace is not None:
            held = {key for key in held if key.namespace == namespace}
        changes: list[Change] = []
        for key in sorted(held - listed.keys()):
            old = self.get(kind, key.namespace, key.name)
            assert old is not None
            self._remove(key, old)
            changes.append(Change(kind, ChangeType.DELETED, old, None))
        for key in sorted(listed):
            new = listed[key]
            old = self.get(kind, key.namespace, key.name)
            if old is not None and resource_version(old) == resource_version(new):
                continue
            self._put(key, old, new)
            changes.append(
                Change(kind, ChangeType.MODIFIED if old is not None else ChangeType.ADDED, old, new)
            )
        return changes

    def _put(self, key: ObjectKey, old: RawObject | None, new: RawObject) -> None:
        if old is not None:
            self._unindex(key, old)
        self._objects.setdefault(key.kind, {}).setdefault(key.namespace, {})[key.name] = new
        node = _node_of(key.kind, new)
        if node is not None:
            by_namespace = self._pods_by_node.setdefault(node, {})
            by_namespace.setdefault(key.namespace, {})[key.name] = new

    def _remove(self, key: ObjectKey, old: RawObject) -> None:
        self._unindex(key, old)
        named = self._objects[key.kind][key.namespace]
        del named[key.name]
        if not named:
            del self._objects[key.kind][key.namespace]

    def _unindex(self, key: ObjectKey, old: RawObject) -> None:
        node = _node_of(key.kind, old)
        if node is None:
            return
        by_namespace = self._pods_by_node.get(node, {})
        named = by_namespace.get(key.namespace, {})
        named.pop(key.name, None)
        if not named:
            by_namespace.pop(key.namespace, None)
        if not by_namespace:
            self._pods_by_node.pop(node, None)
