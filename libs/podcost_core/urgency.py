"""How urgent a decision's writes are: the smallest scale-in that would now go wrong.

The aggregator puts ``first_wrong`` on every decision (``Decision.first_wrong``, the
``first_wrong`` field of the desired-costs message, whose pods are listed first deleted first).
The annotator spends its write budget by it (``podcost.annotator.plan.write_priority``): each
write waits for the smallest scale-in it can set right, its place in the order but never below
its decision's ``first_wrong``. That is the order of a first costing, when every opted-in
workload waits for its writes at once (10 writes/s, so hours for a large cluster): the first pod
to go of every workload where a scale-in of one would now do harm, then the second, and so on;
scale-ins of one are right everywhere after about one write per workload. Harm is whatever the
order says: a spot pod the controller would keep while deleting an on-demand one, a scale-in
that leaves a zone skew the spread would not, a pod on an expensive node kept. A workload whose
costs already give its order (or whose pods all tie in it) has nothing urgent and waits behind
every other.

"Would now go wrong" is judged with the costs on the pods as the snapshot saw them and rules 1-5
of the controller (``victims.clockless_key``): pods with equal keys are ordered by its clock,
so any of them may go, and a scale-in of *k* is wrong when a pod it may delete belongs to a later
group of the order than a pod it may keep. Per ReplicaSet (each is scaled on its own), the
smallest over them. Pure and O(n log n).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import groupby

from podcost_core.model import PodUID, Snapshot
from podcost_core.victims import ReplicaSetViews, clockless_key


def _first_wrong_in(classes: Sequence[Sequence[int]]) -> int | None:
    """The smallest *k* (below the total) at which deleting the first *k* pods of ``classes``
    (ordered classes of group indices, any order inside one) may delete a pod of a later group
    than one it keeps."""
    total = sum(len(members) for members in classes)
    suffix_min = [0] * (len(classes) + 1)
    suffix_min[-1] = total + len(classes) + 2**62  # no pod kept beyond the last class
    for index in range(len(classes) - 1, -1, -1):
        suffix_min[index] = min(suffix_min[index + 1], min(classes[index]))
    deleted_max = -1
    start = 0
    for index, members in enumerate(classes):
        high, low = max(members), min(members)
        for picks in range(1, len(members) + 1):
            k = start + picks
            if k >= total:
                return None
            kept_min = (
                suffix_min[index + 1] if picks == len(members) else min(low, suffix_min[index + 1])
            )
            if max(deleted_max, high) > kept_min:
                return k
        deleted_max = max(deleted_max, high)
        start += len(members)
    return None


def first_wrong(
    order: Sequence[Sequence[PodUID]],
    snapshot: Snapshot,
    views: ReplicaSetViews | None = None,
    group_of: Mapping[PodUID, int] | None = None,
) -> int | None:
    """The smallest scale-in (pods of one ReplicaSet) that, with the costs on ``snapshot``'s pods
    now, may delete a pod ``order`` keeps; ``None`` when every scale-in follows the order.
    ``views``: ``snapshot``'s, and ``group_of``: each pod's group index in ``order``
    (``Combined.ranks``), when the caller has them already."""
    views = ReplicaSetViews.of(snapshot, views)
    if group_of is None:
        group_of = {uid: index for index, group in enumerate(order) for uid in group}
    replicasets = sorted({pod.replicaset for pod in snapshot.pods if pod.uid in group_of
                          and pod.replicaset is not None})  # fmt: skip
    found: int | None = None
    for replicaset in replicasets:
        pods, ranks = views(replicaset)
        keyed = sorted(
            (clockless_key(pod, ranks[pod.uid]), group_of[pod.uid])
            for pod in pods
            if pod.uid in group_of
        )
        classes = [[group for _, group in members] for _, members in groupby(keyed, lambda e: e[0])]
        k = _first_wrong_in(classes)
        if k is not None and (found is None or k < found):
            found = k
    return found
