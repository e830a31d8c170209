"""A workload's snapshot from the objects of a cluster: its pods, the ReplicaSets they belong to,
the nodes they run on with what runs there.

:func:`snapshot_for_workload` reads a :class:`ClusterObjects` (a ``kubectl get -o json`` dump,
loaded by :func:`load_objects`, or the watcher's store, ``podcost_kube.workloads``) as the
ReplicaSet controller does: owned and adoptable pods, related pods of every ReplicaSet of the
owner, bystanders its selectors match. ``podcost simulate``, the demo and the tests call it on a
dump; the watcher on its store, with its caches of converted pods and per-node sums
(:func:`node_usage`, :func:`node_share`). :data:`SNAPSHOT_ADAPTER` validates and (de)serialises
a whole snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from pydantic import TypeAdapter

from podcost_core.kubejson import (
    NODE_ADAPTER,
    POD_ADAPTER,
    WORKLOAD_ADAPTER,
    ConditionJSON,
    ConversionError,
    NodeJSON,
    ObjectMetaJSON,
    OwnerReferenceJSON,
    PodJSON,
    PodSpecJSON,
    WorkloadJSON,
    controller_ref,
    parse_time,
    selector_matches,
    validate,
)
from podcost_core.model import Node, NodeName, Pod, ReplicaSetInfo, Resources, Snapshot, WorkloadRef
from podcost_core.quantities import pod_requests, pod_requests_inputs
from podcost_core.tomodel import node_from_json, pod_from_json


class UnknownWorkload(ConversionError):
    """The requested workload is not in the objects given."""


#: Validates and (de)serialises a whole snapshot with pydantic, from the model's own dataclasses.
SNAPSHOT_ADAPTER: TypeAdapter[Snapshot] = TypeAdapter(Snapshot)


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
                pod: PodJSON = validate(POD_ADAPTER, raw, "pod")
                meta = pod.get("metadata", {})
                self._stamp_meta(meta, pod.get("status", {}).get("conditions", []))
                self.pods[(meta.get("namespace", ""), meta.get("name", ""))] = pod
            case "Node":
                node: NodeJSON = validate(NODE_ADAPTER, raw, "node")
                meta = node.get("metadata", {})
                self._stamp_meta(meta, node.get("status", {}).get("conditions", []))
                self.nodes[meta.get("name", "")] = node
            case "ReplicaSet" | "Deployment":
                workload: WorkloadJSON = validate(WORKLOAD_ADAPTER, raw, kind.lower())
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
    ref = controller_ref(meta)
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
    # ``type`` first: the objects an informer keeps are dicts, and an ABC's check is slow.
    if not (type(spec) is dict or isinstance(spec, Mapping)) or not (
        type(meta) is dict or isinstance(meta, Mapping)
    ):
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
        controller = controller_ref(workload_meta)
        own = [workload]
        if controller is None:
            replicasets = own
        else:
            # The ReplicaSet controller's related pods come from every ReplicaSet of the owner.
            replicasets = [
                rs
                for (rs_namespace, _), rs in sorted(objects.replicasets.items())
                if rs_namespace == namespace
                and _same_controller(controller_ref(rs.get("metadata", {})), controller)
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
                controller_ref(meta) is None
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
    if kind_found == "ReplicaSet" and controller_ref(workload_meta) is None:
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
    controller = controller_ref(meta)
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
    ref = controller_ref(meta)
    if ref is not None and ref.get("kind") == "DaemonSet":
        return True
    return MIRROR_ANNOTATION in meta.get("annotations", {})
