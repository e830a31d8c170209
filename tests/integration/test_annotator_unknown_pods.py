"""A forged decision naming pods the annotator's view does not know, on the real Kafka broker and
the real control plane: each such pod costs a GET (it may be too new for the view), so a record
naming hundreds of invented pods of an opted-in workload, marked most urgent, would spend the
API budget on them ahead of every genuine write. The annotator reads at most
``PODCOST_ANNOTATOR_UNKNOWN_POD_BUDGET`` unknown pods per record and refuses the rest without a
request (``podcost_refusals{reason="unknown_pod"}``); the genuine pod of the record is written.
"""

from __future__ import annotations

import uuid

import pytest
from tests.support.costs import CountingPods, Desire, desired, publish_costs
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import eventually, fresh_kafka_settings, running

from podcost.annotator import AnnotatorSettings
from podcost.annotator import bootstrap as annotator
from podcost.annotator.plan import Scope
from podcost.annotator.view import InformerView
from podcost.runtime.settings import ServiceSettings
from podcost_bus import KafkaBus
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

INVENTED = 120
BUDGET = 5


async def test_a_record_naming_many_unknown_pods_reads_only_its_budget_of_them(
    kafka_bootstrap: str, kube: KubeTestCluster
) -> None:
    settings = fresh_kafka_settings(kafka_bootstrap, "unknown")
    suffix = uuid.uuid4().hex[:6]
    namespace = await kube.create_namespace(f"unknown-{suffix}")
    node = f"unknown-{suffix}"
    labels = {"podcost-unknown-test": suffix}
    await kube.create_node(node, zone="a", labels=labels)
    try:
        await kube.create_deployment(namespace, "web", 1, opt_in=True, node_selector=labels)

        async def created() -> bool:
            return len(await kube.active_pods(namespace, "web")) == 1

        await kube.wait_for(created, "the pod of web", timeout=60, interval=0.05)
        (pod,) = await kube.active_pods(namespace, "web")
        invented = [Desire(f"web-ghost-{i}", str(uuid.uuid4()), i) for i in range(INVENTED)]
        forged = desired(namespace, "web", [*invented, Desire(pod.name, pod.uid, 500)])
        forged = forged.model_copy(update={"first_wrong": 1})
        topic = settings.topics.costs_for("local")
        counting = CountingPods(Kube(kube.api))
        config = AnnotatorSettings(
            group=f"unknown-{suffix}", qps=500, burst=500, unknown_pod_budget=BUDGET
        )
        async with KafkaBus(settings) as bus:
            await bus.ensure_topics([topic, settings.topics.deadletter])
            service = annotator(
                ServiceSettings(http_port=0), settings, config, bus=bus, kube=counting,
                view=InformerView(Kube(kube.api), Scope()),
            )  # fmt: skip
            async with running(service):
                await publish_costs(bus, topic, forged)
                await eventually(
                    lambda: sum(service.committed.values()) == 1, "the record committed", 60
                )
                refusals = service.metrics.get_sample_value(
                    "podcost_refusals_total", {"reason": "unknown_pod"}
                )
        ghosts = [name for name in counting.reads if "web-ghost-" in name]
        assert len(ghosts) <= BUDGET
        assert refusals == INVENTED - len(ghosts)
        raw = await Kube(kube.api).read_pod(namespace, pod.name)
        assert raw["metadata"]["annotations"][DELETION_COST_ANNOTATION] == "500"
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])
