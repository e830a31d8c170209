"""The secure broker (``secure_kafka_broker``): TLS and SASL/SCRAM required, and topic ACLs that
let each component's principal write only its own output topic and read only its inputs.

Everything is asked of the real broker: every user tries to write one record to, and read from,
every topic of the layout, and the broker's answers make the matrix that is printed and compared
with the one the design asks for. A ranker's credentials publishing to a costs topic, a wrong
password, a PLAINTEXT client and a client that does not trust the broker's CA are refused.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import TopicAuthorizationFailedError
from aiokafka.helpers import create_ssl_context
from tests.support.secure_kafka import LAYOUT, OTHER_CLUSTER, SecureBroker
from tests.support.snapshots import CLUSTER

from podcost_bus import BusError, BusSettings, KafkaBus
from podcost_localinfra.kafka_secure import annotator_user, users, watcher_user

pytestmark = pytest.mark.integration

WORKLOADS, RANKS, DEADLETTER = LAYOUT.workloads, LAYOUT.ranks, LAYOUT.deadletter
COSTS, OTHER_COSTS = LAYOUT.costs_for(CLUSTER), LAYOUT.costs_for(OTHER_CLUSTER)
TOPICS = (WORKLOADS, RANKS, COSTS, OTHER_COSTS, DEADLETTER)
ANNOTATOR, OTHER_ANNOTATOR = annotator_user(CLUSTER), annotator_user(OTHER_CLUSTER)
WATCHER, OTHER_WATCHER = watcher_user(CLUSTER), watcher_user(OTHER_CLUSTER)

#: What each principal may do with each topic: r read, w write, - neither. Each cluster's watcher
#: has its own principal; both may write the shared workloads topic, and which cluster a snapshot
#: is of is proven by its signature, which the core checks
#: (``tests/e2e/test_secure_pipeline.py``, ``tests/integration/test_signed_snapshots.py``).
EXPECTED = {
    WATCHER: {WORKLOADS: "w", RANKS: "-", COSTS: "-", OTHER_COSTS: "-", DEADLETTER: "w"},
    OTHER_WATCHER: {WORKLOADS: "w", RANKS: "-", COSTS: "-", OTHER_COSTS: "-", DEADLETTER: "w"},
    "ranker": {WORKLOADS: "r", RANKS: "w", COSTS: "-", OTHER_COSTS: "-", DEADLETTER: "w"},
    "aggregator": {WORKLOADS: "r", RANKS: "r", COSTS: "w", OTHER_COSTS: "w", DEADLETTER: "w"},
    ANNOTATOR: {WORKLOADS: "-", RANKS: "-", COSTS: "r", OTHER_COSTS: "-", DEADLETTER: "w"},
    OTHER_ANNOTATOR: {WORKLOADS: "-", RANKS: "-", COSTS: "-", OTHER_COSTS: "r", DEADLETTER: "w"},
}


def _client(broker: SecureBroker, user: str) -> dict[str, object]:
    return {
        "bootstrap_servers": broker.bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=str(broker.ca_file)),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": user,
        "sasl_plain_password": broker.passwords[user],
    }


async def _may_write(bus: KafkaBus, topic: str) -> bool:
    try:
        await bus.publish(topic, "acl-probe", b"acl probe")
    except BusError as error:
        if isinstance(error.__cause__, TopicAuthorizationFailedError):
            return False
        raise
    return True


async def _may_read(broker: SecureBroker, user: str, topic: str, partition: int) -> bool:
    """Whether the broker lets ``user`` fetch ``partition`` of ``topic`` (which holds a record):
    a topic the user
    may not even describe is refused in its metadata, one it may describe but not read is
    refused on fetch."""
    admin = AIOKafkaAdminClient(**_client(broker, user))
    await admin.start()
    try:
        [described] = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if described["error_code"] == TopicAuthorizationFailedError.errno:
        return False
    assert described["error_code"] == 0, described
    consumer = AIOKafkaConsumer(**_client(broker, user), group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, partition)])
        await consumer.seek_to_beginning()
        async with asyncio.timeout(20):
            while not await consumer.getmany(timeout_ms=500):
                pass
    except TopicAuthorizationFailedError:
        return False
    finally:
        await consumer.stop()
    return True


async def _rights(broker: SecureBroker, user: str, seeded: dict[str, int]) -> dict[str, str]:
    async with KafkaBus(broker.settings(user)) as bus:
        writes = [await _may_write(bus, topic) for topic in TOPICS]
    reads = await asyncio.gather(
        *(_may_read(broker, user, topic, seeded[topic]) for topic in TOPICS)
    )
    return {
        topic: ("r" if read else "") + ("w" if write else "") or "-"
        for topic, read, write in zip(TOPICS, reads, writes, strict=True)
    }


async def test_each_principal_writes_only_its_own_output_and_reads_only_its_inputs(
    secure_kafka_broker: SecureBroker,
) -> None:
    broker = secure_kafka_broker
    # The topics exist, with a record in each, written by the super user.
    async with KafkaBus(broker.settings("admin")) as admin:
        await admin.ensure_topics(TOPICS)
        seeded = {topic: (await admin.publish(topic, None, b"seed")).partition for topic in TOPICS}
    assert set(EXPECTED) == set(users(LAYOUT))

    found = {user: await _rights(broker, user, seeded) for user in EXPECTED}

    width = max(map(len, found))
    lines = [" " * width + "  " + "  ".join(TOPICS)]
    for user, rights in found.items():
        lines.append(user.ljust(width) + "  " + "  ".join(rights[t].center(len(t)) for t in TOPICS))
    print("ACL matrix as the broker enforced it (r read, w write, - refused):")
    print("\n".join(lines))
    assert found == EXPECTED


async def test_a_rankers_credentials_publishing_to_a_costs_topic_are_refused_by_the_broker(
    secure_kafka_broker: SecureBroker,
) -> None:
    async with KafkaBus(secure_kafka_broker.settings("aggregator")) as aggregator:
        await aggregator.ensure_topics([COSTS])  # the aggregator may create it, and does
        await aggregator.publish(COSTS, "key", b"from the aggregator")
    # A short request timeout: how long ensure_topics waits for a topic it may not see.
    settings = secure_kafka_broker.settings("ranker").model_copy(
        update={"request_timeout_ms": 3000}
    )
    async with KafkaBus(settings) as ranker:
        with pytest.raises(BusError) as refused:
            await ranker.publish(COSTS, "key", b"from a ranker")
        # Nor may it create the topic at start-up, nor even see it (it waits the timeout: a
        # topic its writer has not created yet is hidden the same way).
        with pytest.raises(BusError) as hidden:
            await ranker.ensure_topics([COSTS])
    assert isinstance(refused.value.__cause__, TopicAuthorizationFailedError)
    assert not refused.value.retriable
    assert "not authorized for this principal" in str(hidden.value)


async def test_a_principal_ensures_the_topics_it_reads_without_the_right_to_create_them(
    secure_kafka_broker: SecureBroker,
) -> None:
    # The ranker may create the ranks and dead-letter topics, not workloads, which the watcher
    # created: its start-up call over all three succeeds.
    async with KafkaBus(secure_kafka_broker.settings(WATCHER)) as watcher:
        await watcher.ensure_topics([WORKLOADS, DEADLETTER])
    async with KafkaBus(secure_kafka_broker.settings("ranker")) as ranker:
        await ranker.ensure_topics([WORKLOADS, RANKS, DEADLETTER])


async def test_a_wrong_password_is_refused(
    secure_kafka_broker: SecureBroker, caplog: pytest.LogCaptureFixture
) -> None:
    settings = secure_kafka_broker.settings(
        "ranker", password="not-the-password", request_timeout_ms=5000
    )
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(BusError) as refused:
        async with KafkaBus(settings):
            pass
    assert "cannot reach Kafka" in str(refused.value)
    assert "SaslAuthenticationFailed" in caplog.text
    assert "invalid credentials" in caplog.text


async def test_a_plaintext_client_is_refused(
    secure_kafka_broker: SecureBroker, caplog: pytest.LogCaptureFixture
) -> None:
    settings = BusSettings(bootstrap_servers=secure_kafka_broker.bootstrap, request_timeout_ms=5000)
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(BusError) as refused:
        async with KafkaBus(settings):
            pass
    assert "cannot reach Kafka" in str(refused.value)


async def test_a_client_that_does_not_trust_the_brokers_ca_does_not_connect(
    secure_kafka_broker: SecureBroker, caplog: pytest.LogCaptureFixture
) -> None:
    # The system CAs (no PODCOST_KAFKA_SSL_CAFILE) do not include the local CA.
    settings = secure_kafka_broker.settings("ranker", request_timeout_ms=5000)
    untrusting = settings.model_copy(update={"ssl_cafile": None})
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(BusError) as refused:
        async with KafkaBus(untrusting):
            pass
    assert "cannot reach Kafka" in str(refused.value)
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
