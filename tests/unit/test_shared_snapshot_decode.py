"""One decode of a snapshot record serves every reader of it in a process (the rankers of
several strategies together, each with its own consumer): kept until each has read it, however
far apart their positions drift, and let go then; every read still checks the record's key, and
a record that cannot be decoded is refused to each reader, never kept."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from tests.unit.snapshots import WORKLOAD

from podcost_contracts.messages import (
    DecodeError,
    Encoded,
    WorkloadSnapshotMessage,
    decode_workload_record,
    encode,
    keep_decoded_snapshots,
)
from podcost_core.model import Snapshot

OPTED_IN = {"podcost.dev/enabled": "true"}
READERS = 3


@pytest.fixture(autouse=True)
def shared_by_three_readers() -> Iterator[None]:
    keep_decoded_snapshots(4064, readers=READERS)
    yield
    keep_decoded_snapshots(64)


def records(count: int) -> list[Encoded]:
    snapshot = Snapshot(workload=WORKLOAD, pods=(), annotations=OPTED_IN)
    return [
        encode(WorkloadSnapshotMessage.of(replace(snapshot, version=v), emitted_at=9.0))
        for v in range(1, count + 1)
    ]


def read(encoded: list[Encoded]) -> list[WorkloadSnapshotMessage]:
    out = []
    for record in encoded:
        message = decode_workload_record(record.value, record.headers, key=WORKLOAD.key)
        assert isinstance(message, WorkloadSnapshotMessage)
        out.append(message)
    return out


def test_readers_three_thousand_records_apart_share_one_decode_of_each_record() -> None:
    encoded = records(3000)
    first = read(encoded)
    assert [m.version for m in first] == list(range(1, 3001))
    for _ in range(READERS - 1):
        assert all(a is b for a, b in zip(read(encoded), first, strict=True))


def test_a_record_is_let_go_once_every_reader_has_read_it() -> None:
    encoded = records(10)
    first = read(encoded)
    for _ in range(READERS - 1):
        read(encoded)
    # A fourth read (a reader starting over after a restart) decodes it again.
    again = read(encoded)
    assert again == first
    assert all(a is not b for a, b in zip(again, first, strict=True))


def test_the_bounds_still_hold_when_a_reader_never_comes() -> None:
    keep_decoded_snapshots(100, readers=READERS)
    encoded = records(300)
    first = read(encoded)
    # The last 100 were kept; the first 200 were pushed out before another reader came.
    assert all(a is b for a, b in zip(read(encoded[200:]), first[200:], strict=True))
    assert all(a is not b for a, b in zip(read(encoded[:200]), first[:200], strict=True))


def test_every_read_of_a_shared_decode_still_checks_the_records_key() -> None:
    (record,) = records(1)
    read([record])
    with pytest.raises(DecodeError, match="key"):
        decode_workload_record(record.value, record.headers, key="other/ns/Deployment/web")


def test_an_undecodable_record_is_refused_to_every_reader_and_never_kept() -> None:
    (record,) = records(1)
    broken = record.value[: len(record.value) // 2]
    for _ in range(READERS + 1):
        with pytest.raises(DecodeError):
            decode_workload_record(broken, record.headers, key=WORKLOAD.key)
