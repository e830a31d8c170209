"""Writes the controller's own order makes unnecessary: a labelling thinned against the pods.

The aggregator, ``podcost simulate`` and ``podcost explain`` call ``drop_implied`` on the
``labels.label_costs`` result, with the snapshot the order was made from. ``label_costs`` makes
the costs alone realise the order; but the ReplicaSet controller compares costs only after
rules 1-3 (unscheduled, pending, not ready first) and breaks equal costs by rule 5 (more related
pods on the node first) before anything that depends on its clock (``victims.clockless_key``).
A pod whose place those rules already give, with the cost it carries now, needs no write: a
not-ready pod the order puts first, or a doubled-up pod the order deletes before its singly
placed twin that has the same (often missing, so 0) cost.

Exact, and for every scale-in: keeping a pod's current cost is allowed only when, with the
costs of every other pod of its ReplicaSet as decided, the pods of different groups of the
order have different clockless keys ordered like the groups, and pods of one key belong to one
group. Then for every k the controller's sort (whatever it does with equal keys, whenever it
runs) deletes a set the order admits. Pods with equal keys are ordered by the clock (log2 age
buckets that merge as time goes on) and the restarts, so nothing is left to those. Writes are
tried in the order's order and dropped greedily; a ReplicaSet is left as ``label_costs`` made it
when its costs do not realise the order to begin with (a foreign cost in the way, a pin), when
a pod of it is not in the order, or when it has more than ``BURST_REPLICAS`` active pods (a
scale-in of more takes several syncs, and the co-location ranks change between them).

What this relies on changes only with the pods: scheduling, phase, readiness and the pods on a
node are all in the next snapshot, and the next decision writes the costs it then needs. The
price is that window: a pod that turns ready carries its cost only once that decision is
written, where a full labelling had it already.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import pairwise

from podcost_core.labels import DEFAULT_BAND, CostBand, CurrentCost, Labelling
from podcost_core.model import PodUID, Snapshot
from podcost_core.victims import BURST_REPLICAS, ReplicaSetViews, clockless_key

Key = tuple[int, int, int, int, int]


def _fits(key: Key, group: int, ordered: Sequence[tuple[Key, int]]) -> bool:
    """Whether a pod of ``group`` with ``key`` keeps the order with the others, ``ordered``
    (key, group) sorted and realised (:func:`_realised`): their groups never decrease along
    their keys and a key is one group, so only the neighbours of ``key`` need a look."""
    at = bisect_left(ordered, (key,))  # the first other whose key is not smaller
    if at < len(ordered) and ordered[at][0] == key:
        return ordered[at][1] == group  # else a tie the clock would break
    # The last smaller key has the largest group below, the first larger one the smallest above.
    return (at == 0 or ordered[at - 1][1] <= group) and (
        at == len(ordered) or ordered[at][1] >= group
    )


def _realised(ordered: Sequence[tuple[Key, int]]) -> bool:
    """Whether keys order the groups: along ``ordered`` (key, group) sorted, groups never
    decrease and a key is one group."""
    for (key_a, group_a), (key_b, group_b) in pairwise(ordered):
        if group_b < group_a or (key_a == key_b and group_a != group_b):
            return False
    return True


def drop_implied(
    labelling: Labelling,
    order: Sequence[Sequence[PodUID]],
    snapshot: Snapshot,
    current: Mapping[PodUID, CurrentCost],
    *,
    band: CostBand = DEFAULT_BAND,
    views: ReplicaSetViews | None = None,
    group_of: Mapping[PodUID, int] | None = None,
) -> Labelling:
    """``labelling`` without the writes whose pods the controller's own order already places
    (module docstring); ``costs`` then holds the cost such a pod keeps. Only a current cost
    inside ``band`` (the one ``label_costs`` wrote in) is kept. ``views``: ``snapshot``'s, and
    ``group_of``: each pod's group index in ``order`` (``Combined.ranks``), when the caller has
    them already."""
    if not labelling.writes:
        return labelling
    views = ReplicaSetViews.of(snapshot, views)
    if group_of is None:
        group_of = {uid: index for index, group in enumerate(order) for uid in group}
    costs = dict(labelling.costs)
    writes = dict(labelling.writes)
    written_sets = {pod.replicaset for pod in snapshot.pods if pod.uid in writes}
    for replicaset in sorted(rs for rs in written_sets if rs is not None):
        pods, ranks = views(replicaset)
        if len(pods) > BURST_REPLICAS or any(pod.uid not in group_of for pod in pods):
            continue
        by_uid = {pod.uid: pod for pod in pods}
        entries = {
            pod.uid: (clockless_key(pod, ranks[pod.uid], costs[pod.uid]), group_of[pod.uid])
            for pod in pods
        }
        ordered = sorted(entries.values())
        if not _realised(ordered):
            continue
        # Realised, and kept so below (each change fits); ``_fits`` relies on it.
        for uid in sorted((uid for uid in entries if uid in writes), key=group_of.__getitem__):
            cost = current.get(uid)
            kept = None if cost is None else cost.value
            if kept is None or kept not in band:
                continue  # an invalid value is always replaced, one beyond the band too
            key = clockless_key(by_uid[uid], ranks[uid], kept)
            entry = entries[uid]
            del ordered[bisect_left(ordered, entry)]  # the others
            if _fits(key, group_of[uid], ordered):
                entry = entries[uid] = (key, group_of[uid])
                costs[uid] = kept
                del writes[uid]
            insort(ordered, entry)
    if len(writes) == len(labelling.writes):
        return labelling
    return replace(labelling, costs=costs, writes=writes)
