"""One API object as the model: a pod and a node as every component that acts on them reads
them, and who set a pod's deletion cost.

The watcher converts its informer's pods and nodes with :func:`pod_from_json` and
:func:`node_from_json` (through ``podcost_kube.podcache.PodCache``), ``snapshots`` does for a
dump, the annotator reads who owns a cost with :func:`cost_owner` and :func:`own_cost`. QoS
reads as ``GetPodQOS``, restarts as the ReplicaSet controller's ``maxContainerRestarts``, the
deletion cost as ``GetDeletionCostFromPodAnnotations``. Two tables here are shared by every
converted pod of the process: the tolerations (one tuple per distinct list) and the pods' times.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from typing import Any

from podcost_core.kubejson import (
    NODE_ADAPTER,
    POD_ADAPTER,
    ConversionError,
    LabelSelectorJSON,
    NodeJSON,
    ObjectMetaJSON,
    PodAffinityTermJSON,
    PodJSON,
    PodSpecJSON,
    PodStatusJSON,
    controller_ref,
    cost_managers,
    parse_time,
    restartable,
    validate,
)
from podcost_core.model import (
    DELETION_COST_ANNOTATION,
    FIELD_MANAGER,
    AffinityTerm,
    CostOwner,
    Node,
    NodeName,
    Phase,
    Pod,
    PodUID,
    QoSClass,
    Resources,
    Taint,
    Toleration,
)
from podcost_core.quantities import compute_qos, pod_requests, quantity_milli, quantity_value
from podcost_core.victims import deletion_cost_error, parse_deletion_cost


def cost_owner(meta: ObjectMetaJSON, adopt: Collection[str] = ()) -> CostOwner:
    """Who set the deletion cost: podcost when its own field manager, or one of ``adopt`` (the
    managers whose costs podcost takes over), owns the annotation; anyone else is ``OTHER``."""
    if DELETION_COST_ANNOTATION not in meta.get("annotations", {}):
        return CostOwner.NONE
    for manager in cost_managers(meta):
        if manager == FIELD_MANAGER or manager in adopt:
            return CostOwner.PODCOST
    return CostOwner.OTHER


def own_cost(meta: ObjectMetaJSON) -> str | None:
    """The deletion cost exactly as found when podcost's own field manager alone owns it: what
    ``podcost cleanup`` may remove. ``None`` when there is none, or anyone else (an adopted
    manager included: podcost never wrote that value) owns it, or who does is unknown."""
    value = meta.get("annotations", {}).get(DELETION_COST_ANNOTATION)
    return value if value is not None and cost_managers(meta) == (FIELD_MANAGER,) else None


# --- pods -----------------------------------------------------------------------------------


def _restarts(spec: PodSpecJSON, status: PodStatusJSON) -> tuple[int, int]:
    """``maxContainerRestarts``: the highest restart count of a regular container, and of a
    restartable init container (sidecar); plain init containers count for neither."""
    regular = max(
        (c.get("restartCount", 0) for c in status.get("containerStatuses", [])), default=0
    )
    sidecar_names = {c.get("name") for c in spec.get("initContainers", []) if restartable(c)}
    sidecar = max(
        (
            c.get("restartCount", 0)
            for c in status.get("initContainerStatuses", [])
            if c.get("name") in sidecar_names
        ),
        default=0,
    )
    return regular, sidecar


def _reduce_selector(selector: LabelSelectorJSON) -> tuple[dict[str, str], bool]:
    """``matchLabels`` plus the one-value ``In`` expressions; exact when nothing else is left."""
    labels = dict(selector.get("matchLabels", {}))
    exact = True
    for requirement in selector.get("matchExpressions", []):
        values = requirement.get("values", [])
        if requirement.get("operator") == "In" and len(values) == 1:
            labels[requirement.get("key", "")] = values[0]
        else:
            exact = False
    return labels, exact


def _affinity_term(term: PodAffinityTermJSON, weight: int, namespace: str) -> AffinityTerm | None:
    selector = term.get("labelSelector")
    if selector is None:
        return None  # a null selector matches no pod: the term constrains nothing
    labels, exact = _reduce_selector(selector)
    namespaces = term.get("namespaces", [])
    if term.get("namespaceSelector") is not None or (namespaces and namespaces != [namespace]):
        exact = False
    return AffinityTerm(term.get("topologyKey", ""), labels, weight=weight, exact=exact)


def _anti_affinity(spec: PodSpecJSON, namespace: str) -> tuple[AffinityTerm, ...]:
    anti = spec.get("affinity", {}).get("podAntiAffinity", {})
    terms: list[AffinityTerm | None] = [
        _affinity_term(term, 0, namespace)
        for term in anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    ]
    for weighted in anti.get("preferredDuringSchedulingIgnoredDuringExecution", []):
        weight = weighted.get("weight", 1)
        terms.append(_affinity_term(weighted.get("podAffinityTerm", {}), weight, namespace))
    return tuple(term for term in terms if term is not None)


def _phase(value: str | None) -> Phase:
    try:
        return Phase(value or "")
    except ValueError:
        # An empty or unknown phase is active and reads as ordinal 0 in the controller's
        # podPhaseToOrdinal map, exactly like Pending.
        return Phase.PENDING


def _qos(spec: PodSpecJSON, status: PodStatusJSON) -> QoSClass:
    try:
        return QoSClass(status.get("qosClass", ""))
    except ValueError:
        return compute_qos(spec)


#: Most distinct ``spec.tolerations`` lists :func:`pod_from_json` keeps converted (then it starts
#: over): a Deployment's pods share theirs, so a cluster has about one per pod template.
_TOLERATIONS_KEPT = 4096
_tolerations: dict[tuple[tuple[Any, ...], ...], tuple[Toleration, ...]] = {}


def _tolerations_of(spec: PodSpecJSON) -> tuple[Toleration, ...]:
    """The pod's tolerations, one tuple shared by every pod whose tolerations are equal (they
    are frozen): about 0.2 KB a pod less in a cache of converted pods."""
    entries = spec.get("tolerations", [])
    if not entries:
        return ()
    key = tuple(
        (t.get("key", ""), t.get("operator", "Equal") or "Equal", t.get("value", ""),
         t.get("effect", ""))
        for t in entries
    )  # fmt: skip
    found = _tolerations.get(key)
    if found is None:
        if len(_tolerations) >= _TOLERATIONS_KEPT:
            _tolerations.clear()
        found = _tolerations[key] = tuple(
            Toleration(key=k, operator=o, value=v, effect=e) for k, o, v, e in key
        )
    return found


#: The labels or annotations of every pod without any that ``pod_from_json(shared=True)`` reads:
#: read-only, as the maps of the store it shares.
_NO_STRINGS: Mapping[str, str] = {}

#: ``parse_time`` for the times of pods: the pods started or replaced together share their
#: creation and Ready times (whole seconds), and with them one ``float`` each.
_pod_time = functools.lru_cache(maxsize=4096)(parse_time)


def pod_from_json(
    raw: Mapping[str, Any],
    *,
    adopt: Collection[str] = (),
    shared: bool = False,
    requests_of: Callable[[PodSpecJSON], Resources] = pod_requests,
) -> Pod:
    """One pod, as every component that acts on it reads it; a cost set by one of the field
    managers in ``adopt`` counts as podcost's own (``cost_owner``). ``shared``: ``raw`` is never
    changed (an informer's kept object, ``project_pod``'s, whose maps equal pods share), so the
    pod keeps its labels and annotations maps instead of a copy of each. ``requests_of``: what
    sums the validated spec's requests (``pod_requests``; a cache may hand out one
    ``Resources`` for equal sums)."""
    pod: PodJSON = validate(POD_ADAPTER, raw, "pod")
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    name = meta.get("name", "")
    namespace = meta.get("namespace", "")
    if not name:
        raise ConversionError("pod without metadata.name")
    ready_condition = next(
        (c for c in status.get("conditions", []) if c.get("type") == "Ready"), None
    )
    ready = ready_condition is not None and ready_condition.get("status") == "True"
    owner = controller_ref(meta)
    annotations = meta.get("annotations", {})
    labels = meta.get("labels", {})
    if shared:  # the maps of ``raw`` itself, which validation checked (but copied)
        kept = raw.get("metadata", {})
        # Without any, one empty map for every such pod (not a new one each: 64 bytes a pod).
        labels = kept.get("labels", _NO_STRINGS)
        annotations = kept.get("annotations", _NO_STRINGS)
    regular, sidecar = _restarts(spec, status)
    return Pod(
        # A pod always has a UID; hand-written dumps may not, and the UID is a tie-breaker.
        uid=PodUID(meta.get("uid") or f"{namespace}/{name}"),
        name=name,
        namespace=namespace,
        node=NodeName(spec["nodeName"]) if spec.get("nodeName") else None,
        phase=_phase(status.get("phase")),
        ready=ready,
        ready_since=(
            _pod_time(ready_condition.get("lastTransitionTime"))
            if ready and ready_condition is not None
            else None
        ),
        created=_pod_time(meta.get("creationTimestamp")),
        replicaset=owner.get("name")
        if owner is not None and owner.get("kind") == "ReplicaSet"
        else None,
        owner_uid=owner.get("uid") if owner is not None else None,
        restarts=regular,
        sidecar_restarts=sidecar,
        priority=spec.get("priority", 0),
        qos=_qos(spec, status),
        tolerations=_tolerations_of(spec),
        requests=requests_of(spec),
        labels=labels if shared else dict(labels),
        annotations=annotations if shared else dict(annotations),
        deletion_cost=parse_deletion_cost(annotations.get(DELETION_COST_ANNOTATION)),
        deletion_cost_raw=annotations.get(DELETION_COST_ANNOTATION),
        cost_owner=cost_owner(meta, adopt),
        deleting=meta.get("deletionTimestamp") is not None,
        anti_affinity=_anti_affinity(spec, namespace),
    )


def invalid_deletion_cost(pod: Pod) -> str | None:
    """Why the deletion cost found on ``pod`` is one the controller cannot read (not an integer,
    out of int32: it reads 0), ``None`` if it can or there is none. Such a pod counts as having
    no cost (``labels.current_costs``); the watcher reports it."""
    raw = pod.deletion_cost_raw
    return None if raw is None else deletion_cost_error(raw)


def node_from_json(raw: Mapping[str, Any], requested: Resources | None = None) -> Node:
    """One node; ``requested`` is the sum of the requests of the active pods on it, if known."""
    node: NodeJSON = validate(NODE_ADAPTER, raw, "node")
    meta = node.get("metadata", {})
    spec = node.get("spec", {})
    allocatable = node.get("status", {}).get("allocatable", {})
    name = meta.get("name", "")
    if not name:
        raise ConversionError("node without metadata.name")
    return Node(
        name=NodeName(name),
        labels=dict(meta.get("labels", {})),
        annotations=dict(meta.get("annotations", {})),
        taints=tuple(
            Taint(key=t.get("key", ""), effect=t.get("effect", ""), value=t.get("value", ""))
            for t in spec.get("taints", [])
        ),
        allocatable=Resources(
            cpu_milli=quantity_milli(allocatable.get("cpu", 0)),
            memory_bytes=quantity_value(allocatable.get("memory", 0)),
            pods=quantity_value(allocatable.get("pods", 0)),
        ),
        requested=requested or Resources(),
        unschedulable=spec.get("unschedulable", False),
    )
