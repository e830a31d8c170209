"""The annotator's check before a write (``plan.verify``), one row per reason, over a store
holding what an informer would: a namespace, an opted-in Deployment and its ReplicaSet and pods,
a Deployment that never opted in, a ReplicaSet no Deployment owns, a bare pod in kube-system.
Also what the view remembers of deleted pods (``view.ClusterView``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from podcost.annotator.plan import Refusal, Scope, verify, verify_release
from podcost.annotator.view import DELETED_MEMORY, DELETED_MEMORY_SECONDS, ClusterView
from podcost_contracts.messages import WorkloadKey as BusKey
from podcost_core.policy import ENABLED, STRATEGIES
from podcost_kube.store import ChangeType, RawObject, Store
from podcost_kube.workloads import OptInRules

NS = "shop"


def meta(name: str, namespace: str = NS, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
            "resourceVersion": "1", **extra}  # fmt: skip


def controller(kind: str, name: str, namespace: str = NS) -> dict[str, Any]:
    group = "apps/v1" if kind in ("ReplicaSet", "Deployment") else "batch/v1"
    return {"apiVersion": group, "kind": kind, "name": name, "uid": f"uid-{namespace}-{name}",
            "controller": True}  # fmt: skip


def deployment(name: str, annotations: dict[str, str], namespace: str = NS) -> RawObject:
    return {"kind": "Deployment", "metadata": meta(name, namespace, annotations=annotations)}


def replicaset(name: str, owner: str | None, namespace: str = NS) -> RawObject:
    refs = [controller("Deployment", owner, namespace)] if owner else []
    return {"kind": "ReplicaSet", "metadata": meta(name, namespace, ownerReferences=refs)}


def pod(name: str, owner: tuple[str, str] | None, namespace: str = NS) -> RawObject:
    refs = [controller(owner[0], owner[1], namespace)] if owner else []
    return {"kind": "Pod", "metadata": meta(name, namespace, ownerReferences=refs)}


def cluster() -> Store:
    store = Store()
    labelled = {"name": "labelled", "uid": "ns", "resourceVersion": "1", "labels": {"team": "a"}}
    objects = [
        ("Namespace", {"metadata": labelled}),
        ("Deployment", deployment("web", {ENABLED: "true"})),
        ("ReplicaSet", replicaset("web-1", "web")),
        ("Pod", pod("web-1-a", ("ReplicaSet", "web-1"))),
        ("Deployment", deployment("api", {ENABLED: "true"})),
        ("ReplicaSet", replicaset("api-1", "api")),
        ("Pod", pod("api-1-a", ("ReplicaSet", "api-1"))),
        ("Deployment", deployment("legacy", {})),
        ("ReplicaSet", replicaset("legacy-1", "legacy")),
        ("Pod", pod("legacy-1-a", ("ReplicaSet", "legacy-1"))),
        ("Deployment", deployment("broken", {ENABLED: "true", STRATEGIES: "no-such=x"})),
        ("ReplicaSet", replicaset("broken-1", "broken")),
        ("Pod", pod("broken-1-a", ("ReplicaSet", "broken-1"))),
        ("ReplicaSet", replicaset("bare-rs", None)),
        ("Pod", pod("bare-rs-a", ("ReplicaSet", "bare-rs"))),
        ("Pod", pod("job-a", ("Job", "job"))),
        ("Pod", pod("etcd-node", None, namespace="kube-system")),
        ("Pod", pod("orphan-a", ("ReplicaSet", "gone-rs"))),
        ("ReplicaSet", replicaset("lost-1", "lost")),
        ("Pod", pod("lost-1-a", ("ReplicaSet", "lost-1"))),
        ("Deployment", deployment("team", {}, namespace="labelled")),
        ("ReplicaSet", replicaset("team-1", "team", namespace="labelled")),
        ("Pod", pod("team-1-a", ("ReplicaSet", "team-1"), namespace="labelled")),
    ]
    for kind, obj in objects:
        store.apply(kind, ChangeType.ADDED, obj)
    return store


@dataclass(frozen=True)
class Case:
    name: str
    key: str
    pod_namespace: str
    pod_name: str
    expected: Refusal | None
    uid: str | None = None
    scope: Scope = field(default_factory=Scope)


ALL = Scope()
ONLY_SHOP = Scope(namespaces=(NS, "web"))
BY_LABEL = Scope(rules=OptInRules(namespace_selector={"matchLabels": {"team": "a"}}))

CASES = [
    Case("a pod of the opted-in workload the key names is written", f"c/{NS}/Deployment/web",
         NS, "web-1-a", None),
    Case("a workload's pod is written within a scope that lists its namespace",
         f"c/{NS}/Deployment/web", NS, "web-1-a", None, scope=ONLY_SHOP),
    Case("a ReplicaSet no Deployment owns is its own workload, not opted in here",
         f"c/{NS}/ReplicaSet/bare-rs", NS, "bare-rs-a", Refusal.NOT_OPTED_IN),
    Case("a pod in a namespace outside the scope is refused", "c/kube-system/Deployment/web",
         "kube-system", "etcd-node", Refusal.OUT_OF_SCOPE, scope=ONLY_SHOP),
    Case("a pod of the scope under a key outside it is refused", "c/other/Deployment/web",
         NS, "web-1-a", Refusal.OUT_OF_SCOPE, scope=ONLY_SHOP),
    Case("a pod the view does not hold is refused", f"c/{NS}/Deployment/web", NS, "web-1-zz",
         Refusal.UNKNOWN_POD),
    Case("a pod of that name with another uid is refused", f"c/{NS}/Deployment/web", NS,
         "web-1-a", Refusal.UID_MISMATCH, uid="uid-forged"),
    Case("a pod whose ReplicaSet the view has not seen is refused", f"c/{NS}/Deployment/web", NS,
         "orphan-a", Refusal.UNKNOWN_OWNER),
    Case("a pod whose ReplicaSet's Deployment the view has not seen is refused",
         f"c/{NS}/Deployment/lost", NS, "lost-1-a", Refusal.UNKNOWN_OWNER),
    Case("a bare kube-system pod belongs to no workload", f"c/{NS}/Deployment/web",
         "kube-system", "etcd-node", Refusal.NO_WORKLOAD),
    Case("a Job's pod belongs to no workload", f"c/{NS}/Deployment/web", NS, "job-a",
         Refusal.NO_WORKLOAD),
    Case("a pod of another opted-in workload is refused", f"c/{NS}/Deployment/web", NS,
         "api-1-a", Refusal.OTHER_WORKLOAD),
    Case("a pod of a workload that never opted in is refused under its own key",
         f"c/{NS}/Deployment/legacy", NS, "legacy-1-a", Refusal.NOT_OPTED_IN),
    Case("a pod of a workload that never opted in is refused under another's key",
         f"c/{NS}/Deployment/web", NS, "legacy-1-a", Refusal.OTHER_WORKLOAD),
    Case("a workload whose policy annotations are invalid is not opted in",
         f"c/{NS}/Deployment/broken", NS, "broken-1-a", Refusal.NOT_OPTED_IN),
    Case("a namespace selector opts in the workloads of the namespaces it matches",
         "c/labelled/Deployment/team", "labelled", "team-1-a", None, scope=BY_LABEL),
    Case("without the selector the same workload is not opted in",
         "c/labelled/Deployment/team", "labelled", "team-1-a", Refusal.NOT_OPTED_IN),
    Case("a ReplicaSet key does not cover the pods of its Deployment",
         f"c/{NS}/ReplicaSet/web-1", NS, "web-1-a", Refusal.OTHER_WORKLOAD),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_verify(case: Case) -> None:
    store = cluster()
    found = store.get("Pod", case.pod_namespace, case.pod_name)
    uid = case.uid or f"uid-{case.pod_namespace}-{case.pod_name}"
    refused = verify(
        BusKey.parse(case.key), case.pod_namespace, case.pod_name, uid, found, store, case.scope
    )
    assert (refused.reason if refused is not None else None) is case.expected
    if refused is not None:
        assert refused.detail


RELEASES = [
    ("an opted-in workload's costs stay", f"c/{NS}/Deployment/web", NS, "web-1-a",
     Refusal.STILL_OPTED_IN, ALL),
    ("a workload no longer opted in is released", f"c/{NS}/Deployment/legacy", NS,
     "legacy-1-a", None, ALL),
    ("a workload out of scope is released", "c/labelled/Deployment/team", "labelled",
     "team-1-a", None, ONLY_SHOP),
    ("a pod the view does not hold is left to the read", f"c/{NS}/Deployment/legacy", NS,
     "legacy-1-zz", None, ALL),
    ("a pod of another workload is not released under this key", f"c/{NS}/Deployment/legacy",
     NS, "api-1-a", Refusal.OTHER_WORKLOAD, ALL),
    ("a bare pod is not released", f"c/{NS}/Deployment/legacy", "kube-system", "etcd-node",
     Refusal.NO_WORKLOAD, ALL),
]  # fmt: skip


@pytest.mark.parametrize(
    ("key", "namespace", "name", "expected", "scope"),
    [case[1:] for case in RELEASES],
    ids=[case[0] for case in RELEASES],
)
def test_a_release_removes_costs_only_of_a_workload_the_view_says_is_no_longer_podcosts(
    key: str, namespace: str, name: str, expected: Refusal | None, scope: Scope
) -> None:
    store = cluster()
    found = store.get("Pod", namespace, name)
    uid = f"uid-{namespace}-{name}"
    refused = verify_release(BusKey.parse(key), namespace, name, uid, found, store, scope)
    assert (refused.reason if refused is not None else None) is expected


def test_only_a_missing_owner_or_a_missing_opt_in_may_be_waited_for() -> None:
    assert {reason for reason in Refusal if reason.may_catch_up} == {
        Refusal.UNKNOWN_OWNER,
        Refusal.NOT_OPTED_IN,
    }


def test_a_refusal_names_the_workload_the_pod_belongs_to() -> None:
    store = cluster()
    found = store.get("Pod", NS, "api-1-a")
    refused = verify(
        BusKey.parse(f"c/{NS}/Deployment/web"), NS, "api-1-a", f"uid-{NS}-api-1-a", found,
        store, ALL,
    )  # fmt: skip
    assert refused is not None
    assert refused.detail == f"it belongs to c/{NS}/Deployment/api"


def test_a_pod_whose_deployment_was_recreated_under_its_name_has_no_known_owner() -> None:
    store = cluster()
    again = deployment("web", {ENABLED: "true"})
    again["metadata"] = {**again["metadata"], "uid": "uid-new", "resourceVersion": "2"}
    store.apply("Deployment", ChangeType.MODIFIED, again)
    found = store.get("Pod", NS, "web-1-a")
    refused = verify(
        BusKey.parse(f"c/{NS}/Deployment/web"), NS, "web-1-a", f"uid-{NS}-web-1-a", found,
        store, ALL,
    )  # fmt: skip
    assert refused is not None
    assert refused.reason is Refusal.UNKNOWN_OWNER


def test_the_view_remembers_the_pods_it_saw_deleted_and_forgets_the_oldest_first() -> None:
    view = ClusterView(ALL)
    view.apply("Pod", ChangeType.ADDED, pod("a", None))
    assert not view.deleted(f"uid-{NS}-a")
    view.apply("Pod", ChangeType.DELETED, pod("a", None))
    assert view.deleted(f"uid-{NS}-a")
    assert view.pod(NS, "a") is None
    for index in range(DELETED_MEMORY):
        view.apply("Pod", ChangeType.ADDED, pod(f"p{index}", None))
        view.apply("Pod", ChangeType.DELETED, pod(f"p{index}", None))
    assert not view.deleted(f"uid-{NS}-a")
    assert view.deleted(f"uid-{NS}-p{DELETED_MEMORY - 1}")


def test_the_view_forgets_a_deleted_pod_once_its_memory_window_has_passed() -> None:
    now = [0.0]
    view = ClusterView(ALL, monotonic=lambda: now[0])
    for name in ("a", "b"):
        view.apply("Pod", ChangeType.ADDED, pod(name, None))
    view.apply("Pod", ChangeType.DELETED, pod("a", None))
    now[0] = DELETED_MEMORY_SECONDS
    view.apply("Pod", ChangeType.DELETED, pod("b", None))
    assert view.deleted(f"uid-{NS}-a")
    assert view.deleted_kept == 2
    now[0] = DELETED_MEMORY_SECONDS + 1.0
    view.apply("Pod", ChangeType.ADDED, pod("c", None))
    view.apply("Pod", ChangeType.DELETED, pod("c", None))
    assert not view.deleted(f"uid-{NS}-a")
    assert view.deleted(f"uid-{NS}-b")
    assert view.deleted_kept == 2


def test_the_view_tells_its_listeners_of_every_deletion_after_it() -> None:
    view = ClusterView(ALL)
    seen: list[tuple[str, bool]] = []
    view.deletions.append(lambda change: seen.append((change.kind, view.pod(NS, "a") is None)))
    view.apply("Pod", ChangeType.ADDED, pod("a", None))
    view.apply("Deployment", ChangeType.ADDED, deployment("web", {ENABLED: "true"}))
    view.apply("Pod", ChangeType.DELETED, pod("a", None))
    view.apply("Deployment", ChangeType.DELETED, deployment("web", {ENABLED: "true"}))
    assert seen == [("Pod", True), ("Deployment", True)]


def test_a_view_lists_namespaces_only_for_a_namespace_selector() -> None:
    assert [r.kind for r in ClusterView(ALL).resources()] == ["Pod", "ReplicaSet", "Deployment"]
    assert "Namespace" in [r.kind for r in ClusterView(BY_LABEL).resources()]
