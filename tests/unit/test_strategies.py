"""What every scoring strategy prefers, pod against pod (topology-spread has its own module)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.support.pods import NOW, pod

from podcost_core.model import (
    AffinityTerm,
    Node,
    NodeName,
    Phase,
    Pod,
    PodUID,
    QoSClass,
    Resources,
    Snapshot,
    Taint,
    Toleration,
    WorkloadRef,
)
from podcost_core.strategies import (
    age,
    capacity_type,
    co_location,
    karpenter,
    node_consolidation,
    priority_qos,
    untolerated_taints,
    work_in_progress,
)
from podcost_core.strategies.base import active_pods, node_lookup, scores_by_uid

ZONE = "topology.kubernetes.io/zone"


def node(name: str, **fields: object) -> Node:
    return Node(NodeName(name), **fields)  # type: ignore[arg-type]


def snap(
    *pods: Pod, nodes: tuple[Node, ...] = (), taken_at: float = NOW, **more: object
) -> Snapshot:
    return Snapshot(
        WorkloadRef("c", "shop", "Deployment", "web"),
        tuple(pods),
        {n.name: n for n in nodes},
        taken_at=taken_at,
        **more,  # type: ignore[arg-type]
    )


def by_name(snapshot: Snapshot, scores: dict[PodUID, float]) -> dict[str, float]:
    return {p.name: scores[p.uid] for p in snapshot.pods}


# --- capacity-type -----------------------------------------------------------------------------


@pytest.mark.parametrize(("label", "value"), capacity_type.SPOT_LABELS)
def test_capacity_type_deletes_pods_on_every_known_kind_of_spot_node_first(
    label: str, value: str
) -> None:
    s = snap(
        pod("spot", node="n1"),
        pod("regular", node="n2"),
        nodes=(node("n1", labels={label: value}), node("n2", labels={label: "on-demand"})),
    )
    scores = by_name(s, capacity_type.score(s, capacity_type.Args()))
    assert scores["spot"] < scores["regular"]


def test_capacity_type_deletes_pods_on_the_most_expensive_pay_as_you_go_node_first() -> None:
    price = capacity_type.DEFAULT_PRICE_ANNOTATION
    s = snap(
        pod("dear", node="n1"),
        pod("cheap", node="n2"),
        pod("reserved", node="n3"),
        pod("spot", node="n4"),
        nodes=(
            node("n1", annotations={price: "2.0"}),
            node("n2", annotations={price: "0.5"}),
            node("n3"),
            node("n4", labels={"karpenter.sh/capacity-type": "spot"}, annotations={price: "0.1"}),
        ),
    )
    scores = by_name(s, capacity_type.score(s, capacity_type.Args()))
    assert scores["spot"] < scores["dear"] < scores["cheap"] < scores["reserved"]
    assert scores == {"spot": 0.95, "dear": 2.0, "cheap": 2.75, "reserved": 3.0}


@pytest.mark.parametrize("bad", ["", "free", "-3", "nan", "inf", "0"])
def test_capacity_type_treats_an_invalid_price_as_already_paid_for(bad: str) -> None:
    price = capacity_type.DEFAULT_PRICE_ANNOTATION
    s = snap(
        pod("odd", node="n1"),
        pod("reserved", node="n2"),
        nodes=(node("n1", annotations={price: bad}), node("n2")),
    )
    scores = by_name(s, capacity_type.score(s, capacity_type.Args()))
    assert scores["odd"] == scores["reserved"] == 3.0


def test_capacity_type_takes_a_custom_label_and_value_for_spot_like_nodes() -> None:
    s = snap(
        pod("preemptible", node="n1"),
        pod("other-pool", node="n2"),
        pod("unlabelled", node="n3"),
        nodes=(
            node("n1", labels={"acme.io/pool": "cheap"}),
            node("n2", labels={"acme.io/pool": "steady"}),
            node("n3"),
        ),
    )
    with_value = by_name(s, capacity_type.score(s, capacity_type.Args("acme.io/pool", "cheap")))
    assert with_value == {"preemptible": 1.0, "other-pool": 3.0, "unlabelled": 3.0}
    any_value = by_name(s, capacity_type.score(s, capacity_type.Args(label="acme.io/pool")))
    assert any_value == {"preemptible": 1.0, "other-pool": 1.0, "unlabelled": 3.0}


def test_capacity_type_can_ignore_the_cloud_providers_labels_and_prices() -> None:
    s = snap(
        pod("spot", node="n1"),
        nodes=(node("n1", labels={"cloud.google.com/gke-spot": "true"}, annotations={"p": "1"}),),
    )
    args = capacity_type.Args(known_labels=False, price_annotation="")
    assert by_name(s, capacity_type.score(s, args)) == {"spot": 3.0}


def test_capacity_type_gives_unscheduled_pods_and_unknown_nodes_the_neutral_score() -> None:
    s = snap(pod("pending", node=None, phase=Phase.PENDING), pod("lost", node="gone"))
    assert by_name(s, capacity_type.score(s, capacity_type.Args())) == {
        "pending": 3.0,
        "lost": 3.0,
    }


# --- untolerated-taints ------------------------------------------------------------------------

PREFER = Taint("maintenance", "PreferNoSchedule")
NO_SCHEDULE = Taint("dedicated", "NoSchedule", "gpu")
NO_EXECUTE = Taint("node.kubernetes.io/unreachable", "NoExecute")


@pytest.mark.parametrize(
    ("taints", "tolerations", "effects", "expected"),
    [
        pytest.param((), (), untolerated_taints.EFFECTS, 0.0, id="clean node"),
        pytest.param((PREFER,), (), untolerated_taints.EFFECTS, -1.0, id="prefer-no-schedule"),
        pytest.param(
            (PREFER, NO_SCHEDULE, NO_EXECUTE), (), untolerated_taints.EFFECTS, -3.0, id="three"
        ),
        pytest.param(
            (PREFER, NO_SCHEDULE),
            (Toleration("maintenance", "Exists"),),
            untolerated_taints.EFFECTS,
            -1.0,
            id="one tolerated",
        ),
        pytest.param(
            (NO_SCHEDULE,),
            (Toleration("dedicated", "Equal", "cpu", "NoSchedule"),),
            untolerated_taints.EFFECTS,
            -1.0,
            id="wrong value",
        ),
        pytest.param(
            (PREFER, NO_SCHEDULE, NO_EXECUTE),
            (Toleration(operator="Exists"),),
            untolerated_taints.EFFECTS,
            0.0,
            id="tolerates everything",
        ),
        pytest.param(
            (PREFER, NO_SCHEDULE), (), ("PreferNoSchedule",), -1.0, id="only counted effects"
        ),
        pytest.param((Taint("x", "Bogus"),), (), untolerated_taints.EFFECTS, 0.0, id="odd"),
    ],
)
def test_untolerated_taints_counts_the_taints_a_pod_does_not_tolerate(
    taints: tuple[Taint, ...],
    tolerations: tuple[Toleration, ...],
    effects: tuple[str, ...],
    expected: float,
) -> None:
    s = snap(pod("web", node="n1", tolerations=tolerations), nodes=(node("n1", taints=taints),))
    args = untolerated_taints.Args(effects=effects)
    assert by_name(s, untolerated_taints.score(s, args)) == {"web": expected}


def test_untolerated_taints_scores_unscheduled_and_unknown_node_pods_zero() -> None:
    s = snap(pod("pending", node=None, phase=Phase.PENDING), pod("lost", node="gone"))
    scores = untolerated_taints.score(s, untolerated_taints.Args())
    assert by_name(s, scores) == {"pending": 0.0, "lost": 0.0}


# --- priority-qos ------------------------------------------------------------------------------


def test_priority_qos_deletes_lower_priority_first_and_then_by_qos_class() -> None:
    s = snap(
        pod("low-guaranteed", priority=-10, qos=QoSClass.GUARANTEED),
        pod("mid-besteffort", priority=0, qos=QoSClass.BEST_EFFORT),
        pod("mid-burstable", priority=0, qos=QoSClass.BURSTABLE),
        pod("mid-guaranteed", priority=0, qos=QoSClass.GUARANTEED),
        pod("high-besteffort", priority=2_000_000_000, qos=QoSClass.BEST_EFFORT),
    )
    scores = by_name(s, priority_qos.score(s, priority_qos.Args()))
    assert sorted(scores, key=scores.__getitem__) == [
        "low-guaranteed",
        "mid-besteffort",
        "mid-burstable",
        "mid-guaranteed",
        "high-besteffort",
    ]
    # Ranks, not raw priorities: the QoS step stays visible next to a 2e9 priority gap.
    assert scores == {
        "low-guaranteed": 2.0,
        "mid-besteffort": 3.0,
        "mid-burstable": 4.0,
        "mid-guaranteed": 5.0,
        "high-besteffort": 6.0,
    }


def test_priority_qos_without_qos_ties_equal_priorities() -> None:
    s = snap(pod("a", qos=QoSClass.BEST_EFFORT), pod("b", qos=QoSClass.GUARANTEED))
    assert by_name(s, priority_qos.score(s, priority_qos.Args(qos=False))) == {"a": 0, "b": 0}


# --- age ---------------------------------------------------------------------------------------


def test_age_deletes_the_youngest_first_and_ties_pods_past_the_saturation() -> None:
    s = snap(
        pod("new", ready_since=NOW - 60),
        pod("hour", ready_since=NOW - 3600),
        pod("week", ready_since=NOW - 7 * 86_400, created=NOW - 8 * 86_400),
        pod("month", ready_since=NOW - 30 * 86_400, created=NOW - 31 * 86_400),
    )
    scores = by_name(s, age.score(s, age.Args()))
    assert scores == {"new": 60.0, "hour": 3600.0, "week": age.DAY, "month": age.DAY}


def test_age_older_first_reverses_the_order() -> None:
    s = snap(pod("new", ready_since=NOW - 60), pod("old", ready_since=NOW - 7200))
    args = age.Args(direction="older-first", saturation_seconds=3600)
    assert by_name(s, age.score(s, args)) == {"new": 3540.0, "old": 0.0}


def test_age_counts_from_creation_when_a_pod_is_not_ready_or_when_asked() -> None:
    s = snap(
        pod("not-ready", ready=False, created=NOW - 100),
        pod("ready", ready_since=NOW - 10, created=NOW - 100),
    )
    assert by_name(s, age.score(s, age.Args())) == {"not-ready": 100.0, "ready": 10.0}
    assert by_name(s, age.score(s, age.Args(since="created"))) == {
        "not-ready": 100.0,
        "ready": 100.0,
    }


def test_age_is_zero_without_timestamps_in_the_future_or_without_a_clock() -> None:
    s = snap(
        pod("unknown", ready_since=None, created=None),
        pod("future", ready_since=NOW + 50, created=NOW + 10),
    )
    assert by_name(s, age.score(s, age.Args())) == {"unknown": 0.0, "future": 0.0}
    clockless = replace(s, taken_at=0.0)
    assert set(by_name(clockless, age.score(clockless, age.Args())).values()) == {0.0}


# --- work-in-progress --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("12", 12.0),
        (" 2.5 ", 2.5),
        ("-1", -1.0),
        ("busy", 0.0),
        ("", 0.0),
        ("nan", 0.0),
        ("inf", 0.0),
        ("1e999", 0.0),
        (None, 0.0),
    ],
)
def test_work_in_progress_reads_the_pods_own_number_and_treats_garbage_as_idle(
    value: str | None, expected: float
) -> None:
    annotations = {} if value is None else {work_in_progress.DEFAULT_ANNOTATION: value}
    s = snap(replace(pod("worker"), annotations=annotations))
    scores = work_in_progress.score(s, work_in_progress.Args())
    assert by_name(s, scores) == {"worker": expected}


def test_work_in_progress_reads_a_custom_annotation() -> None:
    s = snap(replace(pod("worker"), annotations={"acme.io/jobs": "3"}))
    args = work_in_progress.Args(annotation="acme.io/jobs")
    assert by_name(s, work_in_progress.score(s, args)) == {"worker": 3.0}


# --- co-location -------------------------------------------------------------------------------


def test_co_location_deletes_doubled_up_pods_first() -> None:
    s = snap(
        pod("alone", node="n1"),
        pod("pair-1", node="n2"),
        pod("pair-2", node="n2"),
        pod("trio-1", node="n3"),
        pod("trio-2", node="n3"),
        pod("trio-3", node="n3"),
        pod("pending", node=None, phase=Phase.PENDING),
    )
    scores = by_name(s, co_location.score(s, co_location.Args()))
    assert scores == {
        "alone": 0.0,
        "pair-1": -1.0,
        "pair-2": -1.0,
        "trio-1": -2.0,
        "trio-2": -2.0,
        "trio-3": -2.0,
        "pending": 0.0,
    }


def test_co_location_does_not_count_finished_pods_but_counts_bystanders() -> None:
    s = snap(
        pod("web", node="n1"),
        pod("done", node="n1", phase=Phase.SUCCEEDED),
        pod("leaving", node="n1", deleting=True),
        bystanders=(pod("adopted-elsewhere", node="n1", uid="by"),),
    )
    scores = by_name(s, co_location.score(s, co_location.Args()))
    assert scores == {"web": -1.0, "done": 0.0, "leaving": 0.0}


def zone_term(weight: int = 0, **labels: str) -> AffinityTerm:
    return AffinityTerm(ZONE, labels or {"app": "web"}, weight=weight)


def test_co_location_deletes_pods_that_break_required_anti_affinity_first() -> None:
    term = (zone_term(),)
    s = snap(
        pod("a1", node="n1", labels={"app": "web"}, anti_affinity=term),
        pod("a2", node="n2", labels={"app": "web"}, anti_affinity=term),
        pod("b1", node="n3", labels={"app": "web"}, anti_affinity=term),
        pod("b-other", node="n3", labels={"app": "db"}, anti_affinity=term),
        nodes=(
            node("n1", labels={ZONE: "a"}),
            node("n2", labels={ZONE: "a"}),
            node("n3", labels={ZONE: "b"}),
        ),
    )
    args = co_location.Args(same_node_weight=0.0)
    scores = by_name(s, co_location.score(s, args))
    # a1 and a2 share zone a; in zone b the db pod does not match the selector: b1 is clean,
    # and b-other sees b1 (matched by its own term) although it does not match itself.
    assert scores == {"a1": -10.0, "a2": -10.0, "b1": 0.0, "b-other": -10.0}


def test_co_location_scales_preferred_terms_by_their_weight() -> None:
    term = (zone_term(weight=50),)
    s = snap(
        pod("a1", node="n1", labels={"app": "web"}, anti_affinity=term),
        pod("a2", node="n2", labels={"app": "web"}, anti_affinity=term),
        nodes=(node("n1", labels={ZONE: "a"}), node("n2", labels={ZONE: "a"})),
    )
    args = co_location.Args(same_node_weight=0.0, preferred_weight=2.0)
    assert by_name(s, co_location.score(s, args)) == {"a1": -1.0, "a2": -1.0}


def test_co_location_hostname_terms_fall_back_to_the_node_name_and_skip_unknown_domains() -> None:
    hostname = (AffinityTerm("kubernetes.io/hostname", {"app": "web"}),)
    rack = (AffinityTerm("rack", {}, exact=False),)
    s = snap(
        pod("h1", node="n1", labels={"app": "web"}, anti_affinity=hostname),
        pod("h2", node="n1", labels={"app": "web"}, anti_affinity=hostname),
        pod("r1", node="n2", anti_affinity=rack),
        pod("r2", node="n2", anti_affinity=rack),
    )
    args = co_location.Args(same_node_weight=0.0)
    # n1 is not in the snapshot: the hostname term uses the node name; the rack term has no
    # domain for pods on unknown nodes, so it is not counted.
    assert by_name(s, co_location.score(s, args)) == {"h1": -10.0, "h2": -10.0, "r1": 0, "r2": 0}


# --- node-consolidation ------------------------------------------------------------------------

BIG = Resources(cpu_milli=4000, memory_bytes=8 << 30, pods=110)


def test_node_consolidation_breaks_ties_between_single_pod_nodes_by_utilization_then_name() -> None:
    s = snap(
        pod("idle-node", node="n1"),
        pod("cpu-busy", node="n2"),
        pod("memory-busy", node="n3"),
        nodes=(
            node("n1", allocatable=BIG, requested=Resources(400, 1 << 30)),
            node("n2", allocatable=BIG, requested=Resources(3000, 1 << 30)),
            node("n3", allocatable=BIG, requested=Resources(400, 6 << 30)),
        ),
    )
    dominant = by_name(s, node_consolidation.score(s, node_consolidation.Args()))
    assert dominant == {"idle-node": 0.0, "cpu-busy": 1.0, "memory-busy": 2.0}
    cpu = by_name(s, node_consolidation.score(s, node_consolidation.Args("cpu")))
    assert cpu == {"idle-node": 0.0, "cpu-busy": 2.0, "memory-busy": 1.0}
    memory = by_name(s, node_consolidation.score(s, node_consolidation.Args("memory")))
    assert memory == {"idle-node": 0.0, "cpu-busy": 1.0, "memory-busy": 2.0}


def test_node_consolidation_drains_a_node_shared_with_other_pods_after_those_it_can_empty() -> None:
    s = snap(
        pod("alone", node="n1"),
        pod("pair-1", node="n2"),
        pod("pair-2", node="n2"),
        pod("pending", node=None, phase=Phase.PENDING),
        pod("done", node="n2", phase=Phase.FAILED),
        nodes=(node("n1", allocatable=BIG, requested=BIG), node("n2")),
    )
    scores = by_name(s, node_consolidation.score(s, node_consolidation.Args()))
    assert scores == {"alone": 1.0, "pair-1": 0.0, "pair-2": 0.0, "pending": 0.0, "done": 0.0}


def test_node_consolidation_gives_every_pod_of_a_node_the_same_score() -> None:
    s = snap(
        pod("a", node="n1"),
        pod("b", node="n1"),
        nodes=(node("n1", allocatable=BIG, requested=BIG),),
    )
    args = node_consolidation.Args(measure="count")
    assert by_name(s, node_consolidation.score(s, args)) == {"a": 0.0, "b": 0.0}


# --- karpenter ---------------------------------------------------------------------------------

DISRUPTED = Taint(karpenter.DISRUPTED_TAINT, "NoSchedule")
KEEP = {karpenter.DO_NOT_DISRUPT: "true"}


def test_karpenter_deletes_pods_on_disrupted_nodes_first_and_keeps_do_not_disrupt_pods_last() -> (
    None
):
    s = snap(
        pod("draining", node="n1"),
        pod("tolerant", node="n1", tolerations=(Toleration(operator="Exists"),)),
        pod("plain", node="n2"),
        replace(pod("precious", node="n2"), annotations=KEEP),
        replace(pod("precious-but-draining", node="n1"), annotations=KEEP),
        replace(pod("says-false", node="n2"), annotations={karpenter.DO_NOT_DISRUPT: "false"}),
        pod("unscheduled", node=None, phase=Phase.PENDING),
        nodes=(node("n1", taints=(DISRUPTED,)), node("n2")),
    )
    assert by_name(s, karpenter.score(s, karpenter.Args())) == {
        "draining": -1.0,
        "tolerant": -1.0,
        "plain": 0.0,
        "precious": 1.0,
        "precious-but-draining": -1.0,
        "says-false": 0.0,
        "unscheduled": 0.0,
    }


def test_untolerated_taints_counts_karpenters_disrupted_taint_only_for_pods_not_tolerating_it() -> (
    None
):
    s = snap(
        pod("draining", node="n1"),
        pod("tolerant", node="n1", tolerations=(Toleration(operator="Exists"),)),
        nodes=(node("n1", taints=(DISRUPTED,)),),
    )
    scores = untolerated_taints.score(s, untolerated_taints.Args())
    assert by_name(s, scores) == {"draining": -1.0, "tolerant": 0.0}


def test_karpenter_reads_other_taint_keys_and_annotations_when_told() -> None:
    s = snap(
        pod("a", node="n1"),
        replace(pod("b", node="n2"), annotations={"acme.io/keep": "True"}),
        nodes=(node("n1", taints=(Taint("acme.io/draining", "NoExecute"),)), node("n2")),
    )
    args = karpenter.Args(disrupted_taints=("acme.io/draining",), do_not_disrupt="acme.io/keep")
    assert by_name(s, karpenter.score(s, args)) == {"a": -1.0, "b": 1.0}
    with pytest.raises(ValueError, match="disrupted_taints"):
        karpenter.Args(disrupted_taints=())


# --- shared helpers ----------------------------------------------------------------------------


def test_an_answer_built_for_the_active_pods_keeps_snapshot_order_and_scores_the_rest_apart() -> (
    None
):
    s = snap(
        pod("a", node="n1"),
        pod("done", node="n1", phase=Phase.SUCCEEDED),
        pod("b", node="n2"),
        pod("going", node="n2", deleting=True),
    )
    active = active_pods(s)
    answer = scores_by_uid(s, active, [1.0, 2.0], inactive=-7.0)
    assert list(answer) == [p.uid for p in s.pods]
    assert by_name(s, answer) == {"a": 1.0, "done": -7.0, "b": 2.0, "going": -7.0}
    everyone = snap(pod("a"), pod("b"))
    assert scores_by_uid(everyone, active_pods(everyone), [3.0, 4.0]) == {
        PodUID("uid-a"): 3.0,
        PodUID("uid-b"): 4.0,
    }


def test_the_node_lookup_finds_the_node_and_nothing_for_unscheduled_or_unknown_pods() -> None:
    n1 = node("n1")
    node_of = node_lookup(snap(pod("a", node="n1"), nodes=(n1,)))
    assert node_of("n1") is n1
    assert node_of(None) is None
    assert node_of("gone") is None
