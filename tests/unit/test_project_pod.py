"""What the informer keeps of a pod (``project_pod``) answers every reader as the pod does.

For the pods of the shop dump, kwok-like pods as the API server serves them
(``tests.support.served``), and fuzzed ones (one part of a full pod replaced, removed or doubled:
``tests.support.fuzz``), each reader of the store's pods gives the same answer on the projection
as on the pod: ``pod_from_json`` (the same ``Pod``, or a ``ConversionError`` with the same
message up to a list index), ``pod_requests`` and its inputs, ``cost_owner``, ``own_cost``, the
watcher's change filters, the store's keys and node index, the annotator's ``pod_state`` and
``owning_workload``; and the snapshots built from a store of projected pods equal those built
from the pods as served. One answer differs on purpose (the last test): podcost's own cost write
that comes with a change of a field nothing reads is, on the projections, podcost's own write.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from hypothesis import given
from tests.support.fuzz import fuzz, mutated_json
from tests.support.served import edit, served_pod

from podcost.annotator.plan import pod_state
from podcost_core.kubejson import ConversionError, cost_managers
from podcost_core.model import DELETION_COST_ANNOTATION, FIELD_MANAGER
from podcost_core.projection import SharedParts, project_pod, slim_managed_fields
from podcost_core.quantities import pod_requests, pod_requests_inputs
from podcost_core.tomodel import cost_owner, own_cost, pod_from_json
from podcost_kube.informer import POD, WatchEvent, apply_event
from podcost_kube.snapshots import controller_of, workload_snapshot
from podcost_kube.store import ChangeType, Store, object_key, resource_version
from podcost_kube.workloads import (
    DEPLOYMENT,
    REPLICASET,
    WorkloadKey,
    _pod_status_view,
    is_own_cost_write,
    owning_workload,
    pod_change_matters,
    workloads_of_pod,
)

DUMP: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "shop-dump.json").read_text(encoding="utf-8")
)
ITEMS: list[dict[str, Any]] = DUMP["items"]
SHOP_PODS = [item for item in ITEMS if item["kind"] == "Pod"]
SERVED = [served_pod(index, cost=index - 3 if index % 2 else None) for index in range(6)]
ADOPT = ("kwok", "kube-controller-manager")


def _outcome(read: Callable[[], object]) -> object:
    """What ``read()`` returns, or the error it raises: its type, and for a ``ConversionError``
    its message without list indices (the projection leaves out conditions nobody reads, so an
    item's index in the message may differ)."""
    try:
        return ("ok", read())
    except ConversionError as error:
        return ("refused", re.sub(r"\.\d+(?=[.:])", ".N", str(error)))
    except Exception as error:  # a reader given what no API serves fails the same way
        return ("error", type(error).__name__)


def _meta(obj: Any) -> Any:
    return obj.get("metadata", {}) if isinstance(obj, dict) else {}


def _read_ref(ref: Any) -> object:
    """What the readers read of an owner reference (``blockOwnerDeletion`` they do not)."""
    fields = ("apiVersion", "kind", "name", "uid", "controller")
    return None if ref is None else {field: ref.get(field) for field in fields}


def _readings(raw: Any) -> list[object]:
    """Every reader's answer about ``raw``."""
    spec = raw.get("spec", {}) if isinstance(raw, dict) else {}
    meta = _meta(raw)
    readers: list[Callable[[], object]] = [
        lambda: pod_from_json(raw),
        lambda: pod_from_json(raw, adopt=ADOPT),
        lambda: pod_requests(spec),
        lambda: pod_requests_inputs(spec),
        lambda: cost_managers(meta),
        lambda: cost_owner(meta),
        lambda: cost_owner(meta, ADOPT),
        lambda: own_cost(meta),
        lambda: _pod_status_view(raw),
        lambda: _read_ref(controller_of(raw)),
        lambda: object_key("Pod", raw),
        lambda: resource_version(raw),
        lambda: pod_state(raw),
        lambda: pod_state(raw, ADOPT),
    ]
    return [_outcome(read) for read in readers]


#: One for every test, as an informer has one for all its pods.
SHARED = SharedParts()


def _kept(raw: dict[str, Any]) -> dict[str, Any]:
    """What the informer keeps (of a copy: ``slim_managed_fields`` changes its argument)."""
    return project_pod(slim_managed_fields(copy.deepcopy(raw)), SHARED)


def _slim(raw: dict[str, Any]) -> dict[str, Any]:
    return slim_managed_fields(copy.deepcopy(raw))


@pytest.mark.parametrize("raw", [*SHOP_PODS, *SERVED], ids=lambda raw: raw["metadata"]["name"])
def test_every_reader_answers_the_same_on_the_projection(raw: dict[str, Any]) -> None:
    assert _readings(_kept(raw)) == _readings(_slim(raw))
    assert pod_from_json(_kept(raw)) == pod_from_json(raw)


def test_the_projection_keeps_only_what_podcost_reads() -> None:
    kept = _kept(served_pod(1, cost=5))
    assert set(kept) == {"kind", "apiVersion", "metadata", "spec", "status"}
    assert "generateName" not in kept["metadata"]
    assert set(kept["spec"]) == {"containers", "nodeName", "tolerations", "priority"}
    assert set(kept["status"]) == {"phase", "conditions", "containerStatuses", "qosClass"}
    assert [c["type"] for c in kept["status"]["conditions"]] == ["Ready"]
    assert kept["metadata"]["managedFields"] == [
        {
            "manager": FIELD_MANAGER,
            "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{DELETION_COST_ANNOTATION}": {}}}},
        }
    ]
    # The pod as served is left as it is.
    served = served_pod(1, cost=5)
    project_pod(served)
    assert served == served_pod(1, cost=5)


def test_repeated_strings_are_shared_between_pods_and_unique_ones_are_not_interned() -> None:
    one, two = _kept(served_pod(1)), _kept(served_pod(2))
    assert one["metadata"]["namespace"] is two["metadata"]["namespace"]
    assert one["spec"]["nodeName"] is not two["spec"]["nodeName"]  # different nodes
    labels_one, labels_two = one["metadata"]["labels"], two["metadata"]["labels"]
    assert labels_one["pod-template-hash"] is labels_two["pod-template-hash"]
    ref_one, ref_two = one["metadata"]["ownerReferences"][0], two["metadata"]["ownerReferences"][0]
    assert ref_one["uid"] is ref_two["uid"]
    requests = [p["spec"]["containers"][0]["resources"]["requests"]["cpu"] for p in (one, two)]
    assert requests[0] is requests[1]


def test_equal_parts_of_pods_are_kept_once() -> None:
    one, two = _kept(served_pod(1)), _kept(served_pod(2))
    for section, part in [
        ("metadata", "labels"),
        ("metadata", "ownerReferences"),
        ("spec", "containers"),
        ("spec", "tolerations"),
        ("status", "conditions"),  # same second
    ]:
        assert one[section][part] is two[section][part], part
    assert one["status"]["containerStatuses"] is not two["status"]["containerStatuses"]
    assert one["status"]["containerStatuses"] == _kept(served_pod(4))["status"]["containerStatuses"]


def test_the_dicts_every_pod_has_are_plain_dicts_sharing_their_keys() -> None:
    raw = served_pod(1, cost=5)
    kept = _kept(raw)
    many = [_kept(served_pod(index, cost=index)) for index in range(2, 100)]
    sections = [kept, kept["metadata"], kept["spec"], many[-1]["status"]]
    for section in sections:
        assert type(section) is dict
        copied = {**section}
        assert list(section) == list(copied)
        assert section == copied
        # CPython's split dict: its keys table, shared by 100 pods, counts a hundredth each.
        assert sys.getsizeof(section) < sys.getsizeof(copied)
    assert orjson.loads(orjson.dumps(kept)) == kept == copy.deepcopy(kept)
    assert kept == _project_plain(slim_managed_fields(copy.deepcopy(raw)))


def test_pods_with_keys_the_first_pods_lacked_still_share_their_keys() -> None:
    # CPython 3.11 adds no key to a keys table a few dozen dicts share (``_seed_sections``): 200
    # pods kept first with few keys must not turn every later pod with more into ordinary dicts.
    bare = served_pod(1)
    bare["spec"] = {"containers": bare["spec"]["containers"]}
    bare["status"] = {"phase": "Running"}
    first = [project_pod(copy.deepcopy(bare)) for _ in range(200)]
    later = []
    for index in range(2, 100):
        raw = served_pod(index, cost=index)
        raw["spec"].update(overhead={"cpu": "10m"}, affinity={})
        later.append(project_pod(raw))
    kept = later[-1]
    assert {"overhead", "affinity", "tolerations"} <= set(kept["spec"])
    for section in (kept, kept["metadata"], kept["spec"], kept["status"], first[-1]["spec"]):
        assert sys.getsizeof(section) < sys.getsizeof({**section})


def test_a_watch_event_is_kept_projected_as_the_informer_keeps_it() -> None:
    # ``apply_event`` is the informer's path from a watch event to the store, and the benches'.
    store, shared = Store(), SharedParts()
    raws = [served_pod(index, cost=index) for index in (1, 2)]
    changes = [apply_event(store, POD, WatchEvent("ADDED", copy.deepcopy(raw)), shared)
               for raw in raws]  # fmt: skip
    kept = [store.get("Pod", raw["metadata"]["namespace"], raw["metadata"]["name"]) for raw in raws]
    assert [change.new for change in changes if change is not None] == kept
    assert kept == [_project_plain(slim_managed_fields(copy.deepcopy(raw))) for raw in raws]
    assert kept[0]["spec"]["containers"] is kept[1]["spec"]["containers"]  # shared parts
    gone = apply_event(store, POD, WatchEvent("DELETED", copy.deepcopy(raws[0])), shared)
    assert gone is not None
    assert gone.type is ChangeType.DELETED
    assert store.count("Pod") == 1


def _project_plain(raw: dict[str, Any]) -> dict[str, Any]:
    """``project_pod(raw)`` built of ordinary dicts."""
    return cast(dict[str, Any], orjson.loads(orjson.dumps(project_pod(raw))))


def test_a_status_equal_to_another_pods_is_kept_once() -> None:
    shared = SharedParts()
    one, two, four = (project_pod(served_pod(i), shared) for i in (1, 2, 4))
    assert one["status"] is four["status"]  # same Ready second, same restarts
    assert one["status"] != two["status"]  # a restart more
    assert one["spec"] is not four["spec"]  # different nodes
    late = served_pod(1)
    for condition in late["status"]["conditions"]:
        condition["lastTransitionTime"] = "2030-01-01T00:00:00Z"
    assert project_pod(late, shared)["status"] is not one["status"]


def test_only_parts_equal_in_type_and_order_are_shared() -> None:
    shared = SharedParts()
    parts: list[Any] = [
        {"a": 1},
        {"a": True},
        {"a": 1.0},
        {"a": "1"},
        {"a": 0.0},
        {"a": -0.0},
        {"a": None},
        {"a": float("nan")},
        {"a": float("inf")},
        {"a": [1]},
        {"a": 1, "b": 2},
        {"b": 2, "a": 1},
        [{"a": 1}],
    ]
    assert [shared.share(part) for part in parts] == parts
    assert all(shared.share(copy.deepcopy(part)) is part for part in parts[:7])
    assert shared.share({"a": 10**5000}) is not shared.share({"a": 10**5000})  # no key: kept


def test_shared_parts_are_bounded() -> None:
    shared = SharedParts(limit=2)
    first = shared.share({"a": "1"})
    shared.share({"a": "2"})
    assert len(shared) == 2
    shared.share({"a": "3"})  # full: forgets the others
    assert len(shared) == 1
    assert shared.share({"a": "1"}) is not first


def test_a_malformed_pod_stays_malformed() -> None:
    for broken in (
        {"metadata": "x"},
        {"metadata": {"name": "p", "labels": {"a": 5}}},
        {"metadata": {"name": "p"}, "spec": {"containers": "x"}},
        {"metadata": {"name": "p"}, "status": {"conditions": [{"type": 5}, "x"]}},
        {"metadata": {"name": "p"}, "status": {"conditions": [{"type": "X", "status": 1}]}},
        [],
        "pod",
    ):
        kept = project_pod(copy.deepcopy(broken), SHARED)  # type: ignore[arg-type]
        assert kept == broken
        assert _readings(kept) == _readings(broken)


def _same_readings(raw: Any) -> None:
    """The readers answer the same on what the informer keeps of ``raw`` as on ``raw`` slim
    (a watch event's or a list item's object is always a JSON object: the informer refuses
    anything else before it keeps it)."""
    if not isinstance(raw, dict):
        return
    slim = slim_managed_fields(copy.deepcopy(raw))
    assert _readings(project_pod(copy.deepcopy(slim), SHARED)) == _readings(slim)
    assert _readings(project_pod(copy.deepcopy(slim))) == _readings(slim)


@fuzz()
@given(raw=mutated_json(SERVED[1]))
def test_every_reader_answers_the_same_on_a_fuzzed_served_pod(raw: Any) -> None:
    _same_readings(raw)


def _full_pod() -> dict[str, Any]:
    """A pod with every part the readers read (init containers, affinity, pod-level resources,
    overhead, a deletionTimestamp), so that fuzzing reaches each of them."""
    pod = served_pod(2, cost=-7)
    pod["metadata"]["deletionTimestamp"] = "2026-11-24T02:00:00Z"
    pod["spec"].update(
        priority=100,
        initContainers=[
            {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "5m"}}},
            {"name": "init", "resources": {"requests": {"memory": "1Gi"}}},
        ],
        overhead={"cpu": "10m"},
        resources={"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
        affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}},
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "zone"}
                ],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "podAffinityTerm": {
                            "labelSelector": {
                                "matchExpressions": [
                                    {"key": "app", "operator": "In", "values": ["web"]}
                                ]
                            },
                            "namespaces": ["bench"],
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ],
            },
        },
    )
    pod["status"]["initContainerStatuses"] = [
        {"name": "side", "restartCount": 4, "ready": True},
        {"name": "init", "restartCount": 1, "ready": False},
    ]
    return pod


FULL = _full_pod()


def test_the_full_pod_reads_the_same() -> None:
    assert _readings(_kept(FULL)) == _readings(_slim(FULL))
    assert "nodeAffinity" not in _kept(FULL)["spec"]["affinity"]


@fuzz()
@given(raw=mutated_json(FULL))
def test_every_reader_answers_the_same_on_a_fuzzed_full_pod(raw: Any) -> None:
    _same_readings(raw)


# --- the store and what is built from it ------------------------------------------------------


def _store(project: bool) -> Store:
    store = Store()
    for item in ITEMS:
        kind = item["kind"]
        obj = _kept(item) if project and kind == "Pod" else _slim(item)
        store.apply(kind, ChangeType.ADDED, obj)
    return store


WORKLOADS = [
    WorkloadKey(item["metadata"]["namespace"], item["kind"], item["metadata"]["name"])
    for item in ITEMS
    if item["kind"] in (DEPLOYMENT, REPLICASET)
]


@pytest.mark.parametrize("key", WORKLOADS, ids=str)
def test_a_snapshot_from_projected_pods_is_the_same(key: WorkloadKey) -> None:
    raw, projected = _store(False), _store(True)
    assert workload_snapshot(projected, key, taken_at=1.0) == workload_snapshot(
        raw, key, taken_at=1.0
    )


def test_the_stores_answer_the_same_about_every_pod() -> None:
    raw, projected = _store(False), _store(True)
    assert list(raw.keys("Pod")) == list(projected.keys("Pod"))
    for node in ("node-a1", "node-a2", "node-b1", "node-c1"):
        assert [object_key("Pod", p) for p in raw.indexes.pods_on_node(node)] == [
            object_key("Pod", p) for p in projected.indexes.pods_on_node(node)
        ]
    for pod, kept in zip(raw.objects("Pod"), projected.objects("Pod"), strict=True):
        assert workloads_of_pod(raw, pod) == workloads_of_pod(projected, kept)
        assert owning_workload(raw, pod) == owning_workload(projected, kept)


# --- the watcher's change filters on pairs of versions -----------------------------------------


def _podcost_cost(value: str) -> Callable[[dict[str, Any]], None]:
    def apply(pod: dict[str, Any]) -> None:
        served = served_pod(1, cost=0)
        pod["metadata"]["annotations"] = {DELETION_COST_ANNOTATION: value}
        pod["metadata"]["managedFields"] = served["metadata"]["managedFields"]

    return apply


EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "pod IP (read by nothing)": edit(("status", "podIP"), "10.9.9.9"),
    "restart count": edit(("status", "containerStatuses", 0, "restartCount"), 7),
    "not ready": edit(("status", "conditions", 1, "status"), "False"),
    "scheduled condition time (read by nothing)": edit(
        ("status", "conditions", 3, "lastTransitionTime"), "2026-11-24T09:00:00Z"
    ),
    "phase": edit(("status", "phase"), "Failed"),
    "label": edit(("metadata", "labels", "app"), "other"),
    "image (read by nothing)": edit(("spec", "containers", 0, "image"), "other:2"),
    "request": edit(("spec", "containers", 0, "resources", "requests", "cpu"), "20m"),
    "podcost's cost": _podcost_cost("3"),
    "deleted": edit(("metadata", "deletionTimestamp"), "2026-11-24T03:00:00Z"),
    "broken request": edit(("spec", "containers", 0, "resources", "requests", "cpu"), "x"),
}


@pytest.mark.parametrize("edit", list(EDITS), ids=str)
def test_the_change_filters_answer_the_same_on_projections(edit: str) -> None:
    old = served_pod(1)
    new = copy.deepcopy(old)
    EDITS[edit](new)
    new["metadata"]["resourceVersion"] = "999999"
    raw = (_slim(old), _slim(new))
    kept = (_kept(old), _kept(new))
    assert pod_change_matters(*kept) == pod_change_matters(*raw)
    assert pod_change_matters(*kept, adopt=ADOPT) == pod_change_matters(*raw, adopt=ADOPT)
    assert is_own_cost_write(*kept) == is_own_cost_write(*raw)


def test_podcost_s_cost_written_with_a_change_nothing_reads_is_its_own_write() -> None:
    """The one answer that differs, on purpose: podcost's cost write that comes in the same
    event as a change of a field nothing reads (the pod's IP) was a change that mattered (the
    workload was ranked again, to the same costs); on the projections it is podcost's own write,
    which touches nothing."""
    old = served_pod(1)
    new = copy.deepcopy(old)
    _podcost_cost("3")(new)
    new["status"]["podIP"] = "10.9.9.9"
    new["metadata"]["resourceVersion"] = "999999"
    assert not is_own_cost_write(_slim(old), _slim(new))
    assert is_own_cost_write(_kept(old), _kept(new))
    assert pod_from_json(_kept(new)) == pod_from_json(_slim(new))
