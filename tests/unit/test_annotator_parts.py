"""The annotator's parts, each driven alone, without the service's loops: the backlog (the write
queue and its guards) over a consumer of the in-memory bus, and the writer (pacing and the
request) over ``FakePods`` and a fake clock. The whole service over the same fakes is
``test_annotator_service.py``; the intake is driven through it there (all it does is feed the
backlog what it consumed)."""

from __future__ import annotations

import asyncio
import time

from opentelemetry import trace
from tests.support.clock import FakeClock
from tests.support.costs import Desire, desired
from tests.unit.test_annotator_service import NS, FakePods

from podcost.annotator.backlog import Backlog, Batch, Running
from podcost.annotator.decisions import DecisionLog
from podcost.annotator.intake import Verifier
from podcost.annotator.plan import Ledger, Result, Scope, Ticket, Want
from podcost.annotator.settings import AnnotatorSettings
from podcost.annotator.writer import Writer
from podcost.runtime.metrics import Metrics
from podcost.runtime.settings import ServiceSettings
from podcost_bus import MemoryBus, Record
from podcost_core.model import PodUID
from podcost_kube.client import KubeError

TOPIC = "podcost.costs.local"


def backlog_over(running: Running, config: AnnotatorSettings, metrics: Metrics) -> Backlog:
    backlog = Backlog(
        config=config, metrics=metrics, clock=FakeClock(), decisions=DecisionLog(),
        running=running,
    )  # fmt: skip
    backlog.restart()
    return backlog


async def test_the_backlog_coalesces_a_pods_writes_and_commits_each_record_once_settled() -> None:
    bus = MemoryBus(partitions=1)
    for value in (b"older", b"newer"):
        await bus.publish(TOPIC, "local/shop/Deployment/web", value)
    metrics = Metrics("annotator")
    async with bus.consumer([TOPIC], group="podcost-annotator.local") as consumer:
        older_record, newer_record = await consumer.poll(max_wait=0)
        backlog = backlog_over(Running(consumer=consumer), AnnotatorSettings(), metrics)
        backlog.read_under = {tp: consumer.epoch(tp) for tp in consumer.assignment()}
        older, newer = Batch(older_record, None, None), Batch(newer_record, None, None)
        uid = PodUID("uid-a")
        backlog.queue(Want(uid, NS, "a", 1, 0, backlog.track(older, 1)))
        backlog.queue(newer_want := Want(uid, NS, "a", 2, 0, backlog.track(newer, 1)))

        assert older.results == {Result.SUPERSEDED: 1}  # never written: the newer cost wins
        assert backlog.depth == 1
        assert backlog.committable() == [older]  # settled, so committed before the newer write
        assert backlog.committable() == []  # the newer record waits for its write

        _, _, ready = backlog.ready.get_nowait()
        assert backlog.ready.empty()  # one turn for the pod, not one per cost offered
        assert backlog.writes.take(ready) is newer_want
        backlog.writes.finish(ready)
        backlog.settle(newer_want, Result.OK)
        assert backlog.committable() == [newer]
    sample = metrics.get_sample_value
    assert sample("podcost_patches_total", {"result": "superseded"}) == 1
    assert sample("podcost_patches_total", {"result": "ok"}) == 1


async def test_the_backlog_pauses_consuming_at_the_high_water_mark_and_resumes_at_low() -> None:
    bus = MemoryBus(partitions=1)
    await bus.publish(TOPIC, "local/shop/Deployment/web", b"decision")
    config = AnnotatorSettings(high_water=2, low_water=1)
    async with bus.consumer([TOPIC], group="podcost-annotator.local") as consumer:
        (record,) = await consumer.poll(max_wait=0)
        backlog = backlog_over(Running(consumer=consumer), config, Metrics("annotator"))
        backlog.read_under = {tp: consumer.epoch(tp) for tp in consumer.assignment()}
        ticket = backlog.track(Batch(record, None, None), 2)
        wants = [Want(PodUID(f"uid-{name}"), NS, name, 1, 0, ticket) for name in ("a", "b")]
        for want in wants:
            backlog.queue(want)
        backlog.observe_depth()
        assert consumer.paused
        for want in wants:
            assert backlog.writes.take(want.uid) is want
            backlog.writes.finish(want.uid)
            backlog.settle(want, Result.OK)
            backlog.observe_depth()
        assert not consumer.paused
        assert (backlog.marks.pauses, backlog.marks.resumes) == (1, 1)


class WriterHarness:
    """A writer over ``FakePods`` (and its view), on a fake clock, owning what ``owned`` says."""

    def __init__(self, pods: FakePods, *, owned: bool = True) -> None:
        self.pods, self.clock, self.metrics = pods, FakeClock(), Metrics("annotator")
        settings = ServiceSettings(http_port=0, retry_initial_seconds=1.0, retry_max_seconds=8.0)
        config, running, scope = AnnotatorSettings(), Running(view=pods.view), Scope()
        verifier = Verifier(config=config, scope=scope, metrics=self.metrics, clock=self.clock,
                            wall=time.time, running=running)  # fmt: skip
        self.writer = Writer(
            settings=settings, config=config, metrics=self.metrics, clock=self.clock,
            wall=time.time, otel=trace.NoOpTracer(), backoff=settings.backoff(),
            rng=lambda: 1.0, scope=scope, verifier=verifier, running=running,
            owned=lambda batch: owned,
        )  # fmt: skip
        self.writer.restart()

    def want(self, name: str, uid: str, cost: int) -> Want[Ticket[Batch]]:
        message = desired(NS, "web", [Desire(name, uid, cost)])
        batch = Batch(Record(TOPIC, 0, 0, None, b""), message, None, accepted_at=time.time())
        ticket = Ledger[Batch]().open((TOPIC, 0), 0, 1, batch)
        return Want(PodUID(uid), NS, name, cost, None, ticket)


async def test_the_writer_waits_out_a_429s_retry_after_then_writes_the_cost() -> None:
    pods = FakePods()
    uid = pods.add("a")
    harness = WriterHarness(pods)
    pods.clock = harness.clock
    pods.fail("patch", KubeError("HTTP 429", status=429, retriable=True, retry_after=3.0))
    write = asyncio.create_task(harness.writer.write(pods, harness.want("a", uid, 5)))
    await harness.clock.advance(10.0)

    assert await write is Result.OK
    assert pods.cost("a") == "5"
    patches = [at for request, _, at in pods.timeline if request == "patch"]
    assert len(patches) == 2
    assert patches[0] == 0.0
    assert patches[1] >= 3.0  # nothing again before its Retry-After
    throttled = {"result": "throttled"}
    assert harness.metrics.get_sample_value("podcost_patches_total", throttled) == 1


async def test_the_writer_makes_no_request_for_a_record_whose_assignment_is_gone() -> None:
    pods = FakePods()
    uid = pods.add("a")
    harness = WriterHarness(pods, owned=False)

    assert await harness.writer.write(pods, harness.want("a", uid, 5)) is Result.REVOKED
    assert pods.requests == []
    assert pods.cost("a") is None
