"""The annotator service over the in-memory bus, an in-memory pod API and a fake clock: what the
real API server cannot be made to do on demand (429 with Retry-After, 5xx, timeouts, a cost set
between the read and the write), the QPS budget measured on the fake timeline, dead letters,
and one trace from the record to its patches.

``FakePods`` answers as the API server does for the two requests the annotator makes: 404 for a
missing pod, a refused compare-and-swap when the pod's uid or cost is no longer what was read,
managed fields that name who set the cost. Its ``view`` is the annotator's own view of the
cluster (``ClusterView``, fed here instead of by an informer): the opted-in Deployment ``web``,
its ReplicaSet, and every pod ``add`` makes. What the annotator refuses is in the tests at the
end. The same scenarios against the real control plane are in
``tests/integration/test_annotator.py``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.support.clock import FakeClock
from tests.support.costs import Desire, desired, publish_costs
from tests.support.tasks import leak_check

from podcost.annotator import AnnotatorService, AnnotatorSettings, bootstrap
from podcost.annotator.plan import Scope
from podcost.annotator.view import ClusterView
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import (
    ATTR_COST,
    ATTR_POD,
    ATTR_RESULT,
    ATTR_WORKLOAD,
    ATTR_WRITES,
    SPAN_ANNOTATE,
    SPAN_PATCH,
)
from podcost_bus import BusSettings, MemoryBus
from podcost_contracts.messages import TRACEPARENT, DeadLetter, decode
from podcost_core.model import DELETION_COST_ANNOTATION, FIELD_MANAGER
from podcost_core.policy import ENABLED
from podcost_kube.client import CostChanged, KubeError, PodGone
from podcost_kube.store import ChangeType

NS = "shop"
BUS = BusSettings()
TOPICS = BUS.topics
GROUP = "podcost-annotator.local"  # the default group prefix, for the default cluster
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"

Failure = KubeError | TimeoutError


class FakePods:
    """Pods in memory, answering like the API server; ``fail`` scripts errors per request."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.failures: dict[str, deque[Failure]] = {"read": deque(), "patch": deque()}
        self.requests: list[tuple[str, str]] = []
        """(``read`` or ``patch``, pod name), in order."""
        self.before_patch: Callable[[str], None] | None = None
        self.clock: FakeClock | None = None
        self.timeline: list[tuple[str, str, float]] = []
        """(request, pod name, fake time) when a clock is given."""
        self.view = ClusterView(Scope())
        self.view.apply("Deployment", ChangeType.ADDED, owned("web", {ENABLED: "true"}))
        self.view.apply("ReplicaSet", ChangeType.ADDED, owned("web-1", {}, "Deployment", "web"))
        self.view.apply("Deployment", ChangeType.ADDED, owned("legacy", {}))
        self.view.apply("ReplicaSet", ChangeType.ADDED, owned("legacy-1", {}, "Deployment",
                                                              "legacy"))  # fmt: skip

    def add(
        self,
        name: str,
        *,
        cost: str | None = None,
        manager: str = FIELD_MANAGER,
        replicaset: str = "web-1",
        in_view: bool = True,
    ) -> str:
        """A pod of ``replicaset`` (of Deployment ``web`` by default), in the API and (unless
        ``in_view`` is false: not seen yet) in the view."""
        uid = f"uid-{name}"
        self.pods[name] = {
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": uid,
                "resourceVersion": "1",
                "annotations": {},
                "managedFields": [],
                "ownerReferences": [owner_ref("ReplicaSet", replicaset)],
            }
        }
        if cost is not None:
            self.set_cost(name, cost, manager)
        if in_view:
            self.view.apply("Pod", ChangeType.ADDED, copy.deepcopy(self.pods[name]))
        return uid

    def delete(self, name: str, *, seen: bool = True) -> None:
        """Delete a pod from the API; ``seen``: the view saw it go too."""
        gone = self.pods.pop(name)
        if seen:
            self.view.apply("Pod", ChangeType.DELETED, gone)

    def set_cost(self, name: str, cost: str, manager: str) -> None:
        meta = self.pods[name]["metadata"]
        meta["annotations"][DELETION_COST_ANNOTATION] = cost
        field = {"f:metadata": {"f:annotations": {f"f:{DELETION_COST_ANNOTATION}": {}}}}
        meta["managedFields"] = [{"manager": manager, "operation": "Update", "fieldsV1": field}]

    def cost(self, name: str) -> str | None:
        value: str | None = self.pods[name]["metadata"]["annotations"].get(DELETION_COST_ANNOTATION)
        return value

    def fail(self, request: str, *errors: Failure) -> None:
        self.failures[request].extend(errors)

    def patched(self) -> list[str]:
        return [name for kind, name in self.requests if kind == "patch"]

    def _record(self, request: str, name: str) -> None:
        self.requests.append((request, name))
        if self.clock is not None:
            self.timeline.append((request, name, self.clock.now()))

    async def read_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        self._record("read", name)
        if self.failures["read"]:
            raise self.failures["read"].popleft()
        if name not in self.pods:
            raise PodGone(f"reading pod {namespace}/{name}: not found", status=404)
        return copy.deepcopy(self.pods[name])

    async def patch_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, cost: int, *, seen: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        self._record("patch", pod)
        if self.before_patch is not None:
            self.before_patch(pod)
        if self.failures["patch"]:
            raise self.failures["patch"].popleft()
        if pod not in self.pods:
            raise PodGone(f"patching {namespace}/{pod}: not found", status=404)
        meta, was = self.pods[pod]["metadata"], seen["metadata"]
        if (meta["uid"], self.cost(pod)) != (
            was["uid"],
            was["annotations"].get(DELETION_COST_ANNOTATION),
        ):
            raise CostChanged(f"patching {namespace}/{pod}: changed", status=422, retriable=True)
        self.set_cost(pod, str(cost), FIELD_MANAGER)
        return copy.deepcopy(self.pods[pod])


def owner_ref(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"uid-{name}",
            "controller": True}  # fmt: skip


def owned(
    name: str, annotations: dict[str, str], kind: str | None = None, owner: str | None = None
) -> dict[str, Any]:
    """A Deployment or ReplicaSet (controlled by ``kind`` ``owner`` when given)."""
    refs = [owner_ref(kind, owner)] if kind is not None and owner is not None else []
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                         "resourceVersion": "1", "annotations": annotations,
                         "ownerReferences": refs}}  # fmt: skip


async def until(condition: Callable[[], bool], what: str, rounds: int = 2000) -> None:
    """Let the event loop run until ``condition`` holds (no real time passes)."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


class Harness:
    """One annotator over a MemoryBus, FakePods and a FakeClock, running in a task."""

    def __init__(
        self, service: AnnotatorService, bus: MemoryBus, pods: FakePods, clock: FakeClock
    ) -> None:
        self.service, self.bus, self.pods, self.clock = service, bus, pods, clock

    def patches(self, result: str) -> float:
        registry = self.service.metrics
        return registry.get_sample_value("podcost_patches_total", {"result": result}) or 0.0

    def committed(self) -> int:
        return sum(self.bus.committed(GROUP).values())

    async def publish(self, *pods: Desire, version: int = 1, **options: Any) -> None:
        await publish_costs(
            self.bus,
            TOPICS.costs_for("local"),
            desired(NS, "web", pods, version=version),
            **options,
        )


Start = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """Starts annotators; stops them (and checks no task leaked) after the test."""
    tasks: list[asyncio.Task[None]] = []

    async def starter(
        pods: FakePods,
        *,
        provider: TracerProvider | None = None,
        dry_run: bool = False,
        bus: MemoryBus | None = None,
        catch_up: Callable[[], dict[str, int] | None] | None = None,
        **config: Any,
    ) -> Harness:
        bus, clock = bus or MemoryBus(), FakeClock()
        retry = {"retry_initial_seconds": 1.0, "retry_max_seconds": 8.0}
        service = bootstrap(
            ServiceSettings(http_port=0, dry_run=dry_run, **retry),
            BUS,
            AnnotatorSettings(**config),
            bus=bus,
            kube=pods,
            clock=clock,
            tracer_provider=provider,
            view=pods.view,
            catch_up=catch_up,
            rng=lambda: 1.0,  # every retry waits its whole ceiling: exact on the fake clock
        )
        tasks.append(asyncio.create_task(service.run(), name="annotator-under-test"))
        if catch_up is None:
            await until(service.ready, "the annotator to start consuming")
        else:  # not ready until it has caught up: the test waits for what it consumes
            await asyncio.sleep(0)
        return Harness(service, bus, pods, clock)

    async with leak_check():
        yield starter
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_429_waits_for_its_retry_after_and_holds_every_other_request_too(
    start: Start,
) -> None:
    pods = FakePods()
    a, b = pods.add("a"), pods.add("b")
    pods.fail(
        "patch",
        KubeError("HTTP 429 Too Many Requests", status=429, retriable=True, retry_after=3.0),
    )
    run = await start(pods, max_in_flight=1)
    pods.clock = run.clock
    await run.publish(Desire("a", a, 1), Desire("b", b, 2))
    await until(lambda: run.patches("throttled") == 1, "the 429")
    await run.clock.advance(5.0)
    await until(lambda: run.committed() == 1, "the record committed")
    # After the 429 nothing goes for 3 s; then one request at once and the rest at the rate
    # (20/s): the hold applies to pod b's requests as well, and lets no burst through after it.
    assert [(request, pod, round(at, 6)) for request, pod, at in pods.timeline] == [
        ("read", "a", 0.0), ("patch", "a", 0.0),
        ("read", "a", 3.0), ("patch", "a", 3.05), ("read", "b", 3.1), ("patch", "b", 3.15),
    ]  # fmt: skip
    assert (pods.cost("a"), pods.cost("b")) == ("1", "2")
    assert run.patches("ok") == 2


async def test_5xx_timeouts_and_refused_connections_are_retried_past_max_attempts_until_written(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    pods = FakePods()
    a, b = pods.add("a"), pods.add("b")
    pods.fail(
        "patch",
        KubeError("HTTP 503", status=503, retriable=True),
        TimeoutError(),
        KubeError("patching shop/a: ClientConnectorError: refused", retriable=True),
        KubeError("HTTP 500", status=500, retriable=True),
        KubeError("HTTP 502", status=502, retriable=True),
    )
    run = await start(pods, max_in_flight=1, max_attempts=2)
    await run.publish(Desire("a", a, 1))
    await until(lambda: run.patches("unavailable") == 1, "the first retry")
    await run.clock.advance(0.99)
    assert pods.patched() == ["a"]
    for retry, backoff in enumerate((1.0, 2.0, 4.0, 8.0, 8.0), 2):  # doubled, capped at 8 s
        await run.clock.advance(backoff)
        await until(lambda retry=retry: len(pods.patched()) == retry, f"attempt {retry}")
    await until(lambda: pods.cost("a") == "1", "the write, once the server answers")
    await until(lambda: run.committed() == 1, "the record committed after its write")
    assert (run.patches("unavailable"), run.patches("ok"), run.patches("error")) == (5, 1, 0)
    assert not any("giving up" in r.getMessage() for r in caplog.records)
    await run.publish(Desire("b", b, 2), version=2)
    await until(lambda: pods.cost("b") == "2", "the next record written")


async def test_a_write_that_keeps_conflicting_is_given_up_after_max_attempts(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    pods = FakePods()
    a = pods.add("a")
    pods.fail("patch", *(CostChanged("changed", status=422, retriable=True) for _ in range(3)))
    run = await start(pods, max_in_flight=1, max_attempts=3)
    await run.publish(Desire("a", a, 1))
    await until(lambda: run.patches("conflict") == 1, "the first retry")
    await run.clock.advance(1.0)
    await until(lambda: run.patches("conflict") == 2, "the second retry")
    await run.clock.advance(2.0)
    await until(lambda: run.patches("error") == 1, "giving up")
    assert pods.patched() == ["a", "a", "a"]
    assert any(r.levelno == logging.ERROR and "giving up" in r.getMessage() for r in caplog.records)
    await until(lambda: run.committed() == 1, "the record committed: the annotator moved on")


async def test_readiness_reports_an_api_server_outage_past_unready_after_and_recovers(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    pods = FakePods()
    a = pods.add("a")
    down = KubeError("reading pod shop/a: ClientConnectorError: refused", retriable=True)
    pods.fail("read", *(down for _ in range(4)))
    run = await start(pods, max_in_flight=1, unready_after_seconds=5.0)
    await run.publish(Desire("a", a, 1))
    await until(lambda: run.patches("unavailable") == 1, "the first failure")
    assert run.service.ready()  # a blip is retried, not reported
    await run.clock.advance(1.0 + 2.0)  # failures at 0, 1, 3 s
    await until(lambda: run.patches("unavailable") == 3, "the third failure")
    assert run.service.ready()
    await run.clock.advance(4.0)  # the fourth failure, 7 s into the outage
    await until(lambda: not run.service.ready(), "not ready")
    assert any("not ready" in r.getMessage() for r in caplog.records)
    await run.clock.advance(8.0)  # the server answers
    await until(lambda: pods.cost("a") == "1", "the write")
    assert run.service.ready()
    assert any("ready again" in r.getMessage() for r in caplog.records)


async def test_an_older_decision_after_a_newer_one_is_skipped_as_stale_even_mid_write(
    start: Start,
) -> None:
    pods = FakePods()
    a, b = pods.add("a"), pods.add("b")
    run = await start(pods, max_in_flight=1)
    pods.clock = run.clock
    now = time.time()
    pods.fail("patch", KubeError("HTTP 503", status=503, retriable=True))  # v2 still in flight
    newer = desired(NS, "web", [Desire("a", a, 20), Desire("b", b, 21)], version=2,
                    changed_at=now)  # fmt: skip
    older = desired(NS, "web", [Desire("a", a, 10), Desire("b", b, 11)], version=1,
                    changed_at=now - 5)  # fmt: skip
    await publish_costs(run.bus, TOPICS.costs_for("local"), newer)
    await until(lambda: run.patches("unavailable") == 1, "v2's first write failing")
    await publish_costs(run.bus, TOPICS.costs_for("local"), older)
    await publish_costs(run.bus, TOPICS.costs_for("local"), newer)  # the same decision again
    await run.clock.advance(10.0)
    await until(lambda: run.committed() == 3, "all three records committed")
    assert (pods.cost("a"), pods.cost("b")) == ("20", "21")
    assert pods.patched() == ["a", "a", "b"]  # v2's, its retry; nothing for v1 or the duplicate
    consumed = run.service.metrics.get_sample_value
    assert [
        consumed(
            "podcost_messages_consumed_total",
            {"topic": TOPICS.costs_for("local"), "outcome": outcome},
        )
        for outcome in ("ok", "stale", "duplicate")
    ] == [1, 1, 1]


async def test_after_a_start_it_is_ready_only_once_the_first_pass_is_written(
    start: Start,
) -> None:
    # Embedded mode: ``catch_up`` is the watcher's first pass (None until it is published).
    pods = FakePods()
    a, b = pods.add("a"), pods.add("b")
    key = desired(NS, "web", [Desire("a", a, 1)], version=2).key
    first_pass: dict[str, int] | None = None
    run = await start(pods, catch_up=lambda: first_pass, max_in_flight=1)
    await run.publish(Desire("a", a, 1), Desire("b", b, 2), version=1)  # an older decision
    await until(lambda: run.committed() == 1, "the older decision written")
    assert not run.service.caught_up  # the first pass is not known yet
    assert not run.service.ready()
    first_pass = {key: 2}
    await run.publish(Desire("a", a, 1), Desire("b", b, 3), version=1)  # a duplicate
    await until(lambda: run.committed() == 2, "the duplicate committed")
    assert not run.service.ready()  # version 1 is not the first pass's version 2
    pods.fail("read", KubeError("HTTP 503", status=503, retriable=True))
    await run.publish(Desire("a", a, 5), Desire("b", b, 6), version=2)
    await until(lambda: run.patches("unavailable") == 1, "the first pass's first read fails")
    assert not run.service.ready()  # its writes are under way
    await run.clock.advance(1.0)
    await until(run.service.ready, "ready once the first pass is written")
    assert run.service.caught_up
    assert (pods.cost("a"), pods.cost("b")) == ("5", "6")


async def test_after_a_start_only_the_newest_decision_of_the_uncommitted_tail_is_written(
    start: Start,
) -> None:
    # The run before consumed v1 and v2, wrote v2's costs and was killed before it committed:
    # both are read again. Written in order, v1 would rewind the costs until v2 is read.
    pods = FakePods()
    a, b = pods.add("a"), pods.add("b")
    pods.set_cost("a", "20", FIELD_MANAGER)
    pods.set_cost("b", "21", FIELD_MANAGER)
    bus, now = MemoryBus(), time.time()
    for version, costs in ((1, (10, 11)), (2, (20, 21)), (3, (20, 22))):
        decision = [Desire("a", a, costs[0]), Desire("b", b, costs[1])]
        await publish_costs(bus, TOPICS.costs_for("local"),
                            desired(NS, "web", decision, version=version,
                                    changed_at=now - 10 + version))  # fmt: skip
    # One record per poll: the tail is read over three polls before anything is written. (Over
    # the in-memory bus the writes would coalesce even without the read-ahead, since nothing
    # yields between polls; over Kafka each poll is a fetch, and the e2e SIGKILL test saw the
    # replayed older decision written: tests/e2e/test_sigkill.py.)
    run = await start(pods, bus=bus, poll_records=1)
    await until(lambda: run.committed() == 3, "the three records committed")
    assert (pods.cost("a"), pods.cost("b")) == ("20", "22")
    assert pods.patched() == ["b"]  # v3's one change; nothing of v1 or v2
    consumed = run.service.metrics.get_sample_value
    assert [
        consumed(
            "podcost_messages_consumed_total",
            {"topic": TOPICS.costs_for("local"), "outcome": outcome},
        )
        for outcome in ("ok", "stale")
    ] == [1, 2]


async def test_a_decision_whose_snapshot_predates_our_last_write_is_still_written(
    start: Start,
) -> None:
    # v2 was decided from a snapshot made before v1's write landed (the watcher
    # ignores podcost's own writes, so no newer snapshot follows it). It says the pod has the 0
    # it wants; the pod has v1's 5. Over Kafka v2 arrives after v1's write is done.
    pods = FakePods()
    a = pods.add("a")
    run = await start(pods)
    await run.publish(Desire("a", a, 5, previous=0), version=1)
    await until(lambda: run.committed() == 1, "v1 written and committed")
    assert pods.cost("a") == "5"
    await run.publish(Desire("a", a, 0, previous=0), version=2)
    await until(lambda: run.committed() == 2, "v2 handled and committed")
    assert pods.cost("a") == "0"
    assert pods.requests == [("read", "a"), ("patch", "a"), ("read", "a"), ("patch", "a")]


async def test_a_permanent_error_is_not_retried(start: Start) -> None:
    pods = FakePods()
    a = pods.add("a")
    pods.fail("patch", KubeError("HTTP 422 Unprocessable Entity", status=422))
    run = await start(pods)
    await run.publish(Desire("a", a, 1))
    await until(lambda: run.patches("error") == 1, "the error counted")
    assert pods.patched() == ["a"]
    await until(lambda: run.committed() == 1, "the record committed")


async def test_a_cost_set_between_the_read_and_the_write_is_not_overwritten(
    start: Start,
) -> None:
    pods = FakePods()
    a = pods.add("a")

    def person_sets_the_cost(name: str) -> None:
        pods.before_patch = None
        pods.set_cost(name, "-500", "kubectl-annotate")

    pods.before_patch = person_sets_the_cost
    run = await start(pods)
    await run.publish(Desire("a", a, 7))
    await until(lambda: run.patches("conflict") == 1, "the conditional write refused")
    await run.clock.advance(1.0)
    await until(lambda: run.patches("skipped_foreign") == 1, "the pod read again")
    assert pods.cost("a") == "-500"
    assert pods.requests == [("read", "a"), ("patch", "a"), ("read", "a")]


async def test_a_pod_deleted_before_the_view_saw_it_go_is_skipped_after_one_read(
    start: Start,
) -> None:
    pods = FakePods()
    b, gone = pods.add("b"), pods.add("gone")
    pods.delete("gone", seen=False)
    run = await start(pods)
    await run.publish(Desire("gone", gone, 3), Desire("b", b, 4))
    await until(lambda: run.committed() == 1, "the record committed")
    assert (run.patches("gone"), run.patches("ok")) == (1, 1)
    assert pods.patched() == ["b"]
    assert pods.requests.count(("read", "gone")) == 1


async def test_a_pod_the_view_saw_deleted_is_gone_without_a_request(start: Start) -> None:
    pods = FakePods()
    b, gone = pods.add("b"), pods.add("gone")
    pods.delete("gone")
    run = await start(pods)
    await run.publish(Desire("gone", gone, 3), Desire("b", b, 4))
    await until(lambda: run.committed() == 1, "the record committed")
    assert (run.patches("gone"), run.patches("ok"), run.patches("refused")) == (1, 1, 0)
    assert pods.requests == [("read", "b"), ("patch", "b")]


async def test_the_token_bucket_paces_requests_at_the_configured_rate_on_the_fake_clock(
    start: Start,
) -> None:
    pods = FakePods()
    uids = {f"p{i}": pods.add(f"p{i}") for i in range(10)}
    run = await start(pods, qps=10, burst=4, max_in_flight=8)
    pods.clock = run.clock
    await run.publish(*(Desire(name, uid, 1) for name, uid in uids.items()))
    await run.clock.advance(5.0)
    await until(lambda: run.committed() == 1, "the record committed")
    # 10 writes = 20 requests (a read and a conditional PATCH each): the burst of 4 at once,
    # then one every 0.1 s, the last at 1.6 s: 10 writes in 1.6 s of fake time.
    times = [round(at, 6) for _, _, at in pods.timeline]
    assert times == [0.0] * 4 + [round(0.1 * n, 6) for n in range(1, 17)]
    assert all(pods.cost(name) == "1" for name in uids)
    waited = run.service.metrics.get_sample_value("podcost_rate_limit_wait_seconds_total")
    assert waited is not None
    assert waited > 0


async def test_an_undecodable_record_is_dead_lettered_with_its_reason_and_the_next_is_written(
    start: Start,
) -> None:
    pods = FakePods()
    a = pods.add("a")
    run = await start(pods)
    await run.bus.publish(TOPICS.costs_for("local"), "local/shop/Deployment/web", b"{not json")
    await run.publish(Desire("a", a, 5))
    await until(lambda: pods.cost("a") == "5", "the valid record written")
    await until(lambda: run.committed() == 2, "both records committed")
    [letter] = run.bus.records(TOPICS.deadletter)
    dead = decode(DeadLetter, letter.value, letter.headers)
    assert (dead.topic, dead.offset, dead.group, dead.error) == (
        TOPICS.costs_for("local"),
        0,
        GROUP,
        "DecodeError",
    )
    assert "JSON" in dead.reason


async def test_the_series_the_alerts_read_are_exported_at_zero_before_the_first(
    start: Start,
) -> None:
    """The alerts read ``increase()``: a series born at 1 shows none, so the first dead letter,
    refusal, failed or throttled write would page nobody."""
    run = await start(FakePods())
    sample = run.service.metrics.get_sample_value
    topic = TOPICS.costs_for("local")
    consumed = {"topic": topic, "outcome": "dead_letter"}
    assert sample("podcost_messages_consumed_total", consumed) == 0.0
    for reason in ("out_of_scope", "other_workload", "no_workload", "unknown_pod"):
        assert sample("podcost_refusals_total", {"reason": reason}) == 0.0
    for result in ("error", "throttled"):
        assert sample("podcost_patches_total", {"result": result}) == 0.0


async def test_another_clusters_costs_are_not_written_and_are_committed(start: Start) -> None:
    pods = FakePods()
    a = pods.add("a")
    run = await start(pods)
    message = desired(NS, "web", [Desire("a", a, 5)], cluster="elsewhere")
    await publish_costs(run.bus, TOPICS.costs_for("local"), message)
    await until(lambda: run.committed() == 1, "the record committed")
    assert pods.requests == []


async def test_dry_run_reads_decides_and_counts_but_writes_nothing(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="podcost.annotator")
    pods = FakePods()
    a, b = pods.add("a"), pods.add("b", cost="4")
    run = await start(pods, dry_run=True)
    await run.publish(Desire("a", a, 1), Desire("b", b, 4, previous=None))
    await until(lambda: run.committed() == 1, "the record committed")
    assert pods.patched() == []
    assert (run.patches("dry_run"), run.patches("unchanged")) == (1, 1)
    assert any("would set pod shop/a cost 1" in r.getMessage() for r in caplog.records)


async def test_dry_run_says_a_write_once_until_the_wanted_cost_changes(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="podcost.annotator")
    pods = FakePods()
    a = pods.add("a")
    run = await start(pods, dry_run=True)

    def said(cost: int) -> list[int]:
        return [
            r.levelno
            for r in caplog.records
            if r.getMessage().startswith(f"dry run: would set pod shop/a cost {cost} ")
        ]

    for version, cost in enumerate((1, 1, 1, 2, 1), start=1):
        await run.publish(Desire("a", a, cost), version=version)
        await until(lambda done=version: run.committed() == done, f"record {version} committed")
    # Every decision is still counted; only the first of each repetition is said at info.
    assert run.patches("dry_run") == 5
    assert said(1) == [logging.INFO, logging.DEBUG, logging.DEBUG, logging.INFO]
    assert said(2) == [logging.INFO]
    assert pods.patched() == []


async def test_one_trace_runs_from_the_records_context_through_the_annotate_span_to_each_patch(
    start: Start,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pods = FakePods()
    a, b, gone = pods.add("a"), pods.add("b"), pods.add("gone")
    pods.delete("gone")
    run = await start(pods, provider=provider)
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    await run.publish(
        Desire("a", a, 1),
        Desire("b", b, 2),
        Desire("gone", gone, 3),
        trace={TRACEPARENT: traceparent},
    )
    await until(
        lambda: any(s.name == SPAN_ANNOTATE for s in exporter.get_finished_spans()),
        "the annotate span to end",
    )
    spans = exporter.get_finished_spans()
    [annotate] = [s for s in spans if s.name == SPAN_ANNOTATE]
    patches = [s for s in spans if s.name == SPAN_PATCH]
    assert format(annotate.context.trace_id, "032x") == TRACE_ID
    assert annotate.parent is not None
    assert format(annotate.parent.span_id, "016x") == PARENT_ID
    assert annotate.attributes is not None
    assert annotate.attributes[ATTR_WORKLOAD] == "local/shop/Deployment/web"
    assert annotate.attributes[ATTR_WRITES] == 2
    assert all(
        s.parent is not None and s.parent.span_id == annotate.context.span_id for s in patches
    )
    seen = {
        (s.attributes[ATTR_POD], s.attributes[ATTR_COST], s.attributes[ATTR_RESULT])
        for s in patches
        if s.attributes is not None
    }
    assert seen == {("shop/a", 1, "ok"), ("shop/b", 2, "ok"), ("shop/gone", 3, "gone")}
    provider.shutdown()


async def test_event_to_annotation_is_measured_from_the_change_the_watcher_saw(
    start: Start,
) -> None:
    pods = FakePods()
    pods.view.apply("Deployment", ChangeType.ADDED, owned("api", {ENABLED: "true"}))
    pods.view.apply("ReplicaSet", ChangeType.ADDED, owned("api-1", {}, "Deployment", "api"))
    uids = [pods.add("a"), pods.add("b", replicaset="api-1")]
    harness = await start(pods)
    now = time.time()
    # The watcher saw the change 30 s before the aggregator published its decision.
    message = desired(NS, "web", [Desire("a", uids[0], 5)], emitted_at=now, changed_at=now - 30)
    await publish_costs(harness.bus, TOPICS.costs_for("local"), message)
    # A decision from an aggregator older than changed_at says nothing to measure from (of
    # another workload: read with the first after a start, a newer decision of the same one
    # would supersede the first).
    older = desired(NS, "api", [Desire("b", uids[1], 6)], version=2).model_copy(
        update={"changed_at": None}
    )
    await publish_costs(harness.bus, TOPICS.costs_for("local"), older)
    await until(lambda: harness.patches("ok") == 2, "both pods written")

    registry = harness.service.metrics
    observed = registry.get_sample_value("podcost_event_to_annotation_seconds_count")
    total = registry.get_sample_value("podcost_event_to_annotation_seconds_sum") or 0.0
    assert observed == 1
    assert 30 <= total < 30 + (time.time() - now) + 1


async def test_the_most_urgent_decision_is_written_first_then_pod_by_pod_in_deletion_order(
    start: Start,
) -> None:
    pods = FakePods()
    for workload in ("calm", "late", "soon"):
        pods.view.apply("Deployment", ChangeType.ADDED, owned(workload, {ENABLED: "true"}))
        pods.view.apply("ReplicaSet", ChangeType.ADDED, owned(f"{workload}-1", {}, "Deployment",
                                                              workload))  # fmt: skip

    def wants(workload: str) -> list[Desire]:
        # Costs that go down (10 to 5): each pod is needed once the scale-in reaches its place.
        names = [f"{workload[0]}{index}" for index in (1, 2, 3)]
        return [Desire(name, pods.add(name, cost="10", replicaset=f"{workload}-1"), 5, 10)
                for name in names]  # fmt: skip

    calm, late, soon = wants("calm"), wants("late"), wants("soon")
    run = await start(pods, qps=1, burst=1, max_in_flight=1)
    pods.clock = run.clock
    # Published least urgent first: nothing wrong; wrong from a scale-in of 3; wrong at once.
    for workload, wants, first_wrong in (("calm", calm, None), ("late", late, 3),
                                         ("soon", soon, 1)):  # fmt: skip
        message = desired(NS, workload, wants).model_copy(update={"first_wrong": first_wrong})
        await publish_costs(run.bus, TOPICS.costs_for("local"), message)
    await run.clock.advance(60.0)
    await until(lambda: run.committed() == 3, "every record committed")
    # The smallest scale-in each write can set right, then arrival: s1 (1), s2 (2), then every
    # pod of "late" and s3 (3: "late" is right below 3 already), the calm workload last.
    assert pods.patched() == ["s1", "s2", "l1", "l2", "l3", "s3", "c1", "c2", "c3"]


# --- refusals: the annotator's own view must back every write -----------------------------------


def refusals(run: Harness, reason: str) -> float:
    registry = run.service.metrics
    return registry.get_sample_value("podcost_refusals_total", {"reason": reason}) or 0.0


async def test_decisions_the_view_contradicts_are_refused_without_a_request_counted_and_logged(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="podcost.annotator")
    pods = FakePods()
    genuine = pods.add("a")
    bystander = pods.add("old", replicaset="legacy-1")  # of Deployment legacy, never opted in
    other = pods.add("old2", replicaset="legacy-1")
    stray = pods.add("stray")
    run = await start(pods)
    await run.publish(
        Desire("a", genuine, 1),
        Desire("old", bystander, 2),  # the key names web: another workload's pod
        Desire("stray", "uid-forged", 3),  # the name of a pod of web, a uid it does not have
    )
    await publish_costs(
        run.bus, TOPICS.costs_for("local"), desired(NS, "legacy", [Desire("old2", other, 4)])
    )
    # A workload the view shows not opted in may have opted in since: refused after the grace.
    await until(lambda: run.committed() == 1, "the record of web committed")
    await run.clock.advance(10.0)
    await until(lambda: run.committed() == 2, "both records committed")
    assert pods.requests == [("read", "a"), ("patch", "a")]
    assert [pods.cost(name) for name in ("a", "old", "old2", "stray")] == ["1", None, None, None]
    assert (
        refusals(run, "other_workload"),
        refusals(run, "uid_mismatch"),
        refusals(run, "not_opted_in"),
    ) == (1, 1, 1)
    assert (run.patches("refused"), run.patches("ok")) == (3, 1)
    logged = [r.getMessage() for r in caplog.records if "refusing" in r.getMessage()]
    assert len(logged) == 3
    assert any("shop/old " in line and "local/shop/Deployment/legacy" in line for line in logged)
    assert stray != "uid-forged"  # the real pod of that name is left alone (cost None above)


async def test_a_pod_the_view_does_not_show_is_read_verified_as_read_and_written(
    start: Start,
) -> None:
    pods = FakePods()
    run = await start(pods)
    late = pods.add("late", in_view=False)
    await run.publish(Desire("late", late, 7), Desire("never", "uid-never", 8))
    await until(lambda: run.committed() == 1, "the record committed")
    assert pods.cost("late") == "7"
    assert (run.patches("ok"), run.patches("gone"), run.patches("refused")) == (1, 1, 0)
    assert sorted(pods.requests) == [("patch", "late"), ("read", "late"), ("read", "never")]


async def test_a_pod_whose_new_replicaset_the_view_has_not_seen_waits_for_it_within_the_grace(
    start: Start,
) -> None:
    pods = FakePods()
    run = await start(pods, view_grace_seconds=5.0)
    fresh = pods.add("fresh", replicaset="web-2")
    await run.publish(Desire("fresh", fresh, 7))
    await run.clock.advance(1.0)
    assert pods.requests == []  # waiting for the view, not asking the API
    pods.view.apply("ReplicaSet", ChangeType.ADDED, owned("web-2", {}, "Deployment", "web"))
    await run.clock.advance(0.1)
    await until(lambda: run.committed() == 1, "the record committed")
    assert pods.cost("fresh") == "7"
    assert refusals(run, "unknown_owner") == 0


async def test_a_pod_whose_replicaset_the_view_never_shows_is_refused_after_the_grace(
    start: Start,
) -> None:
    pods = FakePods()
    run = await start(pods, view_grace_seconds=2.0)
    stray = pods.add("stray", replicaset="nowhere")
    await run.publish(Desire("stray", stray, 7))
    await run.clock.advance(1.9)
    assert run.committed() == 0
    await run.clock.advance(0.2)
    await until(lambda: run.committed() == 1, "the record committed")
    assert refusals(run, "unknown_owner") == 1
    assert pods.requests == []
    assert pods.cost("stray") is None


async def test_a_pod_whose_owner_changed_since_the_view_saw_it_is_refused_after_the_read(
    start: Start,
) -> None:
    pods = FakePods()
    a = pods.add("a")
    # Released by its ReplicaSet in the API; the view has not seen that yet.
    pods.pods["a"]["metadata"]["ownerReferences"] = []
    run = await start(pods)
    await run.publish(Desire("a", a, 1))
    await until(lambda: run.committed() == 1, "the record committed")
    assert pods.requests == [("read", "a")]
    assert refusals(run, "no_workload") == 1


async def test_a_forged_decision_cannot_supersede_the_genuine_queued_write_of_its_pod(
    start: Start,
) -> None:
    pods = FakePods()
    a = pods.add("a")
    run = await start(pods, max_in_flight=1)
    await run.publish(Desire("a", a, 1))
    # The same pod under another workload's key, read in the same poll: refused at once.
    await publish_costs(
        run.bus, TOPICS.costs_for("local"), desired(NS, "legacy", [Desire("a", a, 99)])
    )
    await until(lambda: run.committed() == 2, "both records committed")
    assert pods.cost("a") == "1"
    assert (run.patches("ok"), run.patches("superseded"), refusals(run, "other_workload")) == (
        1,
        0,
        1,
    )


async def test_a_new_pod_of_a_new_replicaset_is_read_once_and_written_when_the_view_catches_up(
    start: Start,
) -> None:
    pods = FakePods()
    run = await start(pods, view_grace_seconds=5.0)
    fresh = pods.add("fresh", replicaset="web-3", in_view=False)
    await run.publish(Desire("fresh", fresh, 7))
    await run.clock.advance(1.0)
    assert pods.requests == [("read", "fresh")]  # waiting on the view, not reading again
    pods.view.apply("ReplicaSet", ChangeType.ADDED, owned("web-3", {}, "Deployment", "web"))
    await run.clock.advance(0.1)
    await until(lambda: run.committed() == 1, "the record committed")
    assert pods.requests == [("read", "fresh"), ("patch", "fresh")]
    assert pods.cost("fresh") == "7"


async def test_a_pod_and_a_workload_deleted_after_their_writes_leave_nothing_of_them_behind(
    start: Start,
) -> None:
    pods = FakePods()
    a, b = pods.add("a"), pods.add("b")
    run = await start(pods, dry_run=True)
    await run.publish(Desire("a", a, 1), Desire("b", b, 2))
    await until(lambda: run.committed() == 1, "the record committed")
    service = run.service
    kept = service.kept()
    assert (kept.decisions, kept.writes, kept.told, kept.workloads, kept.done) == (2, 2, 2, 1, 1)

    pods.delete("a")
    kept = service.kept()
    assert (kept.decisions, kept.writes, kept.told, kept.deleted) == (1, 1, 1, 1)
    assert service.decisions.get(NS, "a") is None
    assert service.decisions.get(NS, "b") is not None

    pods.delete("b")
    pods.view.apply("ReplicaSet", ChangeType.DELETED, owned("web-1", {}, "Deployment", "web"))
    pods.view.apply("Deployment", ChangeType.DELETED, owned("web", {ENABLED: "true"}))
    kept = service.kept()
    assert (kept.decisions, kept.writes, kept.told, kept.workloads, kept.done) == (0, 0, 0, 0, 0)
    assert service.guard.latest("local/shop/Deployment/web") is None


async def test_a_decision_read_after_its_pods_and_workload_went_leaves_nothing_behind(
    start: Start,
) -> None:
    """Made before the deletion, read after it: its pods end ``gone`` and what it brought back
    goes with them."""
    pods = FakePods()
    a = pods.add("a")
    run = await start(pods, dry_run=True)
    pods.delete("a")
    pods.view.apply("ReplicaSet", ChangeType.DELETED, owned("web-1", {}, "Deployment", "web"))
    pods.view.apply("Deployment", ChangeType.DELETED, owned("web", {ENABLED: "true"}))
    await run.publish(Desire("a", a, 1))
    await until(lambda: run.committed() == 1, "the record committed")
    assert run.patches("gone") == 1
    kept = run.service.kept()
    assert (kept.decisions, kept.writes, kept.told, kept.workloads, kept.done) == (0, 0, 0, 0, 0)


async def test_a_workload_deleted_before_the_catch_up_pass_is_written_stays_counted_as_written(
    start: Start,
) -> None:
    """The pass reads what was written per workload until it is caught up: a deletion then
    forgets the workload's newest decision but not that its writes are done."""
    pods = FakePods()
    a = pods.add("a")
    expected = {"local/shop/Deployment/web": 1, "local/shop/Deployment/other": 1}
    run = await start(pods, catch_up=lambda: expected)
    await run.publish(Desire("a", a, 1))
    await until(lambda: pods.cost("a") == "1", "the first decision written")
    pods.view.apply("Deployment", ChangeType.DELETED, owned("web", {ENABLED: "true"}))
    assert run.service.guard.latest("local/shop/Deployment/web") is None
    assert not run.service.caught_up
    message = desired(NS, "other", [], version=1)
    await publish_costs(run.bus, TOPICS.costs_for("local"), message)
    await until(lambda: run.service.caught_up, "caught up")
