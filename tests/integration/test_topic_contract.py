"""The topic contract on the real broker: podcost creates each missing topic with the settings
the contract declares (partitions, cleanup policy, retention, ``min.insync.replicas``), and a
topic someone created by hand with other settings is left as it is, reported in a log line and
in ``podcost_topic_config_drift``."""

from __future__ import annotations

import logging

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from tests.support.pipeline import fresh_kafka_settings

from podcost.runtime.metrics import Metrics
from podcost_bus import KafkaBus
from podcost_contracts.topic_contract import (
    CHANGELOG_SEGMENT_BYTES,
    CHANGELOG_SEGMENT_MS,
    PIPELINE_RETENTION_MS,
)

pytestmark = pytest.mark.integration


async def _configs(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    [(error, _, _, name, entries, *_)] = response.resources
    assert error == 0
    assert name == topic
    return {entry[0]: entry[1] for entry in entries}


async def test_missing_topics_are_created_with_the_settings_of_the_contract(
    kafka_bootstrap: str,
) -> None:
    settings = fresh_kafka_settings(kafka_bootstrap, "contract")
    changelog = f"{settings.client_id}-snapshot-changelog"
    async with KafkaBus(settings) as bus:
        costs = settings.topics.costs_for("prod-eu-1")
        await bus.ensure_topics([*settings.topics.shared(), costs, changelog])
        assert bus.topic_drift() == {}
    workloads = await _configs(kafka_bootstrap, settings.topic_workloads)
    assert workloads["cleanup.policy"] == "delete"
    assert workloads["retention.ms"] == str(PIPELINE_RETENTION_MS)
    assert workloads["min.insync.replicas"] == "1"  # one replica on the test broker
    assert (await _configs(kafka_bootstrap, costs))["retention.ms"] == str(PIPELINE_RETENTION_MS)
    assert (await _configs(kafka_bootstrap, changelog))["cleanup.policy"] == "compact"


async def test_a_topic_created_by_hand_with_the_wrong_policy_is_reported_and_left_alone(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = fresh_kafka_settings(kafka_bootstrap, "drift")
    changelog = f"{settings.client_id}-progress-changelog"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        # A changelog that deletes (it would lose quiet workloads' states) and a workloads
        # topic with one partition and a one-hour retention.
        await admin.create_topics([
            NewTopic(changelog, settings.partitions, 1, topic_configs={"cleanup.policy": "delete"}),
            NewTopic(settings.topic_workloads, 1, 1, topic_configs={"retention.ms": "3600000"}),
        ])  # fmt: skip
    finally:
        await admin.close()
    metrics = Metrics("aggregator")
    with caplog.at_level(logging.WARNING, logger="podcost_bus.kafka"):
        async with KafkaBus(settings) as bus:
            await bus.ensure_topics([settings.topic_workloads, settings.topic_ranks, changelog])
            metrics.record_topic_drift(bus.topic_drift())
            found = {
                topic: {(d.setting, d.expected, d.actual) for d in differences}
                for topic, differences in bus.topic_drift().items()
            }
    assert found == {
        changelog: {
            ("cleanup.policy", "compact", "delete"),
            ("segment.bytes", str(CHANGELOG_SEGMENT_BYTES), "1073741824"),
            ("segment.ms", str(CHANGELOG_SEGMENT_MS), "604800000"),
        },
        settings.topic_workloads: {
            ("partitions", str(settings.partitions), "1"),
            ("retention.ms", str(PIPELINE_RETENTION_MS), "3600000"),
        },
    }
    drift = "podcost_topic_config_drift"
    assert metrics.get_sample_value(drift, {"topic": changelog, "setting": "cleanup.policy"}) == 1
    workloads = {"topic": settings.topic_workloads, "setting": "retention.ms"}
    assert metrics.get_sample_value(drift, workloads) == 1
    assert metrics.get_sample_value(drift, {"topic": settings.topic_ranks, "setting": "x"}) is None
    assert f"{changelog}: cleanup.policy is delete, the contract says compact" in caplog.text
    # Left as it was: podcost changes no existing topic.
    assert (await _configs(kafka_bootstrap, changelog))["cleanup.policy"] == "delete"
