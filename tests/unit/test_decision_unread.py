"""The aggregator decodes snapshots without the fields no decision reads
(``podcost_core.aggregate.DECISION_UNREAD``): its decisions must be exactly those it made on whole
snapshots, and a snapshot so decoded must still be refused for what a decision does read."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.decisions import complete_decision
from tests.unit.snapshots import PROPERTY, WORKLOAD, snapshots, zoned_snapshots

from podcost.aggregator.processor import desired_costs_json
from podcost_contracts.messages import (
    DecodeError,
    WorkloadSnapshotMessage,
    decode,
    decode_workload_record,
    encode,
    keep_decoded_snapshots,
    snapshot_validator,
)
from podcost_core.aggregate import DECISION_UNREAD
from podcost_core.model import Node, NodeName, Phase, Pod, PodUID, Resources, Snapshot, Unread
from podcost_core.strategies.base import COLLECTIONS, reading
from podcost_core.strategies.registry import default_registry

OPTED_IN = {"podcost.dev/enabled": "true"}
POLICIES = [
    OPTED_IN,
    {**OPTED_IN, "podcost.dev/strategies": "topology-spread=3,untolerated-taints=2,age=1"},
    {**OPTED_IN, "podcost.dev/strategies": "node-consolidation=2,co-location=1,priority-qos=1"},
]


def unread(message: bytes, headers: dict[str, bytes]) -> WorkloadSnapshotMessage:
    validator = snapshot_validator(DECISION_UNREAD)
    return decode(WorkloadSnapshotMessage, message, headers, validator=validator)


@PROPERTY
@given(st.one_of(snapshots(), zoned_snapshots()), st.sampled_from(POLICIES))
def test_a_decision_on_a_snapshot_read_without_the_unread_fields_is_the_same(
    snapshot: Snapshot, annotations: dict[str, str]
) -> None:
    snapshot = replace(snapshot, annotations=annotations)
    encoded = encode(WorkloadSnapshotMessage.of(snapshot, emitted_at=1.0))
    whole = decode(WorkloadSnapshotMessage, encoded.value, encoded.headers).snapshot
    lean = unread(encoded.value, encoded.headers).snapshot
    expected = complete_decision(whole)
    got = complete_decision(lean, answers_from=whole)  # the rankers read whole snapshots
    assert desired_costs_json(got, emitted_at=2.0) == desired_costs_json(expected, emitted_at=2.0)
    assert got.first_wrong == expected.first_wrong
    assert got.labelling.writes == expected.labelling.writes


def test_the_unread_fields_hold_their_defaults_and_the_rest_is_read_whole() -> None:
    pods = (
        Pod(uid=PodUID("u1"), name="web-1", namespace="ns", node=NodeName("n1"),
            phase=Phase.RUNNING, ready=True, ready_since=1.0, created=0.5, restarts=2,
            labels={"app": "web"}, annotations={"a": "b"}, requests=Resources(cpu_milli=5)),
    )  # fmt: skip
    node = Node(name=NodeName("n1"), labels={"zone": "a"}, annotations={"x": "y"})
    snapshot = Snapshot(workload=WORKLOAD, pods=pods, nodes={"n1": node}, annotations=OPTED_IN)
    encoded = encode(WorkloadSnapshotMessage.of(snapshot, emitted_at=1.0))
    lean = unread(encoded.value, encoded.headers).snapshot
    pod, node = lean.pods[0], lean.nodes["n1"]
    assert (pod.annotations, node.annotations, pod.requests) == ({}, {}, Resources())
    assert (pod.labels, node.labels) == ({"app": "web"}, {"zone": "a"})
    kept = [item.name for item in fields(Pod) if item.name not in DECISION_UNREAD.pod]
    assert all(getattr(pod, name) == getattr(pods[0], name) for name in kept)


def test_a_snapshot_read_so_is_still_refused_for_a_field_a_decision_reads() -> None:
    snapshot = Snapshot(workload=WORKLOAD, pods=(), annotations=OPTED_IN)
    encoded = encode(WorkloadSnapshotMessage.of(snapshot, emitted_at=1.0))
    bad_pod = b'"pods":[{"uid":"u","name":"p","namespace":"ns","node":null,"phase":"Sleeping"'
    broken = encoded.value.replace(b'"pods":[', bad_pod + b',"ready":true,"ready_since":null,'
                                   b'"created":null}', 1)  # fmt: skip
    with pytest.raises(DecodeError, match=r"snapshot\.pods\.0\.phase"):
        unread(broken, {})


def test_a_reader_that_leaves_fields_unread_shares_whole_decodes_but_not_the_other_way() -> None:
    snapshot = Snapshot(workload=WORKLOAD, pods=(), annotations=OPTED_IN)
    encoded = encode(WorkloadSnapshotMessage.of(replace(snapshot, version=7), emitted_at=9.0))
    lean = decode_workload_record(encoded.value, encoded.headers, unread=DECISION_UNREAD)
    whole = decode_workload_record(encoded.value, encoded.headers)
    assert whole is not lean  # a whole reader never gets a message with fields left unread
    assert decode_workload_record(encoded.value, encoded.headers) is whole
    # Once decoded whole, the record is read whole by every reader (embedded mode: the rankers
    # read a snapshot before the aggregator does).
    assert decode_workload_record(encoded.value, encoded.headers, unread=DECISION_UNREAD) is whole
    other = encode(WorkloadSnapshotMessage.of(replace(snapshot, version=8), emitted_at=9.0))
    lean = decode_workload_record(other.value, other.headers, unread=DECISION_UNREAD)
    assert decode_workload_record(other.value, other.headers, unread=DECISION_UNREAD) is lean


REGISTRY = default_registry()


@PROPERTY
@given(st.one_of(snapshots(), zoned_snapshots()), st.sampled_from(sorted(REGISTRY)))
def test_a_strategy_scores_a_snapshot_read_without_what_it_never_reads_as_a_whole_one(
    snapshot: Snapshot, name: str
) -> None:
    # What its ranker decodes (``Strategy.unread``) against what the watcher sent.
    strategy = REGISTRY.get_strategy(name)
    encoded = encode(WorkloadSnapshotMessage.of(snapshot, emitted_at=1.0))
    whole = decode(WorkloadSnapshotMessage, encoded.value, encoded.headers).snapshot
    validator = snapshot_validator(strategy.unread)
    lean = decode(WorkloadSnapshotMessage, encoded.value, encoded.headers, validator=validator)
    args = strategy.default_args()
    assert strategy.score(lean.snapshot, args) == strategy.score(whole, args)
    if strategy.domains is not None:
        assert strategy.domains(lean.snapshot, args) == strategy.domains(whole, args)


def test_only_fields_with_a_default_can_be_left_unread() -> None:
    with pytest.raises(ValueError, match=r"Pod has no field with a default named \['uid'\]"):
        Unread(pod=frozenset({"uid"}))
    with pytest.raises(ValueError, match="Node has no field with a default named"):
        Unread(node=frozenset({"nonsense"}))
    with pytest.raises(ValueError, match=r"not a collection .*\['lables'\]"):
        reading(pod=("lables",))
    assert reading(pod=COLLECTIONS.pod, node=COLLECTIONS.node) == Unread()


def test_a_reader_that_leaves_nothing_out_shares_the_whole_decode() -> None:
    snapshot = Snapshot(workload=WORKLOAD, pods=(), annotations=OPTED_IN, version=9)
    encoded = encode(WorkloadSnapshotMessage.of(snapshot, emitted_at=9.0))
    whole = decode_workload_record(encoded.value, encoded.headers)
    assert decode_workload_record(encoded.value, encoded.headers, unread=Unread()) is whole


def test_a_decode_is_kept_for_a_reader_a_thousand_records_behind_once_asked_to_keep_that_many() -> (
    None
):
    snapshot = Snapshot(workload=WORKLOAD, pods=(), annotations=OPTED_IN)
    records = [
        encode(WorkloadSnapshotMessage.of(replace(snapshot, version=v), emitted_at=9.0))
        for v in range(1, 1001)
    ]

    def read_all() -> list[WorkloadSnapshotMessage]:
        return [decode_workload_record(r.value, r.headers) for r in records]

    first = read_all()
    # By default the last 64 are kept: the first reader's decodes are gone for a late one.
    assert read_all()[0] is not first[0]
    keep_decoded_snapshots(1064)
    try:
        first = read_all()
        assert all(a is b for a, b in zip(read_all(), first, strict=True))
    finally:
        keep_decoded_snapshots(64)
    assert read_all()[0] is not first[0]
