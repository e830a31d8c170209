"""Desired-cost messages as the aggregator publishes them, and a counting wrapper around the pod
API, for the annotator's unit and integration tests.

``desired`` builds a ``DesiredCostsMessage``; ``publish_costs`` puts it on a bus with an optional
trace context. ``CountingPods`` wraps any ``PodAPI`` (the real ``Kube`` adapter in integration
tests) and counts the PATCH requests that reach it per pod; its ``gate`` can hold every PATCH
before it is sent, to stop the annotator between consuming a record and writing it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podcost.annotator import PodAPI
from podcost_bus import Bus, Delivery, publish_message
from podcost_contracts.messages import DesiredCostsMessage, PodCost
from podcost_core.model import PodUID
from podcost_kube.events import EventSink


@dataclass(frozen=True)
class Desire:
    """One pod's desired cost; ``previous`` is what the snapshot saw on it."""

    name: str
    uid: str
    cost: int
    previous: int | None = None


def desired(
    namespace: str,
    workload: str,
    pods: Sequence[Desire],
    *,
    version: int = 1,
    cluster: str = "local",
    emitted_at: float | None = None,
    changed_at: float | None = None,
) -> DesiredCostsMessage:
    """The aggregator's decision for ``namespace/workload`` (a Deployment) at ``version``; the
    change it answers was seen at ``changed_at`` (default: when it is emitted)."""
    emitted_at = time.time() if emitted_at is None else emitted_at
    return DesiredCostsMessage(
        key=f"{cluster}/{namespace}/Deployment/{workload}",
        version=version,
        costs=tuple(
            PodCost(
                namespace=namespace,
                name=pod.name,
                uid=PodUID(pod.uid),
                cost=pod.cost,
                previous=pod.previous,
            )
            for pod in pods
        ),
        complete=True,
        emitted_at=emitted_at,
        changed_at=emitted_at if changed_at is None else changed_at,
    )


async def publish_costs(
    bus: Bus, topic: str, message: DesiredCostsMessage, trace: Mapping[str, str] | None = None
) -> Delivery:
    return await publish_message(bus, topic, message, trace=trace)


class CountingPods:
    """A ``PodAPI`` that counts the PATCH requests (per ``namespace/name``) it passes on."""

    def __init__(self, inner: PodAPI) -> None:
        self.inner = inner
        self.patches: Counter[str] = Counter()
        """PATCH requests sent to ``inner``, per pod."""
        self.reads: Counter[str] = Counter()
        self.gate: asyncio.Event | None = None
        """When set to an unset event, every PATCH waits for it before it is sent."""
        self.held = asyncio.Event()
        """Set once a PATCH is waiting at the gate."""
        self.before_patch: dict[str, Callable[[], Awaitable[None]]] = {}
        """Per pod name: something to do (once) between the annotator's read and its PATCH."""

    @property
    def total(self) -> int:
        return sum(self.patches.values())

    async def read_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads[f"{namespace}/{name}"] += 1
        return await self.inner.read_pod(namespace, name)

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Events pass through to ``inner`` uncounted (when it writes them: the ``Kube``
        adapter), as the annotator writes them in production."""
        assert isinstance(self.inner, EventSink), "events need the Kube adapter underneath"
        return await self.inner.create_event(namespace, body)

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        assert isinstance(self.inner, EventSink), "events need the Kube adapter underneath"
        return await self.inner.patch_event(namespace, name, patch)

    async def patch_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, cost: int, *, seen: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        if self.gate is not None:
            self.held.set()
            await self.gate.wait()
        meddle = self.before_patch.pop(pod, None)
        if meddle is not None:
            await meddle()
        self.patches[f"{namespace}/{pod}"] += 1
        return await self.inner.patch_deletion_cost_if_unchanged(namespace, pod, cost, seen=seen)
