"""The deployment controller's scaling of a Deployment whose ReplicaSets share its replicas
(mid-rollout): which size each ReplicaSet gets when the Deployment is scaled to N.

Pure. Read from Kubernetes v1.36 ``pkg/controller/deployment/sync.go`` (``scale``) and
``pkg/controller/deployment/util/deployment_util.go`` (``FindActiveOrLatest``, ``IsSaturated``,
``MaxSurge``, ``ResolveFenceposts``, ``GetReplicaSetProportion``,
``getReplicaSetFraction``), with the sorts of ``pkg/controller/controller_utils.go``:

1. One ReplicaSet holding replicas (or none: the new one, else the newest) takes all N.
2. A saturated new ReplicaSet (its replicas, its ``desired-replicas`` annotation and its
   available replicas all equal N) takes N and every old one goes to 0.
3. Otherwise, for a RollingUpdate Deployment, the change ``N + maxSurge(N) - sum(replicas)`` is
   spread over the ReplicaSets holding replicas, largest first (on a scale-in, the older first
   among equals): each gets ``round(replicas * (N + maxSurge) / max-replicas) - replicas``, with
   ``max-replicas`` its annotation (else the Deployment's ``status.replicas``), bounded by
   what is left to spread; the largest takes what rounding left over. A Recreate Deployment
   is not scaled this way (the controller leaves its sizes alone).

Each ReplicaSet that shrinks then deletes its own victims (``victims.scale_in``). The deployment
controller calls ``scale`` on a scaling event; a paused rollout stops there, but runs ``scale``
on every sync, its own updates trigger the next, and with the annotations it just wrote it may
move more (one ReplicaSet left holding replicas takes exactly N): ``settled_sizes`` repeats it
until nothing changes. One that is not paused goes on (``rolloutRolling``) and may move more
replicas afterwards: that is the rollout, not the scale-in, and ``podcost simulate`` says so.
``tests/integration/test_rollout_differential.py`` holds this against the real controller.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from podcost_core.kubejson import parse_time
from podcost_core.model import Snapshot
from podcost_core.snapshots import ClusterObjects

DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
REVISION = "deployment.kubernetes.io/revision"
INT32_MAX = 2**31 - 1
_PERCENT = re.compile(r"^([0-9]+)%$")
_ATOI = re.compile(r"^[+-]?[0-9]+$")


class RolloutError(ValueError):
    """What the controller would refuse or not do; the message says which."""


@dataclass(frozen=True, slots=True)
class RolloutReplicaSet:
    """One ReplicaSet of a Deployment, with what ``scale`` reads of it."""

    name: str
    replicas: int
    """``spec.replicas``."""
    created: float | None = None
    """``metadata.creationTimestamp`` (POSIX seconds)."""
    max_replicas: int | None = None
    """The ``deployment.kubernetes.io/max-replicas`` annotation, when it is a valid int32."""
    desired_replicas: str | None = None
    """The ``deployment.kubernetes.io/desired-replicas`` annotation, as written."""
    available: int = 0
    """``status.availableReplicas``."""


@dataclass(frozen=True, slots=True)
class Rollout:
    """A Deployment and its ReplicaSets, as the deployment controller reads them."""

    replicasets: tuple[RolloutReplicaSet, ...]
    new: str | None
    """The ReplicaSet of the Deployment's current template (none when it was not created)."""
    rolling: bool = True
    """``spec.strategy.type`` is RollingUpdate (the default)."""
    max_surge: int | str | None = "25%"
    """``spec.strategy.rollingUpdate.maxSurge`` (an int or a percentage)."""
    max_unavailable: int | str | None = "25%"
    status_replicas: int = 0
    """``status.replicas``: the fallback for a missing ``max-replicas`` annotation."""
    paused: bool = False

    def holding(self) -> list[str]:
        """The ReplicaSets holding replicas, by name."""
        return sorted(rs.name for rs in self.replicasets if rs.replicas > 0)


def _scaled(value: int | str | None, total: int, *, round_up: bool) -> int:
    """``intstr.GetScaledValueFromIntOrPercent``: an int as it is, ``"N%"`` of ``total``."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    match = _PERCENT.match(value)
    if match is None:
        if value.isdigit():
            return int(value)
        raise RolloutError(f"{value!r} is neither an int nor a percentage")
    scaled = int(match.group(1)) * total / 100
    return math.ceil(scaled) if round_up else math.floor(scaled)


def max_surge(rollout: Rollout, replicas: int) -> int:
    """``MaxSurge``: the surge of a RollingUpdate Deployment of ``replicas``; 0 otherwise."""
    if not rollout.rolling:
        return 0
    return _scaled(rollout.max_surge, replicas, round_up=True)


def _round(value: float) -> int:
    """Go's ``math.Round``: halves away from zero."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def _fraction(rs: RolloutReplicaSet, rollout: Rollout, replicas: int) -> int:
    if replicas == 0:
        return -rs.replicas
    maximum = replicas + max_surge(rollout, replicas)
    before = rs.max_replicas
    if not before:
        before = rollout.status_replicas
        if before == 0:
            return 0
    return _round(rs.replicas * maximum / before) - rs.replicas


def _proportion(
    rs: RolloutReplicaSet, rollout: Rollout, replicas: int, to_add: int, added: int
) -> int:
    if rs.replicas == 0 or to_add == 0 or to_add == added:
        return 0
    fraction = _fraction(rs, rollout, replicas)
    allowed = to_add - added
    return min(fraction, allowed) if to_add > 0 else max(fraction, allowed)


def _age_key(rs: RolloutReplicaSet) -> tuple[float, str]:
    # ReplicaSetsByCreationTimestamp: older first, then by name; Go's zero time sorts first.
    return (rs.created if rs.created is not None else -math.inf, rs.name)


def _saturated(rs: RolloutReplicaSet | None, replicas: int) -> bool:
    if rs is None or rs.desired_replicas is None:
        return False
    desired = _atoi(rs.desired_replicas)
    if desired is None:
        return False
    return rs.replicas == replicas and desired == replicas and rs.available == replicas


def scaled_sizes(rollout: Rollout, replicas: int) -> dict[str, int]:
    """Each ReplicaSet's ``spec.replicas`` once the deployment controller has scaled the
    Deployment to ``replicas`` (one call of ``scale`` in sync.go); ReplicaSets it leaves alone
    keep theirs. See ``settled_sizes`` for a paused Deployment."""
    return _scale(rollout, replicas)[0]


def settled_sizes(rollout: Rollout, replicas: int) -> dict[str, int]:
    """Each ReplicaSet's ``spec.replicas`` once the deployment controller is done scaling.

    A paused Deployment runs ``scale`` on every sync, and its own updates of the ReplicaSets
    trigger the next: so it scales again, with the annotations it just wrote, until nothing
    changes. That matters when the split leaves one ReplicaSet holding replicas (it then takes
    exactly ``replicas``, not ``replicas + maxSurge``) or the largest was clamped at 0. An
    unpaused Deployment scales once; then the rollout (``rolloutRolling``) takes over.
    """
    sizes = scaled_sizes(rollout, replicas)
    if not rollout.paused:
        return sizes
    for _ in range(100):
        current = {rs.name: rs.replicas for rs in rollout.replicasets}
        sizes, annotated = _scale(rollout, replicas)
        if sizes == current:
            return sizes
        maximum = replicas + max_surge(rollout, replicas)
        updated = tuple(
            replace(rs, replicas=sizes[rs.name], desired_replicas=str(replicas),
                    max_replicas=maximum)
            if rs.name in annotated
            else rs
            for rs in rollout.replicasets
        )  # fmt: skip
        rollout = replace(rollout, replicasets=updated)
    raise RolloutError(f"scaling to {replicas} does not settle")


def _scale(rollout: Rollout, replicas: int) -> tuple[dict[str, int], set[str]]:
    """``scale``: the sizes, and the ReplicaSets whose replicas annotations it writes
    (``scaleReplicaSet`` writes them with every update it makes)."""
    if not 0 <= replicas <= INT32_MAX:
        raise RolloutError(f"{replicas} replicas is outside 0..{INT32_MAX}")
    sizes = {rs.name: rs.replicas for rs in rollout.replicasets}
    by_name = {rs.name: rs for rs in rollout.replicasets}
    new = by_name.get(rollout.new) if rollout.new is not None else None
    active = [rs for rs in rollout.replicasets if rs.replicas > 0]
    if len(active) <= 1:
        if active:
            chosen = active[0]
        elif new is not None:
            chosen = new
        elif rollout.replicasets:
            chosen = max(rollout.replicasets, key=_age_key)
        else:
            return sizes, set()
        if chosen.replicas == replicas:
            return sizes, set()
        sizes[chosen.name] = replicas
        return sizes, {chosen.name}
    if _saturated(new, replicas):
        for rs in active:
            if rs is not new:
                sizes[rs.name] = 0
        return sizes, {rs.name for rs in active if rs is not new and rs.replicas != 0}
    if not rollout.rolling:
        return sizes, set()
    allowed = replicas + max_surge(rollout, replicas) if replicas > 0 else 0
    to_add = allowed - sum(rs.replicas for rs in active)
    if to_add > 0:  # ReplicaSetsBySizeNewer: larger first, then newer first
        ordered = sorted(active, key=_age_key, reverse=True)
        ordered.sort(key=lambda rs: -rs.replicas)
    else:  # ReplicaSetsBySizeOlder (also the order when nothing changes)
        ordered = sorted(active, key=_age_key)
        ordered.sort(key=lambda rs: -rs.replicas)
    added = 0
    for rs in ordered:
        proportion = _proportion(rs, rollout, replicas, to_add, added)
        sizes[rs.name] = rs.replicas + proportion
        added += proportion
    if to_add != 0:
        first = ordered[0].name
        sizes[first] = max(0, sizes[first] + to_add - added)
    # forceUpdate: every active ReplicaSet is updated when its size or annotations differ.
    return sizes, {rs.name for rs in active}


def shrinking(rollout: Rollout, replicas: int) -> dict[str, int]:
    """The ReplicaSets a scale to ``replicas`` shrinks, each with its new size."""
    current = {rs.name: rs.replicas for rs in rollout.replicasets}
    return {
        name: size for name, size in scaled_sizes(rollout, replicas).items() if size < current[name]
    }


def rollout_from_json(
    deployment: Mapping[str, object], replicasets: Sequence[Mapping[str, object]]
) -> Rollout:
    """The :class:`Rollout` of a Deployment and the ReplicaSets it controls, as the API serves
    them (``kubectl get -o json`` items)."""
    spec = _mapping(deployment.get("spec"))
    strategy = _mapping(spec.get("strategy"))
    rolling_update = _mapping(strategy.get("rollingUpdate"))
    meta = _mapping(deployment.get("metadata"))
    revision = _mapping(meta.get("annotations")).get(REVISION)
    status = _mapping(deployment.get("status"))
    sets: list[RolloutReplicaSet] = []
    new = None
    for rs in replicasets:
        rs_meta = _mapping(rs.get("metadata"))
        annotations = _mapping(rs_meta.get("annotations"))
        name = str(rs_meta.get("name", ""))
        replicas = _mapping(rs.get("spec")).get("replicas", 1)
        available = _mapping(rs.get("status")).get("availableReplicas", 0)
        max_replicas = _int32(annotations.get(MAX_REPLICAS))
        desired = annotations.get(DESIRED_REPLICAS)
        created = rs_meta.get("creationTimestamp")
        sets.append(RolloutReplicaSet(
            name=name,
            created=parse_time(created) if isinstance(created, str) else None,
            replicas=replicas if isinstance(replicas, int) else 1,
            max_replicas=max_replicas,
            desired_replicas=desired if isinstance(desired, str) else None,
            available=available if isinstance(available, int) else 0,
        ))  # fmt: skip
        if revision is not None and annotations.get(REVISION) == revision:
            new = name
    status_replicas = status.get("replicas", 0)
    return Rollout(
        replicasets=tuple(sets),
        new=new,
        rolling=strategy.get("type", "RollingUpdate") == "RollingUpdate",
        max_surge=_intstr(rolling_update.get("maxSurge", "25%")),
        max_unavailable=_intstr(rolling_update.get("maxUnavailable", "25%")),
        status_replicas=status_replicas if isinstance(status_replicas, int) else 0,
        paused=spec.get("paused") is True,
    )


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _atoi(value: str) -> int | None:
    """Go's ``strconv.Atoi``: an optional sign and ASCII digits, else ``None``."""
    return int(value) if _ATOI.match(value) else None


def _int32(value: object) -> int | None:
    """A non-negative int32 annotation value (``getNonNegativeInt32FromAnnotation``), else
    ``None``."""
    number = _atoi(value) if isinstance(value, str) else None
    return number if number is not None and 0 <= number <= INT32_MAX else None


def _intstr(value: object) -> int | str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | str):
        return value
    return None


def rollout_for(objects: ClusterObjects, snapshot: Snapshot) -> Rollout | None:
    """The :class:`Rollout` of ``snapshot``'s Deployment from the dump it was taken from;
    ``None`` for a ReplicaSet, or a Deployment the dump does not hold."""
    workload = snapshot.workload
    if workload.kind != "Deployment":
        return None
    deployment = objects.deployments.get((workload.namespace, workload.name))
    if deployment is None:
        return None
    owned = [
        objects.replicasets[(workload.namespace, name)]
        for name in sorted(snapshot.replicasets)
        if (workload.namespace, name) in objects.replicasets
    ]
    return rollout_from_json(
        cast(Mapping[str, object], deployment), [cast(Mapping[str, object], rs) for rs in owned]
    )
