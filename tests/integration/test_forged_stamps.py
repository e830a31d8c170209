"""Records stamped in the future, on the real Kafka broker (and the real control plane for the
annotator): a decision or a snapshot whose ``changed_at`` or ``emitted_at`` lies beyond the
reader's clock plus ``PODCOST_CLOCK_SKEW_SECONDS`` is refused, counted
(``podcost_messages_consumed{outcome="future"}``) and dead-lettered with its reason, never
admitted: the genuine record published after it is written (the annotator) or decided (the
aggregator), where admitting the forged one would have made every genuine one stale.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from tests.support.costs import CountingPods, Desire, desired, publish_costs
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import Reader, eventually, fresh_kafka_settings, running
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.aggregator import AggregatorSettings
from podcost.annotator import AnnotatorSettings
from podcost.annotator import bootstrap as annotator
from podcost.annotator.plan import Scope
from podcost.annotator.view import InformerView
from podcost.runtime.settings import ServiceSettings
from podcost_bus import KafkaBus, publish_message
from podcost_contracts.messages import DeadLetter, DesiredCostsMessage, WorkloadSnapshotMessage
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

SETTINGS = ServiceSettings(http_port=0)
#: Far beyond any skew allowance: a forged stamp (any finite float decodes).
FAR_FUTURE = 1e12


@pytest.fixture
async def bus(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "stamps")
    async with KafkaBus(settings) as started:
        await started.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
        yield started


async def test_a_decision_stamped_in_the_future_is_dead_lettered_and_the_genuine_one_written(
    bus: KafkaBus, kube: KubeTestCluster
) -> None:
    settings = bus.settings
    suffix = uuid.uuid4().hex[:6]
    namespace = await kube.create_namespace(f"stamps-{suffix}")
    node = f"stamps-{suffix}"
    labels = {"podcost-stamps-test": suffix}
    await kube.create_node(node, zone="a", labels=labels)
    try:
        await kube.create_deployment(namespace, "web", 2, opt_in=True, node_selector=labels)

        async def created() -> bool:
            return len(await kube.active_pods(namespace, "web")) == 2

        await kube.wait_for(created, "2 pods of web", timeout=30, interval=0.05)
        pods = sorted(await kube.active_pods(namespace, "web"), key=lambda pod: pod.name)
        # The pods, workload and opt-in are genuine: only the stamps are forged.
        forged_costs = [Desire(pod.name, pod.uid, 100 + i) for i, pod in enumerate(pods)]
        forged = desired(namespace, "web", forged_costs, version=99, changed_at=FAR_FUTURE)
        stamped_late = desired(namespace, "web", [], version=98, emitted_at=FAR_FUTURE)
        # Within the allowance, but naming no pod the view backs (uids they do not have): refused
        # whole before the version guard orders it, so it cannot make the genuine one stale.
        unbacked_costs = [Desire(pod.name, f"{pod.uid}-x", 50 + i) for i, pod in enumerate(pods)]
        unbacked = desired(namespace, "web", unbacked_costs, version=97,
                           changed_at=time.time() + 60)  # fmt: skip
        genuine_costs = [Desire(pod.name, pod.uid, 5 + i) for i, pod in enumerate(pods)]
        genuine = desired(namespace, "web", genuine_costs)
        topic = settings.topics.costs_for("local")
        counting = CountingPods(Kube(kube.api))
        service = annotator(
            SETTINGS, settings, AnnotatorSettings(group=f"stamps-{suffix}", backoff_initial=0.05),
            bus=bus, kube=counting, view=InformerView(Kube(kube.api), Scope()),
        )  # fmt: skip
        async with running(service), Reader(bus, settings.topics.deadletter, DeadLetter) as dead:
            for message in (forged, stamped_late, unbacked, genuine):
                await publish_costs(bus, topic, message)
            letters = await dead.take(2, timeout=60)
            await eventually(
                lambda: sum(service.committed.values()) == 4, "every record committed", timeout=60
            )
            await dead.nothing_more(0.5)
            consumed = {
                outcome: service.metrics.get_sample_value(
                    "podcost_messages_consumed_total", {"topic": topic, "outcome": outcome}
                )
                for outcome in ("future", "refused", "ok")
            }
        assert consumed == {"future": 2, "refused": 1, "ok": 1}
        assert all(letter.reason.startswith("stamped in the future") for letter in letters)
        assert sorted(letter.offset for letter in letters) == [0, 1]
        assert counting.patches == {f"{namespace}/{pod.name}": 1 for pod in pods}
        written = {
            raw["metadata"]["name"]: raw["metadata"]["annotations"][DELETION_COST_ANNOTATION]
            for raw in await kube.raw_pods(namespace, "web")
        }
        assert written == {pod.name: str(i + 5) for i, pod in enumerate(pods)}
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])


async def test_a_snapshot_stamped_in_the_future_is_dead_lettered_and_the_genuine_one_decided(
    bus: KafkaBus,
) -> None:
    settings, topics = bus.settings, bus.settings.topics
    run = settings.client_id.rsplit("-", 1)[-1]
    good = replace(deployment(pods=3, nodes=3), version=2)
    forged = WorkloadSnapshotMessage.of(replace(good, version=7), emitted_at=FAR_FUTURE)
    # No ranker runs: each snapshot is decided at its deadline with what the aggregator has.
    config = AggregatorSettings(
        deadline_s=0.2, tick_s=0.05, app_id=f"stamps-{run}-aggregator", engine="consumer"
    )
    combiner = aggregator.bootstrap(SETTINGS, settings, config=config, bus=bus)
    async with (
        running(combiner),
        Reader(bus, topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
        Reader(bus, topics.deadletter, DeadLetter) as dead,
    ):
        await publish_message(bus, topics.workloads, forged)
        await publish_message(bus, topics.workloads, WorkloadSnapshotMessage.of(good,
                              emitted_at=time.time()))  # fmt: skip
        (letter,) = await dead.take(1, timeout=60)
        (decision,) = await costs.take(1, timeout=60)
        await costs.nothing_more(1.0)
        future = combiner.metrics.get_sample_value(
            "podcost_messages_consumed_total", {"topic": topics.workloads, "outcome": "future"}
        )
    assert letter.reason.startswith("stamped in the future")
    assert future == 1
    assert decision.version == 2
