"""The annotator's read-ahead at start (the tail past the committed offsets, read in full before
anything is written) over the real Kafka broker and control plane, when the broker fails one
request in the middle of it: the records polled before the failure are written too, and no
commit passes them unwritten. The failure is the bus error a timed-out request to the broker
raises, made once by the real consumer right after its first records are delivered."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from tests.support.costs import CountingPods, Desire, desired, publish_costs
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import eventually, fresh_kafka_settings

from podcost.annotator import AnnotatorSettings, bootstrap
from podcost.annotator.plan import Scope
from podcost.annotator.view import InformerView
from podcost.runtime.settings import ServiceSettings
from podcost_bus import BusError, KafkaBus, OffsetReset
from podcost_bus.kafka import KafkaConsumer
from podcost_bus.protocol import Record, TopicPartition
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration


class HiccupConsumer(KafkaConsumer):
    """The real consumer, whose first ``lag`` after records were delivered fails as a request
    the broker did not answer in time does."""

    delivered = False
    failed = False

    async def poll(
        self, *, max_wait: float | None = None, max_records: int | None = None
    ) -> list[Record]:
        records = await super().poll(max_wait=max_wait, max_records=max_records)
        self.delivered = self.delivered or bool(records)
        return records

    async def lag(self) -> dict[TopicPartition, int]:
        if self.delivered and not self.failed:
            self.failed = True
            raise BusError("cannot read the lag: KafkaTimeoutError", retriable=True)
        return await super().lag()


class HiccupBus(KafkaBus):
    def consumer(
        self,
        topics: list[str] | tuple[str, ...],
        *,
        group: str,
        offset_reset: OffsetReset = "earliest",
        max_poll_records: int | None = None,
    ) -> HiccupConsumer:
        limit = max_poll_records or self.settings.max_poll_records
        self.made = HiccupConsumer(self.settings, tuple(topics), group, offset_reset, limit)
        return self.made


@pytest.fixture
async def bus(kafka_bootstrap: str) -> AsyncIterator[HiccupBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "read-ahead")
    async with HiccupBus(settings) as started:
        await started.ensure_topics([*settings.topics.shared(), settings.topics.costs_for("local")])
        yield started


async def test_records_read_ahead_before_a_broker_hiccup_are_written_and_none_is_passed(
    bus: HiccupBus, kube: KubeTestCluster
) -> None:
    suffix = uuid.uuid4().hex[:6]
    namespace = await kube.create_namespace(f"read-ahead-{suffix}")
    node, labels = f"read-ahead-{suffix}", {"podcost-read-ahead-test": suffix}
    await kube.create_node(node, zone="a", labels=labels)
    try:
        await kube.create_deployment(namespace, "web", 3, opt_in=True, node_selector=labels)

        async def created() -> bool:
            return len(await kube.active_pods(namespace, "web")) == 3

        await kube.wait_for(created, "3 pods of web", timeout=30, interval=0.05)
        pods = sorted(await kube.active_pods(namespace, "web"), key=lambda pod: pod.name)
        topic = bus.settings.topics.costs_for("local")
        # On the topic before the annotator starts: the tail it reads ahead, one record a poll.
        for version, pod in enumerate(pods, 1):
            decision = desired(namespace, "web", [Desire(pod.name, pod.uid, 10 + version)],
                               version=version)  # fmt: skip
            await publish_costs(bus, topic, decision)
        counting = CountingPods(Kube(kube.api))
        service = bootstrap(
            ServiceSettings(http_port=0), bus.settings,
            AnnotatorSettings(group=f"read-ahead-{suffix}", backoff_initial=0.05, poll_records=1),
            bus=bus, kube=counting, view=InformerView(Kube(kube.api), Scope()),
        )  # fmt: skip
        task = asyncio.create_task(service.run(), name="annotator-under-test")
        try:
            await eventually(
                lambda: task.done() or sum(service.committed.values()) == 3,
                "every record committed",
                timeout=60,
            )
            assert not task.done(), task.exception()
            assert bus.made.failed  # the hiccup happened, in the read-ahead
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        written = {
            raw["metadata"]["name"]: (raw["metadata"].get("annotations") or {}).get(
                DELETION_COST_ANNOTATION
            )
            for raw in await kube.raw_pods(namespace, "web")
        }
        assert written == {pod.name: str(11 + index) for index, pod in enumerate(pods)}
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])
