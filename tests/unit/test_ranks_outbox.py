"""The ranks outbox of a process's rankers (``podcost.ranker.outbox``) over the in-memory bus:
every strategy's answers to the same snapshots in one record, a strategy alone publishing its
own kind at once, records per partition and split when too large, each answer's fate back to
its strategy (one strategy's refusal leaves the others' acknowledged), transient errors
retried, and cancellation withdrawing what was not sent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any

import pytest
from tests.support.tasks import leak_check

from podcost.ranker import outbox as outbox_module
from podcost.ranker.outbox import BATCH_MAX_ANSWERS, RanksOutbox, Refusal
from podcost.runtime.clock import WallClock
from podcost.runtime.metrics import Metrics
from podcost_bus import BusError, BusSettings, Delivery, MemoryBus, Record
from podcost_contracts.messages import (
    Encoded,
    MessageTooLarge,
    RankedWorkload,
    RanksBatchMessage,
    RanksRecord,
    StrategyRanksBatchMessage,
    StrategyRanksMessage,
    decode_ranks_record,
    encode,
)
from podcost_core.model import PodUID

TOPIC = BusSettings().topics.ranks
CAP, AGE, QOS = "capacity-type", "age", "priority-qos"
#: Long enough that a test waiting for it would fail its own timeout: what goes out before it
#: went out because every strategy had answered.
NEVER = 60.0
WITHIN = 5.0


def key(name: str) -> str:
    return f"eu-1/shop/Deployment/{name}"


def ranked(name: str, version: int = 1, pods: int = 2) -> RankedWorkload:
    scores = {PodUID(f"{name}-{index}"): float(index) for index in range(pods)}
    return RankedWorkload(key=key(name), version=version, scores=scores, duration_seconds=0.0)


def same_partition(bus: MemoryBus, count: int, prefix: str = "web") -> list[str]:
    """``count`` workload names whose keys the bus puts in one partition."""
    names = [f"{prefix}-{index}" for index in range(200)]
    first = bus.partition_of(key(names[0]).encode())
    return [name for name in names if bus.partition_of(key(name).encode()) == first][:count]


def outbox(bus: MemoryBus, *members: str, linger_s: float = NEVER) -> RanksOutbox:
    box = RanksOutbox(
        bus, TOPIC, metrics=Metrics("rankers"), clock=WallClock(), partition_of=bus.partition_of,
        linger_s=linger_s,
    )  # fmt: skip
    for member in members:
        box.join(member)
    return box


def published(bus: MemoryBus) -> list[tuple[Record, RanksRecord]]:
    return [
        (record, decode_ranks_record(record.value, record.headers, key=record.key))
        for record in bus.records(TOPIC)
    ]


def produced(box: RanksOutbox) -> float:
    labels = {"topic": TOPIC}
    return box.metrics.get_sample_value("podcost_messages_produced_total", labels) or 0.0


def answered(message: RanksRecord) -> list[tuple[str, str, int]]:
    answers = (message,) if isinstance(message, StrategyRanksMessage) else message.messages()
    return [(answer.strategy, answer.key, answer.version) for answer in answers]


async def test_every_strategy_s_answers_to_the_same_snapshots_go_out_in_one_record() -> None:
    bus = MemoryBus()
    box = outbox(bus, CAP, AGE, QOS)
    names = same_partition(bus, 2)
    async with leak_check():
        fates = await asyncio.wait_for(
            asyncio.gather(
                box.publish(CAP, [ranked(name) for name in names]),
                box.publish(AGE, [ranked(name) for name in names]),
                box.publish(QOS, []),  # nothing of what it read to answer: it answered too
            ),
            WITHIN,
        )
    assert list(fates) == [[None, None], [None, None], []]
    [(record, message)] = published(bus)
    assert isinstance(message, RanksBatchMessage)
    assert answered(message) == [(CAP, key(n), 1) for n in names] + [
        (AGE, key(n), 1) for n in names
    ]
    assert record.key == key(names[0]).encode()
    assert produced(box) == 1


async def test_a_strategy_alone_publishes_its_own_kind_at_once() -> None:
    bus = MemoryBus()
    box = outbox(bus, CAP)
    names = same_partition(bus, 2)
    fates = await asyncio.wait_for(box.publish(CAP, [ranked(n) for n in names]), WITHIN)
    assert fates == [None, None]
    [(_, message)] = published(bus)
    # What a ranker alone in its process publishes, readable by every aggregator.
    assert isinstance(message, StrategyRanksBatchMessage)
    assert message.strategy == CAP
    assert answered(message) == [(CAP, key(n), 1) for n in names]


async def test_a_strategy_whose_partners_do_not_answer_publishes_after_the_linger() -> None:
    bus = MemoryBus()
    box = outbox(bus, CAP, AGE, linger_s=0.01)
    [name] = same_partition(bus, 1)
    assert await asyncio.wait_for(box.publish(CAP, [ranked(name)]), WITHIN) == [None]
    [(_, message)] = published(bus)
    assert isinstance(message, StrategyRanksBatchMessage)  # its answers alone: its own kind
    assert answered(message) == [(CAP, key(name), 1)]


async def test_a_partner_that_stops_is_no_longer_waited_for() -> None:
    bus = MemoryBus()
    box = outbox(bus, CAP, AGE)
    [name] = same_partition(bus, 1)
    waiting = asyncio.create_task(box.publish(CAP, [ranked(name)]))
    await asyncio.sleep(0)
    assert not bus.records(TOPIC)  # it waits for AGE's answers
    box.leave(AGE)
    assert await asyncio.wait_for(waiting, WITHIN) == [None]
    assert [answered(message) for _, message in published(bus)] == [[(CAP, key(name), 1)]]


async def test_records_hold_one_partition_s_workloads_and_are_split_when_too_many() -> None:
    bus = MemoryBus()
    box = outbox(bus, CAP, AGE)
    names = [f"web-{index}" for index in range(150)]  # more than a record holds in a partition
    fates = await asyncio.wait_for(
        asyncio.gather(
            box.publish(CAP, [ranked(n) for n in names]),
            box.publish(AGE, [ranked(n, version=2) for n in names]),
        ),
        WITHIN,
    )
    assert list(fates) == [[None] * len(names)] * 2
    records = published(bus)
    every: list[tuple[str, str, int]] = []
    for record, message in records:
        assert 1 <= len(answered(message)) <= BATCH_MAX_ANSWERS
        keys = {k for _, k, _ in answered(message)}
        assert {bus.partition_of(k.encode()) for k in keys} == {record.partition}
        every.extend(answered(message))
    # Every answer once; each strategy's in the order handed over, within each partition.
    assert sorted(every) == sorted(
        [(CAP, key(n), 1) for n in names] + [(AGE, key(n), 2) for n in names]
    )
    partitions = {bus.partition_of(key(n).encode()) for n in names}
    assert len(records) > len(partitions)  # split: some partition had more than a record holds
    assert produced(box) == len(records)
    for partition in partitions:
        mine = [a for r, m in records if r.partition == partition for a in answered(m)]
        for strategy in (CAP, AGE):
            order = [k for s, k, _ in mine if s == strategy]
            assert order == [
                key(n) for n in names if bus.partition_of(key(n).encode()) == partition
            ]


async def test_an_answer_too_large_alone_is_refused_and_the_others_go_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bus = MemoryBus()
    box = outbox(bus, CAP, AGE)
    small, huge = same_partition(bus, 2)

    def sized(message: Any, **kwargs: Any) -> Encoded:
        if any(answer.key == key(huge) for answer in message.answers):
            raise MessageTooLarge(message.KIND, 2_000_000, 1_048_576)
        return encode(message, **kwargs)

    monkeypatch.setattr(outbox_module, "encode", sized)
    cap, age = await asyncio.wait_for(
        asyncio.gather(
            box.publish(CAP, [ranked(small), ranked(huge)]), box.publish(AGE, [ranked(small)])
        ),
        WITHIN,
    )
    assert age == [None]
    assert cap[0] is None
    refusal = cap[1]
    assert isinstance(refusal, Refusal)
    assert refusal.reason.startswith("the ranks do not fit in a record")
    assert isinstance(refusal.error, MessageTooLarge)
    # The record was halved until the answer too large stood alone; the others went out.
    sent = [a for _, message in published(bus) for a in answered(message)]
    assert sent == [(CAP, key(small), 1), (AGE, key(small), 1)]


class FailingBus(MemoryBus):
    """A ``MemoryBus`` whose acknowledgements of the ranks records fail with ``failures``, one
    per record sent, in order; a failed record is not on the topic."""

    def __init__(self, failures: list[BusError]) -> None:
        super().__init__()
        self.failures = failures

    async def send(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Awaitable[Delivery]:
        if topic == TOPIC and self.failures:
            failed: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
            failed.set_exception(self.failures.pop(0))
            return failed
        return await super().send(topic, key, value, headers)


async def test_a_record_refused_for_a_while_is_published_again_and_acknowledged() -> None:
    bus = FailingBus([BusError("the leader moved", retriable=True)])
    box = outbox(bus, CAP, AGE)
    [name] = same_partition(bus, 1)
    fates = await asyncio.wait_for(
        asyncio.gather(box.publish(CAP, [ranked(name)]), box.publish(AGE, [ranked(name)])),
        WITHIN,
    )
    assert list(fates) == [[None], [None]]
    assert [answered(m) for _, m in published(bus)] == [[(CAP, key(name), 1), (AGE, key(name), 1)]]
    assert produced(box) == 1


async def test_a_record_refused_for_good_is_a_refusal_for_each_of_its_answers() -> None:
    bus = FailingBus([BusError("authorisation failed", retriable=False)])
    box = outbox(bus, CAP, AGE)
    [name] = same_partition(bus, 1)
    cap, age = await asyncio.wait_for(
        asyncio.gather(box.publish(CAP, [ranked(name)]), box.publish(AGE, [ranked(name)])),
        WITHIN,
    )
    for [fate] in (cap, age):
        assert isinstance(fate, Refusal)
        assert fate.reason == "cannot publish the ranks: authorisation failed"
    assert not bus.records(TOPIC)
    assert produced(box) == 0


async def test_a_strategy_cancelled_before_its_answers_go_out_withdraws_them() -> None:
    bus = MemoryBus()
    box = outbox(bus, CAP, AGE)
    [name] = same_partition(bus, 1)
    async with leak_check():
        cancelled = asyncio.create_task(box.publish(CAP, [ranked(name)]))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        # AGE is not held up by it, and publishes its answers alone.
        assert await asyncio.wait_for(box.publish(AGE, [ranked(name)]), WITHIN) == [None]
    [(_, message)] = published(bus)
    assert isinstance(message, StrategyRanksBatchMessage)
    assert answered(message) == [(AGE, key(name), 1)]


class UnackedBus(MemoryBus):
    """A ``MemoryBus`` whose ranks records are never acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = asyncio.Event()

    async def send(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Awaitable[Delivery]:
        if topic != TOPIC:
            return await super().send(topic, key, value, headers)
        self.sent.set()
        return asyncio.get_running_loop().create_future()


async def test_once_every_strategy_stopped_what_awaits_its_acknowledgement_is_abandoned() -> None:
    bus = UnackedBus()
    box = outbox(bus, CAP)
    [name] = same_partition(bus, 1)
    async with leak_check():
        waiting = asyncio.create_task(box.publish(CAP, [ranked(name)]))
        await asyncio.wait_for(bus.sent.wait(), WITHIN)
        box.leave(CAP)  # its ranker stopped (it never committed those offsets)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, WITHIN)


async def test_an_unexpected_failure_while_sending_fails_every_waiting_strategy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bus = MemoryBus()
    box = outbox(bus, CAP, AGE)
    [name] = same_partition(bus, 1)

    def broken(message: Any, **kwargs: Any) -> Encoded:
        raise RuntimeError("a defect in the encoder")

    monkeypatch.setattr(outbox_module, "encode", broken)
    async with leak_check():
        results = await asyncio.wait_for(
            asyncio.gather(
                box.publish(CAP, [ranked(name)]),
                box.publish(AGE, [ranked(name)]),
                return_exceptions=True,
            ),
            WITHIN,
        )
    assert [str(result) for result in results] == ["a defect in the encoder"] * 2
    assert not bus.records(TOPIC)
