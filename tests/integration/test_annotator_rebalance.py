"""A rebalance moves a partition from one annotator to another while the first still has writes
of it queued, on the real Kafka broker and the real control plane.

Annotator A, alone in its cluster's group, reads one decision per partition of the costs topic
and writes them slowly (a QPS budget of a request every two seconds). Annotator B joins the
group: the rebalance gives one partition to each. A newer decision for the workload of B's
partition follows, and B writes it at once. A must not write what it still had queued for the
partition it lost (it purges those writes on revoke, and fences every write by the assignment
its record was read under): the pods of that workload end at the newer decision's costs, never
at an older one written after it. A's own partition is written to the end.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator

import pytest
from tests.support.costs import Desire, desired, publish_costs
from tests.support.kube import KubeTestCluster, PodView
from tests.support.pipeline import eventually, fresh_kafka_settings

from podcost.annotator import AnnotatorService, AnnotatorSettings, bootstrap
from podcost.annotator.plan import Scope
from podcost.annotator.view import InformerView
from podcost.runtime.settings import ServiceSettings
from podcost_bus import KafkaBus, key_partitioner
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

PODS = 3
WAIT_S = 90.0


@pytest.fixture
async def bus(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "rebalance")  # two partitions
    async with KafkaBus(settings) as started:
        await started.ensure_topics([settings.topics.costs_for("local")])
        yield started


def annotator(bus: KafkaBus, kube: KubeTestCluster, group: str, qps: float) -> AnnotatorService:
    return bootstrap(
        ServiceSettings(http_port=0),
        bus.settings,
        AnnotatorSettings(group=group, qps=qps, burst=1, max_in_flight=1, backoff_initial=0.05),
        bus=bus,
        kube=Kube(kube.api),
        view=InformerView(Kube(kube.api), Scope()),
    )


async def costs_of(kube: KubeTestCluster, namespace: str, name: str) -> dict[str, str | None]:
    return {
        raw["metadata"]["name"]: (raw["metadata"].get("annotations") or {}).get(
            DELETION_COST_ANNOTATION
        )
        for raw in await kube.raw_pods(namespace, name)
    }


async def test_an_annotator_writes_nothing_queued_for_a_partition_a_rebalance_took_away(
    bus: KafkaBus, kube: KubeTestCluster
) -> None:
    suffix = uuid.uuid4().hex[:6]
    namespace = await kube.create_namespace(f"rebalance-{suffix}")
    labels = {"podcost-rebalance-test": suffix}
    node = f"rebalance-{suffix}"
    await kube.create_node(node, zone="a", labels=labels)
    topic = bus.settings.topics.costs_for("local")
    partition_of = key_partitioner(bus, bus.settings)
    names: dict[int, str] = {}  # one workload per partition
    for index in itertools.count():
        name = f"web-{index}"
        names.setdefault(partition_of(f"local/{namespace}/Deployment/{name}".encode()), name)
        if len(names) == 2:
            break
    tasks: list[asyncio.Task[None]] = []
    try:
        pods: dict[str, list[PodView]] = {}
        for name in names.values():
            await kube.create_deployment(namespace, name, PODS, opt_in=True, node_selector=labels)
        for name in names.values():

            async def created(name: str = name) -> bool:
                pods[name] = await kube.active_pods(namespace, name)
                return len(pods[name]) == PODS

            await kube.wait_for(created, f"{PODS} pods of {name}", timeout=WAIT_S, interval=0.1)
            pods[name].sort(key=lambda pod: pod.name)

        def decision(name: str, version: int) -> object:
            wanted = [Desire(p.name, p.uid, 10 * version + i) for i, p in enumerate(pods[name])]
            return desired(namespace, name, wanted, version=version)

        group = f"rebalance-{suffix}"
        slow = annotator(bus, kube, group, qps=0.5)
        tasks.append(asyncio.create_task(slow.run(), name="annotator-a"))
        await eventually(slow.ready, "annotator A ready", timeout=WAIT_S)
        for name in names.values():
            await publish_costs(bus, topic, decision(name, 1))  # type: ignore[arg-type]
        await eventually(lambda: slow.depth >= 2 * PODS - 1, "A's writes queued", timeout=WAIT_S)

        fast = annotator(bus, kube, group, qps=50)
        tasks.append(asyncio.create_task(fast.run(), name="annotator-b"))

        def split() -> bool:
            consumer_a, consumer_b = slow.consumer, fast.consumer
            return (
                consumer_a is not None
                and consumer_b is not None
                and len(consumer_a.assignment()) == 1
                and len(consumer_b.assignment()) == 1
            )

        await eventually(split, "the rebalance to give each annotator a partition", WAIT_S)
        assert fast.consumer is not None
        (moved_tp,) = fast.consumer.assignment()
        moved = names[moved_tp.partition]
        kept = names[1 - moved_tp.partition]
        assert slow.depth > 0, "A wrote everything before the rebalance: the test proves nothing"
        await publish_costs(bus, topic, decision(moved, 2))  # type: ignore[arg-type]
        newer = {pod.name: str(20 + i) for i, pod in enumerate(pods[moved])}

        async def written_by_b() -> bool:
            return await costs_of(kube, namespace, moved) == newer

        await kube.wait_for(written_by_b, "B to write the newer decision", timeout=WAIT_S)
        older = {pod.name: str(10 + i) for i, pod in enumerate(pods[kept])}

        async def a_done() -> bool:
            return slow.depth == 0 and await costs_of(kube, namespace, kept) == older

        await kube.wait_for(a_done, "A to write its own partition", timeout=WAIT_S, interval=0.2)
        assert await costs_of(kube, namespace, moved) == newer
        revoked = slow.metrics.get_sample_value("podcost_patches_total", {"result": "revoked"})
        assert revoked is not None
        assert revoked >= 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])
