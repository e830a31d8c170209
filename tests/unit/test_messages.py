"""The message contracts: keys, round trips, compression, size of a 10,000-pod snapshot, and
every way ``decode`` refuses a record, each with the reason a dead letter will carry."""

from __future__ import annotations

import gzip
import json
import math
import sys
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError
from tests.support.snapshots import large_snapshot, snapshot

from podcost_contracts.messages import (
    CONTENT_ENCODING,
    DEFAULT_GZIP_THRESHOLD,
    MAX_MESSAGE_BYTES,
    SCHEMA_HEADER,
    TRACEPARENT,
    TRACESTATE,
    DeadLetter,
    DecodeError,
    DesiredCostsMessage,
    InvalidKey,
    Message,
    MessageTooLarge,
    PodCost,
    PodRef,
    RankedWorkload,
    RanksBatchMessage,
    ReleaseCostsMessage,
    StrategyAnswer,
    StrategyRanksBatchMessage,
    StrategyRanksMessage,
    StrategyTerm,
    WorkloadGoneMessage,
    WorkloadKey,
    WorkloadSnapshotMessage,
    _part_problem,
    decode,
    decode_costs_record,
    decode_ranks_record,
    decode_workload_record,
    encode,
    is_live_set,
    live_set_key,
    trace_context,
)
from podcost_contracts.topics import DEFAULT_TOPICS, Topics
from podcost_core.model import PodUID, Taint, WorkloadRef
from podcost_core.strategies import karpenter

KEY = "prod-eu-1/shop/Deployment/web"
TRACE = {
    TRACEPARENT: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    TRACESTATE: "vendor=1",
}
#: Kafka's default limit on one record (producer ``max.request.size``).
KAFKA_DEFAULT_MAX_BYTES = 1_048_576


def ranks(**changes: Any) -> StrategyRanksMessage:
    fields: dict[str, Any] = {
        "key": KEY,
        "version": 4,
        "strategy": "capacity-type",
        "scores": {PodUID("a"): 1.0, PodUID("b"): -2.5},
        "duration_seconds": 0.002,
        "emitted_at": 1_714_568_400.0,
    }
    return StrategyRanksMessage(**(fields | changes))


def costs(**changes: Any) -> DesiredCostsMessage:
    term = StrategyTerm(normalized=40, weight=3, tier=1, raw=-2.0)
    fields: dict[str, Any] = {
        "key": KEY,
        "version": 4,
        "costs": (
            PodCost(namespace="shop", name="web-a", uid=PodUID("a"), cost=-5, previous=None),
            PodCost(
                namespace="shop",
                name="web-b",
                uid=PodUID("b"),
                cost=2**31 - 1,
                previous=7,
                breakdown={"capacity-type": term},
            ),
        ),
        "complete": False,
        "missing": ("age",),
        "emitted_at": 1_714_568_401.0,
    }
    return DesiredCostsMessage(**(fields | changes))


def letter() -> DeadLetter:
    return DeadLetter(
        topic="podcost.workloads",
        partition=2,
        offset=41,
        key=KEY,
        value=b"\x1f\x8b not gzip \x00\xff",
        value_size=16,
        headers={TRACEPARENT: TRACE[TRACEPARENT]},
        reason="bad gzip: invalid block type",
        error="DecodeError",
        group="ranker-age",
        failed_at=1_714_568_402.0,
    )


def gone(**changes: Any) -> WorkloadGoneMessage:
    fields: dict[str, Any] = {
        "key": KEY,
        "version": 6,
        "reason": "deleted",
        "emitted_at": 1_714_568_403.0,
        "changed_at": 1_714_568_403.0,
    }
    return WorkloadGoneMessage(**(fields | changes))


def test_a_live_set_travels_under_its_clusters_own_key_and_names_only_its_workloads() -> None:
    key = live_set_key("prod-eu-1").text()
    listed = gone(key=key, live=("prod-eu-1/shop/Deployment/web",))
    assert decode_workload_record(**_record_of(listed)) == listed
    assert is_live_set(key)
    assert is_live_set(key.encode())
    assert not is_live_set(KEY)
    assert not is_live_set(None)
    with pytest.raises(ValidationError, match="travels under"):
        gone(live=())
    with pytest.raises(ValidationError, match="is not a workload of"):
        gone(key=key, live=("prod-us-1/shop/Deployment/web",))


def _record_of(message: Message) -> dict[str, Any]:
    encoded = encode(message)
    return {"value": encoded.value, "headers": encoded.headers, "key": encoded.key}


def reason_for(kind: type[Message], value: bytes, headers: dict[str, bytes] | None = None) -> str:
    with pytest.raises(DecodeError) as raised:
        decode(kind, value, headers or {})
    return raised.value.reason


# --- keys ------------------------------------------------------------------------------------


def test_a_key_is_built_from_the_workload_and_parsed_back() -> None:
    ref = WorkloadRef("prod-eu-1", "shop", "Deployment", "web")
    key = WorkloadKey.of(ref)
    assert key.text() == ref.key == KEY
    assert WorkloadKey.parse(KEY) == key
    assert WorkloadKey.parse(KEY.encode()) == key
    assert key.encode() == KEY.encode()


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        (None, "the record has no key"),
        (b"\xffshop", "is not UTF-8"),
        ("shop/Deployment/web", "expected cluster/namespace/kind/name (4 parts separated by '/')"),
        ("a/b/c/d/e", "got 5 parts"),
        ("prod//Deployment/web", "namespace is empty"),
        ("prod/shop/Deployment/", "name is empty"),
        ("prod/shop/Deploy ment/web", "kind contains whitespace or a control character"),
        ("prod/shop/Deployment/web\n", "name contains whitespace or a control character"),
        (f"prod/shop/Deployment/{'x' * 254}", "name is longer than 253 characters"),
    ],
)
def test_a_malformed_key_is_refused_with_what_is_wrong(
    key: str | bytes | None, reason: str
) -> None:
    with pytest.raises(InvalidKey, match=reason.replace("(", r"\(").replace(")", r"\)")):
        WorkloadKey.parse(key)


def test_a_key_part_with_a_slash_cannot_be_built() -> None:
    with pytest.raises(InvalidKey, match="name contains '/'"):
        WorkloadKey("prod", "shop", "Deployment", "a/b")


def test_a_key_part_is_refused_for_exactly_the_whitespace_and_control_characters() -> None:
    # ``_part_problem`` tests a part in C; every code point still gets the answer the
    # character-by-character test gave (whitespace, or not printable).
    problem = "contains whitespace or a control character"
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF or code == ord("/"):
            continue  # a lone surrogate is no text a decoded key holds; "/" splits the key
        char = chr(code)
        refused = char.isspace() or not char.isprintable()
        assert (_part_problem(f"a{char}b") == problem) is refused, hex(code)
    with pytest.raises(InvalidKey, match=f"name {problem}"):
        WorkloadKey.parse("prod/shop/Deployment/a\u00a0b")
    assert WorkloadKey.parse("prod/shop/Deployment/caf\u00e9").name == "caf\u00e9"


def test_a_message_s_workload_is_its_key_parsed() -> None:
    message = StrategyRanksMessage(
        key="prod/shop/Deployment/web", version=1, strategy="age", scores={},
        duration_seconds=0.0, emitted_at=0.0,
    )  # fmt: skip
    assert message.workload == WorkloadKey("prod", "shop", "Deployment", "web")
    assert message.workload is message.workload  # parsed once per distinct key
    other = message.model_copy(update={"key": "prod/shop/Deployment/api"})
    assert other.workload.name == "api"


# --- topics ----------------------------------------------------------------------------------


def test_the_default_topics_are_the_documented_names() -> None:
    assert DEFAULT_TOPICS.shared() == (
        "podcost.workloads",
        "podcost.ranks",
        "podcost.deadletter",
    )
    assert DEFAULT_TOPICS.costs_for("prod-eu-1") == "podcost.costs.prod-eu-1"


def test_every_cluster_gets_a_costs_topic_of_its_own() -> None:
    clusters = [f"cluster-{index}" for index in range(50)]
    topics = {DEFAULT_TOPICS.costs_for(cluster) for cluster in clusters}
    assert len(topics) == 50
    assert not topics & set(DEFAULT_TOPICS.shared())


@pytest.mark.parametrize(
    "cluster", ["", "Prod", "a_b", "a.b", "-a", "a-", "a/b", "ü", "x" * 64, "local "]
)
def test_a_cluster_name_that_is_not_a_dns_label_has_no_costs_topic(cluster: str) -> None:
    with pytest.raises(ValueError, match="not a valid cluster name"):
        DEFAULT_TOPICS.costs_for(cluster)


def test_a_key_whose_cluster_cannot_name_a_costs_topic_is_invalid() -> None:
    with pytest.raises(InvalidKey, match="not a valid cluster name"):
        WorkloadKey.parse("Prod_EU/shop/Deployment/web")


def test_a_shared_topic_under_the_costs_prefix_is_refused() -> None:
    with pytest.raises(ValidationError, match="must not start with the costs prefix"):
        Topics(workloads="podcost.costs.workloads")


@pytest.mark.parametrize("name", ["", "has space", "..", "ü", "x" * 250])
def test_an_illegal_topic_name_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="not a legal Kafka topic name"):
        Topics(ranks=name)


def test_two_kinds_cannot_share_a_topic() -> None:
    with pytest.raises(ValidationError, match="must be distinct"):
        Topics(ranks="podcost.costs")


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        WorkloadSnapshotMessage.of(snapshot(pods=5, version=4), emitted_at=1_714_568_400.5),
        ranks(),
        costs(),
        costs(complete=True, missing=()),
        letter(),
        WorkloadSnapshotMessage.of(
            snapshot(pods=2, version=5), emitted_at=1_714_568_400.5, changed_at=1_714_568_399.0
        ),
        ranks(changed_at=1_714_568_399.0),
        costs(changed_at=1_714_568_399.0),
        gone(),
    ],
    ids=[
        "snapshot", "ranks", "costs", "complete-costs", "dead-letter", "snapshot-changed-at",
        "ranks-changed-at", "costs-changed-at", "gone",
    ],
)  # fmt: skip
def test_every_message_kind_comes_back_equal_after_encode_and_decode(message: Message) -> None:
    encoded = encode(message)
    assert decode(type(message), encoded.value, encoded.headers, key=encoded.key) == message


def test_a_costs_topic_record_is_a_decision_or_a_release_as_its_header_says() -> None:
    release = ReleaseCostsMessage(
        key=KEY, version=7, pods=(PodRef(namespace="shop", name="web-a", uid=PodUID("a")),),
        reason="opted out", emitted_at=1_714_568_404.0, changed_at=1_714_568_403.0,
    )  # fmt: skip
    for message in (release, costs()):
        encoded = encode(message)
        assert decode_costs_record(encoded.value, encoded.headers, key=encoded.key) == message
    broken = encode(release)
    with pytest.raises(DecodeError):
        decode_costs_record(b"{}", broken.headers, key=broken.key)


def test_a_snapshot_message_keeps_every_field_of_every_pod() -> None:
    original = snapshot(pods=40, nodes=7, version=9)
    message = WorkloadSnapshotMessage.of(original, emitted_at=0.0)
    encoded = encode(message)
    decoded = decode(WorkloadSnapshotMessage, encoded.value, encoded.headers)
    assert decoded.snapshot == original
    assert decoded.workload == WorkloadKey("prod-eu-1", "shop", "Deployment", "web")


def test_the_karpenter_and_consolidation_facts_survive_the_round_trip_and_score_the_same() -> None:
    original = snapshot(pods=6, nodes=3, version=2)
    name = original.pods[0].node
    assert name is not None
    disrupted = replace(
        original.nodes[name],
        taints=(Taint(karpenter.DISRUPTED_TAINT, "NoSchedule"), Taint("other", "NoExecute", "x")),
        daemon_pods=3,
    )
    kept = replace(original.pods[1], annotations={karpenter.DO_NOT_DISRUPT: "true"})
    original = replace(
        original,
        nodes={**original.nodes, name: disrupted},
        pods=(original.pods[0], kept, *original.pods[2:]),
    )
    encoded = encode(WorkloadSnapshotMessage.of(original, emitted_at=0.0))
    decoded = decode(WorkloadSnapshotMessage, encoded.value, encoded.headers).snapshot
    assert decoded == original
    assert decoded.nodes[name].taints == disrupted.taints
    assert decoded.nodes[name].daemon_pods == 3
    scores = karpenter.score(decoded, karpenter.Args())
    assert scores == karpenter.score(original, karpenter.Args())
    assert scores[original.pods[0].uid] == -1.0


def test_the_headers_name_the_kind_and_version_and_carry_the_trace_context() -> None:
    encoded = encode(ranks(), trace={**TRACE, "baggage": "ignored"})
    assert encoded.headers == {
        SCHEMA_HEADER: b"strategy-ranks/1",
        TRACEPARENT: TRACE[TRACEPARENT].encode(),
        TRACESTATE: b"vendor=1",
    }
    assert trace_context(encoded.headers) == TRACE
    assert encoded.key == KEY.encode()


def test_a_dead_letter_travels_under_the_key_of_the_record_it_keeps() -> None:
    assert encode(letter()).key == KEY.encode()
    assert encode(letter().model_copy(update={"key": None})).key is None


def test_a_dead_letter_keeps_the_raw_value_as_base64_text() -> None:
    payload = json.loads(encode(letter()).value)
    assert payload["value"] == "H4sgbm90IGd6aXAgAP8="


# --- compression -----------------------------------------------------------------------------


def test_a_small_message_is_plain_json() -> None:
    encoded = encode(ranks())
    assert not encoded.compressed
    assert CONTENT_ENCODING not in encoded.headers
    assert json.loads(encoded.value)["strategy"] == "capacity-type"
    assert encoded.json_size == len(encoded.value) < DEFAULT_GZIP_THRESHOLD


def test_a_message_is_compressed_exactly_when_it_is_larger_than_the_threshold() -> None:
    size = len(encode(ranks()).value)
    at_threshold = encode(ranks(), gzip_threshold=size)
    above = encode(ranks(), gzip_threshold=size - 1)
    assert not at_threshold.compressed
    assert above.compressed
    assert above.headers[CONTENT_ENCODING] == b"gzip"
    assert gzip.decompress(above.value) == at_threshold.value
    assert decode(StrategyRanksMessage, above.value, above.headers) == ranks()


def test_encoding_the_same_message_twice_gives_the_same_bytes() -> None:
    message = WorkloadSnapshotMessage.of(snapshot(pods=200), emitted_at=0.0)
    assert encode(message).value == encode(message).value


def test_a_10000_pod_snapshot_fits_well_under_kafkas_default_record_size() -> None:
    message = WorkloadSnapshotMessage.of(large_snapshot(), emitted_at=1_714_568_400.0)
    encoded = encode(message)
    # Measured: about 9.3 MB of JSON, about 0.52 MB gzip-compressed.
    assert encoded.json_size > 8 * KAFKA_DEFAULT_MAX_BYTES
    assert encoded.compressed
    assert len(encoded.value) < 0.6 * KAFKA_DEFAULT_MAX_BYTES
    assert len(encoded.value) < MAX_MESSAGE_BYTES
    decoded = decode(WorkloadSnapshotMessage, encoded.value, encoded.headers)
    assert len(decoded.snapshot.pods) == 10_000
    assert decoded.snapshot == message.snapshot


def test_a_message_too_large_even_compressed_is_refused_before_it_reaches_the_bus() -> None:
    message = WorkloadSnapshotMessage.of(snapshot(pods=50), emitted_at=0.0)
    with pytest.raises(MessageTooLarge, match=r"workload-snapshot message is \d+ bytes") as raised:
        encode(message, max_bytes=1000)
    assert raised.value.limit == 1000
    assert raised.value.size > 1000


# --- validation when building ----------------------------------------------------------------


def test_a_snapshot_message_must_carry_the_key_and_version_of_its_snapshot() -> None:
    taken = snapshot(version=3)
    with pytest.raises(ValidationError, match="is not the snapshot's workload"):
        WorkloadSnapshotMessage(
            key="prod-eu-1/shop/Deployment/other", version=3, snapshot=taken, emitted_at=0.0
        )
    with pytest.raises(ValidationError, match="version 2 is not the snapshot's version 3"):
        WorkloadSnapshotMessage(key=taken.workload.key, version=2, snapshot=taken, emitted_at=0.0)


def test_a_non_finite_score_is_refused() -> None:
    with pytest.raises(ValidationError, match="finite number"):
        ranks(scores={PodUID("a"): math.inf})


def test_desired_costs_say_complete_exactly_when_no_strategy_is_missing() -> None:
    with pytest.raises(ValidationError, match="complete must be true exactly when"):
        costs(complete=True)
    with pytest.raises(ValidationError, match="complete must be true exactly when"):
        costs(complete=False, missing=())


def test_desired_costs_list_each_pod_once() -> None:
    pod = PodCost(namespace="shop", name="web-a", uid=PodUID("a"), cost=1, previous=None)
    with pytest.raises(ValidationError, match=r"costs\.1: pod uid 'a' appears twice"):
        costs(costs=(pod, pod))


def test_a_cost_outside_int32_is_refused() -> None:
    with pytest.raises(ValidationError, match="less than or equal to 2147483647"):
        PodCost(namespace="shop", name="web-a", uid=PodUID("a"), cost=2**31, previous=None)


# --- every way decode refuses a record -------------------------------------------------------


def test_bad_json_is_reported_as_bad_json() -> None:
    reason = reason_for(StrategyRanksMessage, b'{"schema_version": 1, "key": ')
    assert reason.startswith("bad JSON: Invalid JSON: EOF while parsing")


def test_bytes_that_are_not_text_are_reported_as_bad_json() -> None:
    assert reason_for(StrategyRanksMessage, b"\xff\xfe\x00").startswith("bad JSON:")


def test_json_that_is_not_an_object_is_reported_with_what_it_is() -> None:
    reason = reason_for(StrategyRanksMessage, b"[1, 2]")
    assert reason == "expected a JSON object for strategy-ranks, got an array"


def test_a_value_that_is_not_gzip_but_says_so_is_reported_as_bad_gzip() -> None:
    reason = reason_for(StrategyRanksMessage, b'{"a": 1}', {CONTENT_ENCODING: b"gzip"})
    assert reason.startswith("bad gzip: Error -3 while decompressing data: incorrect header check")


def test_a_truncated_gzip_stream_is_reported() -> None:
    cut = gzip.compress(encode(ranks()).value)[:-12]
    reason = reason_for(StrategyRanksMessage, cut, {CONTENT_ENCODING: b"gzip"})
    assert reason == "bad gzip: the stream is truncated"


def test_bytes_after_the_gzip_stream_are_reported() -> None:
    value = gzip.compress(encode(ranks()).value) + b"junk"
    reason = reason_for(StrategyRanksMessage, value, {CONTENT_ENCODING: b"gzip"})
    assert reason == "bad gzip: 4 stray bytes after the stream"


def test_a_gzip_value_that_inflates_past_the_limit_is_refused_without_inflating_it_all() -> None:
    bomb = gzip.compress(b" " * 1_000_000)
    with pytest.raises(DecodeError, match="inflates to more than 65536 bytes"):
        decode(StrategyRanksMessage, bomb, {CONTENT_ENCODING: b"gzip"}, max_decoded_bytes=65536)


def test_an_unknown_content_encoding_is_reported() -> None:
    reason = reason_for(StrategyRanksMessage, b"{}", {CONTENT_ENCODING: b"br"})
    assert reason == "unsupported content-encoding 'br' (supported: gzip, identity)"


def test_a_record_of_another_kind_is_refused_by_its_schema_header() -> None:
    encoded = encode(ranks())
    with pytest.raises(DecodeError) as raised:
        decode(DesiredCostsMessage, encoded.value, encoded.headers)
    assert raised.value.reason == (
        "expected a desired-costs message, the podcost-schema header says 'strategy-ranks/1'"
    )


def test_an_unsupported_version_in_the_schema_header_is_refused() -> None:
    reason = reason_for(StrategyRanksMessage, b"{}", {SCHEMA_HEADER: b"strategy-ranks/2"})
    assert reason == "unsupported schema version 2 for strategy-ranks (supported: 1)"


def test_a_malformed_schema_header_is_refused() -> None:
    reason = reason_for(StrategyRanksMessage, b"{}", {SCHEMA_HEADER: b"strategy-ranks"})
    assert reason == "the podcost-schema header 'strategy-ranks' is not <kind>/<version>"


def test_an_unsupported_schema_version_in_the_payload_is_refused() -> None:
    payload = json.loads(encode(ranks()).value) | {"schema_version": 3}
    reason = reason_for(StrategyRanksMessage, json.dumps(payload).encode())
    assert reason == "unsupported schema version 3 for strategy-ranks (supported: 1)"


def test_a_payload_without_a_schema_version_is_refused() -> None:
    payload = json.loads(encode(ranks()).value)
    del payload["schema_version"]
    reason = reason_for(StrategyRanksMessage, json.dumps(payload).encode())
    assert reason == "the strategy-ranks payload has no schema_version"


def test_validation_errors_name_the_field_path() -> None:
    message = WorkloadSnapshotMessage.of(snapshot(pods=5), emitted_at=0.0)
    payload = json.loads(encode(message).value)
    del payload["snapshot"]["pods"][3]["uid"]
    payload["snapshot"]["pods"][1]["phase"] = "Exploded"
    reason = reason_for(WorkloadSnapshotMessage, json.dumps(payload).encode())
    assert reason.startswith("invalid workload-snapshot: ")
    assert "snapshot.pods.1.phase: Input should be 'Pending', 'Running'" in reason
    assert "snapshot.pods.3.uid: Field required" in reason


def test_many_validation_errors_are_summarised() -> None:
    reason = reason_for(DesiredCostsMessage, b'{"schema_version": 1, "costs": [{}, {}]}')
    assert reason.startswith("invalid desired-costs: key: Field required; version: Field required")
    assert reason.endswith("(and 9 more)")


def test_a_payload_with_a_malformed_key_is_refused() -> None:
    payload = json.loads(encode(ranks()).value) | {"key": "shop/web"}
    reason = reason_for(StrategyRanksMessage, json.dumps(payload).encode())
    assert "key: Value error, invalid workload key 'shop/web'" in reason


def test_a_non_finite_score_on_the_wire_is_refused() -> None:
    value = encode(ranks()).value.replace(b"-2.5", b"-1e999")
    reason = reason_for(StrategyRanksMessage, value)
    assert reason == "invalid strategy-ranks: scores.b: Input should be a finite number"


def test_a_record_whose_key_is_not_the_payloads_key_is_refused() -> None:
    encoded = encode(ranks())
    with pytest.raises(DecodeError) as raised:
        decode(StrategyRanksMessage, encoded.value, encoded.headers, key="c/shop/Deployment/api")
    assert raised.value.reason == (
        "the record key b'c/shop/Deployment/api' is not the payload's key "
        "b'prod-eu-1/shop/Deployment/web'"
    )


def test_a_dead_letter_with_a_value_that_is_not_base64_is_refused() -> None:
    payload = json.loads(encode(letter()).value) | {"value": "not base64!"}
    reason = reason_for(DeadLetter, json.dumps(payload).encode())
    assert reason.startswith("invalid dead-letter: value: Value error,")


def test_unknown_fields_are_ignored_so_an_older_consumer_reads_a_newer_producer() -> None:
    payload = json.loads(encode(ranks()).value) | {"added_later": {"x": 1}}
    assert decode(StrategyRanksMessage, json.dumps(payload).encode()) == ranks()


def test_a_decode_error_is_never_worth_retrying() -> None:
    assert DecodeError.retriable is False
    assert MessageTooLarge.retriable is False


# --- the change time and workloads that are gone ---------------------------------------------


@pytest.mark.parametrize(
    "message",
    [WorkloadSnapshotMessage.of(snapshot(pods=1), emitted_at=3.0), ranks(), costs()],
    ids=["snapshot", "ranks", "costs"],
)
def test_a_message_from_a_producer_older_than_changed_at_still_decodes_without_it(
    message: Message,
) -> None:
    payload = json.loads(message.model_dump_json())
    del payload["changed_at"]
    decoded = decode(type(message), json.dumps(payload).encode())
    assert decoded.changed_at is None  # type: ignore[attr-defined]
    assert decoded == message


def test_a_workloads_record_is_read_as_a_snapshot_or_as_gone_by_its_schema_header() -> None:
    taken = WorkloadSnapshotMessage.of(snapshot(pods=3, version=2), emitted_at=1.0, changed_at=0.5)
    for message in (taken, gone()):
        encoded = encode(message)
        assert decode_workload_record(encoded.value, encoded.headers, key=encoded.key) == message
    # Without a header (a producer that sets none), it is a snapshot.
    assert decode_workload_record(encode(taken).value) == taken


def test_a_gone_message_read_as_a_snapshot_is_refused_by_its_header() -> None:
    encoded = encode(gone())
    with pytest.raises(DecodeError, match="expected a workload-snapshot message"):
        decode(WorkloadSnapshotMessage, encoded.value, encoded.headers)
    with pytest.raises(DecodeError, match="record key"):
        decode_workload_record(encoded.value, encoded.headers, key=b"c/ns/Deployment/other")


def batch(*keys: str) -> StrategyRanksBatchMessage:
    """A ranker's batch: the answer of :func:`ranks`, for each of ``keys``."""
    answer = ranks()
    return StrategyRanksBatchMessage(
        strategy=answer.strategy,
        answers=tuple(
            RankedWorkload(
                key=key, version=answer.version, scores=answer.scores,
                duration_seconds=answer.duration_seconds, changed_at=1_714_568_399.0,
                trace={TRACEPARENT: f"00-{'1' * 32}-{'2' * 16}-01"},
            )
            for key in keys
        ),
        emitted_at=answer.emitted_at,
    )  # fmt: skip


def test_a_batch_of_answers_travels_under_its_first_workload_and_reads_as_its_answers() -> None:
    keys = ("prod-eu-1/shop/Deployment/web", "prod-eu-1/shop/Deployment/api")
    message = batch(*keys)
    encoded = encode(message)
    assert encoded.key == keys[0].encode()
    assert encoded.headers[SCHEMA_HEADER] == b"strategy-ranks-batch/1"
    decoded = decode_ranks_record(encoded.value, encoded.headers, key=encoded.key)
    assert decoded == message
    assert isinstance(decoded, StrategyRanksBatchMessage)
    single = ranks()
    assert [answer.model_dump() for answer in decoded.messages()] == [
        single.model_copy(update={"key": key, "changed_at": 1_714_568_399.0}).model_dump()
        for key in keys
    ]
    assert [RankedWorkload.of(answer) for answer in decoded.messages()] == [
        answer.model_copy(update={"trace": {}}) for answer in message.answers
    ]
    # The ranks topic still reads one answer a record, as rankers published before batches.
    one = encode(single)
    assert decode_ranks_record(one.value, one.headers, key=one.key) == single


def test_an_empty_batch_or_one_with_a_malformed_key_is_refused() -> None:
    payload = json.loads(encode(batch("prod-eu-1/shop/Deployment/web")).value)
    empty = json.dumps(payload | {"answers": []}).encode()
    assert reason_for(StrategyRanksBatchMessage, empty).startswith(
        "invalid strategy-ranks-batch: answers: Tuple should have at least 1 item"
    )
    payload["answers"][0]["key"] = "shop/web"
    reason = reason_for(StrategyRanksBatchMessage, json.dumps(payload).encode())
    assert "answers.0.key: Value error, invalid workload key 'shop/web'" in reason


def combined(*answers: tuple[str, str]) -> RanksBatchMessage:
    """A batch of several strategies' answers: the answer of :func:`ranks` for each
    ``(strategy, key)``."""
    answer = ranks()
    return RanksBatchMessage(
        answers=tuple(
            StrategyAnswer(
                strategy=strategy, key=key, version=answer.version, scores=answer.scores,
                duration_seconds=answer.duration_seconds, changed_at=1_714_568_399.0,
                trace={TRACEPARENT: f"00-{'1' * 32}-{'2' * 16}-01"},
            )
            for strategy, key in answers
        ),
        emitted_at=answer.emitted_at,
    )  # fmt: skip


def test_a_batch_of_several_strategies_reads_as_each_strategy_s_answers() -> None:
    web, api = "prod-eu-1/shop/Deployment/web", "prod-eu-1/shop/Deployment/api"
    message = combined(("capacity-type", web), ("age", web), ("capacity-type", api))
    encoded = encode(message)
    assert encoded.key == web.encode()
    assert encoded.headers[SCHEMA_HEADER] == b"ranks-batch/1"
    decoded = decode_ranks_record(encoded.value, encoded.headers, key=encoded.key)
    assert decoded == message
    assert isinstance(decoded, RanksBatchMessage)
    single = ranks(changed_at=1_714_568_399.0)
    assert [answer.model_dump() for answer in decoded.messages()] == [
        single.model_copy(update={"strategy": strategy, "key": key}).model_dump()
        for strategy, key in (("capacity-type", web), ("age", web), ("capacity-type", api))
    ]
    # The same answers as one strategy's batch hold them, each with its strategy.
    assert [RankedWorkload.of(answer) for answer in decoded.messages()] == [
        RankedWorkload.model_validate(answer.model_dump(exclude={"strategy"}) | {"trace": {}})
        for answer in message.answers
    ]
    # Keyed by its first answer: a reader checks the record's key against it.
    with pytest.raises(DecodeError, match="record key"):
        decode_ranks_record(encoded.value, encoded.headers, key=api.encode())


def test_a_batch_of_several_strategies_without_answers_or_with_a_bad_strategy_is_refused() -> None:
    payload = json.loads(encode(combined(("age", KEY))).value)
    empty = json.dumps(payload | {"answers": []}).encode()
    assert reason_for(RanksBatchMessage, empty).startswith(
        "invalid ranks-batch: answers: Tuple should have at least 1 item"
    )
    for strategy in ("", "two words", None):
        answers = [payload["answers"][0] | {"strategy": strategy}]
        bad = json.dumps(payload | {"answers": answers}).encode()
        assert reason_for(RanksBatchMessage, bad).startswith(
            "invalid ranks-batch: answers.0.strategy"
        )
    unnamed = [{k: v for k, v in payload["answers"][0].items() if k != "strategy"}]
    reason = reason_for(RanksBatchMessage, json.dumps(payload | {"answers": unnamed}).encode())
    assert reason.startswith("invalid ranks-batch: answers.0.strategy: Field required")
    payload["answers"][0]["key"] = "shop/web"
    reason = reason_for(RanksBatchMessage, json.dumps(payload).encode())
    assert "answers.0.key: Value error, invalid workload key 'shop/web'" in reason
    payload["answers"][0]["key"] = KEY
    payload["answers"][0]["scores"] = {"a": "NaN"}
    assert "answers.0.scores.a" in reason_for(RanksBatchMessage, json.dumps(payload).encode())
    # One strategy's batch read as several strategies' is refused by its header.
    one = encode(batch(KEY))
    with pytest.raises(DecodeError, match="expected a ranks-batch message"):
        decode(RanksBatchMessage, one.value, one.headers)
