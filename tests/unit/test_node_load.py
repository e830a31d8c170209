"""Other workloads' pods landing on or leaving a workload's nodes (issue 14): which changes move
a node's load in a snapshot (``podcost_core.convert.node_share``,
``podcost_kube.workloads.nodes_with_moved_load``), and which policies read it
(``podcost_core.policy.reads_node_load``). The watcher re-publishes a workload whose policy reads
it when a pod's share of one of its nodes moves; these tests hold both halves to what a
snapshot actually shows."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.snapshots import large_snapshot

from podcost_core.convert import node_share
from podcost_core.model import Resources
from podcost_core.policy import (
    DEFAULT_POLICY,
    NODE_LOAD_BLIND,
    Policy,
    StrategySpec,
    reads_node_load,
)
from podcost_core.strategies.registry import BUILTIN, BUILTIN_REGISTRY
from podcost_kube.store import Change, ChangeType, Store
from podcost_kube.workloads import (
    DEPLOYMENT,
    WorkloadKey,
    nodes_with_moved_load,
    workload_snapshot,
)

NS = "shop"
T = "2024-05-01T12:00:00Z"
WEB = WorkloadKey(NS, DEPLOYMENT, "web")
NODES = ("n1", "n2", "n3")


def _owner(kind: str, name: str) -> list[dict[str, Any]]:
    api = "v1" if kind == "Node" else "apps/v1"
    return [{"apiVersion": api, "kind": kind, "name": name, "uid": f"uid-{name}",
             "controller": True}]  # fmt: skip


def _pod(name: str, *, app: str, rs: str | None, node: str | None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "resourceVersion": "1",
        "creationTimestamp": T,
        "labels": {"app": app},
    }
    if rs is not None:
        meta["ownerReferences"] = _owner("ReplicaSet", rs)
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]
    }
    if node is not None:
        spec["nodeName"] = node
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": T}],
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}
    for path, value in extra.items():
        section, _, field = path.partition("__")
        pod[section][field] = value
    return pod  # fmt: skip


def _store() -> Store:
    """Deployment ``web`` (pods on n1 and n2) and, unmanaged by podcost, other pods."""
    store = Store()
    allocatable = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    for node in NODES:
        meta = {"name": node, "uid": f"uid-{node}", "resourceVersion": "1"}
        node_obj = {"apiVersion": "v1", "kind": "Node", "metadata": meta,
                    "status": {"allocatable": allocatable}}  # fmt: skip
        store.apply("Node", ChangeType.ADDED, node_obj)
    selector = {"matchLabels": {"app": "web"}}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS, "uid": "uid-web", "resourceVersion": "1",
                     "generation": 1, "annotations": {"podcost.dev/enabled": "true"}},
        "spec": {"replicas": 2, "selector": selector}, "status": {"observedGeneration": 1},
    }  # fmt: skip
    replicaset = {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": NS, "uid": "uid-web-1", "resourceVersion": "1",
                     "creationTimestamp": T, "ownerReferences": _owner(DEPLOYMENT, "web")},
        "spec": {"replicas": 2, "selector": selector}, "status": {"replicas": 2},
    }  # fmt: skip
    store.apply("Deployment", ChangeType.ADDED, deployment)
    store.apply("ReplicaSet", ChangeType.ADDED, replicaset)
    for pod in (
        _pod("web-a", app="web", rs="web-1", node="n1"),
        _pod("web-b", app="web", rs="web-1", node="n2"),
        _pod("db-0", app="db", rs="db", node="n1"),
    ):
        store.apply("Pod", ChangeType.ADDED, pod)
    return store  # fmt: skip


# Versions of a bystander pod: where it is bound, whether it still runs, what it requests, and
# whether a DaemonSet owns it; plus status noise that moves nothing.
versions = st.fixed_dictionaries(
    {
        "node": st.sampled_from([None, *NODES]),
        "phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
        "deleting": st.booleans(),
        "cpu": st.sampled_from(["100m", "250m"]),
        "daemon": st.booleans(),
        "ip": st.sampled_from(["10.0.0.1", "10.0.0.2"]),
    }
)


def _bystander(version: dict[str, Any], resource_version: str) -> dict[str, Any]:
    owner = ("DaemonSet", "agent") if version["daemon"] else ("ReplicaSet", "other-1")
    pod = _pod("other", app="other", rs=None, node=version["node"])
    pod["metadata"]["ownerReferences"] = _owner(*owner)
    pod["metadata"]["resourceVersion"] = resource_version
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = version["cpu"]
    pod["status"]["phase"] = version["phase"]
    pod["status"]["podIP"] = version["ip"]
    if version["deleting"]:
        pod["metadata"]["deletionTimestamp"] = T
    return pod


def _nodes_of_web(store: Store) -> dict[str, Any]:
    return dict(workload_snapshot(store, WEB).nodes)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), versions), st.one_of(st.none(), versions))
def test_a_pod_change_that_moves_a_snapshots_nodes_names_those_nodes(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> None:
    """Whatever a bystander pod does (added, bound, moved, finished, deleted, its requests or
    its owner changed, status noise), if web's snapshot shows its nodes differently after, the
    nodes that changed are among those ``nodes_with_moved_load`` names; and it names none when
    the pod's share did not move."""
    store = _store()
    old = _bystander(before, "2") if before is not None else None
    new = _bystander(after, "3") if after is not None else None
    if old is not None:
        store.apply("Pod", ChangeType.ADDED, old)
    seen = _nodes_of_web(store)
    if new is not None:
        change = store.apply("Pod", ChangeType.MODIFIED, new)
    elif old is not None:
        change = store.apply("Pod", ChangeType.DELETED, old)
    else:
        return
    assert change is not None
    old, new = change.old, change.new
    moved = set(nodes_with_moved_load(change))
    now = _nodes_of_web(store)
    differ = {name for name in seen.keys() | now.keys() if seen.get(name) != now.get(name)}
    assert differ <= moved, (differ, moved)
    old_share = node_share(old) if old is not None else None
    new_share = node_share(new) if new is not None else None
    assert (old_share == new_share) == (not moved)


def test_a_pod_that_lands_on_a_node_moves_it_and_one_that_leaves_both() -> None:
    unbound = _pod("p", app="x", rs=None, node=None)
    bound = _pod("p", app="x", rs=None, node="n1")
    moved_pod = _pod("p", app="x", rs=None, node="n2")
    finished = _pod("p", app="x", rs=None, node="n1", status__phase="Succeeded")

    def moved(old: dict[str, Any] | None, new: dict[str, Any] | None) -> tuple[str, ...]:
        kind = ChangeType.DELETED if new is None else ChangeType.MODIFIED
        return nodes_with_moved_load(Change("Pod", kind, old, new))

    assert moved(unbound, bound) == ("n1",)
    assert moved(bound, moved_pod) == ("n1", "n2")
    assert moved(bound, finished) == ("n1",)
    assert moved(bound, None) == ("n1",)
    noise = copy.deepcopy(bound)
    noise["status"]["podIP"] = "10.9.9.9"
    assert moved(bound, noise) == ()
    node = {"metadata": {"name": "n1"}}
    assert nodes_with_moved_load(Change("Node", ChangeType.MODIFIED, node, node)) == ()


@pytest.mark.parametrize(
    "malformed",
    [
        {"spec": "x", "metadata": {}},
        {"spec": {"nodeName": "n1"}, "metadata": "x"},
        {"spec": {"nodeName": 7}, "metadata": {}},
        {"spec": {"nodeName": "n1", "containers": "x"}, "metadata": {}},
        {"spec": {"nodeName": "n1"}, "metadata": {}, "status": "x"},
        {"spec": {"nodeName": "n1", "containers": [{"resources": 3}]}, "metadata": {}},
    ],
)
def test_a_pod_podcost_cannot_read_adds_nothing_to_a_node(malformed: dict[str, Any]) -> None:
    assert node_share(malformed) is None


def test_the_default_policy_reads_node_load_and_one_of_blind_strategies_does_not() -> None:
    assert reads_node_load(DEFAULT_POLICY)
    blind = Policy((StrategySpec("topology-spread", 1, 0), StrategySpec("age", 1, 1)),
                   BUILTIN_REGISTRY)  # fmt: skip
    assert not reads_node_load(blind)


def test_every_builtin_strategy_is_classified() -> None:
    """A new built-in strategy must be added to ``NODE_LOAD_BLIND`` if it reads nothing of its
    nodes' load, else the watcher would not know to re-publish (it counts as reading it)."""
    assert set(BUILTIN) - NODE_LOAD_BLIND == {"node-consolidation"}
    assert set(BUILTIN) >= NODE_LOAD_BLIND


@pytest.mark.parametrize("name", sorted(NODE_LOAD_BLIND))
def test_a_blind_strategy_scores_the_same_whatever_its_nodes_load(name: str) -> None:
    snapshot = large_snapshot(pods=60, nodes=6)
    strategy = BUILTIN[name]
    args = strategy.default_args()
    loaded = dataclasses.replace(
        snapshot,
        nodes={
            node_name: dataclasses.replace(
                node,
                requested=Resources(
                    cpu_milli=3000 + 100 * index, memory_bytes=2**30 * index, pods=5 + index
                ),
                daemon_pods=index % 3,
            )
            for index, (node_name, node) in enumerate(snapshot.nodes.items())
        },
    )
    assert strategy.score(snapshot, args) == strategy.score(loaded, args)
    if strategy.domains is not None:
        assert strategy.domains(snapshot, args) == strategy.domains(loaded, args)


def test_node_consolidation_does_read_its_nodes_load() -> None:
    """The other side of the classification: the one built-in left out scores differently."""
    snapshot = large_snapshot(pods=60, nodes=6)
    strategy = BUILTIN["node-consolidation"]
    args = strategy.default_args()
    first = next(iter(snapshot.nodes))
    loaded = dataclasses.replace(
        snapshot,
        nodes={**snapshot.nodes, first: dataclasses.replace(
            snapshot.nodes[first], requested=Resources(pods=100))},
    )  # fmt: skip
    assert strategy.score(snapshot, args) != strategy.score(loaded, args)
