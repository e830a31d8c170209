"""Fuzzing the bus decoders: whatever bytes, headers and key a record carries, decoding it ends
in a message or a ``DecodeError`` with a reason (what a consumer dead-letters), never in another
exception, which no consumer catches and which would crash it on that record at every restart.

Two kinds of input: arbitrary records (bytes, gzip of bytes, any headers, any key) for every
message kind, and valid records of every kind with one part mutated (a field replaced by a huge
number, a huge or odd string, deep nesting, NaN or infinity, a wrong type; a field removed; a list
element doubled, e.g. a pod uid twice), so that the decoder's validation, not only its JSON
parser, is reached. An accepted message must also encode again and decode to itself. Case
counts: ``tests/support/fuzz.py``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.fuzz import JSON_VALUES, fuzz, json_edit, json_paths, json_set
from tests.support.snapshots import snapshot

from podcost_contracts.messages import (
    CONTENT_ENCODING,
    SCHEMA_HEADER,
    TRACE_HEADERS,
    TRACEPARENT,
    DeadLetter,
    DecodeError,
    DesiredCostsMessage,
    EncodeError,
    InvalidKey,
    Message,
    PodCost,
    RankedWorkload,
    RanksBatchMessage,
    StrategyAnswer,
    StrategyRanksBatchMessage,
    StrategyRanksMessage,
    StrategyTerm,
    WorkloadGoneMessage,
    WorkloadKey,
    WorkloadSnapshotMessage,
    decode,
    decode_ranks_record,
    decode_workload_record,
    encode,
    trace_context,
)
from podcost_core.model import PodUID

SNAPSHOT = snapshot(pods=3, nodes=2)
KEY = SNAPSHOT.workload.key
UIDS = [pod.uid for pod in SNAPSHOT.pods]
TERM = StrategyTerm(normalized=40, weight=3, tier=1, raw=2.5)
VALID: dict[type[Message], Message] = {
    WorkloadSnapshotMessage: WorkloadSnapshotMessage.of(
        SNAPSHOT, emitted_at=1_714_568_400.0, changed_at=1_714_568_399.5
    ),
    WorkloadGoneMessage: WorkloadGoneMessage(
        key=KEY, version=2, reason="deleted", emitted_at=1_714_568_401.0
    ),
    StrategyRanksMessage: StrategyRanksMessage(
        key=KEY,
        version=1,
        strategy="capacity-type",
        scores={UIDS[0]: 1.0, UIDS[1]: -2.5, UIDS[2]: 0.0},
        duration_seconds=0.002,
        emitted_at=1_714_568_400.1,
    ),
    StrategyRanksBatchMessage: StrategyRanksBatchMessage(
        strategy="capacity-type",
        answers=(
            RankedWorkload(
                key=KEY,
                version=1,
                scores={UIDS[0]: 1.0, UIDS[1]: -2.5, UIDS[2]: 0.0},
                duration_seconds=0.002,
                changed_at=1_714_568_399.5,
                trace={TRACEPARENT: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
            ),
            RankedWorkload(key=KEY, version=2, scores={UIDS[0]: 3.0}, duration_seconds=0.0),
        ),
        emitted_at=1_714_568_400.1,
    ),
    RanksBatchMessage: RanksBatchMessage(
        answers=(
            StrategyAnswer(
                strategy="capacity-type",
                key=KEY,
                version=1,
                scores={UIDS[0]: 1.0, UIDS[1]: -2.5, UIDS[2]: 0.0},
                duration_seconds=0.002,
                changed_at=1_714_568_399.5,
            ),
            StrategyAnswer(
                strategy="age", key=KEY, version=1, scores={UIDS[0]: 3.0}, duration_seconds=0.0
            ),
        ),
        emitted_at=1_714_568_400.1,
    ),
    DesiredCostsMessage: DesiredCostsMessage(
        key=KEY,
        version=1,
        costs=tuple(
            PodCost(
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                cost=index - 1,
                previous=None if index == 0 else index,
                breakdown={"capacity-type": TERM},
            )
            for index, pod in enumerate(SNAPSHOT.pods)
        ),
        complete=False,
        missing=("age",),
        emitted_at=1_714_568_400.2,
    ),
    DeadLetter: DeadLetter(
        topic="podcost.workloads",
        partition=1,
        offset=7,
        key=KEY,
        value=b"{not json",
        value_size=9,
        headers={SCHEMA_HEADER: "workload-snapshot/1"},
        reason="bad JSON",
        error="DecodeError",
        group="podcost-ranker-age",
        failed_at=1_714_568_400.3,
    ),
}
KINDS = list(VALID)

#: Raw JSON put in place of one value: huge and odd numbers, NaN and infinity (not JSON, but some
#: parsers take them), odd and huge strings, deep nesting, wrong types.
HOSTILE = [
    "1" * 5000,
    "-" + "9" * 4301,
    "1" + "0" * 400,
    "1e999",
    "-1e999",
    "1e-999",
    "NaN",
    "Infinity",
    "-Infinity",
    "-1",
    "0",
    "-0",
    "2147483648",
    "-2147483649",
    "9223372036854775808",
    "1.5",
    "true",
    "null",
    '""',
    '"\\ud800"',
    '"\\u0000"',
    '"a/b/c/d"',
    '"-007"',
    '"' + "9" * 5000 + '"',
    '"' + "x" * 100_000 + '"',
    '"\u202e\u0301\U0001f600"',
    "[]",
    "{}",
    "[" * 1000 + "]" * 1000,
    '{"a":' * 300 + "1" + "}" * 300,
    "[1, 2, 3]",
]
MARK = "\x00hostile\x00"
MARK_JSON = json.dumps(MARK)


@st.composite
def mutated(draw: st.DrawFn, kind: type[Message]) -> bytes:
    """A valid ``kind`` payload with one part changed (see the module docstring)."""
    document = json.loads(encode(VALID[kind], gzip_threshold=10**9).value)
    path = draw(st.sampled_from(json_paths(document)))
    how = draw(st.sampled_from(["hostile", "json", "drop", "double", "extra"]))
    if how == "json":
        return json.dumps(json_set(document, path, draw(JSON_VALUES))).encode()
    # The hostile value goes in as raw JSON text: json.dumps refuses some (5000 digits).
    if how == "hostile" or not path:
        text = json.dumps(json_set(document, path, MARK))
    else:
        text = json.dumps(json_edit(document, path, how, MARK))
    return text.replace(MARK_JSON, draw(st.sampled_from(HOSTILE))).encode()


SCHEMA_VALUES = st.one_of(
    st.binary(max_size=40),
    st.builds(
        lambda kind, version: f"{kind}/{version}".encode(),
        st.sampled_from([kind.KIND for kind in KINDS] + ["", "x", "workload-gone "]),
        st.one_of(
            st.integers(min_value=-5, max_value=10**12).map(str),
            st.sampled_from(["1" * 5000, "0" * 4400 + "1", "", "1/1", "²", "١", " 1", "1 "]),
            st.text(max_size=6),
        ),
    ),
)
ENCODING_VALUES = st.sampled_from([b"gzip", b"identity", b"GZIP", b"br", b"", b"\xff", b"gzip "])
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        SCHEMA_HEADER: SCHEMA_VALUES,
        CONTENT_ENCODING: ENCODING_VALUES,
        TRACEPARENT: st.binary(max_size=60),
    },
)
KEYS = st.one_of(
    st.none(),
    st.just(KEY.encode()),
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    st.text(max_size=40),
)


def _decode_any(
    kind: type[Message], value: bytes, headers: Mapping[str, bytes], key: str | bytes | None
) -> Message:
    if kind is WorkloadSnapshotMessage:
        return decode_workload_record(value, headers, key=key)
    if kind in (StrategyRanksBatchMessage, RanksBatchMessage):  # what the aggregator reads
        return decode_ranks_record(value, headers, key=key)
    return decode(kind, value, headers, key=key)


def _decoded_or_refused(
    kind: type[Message], value: bytes, headers: Mapping[str, bytes], key: str | bytes | None
) -> Message | None:
    """The message, or ``None`` when refused with a reason; any other exception fails the test."""
    try:
        message = _decode_any(kind, value, headers, key)
    except DecodeError as error:
        refused = error
    else:
        # Accepted: it must travel again unchanged.
        encoded = encode(message)
        assert _decode_any(kind, encoded.value, encoded.headers, encoded.key) == message
        return message
    assert refused.reason, "a DecodeError without a reason"
    return None


def _gzip(payload: bytes, cut: int, trailer: bytes) -> bytes:
    packed = gzip.compress(payload, mtime=0)
    return packed[: len(packed) - cut] + trailer


@pytest.mark.parametrize("kind", KINDS, ids=[kind.KIND for kind in KINDS])
@fuzz(share=0.5)
@given(value=st.binary(max_size=300), headers=HEADERS, key=KEYS)
def test_any_record_decodes_or_is_refused_with_a_reason(
    kind: type[Message], value: bytes, headers: dict[str, bytes], key: str | bytes | None
) -> None:
    _decoded_or_refused(kind, value, headers, key)


@pytest.mark.parametrize("kind", KINDS, ids=[kind.KIND for kind in KINDS])
@fuzz(share=0.5)
@given(
    payload=st.one_of(st.binary(max_size=300), st.sampled_from(HOSTILE).map(str.encode)),
    cut=st.integers(min_value=0, max_value=12),
    trailer=st.sampled_from([b"", b"\x00", b"garbage", b"\x1f\x8b"]),
)
def test_any_gzip_value_decodes_or_is_refused_with_a_reason(
    kind: type[Message], payload: bytes, cut: int, trailer: bytes
) -> None:
    headers = {CONTENT_ENCODING: b"gzip", SCHEMA_HEADER: f"{kind.KIND}/1".encode()}
    _decoded_or_refused(kind, _gzip(payload, cut, trailer), headers, None)


@pytest.mark.parametrize("kind", KINDS, ids=[kind.KIND for kind in KINDS])
@fuzz()
@given(data=st.data(), compressed=st.booleans())
def test_a_valid_record_with_one_part_mutated_decodes_or_is_refused_with_a_reason(
    kind: type[Message], data: st.DataObject, compressed: bool
) -> None:
    value = data.draw(mutated(kind))
    headers = {SCHEMA_HEADER: f"{kind.KIND}/1".encode()}
    if compressed:
        value = gzip.compress(value, mtime=0)
        headers[CONTENT_ENCODING] = b"gzip"
    _decoded_or_refused(kind, value, headers, VALID[kind].record_key())


@fuzz(share=0.5)
@given(key=st.one_of(st.none(), st.binary(max_size=80), st.text(max_size=80)))
def test_any_record_key_parses_or_is_refused_as_an_invalid_key(key: str | bytes | None) -> None:
    try:
        parsed = WorkloadKey.parse(key)
    except InvalidKey as error:
        refused = error
    else:
        assert WorkloadKey.parse(parsed.encode()) == parsed
        return
    assert str(refused)


@fuzz(share=0.5)
@given(
    headers=st.dictionaries(
        st.sampled_from([*TRACE_HEADERS, "other"]), st.binary(max_size=60), max_size=3
    )
)
def test_the_trace_context_of_any_headers_can_travel_on_with_a_dead_letter(
    headers: dict[str, bytes],
) -> None:
    carrier = trace_context(headers)
    encoded = encode(VALID[DeadLetter], trace=carrier)
    assert {name: encoded.headers[name].decode() for name in carrier} == carrier


# Every case the fuzzing found, kept as a table (the fixes are at the root, in the decoders).
FOUND = [
    pytest.param(
        DesiredCostsMessage,
        b"{}",
        {SCHEMA_HEADER: b"desired-costs/" + b"1" * 5000},
        "is not <kind>/<version>",
        id="5000-digit schema version (int() raised ValueError)",
    ),
    pytest.param(
        WorkloadSnapshotMessage,
        b"{}",
        {SCHEMA_HEADER: b"workload-snapshot/" + b"0" * 4400 + b"1"},
        "is not <kind>/<version>",
        id="4401-digit schema version of a snapshot",
    ),
]


@pytest.mark.parametrize(("kind", "value", "headers", "reason"), FOUND)
def test_a_record_that_crashed_a_decoder_is_refused_with_its_reason(
    kind: type[Message], value: bytes, headers: dict[str, bytes], reason: str
) -> None:
    with pytest.raises(DecodeError) as raised:
        _decode_any(kind, value, headers, None)
    assert reason in raised.value.reason


def test_a_trace_header_that_is_not_ascii_is_left_out_of_the_trace_context() -> None:
    # It made encode() raise UnicodeEncodeError on the dead letter of the very record.
    headers = {TRACEPARENT: b"\xff\xfe", "tracestate": b"vendor=1"}
    assert trace_context(headers) == {"tracestate": "vendor=1"}


def test_a_pod_uid_given_twice_in_desired_costs_is_refused() -> None:
    document = json.loads(encode(VALID[DesiredCostsMessage]).value)
    document["costs"].append(document["costs"][0])
    with pytest.raises(DecodeError, match=f"pod uid '{PodUID(UIDS[0])}' appears twice"):
        decode(DesiredCostsMessage, json.dumps(document).encode())


def test_a_message_with_text_that_is_not_unicode_is_an_encode_error() -> None:
    # A node label with a lone surrogate (from hand-made JSON) converted, then model_dump_json
    # raised PydanticSerializationError, which the watcher did not catch.
    node = next(iter(SNAPSHOT.nodes.values()))
    odd = replace(node, labels={"kubernetes.io/hostname": "\ud800"})
    snapshot_with_odd_text = replace(SNAPSHOT, nodes={**SNAPSHOT.nodes, node.name: odd})
    message = WorkloadSnapshotMessage.of(snapshot_with_odd_text, emitted_at=1.0)
    with pytest.raises(EncodeError, match="cannot be encoded"):
        encode(message)
