"""The converter: Kubernetes JSON read as the components that act on it read it."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podcost_core.kubejson import ConversionError, cost_managers, parse_time
from podcost_core.model import (
    DELETION_COST_ANNOTATION,
    AffinityTerm,
    CostOwner,
    Node,
    NodeName,
    Phase,
    Pod,
    PodUID,
    QoSClass,
    ReplicaSetInfo,
    Resources,
    Snapshot,
    Taint,
    Toleration,
    WorkloadRef,
)
from podcost_core.projection import slim_managed_fields
from podcost_core.quantities import (
    compute_qos,
    parse_quantity,
    pod_requests,
    quantity_milli,
    quantity_value,
)
from podcost_core.snapshots import (
    SNAPSHOT_ADAPTER,
    UnknownWorkload,
    load_objects,
    snapshot_for_workload,
)
from podcost_core.tomodel import invalid_deletion_cost, node_from_json, pod_from_json

DATA = Path(__file__).parent / "data"
T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z


def shop_dump() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / "shop-dump.json").read_text())
    return loaded


def raw_pod(**spec_status: Any) -> dict[str, Any]:
    """A minimal pod; keyword ``spec``/``status``/``metadata`` entries are merged in."""
    base: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "shop", "uid": "u-p"},
        "spec": {"containers": [{"name": "app"}]},
        "status": {"phase": "Running"},
    }
    for part, extra in spec_status.items():
        base[part] = {**base[part], **extra}
    return base


# --- quantities -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("1Gi", Fraction(2**30)),
        ("128974848", Fraction(128974848)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("12M", Fraction(12_000_000)),
        ("12E", Fraction(12 * 10**18)),  # a bare E is exa, not an exponent
        ("1.5Gi", Fraction(3 * 2**29)),
        ("100Ki", Fraction(102_400)),
        (".5", Fraction(1, 2)),
        ("0.1", Fraction(1, 10)),
        ("+3", Fraction(3)),
        ("-1", Fraction(-1)),
        ("5n", Fraction(5, 10**9)),
        ("7u", Fraction(7, 10**6)),
        ("3k", Fraction(3000)),
        ("2e-3", Fraction(2, 1000)),
        ("Gi", Fraction(0)),  # Go reads a quantity without digits as 0
        (".", Fraction(0)),
        (4, Fraction(4)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_quantities_parse_exactly(text: str | int | float, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1K", "1KB", "abc", "1 Gi", "1..5", "1e"])
def test_malformed_quantities_are_conversion_errors(text: str) -> None:
    with pytest.raises(ConversionError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "milli", "value"),
    [("500m", 500, 1), ("2", 2000, 2), ("1n", 1, 1), ("0.1m", 1, 1), ("1.5", 1500, 2)],
)
def test_milli_value_and_value_round_up_like_the_api(text: str, milli: int, value: int) -> None:
    assert quantity_milli(text) == milli
    assert quantity_value(text) == value


# --- times ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2024-05-01T12:00:00Z", T0),
        ("2024-05-01T12:00:00.999Z", T0),  # the API keeps whole seconds
        ("2024-05-01T14:00:00+02:00", T0),
        (None, None),
        ("", None),
    ],
)
def test_api_times_are_whole_posix_seconds(text: str | None, seconds: float | None) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["yesterday", "2024-05-01T12:00:00"])
def test_times_without_a_zone_or_a_date_are_conversion_errors(text: str) -> None:
    with pytest.raises(ConversionError):
        parse_time(text)


# --- pods -----------------------------------------------------------------------------------


def test_a_ready_pod_is_ready_since_its_ready_condition_changed() -> None:
    pod = pod_from_json(
        raw_pod(
            status={
                "phase": "Running",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "True",
                        "lastTransitionTime": "2024-05-01T11:00:00Z",
                    },
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastTransitionTime": "2024-05-01T12:00:00Z",
                    },
                ],
            }
        )
    )
    assert pod.ready
    assert pod.ready_since == T0


def test_a_pod_whose_ready_condition_is_false_is_not_ready_and_has_no_ready_time() -> None:
    conditions = [
        {"type": "Ready", "status": "False", "lastTransitionTime": "2024-05-01T12:00:00Z"}
    ]
    pod = pod_from_json(raw_pod(status={"phase": "Running", "conditions": conditions}))
    assert not pod.ready
    assert pod.ready_since is None


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("Running", Phase.RUNNING),
        ("Unknown", Phase.UNKNOWN),
        ("", Phase.PENDING),
        ("Odd", Phase.PENDING),
    ],
)
def test_phase_reads_like_the_controller_map_with_pending_as_the_zero_value(
    phase: str, expected: Phase
) -> None:
    assert pod_from_json(raw_pod(status={"phase": phase})).phase == expected


def test_restarts_are_the_max_of_regular_containers_and_of_sidecars_apart() -> None:
    pod = pod_from_json(
        raw_pod(
            spec={
                "containers": [{"name": "a"}, {"name": "b"}],
                "initContainers": [
                    {"name": "setup"},
                    {"name": "proxy", "restartPolicy": "Always"},
                    {"name": "log", "restartPolicy": "Always"},
                ],
            },
            status={
                "phase": "Running",
                "containerStatuses": [
                    {"name": "a", "restartCount": 2},
                    {"name": "b", "restartCount": 5},
                ],
                "initContainerStatuses": [
                    {"name": "setup", "restartCount": 9},  # a plain init container: ignored
                    {"name": "proxy", "restartCount": 3},
                    {"name": "log", "restartCount": 1},
                ],
            },
        )
    )
    assert (pod.restarts, pod.sidecar_restarts) == (5, 3)


def container(
    name: str,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    **extra: str,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": name, "resources": resources, **extra}


GUARANTEED = {"cpu": "1", "memory": "1Gi"}


@pytest.mark.parametrize(
    ("spec", "qos"),
    [
        ({"containers": [container("a")]}, QoSClass.BEST_EFFORT),
        ({"containers": [container("a", {"cpu": "100m"})]}, QoSClass.BURSTABLE),
        ({"containers": [container("a", GUARANTEED, GUARANTEED)]}, QoSClass.GUARANTEED),
        (
            {"containers": [container("a", GUARANTEED, GUARANTEED), container("b")]},
            QoSClass.BURSTABLE,
        ),
        (
            {
                "containers": [container("a", GUARANTEED, GUARANTEED)],
                "initContainers": [container("i", {"cpu": "1"}, {"cpu": "2", "memory": "1Gi"})],
            },
            QoSClass.BURSTABLE,
        ),
        (
            {"containers": [container("a", {"cpu": "0"}, {"ephemeral-storage": "1Gi"})]},
            QoSClass.BEST_EFFORT,  # zero and non-QoS resources do not count
        ),
        (
            {
                "containers": [container("a")],
                "resources": {"requests": GUARANTEED, "limits": GUARANTEED},
            },
            QoSClass.GUARANTEED,  # pod-level resources decide alone
        ),
    ],
)
def test_qos_is_computed_like_compute_pod_qos(spec: dict[str, Any], qos: QoSClass) -> None:
    assert compute_qos(spec) == qos  # type: ignore[arg-type]
    assert pod_from_json(raw_pod(spec=spec)).qos == qos


def test_qos_class_in_the_status_wins() -> None:
    assert pod_from_json(raw_pod(status={"qosClass": "Guaranteed"})).qos == QoSClass.GUARANTEED


def test_requests_add_containers_and_sidecars_and_take_the_init_peak() -> None:
    spec = {
        "containers": [container("a", {"cpu": "100m", "memory": "64Mi"})],
        "initContainers": [
            container("proxy", {"cpu": "50m"}, restartPolicy="Always"),
            container("migrate", {"cpu": "1", "memory": "16Mi"}),
        ],
        "overhead": {"cpu": "10m"},
    }
    assert pod_from_json(raw_pod(spec=spec)).requests == Resources(
        cpu_milli=1060, memory_bytes=64 * 2**20, pods=1
    )


def _reference_requests(spec: dict[str, Any]) -> Resources:
    """``resourcehelper.PodRequests`` written plainly, every amount a ``Fraction`` from zero:
    what ``pod_requests`` computes with fewer operations."""
    total: dict[str, Fraction] = {}

    def add(into: dict[str, Fraction], resources: dict[str, str]) -> None:
        for name, amount in resources.items():
            into[name] = into.get(name, Fraction(0)) + parse_quantity(amount)

    def peak(into: dict[str, Fraction], resources: dict[str, Fraction]) -> None:
        for name, amount in resources.items():
            into[name] = max(into.get(name, Fraction(0)), amount)

    for each in spec.get("containers", []):
        add(total, each.get("resources", {}).get("requests", {}))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for each in spec.get("initContainers", []):
        requests = each.get("resources", {}).get("requests", {})
        if each.get("restartPolicy") == "Always":
            add(sidecars, requests)
            peak(init_peak, sidecars)
        else:
            during = dict(sidecars)
            add(during, requests)
            peak(init_peak, during)
    for name, amount in sidecars.items():
        total[name] = total.get(name, Fraction(0)) + amount
    peak(total, init_peak)
    for name in ("cpu", "memory"):
        if name in spec.get("resources", {}).get("requests", {}):
            total[name] = parse_quantity(spec["resources"]["requests"][name])
    add(total, spec.get("overhead", {}))
    return Resources(
        cpu_milli=math.ceil(total.get("cpu", Fraction(0)) * 1000),
        memory_bytes=math.ceil(total.get("memory", Fraction(0))),
        pods=1,
    )


_AMOUNTS = st.sampled_from(
    ["0", "1", "250m", "1500m", "0.5", "-100m", "1e3", "3n", "512Mi", "1Gi", "1.5Ki", "7", "2E-3"]
)
_REQUESTS = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), _AMOUNTS)


@given(
    containers=st.lists(_REQUESTS, max_size=3),
    inits=st.lists(st.tuples(_REQUESTS, st.booleans()), max_size=3),
    pod_level=st.none() | _REQUESTS,
    overhead=st.none() | _REQUESTS,
)
def test_requests_sum_as_the_scheduler_does(
    containers: list[dict[str, str]],
    inits: list[tuple[dict[str, str], bool]],
    pod_level: dict[str, str] | None,
    overhead: dict[str, str] | None,
) -> None:
    sidecar = {"restartPolicy": "Always"}
    spec: dict[str, Any] = {
        "containers": [
            {"name": f"c{i}", "resources": {"requests": r}} for i, r in enumerate(containers)
        ],
        "initContainers": [
            {"name": f"i{i}", "resources": {"requests": r}, **(sidecar if always else {})}
            for i, (r, always) in enumerate(inits)
        ],
    }
    if pod_level is not None:
        spec["resources"] = {"requests": pod_level}
    if overhead is not None:
        spec["overhead"] = overhead
    assert pod_requests(spec) == _reference_requests(spec)


@pytest.mark.parametrize(
    ("annotation", "cost", "owner"),
    [
        (None, 0, CostOwner.NONE),
        ("17", 17, CostOwner.OTHER),
        ("+17", 0, CostOwner.OTHER),  # invalid: the controller reads 0
        ("-2147483648", -2147483648, CostOwner.OTHER),
    ],
)
def test_the_deletion_cost_is_parsed_as_the_controller_parses_it(
    annotation: str | None, cost: int, owner: CostOwner
) -> None:
    meta: dict[str, Any] = {}
    if annotation is not None:
        meta["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": annotation}
    pod = pod_from_json(raw_pod(metadata=meta))
    assert (pod.deletion_cost, pod.deletion_cost_raw, pod.cost_owner) == (cost, annotation, owner)


def managed(manager: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"manager": manager, "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": fields}


COST_FIELDS = {
    "f:metadata": {"f:annotations": {"f:controller.kubernetes.io/pod-deletion-cost": {}}}
}


@pytest.mark.parametrize(
    ("entries", "owner"),
    [
        ([managed("podcost", COST_FIELDS)], CostOwner.PODCOST),
        ([managed("kubectl-annotate", COST_FIELDS)], CostOwner.OTHER),
        ([managed("podcost", {"f:metadata": {"f:labels": {}}})], CostOwner.OTHER),
        ([managed("kubectl", COST_FIELDS), managed("podcost", COST_FIELDS)], CostOwner.PODCOST),
    ],
)
def test_podcost_owns_the_cost_when_its_field_manager_does(
    entries: list[dict[str, Any]], owner: CostOwner
) -> None:
    meta = {
        "annotations": {"controller.kubernetes.io/pod-deletion-cost": "3"},
        "managedFields": entries,
    }
    assert pod_from_json(raw_pod(metadata=meta)).cost_owner == owner


@pytest.mark.parametrize(
    ("entries", "adopt", "owner"),
    [
        ([managed("manager", COST_FIELDS)], (), CostOwner.OTHER),
        ([managed("manager", COST_FIELDS)], ("manager",), CostOwner.PODCOST),
        ([managed("kubectl-annotate", COST_FIELDS)], ("manager",), CostOwner.OTHER),
        ([managed("podcost", COST_FIELDS)], ("manager",), CostOwner.PODCOST),
        ([], ("manager",), CostOwner.OTHER),
    ],
)
def test_a_cost_an_adopted_field_manager_set_counts_as_podcosts_own(
    entries: list[dict[str, Any]], adopt: tuple[str, ...], owner: CostOwner
) -> None:
    meta = {
        "annotations": {"controller.kubernetes.io/pod-deletion-cost": "2147483647"},
        "managedFields": entries,
    }
    assert pod_from_json(raw_pod(metadata=meta), adopt=adopt).cost_owner == owner


def test_cost_managers_names_every_manager_of_the_cost_and_none_without_managed_fields() -> None:
    meta: Any = {
        "annotations": {"controller.kubernetes.io/pod-deletion-cost": "1"},
        "managedFields": [
            managed("kube-controller-manager", {"f:metadata": {"f:labels": {}}}),
            managed("manager", COST_FIELDS),
            managed("kubectl-annotate", COST_FIELDS),
        ],
    }
    assert cost_managers(meta) == ("manager", "kubectl-annotate")
    assert cost_managers({"annotations": meta["annotations"]}) == ()


def test_priority_tolerations_owner_node_and_deletion_are_read() -> None:
    pod = pod_from_json(
        raw_pod(
            metadata={
                "deletionTimestamp": "2024-05-01T12:00:00Z",
                "ownerReferences": [
                    {"kind": "Node", "name": "n", "uid": "u-n"},
                    {"kind": "ReplicaSet", "name": "web-1", "uid": "u-rs", "controller": True},
                ],
            },
            spec={
                "nodeName": "n1",
                "priority": 1000,
                "tolerations": [{"key": "k", "effect": "NoSchedule"}, {"operator": "Exists"}],
            },
        )
    )
    assert (pod.node, pod.priority, pod.replicaset, pod.owner_uid) == ("n1", 1000, "web-1", "u-rs")
    assert pod.deleting
    assert not pod.active
    assert pod.tolerations == (
        Toleration(key="k", effect="NoSchedule"),
        Toleration(operator="Exists"),
    )


def test_anti_affinity_terms_are_reduced_to_labels() -> None:
    selector = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe"]}],
    }
    spec = {
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"},
                    {"topologyKey": "zone"},  # no selector: matches no pod, dropped
                ],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 40,
                        "podAffinityTerm": {
                            "labelSelector": {
                                "matchExpressions": [
                                    {"key": "app", "operator": "NotIn", "values": ["db"]}
                                ]
                            },
                            "topologyKey": "zone",
                        },
                    },
                    {
                        "weight": 10,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"app": "web"}},
                            "topologyKey": "zone",
                            "namespaces": ["other"],
                        },
                    },
                ],
            }
        }
    }
    assert pod_from_json(raw_pod(spec=spec)).anti_affinity == (
        AffinityTerm("kubernetes.io/hostname", {"app": "web", "tier": "fe"}),
        AffinityTerm("zone", {}, weight=40, exact=False),
        AffinityTerm("zone", {"app": "web"}, weight=10, exact=False),
    )


@pytest.mark.parametrize(
    "broken",
    [
        {"metadata": {"name": "p"}, "spec": {"containers": "nope"}},
        {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"restartCount": "many"}]}},
        {"metadata": {"name": "p", "labels": ["a"]}},
        {"metadata": {}},
    ],
)
def test_malformed_pods_are_conversion_errors(broken: dict[str, Any]) -> None:
    with pytest.raises(ConversionError):
        pod_from_json(broken)


def test_a_node_reads_labels_taints_and_allocatable() -> None:
    node = node_from_json(
        {
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": {
                "taints": [{"key": "spot", "value": "yes", "effect": "PreferNoSchedule"}],
                "unschedulable": True,
            },
            "status": {"allocatable": {"cpu": "3920m", "memory": "15Gi", "pods": "110"}},
        }
    )
    assert node == Node(
        name=NodeName("n1"),
        labels={"zone": "a"},
        taints=(Taint("spot", "PreferNoSchedule", "yes"),),
        allocatable=Resources(cpu_milli=3920, memory_bytes=15 * 2**30, pods=110),
        unschedulable=True,
    )


# --- snapshots ------------------------------------------------------------------------------


def test_a_deployment_snapshot_holds_the_active_pods_of_all_its_replicasets() -> None:
    snapshot = snapshot_for_workload(shop_dump(), "shop", "web")
    assert snapshot.workload == WorkloadRef("local", "shop", "Deployment", "web", "d-web")
    assert [pod.name for pod in snapshot.pods] == [f"web-5d8f7-{c * 5}" for c in "abcdef"]
    assert snapshot.replicas == 6
    assert snapshot.annotations == {"podcost.dev/enabled": "true"}
    assert snapshot.replicasets == {
        "web-4c2a1": ReplicaSetInfo("web-4c2a1", "rs-web-4c2a1", 0, "d-web", T0 - 3600),
        "web-5d8f7": ReplicaSetInfo("web-5d8f7", "rs-web-5d8f7", 6, "d-web", T0),
    }
    assert snapshot.bystanders == ()
    assert snapshot.taken_at == T0 + 7000  # the newest time in the dump


def test_the_snapshot_carries_the_nodes_with_every_active_pods_requests() -> None:
    snapshot = snapshot_for_workload(shop_dump(), "shop", "web")
    assert sorted(snapshot.nodes) == ["node-a1", "node-a2", "node-b1", "node-c1"]
    # node-a1 runs web aaaaa and bbbbb, batch-x and api-new-1: four pods of 250m.
    assert snapshot.nodes["node-a1"].requested == Resources(1000, 4 * 256 * 2**20, 4)
    assert snapshot.nodes["node-a1"].labels["topology.kubernetes.io/zone"] == "zone-a"


def test_inactive_pods_are_left_out_unless_asked_for() -> None:
    snapshot = snapshot_for_workload(shop_dump(), "shop", "web", include_inactive=True)
    assert "web-4c2a1-zzzzz" in [pod.name for pod in snapshot.pods]


def test_a_replicaset_without_owner_relates_no_bystander() -> None:
    snapshot = snapshot_for_workload(shop_dump(), "shop", "batch")
    assert snapshot.workload.kind == "ReplicaSet"
    assert snapshot.replicasets["batch"].controller_uid is None
    assert len(snapshot.pods) == 3


def test_an_owned_replicaset_sees_its_siblings_pods_as_bystanders() -> None:
    snapshot = snapshot_for_workload(shop_dump(), "shop", "api-new", kind="ReplicaSet")
    assert [pod.name for pod in snapshot.pods] == ["api-new-1", "api-new-2"]
    assert sorted(snapshot.replicasets) == ["api-new", "api-old"]
    assert [pod.name for pod in snapshot.bystanders] == ["api-old-1"]


def _extra_pod(name: str, labels: dict[str, str], owner: dict[str, Any] | None) -> dict[str, Any]:
    pod = raw_pod(
        metadata={"name": name, "uid": f"u-{name}", "labels": labels}, spec={"nodeName": "node-c1"}
    )
    if owner is not None:
        pod["metadata"]["ownerReferences"] = [owner]
    return pod


def test_an_orphan_matching_a_replicaset_is_adopted_and_a_foreign_match_is_a_bystander() -> None:
    labels = {"app": "web", "pod-template-hash": "5d8f7"}
    job = {"kind": "Job", "name": "j", "uid": "u-j", "controller": True}
    dump = shop_dump()
    dump["items"] += [_extra_pod("orphan", labels, None), _extra_pod("stray", labels, job)]
    snapshot = snapshot_for_workload(dump, "shop", "web")
    adopted = next(pod for pod in snapshot.pods if pod.name == "orphan")
    assert (adopted.replicaset, adopted.owner_uid) == ("web-5d8f7", "rs-web-5d8f7")
    assert [pod.name for pod in snapshot.bystanders] == ["stray"]


def test_daemonset_and_mirror_pods_on_a_node_are_counted_apart() -> None:
    daemon = {"kind": "DaemonSet", "name": "proxy", "uid": "u-ds", "controller": True}
    mirror = _extra_pod("etcd-node-c1", {}, None)
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    dump = shop_dump()
    before = snapshot_for_workload(dump, "shop", "web").nodes["node-c1"]
    dump["items"] += [_extra_pod("proxy-1", {}, daemon), mirror]
    after = snapshot_for_workload(dump, "shop", "web").nodes["node-c1"]
    assert (before.daemon_pods, after.daemon_pods) == (0, 2)
    assert after.requested.pods == before.requested.pods + 2


def test_typed_lists_and_several_dumps_are_read_alike() -> None:
    items = shop_dump()["items"]
    pods = {
        "kind": "PodList",
        "items": [{k: v for k, v in i.items() if k != "kind"} for i in items if i["kind"] == "Pod"],
    }
    rest = {"kind": "List", "items": [i for i in items if i["kind"] != "Pod"]}
    split = snapshot_for_workload([pods, rest], "shop", "web")
    assert split == snapshot_for_workload(shop_dump(), "shop", "web")


@pytest.mark.parametrize(
    ("namespace", "name", "kind"),
    [
        ("shop", "nope", None),
        ("other", "web", None),
        ("shop", "web", "ReplicaSet"),
        ("shop", "web", "Job"),
    ],
)
def test_an_unknown_workload_is_named(namespace: str, name: str, kind: str | None) -> None:
    with pytest.raises(UnknownWorkload):
        snapshot_for_workload(shop_dump(), namespace, name, kind=kind)


@pytest.mark.parametrize("document", [{"kind": "List", "items": 3}, {"kind": "List", "items": [5]}])
def test_a_malformed_list_is_a_conversion_error(document: dict[str, Any]) -> None:
    with pytest.raises(ConversionError):
        load_objects(document)


# --- serialisation --------------------------------------------------------------------------


def test_a_snapshot_round_trips_through_json() -> None:
    snapshot = snapshot_for_workload(shop_dump(), "shop", "web")
    assert SNAPSHOT_ADAPTER.validate_json(SNAPSHOT_ADAPTER.dump_json(snapshot)) == snapshot


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
times = st.none() | st.integers(0, 2**33).map(float)

pods = st.builds(
    Pod,
    uid=text.map(PodUID),
    name=text,
    namespace=text,
    node=st.none() | text.map(NodeName),
    phase=st.sampled_from(Phase),
    ready=st.booleans(),
    ready_since=times,
    created=times,
    replicaset=st.none() | text,
    restarts=st.integers(0, 10**6),
    sidecar_restarts=st.integers(0, 10**6),
    priority=st.integers(-(2**31), 2**31 - 1),
    qos=st.sampled_from(QoSClass),
    tolerations=st.lists(
        st.builds(Toleration, key=text, operator=st.sampled_from(["Equal", "Exists"])), max_size=2
    ).map(tuple),
    labels=st.dictionaries(text, text, max_size=3),
    annotations=st.dictionaries(text, text, max_size=3),
    deletion_cost=st.integers(-(2**31), 2**31 - 1),
    cost_owner=st.sampled_from(CostOwner),
    deleting=st.booleans(),
    anti_affinity=st.lists(
        st.builds(
            AffinityTerm, topology_key=text, match_labels=st.dictionaries(text, text, max_size=2)
        ),
        max_size=2,
    ).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(pods, max_size=4).map(tuple),
    st.dictionaries(
        text,
        st.builds(
            Node,
            name=text.map(NodeName),
            taints=st.lists(st.builds(Taint, key=text, effect=text), max_size=2).map(tuple),
        ),
        max_size=3,
    ),
    st.lists(pods, max_size=2).map(tuple),
)
def test_any_snapshot_round_trips_through_json(
    pod_list: tuple[Pod, ...], nodes: dict[str, Node], bystanders: tuple[Pod, ...]
) -> None:
    snapshot = Snapshot(
        workload=WorkloadRef("c", "ns", "Deployment", "web"),
        pods=pod_list,
        nodes=nodes,
        replicasets={"rs": ReplicaSetInfo("rs", controller_uid="u")},
        bystanders=bystanders,
        taken_at=T0,
    )
    assert SNAPSHOT_ADAPTER.validate_json(SNAPSHOT_ADAPTER.dump_json(snapshot)) == snapshot
    assert (
        SNAPSHOT_ADAPTER.validate_python(SNAPSHOT_ADAPTER.dump_python(snapshot, mode="json"))
        == snapshot
    )


def test_a_pod_whose_labels_left_the_selector_is_released_from_its_replicaset() -> None:
    dump = shop_dump()
    released = next(i for i in dump["items"] if i["metadata"]["name"] == "web-5d8f7-aaaaa")
    released["metadata"]["labels"] = {"app": "web-debug"}
    snapshot = snapshot_for_workload(dump, "shop", "web")
    assert "web-5d8f7-aaaaa" not in [pod.name for pod in snapshot.pods]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, None),
        ("12", None),
        ("-007", None),  # the controller reads -7
        ("abc", "invalid value 'abc'"),
        ("2147483648", "value out of int32 range '2147483648'"),
        ("+1", "invalid value '+1'"),
    ],
)
def test_an_invalid_deletion_cost_is_a_fact_of_the_pod_not_an_error(
    value: str | None, problem: str | None
) -> None:
    annotations = {} if value is None else {DELETION_COST_ANNOTATION: value}
    pod = pod_from_json(
        {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": annotations}}
    )
    assert invalid_deletion_cost(pod) == problem
    assert pod.deletion_cost == (int(value) if problem is None and value else 0)


LABELS_FIELDS = {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:x": {}}}


@pytest.mark.parametrize(
    "entries",
    [
        [],
        [managed("kube-controller-manager", LABELS_FIELDS)],
        [managed("kube-controller-manager", LABELS_FIELDS), managed("podcost", COST_FIELDS)],
        [
            managed("kubectl", COST_FIELDS),
            managed("kwok", LABELS_FIELDS),
            managed("manager", COST_FIELDS),
        ],
        [managed("podcost", COST_FIELDS), managed("podcost", COST_FIELDS)],
    ],
)
def test_slimmed_managed_fields_keep_exactly_who_owns_the_cost_and_nothing_else(
    entries: list[dict[str, Any]],
) -> None:
    annotations = {"controller.kubernetes.io/pod-deletion-cost": "3"}
    meta: dict[str, Any] = {"name": "p", "annotations": annotations, "managedFields": entries}
    pod = raw_pod(metadata=meta)
    before = (
        cost_managers(meta),
        pod_from_json(pod).cost_owner,
        pod_from_json(pod, adopt={"manager"}).cost_owner,
    )
    slim = slim_managed_fields(pod)
    assert slim is pod
    after = (
        cost_managers(pod["metadata"]),
        pod_from_json(pod).cost_owner,
        pod_from_json(pod, adopt={"manager"}).cost_owner,
    )
    assert after == before
    kept = pod["metadata"].get("managedFields")
    assert kept is None if not before[0] else [e["manager"] for e in kept] == list(before[0])
    assert "kube-controller-manager" not in json.dumps(pod)  # nothing of the other entries
    assert pod["metadata"]["annotations"] == annotations
    assert pod["metadata"]["name"] == "p"


@pytest.mark.parametrize("entries", [None, "x", [1, 2], {"manager": "podcost"}])
def test_managed_fields_the_api_would_never_serve_are_left_alone(entries: object) -> None:
    obj: dict[str, Any] = {"metadata": {"managedFields": entries}}
    assert slim_managed_fields(obj) == {"metadata": {"managedFields": entries}}
    assert slim_managed_fields({"metadata": "x"}) == {"metadata": "x"}
    assert slim_managed_fields({}) == {}
