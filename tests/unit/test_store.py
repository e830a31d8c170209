"""The informer's pure parts: the cache's writes and the changes they report, watch-line
decoding (bookmarks, 410 Gone), and the relist backoff."""

from __future__ import annotations

import gc
import json
import random
import sys
from typing import Any

import pytest

from podcost_kube.client import KubeError
from podcost_kube.informer import ResourceExpired, decode_event
from podcost_kube.store import Change, ChangeType, ObjectKey, Store


def pod(name: str, version: str, node: str | None = "n1", **labels: str) -> dict[str, Any]:
    spec = {"nodeName": node} if node else {}
    meta = {"name": name, "namespace": "ns", "resourceVersion": version, "labels": labels}
    return {"kind": "Pod", "metadata": meta, "spec": spec}


# --- the store --------------------------------------------------------------------------------


def test_an_event_for_an_unknown_object_adds_it_whatever_the_watch_called_it() -> None:
    store = Store()
    change = store.apply("Pod", ChangeType.MODIFIED, pod("a", "1"))
    assert change is not None
    assert (change.type, change.old) == (ChangeType.ADDED, None)
    assert store.get("Pod", "ns", "a") == pod("a", "1")


def test_its_repr_counts_the_objects_of_each_kind_instead_of_printing_them() -> None:
    store = Store()
    for name in ("a", "b"):
        store.apply("Pod", ChangeType.ADDED, pod(name, "1"))
    store.apply("Node", ChangeType.ADDED, {"kind": "Node", "metadata": {"name": "n1"}})
    assert repr(store) == "Store(Node=1, Pod=2)"


def test_an_update_reports_the_object_before_and_after() -> None:
    store = Store()
    store.apply("Pod", ChangeType.ADDED, pod("a", "1"))
    change = store.apply("Pod", ChangeType.MODIFIED, pod("a", "2", tier="x"))
    assert change is not None
    assert change.type is ChangeType.MODIFIED
    assert (change.old, change.new) == (pod("a", "1"), pod("a", "2", tier="x"))


def test_an_event_with_the_stored_resource_version_is_a_duplicate() -> None:
    store = Store()
    store.apply("Pod", ChangeType.ADDED, pod("a", "1"))
    assert store.apply("Pod", ChangeType.MODIFIED, pod("a", "1")) is None


def test_an_update_of_nothing_the_store_keeps_is_no_change_and_keeps_the_object_held() -> None:
    store = Store()
    store.apply("Pod", ChangeType.ADDED, pod("a", "1", tier="x"))
    held = store.get("Pod", "ns", "a")
    assert store.apply("Pod", ChangeType.MODIFIED, pod("a", "2", tier="x")) is None
    assert store.get("Pod", "ns", "a") is held
    assert held == pod("a", "2", tier="x")  # at the version the API server has
    assert [p["metadata"]["name"] for p in store.indexes.pods_on_node("n1")] == ["a"]
    change = store.apply("Pod", ChangeType.MODIFIED, pod("a", "3", tier="y"))
    assert change is not None
    assert (change.old, change.new) == (pod("a", "2", tier="x"), pod("a", "3", tier="y"))


def test_an_object_with_a_field_more_or_less_is_a_change() -> None:
    store = Store()
    store.apply("Pod", ChangeType.ADDED, pod("a", "1"))
    more = {**pod("a", "2"), "status": {"phase": "Running"}}
    assert store.apply("Pod", ChangeType.MODIFIED, more) is not None
    less = pod("a", "3")
    del less["metadata"]["labels"]
    assert store.apply("Pod", ChangeType.MODIFIED, less) is not None
    unversioned = pod("a", "4")
    del unversioned["metadata"]["resourceVersion"]
    assert store.apply("Pod", ChangeType.MODIFIED, unversioned) is not None


def test_deleting_an_unknown_object_changes_nothing() -> None:
    assert Store().apply("Pod", ChangeType.DELETED, pod("a", "1")) is None


def test_pods_are_indexed_by_the_node_they_are_bound_to() -> None:
    store = Store()
    store.apply("Pod", ChangeType.ADDED, pod("a", "1", node=None))
    store.apply("Pod", ChangeType.ADDED, pod("b", "1", node="n1"))
    assert [p["metadata"]["name"] for p in store.indexes.pods_on_node("n1")] == ["b"]
    store.apply("Pod", ChangeType.MODIFIED, pod("a", "2", node="n1"))  # bound by the scheduler
    store.apply("Pod", ChangeType.DELETED, pod("b", "2"))
    assert [p["metadata"]["name"] for p in store.indexes.pods_on_node("n1")] == ["a"]


def test_a_relist_reports_only_what_changed_while_the_watch_was_down() -> None:
    store = Store()
    for name in ("gone", "same", "changed", "quiet"):
        store.apply("Pod", ChangeType.ADDED, pod(name, "1"))
    changes = store.replace(
        "Pod", [pod("same", "1"), pod("changed", "5", tier="x"), pod("new", "6"), pod("quiet", "7")]
    )
    assert [(c.type, c.key.name) for c in changes] == [
        (ChangeType.DELETED, "gone"),
        (ChangeType.MODIFIED, "changed"),
        (ChangeType.ADDED, "new"),
    ]
    names = ["changed", "new", "quiet", "same"]
    assert sorted(p["metadata"]["name"] for p in store.objects("Pod")) == names
    on_node = store.indexes.pods_on_node("n1")
    assert [p["metadata"]["name"] for p in on_node] == names
    # Only its resourceVersion moved: the store keeps what it held, at the listed version.
    assert store.get("Pod", "ns", "quiet") == pod("quiet", "7")


def test_a_relist_with_an_object_whose_name_is_not_text_keeps_every_object() -> None:
    # Sorting a number among names raised TypeError and stopped the relist.
    odd = {**pod("x", "1"), "metadata": {**pod("x", "1")["metadata"], "name": 7}}
    store = Store()
    store.apply("Pod", ChangeType.ADDED, pod("gone", "1"))
    changes = store.replace("Pod", [pod("b", "1"), odd, pod("a", "1")])
    assert [(c.type, c.key.name) for c in changes] == [
        (ChangeType.DELETED, "gone"),
        (ChangeType.ADDED, "7"),
        (ChangeType.ADDED, "a"),
        (ChangeType.ADDED, "b"),
    ]
    assert len(store.objects("Pod")) == 3
    assert store.get("Pod", "ns", "7") is odd


def test_a_relist_of_one_namespace_leaves_the_other_namespaces_alone() -> None:
    store = Store()
    elsewhere = {**pod("other", "1"), "metadata": {**pod("other", "1")["metadata"],
                                                   "namespace": "elsewhere"}}  # fmt: skip
    store.apply("Pod", ChangeType.ADDED, elsewhere)
    store.apply("Pod", ChangeType.ADDED, pod("gone", "1"))
    changes = store.replace("Pod", [pod("new", "2")], namespace="ns")
    assert [(c.type, c.key.namespace, c.key.name) for c in changes] == [
        (ChangeType.DELETED, "ns", "gone"),
        (ChangeType.ADDED, "ns", "new"),
    ]
    assert store.get("Pod", "elsewhere", "other") == elsewhere
    # Without a namespace the list is of every namespace: the other one's pod goes.
    store.replace("Pod", [pod("new", "2")])
    assert store.get("Pod", "elsewhere", "other") is None


def test_a_relist_writes_the_store_before_it_builds_a_change_and_keeps_no_key_per_object() -> None:
    # What a list keeps (index entries, a node's map) is then not laid out among a Change and a
    # key per listed object, which left holes the allocator could not give back.
    def keys_and_changes() -> int:
        return sum(isinstance(o, Change | ObjectKey) for o in gc.get_objects())

    alive: list[int] = []

    class Watched(Store):
        def _put(self, key: ObjectKey, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
            alive.append(keys_and_changes())
            Store._put(self, key, old, new)

    store = Watched()
    store.apply("Pod", ChangeType.ADDED, pod("changed", "1"))
    alive.clear()
    listed = [pod(f"p{i}", "1", node=f"n{i % 3}") for i in range(40)]
    listed.append(pod("changed", "2", tier="x"))
    gc.collect()
    before = keys_and_changes()
    changes = store.replace("Pod", listed)
    assert len(changes) == len(alive) == 41
    # At each write: the key being written, and no other Change or key.
    assert max(alive) - before <= 1


def test_the_pod_indexes_hold_one_pointer_a_pod_its_name_in_order_not_a_map_by_name() -> None:
    # A map by name took 28-36 bytes a pod (its table for 30 pods, outside pymalloc); the
    # sorted list of their names takes 8, the pods found by name in the store when read.
    names = [f"p{index:02d}" for index in range(30)]
    store = Store()
    owner = [{"kind": "ReplicaSet", "name": "web-1", "uid": "u1", "controller": True}]
    for name in random.Random(14).sample(names, len(names)):
        obj = pod(name, "1", node="n1", app="web")
        obj["metadata"]["ownerReferences"] = owner
        store.apply("Pod", ChangeType.ADDED, obj)
    index = store.indexes._pods_by_namespace["ns"]
    entries = [store.indexes._pods_by_node["n1"]["ns"], *index.by_controller.values()]
    entries += [group.pods for group in index.by_labels.values()]
    assert len(entries) == 3
    by_name = dict.fromkeys(names)
    for entry in entries:
        assert entry.names == names
        assert sys.getsizeof(entry.names) <= sys.getsizeof([None] * 40) < sys.getsizeof(by_name) / 2
    store.apply("Pod", ChangeType.DELETED, pod("p07", "2"))
    on_node = store.indexes.pods_on_node("n1")
    assert [p["metadata"]["name"] for p in on_node] == names[:7] + names[8:]
    assert [name for _, name, _ in store.indexes.keyed_pods_on_node("n1")] == names[:7] + names[8:]
    # An update that leaves the pod in the same entries changes none of them, but moves its
    # node's stamp on; what the entries read is the update.
    stamp = store.indexes.node_stamp("n1")
    held = [list(entry.names) for entry in entries]
    update = pod("p03", "3", node="n1", app="web")
    update["metadata"]["ownerReferences"] = owner
    update["status"] = {"phase": "Running"}
    store.apply("Pod", ChangeType.MODIFIED, update)
    assert [entry.names for entry in entries] == held
    assert store.indexes.node_stamp("n1") != stamp
    assert store.indexes.pods_on_node("n1")[3] is update
    assert dict(store.indexes.pods_controlled_by("ns", "ReplicaSet", "u1"))["p03"] is update
    assert [dict(pods)["p03"] for _, pods in store.indexes.pod_label_sets("ns")] == [update]


# --- watch lines ------------------------------------------------------------------------------


def line(event_type: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": obj}).encode() + b"\n"


def test_a_bookmark_carries_only_a_resource_version() -> None:
    bookmark = {"kind": "Pod", "metadata": {"resourceVersion": "77"}}
    event = decode_event(line("BOOKMARK", bookmark))
    assert (event.type, event.resource_version) == ("BOOKMARK", "77")


def test_an_expired_version_raises_resource_expired() -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old: 1 (99)"}
    with pytest.raises(ResourceExpired, match="too old") as raised:
        decode_event(line("ERROR", status))
    assert raised.value.retriable


@pytest.mark.parametrize(
    ("text", "retriable"),
    [
        (line("ERROR", {"kind": "Status", "code": 500, "message": "boom"}), True),
        (line("ERROR", {"kind": "Status", "code": 403, "message": "forbidden"}), False),
        (b"{not json", True),
        (line("SURPRISE", pod("a", "1")), True),
        (line("ADDED", {"kind": "Pod", "metadata": {"name": "a"}}), True),
    ],
    ids=[
        "a server error is retriable",
        "a refusal is permanent",
        "a line that is not JSON is retriable",
        "an unknown event type is retriable",
        "an object without a resourceVersion is retriable",
    ],
)
def test_a_bad_watch_line_raises_an_error_that_says_what_happens_next(
    text: bytes, retriable: bool
) -> None:
    with pytest.raises(KubeError) as raised:
        decode_event(text)
    assert raised.value.retriable is retriable


def test_a_throttled_answer_says_how_long_to_wait() -> None:
    status = {"kind": "Status", "code": 429, "message": "storage is (re)initializing",
              "details": {"retryAfterSeconds": 1}}  # fmt: skip
    with pytest.raises(KubeError) as raised:
        decode_event(line("ERROR", status))
    assert (raised.value.retriable, raised.value.retry_after) == (True, 1.0)
