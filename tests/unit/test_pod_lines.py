"""A watch line of pods decoded only as far as the store keeps the pod (``decode_pod_line``) and
kept next to the version the store holds (``keep_pod``) is kept as the whole line would be.

The informer decodes a line of a watch of whole pods with ``decode_event(line, what, POD)``:
for the pods of the shop dump, kwok-like pods as the API server serves them, a pod with every
part the readers read, and fuzzed ones, the store ends up holding what ``project_pod`` keeps of
the whole pod (the same values of the same types, interned and shared the same way), and the
events it refuses or that carry errors (ERROR, malformed lines, missing objects or versions)
raise what they raised. An update that changes nothing the store keeps is no change, and the
parts a change leaves alone are the version's before.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import assume, given
from tests.support.fuzz import fuzz, mutated_json
from tests.support.served import served_pod
from tests.unit.test_project_pod import _full_pod

from podcost_core.kubejson import ConversionError
from podcost_core.projection import (
    SharedParts,
    decode_pod_line,
    keep_pod,
    project_pod,
    slim_decoded_pod,
    slim_managed_fields,
)
from podcost_core.tomodel import pod_from_json
from podcost_kube.client import KubeError
from podcost_kube.informer import NODE, POD, Resource, ResourceExpired, apply_event, decode_event
from podcost_kube.store import ChangeType, Store

DUMP: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "shop-dump.json").read_text(encoding="utf-8")
)
# Versioned as the API server serves them (the dump, as ``kubectl get`` prints it, is not).
SHOP_PODS = [
    {**item, "metadata": {"resourceVersion": str(index + 1), **item["metadata"]}}
    for index, item in enumerate(DUMP["items"])
    if item["kind"] == "Pod"
]
SERVED = [served_pod(index, cost=index - 3 if index % 2 else None) for index in range(6)]
PODS = [*SHOP_PODS, *SERVED, _full_pod()]


def line(event_type: str, obj: object) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj})


def exact(value: Any) -> Any:
    """``value`` with the type of every leaf, so that ``1``, ``1.0`` and ``True`` differ."""
    if isinstance(value, dict):
        return ("dict", sorted((key, exact(item)) for key, item in value.items()))
    if isinstance(value, list):
        return ("list", [exact(item) for item in value])
    return (type(value).__name__, value)


def whole(raw: Any, shared: SharedParts | None = None) -> Any:
    """What the informer kept of ``raw`` when it decoded the whole line."""
    return project_pod(slim_managed_fields(copy.deepcopy(raw)), shared)


def take(store: Store, text: bytes, resource: Resource = POD) -> Any:
    """``text`` through the informer's path; the change it made."""
    return apply_event(store, resource, decode_event(text, "watch", resource), SharedParts())


def _name(raw: dict[str, Any]) -> tuple[str, str]:
    return raw["metadata"].get("namespace", ""), raw["metadata"]["name"]


@pytest.mark.parametrize("raw", PODS, ids=[_name(raw)[1] for raw in PODS])
def test_a_pod_is_kept_as_the_whole_line_would_keep_it(raw: dict[str, Any]) -> None:
    event = decode_event(line("ADDED", raw), "watch", POD)
    assert event.partial
    assert event.resource_version == raw["metadata"]["resourceVersion"]
    store = Store()
    change = apply_event(store, POD, event, SharedParts())
    assert change is not None
    assert change.type is ChangeType.ADDED
    kept = store.get("Pod", *_name(raw))
    assert exact(kept) == exact(whole(raw))
    assert type(kept) is type(whole(raw))  # the dicts every pod shares its keys with
    assert all(type(kept[s]) is type(whole(raw)[s]) for s in ("metadata", "spec"))


def test_what_the_line_carries_beyond_the_kept_fields_is_never_decoded() -> None:
    raw = copy.deepcopy(SERVED[1])
    decoded = decode_pod_line(line("MODIFIED", raw))
    assert decoded is not None
    event_type, obj = decoded
    assert event_type == "MODIFIED"
    assert "volumes" not in obj["spec"]
    assert "podIP" not in obj["status"]
    # Of the managed fields, only what says who owns the deletion cost.
    for entry in obj["metadata"].get("managedFields", []):
        assert set(entry) <= {"manager", "fieldsV1"}
        assert set(entry.get("fieldsV1") or {}) <= {"f:metadata"}


def test_an_update_keeps_the_parts_it_did_not_change_from_the_version_before() -> None:
    shared = SharedParts()
    store = Store()
    raw = copy.deepcopy(SERVED[3])
    apply_event(store, POD, decode_event(line("ADDED", raw), "watch", POD), shared)
    before = store.get("Pod", *_name(raw))
    assert before is not None
    raw["metadata"]["resourceVersion"] = "9001"
    raw["metadata"]["labels"]["tier"] = "gold"
    change = apply_event(store, POD, decode_event(line("MODIFIED", raw), "watch", POD), shared)
    assert change is not None
    after = change.new
    assert exact(after) == exact(whole(raw))
    assert after["metadata"]["labels"] is not before["metadata"]["labels"]
    assert after["metadata"]["ownerReferences"] is before["metadata"]["ownerReferences"]
    assert after["spec"]["containers"] is before["spec"]["containers"]
    assert after["status"] is before["status"]


def test_status_noise_is_no_change_and_the_store_keeps_the_version_it_holds() -> None:
    store = Store()
    raw = copy.deepcopy(SERVED[2])
    take(store, line("ADDED", raw))
    held = store.get("Pod", *_name(raw))
    raw["metadata"]["resourceVersion"] = "9002"
    raw["status"]["podIP"] = "10.9.9.9"  # read by nothing
    for condition in raw["status"]["conditions"]:
        if condition["type"] != "Ready":
            condition["lastProbeTime"] = "2026-01-01T00:00:00Z"  # nor this
    raw["metadata"]["managedFields"][0]["time"] = "2026-01-01T00:00:00Z"  # nor this
    assert take(store, line("MODIFIED", raw)) is None
    assert store.get("Pod", *_name(raw)) is held
    assert held is not None
    assert held["metadata"]["resourceVersion"] == "9002"


def test_an_event_is_kept_only_when_it_changes_something_the_store_keeps() -> None:
    # Status noise, a duplicate and a deletion are told from the decoded pod itself: nothing is
    # kept of them. A change is kept next to the version held.
    shared = SharedParts()
    kept_next_to: list[Any] = []

    def keep(pod: dict[str, Any], held: dict[str, Any] | None) -> dict[str, Any]:
        kept_next_to.append(held)
        return keep_pod(pod, held, shared, slimmed=True)

    def decoded(text: bytes) -> dict[str, Any]:
        found = decode_pod_line(text)
        assert found is not None
        return slim_decoded_pod({**found[1], "kind": "Pod"})

    store = Store()
    raw = copy.deepcopy(SERVED[2])
    assert store.apply("Pod", ChangeType.ADDED, decoded(line("ADDED", raw)), keep=keep)
    assert kept_next_to == [None]
    held = store.get("Pod", *_name(raw))
    raw["metadata"]["resourceVersion"] = "9004"
    for condition in raw["status"]["conditions"]:
        if condition["type"] != "Ready":
            condition["lastProbeTime"] = "2026-01-01T00:00:00Z"  # read by nothing
    noise = decoded(line("MODIFIED", raw))
    for event in (noise, noise):  # then the same line again: a duplicate
        assert store.apply("Pod", ChangeType.MODIFIED, event, keep=keep) is None
    assert kept_next_to == [None]
    assert store.get("Pod", *_name(raw)) is held
    assert held is not None
    assert held["metadata"]["resourceVersion"] == "9004"
    raw["metadata"]["resourceVersion"] = "9005"
    raw["metadata"]["labels"]["tier"] = "gold"
    change = store.apply("Pod", ChangeType.MODIFIED, decoded(line("MODIFIED", raw)), keep=keep)
    assert change is not None
    assert change.old is held
    assert kept_next_to == [None, held]
    assert exact(change.new) == exact(whole(raw))
    assert change.new["spec"] is held["spec"]
    raw["metadata"]["resourceVersion"] = "9006"
    gone = store.apply("Pod", ChangeType.DELETED, decoded(line("DELETED", raw)), keep=keep)
    assert gone is not None
    assert gone.old is change.new
    assert kept_next_to == [None, held]


def test_a_deleted_pod_leaves_the_store() -> None:
    store = Store()
    raw = copy.deepcopy(SERVED[0])
    take(store, line("ADDED", raw))
    raw["metadata"]["resourceVersion"] = "9003"
    change = take(store, line("DELETED", raw))
    assert change is not None
    assert change.type is ChangeType.DELETED
    assert store.count("Pod") == 0


def test_a_pod_without_its_optional_fields_is_kept_as_it_comes() -> None:
    bare = {"metadata": {"name": "bare", "namespace": "ns", "resourceVersion": "5"}}
    store = Store()
    change = take(store, line("ADDED", bare))
    assert change is not None
    kept = store.get("Pod", "ns", "bare")
    assert kept == {**bare, "apiVersion": "v1", "kind": "Pod"}
    with pytest.raises(ConversionError):
        pod_from_json({"metadata": {"namespace": "ns"}})  # what a reader makes of less


def test_a_bookmark_is_decoded_with_its_resource_version() -> None:
    bookmark = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "77", "annotations": {"k8s.io/initial-events-end": "true"}},
    }
    event = decode_event(line("BOOKMARK", bookmark), "watch", POD)
    assert (event.type, event.resource_version) == ("BOOKMARK", "77")


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ({"kind": "Status", "code": 410, "reason": "Gone", "message": "too old"}, ResourceExpired),
        # A Status the pod decoder would accept (no ``status`` field): still the error it carries.
        ({"kind": "Status", "metadata": {}, "code": 410, "message": "too old"}, ResourceExpired),
        ({"kind": "Status", "status": "Failure", "code": 500, "message": "boom"}, KubeError),
    ],
)
def test_an_error_event_raises_the_error_it_carries(status: dict[str, Any], error: type) -> None:
    with pytest.raises(error, match=r"too old|boom") as raised:
        decode_event(line("ERROR", status), "watch", POD)
    assert raised.value.retriable


@pytest.mark.parametrize(
    "text",
    [
        b"{not json",
        b'{"type": "ADDED"}',
        b'{"type": "ADDED", "object": "a pod"}',
        line("ADDED", {"metadata": {"name": "p"}}),  # no resourceVersion
        line("SURPRISE", {"metadata": {"name": "p", "resourceVersion": "1"}}),
    ],
)
def test_a_line_the_informer_refuses_is_refused_the_same_way(text: bytes) -> None:
    with pytest.raises(KubeError) as fast:
        decode_event(text, "watch", POD)
    with pytest.raises(KubeError) as slow:
        decode_event(text, "watch")
    assert str(fast.value) == str(slow.value)
    assert fast.value.retriable


def test_a_pod_of_unexpected_shape_is_decoded_whole_and_kept_malformed() -> None:
    raw = copy.deepcopy(SERVED[1])
    raw["spec"]["containers"] = "not a list"
    event = decode_event(line("ADDED", raw), "watch", POD)
    assert not event.partial
    store = Store()
    apply_event(store, POD, event, SharedParts())
    assert store.get("Pod", *_name(raw)) == whole(raw)


def test_other_kinds_and_metadata_only_pods_are_decoded_whole() -> None:
    node = {"kind": "Node", "metadata": {"name": "n", "resourceVersion": "1"}, "status": {}}
    assert not decode_event(line("ADDED", node), "watch", NODE).partial
    metadata_only = Resource("Pod", "v1", "pods", metadata_only=True)
    assert not decode_event(line("ADDED", SERVED[0]), "watch", metadata_only).partial


def test_a_number_beyond_64_bits_is_refused_by_validation_either_way() -> None:
    raw = copy.deepcopy(SERVED[0])
    text = line("ADDED", raw).replace(b'"priority":0', b'"priority":123456789012345678901234567890')
    assert b"1234567890123456789" in text
    for resource in (POD, None):
        store = Store()
        apply_event(store, POD, decode_event(text, "watch", resource), SharedParts())
        with pytest.raises(ConversionError, match="priority"):
            pod_from_json(store.get("Pod", *_name(raw)) or {})


@fuzz(share=0.5)
@given(raw=mutated_json(SERVED[1]))
def test_a_fuzzed_pod_is_kept_or_refused_as_the_whole_line(raw: Any) -> None:
    try:
        text = line("MODIFIED", raw)
    except TypeError:  # orjson cannot write it (an int beyond 64 bits): no server sends it
        assume(False)
    try:
        expected = decode_event(text, "watch")
    except KubeError as error:
        refused = str(error)
    else:
        refused = None
    if refused is not None:
        with pytest.raises(KubeError) as fast:
            decode_event(text, "watch", POD)
        assert str(fast.value) == refused
        return
    event = decode_event(text, "watch", POD)
    assert event.type == expected.type
    # Alone: the same values of the same types.
    fresh_whole, fresh_fast = Store(), Store()
    apply_event(fresh_whole, POD, expected, SharedParts())
    apply_event(fresh_fast, POD, event, SharedParts())
    assert exact(fresh_fast.objects("Pod")) == exact(fresh_whole.objects("Pod"))
    # Next to a version before it (the served pod): the same change, the same pod kept, its
    # parts equal to the version before taken from it (``==``, which reads 1 as 1.0).
    served = copy.deepcopy(SERVED[1])
    served["metadata"]["resourceVersion"] = "0"
    next_whole, next_fast = Store(), Store()
    for store in (next_whole, next_fast):
        take(store, line("ADDED", served))
    whole_change = apply_event(next_whole, POD, decode_event(text, "watch"), SharedParts())
    fast_change = apply_event(next_fast, POD, decode_event(text, "watch", POD), SharedParts())
    assert (whole_change is None) == (fast_change is None)
    assert next_fast.objects("Pod") == next_whole.objects("Pod")


def test_a_part_equal_to_one_seen_before_is_taken_without_being_projected_again() -> None:
    shared = SharedParts()
    projected: list[Any] = []

    def project(part: Any) -> Any:
        projected.append(part)
        return [dict(item) for item in part]

    first = shared.share([{"type": "Ready", "status": "True"}], project)
    assert projected == [first]
    again = shared.share([{"type": "Ready", "status": "True"}], project)
    assert again is first
    assert projected == [first]
    other = shared.share([{"type": "Ready", "status": "False"}], project)
    assert other == [{"type": "Ready", "status": "False"}]
    assert len(projected) == 2
    # A part without a key (an int beyond 64 bits) is projected, and not remembered.
    big = [{"restartCount": 2**70}]
    assert shared.share(big, project) == big
    assert len(projected) == 3
    assert len(shared) == 2
