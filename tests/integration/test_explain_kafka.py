"""``podcost explain --kafka``: the latest decision about a pod, read off the costs topic of the
real broker — the newest of several, with the trace id its record carried, past other
namespaces' records and a record that cannot be decoded — by a consumer group of its own that
commits nothing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from tests.support.costs import Desire, desired
from tests.support.pipeline import fresh_kafka_settings

from podcost.commands.explain import read_costs_topic
from podcost_bus import KafkaBus, publish_message
from podcost_contracts.messages import TRACEPARENT

pytestmark = pytest.mark.integration

TRACES = ["1" * 32, "4bf92f3577b34da6a3ce929d0e0e4736", "2" * 32]


@pytest.fixture
async def kafka(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "explain")
    async with KafkaBus(settings) as bus:
        await bus.ensure_topics([settings.topics.costs_for("local")])
        yield bus


def _trace(trace_id: str) -> dict[str, str]:
    return {TRACEPARENT: f"00-{trace_id}-00f067aa0ba902b7-01"}


async def test_the_latest_decision_about_the_pod_is_read_off_the_costs_topic(
    kafka: KafkaBus,
) -> None:
    topic = kafka.settings.topics.costs_for("local")
    now = time.time()
    for version, cost in ((1, 10), (2, 30)):
        message = desired(
            "shop", "web", [Desire("web-a", "uid-a", cost), Desire("web-b", "uid-b", 20)],
            version=version, emitted_at=now + version,
        )  # fmt: skip
        await publish_message(kafka, topic, message, trace=_trace(TRACES[version - 1]))
    # Another namespace's pod of the same name, and a record nobody can decode.
    other = desired(
        "other", "web", [Desire("web-a", "uid-other", 99)], version=3, emitted_at=now + 9
    )
    await publish_message(kafka, topic, other, trace=_trace(TRACES[2]))
    await kafka.publish(topic, "local/shop/Deployment/web", b"{not json")

    found = await read_costs_topic(kafka.settings, "local", "shop", "web-a", "uid-a", limit_s=60)
    missing = await read_costs_topic(
        kafka.settings, "local", "shop", "web-a", "uid-of-a-new-pod", limit_s=60
    )

    assert found is not None
    assert (found.version, found.cost, found.trace_id) == (2, 30, TRACES[1])
    assert (found.source, found.workload) == ("costs topic", "local/shop/Deployment/web")
    assert (found.position, found.tied, found.of) == (1, 1, 2)  # no breakdown: all tied
    assert missing is None
