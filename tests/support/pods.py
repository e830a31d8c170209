"""Model pods and raw pod JSON for unit tests, with defaults that make every pod alike.

A pod made here is scheduled, Running, Ready since ``READY``, created at ``CREATED``, without
restarts or cost, so a test changes only the facts it is about. Used by the victim-model,
labelling, converter and simulate tests.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from podcost_core.model import (
    DELETION_COST_ANNOTATION,
    CostOwner,
    NodeName,
    Phase,
    Pod,
    PodUID,
)

#: 2024-05-01T12:00:00Z, the creation time of every default pod.
CREATED = 1_714_564_800.0
#: Ready one minute after creation.
READY = CREATED + 60
#: One hour after creation: "now" for most tests.
NOW = CREATED + 3600


def pod(
    name: str,
    *,
    uid: str | None = None,
    node: str | None = "node-a",
    phase: Phase = Phase.RUNNING,
    ready: bool = True,
    ready_since: float | None = READY,
    created: float | None = CREATED,
    replicaset: str | None = "web-1",
    restarts: int = 0,
    sidecar_restarts: int = 0,
    cost: int | None = None,
    cost_owner: CostOwner | None = None,
    deleting: bool = False,
    **other: Any,
) -> Pod:
    """A model pod; ``cost`` sets the annotation (owned by podcost unless told otherwise)."""
    annotations = {DELETION_COST_ANNOTATION: str(cost)} if cost is not None else {}
    owner = cost_owner or (CostOwner.PODCOST if cost is not None else CostOwner.NONE)
    return Pod(
        uid=PodUID(uid or f"uid-{name}"),
        name=name,
        namespace="shop",
        node=NodeName(node) if node else None,
        phase=phase,
        ready=ready,
        ready_since=ready_since if ready else None,
        created=created,
        replicaset=replicaset,
        restarts=restarts,
        sidecar_restarts=sidecar_restarts,
        annotations=annotations,
        deletion_cost=cost or 0,
        deletion_cost_raw=str(cost) if cost is not None else None,
        cost_owner=owner,
        deleting=deleting,
        **other,
    )


def with_cost(base: Pod, cost: int) -> Pod:
    """``base`` with podcost's cost ``cost`` written on it."""
    return replace(
        base,
        annotations={**base.annotations, DELETION_COST_ANNOTATION: str(cost)},
        deletion_cost=cost,
        deletion_cost_raw=str(cost),
        cost_owner=CostOwner.PODCOST,
    )
