"""The store's index of ReplicaSets by controller (``WorkloadIndexes.controlled_by``) and the
snapshots built through it: a snapshot reads only the ReplicaSets whose controller reference
could name its workload (or, for a ReplicaSet, its controller), where it read every ReplicaSet
of the namespace before (``tests/bench/bench_workload_objects.py``: most of a snapshot's time in
a namespace of 1,334 Deployments). On random stores whose ReplicaSets name their controllers by
uid and name, by name alone, by a uid of another object, by a name that is not the owner's, or
in references that cannot be keys, every workload's snapshot (or error) and its pods and nodes
are those of the store read without the index, and the index equals that of a store built
afresh from what the store holds."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.test_workload_pod_index import (
    DEPLOYMENTS,
    NAMESPACES,
    PROPERTY,
    RS_NAMES,
    base_store,
    keys,
    pods,
    rebuilt,
    selectors,
    uid,
)

from podcost_kube.snapshots import WorkloadIndexes, workload_objects, workload_snapshot
from podcost_kube.store import ChangeType, Store
from podcost_kube.workloads import DEPLOYMENT, REPLICASET, WorkloadKey

REFERENCES = ("uid and name", "uid and name", "name only", "another uid", "another name",
              "not a controller", "none", "irregular")  # fmt: skip


@st.composite
def replicasets(draw: st.DrawFn) -> dict[str, Any]:
    namespace = draw(st.sampled_from(NAMESPACES))
    name = draw(st.sampled_from(RS_NAMES))
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if draw(st.integers(0, 9)):
        meta["uid"] = uid(REPLICASET, namespace, name)
    controller = draw(st.sampled_from(DEPLOYMENTS))
    ref: dict[str, Any] = {"kind": DEPLOYMENT, "name": controller, "controller": True,
                           "uid": uid(DEPLOYMENT, namespace, controller)}  # fmt: skip
    match draw(st.sampled_from(REFERENCES)):
        case "name only":
            del ref["uid"]
        case "another uid":  # the name of one Deployment, the uid of the other
            other = next(d for d in DEPLOYMENTS if d != controller)
            ref["uid"] = uid(DEPLOYMENT, namespace, other)
        case "another name":  # the uid of one Deployment, a name nobody has
            ref["name"] = "renamed"
        case "not a controller":
            ref["controller"] = False
        case "none":
            ref = {}
        case "irregular":
            meta["ownerReferences"] = draw(st.sampled_from(("d0", [{**ref, "uid": ["u"]}])))
    if ref and "ownerReferences" not in meta:
        meta["ownerReferences"] = [ref]
    return {"kind": REPLICASET, "metadata": meta, "spec": {"selector": draw(selectors(False))}}


def operations() -> st.SearchStrategy[list[tuple[Any, ...]]]:
    change = st.one_of(
        st.tuples(st.just("replicaset"), replicasets()),
        st.tuples(st.just("replicaset"), replicasets()),
        st.tuples(st.just("delete"), st.sampled_from(NAMESPACES), st.sampled_from(RS_NAMES)),
        st.tuples(st.just("pod"), pods(False)),
    )
    return st.builds(
        lambda start, pods_first, changes: [*start, *pods_first, *changes],
        st.lists(st.tuples(st.just("replicaset"), replicasets()), min_size=3, max_size=8),
        st.lists(st.tuples(st.just("pod"), pods(False)), min_size=4, max_size=12),
        st.lists(change, max_size=10),
    )


def build(ops: list[tuple[Any, ...]]) -> Store:
    store = base_store()
    for version, (op, *args) in enumerate(ops, start=1):
        if op == "delete":
            meta = {"name": args[1], "namespace": args[0]}
            store.apply(REPLICASET, ChangeType.DELETED, {"kind": REPLICASET, "metadata": meta})
            continue
        obj = copy.deepcopy(args[0])
        obj["metadata"]["resourceVersion"] = str(version)
        store.apply("Pod" if op == "pod" else REPLICASET, ChangeType.MODIFIED, obj)
    return store


def outcome(store: Store, key: WorkloadKey) -> Any:
    """The snapshot of ``key`` and the pods and nodes it was built from, or the error."""
    try:
        objects = workload_objects(store, key)
        return workload_snapshot(store, key), list(objects.pods.items()), list(objects.nodes)
    except Exception as error:  # the same error, type and message
        return type(error), str(error)


def read_all(self: WorkloadIndexes, *args: Any) -> None:
    return None  # "read them all": every ReplicaSet of the namespace, as before the index


def controlled(store: Store) -> Any:
    def names(table: dict[Any, list[str]]) -> dict[Any, list[str]]:
        return {entry: sorted(held) for entry, held in table.items()}  # kept in any order

    return {
        where: (names(index.by_uid), names(index.by_name), index.irregular)
        for where, index in store.indexes._controlled.items()
    }


@PROPERTY
@given(operations())
def test_every_snapshot_is_the_one_read_from_every_replicaset_of_its_namespace(
    ops: list[tuple[Any, ...]],
) -> None:
    store = build(ops)
    through_index = {key: outcome(store, key) for key in keys(store)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WorkloadIndexes, "controlled_by", read_all)
        assert through_index == {key: outcome(store, key) for key in keys(store)}
    assert controlled(store) == controlled(rebuilt(store))


def test_the_index_finds_a_deployments_replicasets_by_uid_or_by_name() -> None:
    store = Store()

    def add(name: str, ref: dict[str, Any] | None) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": "a", "resourceVersion": "1"}
        if ref is not None:
            meta["ownerReferences"] = [{"controller": True, "kind": DEPLOYMENT, **ref}]
        store.apply(REPLICASET, ChangeType.ADDED, {"metadata": meta})

    add("by-both", {"name": "web", "uid": "u-web"})
    add("by-name", {"name": "web"})
    add("by-uid", {"name": "renamed", "uid": "u-web"})
    add("other", {"name": "api", "uid": "u-api"})
    add("orphan", None)

    def names(found: list[dict[str, Any]] | None) -> list[str] | None:
        return None if found is None else [rs["metadata"]["name"] for rs in found]

    assert names(store.indexes.controlled_by(REPLICASET, "a", "web", "u-web")) == [
        "by-both",
        "by-name",
        "by-uid",
    ]
    assert names(store.indexes.controlled_by(REPLICASET, "a", "web", "")) == [
        "by-both",
        "by-name",
    ]
    assert names(store.indexes.controlled_by(REPLICASET, "b", "web", "u-web")) == []
    assert store.indexes.controlled_by(REPLICASET, "a", ["web"], "u-web") is None
    add("odd", {"name": "web", "uid": {"not": "a key"}})
    assert store.indexes.controlled_by(REPLICASET, "a", "web", "u-web") is None
    store.apply(REPLICASET, ChangeType.DELETED, {"metadata": {"name": "odd", "namespace": "a"}})
    for name in ("by-both", "by-name", "by-uid", "other"):
        store.apply(REPLICASET, ChangeType.DELETED, {"metadata": {"name": name, "namespace": "a"}})
    assert store.indexes._controlled == {}
