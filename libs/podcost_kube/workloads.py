"""The watcher's decisions over the informer cache: which workloads a change touches, whether a
change matters at all (podcost's own cost writes do not: no feedback loop), and whether a
workload is opted in and with what policy.

Pure functions over raw Kubernetes JSON and a :class:`~podcost_kube.store.Store`: no I/O, no
client library, no clock. The watcher service calls :func:`touched_by` from its informer handler
and feeds the keys to its debouncer; for every emission it calls :func:`workload_policy`, then
``podcost_kube.snapshots.workload_snapshot`` for the workloads it ranks; on becoming the leader
(with leader election on) it touches every :func:`opted_in_workloads`. The annotator verifies
each decision with :func:`owning_workload` and :func:`workload_policy` over its own informer
view (``podcost.annotator.plan.verify``), so both decide opt-in by the same rules. The raw JSON
becomes the model only through ``podcost_core.tomodel`` and ``podcost_core.snapshots``.

A workload is a Deployment, or a ReplicaSet that no Deployment controls (a ReplicaSet controlled
by a Deployment carries the Deployment's annotations, but the Deployment is the workload). Its
key (:class:`WorkloadKey`) and the two kinds are defined in ``podcost_kube.objects`` and can be
imported from here too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, cast

from podcost_core.kubejson import (
    ConversionError,
    LabelSelectorJSON,
    ObjectMetaJSON,
    selector_matches,
)
from podcost_core.model import DELETION_COST_ANNOTATION, CostOwner, Pod
from podcost_core.policy import (
    ENABLED,
    LABLABS_ENABLED,
    Policy,
    PolicyError,
    policy_from_annotations,
)
from podcost_core.snapshots import (
    NodeShare,
    node_share,
)
from podcost_core.strategies.registry import Registry
from podcost_core.tomodel import cost_owner, node_from_json, pod_from_json
from podcost_kube.objects import DEPLOYMENT as DEPLOYMENT
from podcost_kube.objects import REPLICASET as REPLICASET
from podcost_kube.objects import WorkloadKey as WorkloadKey
from podcost_kube.snapshots import (
    OWNERS_KEPT,
    LoadGroup,
    controller_of,
    metadata,
    same_node_share,
    same_object,
    selector_of,
)
from podcost_kube.store import Change, ChangeType, Store

#: Metadata that changes with every write and says nothing about the object.
NOISE_FIELDS = ("resourceVersion", "managedFields", "generation")


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    annotations = metadata(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


# --- which workloads ---------------------------------------------------------------------------


def workload_of_replicaset(replicaset: Mapping[str, Any]) -> WorkloadKey:
    """The Deployment that controls ``replicaset``, else the ReplicaSet itself."""
    meta = metadata(replicaset)
    namespace = str(meta.get("namespace", ""))
    ref = controller_of(replicaset)
    if ref is not None and ref.get("kind") == DEPLOYMENT:
        return WorkloadKey(namespace, DEPLOYMENT, str(ref.get("name", "")))
    return WorkloadKey(namespace, REPLICASET, str(meta.get("name", "")))


def workloads_of_pod(store: Store, pod: Mapping[str, Any]) -> frozenset[WorkloadKey]:
    """The workloads whose snapshot shows ``pod``.

    A pod a ReplicaSet controls belongs to that ReplicaSet's workload (nothing, while the
    ReplicaSet is not in the store: its own arrival touches the workload). A pod no ReplicaSet
    controls (an orphan the ReplicaSet controller may adopt, or a bystander it counts) concerns
    every workload with a live ReplicaSet in the namespace whose selector matches its labels.

    The answer for a controlled pod is kept by the identity of its owner references list, which
    the informer shares between the pods of a ReplicaSet (``WorkloadIndexes.owners``): the pods
    of a ReplicaSet, and every version of each, are answered by one lookup while the store holds
    the same ReplicaSet object. Every pod change asks (and, for a pod landing on or leaving a
    node, the other pods there: ``node_load_neighbours``).
    """
    meta = metadata(pod)
    namespace = str(meta.get("namespace", ""))
    refs = meta.get("ownerReferences")
    owners = store.indexes.owners
    if type(refs) is list:
        known = owners.get((namespace, id(refs)))
        if (
            known is not None
            and known[0] is refs
            and store.get(REPLICASET, namespace, known[1]) is known[2]
        ):
            return known[3]
    ref = controller_of(pod)
    if ref is not None and ref.get("kind") == REPLICASET:
        name = str(ref.get("name", ""))
        replicaset = store.get(REPLICASET, namespace, name)
        if replicaset is None or not same_object(ref, replicaset):
            return frozenset()
        found = frozenset({workload_of_replicaset(replicaset)})
        if type(refs) is list:
            if len(owners) >= OWNERS_KEPT:
                owners.clear()
            owners[(namespace, id(refs))] = (refs, name, replicaset, found)
        return found
    labels = meta.get("labels") or {}
    return frozenset(
        workload_of_replicaset(replicaset)
        for replicaset in store.objects(REPLICASET, namespace)
        if metadata(replicaset).get("deletionTimestamp") is None
        and selector_matches(selector_of(replicaset), labels)
    )


def _pod_workloads(
    store: Store, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> frozenset[WorkloadKey]:
    """:func:`workloads_of_pod` of both versions of a changed pod, together. What it reads (the
    namespace, the owner references, the labels) is the same objects in both versions when the
    change left them alone (the informer keeps them so, ``keep_pod``): one answer then serves
    both."""
    if old is None or new is None:
        pod = new if new is not None else old
        return workloads_of_pod(store, pod) if pod is not None else frozenset()
    old_meta, new_meta = metadata(old), metadata(new)
    if all(
        old_meta.get(field) is new_meta.get(field)
        for field in ("namespace", "ownerReferences", "labels")
    ):
        return workloads_of_pod(store, new)
    return workloads_of_pod(store, old) | workloads_of_pod(store, new)


def workloads_on_node(store: Store, node: str) -> set[WorkloadKey]:
    """Every workload with a pod bound to ``node``."""
    found: set[WorkloadKey] = set()
    for pod in store.indexes.pods_on_node(node):
        found |= workloads_of_pod(store, pod)
    return found


def workloads_in_namespace(store: Store, namespace: str | None) -> set[WorkloadKey]:
    """Every workload of ``namespace`` (``None``: of every namespace): its Deployments and the
    ReplicaSets no Deployment owns."""
    found = {
        WorkloadKey(
            str(metadata(deployment).get("namespace", "")),
            DEPLOYMENT,
            str(metadata(deployment).get("name", "")),
        )
        for deployment in store.objects(DEPLOYMENT, namespace)
    }
    found |= {workload_of_replicaset(rs) for rs in store.objects(REPLICASET, namespace)}
    return found


@dataclass(frozen=True, slots=True)
class PodOwner:
    """The workload that owns a pod through its controllers, as :func:`owning_workload` found."""

    workload: WorkloadKey | None
    """The owning workload; ``None`` when there is none, or it is not in the store."""
    missing: str | None = None
    """The controller the pod names that the store does not hold (yet), e.g.
    ``ReplicaSet shop/web-5d8f``; ``None`` when the chain was followed to its end."""


def owning_workload(store: Store, pod: Mapping[str, Any]) -> PodOwner:
    """The workload that owns ``pod``, strictly: its controller is an ``apps/v1`` ReplicaSet in
    the store with the uid the reference names, and that ReplicaSet's Deployment, if a
    Deployment controls it, is in the store with the uid its reference names.

    Unlike :func:`workloads_of_pod` (what a snapshot shows, orphans a selector matches
    included), only ownership counts: the annotator asks this before it writes a pod's cost.
    """
    namespace = str(metadata(pod).get("namespace", ""))
    ref = controller_of(pod)
    if ref is None or ref.get("kind") != REPLICASET or ref.get("apiVersion") != "apps/v1":
        return PodOwner(None)
    name = str(ref.get("name", ""))
    replicaset = store.get(REPLICASET, namespace, name)
    if replicaset is None or metadata(replicaset).get("uid") != ref.get("uid"):
        return PodOwner(None, missing=f"{REPLICASET} {namespace}/{name}")
    key = workload_of_replicaset(replicaset)
    if key.kind == DEPLOYMENT:
        deployment = store.get(DEPLOYMENT, namespace, key.name)
        owner_ref = controller_of(replicaset)
        if (
            deployment is None
            or owner_ref is None
            or metadata(deployment).get("uid") != owner_ref.get("uid")
        ):
            return PodOwner(None, missing=f"{DEPLOYMENT} {namespace}/{key.name}")
    return PodOwner(key)


# --- whether a change matters ------------------------------------------------------------------


def _without_noise(obj: Mapping[str, Any], *, drop_cost: bool = False) -> dict[str, Any]:
    """``obj`` without ``NOISE_FIELDS`` in its metadata (and without the cost annotation)."""
    meta = {key: value for key, value in metadata(obj).items() if key not in NOISE_FIELDS}
    if drop_cost and DELETION_COST_ANNOTATION in meta.get("annotations", {}):
        annotations = dict(meta["annotations"])
        del annotations[DELETION_COST_ANNOTATION]
        if annotations:
            meta["annotations"] = annotations
        else:
            del meta["annotations"]
    return {**obj, "metadata": meta}


def _cost_owner(obj: Mapping[str, Any], adopt: Collection[str] = ()) -> CostOwner:
    return cost_owner(cast(ObjectMetaJSON, metadata(obj)), adopt)


def is_own_cost_write(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether a pod update is only podcost's own deletion-cost write.

    True when the cost annotation is the one thing that differs (besides ``NOISE_FIELDS``) and
    podcost's field manager owns the new value, or, for a removal, owned the old one. The
    watcher ignores such an update; otherwise every write would re-trigger a ranking.
    """
    if old is None or new is None:
        return False
    old_cost = _annotations(old).get(DELETION_COST_ANNOTATION)
    new_cost = _annotations(new).get(DELETION_COST_ANNOTATION)
    if old_cost == new_cost:
        return False
    if _without_noise(old, drop_cost=True) != _without_noise(new, drop_cost=True):
        return False
    owner_of = new if new_cost is not None else old
    return _cost_owner(owner_of) is CostOwner.PODCOST


def _status_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``old`` and ``new`` differ in their status and noise only (both without noise)."""
    return {k: v for k, v in old.items() if k != "status"} == {
        k: v for k, v in new.items() if k != "status"
    }


def _pod_status_view(pod: Mapping[str, Any]) -> tuple[object, ...]:
    """The part of a pod's status that ``pod_from_json`` reads: phase, QoS class, the Ready
    condition, and restart counts. Kept in step with ``convert`` by a unit test."""
    status = pod.get("status") or {}
    ready: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    return (
        status.get("phase"),
        status.get("qosClass"),
        ready.get("status"),
        ready.get("lastTransitionTime"),
        tuple(c.get("restartCount", 0) for c in status.get("containerStatuses") or []),
        tuple(
            (c.get("name"), c.get("restartCount", 0))
            for c in status.get("initContainerStatuses") or []
        ),
    )


def _status_and_noise_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``old`` and ``new`` differ at most in their status and ``NOISE_FIELDS``, told
    by identity where the informer kept a part of the version before (``keep_pod``), else by
    value; ``False`` when that takes more than a glance (then ``_without_noise`` tells)."""
    if len(old) != len(new):
        return False
    for name, value in new.items():
        if name == "status":
            continue
        before = old.get(name, _MISSING)
        if before is value:
            continue
        if name != "metadata" or type(before) is not dict or type(value) is not dict:
            return False
        for key, item in value.items():
            if key not in NOISE_FIELDS:
                earlier = before.get(key, _MISSING)
                if earlier is not item and earlier != item:
                    return False
        for key in before:  # none gone, noise aside
            if key not in value and key not in NOISE_FIELDS:
                return False
    return True


#: What no object holds.
_MISSING = object()


def _read_as_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the two versions of a pod differ in a field ``pod_from_json`` carries over as it
    is (the node it is bound to, whether it is being deleted, its labels and annotations): their
    ``Pod``s then differ, or one of them is not a pod that converts, and either way the change
    matters. The usual spec and metadata updates (a pod bound, a deletion begun) are decided so
    without converting the new version, which a snapshot converts later only if it still shows
    it."""
    old_meta, new_meta = metadata(old), metadata(new)
    old_spec, new_spec = old.get("spec"), new.get("spec")
    if not isinstance(old_spec, Mapping) or not isinstance(new_spec, Mapping):
        return False
    return (
        (old_spec.get("nodeName") or None) != (new_spec.get("nodeName") or None)
        or (old_meta.get("deletionTimestamp") is None)
        != (new_meta.get("deletionTimestamp") is None)
        or old_meta.get("labels", {}) != new_meta.get("labels", {})
        or old_meta.get("annotations", {}) != new_meta.get("annotations", {})
    )


def pod_change_matters(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    *,
    convert: Callable[[Mapping[str, Any]], Pod] = pod_from_json,
    adopt: Collection[str] = (),
) -> bool:
    """Whether a pod update changes anything a snapshot shows of the pod.

    Adds and deletes always matter. An update matters when the pod as ``pod_from_json`` reads it
    differs (a status heartbeat, an IP or a container state that nothing ranks on does not).
    Status-only updates, the most frequent kind, are decided on the few status fields the
    converter reads, without converting. ``convert`` is ``pod_from_json`` or a cache of it (the
    watcher's ``PodCache``, which then holds the new version for the snapshot that follows);
    ``adopt`` the field managers whose costs count as podcost's own, as ``convert`` reads them.
    """
    if old is None or new is None:
        return True
    if _status_and_noise_only(old, new):  # the usual update, told without copying either
        if old.get("status") == new.get("status"):
            return _cost_owner(old, adopt) is not _cost_owner(new, adopt)
        return _pod_status_view(old) != _pod_status_view(new)
    if _read_as_changed(old, new):
        # A pod bound, a deletion begun, labels or annotations changed: told without copying
        # either (what it reads is not noise, so the copies below would differ too).
        return True
    quiet_old, quiet_new = _without_noise(old), _without_noise(new)
    if quiet_old == quiet_new:
        # Only the noise differs; managedFields still say who owns the cost.
        return _cost_owner(old, adopt) is not _cost_owner(new, adopt)
    if _status_only(quiet_old, quiet_new):
        return _pod_status_view(old) != _pod_status_view(new)
    try:
        return convert(old) != convert(new)
    except ConversionError:
        return True  # let the snapshot report the broken object


def node_change_matters(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether a node update changes what a snapshot shows of it (labels, annotations, taints,
    allocatable, unschedulable); kwok's and the kubelet's heartbeats do not."""
    if old is None or new is None:
        return True
    quiet_old, quiet_new = _without_noise(old), _without_noise(new)
    if _status_only(quiet_old, quiet_new):
        # Of a node's status, a snapshot shows the allocatable resources only.
        allocatable = (old.get("status") or {}).get("allocatable")
        return bool(allocatable != (new.get("status") or {}).get("allocatable"))
    try:
        return node_from_json(old) != node_from_json(new)
    except ConversionError:
        return True


def workload_change_matters(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether a Deployment or ReplicaSet update changes its metadata or spec (its status, which
    its controller rewrites on every pod change, shows in no snapshot)."""
    if old is None or new is None:
        return True
    return (_without_noise(old)["metadata"], old.get("spec")) != (
        _without_noise(new)["metadata"],
        new.get("spec"),
    )


def touched_by(
    change: Change,
    store: Store,
    *,
    convert_pod: Callable[[Mapping[str, Any]], Pod] = pod_from_json,
    adopt: Collection[str] = (),
) -> frozenset[WorkloadKey]:
    """The workloads whose snapshot ``change`` alters; empty for changes that alter none.

    ``store`` must already hold the change (the informer applies it before calling handlers).
    A pod touches its workload (before and after, if its owner or labels moved it); a ReplicaSet
    its Deployment, or itself; a node every workload with pods on it; a namespace's labels
    (the namespace selector's input) every workload in it. A pod landing on or leaving a node
    changes what the node's other workloads' snapshots say of it (``Node.requested``), which
    does not touch them: :func:`node_load_neighbours` finds those whose order it may move, and
    the watcher touches the ones whose policy reads it (``podcost_core.policy.reads_node_load``).
    ``convert_pod`` is what :func:`pod_change_matters` converts with, ``adopt`` the managers it
    counts as podcost.
    """
    old, new = change.old, change.new
    match change.kind:
        case "Pod":
            if change.type is ChangeType.MODIFIED and (
                is_own_cost_write(old, new)
                or not pod_change_matters(old, new, convert=convert_pod, adopt=adopt)
            ):
                return frozenset()
            return frozenset(_pod_workloads(store, old, new))
        case "ReplicaSet":
            if not workload_change_matters(old, new):
                return frozenset()
            return frozenset(workload_of_replicaset(rs) for rs in (old, new) if rs is not None)
        case "Deployment":
            if not workload_change_matters(old, new):
                return frozenset()
            key = change.key
            return frozenset({WorkloadKey(key.namespace, DEPLOYMENT, key.name)})
        case "Node":
            if not node_change_matters(old, new):
                return frozenset()
            return frozenset(workloads_on_node(store, change.key.name))
        case "Namespace":
            old_labels = metadata(old).get("labels") if old is not None else None
            new_labels = metadata(new).get("labels") if new is not None else None
            if change.type is ChangeType.MODIFIED and old_labels == new_labels:
                return frozenset()
            return frozenset(workloads_in_namespace(store, change.key.name))
        case _:
            return frozenset()


def nodes_with_moved_load(change: Change) -> tuple[str, ...]:
    """The nodes whose sums in a snapshot (``Node.requested``, ``Node.daemon_pods``) a pod
    change alters: the node it was bound to and the one it is bound to, when its share
    (``podcost_core.snapshots.node_share``: bound, active, its request fields) differs between
    the two versions; nothing for any other kind, or a pod whose share did not move (a status
    update, a label change, podcost's own cost write)."""
    if change.kind != "Pod":
        return ()
    return _moved_nodes(*_shares(change, node_share))


def _shares(
    change: Change, share_of: Callable[[Mapping[str, Any]], NodeShare | None]
) -> tuple[NodeShare | None, NodeShare | None]:
    """The changed pod's ``node_share`` before and after (as ``share_of`` gives it);
    ``(None, None)`` without computing them when what they are computed from is the same in
    both versions (``same_node_share``)."""
    if (
        change.old is not None
        and change.new is not None
        and same_node_share(change.old, change.new)
    ):
        return None, None
    old = share_of(change.old) if change.old is not None else None
    new = share_of(change.new) if change.new is not None else None
    return old, new


def _moved_nodes(old: NodeShare | None, new: NodeShare | None) -> tuple[str, ...]:
    if old == new:
        return ()
    return tuple(sorted({share[0] for share in (old, new) if share is not None}))


def _group_workloads(store: Store, namespace: str, group: LoadGroup) -> frozenset[WorkloadKey]:
    """The workloads whose snapshots show the pods of ``group`` in ``namespace``
    (``WorkloadIndexes.node_load``): :func:`workloads_of_pod` of each, found for a ReplicaSet's
    pods from the ReplicaSet alone (kept in ``WorkloadIndexes.load_groups`` while the store
    holds the same ReplicaSet)."""
    if group[0] == "pod":  # ("pod", the namespace and the name the store holds it under)
        pod = store.get("Pod", group[1], group[2] or "")
        return workloads_of_pod(store, pod) if pod is not None else frozenset()
    _, owner, uid = group
    replicaset = store.get(REPLICASET, namespace, owner)
    kept = store.indexes.load_groups
    known = kept.get((namespace, owner, uid))
    if known is not None and known[0] is replicaset:
        return known[1]
    if replicaset is None:
        return frozenset()
    held_uid = metadata(replicaset).get("uid")
    found = (
        frozenset({workload_of_replicaset(replicaset)})
        if not (held_uid and uid) or held_uid == uid  # as ``same_object`` reads the reference
        else frozenset()
    )
    if len(kept) >= OWNERS_KEPT:
        kept.clear()
    kept[(namespace, owner, uid)] = (replicaset, found)
    return found


def node_load_neighbours(store: Store, change: Change) -> set[WorkloadKey]:
    """The workloads, other than the changed pod's own, whose ``node-consolidation`` order a pod
    change may move: on each node of :func:`nodes_with_moved_load`, those for which the node
    started or stopped holding other workloads' pods (the only way others' pods order a node:
    ``podcost_core.strategies.node_consolidation``, rule 1), and, when the pod is a DaemonSet or
    static pod, those for which the node holds no other pods (their utilization tie-break reads
    its requests). ``store`` must already hold the change.

    Counted as a snapshot counts them (``podcost_core.snapshots._nodes_for``): a node's active
    pods less its daemon pods less the workload's own active pods there. The counts are the
    store's (``WorkloadIndexes.node_load``, kept on every write, by namespace and ReplicaSet):
    no pod on the node is read, and workloads are looked up only in a namespace that holds all
    of the node's pods for others but one at most (a workload's pods are in its namespace, and
    one whose count moves has at most one other pod there).
    """
    if change.kind != "Pod":
        return set()
    indexes = store.indexes
    old, new = _shares(change, indexes.share_of)
    nodes = _moved_nodes(old, new)
    if not nodes:
        return set()
    own_keys: frozenset[WorkloadKey] | None = None
    found: set[WorkloadKey] = set()
    for node in nodes:
        # The pod's own share of the node's other pods, after less before (0, 1 or -1).
        counted = [share is not None and share[0] == node and not share[2] for share in (old, new)]
        delta = int(counted[1]) - int(counted[0])
        daemon = any(share is not None and share[0] == node and share[2] for share in (old, new))
        others, by_namespace = indexes.node_load(node)
        # A workload moves only with at most ``max(delta, 0)`` of the node's pods not its own:
        # (before > 0) != (after > 0) needs after 0, or 1 with the pod counted in; the daemon's
        # case after 0.
        least = others - max(delta, 0)
        for namespace, groups in by_namespace.items():
            if sum(groups.values()) < least:
                continue
            if own_keys is None:
                own_keys = _pod_workloads(store, change.old, change.new)
            own: dict[WorkloadKey, int] = {}
            for group, count in groups.items():
                for key in _group_workloads(store, namespace, group):
                    own[key] = own.get(key, 0) + count
            for key, count in own.items():
                if key in own_keys:
                    continue
                after = others - count
                before = after - delta
                if (before > 0) != (after > 0) or (daemon and after <= 0):
                    found.add(key)
    return found


# --- opt-in and policy -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OptInRules:
    """The cluster's opt-in rules, beyond a workload's own annotations."""

    namespace_selector: LabelSelectorJSON | None = None
    """Workloads in namespaces whose labels match are opted in (``None``: no namespace is)."""
    default_enabled: bool = False
    """Whether a workload that says nothing, in a namespace not selected, is opted in."""
    default_policy: Policy | None = None
    """The policy of a workload without ``podcost.dev/strategies`` (``None``: the built-in
    ``DEFAULT_POLICY``)."""
    registry: Registry | None = None
    """Where policies look strategy names up (``None``: the installed ones); one with remote
    strategies lets a policy name a strategy whose code runs in its own ranker."""


@dataclass(frozen=True, slots=True)
class WorkloadPolicy:
    """Whether a workload is ranked, why, and with which policy."""

    enabled: bool
    source: str
    """What decided: the annotation's name, ``namespace selector`` or ``cluster default``."""
    policy: Policy | None = None
    """The policy to rank with; ``None`` when disabled or invalid."""
    error: PolicyError | None = None
    """Why the annotations are invalid (to report; the workload is then not ranked)."""


def _explicit_enabled(
    annotations: Mapping[str, str],
) -> tuple[bool, str] | PolicyError | None:
    # podcost's own annotation wins over the lablabs alias, as for every other setting.
    for key in (ENABLED, LABLABS_ENABLED):
        if key in annotations:
            value = str(annotations[key]).strip().lower()
            if value in ("true", "false"):
                return value == "true", key
            return PolicyError(key, f'must be "true" or "false", got {annotations[key]!r}')
    return None


def resolve_policy(
    annotations: Mapping[str, str],
    namespace_labels: Mapping[str, str] | None,
    rules: OptInRules = OptInRules(),
) -> WorkloadPolicy:
    """Opt-in and policy of a workload with ``annotations`` in a namespace with
    ``namespace_labels`` (``None``: unknown).

    An explicit ``podcost.dev/enabled`` (or lablabs') ``"true"``/``"false"`` decides; without one
    the namespace selector opts in, else the cluster default decides. An opted-in workload gets
    ``policy_from_annotations`` over the cluster's default policy; an invalid annotation
    disables it and says why.
    """
    explicit = _explicit_enabled(annotations)
    if isinstance(explicit, PolicyError):
        return WorkloadPolicy(False, explicit.culprit, error=explicit)
    if explicit is not None:
        enabled, source = explicit
    elif (
        rules.namespace_selector is not None
        and namespace_labels is not None
        and selector_matches(rules.namespace_selector, namespace_labels)
    ):
        enabled, source = True, "namespace selector"
    else:
        enabled, source = rules.default_enabled, "cluster default"
    if not enabled:
        return WorkloadPolicy(False, source)
    try:
        policy = policy_from_annotations(
            annotations, default=rules.default_policy, registry=rules.registry
        )
    except PolicyError as error:
        return WorkloadPolicy(False, source, error=error)
    return WorkloadPolicy(True, source, policy)


def workload_policy(
    store: Store, key: WorkloadKey, rules: OptInRules = OptInRules()
) -> WorkloadPolicy:
    """:func:`resolve_policy` for a workload in the store (disabled when it is not there).

    Namespace labels come from the store's ``Namespace`` objects when the informer watches
    them; otherwise the namespace selector cannot match.
    """
    workload = store.get(key.kind, key.namespace, key.name)
    if workload is None:
        return WorkloadPolicy(False, "workload not found")
    namespace = store.get("Namespace", "", key.namespace)
    labels = (metadata(namespace).get("labels") or {}) if namespace is not None else None
    return resolve_policy(_annotations(workload), labels, rules)


def opted_in_workloads(store: Store, rules: OptInRules = OptInRules()) -> list[WorkloadKey]:
    """Every workload in the store that is ranked (its policy is enabled and valid), in order.

    A watcher that becomes the leader touches them all once: what changed while it stood by was
    never published by it, and may not have been by the leader before it.
    """
    return sorted(
        key
        for key in workloads_in_namespace(store, None)
        if workload_policy(store, key, rules).enabled
    )
