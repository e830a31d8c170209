"""The informer cache: raw Kubernetes objects by (kind, namespace, name), and the changes each
write makes.

Pure data structure (no I/O, no client library): ``podcost_kube.informer`` writes into it from
list and watch responses and calls its handlers with the :class:`Change` each write returns;
``podcost_kube.workloads`` reads it to find the workloads a change touches, and
``podcost_kube.snapshots`` to build their snapshots. Objects are stored as the API serves them
(``kubectl get -o json`` shapes; the informer keeps of a pod only the fields podcost reads,
``podcost_core.projection.project_pod``) and are shared, not copied: readers must treat them as
read-only.

Every write also keeps the cache's :attr:`Store.indexes` current: the pods by node, controller
and label set, and the ReplicaSets by controller, that a snapshot finds its objects through
(``podcost_kube.snapshots.WorkloadIndexes``, where they are defined with the builder that reads
them). The words of the cache (``RawObject``, ``ObjectKey``, ``Change``, ``ChangeType``,
``object_key``, ``resource_version``) are defined in ``podcost_kube.objects`` and can be
imported from here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from podcost_kube.objects import (
    Change,
    ChangeType,
    ObjectKey,
    RawObject,
    key_text,
    object_key,
    resource_version,
)
from podcost_kube.snapshots import WorkloadIndexes

__all__ = [
    "Change",
    "ChangeType",
    "Keep",
    "ObjectKey",
    "RawObject",
    "Store",
    "object_key",
    "resource_version",
    "same_but_version",
]


#: What :meth:`Store.apply` keeps of an object, given the version it holds (``None``: none).
Keep = Callable[[RawObject, RawObject | None], RawObject]


def same_but_version(old: RawObject, new: RawObject) -> bool:
    """Whether ``new`` is ``old`` as the store keeps it, but for its resourceVersion: an event
    that carries it (a later version that changed only what the store does not keep of the
    object) changes nothing. Parts taken from ``old`` (``keep_pod``) compare
    by identity."""
    if old is new:
        return True
    if len(old) != len(new):
        return False
    for name, value in new.items():
        if name not in old:
            return False
        before = old[name]
        if before is value:
            continue
        if name != "metadata" or type(value) is not dict or type(before) is not dict:
            if before != value:
                return False
            continue
        if len(before) != len(value):
            return False
        for key, item in value.items():
            if key == "resourceVersion":
                continue
            if key not in before:
                return False
            earlier = before[key]
            if earlier is not item and earlier != item:
                return False
    return True


def _move_version(held: RawObject, version: str) -> None:
    """Give the object the store holds a later ``version`` of the same content: the one object
    the store changes in place (its metadata is its own: the parts shared with other objects
    are within it)."""
    meta = held.get("metadata")
    if isinstance(meta, dict) and version:
        meta["resourceVersion"] = version


@dataclass(slots=True, repr=False)
class Store:
    """Raw objects by kind, namespace and name, with the indexes a snapshot reads
    (:attr:`indexes`), kept current on every write."""

    _objects: dict[str, dict[str, dict[str, RawObject]]] = field(default_factory=dict)
    """kind → namespace → name → object; shared with :attr:`indexes`, so never rebound."""
    indexes: WorkloadIndexes = field(init=False)
    """Pods by node, controller and label set, ReplicaSets by controller, node stamps
    (``podcost_kube.snapshots``)."""

    def __post_init__(self) -> None:
        self.indexes = WorkloadIndexes(self._objects)

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

    def count(self, kind: str) -> int:
        """How many objects of ``kind`` the store holds."""
        return sum(len(named) for named in self._objects.get(kind, {}).values())

    def __repr__(self) -> str:
        """How many objects of each kind, not the objects: a cluster's store holds thousands."""
        counts = ", ".join(f"{kind}={self.count(kind)}" for kind in sorted(self._objects))
        return f"Store({counts})"

    # --- writing ------------------------------------------------------------------------------

    def apply(
        self,
        kind: str,
        change_type: ChangeType,
        obj: RawObject,
        key: ObjectKey | None = None,
        keep: Keep | None = None,
    ) -> Change | None:
        """Apply one watch event; the change it makes, or ``None`` when it changes nothing.

        ``ADDED`` and ``MODIFIED`` both upsert (which one the change is depends on what the store
        held, so a replayed event cannot corrupt it); an event carrying the resourceVersion
        already stored is a duplicate and changes nothing; deleting an unknown object too. An
        update whose object, as kept, equals the one held but for its resourceVersion (what
        changed is read by nothing: a probe time, a heartbeat, a field manager's timestamp)
        changes nothing either (:func:`same_but_version`): the object held stays, its
        resourceVersion moved on to the event's, so that the store holds the versions the API
        server does. ``key``: ``obj``'s (``object_key``), when
        the caller has it already.

        ``keep``: what the store keeps of ``obj`` (given the version held, ``None`` for a new
        object), when ``obj`` is not that yet: called only for an update that changes something
        (never for a duplicate, a deletion or an update that changes nothing), and ``obj``
        must equal by value what it returns (an informer's decoded pod and ``keep_pod``, which
        only interns and shares its parts), so that whether anything changed is told from
        ``obj`` itself. Most pod events change nothing the store keeps (status noise): they
        then cost a comparison, not the making of a kept version thrown away.
        """
        if key is None:
            # The key object only for a write: most events are duplicates or change nothing.
            meta = obj.get("metadata", {})
            namespace, name = key_text(meta.get("namespace")), key_text(meta.get("name"))
        else:
            namespace, name = key.namespace, key.name
        named = self._objects.get(kind)
        held = named.get(namespace) if named is not None else None
        old = held.get(name) if held is not None else None
        if change_type is ChangeType.DELETED:
            if old is None:
                return None
            self._remove(key or ObjectKey(kind, namespace, name), old)
            return Change(kind, ChangeType.DELETED, old, None)
        if old is not None:
            version = resource_version(obj)
            if resource_version(old) == version:
                return None
            if same_but_version(old, obj):
                _move_version(old, version)
                return None
        if keep is not None:
            obj = keep(obj, old)
        self._put(key or ObjectKey(kind, namespace, name), old, obj)
        return Change(kind, ChangeType.MODIFIED if old is not None else ChangeType.ADDED, old, obj)

    def replace(
        self, kind: str, objects: Iterable[RawObject], *, namespace: str | None = None
    ) -> list[Change]:
        """Make ``kind`` hold exactly ``objects`` (a relist); the changes that makes.

        Objects gone from the list are deleted, new ones added, and the ones whose
        resourceVersion differs modified, unless nothing else of them differs
        (:func:`same_but_version`); the rest are left alone, so a relist after a 410
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
            namespace_of = key_text(meta.get("namespace"))
            named = listed.get(namespace_of)
            if named is None:
                named = listed[namespace_of] = {}
            named[key_text(meta.get("name"))] = obj
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
                if old is not None:
                    version = resource_version(new)
                    if resource_version(old) == version:
                        continue
                    if same_but_version(old, new):
                        _move_version(old, version)
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
        indexes = self.indexes
        if old is not None:
            if indexes.reindex(key, old, new):  # in the same index entries: most updates
                self._objects[key.kind][key.namespace][key.name] = new
                return
            indexes.unindex(key, old)
        self._objects.setdefault(key.kind, {}).setdefault(key.namespace, {})[key.name] = new
        indexes.index(key, new)

    def _remove(self, key: ObjectKey, old: RawObject) -> None:
        self.indexes.unindex(key, old)
        named = self._objects[key.kind][key.namespace]
        del named[key.name]
        if not named:
            del self._objects[key.kind][key.namespace]
