"""The batch step both keyed-state transports share (``podcost_bus.keyed``), and the aggregator's
processor in batches, over the in-memory bus: per-key order within a batch, outputs acknowledged
before anything is kept or committed, a publish the bus refuses for good dead-letters its record
while the rest of the batch goes on, and the costs JSON built without the message models is the
message's own JSON, and the snapshot part of a state is stored as the record it came in. The
faust transport's batches against the real broker are
``tests/integration/test_faust_app.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from tests.support.clock import FakeClock
from tests.support.pipeline import Reader, eventually, running
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.aggregator import AggregatorService, AggregatorSettings
from podcost.aggregator.processor import desired_costs, desired_costs_json
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import ATTR_WORKLOAD, SPAN_COMBINE
from podcost_bus import BusError, BusSettings, Delivery, MemoryBus, Record, publish_message
from podcost_bus.keyed import DROP, Drop, KeyedConsumerLoop, process_batch
from podcost_contracts.messages import (
    TRACEPARENT,
    DeadLetter,
    DesiredCostsMessage,
    StrategyRanksMessage,
    WorkloadSnapshotMessage,
    encode,
    encode_json,
)
from podcost_core.aggregate import SNAPSHOT_PART, Aggregator, WorkloadState, dump_latest
from podcost_core.combine import answers_needed
from podcost_core.model import Snapshot
from podcost_core.policy import DEFAULT_POLICY, policy_from_annotations

TOPIC = "t.source"
OUT = "t.out"
START = 1_714_568_400.0


def record(key: bytes | None, value: bytes, offset: int = 0) -> Record:
    return Record(TOPIC, 0, offset, key, value)


class Appender:
    """Keeps each key's values joined by ``|`` (``drop`` forgets the key); publishes every record's
    new state to ``OUT`` in :meth:`flush`, which waits for ``gate`` first when one is set."""

    parts = ("value",)

    def __init__(self, bus: MemoryBus | None = None) -> None:
        self.bus = bus
        self.seen: list[tuple[bytes, bytes | None]] = []
        self.queued: list[tuple[bytes | None, bytes]] = []
        self.flushed: list[int] = []
        self.gate: asyncio.Event | None = None

    def split(self, record: Record) -> list[tuple[bytes | None, Record]]:
        return [(record.key, record)]

    def on_record(self, record: Record, state: bytes | None) -> bytes | Drop | None:
        self.seen.append((record.value, state))
        if record.value == b"drop":
            return DROP
        new = record.value if state is None else state + b"|" + record.value
        self.queued.append((record.key, new))
        return new

    def on_tick(self, key: bytes | None, state: bytes) -> bytes | None:
        return None

    async def flush(self) -> None:
        queued, self.queued = self.queued, []
        if self.gate is not None:
            await self.gate.wait()
        if self.bus is not None:
            acks = [await self.bus.send(OUT, key, value) for key, value in queued]
            await asyncio.gather(*acks)
        self.flushed.append(len(queued))

    def wakeup(self, state: bytes) -> float | None:
        return None

    def now(self) -> float:
        return 0.0

    def waiting(self, state: bytes) -> bool:
        return False

    def dump(self, old: bytes | None, new: bytes) -> Mapping[str, bytes]:
        return {"value": new}

    def load(self, key: bytes | None, parts: Mapping[str, bytes | None]) -> bytes:
        return parts["value"] or b""


async def test_each_record_of_a_batch_sees_the_state_the_previous_one_of_its_key_left() -> None:
    processor = Appender()
    stored: dict[bytes | None, bytes] = {b"a": b"0"}
    records = [
        record(b"a", b"1"),
        record(b"b", b"x"),
        record(b"a", b"2"),
        record(b"b", b"drop"),
        record(b"b", b"y"),
        record(b"a", b"3"),
    ]

    batch = await process_batch(processor, records, stored.get)

    assert processor.seen == [
        (b"1", b"0"),
        (b"x", None),
        (b"2", b"0|1"),
        (b"drop", b"x"),
        (b"y", None),  # dropped earlier in the batch: starts afresh
        (b"3", b"0|1|2"),
    ]
    assert batch.states == {b"a": b"0|1|2|3", b"b": b"y"}  # one state per key to persist
    assert batch.replaced == {b"b"}  # what was stored for b is replaced, not patched
    assert [outcome for _, _, outcome in batch.outcomes] == [
        b"0|1",
        b"x",
        b"0|1|2",
        DROP,
        b"y",
        b"0|1|2|3",
    ]
    assert [(record, key) for record, key, _ in batch.outcomes] == [
        (record, record.key) for record in records
    ]
    assert processor.flushed == [5]  # one flush, after every record was decided


async def test_the_consumer_loop_commits_and_keeps_a_batch_only_once_its_outputs_are_acked() -> (
    None
):
    bus = MemoryBus()
    processor = Appender(bus)
    processor.gate = asyncio.Event()
    async with bus:
        loop = KeyedConsumerLoop(bus, [TOPIC], "g", processor, tick_s=60.0, poll_s=0.01)
        for value in (b"1", b"2", b"3"):
            await bus.publish(TOPIC, b"k", value)
        out = bus.consumer([OUT], group="reader")
        async with out, running_loop(loop):
            await eventually(lambda: len(processor.seen) == 3, "the batch to be decided")
            await asyncio.sleep(0.05)
            # Decided, but its outputs are not delivered yet: nothing kept, nothing committed.
            assert dict(loop.states) == {}
            assert bus.committed("g") == {}
            processor.gate.set()
            await eventually(lambda: bus.committed("g") != {}, "the batch to be committed")
            assert dict(loop.states) == {b"k": b"1|2|3"}
            assert sum(bus.committed("g").values()) == 3
            records = await out.poll(max_wait=1)
        assert [r.value for r in records] == [b"1", b"1|2", b"1|2|3"]


class running_loop:
    """``loop.run()`` as a task for the block."""

    def __init__(self, loop: KeyedConsumerLoop[Any]) -> None:
        self.loop = loop
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        self.task = asyncio.create_task(self.loop.run())
        await eventually(lambda: self.loop.ready(), "the loop to join its group")

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


# --- the aggregator's processor in batches ----------------------------------------------------

SETTINGS = ServiceSettings(http_port=0)
BUS = BusSettings()
TOPICS = BUS.topics
CAP, AGE = "capacity-type", "age"
ANNOTATIONS = {"podcost.dev/enabled": "true", "podcost.dev/strategies": f"{CAP}=3, {AGE}"}
COSTS = TOPICS.costs_for(CLUSTER)  # where the decisions of the snapshots here go


class RefusingBus(MemoryBus):
    """A ``MemoryBus`` that refuses the costs of the workloads named in ``refuse``: for good, or
    (``times``) that many times, as a moving leader would."""

    def __init__(self, refuse: set[str], *, times: int | None = None) -> None:
        super().__init__()
        self.refuse = refuse
        self.times = times
        self.refused = 0

    async def send(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Awaitable[Delivery]:
        text = key.decode() if isinstance(key, bytes) else key
        refusing = self.times is None or self.refused < self.times
        if topic == COSTS and text in self.refuse and refusing:
            self.refused += 1
            if self.times is None:
                raise BusError("authorisation failed", retriable=False)
            raise BusError("the leader moved", retriable=True)
        return await super().send(topic, key, value, headers)

    async def publish(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Delivery:
        return await (await self.send(topic, key, value, headers))


def workload(name: str) -> Snapshot:
    return replace(deployment(name, pods=4, nodes=4), annotations=ANNOTATIONS)


async def publish_answered(bus: MemoryBus, snapshot: Snapshot, now: float) -> None:
    """The snapshot and every needed strategy's answer, as the rankers would publish them."""
    await publish_message(
        bus, TOPICS.workloads, WorkloadSnapshotMessage.of(snapshot, emitted_at=now)
    )
    policy = policy_from_annotations(dict(snapshot.annotations))
    for bound in policy.bound:
        if bound.strategy.spread:
            continue
        scores = bound.strategy.score(snapshot, bound.args)
        answer = StrategyRanksMessage(
            key=snapshot.workload.key, version=snapshot.version, strategy=bound.name,
            scores=dict(scores), duration_seconds=0.0, emitted_at=now,
        )  # fmt: skip
        await publish_message(bus, TOPICS.ranks, answer)


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def combiner(bus: MemoryBus, provider: TracerProvider) -> AggregatorService:
    return aggregator.bootstrap(
        SETTINGS, BUS, config=AggregatorSettings(deadline_seconds=60), bus=bus,
        clock=FakeClock(START), tracer_provider=provider,
    )  # fmt: skip


async def test_costs_the_bus_refuses_for_good_dead_letter_their_record_and_the_batch_goes_on(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    names = [f"web-{index}" for index in range(5)]
    refused = workload(names[2]).workload.key
    bus = RefusingBus({refused})
    service = combiner(bus, provider)
    async with bus:
        for name in names:  # all there before the aggregator reads: one batch
            await publish_answered(bus, workload(name), START)
        async with (
            Reader(bus, COSTS, DesiredCostsMessage) as costs,
            Reader(bus, TOPICS.deadletter, DeadLetter) as dead,
            running(service),
        ):
            decided = await costs.take(4)
            [letter] = await dead.take(1)
            await eventually(
                lambda: sum(bus.committed(service.processor.group).values()) == 5 * 3,
                "every record to be committed",
            )
    assert sorted(decision.key for decision in decided) == sorted(
        workload(name).workload.key for name in names if workload(name).workload.key != refused
    )
    assert letter.key == refused  # the record that made the decision due
    assert letter.reason.startswith("the costs decided for version 1 cannot be published")
    assert letter.error == "BusError"
    [failed] = [
        span for span in exporter.get_finished_spans()
        if span.name == SPAN_COMBINE and span.status.status_code is StatusCode.ERROR
    ]  # fmt: skip
    assert (failed.attributes or {})[ATTR_WORKLOAD] == refused
    # The refused workload's state is kept all the same: it was decided.
    states = service.transport.states  # type: ignore[attr-defined]
    assert refused.encode() in states


async def test_costs_the_bus_refuses_for_a_while_are_published_again_until_acknowledged(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = spans
    snapshot = workload("web")
    bus = RefusingBus({snapshot.workload.key}, times=2)
    service = combiner(bus, provider)
    async with bus:
        await publish_answered(bus, snapshot, START)
        async with Reader(bus, COSTS, DesiredCostsMessage) as costs, running(service):
            # The retries sleep on the fake clock: move it along until the costs are through.
            clock = service.processor.clock
            assert isinstance(clock, FakeClock)

            async def retried() -> None:
                while True:
                    await asyncio.sleep(0.01)
                    await clock.advance(1.0)

            mover = asyncio.create_task(retried())
            try:
                [decision] = await costs.take(1)
            finally:
                mover.cancel()
            await costs.nothing_more(0.1)
    assert bus.refused == 2
    assert decision.key == snapshot.workload.key
    assert decision.complete


# --- the costs JSON ---------------------------------------------------------------------------


def decisions() -> list[Any]:
    """Decisions of several shapes: complete, incomplete, with pods without a cost, with the
    default policy (a spread strategy), with and without ``changed_at``."""
    aggregator_ = Aggregator()
    out = []
    for index, (pods, opt_in, strategies) in enumerate(
        [
            (6, ANNOTATIONS, (CAP, AGE)),
            (6, ANNOTATIONS, (CAP,)),  # incomplete, at the deadline
            (25, {"podcost.dev/enabled": "true"}, answers_needed(DEFAULT_POLICY)),
            (1, {"podcost.dev/enabled": "true"}, ()),
        ]
    ):
        snapshot = replace(
            deployment(f"app-{index}", pods=pods, nodes=max(1, pods // 2), seed=index),
            annotations=opt_in,
        )
        if index == 1:  # pods without a cost, one with a foreign one
            pods_ = list(snapshot.pods)
            pods_[0] = replace(pods_[0], deletion_cost_raw=None, annotations={})
            snapshot = replace(snapshot, pods=tuple(pods_))
        policy = aggregator_.policies.of(snapshot)
        state = aggregator_.on_snapshot(
            WorkloadState(snapshot.workload.key), snapshot, emitted_at=1.0, now=1.0,
            changed_at=None if index % 2 else 0.5,
        ).state  # fmt: skip
        for bound in policy.bound:
            if bound.name in strategies:
                raw = bound.strategy.score(snapshot, bound.args)
                # Integral scores as ints for one workload: the JSON has them as floats too.
                scores = {uid: int(v) if index == 0 else v for uid, v in raw.items()}
                state = aggregator_.on_ranks(
                    state, strategy=bound.name, version=snapshot.version, scores=scores, now=1.0
                ).state
        _, decision = aggregator_.due(state, 1.0 + 3600)
        assert decision is not None
        out.append(decision)
    return out


@pytest.mark.parametrize("decision", decisions(), ids=lambda d: f"{d.key}-{d.complete}")
def test_the_costs_json_is_exactly_the_message_s_own(decision: Any) -> None:
    message = desired_costs(decision, emitted_at=START)
    body = desired_costs_json(decision, emitted_at=START)
    assert body == message.model_dump_json().encode()
    assert DesiredCostsMessage.model_validate_json(body) == message
    assert encode_json(
        DesiredCostsMessage, body, key=decision.key.encode(), schema_version=1,
        trace={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    ) == encode(
        message, trace={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    )  # fmt: skip


# --- the stored snapshot part -----------------------------------------------------------------


@pytest.mark.parametrize("pods", [2, 200], ids=["plain", "gzipped"])
async def test_a_state_s_snapshot_is_stored_as_its_record_and_reads_back_the_same(
    pods: int, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    processor = combiner(MemoryBus(), spans[0]).processor
    snapshot = replace(deployment("web", pods=pods, nodes=4), annotations=ANNOTATIONS)
    message = WorkloadSnapshotMessage.of(snapshot, emitted_at=START, changed_at=START - 1)
    trace = {TRACEPARENT: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    encoded = encode(message, trace=trace)
    assert encoded.compressed is (pods == 200)
    source = Record(TOPICS.workloads, 0, 0, encoded.key, encoded.value, encoded.headers)
    [(key, step)] = processor.split(source)
    assert key == source.key
    state = processor.on_record(step, None)
    assert isinstance(state, WorkloadState)
    assert state.latest is not None
    await processor.flush()  # the transport stores what a batch decided after its flush

    parts = processor.dump(None, state)
    assert parts[SNAPSHOT_PART].endswith(encoded.value)
    assert len(parts[SNAPSHOT_PART]) < len(encoded.value) + 300
    loaded = processor.load(encoded.key, parts)
    assert loaded == state
    assert loaded.latest is not None
    assert dict(loaded.latest.trace) == trace
    # A snapshot part in the core's own format (the record not at hand) still reads back.
    assert processor.dump(None, state)[SNAPSHOT_PART] == dump_latest(state.latest)
    assert processor.load(encoded.key, {**parts, SNAPSHOT_PART: dump_latest(state.latest)}) == state
