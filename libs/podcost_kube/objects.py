"""The words of the informer cache: a raw object, where it lives (:class:`ObjectKey`), the
:class:`Change` a write makes of it, its resourceVersion, and which workload a key names
(:class:`WorkloadKey`).

Imported by the cache (``podcost_kube.store``), by what builds a workload's snapshot from it
(``podcost_kube.snapshots``), by the watcher's decisions over it (``podcost_kube.workloads``) and
by its cache of converted pods (``podcost_kube.podcache``); it imports none of them, so each
reads these the same way. Objects are as the API serves them
(``kubectl get -o json`` shapes) and taken as read-only. How objects name each other (their
controller, a selector) is read in ``podcost_kube.snapshots``, which follows those names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from podcost_core.model import WorkloadRef

#: One object as the API serves it.
RawObject = dict[str, Any]


@dataclass(frozen=True, slots=True, order=True)
class ObjectKey:
    """Where an object lives in the store. ``namespace`` is ``""`` for cluster-scoped kinds."""

    kind: str
    namespace: str
    name: str


class ChangeType(StrEnum):
    """What happened to an object, as a watch names it."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


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
    return ObjectKey(kind, key_text(meta.get("namespace")), key_text(meta.get("name")))


def key_text(value: object) -> str:
    """A namespace or name as the store keys it: the string, ``""`` for none, else its text."""
    return value if isinstance(value, str) else "" if value is None else str(value)


def resource_version(obj: Mapping[str, Any]) -> str:
    """``metadata.resourceVersion``; ``""`` when absent (or the metadata is not an object)."""
    meta = obj.get("metadata")
    # ``type`` first: the objects the store keeps are dicts, and an ABC's check is slow.
    if type(meta) is dict or isinstance(meta, Mapping):
        version = meta.get("resourceVersion", "")
        return version if type(version) is str else str(version)
    return ""


DEPLOYMENT = "Deployment"
REPLICASET = "ReplicaSet"


@dataclass(frozen=True, slots=True, order=True)
class WorkloadKey:
    """Which workload: the debouncer's key and, with a cluster name, the bus key."""

    namespace: str
    kind: str
    """``Deployment`` or ``ReplicaSet``."""
    name: str

    def bus_key(self, cluster: str) -> str:
        """``cluster/namespace/kind/name``, as ``WorkloadRef.key``."""
        return f"{cluster}/{self.namespace}/{self.kind}/{self.name}"

    def ref(self, cluster: str, uid: str = "") -> WorkloadRef:
        return WorkloadRef(cluster, self.namespace, self.kind, self.name, uid)
