"""The annotator's memory of the last decision per pod, for ``podcost explain``.

Every desired-costs message the annotator accepts is an explained decision: each pod's cost with
every strategy's term of it, and the trace it belongs to (its W3C trace context rides in the
record's headers). :class:`DecisionLog` keeps the latest :class:`Explanation` per pod, while
the pod lives and bounded (least recently decided pods are forgotten first), records what
became of each write, and remembers the decision whose write actually set the pod's current
cost. The annotator serves it as ``GET /explain/{namespace}/{pod}`` on its HTTP port
(``router``); ``podcost explain`` reads it and renders the same :class:`Explanation` when it
reads a decision off the costs topic or computes one now (:func:`explanations`).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from opentelemetry import trace
from pydantic import BaseModel, ConfigDict

from podcost.runtime.telemetry import extract
from podcost_contracts.messages import DesiredCostsMessage
from podcost_core.explain import placements, tier_sums

if TYPE_CHECKING:
    from fastapi import APIRouter

#: How many pods the annotator remembers a decision for (about 0.2 KB each).
DEFAULT_CAPACITY = 20_000

Source = Literal["annotator", "costs topic", "computed now"]


class Term(BaseModel):
    """One strategy's term of a pod's cost."""

    model_config = ConfigDict(frozen=True)

    strategy: str
    tier: int
    """The strategy's tier (lower dominates)."""
    weight: int
    raw: float | None
    """The strategy's own score (−level for a spread strategy), when known."""
    normalized: int
    """The score normalized to [0, 100]."""
    points: int
    """``weight · normalized``: what it adds to the pod's tier sum."""


class Written(BaseModel):
    """The decision whose write set the cost the pod carries."""

    model_config = ConfigDict(frozen=True)

    cost: int
    version: int
    trace_id: str | None


class Explanation(BaseModel):
    """Why a pod should carry its cost: the JSON of ``/explain`` and ``podcost explain``."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    pod: str
    uid: str
    workload: str
    """The workload key, ``cluster/namespace/kind/name``."""
    version: int
    """The snapshot version decided."""
    cost: int
    """The decided ``controller.kubernetes.io/pod-deletion-cost``."""
    previous: int | None
    """The cost on the pod when the snapshot was taken."""
    complete: bool
    """Whether every strategy of the policy took part."""
    missing: tuple[str, ...] = ()
    decided_at: float
    """When the aggregator published the decision (POSIX seconds)."""
    trace_id: str | None
    """The trace of the decision (32 hex digits), when it carried one."""
    position: int
    """1 = among the first pods to be deleted; tied pods share it."""
    tied: int
    of: int
    tier_sums: tuple[int, ...]
    """Σ points per tier, dominant tier first: what the pods are ordered by."""
    terms: tuple[Term, ...]
    source: Source
    result: str | None = None
    """What the annotator did with the cost (``ok``, ``unchanged``, ``foreign``, ``dry_run``,
    ``gone``, ``error``, ``refused``); ``None`` while the write is under way or when not known."""
    written: Written | None = None
    """The decision whose write set the pod's current cost, if this annotator made it."""


def trace_id_of(headers: Mapping[str, bytes] | None) -> str | None:
    """The trace id in a record's W3C ``traceparent`` header (32 hex digits), if valid."""
    context = trace.get_current_span(extract(headers)).get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def explanations(
    message: DesiredCostsMessage, *, trace_id: str | None, source: Source
) -> list[Explanation]:
    """One :class:`Explanation` per pod of ``message``, in its order."""
    tiers = {term.tier for pod in message.costs for term in pod.breakdown.values()}
    sums = {pod.uid: tier_sums(pod.breakdown.values(), tiers) for pod in message.costs}
    places = placements(sums)
    return [
        Explanation(
            namespace=pod.namespace,
            pod=pod.name,
            uid=pod.uid,
            workload=message.key,
            version=message.version,
            cost=pod.cost,
            previous=pod.previous,
            complete=message.complete,
            missing=message.missing,
            decided_at=message.emitted_at,
            trace_id=trace_id,
            position=places[pod.uid].position,
            tied=places[pod.uid].tied,
            of=places[pod.uid].of,
            tier_sums=sums[pod.uid],
            terms=tuple(
                Term(
                    strategy=name,
                    tier=term.tier,
                    weight=term.weight,
                    raw=term.raw,
                    normalized=term.normalized,
                    points=term.weight * term.normalized,
                )
                for name, term in pod.breakdown.items()
            ),
            source=source,
        )
        for pod in message.costs
    ]


class _Wrote(NamedTuple):
    """A :class:`Written` as the log keeps it: a tuple, not a pydantic model (about 0.3 KB less
    per written pod); its trace id is the string of its decision, shared by its pods."""

    cost: int
    version: int
    trace_id: str | None

    @classmethod
    def of(cls, written: Written) -> _Wrote:
        return cls(written.cost, written.version, written.trace_id)

    def model(self) -> Written:
        return Written(cost=self.cost, version=self.version, trace_id=self.trace_id)


@dataclass(slots=True)
class _Remembered:
    """What the log keeps per pod: how to get the decision again (shared by all its pods: the
    record's bytes as they came, decoded again when asked), and what became of the pod's write.
    The :class:`Explanation` is built when asked for: pydantic models of every pod's terms cost
    about 9 KB a pod, the decoded message about 5 KB. Its strings (the pod's namespace, name,
    uid) are interned: the same objects as the watcher's cache in embedded mode, not a copy per
    decoded decision."""

    decision: Callable[[], DesiredCostsMessage]
    version: int
    trace_id: str | None
    uid: str
    result: str | None = None
    written: _Wrote | None = None


class DecisionLog:
    """The last decision per pod, least recently decided forgotten first past ``capacity``; a
    pod's goes with the pod (:meth:`forget`: the annotator calls it when its view sees the pod
    deleted or its write finds it gone)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._pods: OrderedDict[tuple[str, str], _Remembered] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pods)

    def record(
        self,
        message: DesiredCostsMessage,
        trace_id: str | None,
        again: Callable[[], DesiredCostsMessage] | None = None,
    ) -> None:
        """Remember ``message`` as the latest decision of each of its pods; ``again`` decodes it
        anew from its record (without it the message itself is kept)."""
        decision = again if again is not None else (lambda: message)
        for pod in message.costs:
            where = (sys.intern(pod.namespace), sys.intern(pod.name))
            before = self._pods.pop(where, None)
            entry = _Remembered(decision, message.version, trace_id, sys.intern(pod.uid))
            if before is not None and before.uid == pod.uid:
                entry.written = before.written
            self._pods[where] = entry
        while len(self._pods) > self.capacity:
            self._pods.popitem(last=False)

    def settle(
        self,
        namespace: str,
        pod: str,
        uid: str,
        *,
        version: int,
        result: str,
        written: Written | None = None,
    ) -> None:
        """Record what became of the write of ``version``'s cost; ``written`` when it set the
        pod's cost (even if a newer decision came meanwhile: that one found it already set)."""
        known = self._pods.get((namespace, pod))
        if known is None or known.uid != uid:
            return  # forgotten, or the name now belongs to another pod
        if known.version == version:
            known.result = result
        if written is not None and (known.written is None or known.written.version <= version):
            known.written = _Wrote.of(written)

    def forget(self, namespace: str, pod: str, uid: str) -> None:
        """Forget the decision about the pod ``uid`` (deleted, or found gone by its write); a
        pod that took its name since keeps its own."""
        known = self._pods.get((namespace, pod))
        if known is not None and known.uid == uid:
            del self._pods[(namespace, pod)]

    def get(self, namespace: str, pod: str) -> Explanation | None:
        """The last decision about ``namespace/pod``, if remembered."""
        known = self._pods.get((namespace, pod))
        if known is None:
            return None
        every = explanations(known.decision(), trace_id=known.trace_id, source="annotator")
        found = next(e for e in every if e.uid == known.uid)
        written = None if known.written is None else known.written.model()
        return found.model_copy(update={"result": known.result, "written": written})

    def router(self) -> APIRouter:
        """``GET /explain/{namespace}/{pod}``: the pod's :class:`Explanation`, or 404."""
        from fastapi import APIRouter, HTTPException  # only with the HTTP server: not at start

        router = APIRouter()

        @router.get("/explain/{namespace}/{pod}")
        def explain(namespace: str, pod: str) -> Explanation:
            found = self.get(namespace, pod)
            if found is None:
                raise HTTPException(404, f"no decision known for pod {namespace}/{pod}")
            return found

        return router
