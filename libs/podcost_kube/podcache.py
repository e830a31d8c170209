"""The watcher's pod conversion cache: a pod's raw JSON becomes a ``podcost_core.model.Pod`` once
per version of the pod, not once per snapshot that shows it (as long as it is among the
:data:`POD_CACHE_SIZE` pods used last); a node's becomes a ``Node`` once per version of the node;
equal requests are summed once; what a node's pods request is summed once per state of its pods
(:meth:`PodCache.node_usage`).

A node change re-publishes every workload with pods on that node, and each snapshot shows all of
a workload's pods and sums the requests of every pod on their nodes: without the cache, every
one of them is validated and converted again although none changed.
``podcost_kube.snapshots.workload_snapshot`` converts through :meth:`PodCache.convert`,
:meth:`PodCache.requests` and :meth:`PodCache.node`; the watcher's informer handler calls
:meth:`PodCache.observe` with every change, so a deleted pod's or node's entries go with it.

What it keeps does not grow with the cluster: at most :data:`POD_CACHE_SIZE`
converted pods, the least recently used going first (a 30-pod workload's snapshot converts its
pods again once they went: about 1 ms), and one sum per distinct set of request fields, not one
per pod. A pod's requests are the sum of four parts of its spec (``pod_requests_inputs``), which
the informer's projection shares between pods whose parts are equal (``project_pod``): a sum is
found by the identity of those parts, which it keeps (so no other object can take their place),
without reading a quantity again. Kept for every pod, the ``Pod`` objects and their entries were
about 0.26 KB a pod, a sixth of the watcher's memory per pod. The raw objects are the store's,
which never changes one (an update replaces it): a ``Pod`` keeps their labels and annotations
maps (``pod_from_json(shared=True)``) instead of a copy of each, and equal sums of requests (a
workload's pods all request the same) are one ``Resources``. Pure: no I/O, no client library.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from podcost_core.kubejson import PodSpecJSON
from podcost_core.model import Node, Pod, Resources
from podcost_core.quantities import pod_requests
from podcost_core.snapshots import NodeUsage, node_usage
from podcost_core.tomodel import node_from_json, pod_from_json
from podcost_kube.objects import Change, ChangeType

#: Distinct sums of requests kept to share; when full, forgotten (the shared ones stay so).
AMOUNTS_LIMIT = 4096

#: Converted pods kept (about 1 MB): the pods of the workloads published last. A workload's
#: snapshot finds them converted while the workload keeps changing, whatever the cluster's size.
POD_CACHE_SIZE = 4096

#: Sums kept by the identity of the spec parts they were summed from; when full, forgotten.
SUMS_LIMIT = 4096

#: Nodes whose usage is kept (``PodCache.node_usage``); when full, forgotten.
NODE_USAGE_LIMIT = 4096

#: The parts of a pod's spec its requests are summed from (``pod_requests_inputs``).
_REQUEST_PARTS = ("containers", "initContainers", "resources", "overhead")


def _identity(raw: Mapping[str, Any]) -> tuple[str, str] | None:
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if not (isinstance(uid, str) and uid and isinstance(version, str) and version):
        return None  # without both it cannot be told apart from another version: not cached
    return uid, version


class PodCache:
    """Converted pods by uid, each for one resourceVersion, at most ``size`` of them (the least
    recently used go first).

    ``on_convert`` is called with each pod converted for a snapshot, once per conversion of a
    version: a version converted again after it left the cache is handed over again (the
    watcher reports a pod's invalid cost once per value, however often it is handed over). A
    version converted with ``report=False`` (the watcher deciding whether a change matters, for
    pods it may never rank) is handed over when a snapshot first shows it. ``adopt``: the field
    managers whose deletion costs count as podcost's own (``pod_from_json``).
    """

    def __init__(
        self,
        on_convert: Callable[[Pod], None] | None = None,
        *,
        adopt: Collection[str] = (),
        size: int = POD_CACHE_SIZE,
    ) -> None:
        if size < 1:
            raise ValueError("the pod cache needs a size of at least 1")
        self.adopt = frozenset(adopt)
        self.size = size
        self._pods: OrderedDict[str, tuple[str, Pod]] = OrderedDict()
        """Per uid: the version converted and its ``Pod``, the least recently used first."""
        self._sums: dict[object, tuple[tuple[object, ...], Resources]] = {}
        """By the identities of a spec's request parts (of its containers alone when it has no
        other): those parts (kept, so that no other object takes their identity) and their
        sum."""
        self._nodes: dict[str, tuple[str, Node]] = {}
        """Per node name: the version converted, and the node without its requested sums."""
        self._usage: dict[str, tuple[int, NodeUsage]] = {}
        """Per node name: the stamp of its pods (``WorkloadIndexes.node_stamp``) and what they
        request."""
        self._on_convert = on_convert
        self._amounts: dict[Resources, Resources] = {}
        """Each distinct sum of requests once, for the pods that request it to share."""
        self._unreported: set[str] = set()
        """Uids whose cached version was converted with ``report=False`` and not reported yet."""
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        """How many converted pods are kept."""
        return len(self._pods)

    def convert(self, raw: Mapping[str, Any], *, report: bool = True) -> Pod:
        """``pod_from_json(raw)``, from the cache when this version of the pod was converted
        before and is still kept; raises ``ConversionError`` as it does (a failure is not
        cached). ``report``: hand the pod to ``on_convert`` if this version was not yet."""
        identity = _identity(raw)
        if identity is not None:
            uid, version = identity
            cached = self._pods.get(uid)
            if cached is not None and cached[0] == version:
                self._pods.move_to_end(uid)
                self.hits += 1
                if report and uid in self._unreported:
                    self._unreported.discard(uid)
                    self._report(cached[1])
                return cached[1]
        self.misses += 1
        # Summed from the raw spec's parts, which the store keeps (the validated spec is a copy:
        # its parts would be new objects every time); they read the same (``project_pod``).
        spec = raw.get("spec")
        summed = self._summed if not isinstance(spec, Mapping) else lambda _: self._spec_sum(spec)
        pod = pod_from_json(raw, adopt=self.adopt, shared=True, requests_of=summed)
        if identity is not None:
            uid, version = identity
            self._pods[uid] = (version, pod)
            self._pods.move_to_end(uid)
            if report:
                self._unreported.discard(uid)
            else:
                self._unreported.add(uid)
            while len(self._pods) > self.size:
                gone, _ = self._pods.popitem(last=False)
                self._unreported.discard(gone)
        if report:
            self._report(pod)
        return pod

    def _report(self, pod: Pod) -> None:
        if self._on_convert is not None:
            self._on_convert(pod)

    def requests(self, raw: Mapping[str, Any]) -> Resources:
        """``pod_requests`` of the pod's spec, summed once per distinct set of request parts
        (see the module docstring)."""
        spec = raw.get("spec", {})
        if not isinstance(spec, Mapping):
            return pod_requests(spec)  # raises as it would
        return self._spec_sum(spec)

    def _spec_sum(self, spec: Mapping[str, Any]) -> Resources:
        """``pod_requests(spec)``, found by the identity of the parts it is summed from: of its
        containers alone when the spec has none of the other three (most pods; a snapshot sums
        every pod on its nodes, so this is a hot path)."""
        get = spec.get
        containers = get("containers")
        key: object
        if get("initContainers") is None and get("resources") is None and get("overhead") is None:
            key = id(containers)
            found = self._sums.get(key)
            if found is not None and found[0][0] is containers:
                return found[1]
            parts: tuple[object, ...] = (containers,)
        else:
            parts = tuple(get(name) for name in _REQUEST_PARTS)
            key = tuple(map(id, parts))
            found = self._sums.get(key)
            if found is not None and all(a is b for a, b in zip(found[0], parts, strict=True)):
                return found[1]
        amount = self._summed(cast(PodSpecJSON, spec))
        if len(self._sums) >= SUMS_LIMIT:
            self._sums.clear()
        self._sums[key] = (parts, amount)
        return amount

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

    def node_usage(self, node: str, stamp: int, pods: Sequence[Mapping[str, Any]]) -> NodeUsage:
        """``node_usage(pods)`` of the pods bound to ``node``, summed once per ``stamp`` of
        them (``WorkloadIndexes.node_stamp``, unique in the process: it changes with any of the
        node's pods). A snapshot shows the nodes of its workload's pods with what every pod on them
        requests: without this, each snapshot summed its nodes' pods again, 30 nodes of 30 pods
        for a 30-pod Deployment spread over them, whose 29 other Deployments' snapshots summed
        the same pods (``tests/bench/bench_workload_objects.py``)."""
        kept = self._usage.get(node)
        if kept is not None and kept[0] == stamp and stamp:
            return kept[1]
        usage = node_usage(pods, self.requests)
        if len(self._usage) >= NODE_USAGE_LIMIT and node not in self._usage:
            self._usage.clear()
        self._usage[node] = (stamp, usage)
        return usage

    def forget(self, raw: Mapping[str, Any]) -> None:
        """Drop the entries of the pod ``raw`` is a version of."""
        meta = raw.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        if isinstance(uid, str):
            self._pods.pop(uid, None)
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
                self._usage.pop(str(meta.get("name")), None)
