"""Other workloads' pods landing on or leaving a workload's nodes: which changes move
a node's load in a snapshot (``podcost_core.snapshots.node_share``,
``podcost_kube.workloads.nodes_with_moved_load``), and which policies read it
(``podcost_core.policy.reads_node_load``). The watcher re-publishes a workload whose policy reads
it when a pod's share of one of its nodes moves; these tests hold both halves to what a
snapshot actually shows."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.support.snapshots import large_snapshot
from tests.unit.rawobjects import NS, T, raw_deployment, raw_node, raw_pod, raw_replicaset
from tests.unit.rawobjects import owner as owner_ref

from podcost_core.model import Resources, Snapshot
from podcost_core.policy import (
    DEFAULT_POLICY,
    NODE_LOAD_BLIND,
    Policy,
    StrategySpec,
    reads_node_load,
)
from podcost_core.snapshots import node_share
from podcost_core.strategies import node_consolidation
from podcost_core.strategies.registry import BUILTIN, BUILTIN_REGISTRY
from podcost_kube.podcache import PodCache
from podcost_kube.snapshots import workload_snapshot
from podcost_kube.store import Change, ChangeType, Store
from podcost_kube.workloads import (
    DEPLOYMENT,
    WorkloadKey,
    node_load_neighbours,
    nodes_with_moved_load,
    workloads_of_pod,
)

WEB = WorkloadKey(NS, DEPLOYMENT, "web")
API = WorkloadKey(NS, DEPLOYMENT, "api")
NODES = ("n1", "n2", "n3", "n4")


def _store(db: bool = True) -> Store:
    """Deployments ``web`` (pods on n1 and n2) and ``api`` (on n2, n3 and n4: two nodes it can
    empty, one pod each, ordered by utilization), and, with ``db``, a pod of a workload podcost
    does not rank on n1."""
    store = Store()
    for node in NODES:
        store.apply("Node", ChangeType.ADDED, raw_node(node, "a"))
    for name in ("web", "api"):
        store.apply(
            "Deployment", ChangeType.ADDED, raw_deployment(name, {"podcost.dev/enabled": "true"})
        )
        store.apply("ReplicaSet", ChangeType.ADDED, raw_replicaset(f"{name}-1", name, name))
    pods = [raw_pod("web-a", app="web", rs="web-1", node="n1"),
            raw_pod("web-b", app="web", rs="web-1", node="n2"),
            raw_pod("api-a", app="api", rs="api-1", node="n2"),
            raw_pod("api-b", app="api", rs="api-1", node="n3"),
            raw_pod("api-c", app="api", rs="api-1", node="n4")]  # fmt: skip
    if db:
        pods.append(raw_pod("db-0", app="db", rs="db", node="n1"))
    for pod in pods:
        store.apply("Pod", ChangeType.ADDED, pod)
    return store


# Versions of a bystander pod: where it is bound, whether it still runs, what it requests, and
# whether a DaemonSet owns it; plus status noise that moves nothing.
versions = st.fixed_dictionaries(
    {
        "node": st.sampled_from([None, "n1", "n2", "n3", "n4"]),
        "phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
        "deleting": st.booleans(),
        "cpu": st.sampled_from(["100m", "250m"]),
        "daemon": st.booleans(),
        "ip": st.sampled_from(["10.0.0.1", "10.0.0.2"]),
    }
)


def _bystander(version: dict[str, Any], resource_version: str) -> dict[str, Any]:
    owner = ("DaemonSet", "agent") if version["daemon"] else ("ReplicaSet", "other-1")
    pod = raw_pod("other", app="other", rs=None, node=version["node"])
    pod["metadata"]["ownerReferences"] = owner_ref(*owner)
    pod["metadata"]["resourceVersion"] = resource_version
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = version["cpu"]
    pod["status"]["phase"] = version["phase"]
    pod["status"]["podIP"] = version["ip"]
    if version["deleting"]:
        pod["metadata"]["deletionTimestamp"] = T
    return pod


def _consolidation(store: Store, key: WorkloadKey, measure: str) -> dict[str, float]:
    snapshot = workload_snapshot(store, key)
    scores = node_consolidation.score(snapshot, node_consolidation.Args(measure))
    return {pod.name: scores[pod.uid] for pod in snapshot.pods}


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.none(), versions), st.one_of(st.none(), versions), st.booleans())
def test_a_pod_change_that_moves_a_workloads_node_order_touches_it(
    before: dict[str, Any] | None, after: dict[str, Any] | None, db: bool
) -> None:
    """Whatever a bystander pod does (added, bound, moved, finished, deleted, its requests or
    its owner changed, status noise), every other workload whose ``node-consolidation`` scores
    it changes is among ``node_load_neighbours``; ``nodes_with_moved_load`` names every node
    whose snapshot sums it changed, and none when the pod's share did not move."""
    store = _store(db)
    old = _bystander(before, "2") if before is not None else None
    new = _bystander(after, "3") if after is not None else None
    if old is not None:
        store.apply("Pod", ChangeType.ADDED, old)
    measures = ("dominant", "count")
    seen = {(key, m): _consolidation(store, key, m) for key in (WEB, API) for m in measures}
    nodes_seen = dict(workload_snapshot(store, WEB).nodes) | dict(
        workload_snapshot(store, API).nodes
    )
    if new is not None:
        change = store.apply("Pod", ChangeType.MODIFIED, new)
    elif old is not None:
        change = store.apply("Pod", ChangeType.DELETED, old)
    else:
        return
    if change is None:  # nothing the store keeps of the pod changed: nor did any snapshot
        assert all(seen[(key, m)] == _consolidation(store, key, m) for key in (WEB, API)
                   for m in measures)  # fmt: skip
        return
    touched = node_load_neighbours(store, change)
    for key in (WEB, API):
        if any(seen[(key, m)] != _consolidation(store, key, m) for m in measures):
            assert key in touched, (key, before, after, db)
    moved = set(nodes_with_moved_load(change))
    now = dict(workload_snapshot(store, WEB).nodes) | dict(workload_snapshot(store, API).nodes)
    differ = {name for name in nodes_seen if nodes_seen[name] != now.get(name)}
    assert differ <= moved, (differ, moved)
    old_share = node_share(change.old) if change.old is not None else None
    new_share = node_share(change.new) if change.new is not None else None
    assert (old_share == new_share) == (not moved)
    assert touched <= {WEB, API}


def test_only_a_node_that_starts_or_stops_holding_other_pods_touches_its_workloads() -> None:
    store = _store(db=True)
    # n3 holds only api's pod: a bystander landing there changes api's order.
    lands = store.apply("Pod", ChangeType.ADDED, _bystander(BOUND_N3, "2"))
    assert lands is not None
    assert node_load_neighbours(store, lands) == {API}
    # A second one changes nothing: n3 already holds another workload's pod.
    second = _bystander(BOUND_N3, "2")
    second["metadata"]["name"], second["metadata"]["uid"] = "other-2", "uid-other-2"
    again = store.apply("Pod", ChangeType.ADDED, second)
    assert again is not None
    assert node_load_neighbours(store, again) == set()
    # n1 holds db-0: web's order there is already "cannot be emptied".
    on_n1 = store.apply("Pod", ChangeType.ADDED, raw_pod("p1", app="x", rs=None, node="n1"))
    assert on_n1 is not None
    assert node_load_neighbours(store, on_n1) == set()


BOUND_N3 = {"node": "n3", "phase": "Running", "deleting": False, "cpu": "100m",
            "daemon": False, "ip": "10.0.0.1"}  # fmt: skip


def test_a_pod_that_lands_on_a_node_moves_it_and_one_that_leaves_both() -> None:
    unbound = raw_pod("p", app="x", rs=None, node=None)
    bound = raw_pod("p", app="x", rs=None, node="n1")
    moved_pod = raw_pod("p", app="x", rs=None, node="n2")
    finished = raw_pod("p", app="x", rs=None, node="n1", phase="Succeeded")

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


def test_node_consolidation_reads_whether_a_node_holds_other_pods_not_how_many() -> None:
    """The other side of the classification: the one built-in left out reads its nodes' load,
    but only whether a node holds other workloads' pods (rule 1): how many does not move it."""
    snapshot = large_snapshot(pods=60, nodes=6)
    strategy = BUILTIN["node-consolidation"]
    args = strategy.default_args()
    own = {name: sum(1 for pod in snapshot.pods if pod.node == name) for name in snapshot.nodes}

    def with_others(extra: dict[str, int]) -> Snapshot:
        return dataclasses.replace(snapshot, nodes={
            name: dataclasses.replace(node, requested=Resources(pods=own[name] + extra[name]),
                                      daemon_pods=0)
            for name, node in snapshot.nodes.items()
        })  # fmt: skip

    alone = strategy.score(with_others(dict.fromkeys(own, 0)), args)
    first = next(iter(own))
    assert strategy.score(with_others({**dict.fromkeys(own, 0), first: 1}), args) != alone
    shared = strategy.score(with_others(dict.fromkeys(own, 1)), args)
    assert strategy.score(with_others({**dict.fromkeys(own, 1), first: 9}), args) == shared


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), versions), min_size=1, max_size=6), st.booleans())
def test_a_nodes_usage_kept_by_the_cache_is_what_summing_its_pods_gives(
    steps: list[dict[str, Any] | None], db: bool
) -> None:
    """``PodCache.node_usage`` keeps a node's sums while its pods' stamp holds: whatever a
    bystander pod goes through (added, bound, moved, finished, deleted, its requests or owner
    changed), a snapshot through one long-lived cache shows the nodes a cache-less snapshot
    shows, and the cache is asked for each node (its sums are not taken from the pods again)."""
    store = _store(db)
    cache = PodCache()
    asked: list[str] = []
    usage = cache.node_usage

    def counting(node: str, stamp: int, pods: Any) -> Any:
        asked.append(node)
        return usage(node, stamp, pods)

    cache.node_usage = counting  # type: ignore[method-assign]
    held: dict[str, Any] | None = None
    for number, step in enumerate(steps, start=2):
        if step is None:
            if held is not None:
                store.apply("Pod", ChangeType.DELETED, held)
            held = None
        else:
            held = _bystander(step, str(number))
            store.apply("Pod", ChangeType.MODIFIED, held)
        for key in (WEB, API):
            asked.clear()
            cached = workload_snapshot(store, key, pods=cache)
            assert cached == workload_snapshot(store, key), (key, steps)
            assert sorted(asked) == sorted(cached.nodes)


def test_a_nodes_stamp_moves_with_its_pods_and_no_other() -> None:
    store = _store(db=False)
    stamps = {node: store.indexes.node_stamp(node) for node in NODES}
    assert all(stamps.values())
    assert len(set(stamps.values())) == len(NODES)
    assert store.indexes.node_stamp("n9") == 0  # no pod there
    moved = raw_pod("web-b", app="web", rs="web-1", node="n3")
    moved["metadata"]["resourceVersion"] = "2"
    store.apply("Pod", ChangeType.MODIFIED, moved)  # n2 → n3
    now = {node: store.indexes.node_stamp(node) for node in NODES}
    assert (now["n1"], now["n4"]) == (stamps["n1"], stamps["n4"])
    assert now["n2"] > stamps["n2"]
    assert now["n3"] > stamps["n3"]
    store.apply("Pod", ChangeType.DELETED, raw_pod("web-a", app="web", rs="web-1", node="n1"))
    assert store.indexes.node_stamp("n1") == 0  # its last pod left
    assert Store().indexes.node_stamp("n1") == 0
    other = Store()
    other.apply("Pod", ChangeType.ADDED, raw_pod("x", app="x", rs=None, node="n2"))
    assert other.indexes.node_stamp("n2") not in set(now.values())  # one count for every store


def _recounted_neighbours(store: Store, change: Change) -> set[WorkloadKey]:
    """What ``node_load_neighbours`` must answer, counted the long way: every pod on each moved
    node read, its share and its workloads found from it, every workload's count compared."""
    if change.kind != "Pod":
        return set()
    old = node_share(change.old) if change.old is not None else None
    new = node_share(change.new) if change.new is not None else None
    if old == new:
        return set()
    own_keys = workloads_of_pod(store, change.old) if change.old is not None else frozenset()
    if change.new is not None:
        own_keys |= workloads_of_pod(store, change.new)
    found: set[WorkloadKey] = set()
    for node in {share[0] for share in (old, new) if share is not None}:
        counted = [share is not None and share[0] == node and not share[2] for share in (old, new)]
        delta = int(counted[1]) - int(counted[0])
        daemon = any(share is not None and share[0] == node and share[2] for share in (old, new))
        others = 0
        own: dict[WorkloadKey, int] = {}
        for pod in store.indexes.pods_on_node(node):
            share = node_share(pod)
            if share is None or share[2]:
                continue
            others += 1
            for key in workloads_of_pod(store, pod):
                own[key] = own.get(key, 0) + 1
        for key, count in own.items():
            after = others - count
            before = after - delta
            if key not in own_keys and ((before > 0) != (after > 0) or (daemon and after <= 0)):
                found.add(key)
    return found


#: The namespace of each pod written (one of them outside the workloads').
POD_NAMESPACES = {"p0": NS, "p1": NS, "p2": NS, "p3": "elsewhere"}

# One write of a pod of the shared store: which pod (n3 holds one pod of api's, n1
# one of web's and one of no workload's), where it is bound, whether it still runs,
# who owns it (web's or api's ReplicaSet, a DaemonSet, a ReplicaSet not in the store, nobody),
# its labels; or, with ``None``, its deletion. And now and then a ReplicaSet goes or comes back.
pod_writes = st.tuples(
    st.sampled_from(["p0", "p1", "p2", "p3"]),
    st.one_of(
        st.none(),
        st.fixed_dictionaries(
            {
                "node": st.sampled_from([None, "n1", "n3"]),
                "phase": st.sampled_from(["Pending", "Running", "Failed"]),
                "deleting": st.booleans(),
                "owner": st.sampled_from(["web-1", "api-1", "gone-1", "daemon", None]),
                "app": st.sampled_from(["web", "api", "x"]),
                "cpu": st.sampled_from(["100m", "250m"]),
            }
        ),
    ),
)
replicaset_writes = st.tuples(st.sampled_from(["web-1", "api-1"]), st.booleans())


def _running(node: str, owner: str | None, app: str) -> dict[str, Any]:
    return {"node": node, "phase": "Running", "deleting": False, "owner": owner, "app": app,
            "cpu": "100m"}  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(pod_writes, replicaset_writes), min_size=1, max_size=12))
# An orphan api's selector adopts joins api's pod on n3; another workload's pod landing there
# then makes n3 hold others' pods for api.
@example([("p0", _running("n3", None, "api")), ("p1", _running("n3", "web-1", "web"))])
# api's pod on n3 is joined by a bystander, which then leaves.
@example([("p3", _running("n3", None, "x")), ("p3", None)])
def test_the_counted_neighbours_are_those_a_recount_of_every_pod_finds(
    writes: list[tuple[str, Any]],
) -> None:
    """Whatever pods are added, bound, moved, started, finished, deleted, re-owned or relabelled,
    and whatever ReplicaSets go or come back in between, the workloads ``node_load_neighbours``
    reads from the store's counts (``WorkloadIndexes.node_load``) are the ones counting every
    pod on the node finds, and the counts are what counting them again gives."""
    store = _store(db=True)
    version = 10
    for name, write in writes:
        version += 1
        if isinstance(write, bool):  # a ReplicaSet deleted (False) or back (True)
            replicaset = raw_replicaset(name, name[:3], name[:3])
            replicaset["metadata"]["resourceVersion"] = str(version)
            store.apply("ReplicaSet", ChangeType.ADDED if write else ChangeType.DELETED,
                        replicaset)  # fmt: skip
            continue
        held = store.get("Pod", POD_NAMESPACES[name], name)
        if write is None:
            change = store.apply("Pod", ChangeType.DELETED, held) if held is not None else None
        else:
            owner = write["owner"]
            pod = raw_pod(name, app=write["app"], rs=None, node=write["node"], cpu=write["cpu"],
                          phase=write["phase"], namespace=POD_NAMESPACES[name])  # fmt: skip
            if owner == "daemon":
                pod["metadata"]["ownerReferences"] = owner_ref("DaemonSet", "agent")
            elif owner is not None:
                pod["metadata"]["ownerReferences"] = owner_ref("ReplicaSet", owner)
            if write["deleting"]:
                pod["metadata"]["deletionTimestamp"] = T
            pod["metadata"]["resourceVersion"] = str(version)
            change = store.apply("Pod", ChangeType.MODIFIED, pod)
        if change is not None:
            expected = _recounted_neighbours(store, change)
            assert node_load_neighbours(store, change) == expected, (name, write)
        for node in NODES:
            total, by_namespace = store.indexes.node_load(node)
            shares = [node_share(pod) for pod in store.indexes.pods_on_node(node)]
            counted = [share for share in shares if share is not None and not share[2]]
            assert (
                total
                == len(counted)
                == sum(sum(groups.values()) for groups in by_namespace.values())
            )
