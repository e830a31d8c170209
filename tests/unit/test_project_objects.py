"""What the informer keeps of a node (``project_node``) and of a ReplicaSet or a Deployment
(``project_workload``) answers every reader as the object does.

For the nodes and workloads of the shop dump, kwok-like ones as the API server serves them
(``tests.support.served``) and fuzzed ones (``tests.support.fuzz``), each reader gives the same
answer on the projection as on the object slim: ``node_from_json`` (the same ``Node`` or the
same ``ConversionError`` up to a list index), the store's keys, ``workload_of_replicaset``, the
opt-in and policy, the rollout; the watcher's change filters answer the same on pairs of
versions (a heartbeat, a label, the allocatable resources, a template, the replicas...); and the
snapshots of every workload of a store of projected objects equal those of a store of the
objects slim.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from tests.support.fuzz import fuzz, mutated_json
from tests.support.served import (
    drop,
    edit,
    served_deployment,
    served_node,
    served_pod,
    served_replicaset,
)

from podcost_core.kubejson import WORKLOAD_ADAPTER, ConversionError, validate
from podcost_core.model import Resources
from podcost_core.projection import (
    SharedParts,
    project_node,
    project_pod,
    project_workload,
    slim_managed_fields,
    template_digest,
)
from podcost_core.rollout import rollout_from_json
from podcost_core.tomodel import node_from_json
from podcost_kube.snapshots import workload_snapshot
from podcost_kube.store import ChangeType, Store, object_key, resource_version
from podcost_kube.workloads import (
    DEPLOYMENT,
    REPLICASET,
    OptInRules,
    WorkloadKey,
    node_change_matters,
    opted_in_workloads,
    workload_change_matters,
    workload_of_replicaset,
    workload_policy,
)

DUMP: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "shop-dump.json").read_text(encoding="utf-8")
)
ITEMS: list[dict[str, Any]] = DUMP["items"]
SHARED = SharedParts()
NODES = [item for item in ITEMS if item["kind"] == "Node"] + [served_node(i) for i in range(3)]
WORKLOADS = [item for item in ITEMS if item["kind"] in (DEPLOYMENT, REPLICASET)] + [
    make(i) for i in range(2) for make in (served_deployment, served_replicaset)
]


def _outcome(read: Callable[[], object]) -> object:
    """What ``read()`` returns, or the error it raises (a ``ConversionError``'s message without
    list indices: the projection leaves out well-formed conditions)."""
    try:
        return ("ok", read())
    except ConversionError as error:
        return ("refused", re.sub(r"\.\d+(?=[.:])", ".N", str(error)))
    except Exception as error:  # a reader given what no API serves fails the same way
        return ("error", type(error).__name__)


def _slim(raw: Any) -> Any:
    return slim_managed_fields(copy.deepcopy(raw)) if isinstance(raw, dict) else raw


def _kept(raw: Any, shared: SharedParts | None = SHARED) -> Any:
    """What the informer keeps of ``raw`` (a copy), by its kind."""
    slim = _slim(raw)
    if isinstance(slim, dict) and slim.get("kind") == "Node":
        return project_node(slim, shared)
    return project_workload(slim, shared)


def _node_readings(raw: Any) -> list[object]:
    readers: list[Callable[[], object]] = [
        lambda: node_from_json(raw),
        lambda: node_from_json(raw, Resources(cpu_milli=5, pods=2)),
        lambda: object_key("Node", raw),
        lambda: resource_version(raw),
    ]
    return [_outcome(read) for read in readers]


def _workload_readings(raw: Any) -> list[object]:
    kind = raw.get("kind") if isinstance(raw, dict) else None
    readers: list[Callable[[], object]] = [
        lambda: validate(WORKLOAD_ADAPTER, raw, "workload") and None,
        lambda: workload_of_replicaset(raw),
        lambda: object_key(str(kind), raw),
        lambda: resource_version(raw),
        lambda: raw["spec"]["selector"],
        lambda: rollout_from_json(raw, [raw]),
    ]
    return [_outcome(read) for read in readers]


@pytest.mark.parametrize("raw", NODES, ids=lambda raw: raw["metadata"]["name"])
def test_every_reader_answers_the_same_on_a_projected_node(raw: dict[str, Any]) -> None:
    assert _node_readings(_kept(raw)) == _node_readings(_slim(raw))
    assert _node_readings(_kept(raw, None)) == _node_readings(_slim(raw))


@pytest.mark.parametrize("raw", WORKLOADS, ids=lambda raw: raw["metadata"]["name"])
def test_every_reader_answers_the_same_on_a_projected_workload(raw: dict[str, Any]) -> None:
    assert _workload_readings(_kept(raw)) == _workload_readings(_slim(raw))
    assert _workload_readings(_kept(raw, None)) == _workload_readings(_slim(raw))


def test_the_projection_keeps_only_what_podcost_reads() -> None:
    node = _kept(served_node(1))
    assert node["status"] == {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "30"}}
    assert node["metadata"] == _slim(served_node(1))["metadata"]
    assert node["spec"] == served_node(1)["spec"]
    deployment = _kept(served_deployment(1))
    assert isinstance(deployment["spec"]["template"], bytes)
    assert "conditions" not in deployment["status"]
    slim = _slim(served_deployment(1))
    del slim["spec"]["template"], deployment["spec"]["template"]
    del slim["status"]["conditions"]
    assert deployment == slim


def test_the_strings_of_labels_and_annotations_are_interned() -> None:
    for make in (served_node, served_deployment, served_replicaset):
        # Parsed as the informer parses them: every value a string of its own.
        one, two = (_kept(orjson.loads(orjson.dumps(make(i)))) for i in (1, 2))
        for field in ("labels", "annotations"):
            for name, value in one["metadata"][field].items():
                if two["metadata"][field].get(name) == value:
                    assert two["metadata"][field][name] is value, (make, name)
    malformed = {"kind": "Node", "metadata": {"name": "n", "labels": {"a": 1}}}
    assert _kept(malformed)["metadata"]["labels"] == {"a": 1}


def test_equal_parts_of_nodes_and_workloads_are_kept_once() -> None:
    shared = SharedParts()
    one, two = _kept(served_node(1), shared), _kept(served_node(4), shared)
    assert one["status"] is two["status"]
    assert one["metadata"]["annotations"] is not two["metadata"]["annotations"]  # not offered
    one, two = _kept(served_replicaset(1), shared), _kept(served_replicaset(2), shared)
    assert one["status"] is two["status"]
    one, two = _kept(served_deployment(1), shared), _kept(served_deployment(2), shared)
    assert one["spec"]["strategy"] is two["spec"]["strategy"]


def test_a_templates_digest_tells_templates_apart_and_not_key_orders() -> None:
    template = served_deployment(1)["spec"]["template"]
    reordered = dict(reversed(list(copy.deepcopy(template).items())))
    assert template_digest(template) == template_digest(reordered)
    assert template_digest(template) != template_digest(served_deployment(2)["spec"]["template"])
    changed = copy.deepcopy(template)
    changed["spec"]["containers"][0]["image"] = "registry.local/podcost/app:2"
    assert template_digest(template) != template_digest(changed)
    assert isinstance(template_digest({"a": 2**70}), dict)  # orjson cannot write it: kept


def test_malformed_objects_stay_malformed() -> None:
    for broken in (
        {"kind": "Node", "metadata": {"name": "n"}, "status": {"conditions": [{"type": 5}]}},
        {"kind": "Node", "metadata": {"name": "n"}, "status": {"conditions": "x"}},
        {"kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "x"}}},
        {"kind": "Node", "metadata": {"name": "n"}, "status": "x"},
        {"kind": "Node", "metadata": "x"},
    ):
        assert _node_readings(_kept(broken)) == _node_readings(_slim(broken))
    for broken in (
        {"kind": "ReplicaSet", "metadata": {"name": "r"}, "status": {"conditions": [{"type": 1}]}},
        {"kind": "ReplicaSet", "metadata": {"name": "r"}, "spec": {"replicas": "x"}},
        {"kind": "Deployment", "metadata": {"name": "d"}, "spec": "x", "status": ["x"]},
    ):
        kept = _kept(broken)
        assert kept == broken
        assert _workload_readings(kept) == _workload_readings(_slim(broken))


@fuzz(share=0.5)
@given(raw=mutated_json(served_node(2)))
def test_every_reader_answers_the_same_on_a_fuzzed_node(raw: Any) -> None:
    if isinstance(raw, dict):
        assert _node_readings(_kept(raw)) == _node_readings(_slim(raw))


@fuzz(share=0.5)
@given(raw=mutated_json(served_deployment(2)))
def test_every_reader_answers_the_same_on_a_fuzzed_workload(raw: Any) -> None:
    if isinstance(raw, dict):
        assert _workload_readings(_kept(raw)) == _workload_readings(_slim(raw))


# --- the store: snapshots and opt-in -------------------------------------------------------------


def _store(project: bool) -> Store:
    store = Store()
    shared = SharedParts()
    objects = [
        *ITEMS,
        *(served_node(i) for i in range(4)),
        *(make(i, namespace="bench") for i in range(2) for make in (served_deployment,)),
        *(served_replicaset(i, namespace="bench") for i in range(2)),
        *(
            served_pod(i, deployment=f"d{i % 2}", template_hash="5b6d7f8c9", nodes=4)
            for i in range(8)
        ),
    ]
    for item in objects:
        kind = item["kind"]
        if kind == "Pod":
            obj = project_pod(_slim(item), shared)
        elif project:
            obj = _kept(item, shared)
        else:
            obj = _slim(item)
        store.apply(kind, ChangeType.ADDED, obj)
    return store


def _workload_keys(store: Store) -> list[WorkloadKey]:
    return [
        WorkloadKey(key.namespace, key.kind, key.name)
        for kind in (DEPLOYMENT, REPLICASET)
        for key in store.keys(kind)
    ]


def test_a_snapshot_from_projected_objects_is_the_same() -> None:
    raw, projected = _store(False), _store(True)
    keys = _workload_keys(raw)
    assert keys == _workload_keys(projected)
    assert len(keys) >= 11
    for key in keys:
        expected = _outcome(lambda key=key: workload_snapshot(raw, key, taken_at=1.0))
        assert _outcome(lambda key=key: workload_snapshot(projected, key, taken_at=1.0)) == expected
        assert expected[0] == "ok"
        assert workload_policy(projected, key) == workload_policy(raw, key)
    for rules in (OptInRules(), OptInRules(default_enabled=True)):
        assert opted_in_workloads(projected, rules) == opted_in_workloads(raw, rules)


# --- the watcher's change filters on pairs of versions -------------------------------------------


NODE_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "heartbeat (read by nothing)": edit(
        ("status", "conditions", 0, "lastHeartbeatTime"), "2026-11-24T09:00:00Z"
    ),
    "not ready (read by nothing)": edit(("status", "conditions", 0, "status"), "False"),
    "node info (read by nothing)": edit(("status", "nodeInfo", "bootID"), "x"),
    "capacity (read by nothing)": edit(("status", "capacity", "cpu"), "64"),
    "allocatable": edit(("status", "allocatable", "cpu"), "16"),
    "broken condition": edit(("status", "conditions", 1, "status"), 3),
    "label": edit(("metadata", "labels", "type"), "other"),
    "taint": edit(("spec", "taints"), [{"key": "k", "effect": "NoSchedule"}]),
    "unschedulable": edit(("spec", "unschedulable"), True),
    "pod CIDR": edit(("spec", "podCIDR"), "10.9.0.0/24"),
}

WORKLOAD_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "status counts": edit(("status", "availableReplicas"), 3),
    "condition (read by nothing)": edit(("status", "conditions", 0, "status"), "False"),
    "broken condition": edit(("status", "conditions", 0, "type"), 7),
    "replicas": edit(("spec", "replicas"), 31),
    "image": edit(("spec", "template", "spec", "containers", 0, "image"), "app:2"),
    "template label": edit(("spec", "template", "metadata", "labels", "x"), "y"),
    "no template": drop(("spec", "template")),
    "strategy": edit(("spec", "strategy"), {"type": "Recreate"}),
    "annotation": edit(("metadata", "annotations", "podcost.dev/enabled"), "false"),
    "generation (noise)": edit(("metadata", "generation"), 2),
}


@pytest.mark.parametrize("edit", list(NODE_EDITS), ids=str)
def test_the_node_filter_answers_the_same_on_projections(edit: str) -> None:
    old = served_node(1)
    new = copy.deepcopy(old)
    NODE_EDITS[edit](new)
    new["metadata"]["resourceVersion"] = "999999"
    expected = node_change_matters(_slim(old), _slim(new))
    assert node_change_matters(_kept(old), _kept(new)) == expected
    assert node_change_matters(_kept(old, None), _kept(new, None)) == expected


@pytest.mark.parametrize("make", [served_deployment, served_replicaset], ids=["d", "rs"])
@pytest.mark.parametrize("edit", list(WORKLOAD_EDITS), ids=str)
def test_the_workload_filter_answers_the_same_on_projections(
    edit: str, make: Callable[[int], dict[str, Any]]
) -> None:
    old = make(1)
    if "conditions" not in old["status"]:
        old["status"]["conditions"] = served_deployment(1)["status"]["conditions"]
    new = copy.deepcopy(old)
    WORKLOAD_EDITS[edit](new)
    new["metadata"]["resourceVersion"] = "999999"
    expected = workload_change_matters(_slim(old), _slim(new))
    assert workload_change_matters(_kept(old), _kept(new)) == expected
    assert workload_change_matters(_kept(old, None), _kept(new, None)) == expected
