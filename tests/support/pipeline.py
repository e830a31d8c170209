"""Running rankers and the aggregator inside a test, and reading what they publish.

Used by the in-memory pipeline tests (``tests/unit/test_ranker_aggregator_memory.py``) and the
real-broker ones (``tests/integration/test_ranker_aggregator.py``): the same services, the same
helpers, only the bus differs. ``running`` starts services as tasks and stops them at the end
(a service that failed fails the test), ``Reader`` reads a topic as its own consumer group, and
``expected_costs`` is what the pipeline must decide, computed directly with ``rank`` and
``label_costs``; ``fresh_kafka_settings`` points a test at topics of its own on the real broker,
and ``fresh_kafka_bus`` opens a bus over them with the topics created.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Generic, Protocol, TypeVar

from podcost_bus import Bus, BusSettings, Consumer, KafkaBus, Record
from podcost_contracts.messages import (
    Message,
    StrategyRanksBatchMessage,
    StrategyRanksMessage,
    decode,
    decode_ranks_record,
    is_live_set,
)
from podcost_core.combine import rank
from podcost_core.implied import drop_implied
from podcost_core.labels import band_for, current_costs, label_costs
from podcost_core.model import PodUID, Snapshot
from podcost_core.policy import Policy

M = TypeVar("M", bound=Message)


def fresh_kafka_settings(bootstrap: str, prefix: str) -> BusSettings:
    """Bus settings on the real broker with topics no other test uses (``<prefix>-<run>.*``),
    two partitions each, and a short session timeout so a group forms quickly."""
    run = uuid.uuid4().hex[:8]
    return BusSettings(
        bootstrap_servers=bootstrap,
        client_id=f"podcost-{prefix}-{run}",
        topic_workloads=f"{prefix}-{run}.workloads",
        topic_ranks=f"{prefix}-{run}.ranks",
        topic_costs=f"{prefix}-{run}.costs",
        topic_deadletter=f"{prefix}-{run}.deadletter",
        partitions=2,
        session_timeout_ms=6000,
    )


@asynccontextmanager
async def fresh_kafka_bus(
    bootstrap: str, prefix: str, *, partitions: int, clusters: tuple[str, ...] = ()
) -> AsyncIterator[KafkaBus]:
    """A bus over topics of this run's own (:func:`fresh_kafka_settings`) of ``partitions``
    partitions, with the shared topics and each of ``clusters``' costs topic created."""
    settings = fresh_kafka_settings(bootstrap, prefix).model_copy(update={"partitions": partitions})
    async with KafkaBus(settings) as bus:
        topics = settings.topics
        await bus.ensure_topics([*topics.shared(), *map(topics.costs_for, clusters)])
        yield bus


class Runnable(Protocol):
    name: str

    async def run(self) -> None: ...

    def ready(self) -> bool: ...


async def eventually(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Return as soon as ``check()`` holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running(*services: Runnable, timeout: float = 30.0) -> AsyncIterator[None]:
    """Run ``services`` as tasks until the block ends; ready before it starts. A service that
    stopped by itself fails the test with its error."""
    tasks = [asyncio.create_task(service.run(), name=service.name) for service in services]

    def failed() -> list[asyncio.Task[None]]:
        return [task for task in tasks if task.done()]

    try:
        await eventually(
            lambda: bool(failed()) or all(service.ready() for service in services),
            f"{[s.name for s in services]} ready",
            timeout,
        )
        for task in failed():
            task.result()
        yield
        for task in failed():
            task.result()
            raise AssertionError(f"{task.get_name()} stopped by itself")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Reader(Generic[M]):
    """Reads ``topic`` as a consumer group of its own and decodes ``kind`` messages."""

    def __init__(
        self, bus: Bus, topic: str, kind: type[M], decoder: Callable[..., Any] | None = None
    ) -> None:
        """``decoder``: how to decode a record when the topic carries more than one kind (e.g.
        ``decode_costs_record``); by default ``decode(kind, ...)``."""
        self.kind = kind
        self.decoder = decoder
        self.records: list[Record] = []
        self._consumer: Consumer = bus.consumer([topic], group=f"test-reader-{uuid.uuid4().hex}")

    async def __aenter__(self) -> Reader[M]:
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def take(self, count: int, timeout: float = 20.0) -> list[M]:
        """The next ``count`` messages; fails naming how many came before ``timeout``."""
        deadline = time.monotonic() + timeout
        records: list[Record] = []
        while len(records) < count:
            left = deadline - time.monotonic()
            batch = await self._consumer.poll(
                max_wait=max(0.0, left), max_records=count - len(records)
            )
            # A watcher's live set (published after each sync) is no message of any kind here.
            records.extend(record for record in batch if not is_live_set(record.key))
            if not batch and time.monotonic() >= deadline:
                raise AssertionError(
                    f"got {len(records)} of {count} {self.kind.KIND} messages in {timeout}s"
                )
        self.records.extend(records)
        if self.decoder is not None:
            return [self.decoder(r.value, r.headers, key=r.key) for r in records]
        return [decode(self.kind, r.value, r.headers, key=r.key) for r in records]

    async def nothing_more(self, wait: float = 0.5) -> None:
        """Fail if a message comes within ``wait`` seconds (absence takes a wait to show)."""
        extra = [r for r in await self._consumer.poll(max_wait=wait) if not is_live_set(r.key)]
        assert extra == [], f"unexpected {self.kind.KIND} messages: {len(extra)}"


class AnswersReader:
    """Reads the ranks topic as a consumer group of its own: every answer, one
    ``StrategyRanksMessage`` each, whether it came alone or in a ranker's batch."""

    def __init__(self, bus: Bus, topic: str) -> None:
        self.records: list[Record] = []
        self._consumer: Consumer = bus.consumer([topic], group=f"test-reader-{uuid.uuid4().hex}")
        self._ready: list[StrategyRanksMessage] = []
        """Answers read but not taken yet (a batch held more than asked for)."""

    async def __aenter__(self) -> AnswersReader:
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def take(self, count: int, timeout: float = 20.0) -> list[StrategyRanksMessage]:
        """The next ``count`` answers; fails naming how many came before ``timeout``."""
        deadline = time.monotonic() + timeout
        while len(self._ready) < count:
            left = deadline - time.monotonic()
            batch = await self._consumer.poll(max_wait=max(0.0, left))
            self.records.extend(batch)
            for record in batch:
                self._ready.extend(answers_of(record))
            if not batch and time.monotonic() >= deadline:
                raise AssertionError(f"got {len(self._ready)} of {count} answers in {timeout}s")
        taken, self._ready = self._ready[:count], self._ready[count:]
        return taken

    async def nothing_more(self, wait: float = 0.5) -> None:
        """Fail if an answer is left or comes within ``wait`` seconds."""
        extra = await self._consumer.poll(max_wait=wait)
        answers = [*self._ready, *(a for record in extra for a in answers_of(record))]
        assert answers == [], f"unexpected answers: {answers}"


def answers_of(record: Record) -> tuple[StrategyRanksMessage, ...]:
    """The answers a ranks record carries."""
    message = decode_ranks_record(record.value, record.headers, key=record.key)
    return message.messages() if isinstance(message, StrategyRanksBatchMessage) else (message,)


def expected_costs(snapshot: Snapshot, policy: Policy) -> dict[PodUID, int]:
    """What the pipeline must decide for ``snapshot``: ``rank``, ``label_costs``, then
    ``drop_implied``, in the band of ``policy`` (``non_negative_costs``)."""
    combined = rank(snapshot, policy)
    replicaset_of: Mapping[PodUID, str | None] = {p.uid: p.replicaset for p in snapshot.pods}
    current = current_costs(snapshot.pods)
    band = band_for(policy.non_negative_costs)
    labelled = label_costs(combined.order, replicaset_of, current, band=band)
    return dict(drop_implied(labelled, combined.order, snapshot, current, band=band).costs)
