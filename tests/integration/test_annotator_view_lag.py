"""A decision for a workload the annotator's view does not show opted in yet, on the real Kafka
broker and the real control plane: the watcher saw the opt-in, the annotator's informer has not
(it lags, or the decision arrived first). The refusal may change, so it is not final at once:
the write waits for the view within ``PODCOST_ANNOTATOR_VIEW_GRACE`` and is written once the
view shows the workload opted in, instead of being committed as refused for good.
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


async def test_a_decision_that_comes_before_the_view_sees_the_opt_in_is_written_once_it_does(
    kafka_bootstrap: str, kube: KubeTestCluster
) -> None:
    settings = fresh_kafka_settings(kafka_bootstrap, "lag")
    suffix = uuid.uuid4().hex[:6]
    namespace = await kube.create_namespace(f"lag-{suffix}")
    node = f"lag-{suffix}"
    labels = {"podcost-lag-test": suffix}
    await kube.create_node(node, zone="a", labels=labels)
    try:
        await kube.create_deployment(namespace, "web", 1, opt_in=False, node_selector=labels)

        async def created() -> bool:
            return len(await kube.active_pods(namespace, "web")) == 1

        await kube.wait_for(created, "the pod of web", timeout=60, interval=0.05)
        (pod,) = await kube.active_pods(namespace, "web")
        topic = settings.topics.costs_for("local")
        counting = CountingPods(Kube(kube.api))
        config = AnnotatorSettings(group=f"lag-{suffix}", view_grace=30.0)
        async with KafkaBus(settings) as bus:
            await bus.ensure_topics([topic, settings.topics.deadletter])
            service = annotator(
                ServiceSettings(http_port=0), settings, config, bus=bus, kube=counting,
                view=InformerView(Kube(kube.api), Scope()),
            )  # fmt: skip
            async with running(service):
                decision = desired(namespace, "web", [Desire(pod.name, pod.uid, 42)])
                await publish_costs(bus, topic, decision)
                await eventually(
                    lambda: service.depth > 0 or sum(service.committed.values()) == 1,
                    "the decision consumed",
                    30,
                )
                # The opt-in the watcher saw, reaching the annotator's view only now.
                await kube.apps.patch_namespaced_deployment(
                    "web", namespace, {"metadata": {"annotations": {"podcost.dev/enabled": "true"}}}
                )
                await eventually(
                    lambda: sum(service.committed.values()) == 1, "the record committed", 60
                )
                refused = service.metrics.get_sample_value(
                    "podcost_refusals_total", {"reason": "not_opted_in"}
                )
        raw = await Kube(kube.api).read_pod(namespace, pod.name)
        assert (raw["metadata"].get("annotations") or {}).get(DELETION_COST_ANNOTATION) == "42"
        assert not refused
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])
