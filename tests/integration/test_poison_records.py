"""Poison records on the real Kafka broker: every service that reads a topic dead-letters each one
with its reason, stays ready, and decides the good record published after them.

The poison: a ``podcost-schema`` header with a 5,000-digit version, a key that is not UTF-8, a gzip
bomb, a value marked gzip that is not, truncated JSON, a message of the wrong kind, a valid-looking
message with a 5,000-digit number in it, and a record of nearly 1 MB of headers and value (whose
dead letter must still fit in one record), one with a trace header that is not ASCII, one with a 2
MB ``tracestate`` (accepted by the broker inside a zstd batch, as any client may send it), and a
snapshot of 400,000 minimal pods (18 MB of JSON in 0.1 MB of gzip: inside the byte limits, refused
for its count of JSON values before anything is built from it). A valid snapshot with a 2 MB
``tracestate`` is decided (its trace context is left out, and the state the aggregator stores of it
fits the changelog). They go on every topic a service reads: workloads (two rankers and the
aggregator) and ranks (the aggregator), with the aggregator on faust and on the consumer loop;
costs (the annotator, against the real control plane, followed by costs for pods with odd names).
"""

from __future__ import annotations

import gzip
import json
import os
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from tests.support.costs import CountingPods, Desire, desired, publish_costs
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import Reader, eventually, expected_costs, fresh_kafka_settings, running
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator, ranker
from podcost.aggregator import AggregatorSettings
from podcost.annotator import AnnotatorSettings
from podcost.annotator import bootstrap as annotator
from podcost.annotator.plan import Scope
from podcost.annotator.view import InformerView
from podcost.runtime.settings import ServiceSettings
from podcost_bus import KafkaBus, publish_message
from podcost_bus.faust_app import FaustKeyedApp
from podcost_bus.keyed import KeyedConsumerLoop
from podcost_contracts.messages import (
    CONTENT_ENCODING,
    MAX_DECODED_BYTES,
    SCHEMA_HEADER,
    TRACEPARENT,
    TRACESTATE,
    DeadLetter,
    DesiredCostsMessage,
    Message,
    RankedWorkload,
    StrategyRanksBatchMessage,
    StrategyRanksMessage,
    WorkloadSnapshotMessage,
    encode,
)
from podcost_core.model import DELETION_COST_ANNOTATION, Snapshot
from podcost_core.policy import policy_from_annotations
from podcost_kube.client import Kube

pytestmark = pytest.mark.integration

SETTINGS = ServiceSettings(http_port=0)
CAP, AGE, SPREAD = "capacity-type", "age", "topology-spread"
ANNOTATIONS = {"podcost.dev/enabled": "true", "podcost.dev/strategies": f"{SPREAD} | {CAP}, {AGE}"}
GOOD = replace(deployment(pods=4, nodes=4), annotations=ANNOTATIONS)
POLICY = policy_from_annotations(ANNOTATIONS)
KEY = GOOD.workload.key.encode()
DIGITS = "1" * 5000
#: A ``tracestate`` of 2 MB: nothing in it is valid trace context, and its record is 2 KB in a
#: zstd batch.
HUGE_TRACESTATE = b"v=" + b"a" * 2_000_000


@dataclass(frozen=True)
class Poison:
    """One bad record and the start of the reason its dead letter must give."""

    name: str
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    reason: str


def _gzip_bomb() -> bytes:
    """A gzip stream that inflates to 1 MiB more than a consumer inflates (about 130 KB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    parts = [packer.compress(chunk) for _ in range((MAX_DECODED_BYTES >> 20) + 1)]
    return b"".join(parts) + packer.flush()


def many_pods(valid: WorkloadSnapshotMessage, count: int) -> bytes:
    """``valid`` with ``count`` minimal pods (a namespace, a name and a uid, 45 bytes of JSON
    each), gzipped."""
    document = json.loads(encode(valid, gzip_threshold=10**9).value)
    namespace = document["snapshot"]["pods"][0]["namespace"]
    minimal = json.dumps({"namespace": namespace, "name": "p", "uid": "u"})
    document["snapshot"]["pods"] = "__pods__"
    pods = "[" + ",".join([minimal] * count) + "]"
    return gzip.compress(json.dumps(document).replace('"__pods__"', pods).encode(), 9)


def _with_huge_number(message: Message, field: str) -> bytes:
    """``message`` as JSON with the number at ``field`` (a dotted path) made 5,000 digits."""
    document = json.loads(encode(message, gzip_threshold=10**9).value)
    parent = document
    *path, last = field.split(".")
    for step in path:
        parent = parent[int(step) if step.isdigit() else step]
    parent[last] = "__huge__"
    return json.dumps(document).replace('"__huge__"', DIGITS).encode()


def poison(valid: Message, wrong: Message, number_field: str) -> list[Poison]:
    """The poison records for a topic whose messages are like ``valid`` (module docstring)."""
    schema = f"{valid.KIND}/1".encode()
    good = encode(valid, gzip_threshold=10**9).value
    key = valid.record_key()
    return [
        Poison(
            "5000-digit schema version",
            key,
            good,
            {SCHEMA_HEADER: f"{valid.KIND}/{DIGITS}".encode()},
            "the podcost-schema header",
        ),
        Poison("key not UTF-8", b"\xff\xfe/shop/Deployment/web", good, {SCHEMA_HEADER: schema}, ""),
        Poison(
            "gzip bomb",
            key,
            _gzip_bomb(),
            {SCHEMA_HEADER: schema, CONTENT_ENCODING: b"gzip"},
            "bad gzip: the value inflates to more than",
        ),
        Poison(
            "not gzip",
            key,
            b"plain bytes",
            {SCHEMA_HEADER: schema, CONTENT_ENCODING: b"gzip"},
            "bad gzip",
        ),
        Poison(
            "truncated JSON, trace header not ASCII",
            key,
            good[: len(good) // 2],
            {SCHEMA_HEADER: schema, TRACEPARENT: b"\xff\xfe00-garbage"},
            "bad JSON",
        ),
        Poison(
            "wrong kind",
            key,
            encode(wrong, gzip_threshold=10**9).value,
            {SCHEMA_HEADER: f"{wrong.KIND}/1".encode()},
            f"expected a {valid.KIND} message",
        ),
        Poison(
            "5000-digit number in a valid-looking message",
            key,
            _with_huge_number(valid, number_field),
            {SCHEMA_HEADER: schema},
            "bad JSON",
        ),
        Poison(
            "nearly 1 MB of headers and value",
            key,
            os.urandom(500_000),
            {SCHEMA_HEADER: schema, "x-junk": os.urandom(400_000)},
            "bad JSON",
        ),
        Poison(
            "truncated JSON with a 2 MB tracestate",
            key,
            good[: len(good) // 2],
            {SCHEMA_HEADER: schema, TRACESTATE: HUGE_TRACESTATE},
            "bad JSON",
        ),
        *(
            [
                Poison(
                    "400,000 minimal pods",
                    key,
                    many_pods(valid, 400_000),
                    {SCHEMA_HEADER: schema, CONTENT_ENCODING: b"gzip"},
                    "the workload-snapshot payload holds up to",
                )
            ]
            if isinstance(valid, WorkloadSnapshotMessage)
            else []
        ),
    ]


Published = dict[tuple[int, int], Poison]
"""The poison records of one topic by where they landed: (partition, offset)."""


async def publish_poison(bus: KafkaBus, topic: str, records: list[Poison]) -> Published:
    """Publish ``records`` as any client may: in zstd batches, with no request size limit of
    its own (the broker's limit applies to the compressed batch)."""
    published = {}
    async with _raw_producer(bus) as producer:
        for record in records:
            landed = await producer.send_and_wait(
                topic, record.value, key=record.key, headers=list(record.headers.items())
            )
            published[(landed.partition, landed.offset)] = record
    return published


@asynccontextmanager
async def _raw_producer(bus: KafkaBus) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(
        bootstrap_servers=bus.settings.bootstrap_servers,
        compression_type="zstd",
        max_request_size=64 * 1024 * 1024,
    )
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


def check_letters(
    letters: list[DeadLetter], topic: str, published: Published, groups: set[str]
) -> None:
    """Each poison record of ``topic`` was dead-lettered once by each of ``groups``, with its
    reason."""
    mine = [letter for letter in letters if letter.topic == topic]
    assert sorted((letter.group, letter.partition, letter.offset) for letter in mine) == sorted(
        (group, *where) for group in groups for where in published
    )
    for letter in mine:
        record = published[(letter.partition, letter.offset)]
        assert letter.reason.startswith(record.reason), (record.name, letter.reason)
        assert letter.value_size == len(record.value), record.name


def ranks(snapshot: Snapshot) -> StrategyRanksMessage:
    return StrategyRanksMessage(
        key=snapshot.workload.key,
        version=snapshot.version,
        strategy=CAP,
        scores={pod.uid: 1.0 for pod in snapshot.pods},
        duration_seconds=0.001,
        emitted_at=time.time(),
    )


def ranks_batch(snapshot: Snapshot) -> StrategyRanksBatchMessage:
    """A ranker's batch answering ``snapshot`` (what rankers publish)."""
    ranked = RankedWorkload.of(ranks(snapshot))
    return StrategyRanksBatchMessage(strategy=CAP, answers=(ranked,), emitted_at=time.time())


@pytest.fixture
async def bus(kafka_bootstrap: str) -> AsyncIterator[KafkaBus]:
    settings = fresh_kafka_settings(kafka_bootstrap, "poison")
    async with KafkaBus(settings) as started:
        await started.ensure_topics([*settings.topics.shared(), settings.topics.costs_for(CLUSTER)])
        yield started


@pytest.mark.parametrize("engine", ["faust", "consumer"])
async def test_poison_on_workloads_and_ranks_is_dead_lettered_and_the_next_snapshot_decided(
    bus: KafkaBus, tmp_path: Path, engine: str
) -> None:
    settings, topics = bus.settings, bus.settings.topics
    run = settings.client_id.rsplit("-", 1)[-1]
    snapshot_message = WorkloadSnapshotMessage.of(GOOD, emitted_at=time.time())
    costs_message = desired("shop", "web", [Desire("p", "u", 1)], cluster=GOOD.workload.cluster)
    on_workloads = poison(snapshot_message, costs_message, "snapshot.pods.0.deletion_cost")
    on_ranks = [
        *poison(ranks(GOOD), snapshot_message, "version"),
        # A header of another kind is read as one answer's (what rankers published before
        # batches), and refused as that.
        *(
            replace(record, reason=f"expected a {StrategyRanksMessage.KIND} message")
            if record.name == "wrong kind"
            else record
            for record in poison(ranks_batch(GOOD), snapshot_message, "answers.0.version")
        ),
    ]
    # Valid, with a 5,000-digit cost annotation on a pod: decided, that cost read as none.
    odd = replace(
        GOOD.pods[0], deletion_cost_raw=DIGITS, annotations={DELETION_COST_ANNOTATION: DIGITS}
    )
    odd_snapshot = replace(
        GOOD, workload=replace(GOOD.workload, name="odd"), pods=(odd, *GOOD.pods[1:])
    )
    rankers = [ranker.bootstrap(SETTINGS, settings, strategy=name, bus=bus) for name in (CAP, AGE)]
    config = AggregatorSettings(
        deadline_seconds=30.0, tick_seconds=0.1, app_id=f"poison-{run}-aggregator",
        data_dir=tmp_path, commit_interval_seconds=0.2, engine=engine,  # type: ignore[arg-type]
    )  # fmt: skip
    combiner = aggregator.bootstrap(SETTINGS, settings, config=config, bus=bus)
    transport = FaustKeyedApp if engine == "faust" else KeyedConsumerLoop
    assert isinstance(combiner.transport, transport)
    services = [*rankers, combiner]
    async with (
        running(*services),
        Reader(bus, topics.costs_for(CLUSTER), DesiredCostsMessage) as costs,
        Reader(bus, topics.deadletter, DeadLetter) as dead,
    ):
        on_workloads_at = await publish_poison(bus, topics.workloads, on_workloads)
        on_ranks_at = await publish_poison(bus, topics.ranks, on_ranks)
        odd_message = encode(WorkloadSnapshotMessage.of(odd_snapshot, emitted_at=time.time()))
        async with _raw_producer(bus) as producer:
            await producer.send_and_wait(
                topics.workloads, odd_message.value, key=odd_message.key,
                headers=[*odd_message.headers.items(), (TRACESTATE, HUGE_TRACESTATE)],
            )  # fmt: skip
        await publish_message(bus, topics.workloads, snapshot_message)
        decisions = {decision.key: decision for decision in await costs.take(2, timeout=60)}
        letters = await dead.take(3 * len(on_workloads) + len(on_ranks), timeout=60)
        await dead.nothing_more(1.0)
        assert all(service.ready() for service in services)

    combiner_group = config.app_id if engine == "faust" else combiner.processor.group
    groups = {r.group for r in rankers} | {combiner_group}
    check_letters(letters, topics.workloads, on_workloads_at, groups)
    check_letters(letters, topics.ranks, on_ranks_at, {combiner_group})
    good = decisions[GOOD.workload.key]
    assert good.complete
    assert {pod.uid: pod.cost for pod in good.costs} == expected_costs(GOOD, POLICY)
    odd_costs = {pod.uid: pod for pod in decisions[odd_snapshot.workload.key].costs}
    assert odd_costs[odd.uid].previous is None  # the 5,000-digit cost counts as none


async def test_poison_on_the_costs_topic_is_dead_lettered_and_the_next_costs_are_written(
    bus: KafkaBus, kube: KubeTestCluster
) -> None:
    settings = bus.settings
    suffix = uuid.uuid4().hex[:6]
    namespace = await kube.create_namespace(f"poison-{suffix}")
    node = f"poison-{suffix}"
    labels = {"podcost-poison-test": suffix}
    await kube.create_node(node, zone="a", labels=labels)
    try:
        await kube.create_deployment(namespace, "web", 2, opt_in=True, node_selector=labels)

        async def created() -> bool:
            return len(await kube.active_pods(namespace, "web")) == 2

        await kube.wait_for(created, "2 pods of web", timeout=30, interval=0.05)
        pods = sorted(await kube.active_pods(namespace, "web"), key=lambda pod: pod.name)
        good = desired(
            namespace, "web", [Desire(pod.name, pod.uid, i + 5) for i, pod in enumerate(pods)]
        )
        odd_names = [Desire("../../nodes/x", "u-1", 1), Desire("\u202e\U0001f600", "u-2", 2)]
        hostile_names = desired(namespace, "web", odd_names, version=2)
        snapshot_message = WorkloadSnapshotMessage.of(GOOD, emitted_at=time.time())
        on_costs = poison(good, snapshot_message, "costs.0.cost")
        topic = settings.topics.costs_for("local")
        counting = CountingPods(Kube(kube.api))
        service = annotator(
            SETTINGS.model_copy(update={"retry_initial_seconds": 0.05}), settings,
            AnnotatorSettings(group=f"poison-{suffix}"),
            bus=bus, kube=counting, view=InformerView(Kube(kube.api), Scope()),
        )  # fmt: skip
        async with running(service), Reader(bus, settings.topics.deadletter, DeadLetter) as dead:
            on_costs_at = await publish_poison(bus, topic, on_costs)
            await publish_costs(bus, topic, hostile_names)
            # The newest decision: seen after the hostile one (the annotator's version guard
            # orders decisions by when their change was seen, then by version).
            newest = {"version": 3, "changed_at": time.time(), "emitted_at": time.time()}
            await publish_costs(bus, topic, good.model_copy(update=newest))
            letters = await dead.take(len(on_costs), timeout=60)
            await eventually(
                lambda: sum(service.committed.values()) == len(on_costs) + 2,
                "every record committed",
                timeout=60,
            )
            await dead.nothing_more(1.0)
            assert service.ready()
        check_letters(letters, topic, on_costs_at, {service.group})
        assert counting.patches == {f"{namespace}/{pod.name}": 1 for pod in pods}
        written = {
            raw["metadata"]["name"]: raw["metadata"]["annotations"][DELETION_COST_ANNOTATION]
            for raw in await kube.raw_pods(namespace, "web")
        }
        assert written == {pod.name: str(i + 5) for i, pod in enumerate(pods)}
    finally:
        await kube.delete_namespace(namespace)
        await kube.delete_nodes([node])


def test_the_gzip_bomb_inflates_past_the_consumers_limit() -> None:
    assert len(_gzip_bomb()) < 200_000
    assert len(gzip.decompress(_gzip_bomb())) > MAX_DECODED_BYTES
