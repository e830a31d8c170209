"""podcost's costs as Karpenter reads them, for the choice of the cost band on Karpenter clusters.

Karpenter (v1.14, ``pkg/utils/disruption/disruption.go``) counts each pod it would evict as
``clamp(1 + cost/2^27 + priority/2^25, -10, 10)``; a node's reschedule cost is 1 plus the sum of
its pods' positive counts, and a node at 1 or below is *empty* to it (``Candidate.IsEmpty``): its
Emptiness method deletes it, running pods and all. These tests label ReplicaSets the way the
aggregator does (``label_costs``, a first labelling and a re-ranking after it) and read the
costs as Karpenter does: in the default band a large ReplicaSet ranked pod by pod gets pods
Karpenter counts 0 or less, in the non-negative band no pod ever counts less than an unannotated
one or as much as two.
"""

from __future__ import annotations

import random

import pytest

from podcost_core.labels import DEFAULT_BAND, NON_NEGATIVE_BAND, CostBand, CurrentCost, label_costs
from podcost_core.model import PodUID


def karpenter_eviction_cost(cost: int) -> float:
    """Karpenter's ``EvictionCost`` of a pod of priority 0 with deletion cost ``cost``."""
    return min(10.0, max(-10.0, 1.0 + cost / 2**27))


def labelled(pods: int, band: CostBand, seed: int) -> tuple[list[int], list[int]]:
    """The costs of a first labelling of ``pods`` pods ranked one by one (every pod its own
    group, all without a cost before), and after a re-ranking in a shuffled order."""
    uids = [PodUID(f"p{index}") for index in range(pods)]
    replicaset = dict.fromkeys(uids, "web")
    first = label_costs([[uid] for uid in uids], replicaset,
                        {uid: CurrentCost(0) for uid in uids}, band=band)  # fmt: skip
    order = uids[:]
    random.Random(seed).shuffle(order)
    current = {uid: CurrentCost(cost) for uid, cost in first.costs.items()}
    again = label_costs([[uid] for uid in order], replicaset, current, band=band)
    return list(first.costs.values()), list(again.costs.values())


def test_a_large_replicaset_in_the_default_band_has_pods_karpenter_counts_as_nothing() -> None:
    first, again = labelled(200, DEFAULT_BAND, seed=1)
    assert sum(karpenter_eviction_cost(cost) <= 0 for cost in first) == 72
    assert any(karpenter_eviction_cost(cost) <= 0 for cost in again)


def test_a_small_replicaset_in_the_default_band_stays_above_zero() -> None:
    first, again = labelled(100, DEFAULT_BAND, seed=1)
    assert min(karpenter_eviction_cost(cost) for cost in first + again) > 0


@pytest.mark.parametrize("pods", [2, 20, 200, 1000])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_in_the_non_negative_band_every_pod_counts_between_one_and_two(
    pods: int, seed: int
) -> None:
    first, again = labelled(pods, NON_NEGATIVE_BAND, seed)
    counts = [karpenter_eviction_cost(cost) for cost in first + again]
    assert min(counts) >= 1.0
    assert max(counts) < 2.0
