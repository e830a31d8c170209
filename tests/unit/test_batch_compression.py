"""How the records one consumer reads are compressed (the aggregator's costs records, the
rankers' ranks records): left to their producer's batch compression (zstd unless
``PODCOST_KAFKA_COMPRESSION`` says otherwise) up to ``BATCHED_GZIP_ABOVE`` bytes of JSON,
gzipped one by one above it, or above the contract's threshold when the producer compresses
nothing (``podcost_bus.gzip_threshold``); either way the reader reads the same message."""

from __future__ import annotations

import time

import pytest
from tests.bench.bench_aggregator import answers, batched
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator, ranker
from podcost.aggregator.processor import AggregationProcessor
from podcost.ranker.outbox import pack
from podcost.runtime.clock import WallClock
from podcost.runtime.metrics import Metrics
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import tracer
from podcost_bus import BusSettings, MemoryBus, Record
from podcost_contracts.messages import (
    BATCHED_GZIP_ABOVE,
    CONTENT_ENCODING,
    DEFAULT_GZIP_THRESHOLD,
    DesiredCostsMessage,
    Encoded,
    RankedWorkload,
    WorkloadSnapshotMessage,
    decode,
    decode_ranks_record,
    encode,
)
from podcost_core.aggregate import AggregationConfig, Aggregator, PolicyResolver, WorkloadState
from podcost_core.model import PodUID
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.strategies.registry import default_registry

TOPICS = BusSettings().topics
KAFKA = "127.0.0.1:9"  # never connected to: the services are built, not started


def _records(pods: int) -> list[Record]:
    """A snapshot of ``pods`` pods and every ranked strategy's answer to it, as records."""
    item = deployment("app", pods=pods, nodes=max(3, pods // 3))
    message = WorkloadSnapshotMessage.of(item, emitted_at=time.time(), changed_at=None)
    encoded: list[tuple[str, Encoded]] = [(TOPICS.workloads, encode(message))]
    encoded += [(TOPICS.ranks, encode(batch)) for batch in batched(answers([item]), 100, 1)]
    return [
        Record(topic, 0, offset, record.key, record.value, record.headers)
        for offset, (topic, record) in enumerate(encoded)
    ]


def _decided(costs_gzip_above: int, pods: int) -> Encoded:
    """The costs record a processor with ``costs_gzip_above`` queues for ``pods`` pods."""
    processor = AggregationProcessor(
        Aggregator(AggregationConfig(deadline_s=3600), PolicyResolver(
            DEFAULT_POLICY, registry=default_registry())),
        bus=MemoryBus(), topics=TOPICS, group="test", metrics=Metrics("aggregator"),
        tracer=tracer(), clock=WallClock(), costs_gzip_above=costs_gzip_above,
    )  # fmt: skip
    states: dict[bytes | None, WorkloadState] = {}
    for record in _records(pods):
        for key, step in processor.split(record):
            new = processor.on_record(step, states.get(key))
            if isinstance(new, WorkloadState):
                states[key] = new
    [queued] = processor._queue
    assert queued.decision is not None
    return queued.encoded


def _message(encoded: Encoded) -> DesiredCostsMessage:
    return decode(DesiredCostsMessage, encoded.value, encoded.headers, key=encoded.key)


def test_a_decision_under_the_batched_threshold_is_sent_as_json_and_reads_the_same() -> None:
    plain = _decided(BATCHED_GZIP_ABOVE, pods=25)
    gzipped = _decided(DEFAULT_GZIP_THRESHOLD, pods=25)

    assert CONTENT_ENCODING not in plain.headers
    assert gzipped.headers[CONTENT_ENCODING] == b"gzip"
    assert plain.json_size > DEFAULT_GZIP_THRESHOLD  # what was gzipped one by one before
    ours, theirs = _message(plain), _message(gzipped)
    # Decided twice, a second apart at most: all but the emission time is the same.
    assert ours.model_copy(update={"emitted_at": 0.0}) == theirs.model_copy(
        update={"emitted_at": 0.0}
    )


def test_a_decision_above_the_batched_threshold_is_still_gzipped_one_by_one() -> None:
    encoded = _decided(4 * 1024, pods=25)

    assert encoded.headers[CONTENT_ENCODING] == b"gzip"
    assert len(_message(encoded).costs) == 25


@pytest.mark.parametrize(
    ("compression", "threshold"),
    [
        (None, BATCHED_GZIP_ABOVE),
        ("zstd", BATCHED_GZIP_ABOVE),
        ("gzip", BATCHED_GZIP_ABOVE),
        ("none", DEFAULT_GZIP_THRESHOLD),
    ],
)
def test_the_composition_root_leaves_costs_to_the_batch_compression_the_producer_has(
    compression: str | None, threshold: int
) -> None:
    settings = BusSettings(bootstrap_servers=KAFKA, **(
        {} if compression is None else {"compression": compression}))  # fmt: skip
    service = aggregator.bootstrap(ServiceSettings(http_port=0), settings)

    assert service.bus.settings.compression == (compression or "zstd")  # type: ignore[attr-defined]
    assert service.processor.costs_gzip_above == threshold


def test_over_the_in_memory_bus_costs_are_gzipped_above_the_contract_s_threshold() -> None:
    service = aggregator.bootstrap(ServiceSettings(http_port=0), BusSettings(), bus=MemoryBus())

    assert service.processor.costs_gzip_above == DEFAULT_GZIP_THRESHOLD


@pytest.mark.parametrize(
    ("compression", "threshold"),
    [("zstd", BATCHED_GZIP_ABOVE), ("none", DEFAULT_GZIP_THRESHOLD), (None, None)],
)
def test_the_rankers_leave_their_ranks_records_to_the_batch_compression_the_producer_has(
    compression: str | None, threshold: int | None
) -> None:
    # None: the in-memory bus, which compresses nothing.
    settings = (
        BusSettings() if compression is None
        else BusSettings(bootstrap_servers=KAFKA, compression=compression)
    )  # fmt: skip
    bus = MemoryBus() if compression is None else None
    expected = DEFAULT_GZIP_THRESHOLD if threshold is None else threshold
    service = ranker.bootstrap(ServiceSettings(http_port=0), settings, strategy="age", bus=bus)
    shared = ranker.shared_outbox(ServiceSettings(http_port=0), settings, bus=service.bus)

    assert service.outbox.gzip_above == expected
    assert shared.gzip_above == expected


@pytest.mark.parametrize("gzip_above", [DEFAULT_GZIP_THRESHOLD, BATCHED_GZIP_ABOVE])
def test_a_ranks_record_is_gzipped_above_its_outbox_s_threshold(gzip_above: int) -> None:
    # Thirty answers of 25 pods: about 60 KB of JSON, between the two thresholds.
    ranks = [
        RankedWorkload(
            key=f"eu-1/shop/Deployment/web-{index}",
            version=1,
            duration_seconds=0.0,
            scores={PodUID(f"web-{index}-{pod:04d}-{'x' * 30}"): float(pod) for pod in range(25)},
        )
        for index in range(30)
    ]
    [(chunk, encoded)], refused = pack(ranks, lambda item: ("age", item), lambda key: 0, 1.0,
                                       gzip_above)  # fmt: skip

    assert refused == []
    assert len(chunk) == 30
    assert DEFAULT_GZIP_THRESHOLD < encoded.json_size < BATCHED_GZIP_ABOVE
    gzipped = encoded.headers.get(CONTENT_ENCODING) == b"gzip"
    assert gzipped == (gzip_above == DEFAULT_GZIP_THRESHOLD)
    message = decode_ranks_record(encoded.value, encoded.headers, key=encoded.key)
    assert [answer.key for answer in message.messages()] == [item.key for item in ranks]
