"""Differential test of a first costing with the fewer writes: the real kube-controller-manager
deletes the pods podcost's order says, though podcost left many pods without a cost.

Each scenario is drawn from a seeded random generator: a Deployment on one to three kwok nodes
(pods doubled up or not), some pods not ready, some already carrying a cost, no cost on the
rest. podcost's intended order is random but follows rules 1-3 (no cost can move a not-ready
pod behind a ready one). ``label_costs`` then ``drop_implied`` decide the writes, only those
are applied, and:

- the victim model (``pods_to_delete``, which ``test_victims_differential`` holds against the
  real controller) must delete, for every k, only pods the order admits, with its clock anywhere
  in the next day;
- the real controller scales in by one random k, and the pods it deletes must be the first k
  of the order (ties inside a group either way), and what the model predicts.

The writes of the scenarios are printed against writing every pod (``-s`` shows them).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from tests.support.kube import KubeTestCluster

from podcost.annotator.plan import write_priority
from podcost_core.implied import drop_implied
from podcost_core.labels import CurrentCost, Labelling, current_costs, label_costs
from podcost_core.model import Pod, PodUID, Snapshot, WorkloadRef
from podcost_core.tomodel import pod_from_json
from podcost_core.urgency import first_wrong
from podcost_core.victims import NowWindow, clockless_key, pods_to_delete

pytestmark = pytest.mark.integration

LANES = 3
SCENARIOS = 9


@dataclass
class Outcome:
    """One scenario: what was written and what the controller did."""

    seed: int
    pods: int = 0
    writes_before: int = 0
    writes_full: int = 0
    writes: int = 0
    k: int = 0
    deleted: list[str] = field(default_factory=list)
    failure: str | None = None


def _nodes(lane: int) -> list[str]:
    return [f"first-{lane}-{index}" for index in range(3)]


@pytest.fixture(scope="module")
async def first_lanes(kube: KubeTestCluster) -> list[int]:
    for lane in range(LANES):
        for index, name in enumerate(_nodes(lane)):
            await kube.create_node(name, zone=f"zone-{index % 2}", labels={"first-node": name})
    return list(range(LANES))


def _intended(pods: Sequence[Pod], rng: random.Random) -> list[list[PodUID]]:
    """A random order that follows rules 1-3: groups by (controller class, random draw)."""
    draw = {pod.uid: rng.randint(0, 3) for pod in pods}

    def place(pod: Pod) -> tuple[int, ...]:
        return (*clockless_key(pod, 0, 0)[:3], draw[pod.uid])

    order: list[list[PodUID]] = []
    last: tuple[int, ...] | None = None
    for pod in sorted(pods, key=lambda pod: (place(pod), pod.uid)):
        if place(pod) != last:
            order.append([])
            last = place(pod)
        order[-1].append(pod.uid)
    return order


def _admitted(order: Sequence[Sequence[PodUID]], deleted: set[str], everyone: set[str]) -> bool:
    """Whether deleting ``deleted`` out of ``everyone`` takes the order's first pods."""
    group_of = {uid: index for index, group in enumerate(order) for uid in group}
    kept = everyone - deleted
    return (
        not deleted
        or not kept
        or (max(group_of[uid] for uid in deleted) <= min(group_of[uid] for uid in kept))
    )


async def _scenario(
    kube: KubeTestCluster, lane: int, seed: int, upto: int | None = None
) -> Outcome:
    namespace = await kube.create_namespace(f"first-{seed}-{uuid.uuid4().hex[:4]}")
    try:
        return await _play(kube, lane, seed, namespace, upto)
    finally:
        await kube.delete_namespace(namespace)


async def _play(
    kube: KubeTestCluster, lane: int, seed: int, namespace: str, upto: int | None
) -> Outcome:
    """One scenario; with ``upto``, only the writes the annotator makes before scale-ins up to
    ``upto`` are right (``write_priority``), and only those scale-ins are checked."""
    rng = random.Random(seed)
    outcome = Outcome(seed)
    nodes = rng.sample(_nodes(lane), rng.randint(1, 3))
    replicas = rng.randint(3, 8)
    extra: dict[str, Any] = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "first-node", "operator": "In", "values": nodes}]}
            ]
        }}}
    }  # fmt: skip
    await kube.create_deployment(namespace, "web", replicas, pod_spec_extra=extra)
    await kube.wait_ready(namespace, "web", replicas)
    views = sorted(await kube.pods(namespace, "web"), key=lambda view: view.name)
    for view in rng.sample(views, rng.randint(0, 2)):
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        await kube.patch_pod_status(
            namespace,
            view.name,
            {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}]},
        )
    if rng.random() < 0.3:
        for view in rng.sample(views, rng.randint(1, 2)):
            await kube.set_deletion_cost(namespace, view.name, rng.choice((-5, 0, 3, 100)))
    await asyncio.sleep(1.0)  # the controller's informer cache sees the patches

    pods = [pod_from_json(item) for item in await kube.raw_pods(namespace, "web")]
    snapshot = Snapshot(WorkloadRef("first", namespace, "Deployment", "web"), tuple(pods))
    order = _intended(pods, rng)
    current = current_costs(pods)
    full = label_costs(order, {pod.uid: pod.replicaset for pod in pods}, current,
                       overwrite_foreign=True)  # fmt: skip
    thin = drop_implied(full, order, snapshot, current)
    if upto is not None:
        thin = _first_writes(thin, order, snapshot, current, upto)
    names = {pod.uid: pod.name for pod in pods}
    for uid, cost in thin.writes.items():
        await kube.set_deletion_cost(namespace, names[uid], cost)
    # Before: a pod without the annotation counted as no cost, so it was written.
    unread = {pod.uid: CurrentCost() if pod.deletion_cost_raw is None else current[pod.uid]
              for pod in pods}  # fmt: skip
    before = label_costs(order, {pod.uid: pod.replicaset for pod in pods}, unread,
                         overwrite_foreign=True)  # fmt: skip
    outcome.pods, outcome.writes_before = len(pods), len(before.writes)
    outcome.writes_full, outcome.writes = len(full.writes), len(thin.writes)
    await asyncio.sleep(1.0)

    raw = await kube.raw_pods(namespace, "web")
    labelled = [pod_from_json(item) for item in raw]
    assert {pod.uid: pod.deletion_cost for pod in labelled} == dict(thin.costs)
    everyone = {pod.uid for pod in labelled}
    day = NowWindow(time.time(), time.time() + 86_400)
    largest = len(labelled) - 1 if upto is None else min(upto, len(labelled) - 1)
    for k in range(1, largest + 1):
        choice = pods_to_delete(labelled, labelled, k, day)
        for picks in _outcomes(choice.certain, choice.tied, choice.tie_picks):
            if not _admitted(order, picks, everyone):
                outcome.failure = f"model, k={k}: {sorted(names[uid] for uid in picks)}"
                return outcome

    outcome.k = rng.randint(1, largest)
    earliest = time.time()
    deleted_names = await kube.scale_and_observe(namespace, "web", len(labelled) - outcome.k)
    window = NowWindow(earliest, time.time())
    by_name = {pod.name: pod.uid for pod in labelled}
    deleted = {by_name[name] for name in deleted_names}
    outcome.deleted = sorted(deleted_names)
    choice = pods_to_delete(labelled, labelled, outcome.k, window)
    if not _admitted(order, deleted, everyone) or not choice.admits(deleted):
        outcome.failure = (
            f"controller, k={outcome.k}: deleted {outcome.deleted}; order "
            f"{[[names[uid] for uid in group] for group in order]}; costs "
            f"{ {names[uid]: cost for uid, cost in thin.costs.items()} }"
        )
    return outcome


def _first_writes(
    labelling: Labelling,
    order: Sequence[Sequence[PodUID]],
    snapshot: Snapshot,
    current: Mapping[PodUID, CurrentCost],
    upto: int,
) -> Labelling:
    """``labelling`` with only the writes the annotator makes before scale-ins up to ``upto``
    are right: priority (``write_priority``, as the decision lists the pods) at most ``upto``."""
    urgent = first_wrong(order, snapshot)
    listed = [uid for group in order for uid in group]
    kept = {
        uid: cost
        for position, uid in enumerate(listed)
        if (cost := labelling.writes.get(uid)) is not None
        and write_priority(urgent, position, rising=cost > (current[uid].value or 0)) <= upto
    }
    costs = {uid: kept.get(uid, current[uid].value or 0) if uid in labelling.writes else cost
             for uid, cost in labelling.costs.items()}  # fmt: skip
    return replace(labelling, costs=costs, writes=kept)


def _outcomes(certain: Sequence[Pod], tied: Sequence[Pod], picks: int) -> list[set[str]]:
    """Every set of pods the controller may delete: the certain ones and ``picks`` tied ones."""
    from itertools import combinations

    base = {pod.uid for pod in certain}
    return [base | {pod.uid for pod in chosen} for chosen in combinations(tied, picks)]


@pytest.mark.timeout(600)
async def test_the_real_controller_deletes_in_podcosts_order_with_the_fewer_writes(
    kube: KubeTestCluster, first_lanes: list[int]
) -> None:
    async def lane_run(lane: int) -> list[Outcome]:
        return [await _scenario(kube, lane, seed) for seed in range(lane, SCENARIOS, LANES)]

    outcomes = [o for lane in await asyncio.gather(*map(lane_run, first_lanes)) for o in lane]
    pods = sum(o.pods for o in outcomes)
    before = sum(o.writes_before for o in outcomes)
    full = sum(o.writes_full for o in outcomes)
    thin = sum(o.writes for o in outcomes)
    print(f"\n{len(outcomes)} scenarios, {pods} pods: writes of every pod {pods}, label_costs "
          f"before {before}, with no annotation read as 0 {full}, less the controller's own "
          f"order {thin}")  # fmt: skip
    failures = [f"seed {o.seed}: {o.failure}" for o in outcomes if o.failure]
    assert len(outcomes) == SCENARIOS
    assert not failures, "\n".join(failures)
    assert thin < full <= before <= pods


@pytest.mark.timeout(600)
async def test_the_first_writes_by_priority_already_make_small_scale_ins_right(
    kube: KubeTestCluster, first_lanes: list[int]
) -> None:
    # Only the writes the annotator makes first (a scale-in of one or two right), the rest
    # still to come: the real controller already deletes in podcost's order for those.
    async def lane_run(lane: int) -> list[Outcome]:
        return [await _scenario(kube, lane, seed, upto=1 + seed % 2)
                for seed in range(100 + lane, 100 + SCENARIOS, LANES)]  # fmt: skip

    outcomes = [o for lane in await asyncio.gather(*map(lane_run, first_lanes)) for o in lane]
    first, full = sum(o.writes for o in outcomes), sum(o.writes_full for o in outcomes)
    print(f"\n{len(outcomes)} scenarios, {sum(o.pods for o in outcomes)} pods: the first "
          f"{first} writes of label_costs' {full}")  # fmt: skip
    failures = [f"seed {o.seed}: {o.failure}" for o in outcomes if o.failure]
    assert not failures, "\n".join(failures)
