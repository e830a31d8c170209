"""Hypothesis strategies for workload snapshots, shared by every property test of the core.

Two kinds:

- :func:`snapshots`: anything the model allows and a decoder might hand over: unscheduled pods,
  pods on nodes missing from ``snapshot.nodes``, nodes without labels, duplicate pod names,
  finished and terminating pods, bystanders, odd timestamps, invalid annotation values, every
  spot label, taints of every effect, anti-affinity terms. For "never raises" properties.
- :func:`zoned_snapshots`: pods spread over a few zones (and the occasional unlabelled node or
  unscheduled pod) with varied everything else, for the skew and dominance properties.

``PROPERTY`` is the settings the property tests use: 200 examples (the CPU is shared with long
builds), no deadline (a loaded machine must not make a test flaky).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from podcost_core.model import (
    AffinityTerm,
    CostOwner,
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
from podcost_core.strategies.capacity_type import SPOT_LABELS

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
PRICE = "podcost.dev/hourly-price"
WORK = "podcost.dev/work-cost"
NOW = 1_700_000_000.0
ZONES = ("zone-a", "zone-b", "zone-c", "zone-d")
NODE_NAMES = tuple(NodeName(f"node-{index}") for index in range(8))
APP = {"app": "web"}

WORKLOAD = WorkloadRef("test", "default", "Deployment", "web")

# Values come from small pools of prebuilt ones wherever the pool covers the cases that matter:
# one draw each instead of many keeps hundreds of examples fast, and they shrink to the first.
TIMES = (None, 0.0, NOW - 30, NOW - 60, NOW - 3600, NOW - 2 * 86_400, NOW - 9 * 86_400, NOW + 60)
timestamps = st.sampled_from(TIMES)
prices = st.sampled_from(
    ["0.1", "0.5", "1.25", "2", "50", "", "abc", "-1", "nan", "inf", "1e999", " 0.5 ", "0"]
)
work_costs = st.sampled_from(["0", "1", "12", "5000", "-3", "", "busy", "nan", "-inf", "1e400"])
RESOURCES = (
    Resources(),
    Resources(4000, 8 << 30, 110),
    Resources(1000, 1 << 30, 10),
    Resources(3500, 2 << 30, 30),
    Resources(250, 7 << 30, 5),
    Resources(0, 4 << 30, 0),
)
resources = st.sampled_from(RESOURCES)
PREFER = Taint("maintenance", "PreferNoSchedule")
DEDICATED = Taint("dedicated", "NoSchedule", "gpu")
UNREACHABLE = Taint("node.kubernetes.io/unreachable", "NoExecute")
CORDONED = Taint("node.kubernetes.io/unschedulable", "NoSchedule")
taint_sets = st.sampled_from(
    [(), (PREFER,), (DEDICATED,), (UNREACHABLE,), (CORDONED,), (PREFER, DEDICATED),
     (Taint("odd", "Bogus"),), (PREFER, UNREACHABLE, CORDONED)]
)  # fmt: skip
toleration_sets = st.sampled_from(
    [(), (Toleration(operator="Exists"),), (Toleration("maintenance", "Exists"),),
     (Toleration("dedicated", "Equal", "gpu", "NoSchedule"),),
     (Toleration("dedicated", "Equal", "cpu"),),
     (Toleration(effect="NoExecute", operator="Exists"),),
     (Toleration("maintenance", "Exists"), Toleration(CORDONED.key, "Exists"))]
)  # fmt: skip
term_sets = st.sampled_from(
    [(), (AffinityTerm(ZONE, APP),), (AffinityTerm(HOSTNAME, APP, weight=100),),
     (AffinityTerm("rack", {}, exact=False),), (AffinityTerm(ZONE, {"app": "other"}, weight=50),),
     (AffinityTerm(HOSTNAME, APP), AffinityTerm(ZONE, {"app": "web", "tier": "front"}, weight=1))]
)  # fmt: skip
PRIORITIES = (0, 0, 100, -10, 1_000_000, 2_000_001_000, -(2**31))


_one_in_ten = st.integers(0, 9)
_one_in_four = st.integers(0, 3)
_one_in_five = st.integers(0, 4)
_spot_label = st.sampled_from(SPOT_LABELS)
_rack = st.sampled_from(["r1", "r2"])


@st.composite
def nodes(draw: st.DrawFn, name: NodeName, zones: tuple[str, ...] = ZONES) -> Node:
    """A node called ``name``: maybe zoned, maybe spot, maybe priced, tainted, sized."""
    labels: dict[str, str] = {}
    if draw(_one_in_ten) > 0:  # one in ten nodes has no zone label
        labels[ZONE] = draw(st.sampled_from(zones))
    if draw(st.booleans()):
        labels[HOSTNAME] = name
    if draw(_one_in_four) == 0:
        key, value = draw(_spot_label)
        labels[key] = value
    if draw(_one_in_five) == 0:
        labels["rack"] = draw(_rack)
    annotations = {PRICE: draw(prices)} if draw(st.booleans()) else {}
    return Node(
        name=name,
        labels=labels,
        annotations=annotations,
        taints=draw(taint_sets),
        allocatable=draw(resources),
        requested=draw(resources),
        unschedulable=draw(st.booleans()),
    )


_pod_names = st.sampled_from(["web-1", "web-2", "web-3"])  # duplicates on purpose
_replicasets = st.sampled_from([None, "web-1", "web-2"])
_restarts = st.integers(0, 5)
_sidecar_restarts = st.integers(0, 2)
_priorities = st.sampled_from(PRIORITIES)
_qos = st.sampled_from(QoSClass)
_phases = st.sampled_from(Phase)
_pod_labels = st.sampled_from([APP, {}, {"app": "web", "tier": "front"}])
_costs = st.integers(-5, 5)
_owners = st.sampled_from(CostOwner)


@st.composite
def pods(draw: st.DrawFn, uid: str, node_names: tuple[NodeName, ...] = NODE_NAMES) -> Pod:
    """A pod with uid ``uid`` on one of ``node_names`` (or none); every field varied."""
    ready = draw(st.booleans())
    annotations = {WORK: draw(work_costs)} if draw(st.booleans()) else {}
    return Pod(
        uid=PodUID(uid),
        name=draw(_pod_names),
        namespace="default",
        node=draw(st.one_of(st.none(), st.sampled_from(node_names))),
        phase=draw(_phases),
        ready=ready,
        ready_since=draw(timestamps) if ready else None,
        created=draw(timestamps),
        replicaset=draw(_replicasets),
        restarts=draw(_restarts),
        sidecar_restarts=draw(_sidecar_restarts),
        priority=draw(_priorities),
        qos=draw(_qos),
        tolerations=draw(toleration_sets),
        requests=draw(resources),
        labels=draw(_pod_labels),
        annotations=annotations,
        deletion_cost=draw(_costs),
        cost_owner=draw(_owners),
        deleting=draw(_one_in_ten) == 0,
        anti_affinity=draw(term_sets),
    )


# What differs between the replicas of one workload, as prebuilt combinations (one draw a pod):
# (ready, ready since, created), and for arbitrary snapshots also (phase, deleting).
_TIMING = tuple(
    (ready, ready_since if ready else None, created)
    for ready in (True, False)
    for ready_since in TIMES
    for created in TIMES
    if not ready or ready_since is not None
)
_LIFE = tuple((phase, deleting) for deleting in (False, True) for phase in Phase)
_timing = st.sampled_from(_TIMING)
_life = st.sampled_from(_LIFE)


@st.composite
def _pods_from_templates(
    draw: st.DrawFn, count: int, node_names: tuple[NodeName | None, ...], *, zoned: bool = False
) -> list[Pod]:
    """``count`` pods made from up to three fully drawn templates (the pods of one workload are
    alike), each varied in what differs between replicas: node, phase, readiness, times,
    termination. Far fewer draws than ``count`` full pods, so hundreds of examples stay fast."""
    templates = draw(st.lists(pods("template"), min_size=1, max_size=3))
    # Strategies built once, not per pod: building one costs more than drawing from it.
    pick_template, pick_node = st.sampled_from(templates), st.sampled_from(node_names)
    made = []
    for index in range(count):
        template = draw(pick_template)
        node = draw(pick_node)
        ready, ready_since, created = draw(_timing)
        if zoned:  # active, Running when scheduled, Pending otherwise
            phase, deleting = (Phase.RUNNING if node is not None else Phase.PENDING), False
        else:
            phase, deleting = draw(_life)
        ready = ready and node is not None
        made.append(
            replace(
                template,
                uid=PodUID(f"uid-{index:03d}"),
                node=node,
                phase=phase,
                ready=ready,
                ready_since=ready_since if ready else None,
                created=created,
                deleting=deleting,
            )
        )
    return made


@st.composite
def snapshots(draw: st.DrawFn, max_pods: int = 25) -> Snapshot:
    """Any snapshot: up to ``max_pods`` pods on up to 8 node names, some nodes unknown."""
    count = draw(st.integers(0, max_pods))
    pod_list = draw(_pods_from_templates(count, (None, *NODE_NAMES)))
    known = draw(st.lists(st.sampled_from(NODE_NAMES), unique=True, max_size=len(NODE_NAMES)))
    bystanders = [draw(pods(f"by-{index}")) for index in range(draw(st.integers(0, 2)))]
    return Snapshot(
        workload=WORKLOAD,
        pods=tuple(pod_list),
        nodes={name: draw(nodes(name)) for name in known},
        replicas=count,
        version=draw(st.integers(0, 10)),
        taken_at=draw(st.sampled_from([NOW, 0.0, NOW + 86_400 * 3])),
        bystanders=tuple(bystanders),
    )


@st.composite
def zoned_snapshots(
    draw: st.DrawFn,
    zones: tuple[str, ...] = ZONES[:3],
    max_pods: int = 30,
    nodes_per_zone: int = 2,
) -> Snapshot:
    """Active pods over ``zones`` (nodes named by zone), a few unscheduled or on a bare node.

    Everything the tie-breaking tiers look at varies (spot, price, taints, priority, QoS, age,
    readiness, work in progress), so that dominance properties are tested against conflicting
    preferences.
    """
    node_map: dict[str, Node] = {}
    for zone in zones:
        for index in range(nodes_per_zone):
            name = NodeName(f"{zone}-{index}")
            node = draw(nodes(name, zones=(zone,)))
            node_map[name] = replace(node, labels={**node.labels, ZONE: zone}, unschedulable=False)
    node_map["bare"] = Node(NodeName("bare"))  # a node without any label
    # One pod in ten on the bare node or unscheduled: the extra domain.
    names: tuple[NodeName | None, ...] = (*[NodeName(n) for n in node_map if n != "bare"],) * 5
    names += (NodeName("bare"), None)
    count = draw(st.integers(0, max_pods))
    pod_list = draw(_pods_from_templates(count, names, zoned=True))
    return Snapshot(
        workload=WORKLOAD, pods=tuple(pod_list), nodes=node_map, replicas=count, taken_at=NOW
    )


def domain_sizes(snapshot: Snapshot, remaining: set[PodUID], key: str = ZONE) -> dict[str, int]:
    """Active pods of ``remaining`` per domain of ``key`` ("" = unscheduled/unlabelled); every
    domain the snapshot's active pods start in is listed, emptied ones with 0."""
    sizes: dict[str, int] = {}
    for pod in snapshot.pods:
        if not pod.active:
            continue
        node = snapshot.nodes.get(pod.node) if pod.node is not None else None
        domain = node.labels.get(key, "") if node is not None else ""
        sizes[domain] = sizes.get(domain, 0) + (pod.uid in remaining)
    return sizes


def skew(sizes: dict[str, int]) -> int:
    """max − min over the domains (0 for none)."""
    return max(sizes.values()) - min(sizes.values()) if sizes else 0


def least_skew(sizes: dict[str, int], deletions: int) -> int:
    """The least skew any ``deletions`` deletions can leave: water-filling from the top.

    Deleting from a currently-largest domain minimizes the maximum and never lowers the minimum
    before every domain is level, so no other choice does better (checked against brute force in
    ``test_topology_spread``).
    """
    counts = sorted(sizes.values())
    for _ in range(deletions):
        counts[-1] -= 1
        counts.sort()
    return counts[-1] - counts[0] if counts else 0
