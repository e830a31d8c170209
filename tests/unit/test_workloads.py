"""The watcher's decisions over the cache: which workloads a change touches, that podcost's own
cost writes touch none, opt-in and policy, and snapshots built from the cache."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.unit.rawobjects import (
    NS,
    T,
    managed,
    owner,
    raw_deployment,
    raw_namespace,
    raw_node,
    raw_pod,
    raw_replicaset,
)

from podcost_core.kubejson import ConversionError
from podcost_core.model import DELETION_COST_ANNOTATION, CostOwner, Pod, Resources
from podcost_core.policy import DEFAULT_POLICY, Policy, StrategySpec
from podcost_core.projection import SharedParts, project_pod
from podcost_core.quantities import pod_requests
from podcost_core.snapshots import UnknownWorkload, load_objects, snapshot_for_workload
from podcost_core.tomodel import node_from_json, pod_from_json
from podcost_kube.podcache import PodCache
from podcost_kube.snapshots import convert_snapshot_pods, workload_snapshot
from podcost_kube.store import Change, ChangeType, Store
from podcost_kube.workloads import (
    DEPLOYMENT,
    REPLICASET,
    OptInRules,
    WorkloadKey,
    _cost_owner,
    _pod_status_view,
    _read_as_changed,
    _status_only,
    _without_noise,
    is_own_cost_write,
    node_change_matters,
    opted_in_workloads,
    pod_change_matters,
    resolve_policy,
    touched_by,
    workload_policy,
    workloads_of_pod,
)

DATA = Path(__file__).parent / "data"
WEB = WorkloadKey(NS, DEPLOYMENT, "web")
API = WorkloadKey(NS, DEPLOYMENT, "api")
BATCH = WorkloadKey(NS, REPLICASET, "batch")

# --- the shop: raw objects (``rawobjects``) in a store --------------------------------------


def shop() -> Store:
    """Deployment web (two ReplicaSets), Deployment api, ReplicaSet batch without a Deployment,
    an orphan pod labelled like web, a StatefulSet pod, all on nodes n1..n3."""
    store = Store()
    objects = [
        ("Namespace", raw_namespace(NS, {"team": "shop"})),
        ("Node", raw_node("n1", "a")),
        ("Node", raw_node("n2", "b")),
        ("Node", raw_node("n3", "c")),
        ("Deployment", raw_deployment("web", {"podcost.dev/enabled": "true"})),
        ("ReplicaSet", raw_replicaset("web-1", "web", "web")),
        ("ReplicaSet", raw_replicaset("web-0", "web", "web", replicas=0)),
        ("Deployment", raw_deployment("api")),
        ("ReplicaSet", raw_replicaset("api-1", "api", "api")),
        ("ReplicaSet", raw_replicaset("batch", "batch", None)),
        ("Pod", raw_pod("web-1-a", rs="web-1", app="web", node="n1")),
        ("Pod", raw_pod("web-1-b", rs="web-1", app="web", node="n2")),
        ("Pod", raw_pod("api-1-a", rs="api-1", app="api", node="n2")),
        ("Pod", raw_pod("batch-a", rs="batch", app="batch", node="n1")),
        ("Pod", raw_pod("stray", rs=None, app="web", node="n3")),
        ("Pod", raw_pod("db-0", rs="db", app="db", node="n1", controller_kind="StatefulSet")),
        ("Pod", raw_pod("other", rs=None, app="x", node="n1", namespace="elsewhere", cpu="1")),
    ]
    for kind, obj in objects:
        store.apply(kind, ChangeType.ADDED, obj)
    return store


# --- changes ----------------------------------------------------------------------------------


def bumped(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` as the next write returns it: a new resourceVersion, managedFields."""
    new = copy.deepcopy(obj)
    new["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
    return new


def modify(kind: str, namespace: str, name: str, edit: Callable[[dict[str, Any]], None]):  # type: ignore[no-untyped-def]
    def change(store: Store) -> Change | None:
        old = store.get(kind, namespace, name)
        assert old is not None
        new = bumped(old)
        edit(new)
        return store.apply(kind, ChangeType.MODIFIED, new)

    return change


def add(kind: str, obj: dict[str, Any]):  # type: ignore[no-untyped-def]
    return lambda store: store.apply(kind, ChangeType.ADDED, obj)


def delete(kind: str, namespace: str, name: str):  # type: ignore[no-untyped-def]
    def change(store: Store) -> Change | None:
        old = store.get(kind, namespace, name)
        assert old is not None
        return store.apply(kind, ChangeType.DELETED, old)

    return change


def set_cost(value: str | None, manager: str) -> Callable[[dict[str, Any]], None]:
    """``manager`` writes (or with ``None`` removes) the cost; as with an Update, the field
    leaves every other manager's set, and the API omits an empty annotations map."""

    def edit(pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        annotations = meta.setdefault("annotations", {})
        entries = [e for e in meta["managedFields"] if not owns_cost(e)]
        if value is None:
            annotations.pop(DELETION_COST_ANNOTATION, None)
        else:
            annotations[DELETION_COST_ANNOTATION] = value
            entries.append(managed(manager, DELETION_COST_ANNOTATION))
        meta["managedFields"] = entries
        if not annotations:
            del meta["annotations"]

    return edit


def owns_cost(entry: dict[str, Any]) -> bool:
    fields = entry["fieldsV1"]["f:metadata"].get("f:annotations", {})
    return f"f:{DELETION_COST_ANNOTATION}" in fields


def both(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(obj: dict[str, Any]) -> None:
        for one in edits:
            one(obj)

    return edit


def relabel(**labels: str) -> Callable[[dict[str, Any]], None]:
    return lambda obj: obj["metadata"].setdefault("labels", {}).update(labels)


def with_podcost_cost(store: Store) -> None:
    modify("Pod", NS, "web-1-a", set_cost("7", "podcost"))(store)


@dataclass(frozen=True)
class TouchCase:
    name: str
    change: Callable[[Store], Change | None]
    touched: frozenset[WorkloadKey]
    before: Callable[[Store], None] | None = None


def status(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda obj: obj["status"].update(fields)


def not_ready(pod: dict[str, Any]) -> None:
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False", "lastTransitionTime": T}]


def taint(node: dict[str, Any]) -> None:
    node["spec"]["taints"] = [{"key": "spot", "effect": "PreferNoSchedule"}]


TOUCH_CASES = [
    TouchCase(
        "a new pod touches the Deployment that owns its ReplicaSet",
        add("Pod", raw_pod("web-1-c", rs="web-1", app="web", node="n3")),
        frozenset({WEB}),
    ),
    TouchCase(
        "a pod of a ReplicaSet no Deployment controls touches that ReplicaSet",
        add("Pod", raw_pod("batch-b", rs="batch", app="batch", node="n2")),
        frozenset({BATCH}),
    ),
    TouchCase(
        "a deleted pod touches its workload",
        delete("Pod", NS, "api-1-a"),
        frozenset({API}),
    ),
    TouchCase(
        "a pod that stops being ready touches its workload",
        modify("Pod", NS, "web-1-a", not_ready),
        frozenset({WEB}),
    ),
    TouchCase(
        "a pod's label change touches its workload",
        modify("Pod", NS, "web-1-a", relabel(tier="front")),
        frozenset({WEB}),
    ),
    TouchCase(
        "podcost's own deletion-cost write touches nothing",
        modify("Pod", NS, "web-1-a", set_cost("7", "podcost")),
        frozenset(),
    ),
    TouchCase(
        "podcost rewriting its own cost touches nothing",
        modify("Pod", NS, "web-1-a", set_cost("9", "podcost")),
        frozenset(),
        before=with_podcost_cost,
    ),
    TouchCase(
        "podcost removing its own cost touches nothing",
        modify("Pod", NS, "web-1-a", set_cost(None, "podcost")),
        frozenset(),
        before=with_podcost_cost,
    ),
    TouchCase(
        "a deletion cost someone else writes touches the workload",
        modify("Pod", NS, "web-1-a", set_cost("7", "kubectl-annotate")),
        frozenset({WEB}),
    ),
    TouchCase(
        "someone else taking over podcost's cost with the same value touches the workload",
        modify("Pod", NS, "web-1-a", set_cost("7", "kubectl-annotate")),
        frozenset({WEB}),
        before=with_podcost_cost,
    ),
    TouchCase(
        "podcost's cost write that comes with a label change touches the workload",
        modify("Pod", NS, "web-1-a", both(set_cost("7", "podcost"), relabel(tier="front"))),
        frozenset({WEB}),
    ),
    TouchCase(
        "a pod status change that no snapshot shows touches nothing",
        modify("Pod", NS, "web-1-a", status(podIP="10.0.0.9")),
        frozenset(),
    ),
    TouchCase(
        "a write that changes only the resourceVersion touches nothing",
        modify("Pod", NS, "web-1-a", lambda pod: None),
        frozenset(),
    ),
    TouchCase(
        "an orphan pod touches the workloads whose ReplicaSet selector matches it",
        modify("Pod", NS, "stray", status(phase="Failed")),
        frozenset({WEB}),
    ),
    TouchCase(
        "a pod a StatefulSet controls touches nothing",
        modify("Pod", NS, "db-0", not_ready),
        frozenset(),
    ),
    TouchCase(
        "a pod whose ReplicaSet is not cached yet touches nothing",
        add("Pod", raw_pod("new-1-a", rs="new-1", app="new", node="n1")),
        frozenset(),
    ),
    TouchCase(
        "a pod that changes owner touches the workloads before and after",
        modify(
            "Pod",
            NS,
            "web-1-b",
            lambda pod: pod["metadata"].update(ownerReferences=owner(REPLICASET, "api-1")),
        ),
        frozenset({WEB, API}),
    ),
    TouchCase(
        "a ReplicaSet status update touches nothing",
        modify("ReplicaSet", NS, "web-1", status(readyReplicas=1)),
        frozenset(),
    ),
    TouchCase(
        "a scaled ReplicaSet touches its Deployment",
        modify("ReplicaSet", NS, "web-1", lambda rs: rs["spec"].update(replicas=5)),
        frozenset({WEB}),
    ),
    TouchCase(
        "a new ReplicaSet touches its Deployment",
        add("ReplicaSet", raw_replicaset("api-2", "api", "api")),
        frozenset({API}),
    ),
    TouchCase(
        "a Deployment's annotation change touches it",
        modify(
            "Deployment",
            NS,
            "api",
            lambda d: d["metadata"]["annotations"].update({"podcost.dev/enabled": "true"}),
        ),
        frozenset({API}),
    ),
    TouchCase(
        "a Deployment status update touches nothing",
        modify("Deployment", NS, "api", status(observedGeneration=2)),
        frozenset(),
    ),
    TouchCase(
        "a node relabel touches every workload with pods on it",
        modify("Node", "", "n1", relabel(**{"topology.kubernetes.io/zone": "z"})),
        frozenset({WEB, BATCH}),
    ),
    TouchCase(
        "a new taint on a node touches every workload with pods on it",
        modify("Node", "", "n2", taint),
        frozenset({WEB, API}),
    ),
    TouchCase(
        "a node heartbeat touches nothing",
        modify(
            "Node",
            "",
            "n1",
            status(
                conditions=[
                    {"type": "Ready", "status": "True", "lastHeartbeatTime": "2025-01-01T00:00:00Z"}
                ]
            ),
        ),
        frozenset(),
    ),
    TouchCase(
        "a deleted node touches the workloads that had pods on it",
        delete("Node", "", "n3"),
        frozenset({WEB}),  # through the orphan pod "stray", which web's selector matches
    ),
    TouchCase(
        "a namespace relabel touches every workload in it",
        modify("Namespace", "", NS, relabel(podcost="on")),
        frozenset({WEB, API, BATCH}),
    ),
    TouchCase(
        "a namespace annotation change touches nothing",
        modify("Namespace", "", NS, lambda ns: ns["metadata"].update(annotations={"a": "b"})),
        frozenset(),
    ),
]


@pytest.mark.parametrize("case", TOUCH_CASES, ids=[case.name for case in TOUCH_CASES])
def test_touched_workloads(case: TouchCase) -> None:
    store = shop()
    if case.before is not None:
        case.before(store)
    change = case.change(store)
    if change is None:  # an update of nothing the store keeps: the store reports no change
        assert case.touched == frozenset()
        return
    assert touched_by(change, store) == case.touched


def test_a_change_of_the_resource_version_alone_touches_nothing() -> None:
    # The store reports none (``Store.apply``); a relist of another store could.
    store = shop()
    old = store.get("Pod", NS, "web-1-a")
    assert old is not None
    assert touched_by(Change("Pod", ChangeType.MODIFIED, old, bumped(old)), store) == frozenset()


# --- feedback loop, in raw terms --------------------------------------------------------------


def test_an_own_cost_write_is_recognised_only_when_podcost_owns_the_new_value() -> None:
    old = raw_pod("p", rs="web-1", app="web", node="n1")
    ours, theirs = bumped(old), bumped(old)
    set_cost("3", "podcost")(ours)
    set_cost("3", "kubectl")(theirs)
    assert is_own_cost_write(old, ours)
    assert not is_own_cost_write(old, theirs)
    assert not is_own_cost_write(None, ours)
    assert not is_own_cost_write(ours, ours)  # nothing changed at all


def test_a_change_of_who_owns_the_same_cost_matters() -> None:
    old = raw_pod("p", rs="web-1", app="web", node="n1")
    set_cost("3", "podcost")(old)
    new = bumped(old)
    set_cost("3", "kubectl")(new)
    new["metadata"]["managedFields"] = [managed("kubectl", DELETION_COST_ANNOTATION)]
    assert pod_change_matters(old, new)


# --- status-only updates are decided without converting; they must agree with the converter --

T2 = "2024-05-01T13:00:00Z"
conditions = st.lists(
    st.fixed_dictionaries({
        "type": st.sampled_from(["Ready", "Ready", "ContainersReady", "DisruptionTarget"]),
        "status": st.sampled_from(["True", "False"]),
        "lastTransitionTime": st.sampled_from([T, T2]),
    }),
    max_size=3,
)  # fmt: skip
container_statuses = st.lists(
    st.fixed_dictionaries({
        "name": st.sampled_from(["app", "side", "init"]),
        "restartCount": st.integers(0, 2),
        "ready": st.booleans(),
        "state": st.sampled_from([{"running": {"startedAt": T}}, {"waiting": {"reason": "x"}}]),
    }),
    max_size=2,
)  # fmt: skip
pod_statuses = st.fixed_dictionaries(
    {},
    optional={
        "phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown", "Odd"]),
        "qosClass": st.sampled_from(["BestEffort", "Burstable", "Guaranteed"]),
        "conditions": conditions,
        "containerStatuses": container_statuses,
        "initContainerStatuses": container_statuses,
        "podIP": st.sampled_from(["10.0.0.1", "10.0.0.2"]),
        "startTime": st.sampled_from([T, T2]),
    },
)


def with_status(status: dict[str, Any]) -> dict[str, Any]:
    pod = raw_pod("p", rs="web-1", app="web", node="n1")
    pod["spec"]["initContainers"] = [
        {"name": "init"}, {"name": "side", "restartPolicy": "Always"}
    ]  # fmt: skip
    pod["status"] = status
    return pod


def updated(statuses: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[tuple[Any, Any]]:
    """A status and an update of it: some fields dropped, some redrawn, the rest kept."""

    @st.composite
    def pair(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
        before = draw(statuses)
        dropped = draw(st.sets(st.sampled_from(sorted(before)))) if before else set()
        after = {k: v for k, v in before.items() if k not in dropped} | draw(statuses)
        return before, after

    return pair()


READY_SINCE_T = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": T}]}
NOT_READY_SINCE_T = {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": T}]}


@settings(max_examples=500, deadline=None)
@given(updated(pod_statuses))
@example((READY_SINCE_T, NOT_READY_SINCE_T))
@example(
    (READY_SINCE_T, {"conditions": [{**READY_SINCE_T["conditions"][0], "lastTransitionTime": T2}]})
)
def test_a_status_update_that_changes_the_converted_pod_always_matters(
    statuses: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    before, after = statuses
    old, new = with_status(before), bumped(with_status(before))
    new["status"] = after
    if pod_from_json(old) != pod_from_json(new):
        assert pod_change_matters(old, new)


def _matters_copying_first(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """``pod_change_matters`` as it read an update beyond status and noise: both versions copied
    without their noise and compared before the fields carried over as they are."""
    quiet_old, quiet_new = _without_noise(old), _without_noise(new)
    if quiet_old == quiet_new:
        return _cost_owner(old) is not _cost_owner(new)
    if _status_only(quiet_old, quiet_new):
        return _pod_status_view(old) != _pod_status_view(new)
    if _read_as_changed(old, new):
        return True
    try:
        return pod_from_json(old) != pod_from_json(new)
    except ConversionError:
        return True


# A version of a pod's spec and metadata: where it is bound, whether it is being deleted, its
# labels and annotations, what it requests, and a field nothing reads.
pod_versions = st.fixed_dictionaries(
    {
        "node": st.sampled_from([None, "", "n1", "n2"]),
        "deleting": st.sampled_from([None, T]),
        "labels": st.sampled_from([None, {}, {"app": "web"}, {"app": "web", "x": "y"}]),
        "annotations": st.sampled_from([None, {}, {"a": "1"}]),
        "cpu": st.sampled_from(["100m", "200m"]),
        "hostname": st.sampled_from([None, "h1"]),
        "phase": st.sampled_from(["Running", "Pending"]),
    }
)


def _pod_version(version: dict[str, Any], resource_version: str) -> dict[str, Any]:
    pod = raw_pod("p", rs="web-1", app="web", node=version["node"], cpu=version["cpu"],
                  phase=version["phase"])  # fmt: skip
    meta = pod["metadata"]
    meta["resourceVersion"] = resource_version
    for field, value in (("deletionTimestamp", version["deleting"]),
                         ("annotations", version["annotations"])):  # fmt: skip
        if value is not None:
            meta[field] = value
    if version["labels"] is None:
        del meta["labels"]
    else:
        meta["labels"] = version["labels"]
    if version["hostname"] is not None:
        pod["spec"]["hostname"] = version["hostname"]
    return pod


@settings(max_examples=300, deadline=None)
@given(pod_versions, pod_versions)
def test_an_update_told_to_matter_without_copying_is_told_so_as_by_copying_first(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    """A pod bound, a deletion begun, labels or annotations changed are told to matter before
    both versions are copied without their noise: whatever else changed with them, the answer
    is the one copying first gives."""
    old, new = _pod_version(before, "1"), _pod_version(after, "2")
    assert pod_change_matters(old, new) == _matters_copying_first(old, new)


node_statuses = st.fixed_dictionaries(
    {},
    optional={
        "allocatable": st.sampled_from([{"cpu": "4", "pods": "110"}, {"cpu": "8", "pods": "110"}]),
        "capacity": st.sampled_from([{"cpu": "4"}, {"cpu": "8"}]),
        "conditions": conditions,
        "addresses": st.sampled_from([[], [{"type": "InternalIP", "address": "10.0.0.1"}]]),
    },
)


@settings(max_examples=200, deadline=None)
@given(updated(node_statuses))
def test_a_node_status_update_that_changes_the_converted_node_always_matters(
    statuses: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    before, after = statuses
    old = raw_node("n1", "a")
    old["status"] = before
    new = bumped(old)
    new["status"] = after
    assert node_change_matters(old, new) == (node_from_json(old) != node_from_json(new))


# --- opt-in and policy ------------------------------------------------------------------------

SELECT_SHOP = OptInRules(namespace_selector={"matchLabels": {"team": "shop"}})


@dataclass(frozen=True)
class PolicyCase:
    name: str
    annotations: dict[str, str]
    namespace_labels: dict[str, str] | None
    rules: OptInRules
    enabled: bool
    source: str
    strategies: tuple[str, ...] | None = None
    """The policy's strategy names, when enabled; ``None``: not checked."""


POLICY_CASES = [
    PolicyCase(
        "podcost.dev/enabled true opts in with the default policy",
        {"podcost.dev/enabled": "true"}, None, OptInRules(), True, "podcost.dev/enabled",
        DEFAULT_POLICY.names,
    ),
    PolicyCase(
        "the lablabs alias opts in",
        {"pod-deletion-cost.lablabs.io/enabled": "true"}, None, OptInRules(), True,
        "pod-deletion-cost.lablabs.io/enabled",
    ),
    PolicyCase(
        "the enabled value is read without regard to case or spaces",
        {"podcost.dev/enabled": " True "}, None, OptInRules(), True, "podcost.dev/enabled",
    ),
    PolicyCase(
        "a workload that says nothing is left alone by default",
        {}, {"team": "shop"}, OptInRules(), False, "cluster default",
    ),
    PolicyCase(
        "a namespace that the selector matches opts its workloads in",
        {}, {"team": "shop"}, SELECT_SHOP, True, "namespace selector",
    ),
    PolicyCase(
        "a namespace that the selector does not match leaves its workloads out",
        {}, {"team": "pay"}, SELECT_SHOP, False, "cluster default",
    ),
    PolicyCase(
        "an unknown namespace is not selected",
        {}, None, SELECT_SHOP, False, "cluster default",
    ),
    PolicyCase(
        "podcost.dev/enabled false opts out even in a selected namespace",
        {"podcost.dev/enabled": "false"}, {"team": "shop"}, SELECT_SHOP, False,
        "podcost.dev/enabled",
    ),
    PolicyCase(
        "podcost's own enabled annotation wins over the lablabs one",
        {"podcost.dev/enabled": "false", "pod-deletion-cost.lablabs.io/enabled": "true"},
        None, OptInRules(), False, "podcost.dev/enabled",
    ),
    PolicyCase(
        "the cluster default opts in a workload that says nothing",
        {}, None, OptInRules(default_enabled=True), True, "cluster default",
    ),
    PolicyCase(
        "podcost.dev/strategies picks the strategies and their weights",
        {"podcost.dev/enabled": "true",
         "podcost.dev/strategies": "topology-spread=3,capacity-type=1"},
        None, OptInRules(), True, "podcost.dev/enabled", ("topology-spread", "capacity-type"),
    ),
    PolicyCase(
        "lablabs' zone type ranks by topology spread first",
        {"pod-deletion-cost.lablabs.io/enabled": "true",
         "pod-deletion-cost.lablabs.io/type": "zone"},
        None, OptInRules(), True, "pod-deletion-cost.lablabs.io/enabled",
    ),
    PolicyCase(
        "a cluster default policy applies to a workload that names no strategies",
        {"podcost.dev/enabled": "true"}, None,
        OptInRules(default_policy=Policy((StrategySpec("age"),))), True, "podcost.dev/enabled",
        ("age",),
    ),
    PolicyCase(
        "an enabled value other than true or false disables the workload",
        {"podcost.dev/enabled": "yes"}, None, OptInRules(default_enabled=True), False,
        "podcost.dev/enabled",
    ),
    PolicyCase(
        "an unknown strategy disables the workload",
        {"podcost.dev/enabled": "true", "podcost.dev/strategies": "no-such-strategy"}, None,
        OptInRules(), False, "podcost.dev/enabled",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", POLICY_CASES, ids=[case.name for case in POLICY_CASES])
def test_opt_in_and_policy(case: PolicyCase) -> None:
    resolved = resolve_policy(case.annotations, case.namespace_labels, case.rules)
    assert (resolved.enabled, resolved.source) == (case.enabled, case.source)
    assert (resolved.policy is not None) == case.enabled
    if case.strategies is not None:
        assert resolved.policy is not None
        assert resolved.policy.names == case.strategies


def test_an_invalid_policy_says_which_annotation_is_at_fault() -> None:
    resolved = resolve_policy(
        {"podcost.dev/enabled": "true", "podcost.dev/strategies": "age=0"}, None
    )
    assert resolved.error is not None
    assert resolved.error.culprit == "age"
    invalid = resolve_policy({"podcost.dev/enabled": "maybe"}, None)
    assert invalid.error is not None
    assert invalid.error.culprit == "podcost.dev/enabled"


def test_spread_by_sets_the_topology_key_of_topology_spread() -> None:
    resolved = resolve_policy(
        {"podcost.dev/enabled": "true", "podcost.dev/spread-by": "example.com/rack"}, None
    )
    assert resolved.policy is not None
    spec = resolved.policy.spec("topology-spread")
    assert spec is not None
    assert spec.args["topology_key"] == "example.com/rack"


def test_lablabs_spread_by_is_an_alias_of_spread_by() -> None:
    resolved = resolve_policy(
        {
            "pod-deletion-cost.lablabs.io/enabled": "true",
            "pod-deletion-cost.lablabs.io/spread-by": "example.com/rack",
        },
        None,
    )
    assert resolved.policy is not None
    spec = resolved.policy.spec("topology-spread")
    assert spec is not None
    assert spec.args["topology_key"] == "example.com/rack"


def test_the_policy_of_a_workload_in_the_store_reads_its_namespace_labels() -> None:
    store = shop()
    assert workload_policy(store, API, SELECT_SHOP).source == "namespace selector"
    assert workload_policy(store, WEB, SELECT_SHOP).source == "podcost.dev/enabled"
    assert not workload_policy(store, WorkloadKey(NS, DEPLOYMENT, "gone"), SELECT_SHOP).enabled


def test_the_opted_in_workloads_are_every_deployment_and_lone_replicaset_that_is_ranked() -> None:
    store = shop()
    assert opted_in_workloads(store) == [WEB]
    assert opted_in_workloads(store, SELECT_SHOP) == [API, WEB, BATCH]
    assert opted_in_workloads(store, OptInRules(default_enabled=True)) == [API, WEB, BATCH]
    assert opted_in_workloads(Store(), SELECT_SHOP) == []


# --- snapshots --------------------------------------------------------------------------------


def test_a_deployment_snapshot_has_the_pods_of_its_replicasets_and_their_nodes() -> None:
    snapshot = workload_snapshot(shop(), WEB, cluster="c1", version=7, taken_at=1000.0)
    assert snapshot.workload.key == "c1/shop/Deployment/web"
    assert (snapshot.version, snapshot.taken_at, snapshot.replicas) == (7, 1000.0, 2)
    assert sorted(pod.name for pod in snapshot.pods) == ["stray", "web-1-a", "web-1-b"]
    assert set(snapshot.replicasets) == {"web-0", "web-1"}
    assert set(snapshot.nodes) == {"n1", "n2", "n3"}
    assert snapshot.annotations == {"podcost.dev/enabled": "true"}


def test_node_requests_add_up_every_active_pod_on_the_node_of_any_workload() -> None:
    store = shop()
    store.apply("Pod", ChangeType.ADDED, raw_pod("done", rs=None, app="z", node="n1",
                                                 phase="Succeeded", cpu="2"))  # fmt: skip
    nodes = workload_snapshot(store, WEB).nodes
    # n1: web-1-a, batch-a and db-0 (100m each) and "other" from another namespace (1 CPU);
    # the finished pod does not count.
    assert nodes["n1"].requested == Resources(cpu_milli=1300, memory_bytes=4 * 64 * 2**20, pods=4)
    assert nodes["n2"].requested == Resources(cpu_milli=200, memory_bytes=2 * 64 * 2**20, pods=2)


def test_a_snapshot_shows_who_wrote_each_cost() -> None:
    store = shop()
    with_podcost_cost(store)
    [pod] = [p for p in workload_snapshot(store, WEB).pods if p.name == "web-1-a"]
    assert (pod.deletion_cost, pod.cost_owner) == (7, CostOwner.PODCOST)


def test_the_snapshot_of_a_workload_not_in_the_cache_is_an_error() -> None:
    with pytest.raises(UnknownWorkload):
        workload_snapshot(shop(), WorkloadKey(NS, DEPLOYMENT, "gone"))


@pytest.mark.parametrize(
    ("kind", "name"),
    [("Deployment", "web"), ("Deployment", "api"), ("ReplicaSet", "batch")],
)
def test_a_snapshot_from_the_cache_equals_the_one_from_a_whole_dump(kind: str, name: str) -> None:
    dump = json.loads((DATA / "shop-dump.json").read_text())
    store = Store()
    for item in dump["items"]:
        store.apply(item["kind"], ChangeType.ADDED, item)
    expected = snapshot_for_workload(load_objects(dump), "shop", name, kind)
    got = workload_snapshot(store, WorkloadKey("shop", kind, name), taken_at=expected.taken_at)
    assert got == replace(expected, version=0)


# --- the pod conversion cache -----------------------------------------------------------------


def test_a_snapshot_through_the_cache_is_the_same_and_a_node_change_converts_no_pod_again() -> None:
    store, pods = shop(), PodCache()
    first = workload_snapshot(store, WEB, pods=pods)
    assert first == workload_snapshot(store, WEB)
    # Its 3 pods converted; the 4 others on its nodes only summed (api-1-a, batch-a, db-0, other).
    assert (pods.misses, pods.hits, len(pods)) == (3, 0, 3)
    # A node change re-publishes the workload: its pods did not change, none is converted.
    node = bumped(raw_node("n1", "a"))
    taint(node)
    store.apply("Node", ChangeType.MODIFIED, node)
    again = workload_snapshot(store, WEB, pods=pods)
    assert (pods.misses, pods.hits) == (3, 3)
    assert again.pods == first.pods
    assert again.nodes != first.nodes


def test_converting_a_snapshots_pods_first_converts_those_it_shows_and_sums_no_other() -> None:
    store, first, plain = shop(), PodCache(), PodCache()
    convert_snapshot_pods(store, WEB, first)
    # Its 3 pods converted; the 4 others on its nodes not summed: no entry kept for them.
    assert (first.misses, len(first), len(first._sums)) == (3, 3, 3)
    snapshot = workload_snapshot(store, WEB, pods=first)
    assert snapshot == workload_snapshot(store, WEB, pods=plain) == workload_snapshot(store, WEB)
    assert (first.misses, first.hits) == (3, 3)  # publishing converts none of them again


def test_converting_a_snapshots_pods_first_converts_and_reports_what_the_snapshot_does() -> None:
    store = shop()
    store.apply("Pod", ChangeType.ADDED, raw_pod("web-1-done", rs="web-1", app="web", node="n3",
                                                  phase="Succeeded"))  # fmt: skip
    for key in opted_in_workloads(store, OptInRules(default_enabled=True)):
        first: list[Pod] = []
        alone: list[Pod] = []
        convert_snapshot_pods(store, key, PodCache(on_convert=first.append))
        workload_snapshot(store, key, pods=PodCache(on_convert=alone.append))
        assert first == alone
        assert first


def test_requests_are_summed_once_per_distinct_set_of_shared_parts_not_per_pod() -> None:
    shared = SharedParts()
    raws = [
        project_pod(raw_pod(f"p{index}", rs="web-1", app="web", node="n1"), shared)
        for index in range(200)
    ]
    raws.append(project_pod(raw_pod("big", rs="web-1", app="web", node="n1", cpu="2"), shared))
    pods = PodCache()
    sums = [pods.requests(raw) for raw in raws]
    assert sums == [pod_requests(raw["spec"]) for raw in raws]
    # The projection shares equal containers: two sums kept, no converted pod, no entry a pod.
    assert (len(pods._sums), len(pods)) == (2, 0)
    assert pods.convert(raws[0]).requests is sums[0] is sums[199]
    # A new version with the same request parts (a status update) keeps the sum.
    status_only = bumped(raws[0])
    status_only["spec"]["containers"] = raws[0]["spec"]["containers"]
    assert pods.requests(status_only) is sums[0]
    assert len(pods._sums) == 2


def test_requests_with_init_containers_or_overhead_are_summed_by_every_part() -> None:
    shared = SharedParts()
    raws = []
    for index, overhead in enumerate(["10m", "10m", "20m"]):
        raw = raw_pod(f"p{index}", rs="web-1", app="web", node="n1")
        raw["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "1"}}}]
        raw["spec"]["overhead"] = {"cpu": overhead}
        raws.append(project_pod(raw, shared))
    pods = PodCache()
    sums = [pods.requests(raw) for raw in raws]
    assert sums == [pod_requests(raw["spec"]) for raw in raws]
    assert (sums[0].cpu_milli, sums[2].cpu_milli) == (1010, 1020)
    assert sums[0] is sums[1]
    assert len(pods._sums) == 2  # the third's overhead differs: a sum of its own


def test_at_most_size_pods_are_kept_the_least_recently_used_going_first() -> None:
    seen: list[str] = []
    pods = PodCache(on_convert=lambda pod: seen.append(pod.name), size=3)
    raws = [raw_pod(f"p{index}", rs="web-1", app="web", node="n1") for index in range(4)]
    for raw in raws[:3]:
        pods.convert(raw)
    pods.convert(raws[0])  # used again: p1 is now the least recently used
    pods.convert(raws[3])
    assert (len(pods), pods.misses, pods.hits) == (3, 4, 1)
    pods.convert(raws[0])
    pods.convert(raws[2])
    assert (pods.misses, pods.hits) == (4, 3)
    assert pods.convert(raws[1]) == pod_from_json(raws[1])  # it went: converted again
    assert (len(pods), pods.misses) == (3, 5)
    # Each conversion of a version is handed over; p1's twice, as it was converted twice.
    assert seen == ["p0", "p1", "p2", "p3", "p1"]
    with pytest.raises(ValueError, match="size"):
        PodCache(size=0)


def test_a_pod_converted_unreported_and_pushed_out_is_reported_when_converted_again() -> None:
    seen: list[str] = []
    pods = PodCache(on_convert=lambda pod: seen.append(pod.name), size=1)
    first, second = (raw_pod(f"p{index}", rs="web-1", app="web", node="n1") for index in range(2))
    pods.convert(first, report=False)
    pods.convert(second, report=False)  # first goes, unreported
    assert (seen, pods._unreported) == ([], {second["metadata"]["uid"]})
    pods.convert(first)
    assert (seen, pods._unreported) == (["p0"], set())


def test_the_cache_keeps_the_stores_maps_and_one_tuple_of_equal_tolerations() -> None:
    store, pods = shop(), PodCache()
    raw = store.get("Pod", NS, "web-1-a")
    assert raw is not None
    raw = copy.deepcopy(raw)
    raw["spec"]["tolerations"] = [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]
    twin = copy.deepcopy(raw)
    twin["metadata"]["uid"] = "another-uid"
    cached, other = pods.convert(raw), pods.convert(twin)
    # The store never changes a kept object: the pod keeps its maps, not a copy of each.
    assert cached.labels is raw["metadata"]["labels"]
    assert cached.annotations is raw["metadata"].get("annotations", cached.annotations)
    assert cached.tolerations is other.tolerations  # equal tolerations: one tuple
    assert [(t.key, t.operator, t.value, t.effect) for t in cached.tolerations] == [
        ("k", "Exists", "", "NoSchedule")
    ]
    # Outside the cache the raw object is the caller's: the pod copies its maps.
    plain = pod_from_json(raw)
    assert plain == cached
    assert plain.labels is not raw["metadata"]["labels"]


def test_a_new_version_of_a_pod_is_converted_again_and_replaces_the_old_one() -> None:
    store, pods = shop(), PodCache()
    workload_snapshot(store, WEB, pods=pods)
    old = store.get("Pod", NS, "web-1-a")
    assert old is not None
    new = bumped(old)
    new["metadata"]["labels"]["extra"] = "x"
    store.apply("Pod", ChangeType.MODIFIED, new)
    [pod] = [p for p in workload_snapshot(store, WEB, pods=pods).pods if p.name == "web-1-a"]
    assert pod.labels == {"app": "web", "extra": "x"}
    assert (pods.misses, pods.hits, len(pods)) == (4, 2, 3)


def test_a_deleted_pod_leaves_the_cache() -> None:
    store, pods = shop(), PodCache()
    workload_snapshot(store, WEB, pods=pods)
    old = store.get("Pod", NS, "web-1-b")
    assert old is not None
    change = store.apply("Pod", ChangeType.DELETED, old)
    assert change is not None
    pods.observe(change)
    pods.observe(Change("Node", ChangeType.DELETED, raw_node("n1", "a"), None))  # not a pod
    assert len(pods) == 2
    workload_snapshot(store, WEB, pods=pods)
    assert (pods.misses, len(pods)) == (3, 2)


def test_empty_labels_and_annotations_are_one_map_for_every_pod() -> None:
    raws = [raw_pod(f"p{index}", rs="web-1", app="web", node="n1") for index in range(2)]
    for raw in raws:
        del raw["metadata"]["labels"]
    pods = PodCache()
    one, two = (pods.convert(raw) for raw in raws)
    assert one.labels == one.annotations == {}
    assert one.labels is two.labels
    assert one.annotations is two.annotations
    assert one == pod_from_json(raws[0])


def test_a_pod_without_a_resource_version_is_converted_every_time() -> None:
    raw = raw_pod("p", rs="web-1", app="web", node="n1")
    del raw["metadata"]["resourceVersion"]
    pods = PodCache()
    assert pods.convert(raw) == pods.convert(raw) == pod_from_json(raw)
    assert (pods.misses, pods.hits, len(pods)) == (2, 0, 0)


def test_each_version_of_a_pod_is_handed_to_on_convert_once() -> None:
    seen: list[Pod] = []
    pods = PodCache(on_convert=seen.append)
    raw = raw_pod("p", rs="web-1", app="web", node="n1")
    pods.convert(raw)
    pods.convert(raw)
    pods.convert(bumped(raw))
    assert [pod.name for pod in seen] == ["p", "p"]


def test_the_requests_of_a_pod_are_summed_once_per_version() -> None:
    pods = PodCache()
    raw = raw_pod("p", rs="web-1", app="web", node="n1", cpu="250m")
    first = pods.requests(raw)
    assert first == Resources(cpu_milli=250, memory_bytes=64 * 2**20, pods=1)
    assert pods.requests(raw) is first
    changed = bumped(raw)
    changed["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
    assert pods.requests(changed).cpu_milli == 1000
    assert pods.convert(changed).requests is pods.requests(changed)


def test_the_requests_of_a_pod_are_kept_across_versions_that_change_only_its_status() -> None:
    pods = PodCache()
    raw = raw_pod("p", rs="web-1", app="web", node="n1", cpu="250m")
    first = pods.requests(raw)
    status_only = bumped(raw)
    status_only["status"]["phase"] = "Failed"
    assert pods.requests(status_only) is first
    resized = bumped(status_only)
    resized["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1Gi"
    assert pods.requests(resized) == Resources(cpu_milli=250, memory_bytes=2**30, pods=1)


def test_a_node_is_converted_once_per_version_and_carries_the_requests_given() -> None:
    pods = PodCache()
    raw = raw_node("n1", "a")
    used = Resources(cpu_milli=300, memory_bytes=2**20, pods=2)
    first = pods.node(raw, used)
    assert first == node_from_json(raw, used)
    assert pods.node(raw, Resources()) == node_from_json(raw)
    tainted = bumped(raw)
    taint(tainted)
    assert pods.node(tainted, used) == node_from_json(tainted, used) != first


def test_a_pod_converted_without_report_is_reported_when_a_snapshot_first_shows_it() -> None:
    seen: list[Pod] = []
    pods = PodCache(on_convert=seen.append)
    raw = raw_pod("p", rs="web-1", app="web", node="n1")
    quiet = pods.convert(raw, report=False)
    assert seen == []
    assert pods.convert(raw) is quiet
    pods.convert(raw)
    assert seen == [quiet]
    assert (pods.misses, pods.hits) == (1, 2)


def test_deciding_that_a_pod_change_matters_leaves_the_new_version_in_the_cache() -> None:
    store, pods = shop(), PodCache()
    old = store.get("Pod", NS, "web-1-a")
    assert old is not None
    new = bumped(old)
    new["spec"]["priority"] = 7
    change = store.apply("Pod", ChangeType.MODIFIED, new)
    assert change is not None
    quiet = functools.partial(pods.convert, report=False)
    assert touched_by(change, store, convert_pod=quiet) == touched_by(change, store) == {WEB}
    before = pods.misses
    [pod] = [p for p in workload_snapshot(store, WEB, pods=pods).pods if p.name == "web-1-a"]
    assert pod.priority == 7
    assert pods.misses == before + 2  # the two other pods of web; web-1-a was converted already


@pytest.mark.parametrize(
    "edit",
    [
        lambda pod: pod["metadata"]["labels"].update(extra="x"),
        lambda pod: pod["metadata"].update(annotations={"note": "x"}),
        lambda pod: pod["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"),
        lambda pod: pod["spec"].update(nodeName="n9"),
    ],
    ids=["labels", "annotations", "deletion", "node"],
)
def test_a_change_of_a_field_the_pod_carries_over_matters_without_converting(
    edit: Callable[[dict[str, Any]], None],
) -> None:
    store, pods = shop(), PodCache()
    old = store.get("Pod", NS, "web-1-a")
    assert old is not None
    new = bumped(old)
    edit(new)
    quiet = functools.partial(pods.convert, report=False)
    assert pod_change_matters(old, new, convert=quiet)
    assert (pods.hits, pods.misses) == (0, 0)
    assert pod_from_json(old) != pod_from_json(new)  # what converting would have found


@pytest.mark.parametrize(
    ("before", "after", "matters"),
    [
        ({"uid": "u", "generation": 1}, {"uid": "u", "generation": 2}, False),
        ({"uid": "u", "annotations": {"a": "1"}}, {"uid": "u", "generation": 2}, True),
        ({"uid": "u", "generation": 2}, {"uid": "u", "annotations": {"a": "1"}}, True),
        ({"uid": "u"}, {"uid": "v"}, True),
    ],
)
def test_a_metadata_change_beyond_the_noise_is_told_apart_from_the_noise(
    before: dict[str, Any], after: dict[str, Any], matters: bool
) -> None:
    def pod(labels: dict[str, Any]) -> dict[str, Any]:
        meta = {"name": "p", "namespace": NS, "labels": {"app": "web"}, **labels}
        return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}

    old, new = pod(before), pod(after)
    assert pod_change_matters(old, new) is matters
    new["status"] = {"phase": "Failed"}
    assert pod_change_matters(old, new)


def test_a_pods_workload_is_found_by_its_owner_references_while_its_replicaset_holds() -> None:
    store = shop()
    pod = store.get("Pod", NS, "web-1-a")
    assert pod is not None
    # Another pod (or version) of the ReplicaSet with the same owner references list, as the
    # informer shares it: answered from what was found for the first.
    twin = {**pod, "metadata": {**pod["metadata"], "name": "web-1-z"}}
    first = workloads_of_pod(store, pod)
    assert first == {WEB}
    assert workloads_of_pod(store, twin) is first
    # The ReplicaSet moves to another Deployment: the answer follows the store, not the memo.
    replicaset = store.get(REPLICASET, NS, "web-1")
    assert replicaset is not None
    moved = bumped(replicaset)
    moved["metadata"]["ownerReferences"][0]["name"] = "api"
    store.apply(REPLICASET, ChangeType.MODIFIED, moved)
    assert workloads_of_pod(store, twin) == {API}
    # Gone: no workload, nothing kept about it answered.
    store.apply(REPLICASET, ChangeType.DELETED, moved)
    assert workloads_of_pod(store, pod) == frozenset()
    # The same references list in another namespace names another ReplicaSet.
    elsewhere = {**pod, "metadata": {**pod["metadata"], "namespace": "elsewhere"}}
    assert workloads_of_pod(store, elsewhere) == frozenset()
