"""The watcher's pod conversion cache: a pod's raw JSON becomes a ``podcost_core.model.Pod`` (and
its summed requests) once per version of the pod, not once per snapshot that shows it; a node's
becomes a ``Node`` once per version of the node.

A node change re-publishes every workload with pods on that node, and each snapshot shows all of
a workload's pods and sums the requests of every pod on their nodes: without the cache, every
one of them is validated and converted again although none changed.
``podcost_kube.workloads.workload_snapshot`` converts through :meth:`PodCache.convert`,
:meth:`PodCache.requests` and :meth:`PodCache.node`; the watcher's informer handler calls
:meth:`PodCache.observe` with every change, so a deleted pod's or node's entries go with it.
Entries are keyed by uid (nodes: by name) and hold one ``resourceVersion`` each (a newer version
replaces the older), so the cache holds at most one ``Pod`` and one ``Resources`` per pod, and one
``Node`` per node, in the informer's store. A pod's requests are kept across versions that leave
what they are summed from unchanged (status updates, the usual case): only the spec's request
fields are compared, and no quantity is parsed again. The raw objects are the store's, which
never changes one (an update replaces it): a ``Pod`` keeps their labels and annotations maps
(``pod_from_json(shared=True)``) instead of a copy of each, and equal sums of requests (a
workload's pods all request the same) are one ``Resources``. Pure: no I/O, no client library.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from podcost_core.convert import (
    PodSpecJSON,
    node_from_json,
    pod_from_json,
    pod_requests,
    pod_requests_inputs,
)
from podcost_core.model import Node, Pod, Resources
from podcost_kube.store import Change, ChangeType

#: Distinct sums of requests kept to share; when full, forgotten (the shared ones stay so).
AMOUNTS_LIMIT = 4096


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

    ``on_convert`` is called with each pod converted for a snapshot, once per version of a pod:
    where the watcher reports what it finds wrong in a pod without repeating itself on every
    snapshot. A version converted with ``report=False`` (the watcher deciding whether a change
    matters, for pods it may never rank) is reported when a snapshot first shows it. ``adopt``:
    the field managers whose deletion costs count as podcost's own (``pod_from_json``).
    """

    def __init__(
        self, on_convert: Callable[[Pod], None] | None = None, *, adopt: Collection[str] = ()
    ) -> None:
        self.adopt = frozenset(adopt)
        self._pods: dict[str, Pod] = {}
        self._versions: dict[str, str] = {}
        """Per uid in :attr:`_pods`: the version its ``Pod`` was converted from (a second map
        rather than a ``(version, Pod)`` tuple per pod: 35 bytes a pod less)."""
        self._requests: dict[str, tuple[str, tuple[object, ...], Resources]] = {}
        """Per pod: the version last summed, what its requests were summed from, and the sum."""
        self._requests_peak = 0
        """The most entries :attr:`_requests` held since it was last rebuilt."""
        self._nodes: dict[str, tuple[str, Node]] = {}
        """Per node name: the version converted, and the node without its requested sums."""
        self._on_convert = on_convert
        self._amounts: dict[Resources, Resources] = {}
        """Each distinct sum of requests once, for the pods that request it to share."""
        self._unreported: set[str] = set()
        """Uids whose cached version was converted with ``report=False`` and not reported yet."""
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        """How many pods have an entry."""
        return len(self._pods.keys() | self._requests.keys())

    def convert(self, raw: Mapping[str, Any], *, report: bool = True) -> Pod:
        """``pod_from_json(raw)``, from the cache when this version of the pod was converted
        before; raises ``ConversionError`` as it does (a failure is not cached). ``report``:
        hand the pod to ``on_convert`` if this version was not yet."""
        identity = _identity(raw)
        if identity is not None:
            cached = self._pods.get(identity[0])
            if cached is not None and self._versions.get(identity[0]) == identity[1]:
                self.hits += 1
                if report and identity[0] in self._unreported:
                    self._unreported.discard(identity[0])
                    self._report(cached)
                return cached
        self.misses += 1
        pod = pod_from_json(raw, adopt=self.adopt, shared=True, requests_of=self._summed)
        if identity is not None:
            self._pods[identity[0]] = pod
            self._versions[identity[0]] = identity[1]
            # The pod's requests are the sum of this version: a summed entry is only a copy.
            self._drop_requests(identity[0])
            if report:
                self._unreported.discard(identity[0])
            else:
                self._unreported.add(identity[0])
        if report:
            self._report(pod)
        return pod

    def _report(self, pod: Pod) -> None:
        if self._on_convert is not None:
            self._on_convert(pod)

    def requests(self, raw: Mapping[str, Any]) -> Resources:
        """``pod_requests`` of the pod's spec, from the cache when this version of the pod was
        converted or summed before."""
        identity = _identity(raw)
        spec = raw.get("spec", {})
        if identity is None:
            return pod_requests(spec)
        uid, version = identity
        pod = self._pods.get(uid)
        if pod is not None and self._versions.get(uid) == version:
            return pod.requests
        cached = self._requests.get(uid)
        if cached is not None and cached[0] == version:
            return cached[2]
        inputs = pod_requests_inputs(spec)
        # A new version with the same request fields (a status update) keeps the sum.
        same = cached is not None and cached[1] == inputs
        amount = cached[2] if cached is not None and same else self._summed(spec)
        self._requests[uid] = (version, inputs, amount)
        self._requests_peak = max(self._requests_peak, len(self._requests))
        return amount

    def _drop_requests(self, uid: str) -> None:
        """Drop the summed entry of ``uid``; a map left with far fewer entries than it held is
        rebuilt, as a dict never shrinks: the first pass sums the requests of every pod on the
        nodes of the workloads it converts before converting those pods (10,000 pods: 0.2 MB
        of an empty table kept for good otherwise)."""
        if self._requests.pop(uid, None) is None:
            return
        if len(self._requests) * 8 < self._requests_peak:
            self._requests = dict(self._requests)
            self._requests_peak = len(self._requests)

    def _summed(self, spec: PodSpecJSON) -> Resources:
        """``pod_requests(spec)``, the one ``Resources`` of that sum this cache hands out."""
        amount = pod_requests(spec)
        found = self._amounts.get(amount)
        if found is not None:
            return found
        if len(self._amounts) >= AMOUNTS_LIMIT:
            self._amounts.clear()
        self._amounts[amount] = amount
        return amount

    def node(self, raw: Mapping[str, Any], requested: Resources) -> Node:
        """``node_from_json(raw, requested)``, the node converted once per version."""
        identity = _identity(raw)
        meta = raw.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if identity is None or not isinstance(name, str):
            return node_from_json(raw, requested)
        cached = self._nodes.get(name)
        if cached is None or cached[0] != identity[1]:
            cached = (identity[1], node_from_json(raw))
            self._nodes[name] = cached
        return replace(cached[1], requested=requested)

    def forget(self, raw: Mapping[str, Any]) -> None:
        """Drop the entries of the pod ``raw`` is a version of."""
        meta = raw.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        if isinstance(uid, str):
            self._pods.pop(uid, None)
            self._versions.pop(uid, None)
            self._drop_requests(uid)
            self._unreported.discard(uid)

    def observe(self, change: Change) -> None:
        """Keep up with the informer: a deleted pod or node leaves the cache."""
        if change.type is not ChangeType.DELETED or change.old is None:
            return
        if change.kind == "Pod":
            self.forget(change.old)
        elif change.kind == "Node":
            meta = change.old.get("metadata")
            if isinstance(meta, Mapping):
                self._nodes.pop(str(meta.get("name")), None)
