"""What podcost builds from a record it reads is bounded whatever the record holds: trace headers
longer than trace context may be are neither read nor carried on, a dead letter fits in one Kafka
record for the worst record the broker takes, and a payload is refused for the count of JSON
values it holds before anything is built from it (a snapshot of many minimal pods is small in
bytes and large in memory). The records themselves go to the real broker in
``tests/integration/test_poison_records.py``."""

from __future__ import annotations

import gzip
import json
import os
import time

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from tests.support.snapshots import large_snapshot, snapshot

from podcost_bus.messaging import (
    DEAD_LETTER_HEADERS,
    DEAD_LETTER_NAME_CHARS,
    DEAD_LETTER_TEXT_BYTES,
    dead_letter_of,
)
from podcost_bus.protocol import Record
from podcost_contracts.messages import (
    CONTENT_ENCODING,
    MAX_DECODED_VALUES,
    MAX_MESSAGE_BYTES,
    MAX_TRACE_HEADER_BYTES,
    SCHEMA_HEADER,
    TRACEPARENT,
    TRACESTATE,
    DeadLetter,
    DecodeError,
    WorkloadSnapshotMessage,
    decode,
    decode_workload_record,
    encode,
    trace_context,
)

#: A producer's ``max.request.size`` by default: the largest record it sends.
MAX_REQUEST_SIZE = 1_048_576
PARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_trace_header_longer_than_trace_context_may_be_is_left_out() -> None:
    fitting = b"v=" + b"a" * (MAX_TRACE_HEADER_BYTES - 2)
    headers = {TRACEPARENT: PARENT, TRACESTATE: fitting + b"a"}
    assert trace_context(headers) == {TRACEPARENT: PARENT.decode()}
    assert trace_context({TRACESTATE: fitting}) == {TRACESTATE: fitting.decode()}


def test_a_trace_header_longer_than_trace_context_may_be_is_not_carried_on() -> None:
    message = WorkloadSnapshotMessage.of(snapshot(pods=1, nodes=1), emitted_at=1.0)
    trace = {TRACEPARENT: PARENT.decode(), TRACESTATE: "v=" + "a" * 2_000_000}
    assert set(encode(message, trace=trace).headers) == {SCHEMA_HEADER, TRACEPARENT}


def _worst(control: bool) -> Record:
    """A record as large as dead letters can make it: every part longer than what is kept,
    nothing in it that compresses, text that takes the most bytes in JSON."""
    if control:  # characters JSON writes as \u00NN: six bytes each
        name = lambda index: chr(1) * (DEAD_LETTER_NAME_CHARS - 3) + f"{index:03}"  # noqa: E731
        text = bytes([1]) * (DEAD_LETTER_TEXT_BYTES * 2)
    else:  # bytes that are not UTF-8, kept as \xNN: five bytes each in JSON
        name = lambda index: os.urandom(DEAD_LETTER_NAME_CHARS).hex()  # noqa: E731
        text = os.urandom(DEAD_LETTER_TEXT_BYTES * 2)
    headers = {name(index): text for index in range(DEAD_LETTER_HEADERS * 2)}
    headers[TRACESTATE] = b"v=" + b"a" * 2_000_000
    return Record(
        topic="t" * 249, partition=0, offset=1, key=text * 100, value=os.urandom(2_000_000),
        headers=headers, timestamp=0.0,
    )  # fmt: skip


@pytest.mark.parametrize("control", [False, True], ids=["not UTF-8", "control characters"])
def test_the_dead_letter_of_the_worst_record_fits_in_one_kafka_record(control: bool) -> None:
    record = _worst(control)
    letter = dead_letter_of(
        record, "r" * 100_000, ValueError("x"), group="g" * 249, failed_at=time.time()
    )
    encoded = encode(letter, trace=trace_context(record.headers))
    assert encoded.json_size < MAX_MESSAGE_BYTES  # before gzip: bounded however it compresses
    headers = [(name, value) for name, value in encoded.headers.items()]
    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(encoded.key, encoded.value, headers)
    assert size < MAX_REQUEST_SIZE
    assert decode(DeadLetter, encoded.value, encoded.headers) == letter


def _many_pods(count: int) -> bytes:
    """A valid snapshot message with ``count`` minimal pods, as JSON."""
    message = WorkloadSnapshotMessage.of(snapshot(pods=1, nodes=1), emitted_at=1.0)
    document = json.loads(encode(message, gzip_threshold=10**9).value)
    pod = document["snapshot"]["pods"][0]
    minimal = json.dumps({name: pod[name] for name in ("namespace", "name", "uid")})
    document["snapshot"]["pods"] = "__pods__"
    pods = "[" + ",".join([minimal] * count) + "]"
    return json.dumps(document).replace('"__pods__"', pods).encode()


def test_a_snapshot_of_many_minimal_pods_is_refused_for_its_count_before_it_is_built() -> None:
    body = _many_pods(250_000)  # 21 MB of JSON, inside the byte limit
    headers = {CONTENT_ENCODING: b"gzip"}
    with pytest.raises(DecodeError, match="JSON values, more than the limit of 1000000"):
        decode_workload_record(gzip.compress(body), headers)


def test_a_large_snapshot_as_the_watcher_publishes_it_is_well_within_the_count() -> None:
    message = WorkloadSnapshotMessage.of(large_snapshot(), emitted_at=1.0)  # 10,000 pods
    encoded = encode(message)
    body = gzip.decompress(encoded.value)
    assert body.count(b",") + body.count(b"{") + body.count(b"[") < MAX_DECODED_VALUES / 2
    assert decode_workload_record(encoded.value, encoded.headers) == message
