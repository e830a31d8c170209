"""The watcher's pod conversion cache: a pod's raw JSON becomes a ``podcost_core.model.Pod`` (and
its summed requests) once per version of the pod, not once per snapshot that shows it.

A node change re-publishes every workload with pods on that node, and each snapshot shows all of
a workload's pods and sums the requests of every pod on their nodes: without the cache, every
one of them is validated and converted again although none changed.
``podcost_kube.workloads.workload_snapshot`` converts through :meth:`PodCache.convert` and
:meth:`PodCache.requests`; the watcher's informer handler calls :meth:`PodCache.observe` with
every change, so a deleted pod's entries go with it. Entries are keyed by uid and hold one
``resourceVersion`` each (a newer version replaces the older), so the cache holds at most one
``Pod`` and one ``Resources`` per pod in the informer's store. Pure: no I/O, no client library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from podcost_core.convert import pod_from_json, pod_requests
from podcost_core.model import Pod, Resources
from podcost_kube.store import Change, ChangeType


def _identity(raw: Mapping[str, Any]) -> tuple[str, str] | None:
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if not (isinstance(uid, str) and uid and isinstance(version, str) and version):
        return None  # without both it cannot be told apart from another version: not cached
    return uid, version


class PodCache:
    """Converted pods by uid, each for one resourceVersion.

    ``on_convert`` is called with each pod actually converted (a miss), once per version of a
    pod: where the watcher reports what it finds wrong in a pod without repeating itself on
    every snapshot.
    """

    def __init__(self, on_convert: Callable[[Pod], None] | None = None) -> None:
        self._pods: dict[str, tuple[str, Pod]] = {}
        self._requests: dict[str, tuple[str, Resources]] = {}
        """Of the pods on the snapshots' nodes that no snapshot shows (other workloads')."""
        self._on_convert = on_convert
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        """How many pods have an entry."""
        return len(self._pods.keys() | self._requests.keys())

    def convert(self, raw: Mapping[str, Any]) -> Pod:
        """``pod_from_json(raw)``, from the cache when this version of the pod was converted
        before; raises ``ConversionError`` as it does (a failure is not cached)."""
        identity = _identity(raw)
        if identity is not None:
            cached = self._pods.get(identity[0])
            if cached is not None and cached[0] == identity[1]:
                self.hits += 1
                return cached[1]
        self.misses += 1
        pod = pod_from_json(raw)
        if identity is not None:
            self._pods[identity[0]] = (identity[1], pod)
        if self._on_convert is not None:
            self._on_convert(pod)
        return pod

    def requests(self, raw: Mapping[str, Any]) -> Resources:
        """``pod_requests`` of the pod's spec, from the cache when this version of the pod was
        converted or summed before."""
        identity = _identity(raw)
        if identity is None:
            return pod_requests(raw.get("spec", {}))
        uid, version = identity
        pod = self._pods.get(uid)
        if pod is not None and pod[0] == version:
            return pod[1].requests
        cached = self._requests.get(uid)
        if cached is not None and cached[0] == version:
            return cached[1]
        amount = pod_requests(raw.get("spec", {}))
        self._requests[uid] = (version, amount)
        return amount

    def forget(self, raw: Mapping[str, Any]) -> None:
        """Drop the entries of the pod ``raw`` is a version of."""
        meta = raw.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        if isinstance(uid, str):
            self._pods.pop(uid, None)
            self._requests.pop(uid, None)

    def observe(self, change: Change) -> None:
        """Keep up with the informer: a deleted pod leaves the cache."""
        if change.kind == "Pod" and change.type is ChangeType.DELETED and change.old is not None:
            self.forget(change.old)
