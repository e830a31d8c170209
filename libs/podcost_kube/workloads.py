"""The watcher's decisions over the informer cache: which workloads a change touches, whether a
change matters at all (podcost's own cost writes do not: no feedback loop), whether a workload
is opted in and with what policy, and its snapshot.

Pure functions over raw Kubernetes JSON and a :class:`~podcost_kube.store.Store`: no I/O, no
client library, no clock (the caller passes "now"). The watcher service calls
:func:`touched_by` from its informer handler and feeds the keys to its debouncer; for every
emission it calls :func:`workload_policy` and :func:`workload_snapshot`; on becoming the leader
(with leader election on) it touches every :func:`opted_in_workloads`. The annotator verifies
each decision with :func:`owning_workload` and :func:`workload_policy` over its own informer
view (``podcost.annotator.plan.verify``), so both decide opt-in by the same rules. The raw JSON
becomes the model only through ``podcost_core.convert``.

A workload is a Deployment, or a ReplicaSet that no Deployment controls (a ReplicaSet controlled
by a Deployment carries the Deployment's annotations, but the Deployment is the workload).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from podcost_core.kubejson import (
    ConversionError,
    LabelSelectorJSON,
    NodeJSON,
    ObjectMetaJSON,
    PodJSON,
    WorkloadJSON,
    selector_matches,
)
from podcost_core.model import (
    DELETION_COST_ANNOTATION,
    CostOwner,
    Pod,
    Resources,
    Snapshot,
    WorkloadRef,
)
from podcost_core.policy import (
    ENABLED,
    LABLABS_ENABLED,
    Policy,
    PolicyError,
    policy_from_annotations,
)
from podcost_core.snapshots import (
    ClusterObjects,
    NodeShare,
    NodeUsage,
    UnknownWorkload,
    node_share,
    snapshot_for_workload,
)
from podcost_core.strategies.registry import Registry
from podcost_core.tomodel import cost_owner, node_from_json, pod_from_json
from podcost_kube.podcache import PodCache
from podcost_kube.store import Change, ChangeType, RawObject, Store, controller_of, object_key

DEPLOYMENT = "Deployment"
REPLICASET = "ReplicaSet"

#: Metadata that changes with every write and says nothing about the object.
NOISE_FIELDS = ("resourceVersion", "managedFields", "generation")


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


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    annotations = _meta(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


# --- which workloads ---------------------------------------------------------------------------


def workload_of_replicaset(replicaset: Mapping[str, Any]) -> WorkloadKey:
    """The Deployment that controls ``replicaset``, else the ReplicaSet itself."""
    meta = _meta(replicaset)
    namespace = str(meta.get("namespace", ""))
    ref = controller_of(replicaset)
    if ref is not None and ref.get("kind") == DEPLOYMENT:
        return WorkloadKey(namespace, DEPLOYMENT, str(ref.get("name", "")))
    return WorkloadKey(namespace, REPLICASET, str(meta.get("name", "")))


def _same_object(ref: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    uid, ref_uid = _meta(obj).get("uid"), ref.get("uid")
    return not (uid and ref_uid) or uid == ref_uid


def workloads_of_pod(store: Store, pod: Mapping[str, Any]) -> set[WorkloadKey]:
    """The workloads whose snapshot shows ``pod``.

    A pod a ReplicaSet controls belongs to that ReplicaSet's workload (nothing, while the
    ReplicaSet is not in the store: its own arrival touches the workload). A pod no ReplicaSet
    controls (an orphan the ReplicaSet controller may adopt, or a bystander it counts) concerns
    every workload with a live ReplicaSet in the namespace whose selector matches its labels.
    """
    meta = _meta(pod)
    namespace = str(meta.get("namespace", ""))
    ref = controller_of(pod)
    if ref is not None and ref.get("kind") == REPLICASET:
        replicaset = store.get(REPLICASET, namespace, str(ref.get("name", "")))
        if replicaset is None or not _same_object(ref, replicaset):
            return set()
        return {workload_of_replicaset(replicaset)}
    labels = meta.get("labels") or {}
    return {
        workload_of_replicaset(replicaset)
        for replicaset in store.objects(REPLICASET, namespace)
        if _meta(replicaset).get("deletionTimestamp") is None
        and selector_matches(_selector(replicaset), labels)
    }


def _selector(workload: Mapping[str, Any]) -> LabelSelectorJSON | None:
    selector = workload.get("spec", {}).get("selector")
    return cast(LabelSelectorJSON, selector) if isinstance(selector, Mapping) else None


def workloads_on_node(store: Store, node: str) -> set[WorkloadKey]:
    """Every workload with a pod bound to ``node``."""
    found: set[WorkloadKey] = set()
    for pod in store.pods_on_node(node):
        found |= workloads_of_pod(store, pod)
    return found


def workloads_in_namespace(store: Store, namespace: str | None) -> set[WorkloadKey]:
    """Every workload of ``namespace`` (``None``: of every namespace): its Deployments and the
    ReplicaSets no Deployment owns."""
    found = {
        WorkloadKey(
            str(_meta(deployment).get("namespace", "")),
            DEPLOYMENT,
            str(_meta(deployment).get("name", "")),
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
    namespace = str(_meta(pod).get("namespace", ""))
    ref = controller_of(pod)
    if ref is None or ref.get("kind") != REPLICASET or ref.get("apiVersion") != "apps/v1":
        return PodOwner(None)
    name = str(ref.get("name", ""))
    replicaset = store.get(REPLICASET, namespace, name)
    if replicaset is None or _meta(replicaset).get("uid") != ref.get("uid"):
        return PodOwner(None, missing=f"{REPLICASET} {namespace}/{name}")
    key = workload_of_replicaset(replicaset)
    if key.kind == DEPLOYMENT:
        deployment = store.get(DEPLOYMENT, namespace, key.name)
        owner_ref = controller_of(replicaset)
        if (
            deployment is None
            or owner_ref is None
            or _meta(deployment).get("uid") != owner_ref.get("uid")
        ):
            return PodOwner(None, missing=f"{DEPLOYMENT} {namespace}/{key.name}")
    return PodOwner(key)


# --- whether a change matters ------------------------------------------------------------------


def _without_noise(obj: Mapping[str, Any], *, drop_cost: bool = False) -> dict[str, Any]:
    """``obj`` without ``NOISE_FIELDS`` in its metadata (and without the cost annotation)."""
    meta = {key: value for key, value in _meta(obj).items() if key not in NOISE_FIELDS}
    if drop_cost and DELETION_COST_ANNOTATION in meta.get("annotations", {}):
        annotations = dict(meta["annotations"])
        del annotations[DELETION_COST_ANNOTATION]
        if annotations:
            meta["annotations"] = annotations
        else:
            del meta["annotations"]
    return {**obj, "metadata": meta}


def _cost_owner(obj: Mapping[str, Any], adopt: Collection[str] = ()) -> CostOwner:
    return cost_owner(cast(ObjectMetaJSON, _meta(obj)), adopt)


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
            found: set[WorkloadKey] = set()
            for pod in (old, new):
                if pod is not None:
                    found |= workloads_of_pod(store, pod)
            return frozenset(found)
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
            old_labels = _meta(old).get("labels") if old is not None else None
            new_labels = _meta(new).get("labels") if new is not None else None
            if change.type is ChangeType.MODIFIED and old_labels == new_labels:
                return frozenset()
            return frozenset(workloads_in_namespace(store, change.key.name))
        case _:
            return frozenset()


def nodes_with_moved_load(change: Change) -> tuple[str, ...]:
    """The nodes whose sums in a snapshot (``Node.requested``, ``Node.daemon_pods``) a pod
    change alters: the node it was bound to and the one it is bound to, when its share
    (``podcost_core.convert.node_share``: bound, active, its request fields) differs between
    the two versions; nothing for any other kind, or a pod whose share did not move (a status
    update, a label change, podcost's own cost write)."""
    if change.kind != "Pod":
        return ()
    return _moved_nodes(*_shares(change))


def _shares(change: Change) -> tuple[NodeShare | None, NodeShare | None]:
    """The changed pod's ``node_share`` before and after."""
    old = node_share(change.old) if change.old is not None else None
    new = node_share(change.new) if change.new is not None else None
    return old, new


def _moved_nodes(old: NodeShare | None, new: NodeShare | None) -> tuple[str, ...]:
    if old == new:
        return ()
    return tuple(sorted({share[0] for share in (old, new) if share is not None}))


def node_load_neighbours(store: Store, change: Change) -> set[WorkloadKey]:
    """The workloads, other than the changed pod's own, whose ``node-consolidation`` order a pod
    change may move: on each node of :func:`nodes_with_moved_load`, those for which the node
    started or stopped holding other workloads' pods (the only way others' pods order a node:
    ``podcost_core.strategies.node_consolidation``, rule 1), and, when the pod is a DaemonSet or
    static pod, those for which the node holds no other pods (their utilization tie-break reads
    its requests). ``store`` must already hold the change.

    Counted as a snapshot counts them (``podcost_core.convert._nodes_for``): a node's active
    pods less its daemon pods less the workload's own active pods there.
    """
    if change.kind != "Pod":
        return set()
    old, new = _shares(change)
    nodes = _moved_nodes(old, new)
    if not nodes:
        return set()
    own_keys = set()
    for pod in (change.old, change.new):
        if pod is not None:
            own_keys |= workloads_of_pod(store, pod)
    found: set[WorkloadKey] = set()
    for node in nodes:
        # The pod's own share of the node's other pods, after less before (0, 1 or -1).
        counted = [share is not None and share[0] == node and not share[2] for share in (old, new)]
        delta = int(counted[1]) - int(counted[0])
        daemon = any(share is not None and share[0] == node and share[2] for share in (old, new))
        others = 0
        own: dict[WorkloadKey, int] = {}
        first: set[WorkloadKey] | None = None
        for pod in store.pods_on_node(node):
            share = node_share(pod)
            if share is None or share[0] != node or share[2]:
                continue
            keys = workloads_of_pod(store, pod)
            if object_key("Pod", pod) != change.key:
                if first is None:
                    first = keys
                elif keys.isdisjoint(first):
                    # Two pods no one workload owns both of, neither of them the changed one:
                    # every workload has other pods on this node before and after. The usual
                    # case on a shared node, and found after a few pods: nothing moves here.
                    own.clear()
                    break
            others += 1
            for key in keys:
                own[key] = own.get(key, 0) + 1
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
    labels = (_meta(namespace).get("labels") or {}) if namespace is not None else None
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


# --- snapshots ---------------------------------------------------------------------------------


#: What :func:`workload_objects` asks for a node's usage: the node, its stamp
#: (``Store.node_stamp``) and its pods (``PodCache.node_usage``).
UsageOf = Callable[[str, int, Sequence[RawObject]], NodeUsage]


def workload_objects(
    store: Store, key: WorkloadKey, *, with_nodes: bool = True, usage: UsageOf | None = None
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
    if store.pods_indexed(key.namespace):
        try:
            return _workload_objects_indexed(store, key, with_nodes=with_nodes, usage=usage)
        except Exception:  # a malformed object (or no workload): the scan answers or raises
            pass
    return _workload_objects_by_scan(store, key, with_nodes=with_nodes, usage=usage)


def _pod_rules(
    store: Store, key: WorkloadKey
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
    uids = {_meta(rs).get("uid") for rs in mine}
    selectors = [_selector(rs) for rs in related]
    return objects, uids, selectors


def _replicasets_related(store: Store, key: WorkloadKey, workload: RawObject) -> list[RawObject]:
    """The ReplicaSets of the namespace that a snapshot of ``key`` may read, sorted by name:
    for a Deployment, those whose controller reference names it; for a ReplicaSet, itself and
    those whose controller reference names its controller (the ReplicaSet controller relates
    them). Found through the store's index of ReplicaSets by controller, a superset that the
    reference checks here and in ``snapshot_for_workload`` narrow as they did over every
    ReplicaSet of the namespace (which a namespace of 1,334 Deployments made most of a
    snapshot's time); every ReplicaSet of the namespace where the index cannot say."""
    if key.kind == DEPLOYMENT:
        meta = _meta(workload)
        found = store.controlled_by(REPLICASET, key.namespace, meta.get("name"), meta.get("uid"))
    else:
        owner = controller_of(workload)
        found = (
            []
            if owner is None
            else store.controlled_by(REPLICASET, key.namespace, owner.get("name"), owner.get("uid"))
        )
        if found is not None and not any(rs is workload for rs in found):
            found = sorted([*found, workload], key=_name)
    return store.objects(REPLICASET, key.namespace) if found is None else found


def _workload_objects_indexed(
    store: Store, key: WorkloadKey, *, with_nodes: bool = True, usage: UsageOf | None = None
) -> ClusterObjects:
    objects, uids, selectors = _pod_rules(store, key)
    found: dict[str, RawObject] = {}
    for uid in uids:
        found.update(store.pods_controlled_by(key.namespace, REPLICASET, uid))
    pairs = _required_pairs(selectors)
    groups = (
        store.pod_label_sets(key.namespace)
        if pairs is None
        else store.pod_label_sets_with(key.namespace, pairs)
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
    store: Store, key: WorkloadKey, *, with_nodes: bool = True, usage: UsageOf | None = None
) -> ClusterObjects:
    """:func:`workload_objects` reading every pod of the namespace: what it did before the
    store's pod indexes, and what it still does where they cannot stand for every pod."""
    objects, uids, selectors = _pod_rules(store, key)
    nodes: set[str] = set()
    for pod in store.objects("Pod", key.namespace):
        ref = controller_of(pod)
        labels = _meta(pod).get("labels") or {}
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
    store: Store, objects: ClusterObjects, nodes: set[str], usage: UsageOf | None = None
) -> None:
    """Add ``nodes`` and every pod bound to them (for ``Node.requested``), and with ``usage``
    each node's usage."""
    for node in sorted(nodes):
        raw_node = store.get("Node", "", node)
        if raw_node is not None:
            objects.nodes[node] = cast(NodeJSON, raw_node)
        on_node = store.keyed_pods_on_node(node)
        for namespace, name, pod in on_node:
            objects.pods.setdefault((namespace, name), cast(PodJSON, pod))
        if usage is not None:
            objects.node_usage[node] = usage(
                node, store.node_stamp(node), [pod for _, _, pod in on_node]
            )


def _controlled_by(obj: Mapping[str, Any], kind: str, owner: Mapping[str, Any]) -> bool:
    ref = controller_of(obj)
    return (
        ref is not None
        and ref.get("kind") == kind
        and ref.get("name") == _meta(owner).get("name")
        and _same_object(ref, owner)
    )


def _same_ref(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.get("kind") != b.get("kind"):
        return False
    if a.get("uid") and b.get("uid"):
        return bool(a.get("uid") == b.get("uid"))
    return bool(a.get("name") == b.get("name"))


def _name(obj: RawObject) -> str:
    return str(_meta(obj).get("name", ""))


def workload_snapshot(
    store: Store,
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


def convert_snapshot_pods(store: Store, key: WorkloadKey, pods: PodCache) -> None:
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
