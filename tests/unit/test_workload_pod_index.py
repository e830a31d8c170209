"""The store's pod indexes (by controller, by label set) and the snapshot objects found through
them: on random stores built by adds, updates that move pods between label sets,
deletes and relists, ``workload_objects`` answers exactly as the scan of every pod of the
namespace it replaced (``_workload_objects_by_scan``, kept as the reference): the same objects
in the same order, or the same error; and the indexes equal those of a store built afresh from
what the store holds."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podcost_core.snapshots import ClusterObjects
from podcost_kube.snapshots import (
    _workload_objects_by_scan,
    _workload_objects_indexed,
    workload_objects,
)
from podcost_kube.store import ChangeType, Store
from podcost_kube.workloads import DEPLOYMENT, REPLICASET, WorkloadKey

NAMESPACES = ("a", "b")
LABEL_KEYS = ("app", "tier", "pod-template-hash")
LABEL_VALUES = ("x", "y")
RS_NAMES = ("rs0", "rs1", "rs2", "rs3")
DEPLOYMENTS = ("d0", "d1")
POD_NAMES = tuple(f"p{index}" for index in range(8))
NODES = ("n0", "n1", "n2")  # n2 is never in the store

PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

labels_st = st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=3)


@st.composite
def requirements(draw: st.DrawFn) -> dict[str, Any]:
    operator = draw(st.sampled_from(("In", "NotIn", "Exists", "DoesNotExist")))
    requirement: dict[str, Any] = {"key": draw(st.sampled_from(LABEL_KEYS)), "operator": operator}
    if operator in ("In", "NotIn"):
        values = draw(st.lists(st.sampled_from(LABEL_VALUES), min_size=1, max_size=2))
        requirement["values"] = values
    return requirement


def selectors(malformed: bool, labelled: bool = False) -> st.SearchStrategy[Any]:
    """Selectors of ReplicaSets; ``labelled``: each with ``matchLabels`` (or none at all), the
    selectors whose label sets ``workload_objects`` looks up by a label they require."""
    valid = st.builds(
        lambda labels, expressions: {
            **({"matchLabels": labels} if labels else {}),
            **({"matchExpressions": expressions} if expressions else {}),
        },
        st.dictionaries(
            st.sampled_from(LABEL_KEYS),
            st.sampled_from(LABEL_VALUES),
            min_size=1 if labelled else 0,
            max_size=2,
        ),
        st.lists(requirements(), max_size=2),
    )
    choices: list[st.SearchStrategy[Any]] = [valid, valid, valid, st.none()]
    if malformed:
        choices += [
            st.just({"matchExpressions": [{"key": "app", "operator": "Bogus"}]}),
            st.just({"matchLabels": "app=x"}),
            st.just({"matchExpressions": [{"key": "app", "operator": "In", "values": 5}]}),
            st.just({"matchExpressions": "app"}),
        ]
    return st.one_of(choices)


def uid(kind: str, namespace: str, name: str) -> str:
    return f"{kind}/{namespace}/{name}"


def owner(kind: str, namespace: str, name: str, *, controller: bool = True) -> dict[str, Any]:
    return {"kind": kind, "name": name, "uid": uid(kind, namespace, name), "controller": controller}


@st.composite
def replicasets(draw: st.DrawFn, malformed: bool, labelled: bool = False) -> dict[str, Any]:
    namespace = draw(st.sampled_from(NAMESPACES))
    name = draw(st.sampled_from(RS_NAMES))
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if draw(st.integers(0, 9)):  # a ReplicaSet without a uid now and then
        meta["uid"] = uid(REPLICASET, namespace, name)
    controller = draw(st.sampled_from((*DEPLOYMENTS, *DEPLOYMENTS, None)))
    if controller is not None:
        meta["ownerReferences"] = [owner(DEPLOYMENT, namespace, controller)]
    selector = draw(selectors(malformed, labelled))
    return {"kind": REPLICASET, "metadata": meta, "spec": {"selector": selector}}


@st.composite
def pods(draw: st.DrawFn, malformed: bool) -> dict[str, Any]:
    namespace = draw(st.sampled_from(NAMESPACES))
    meta: dict[str, Any] = {"name": draw(st.sampled_from(POD_NAMES)), "namespace": namespace}
    labels: Any = draw(st.one_of(labels_st, labels_st, st.none()))
    refs: Any = []
    match draw(st.sampled_from(("rs", "rs", "rs", "other", "not controller", "none"))):
        case "rs":
            refs = [owner(REPLICASET, namespace, draw(st.sampled_from((*RS_NAMES, "gone"))))]
        case "other":  # a controller of another kind, with the uid of a ReplicaSet
            refs = [{**owner(REPLICASET, namespace, "rs0"), "kind": "StatefulSet"}]
        case "not controller":
            refs = [owner(REPLICASET, namespace, "rs0", controller=False)]
    if draw(st.booleans()):
        refs = [{"kind": "Job", "name": "j", "uid": "j"}, *refs]  # not a controller: skipped
    spec: Any = {}
    node = draw(st.sampled_from((*NODES, None)))
    if node is not None:
        spec["nodeName"] = node
    if malformed:
        match draw(st.integers(0, 29)):
            case 0:
                labels = draw(st.sampled_from((["app"], "app", {"app": 1}, {"app": ["x"]})))
            case 1:
                refs = draw(st.sampled_from((5, "rs", {"kind": REPLICASET})))
            case 2:
                refs = [{**owner(REPLICASET, namespace, "rs0"), "uid": ["u"]}]
            case 3:
                spec = {"nodeName": ["n0"]}  # cannot be a key
            case 4:
                meta["name"] = 7
    if labels is not None:
        meta["labels"] = labels
    if refs != []:
        meta["ownerReferences"] = refs
    return {"kind": "Pod", "metadata": meta, "spec": spec}


def ops(malformed: bool, labelled: bool = False) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """Some ReplicaSets and pods to start with, then random changes (``labelled``: see
    :func:`selectors`)."""
    pod_st = pods(malformed)
    change = st.one_of(
        st.tuples(st.just("apply"), pod_st),
        st.tuples(st.just("apply"), pod_st),
        st.tuples(st.just("apply"), pod_st),
        st.tuples(st.just("delete"), st.sampled_from(NAMESPACES), st.sampled_from(POD_NAMES)),
        st.tuples(st.just("replicaset"), replicasets(malformed, labelled)),
        st.tuples(
            st.just("relist"),
            st.lists(pod_st, max_size=6),
            st.sampled_from((*NAMESPACES, *NAMESPACES, None)),
        ),
    )
    start = st.lists(
        st.tuples(st.just("replicaset"), replicasets(malformed, labelled)), min_size=3, max_size=8
    )
    pods_first = st.lists(st.tuples(st.just("apply"), pod_st), min_size=4, max_size=12)
    return st.builds(
        lambda *parts: [op for part in parts for op in part],
        start,
        pods_first,
        st.lists(change, max_size=12),
    )


def base_store() -> Store:
    """A store of the Deployments of every namespace and the nodes but the last."""
    store = Store()
    for namespace in NAMESPACES:
        for name in DEPLOYMENTS:
            meta = {"name": name, "namespace": namespace, "uid": uid(DEPLOYMENT, namespace, name)}
            store.apply(DEPLOYMENT, ChangeType.ADDED, {"kind": DEPLOYMENT, "metadata": meta})
    for node in NODES[:2]:
        store.apply("Node", ChangeType.ADDED, {"kind": "Node", "metadata": {"name": node}})
    return store


def build(operations: list[tuple[Any, ...]]) -> Store:
    store = base_store()
    version = 0
    for op, *args in operations:
        version += 1
        match op:
            case "apply" | "replicaset":
                obj = copy.deepcopy(args[0])
                obj["metadata"]["resourceVersion"] = str(version)
                kind = "Pod" if op == "apply" else REPLICASET
                store.apply(kind, ChangeType.MODIFIED, obj)
            case "delete":
                meta = {"name": args[1], "namespace": args[0]}
                store.apply("Pod", ChangeType.DELETED, {"kind": "Pod", "metadata": meta})
            case "relist":
                listed, namespace = args
                chosen = [copy.deepcopy(p) for p in listed]
                if namespace is not None:
                    for pod in chosen:
                        pod["metadata"]["namespace"] = namespace
                held = [key.name for key in store.keys("Pod")]
                if any(not isinstance(name, str) for name in held) or any(
                    not isinstance(p["metadata"]["name"], str) for p in chosen
                ):
                    continue  # a relist sorts the keys: names of two types cannot be relisted
                for pod in chosen:
                    pod["metadata"]["resourceVersion"] = str(version)
                store.replace("Pod", chosen, namespace=namespace)
    return store


def keys(store: Store) -> list[WorkloadKey]:
    found = [
        WorkloadKey(namespace, kind, name)
        for kind in (DEPLOYMENT, REPLICASET)
        for namespace in NAMESPACES
        for name in (*DEPLOYMENTS, *RS_NAMES)
        if store.get(kind, namespace, name) is not None
    ]
    return [*found, WorkloadKey("a", DEPLOYMENT, "gone")]


def ordered(objects: ClusterObjects) -> tuple[Any, ...]:
    """Every field, each map as its list of items: the insertion order counts."""
    return (
        list(objects.pods.items()),
        list(objects.nodes.items()),
        list(objects.replicasets.items()),
        list(objects.deployments.items()),
        objects.newest,
    )


def outcome(
    find: Callable[[Store, WorkloadKey], ClusterObjects], store: Store, key: WorkloadKey
) -> Any:
    try:
        return ordered(find(store, key))
    except Exception as error:  # the same error, type and message
        return type(error), str(error)


def indexes(store: Store) -> Any:
    def held(namespace: str) -> dict[str, Any]:
        return {key.name: store.get("Pod", namespace, key.name) for key in store.keys("Pod")
                if key.namespace == namespace}  # fmt: skip

    return {
        namespace: (
            {
                controller: list(e.of(held(namespace)))
                for controller, e in index.by_controller.items()
            },
            {
                labels: (g.labels, list(g.pods.of(held(namespace))))
                for labels, g in index.by_labels.items()
            },
            set(index.irregular),
            {pair: (len(held), frozenset(held)) for pair, held in index.by_pair.items()},
        )
        for namespace, index in store.indexes._pods_by_namespace.items()
    }


def rebuilt(store: Store) -> Store:
    fresh = Store()
    for kind in ("Pod", REPLICASET, DEPLOYMENT, "Node"):
        for key in store.keys(kind):
            obj = store.get(kind, key.namespace, key.name)
            assert obj is not None
            fresh.apply(kind, ChangeType.ADDED, obj)
    return fresh


@PROPERTY
@given(ops(malformed=False))
def test_the_indexes_find_exactly_the_pods_the_scan_of_the_namespace_finds(
    operations: list[tuple[Any, ...]],
) -> None:
    store = build(operations)
    assert all(store.indexes.pods_indexed(namespace) for namespace in NAMESPACES)
    for key in keys(store)[:-1]:
        expected = ordered(_workload_objects_by_scan(store, key))
        assert ordered(_workload_objects_indexed(store, key)) == expected  # no fallback
        assert ordered(workload_objects(store, key)) == expected
    assert indexes(store) == indexes(rebuilt(store))


@PROPERTY
@given(ops(malformed=False, labelled=True))
def test_label_sets_looked_up_by_a_required_label_find_what_the_scan_finds(
    operations: list[tuple[Any, ...]],
) -> None:
    """Every selector with ``matchLabels``: only the label sets holding one of the labels they
    require are checked (``WorkloadIndexes.pod_label_sets_with``), and they find the same pods."""
    store = build(operations)
    for key in keys(store)[:-1]:
        assert ordered(_workload_objects_indexed(store, key)) == ordered(
            _workload_objects_by_scan(store, key)
        )
    assert indexes(store) == indexes(rebuilt(store))


def test_each_selector_of_a_workload_finds_its_label_sets() -> None:
    store = base_store()
    for name, selector in (("rs0", {"app": "x"}), ("rs1", {"tier": "y"})):
        meta = {
            "name": name,
            "namespace": "a",
            "uid": uid(REPLICASET, "a", name),
            "resourceVersion": "1",
            "ownerReferences": [owner(DEPLOYMENT, "a", "d0")],
        }
        rs = {"kind": REPLICASET, "metadata": meta, "spec": {"selector": {"matchLabels": selector}}}
        store.apply(REPLICASET, ChangeType.ADDED, rs)
    for name, labels in (("p0", {"app": "x"}), ("p1", {"tier": "y"}), ("p2", {"app": "y"})):
        meta = {"name": name, "namespace": "a", "resourceVersion": "1", "labels": labels}
        store.apply("Pod", ChangeType.ADDED, {"kind": "Pod", "metadata": meta, "spec": {}})
    found = _workload_objects_indexed(store, WorkloadKey("a", DEPLOYMENT, "d0"))
    assert [name for _, name in found.pods] == ["p0", "p1"]


@PROPERTY
@given(ops(malformed=True))
def test_with_malformed_objects_the_snapshot_objects_or_the_error_are_as_the_scans(
    operations: list[tuple[Any, ...]],
) -> None:
    store = build(operations)
    for key in keys(store):
        assert outcome(workload_objects, store, key) == outcome(
            _workload_objects_by_scan, store, key
        )
    assert indexes(store) == indexes(rebuilt(store))


def test_a_pod_moved_to_another_label_set_leaves_the_old_one() -> None:
    store = Store()
    meta = {"name": "p", "namespace": "a", "resourceVersion": "1", "labels": {"app": "x"}}
    store.apply("Pod", ChangeType.ADDED, {"metadata": meta})
    store.apply("Pod", ChangeType.MODIFIED, {"metadata": {**meta, "resourceVersion": "2"}})
    moved = {**meta, "resourceVersion": "3", "labels": {"app": "y"}}
    store.apply("Pod", ChangeType.MODIFIED, {"metadata": moved})
    assert [
        (dict(labels), [name for name, _ in pods])
        for labels, pods in store.indexes.pod_label_sets("a")
    ] == [({"app": "y"}, ["p"])]
    store.apply("Pod", ChangeType.DELETED, {"metadata": moved})
    assert list(store.indexes.pod_label_sets("a")) == []
    assert store.indexes._pods_by_namespace == {}


def test_a_namespace_with_an_irregular_pod_is_not_indexed_until_it_goes() -> None:
    store = Store()
    odd = {"name": "odd", "namespace": "a", "resourceVersion": "1", "labels": {"app": 1}}
    store.apply("Pod", ChangeType.ADDED, {"metadata": odd})
    assert not store.indexes.pods_indexed("a")
    assert store.indexes.pods_indexed("b")
    store.replace("Pod", [], namespace="a")
    assert store.indexes.pods_indexed("a")
