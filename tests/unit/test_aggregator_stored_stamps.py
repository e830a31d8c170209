"""The aggregator's stored states: it forgets one whose snapshot is stamped in the future (one
stored before such records were refused would keep every genuine snapshot of its workload stale
for as long as the changelog keeps it, restarts included), and it tells a stored state's wake-up
from its parts without decoding its snapshot."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from tests.support.clock import FakeClock
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.runtime.settings import ServiceSettings
from podcost_bus import BusSettings, MemoryBus, Record
from podcost_bus.keyed import UNKNOWN
from podcost_contracts.messages import WorkloadSnapshotMessage, encode
from podcost_core.aggregate import SNAPSHOT_PART, Latest, Verdict, WorkloadState, dump_parts

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("emitted_at", "kept"), [(NOW - 5, True), (NOW + 1e9, False)])
def test_a_stored_snapshot_from_the_future_is_forgotten_on_load(
    emitted_at: float, kept: bool
) -> None:
    snapshot = replace(deployment(pods=2, nodes=2), version=3)
    key = snapshot.workload.key
    stored = WorkloadState(key, latest=Latest(snapshot, emitted_at, NOW - 4, changed_at=NOW - 6))
    service = aggregator.bootstrap(
        ServiceSettings(http_port=0), BusSettings(), bus=MemoryBus(), clock=FakeClock(NOW)
    )
    loaded = service.processor.load(key.encode(), dump_parts(None, stored))
    assert loaded.key == key
    assert (loaded.latest is not None) is kept
    if kept:
        assert loaded.version == 3


async def test_a_stored_states_wake_up_is_read_from_its_parts_without_decoding_the_snapshot() -> (
    None
):
    """The snapshot part as stored from its record (``podcost-record/1``) says the snapshot's
    version and arrival in its header: with the progress part, the state's wake-up. A part that
    does not say (stored by a version before, or in the core's format) must be decoded."""
    service = aggregator.bootstrap(
        ServiceSettings(http_port=0), BusSettings(), bus=MemoryBus(), clock=FakeClock(NOW)
    )
    processor = service.processor
    snapshot = replace(deployment(pods=3, nodes=3), version=4)
    encoded = encode(WorkloadSnapshotMessage.of(snapshot, emitted_at=NOW - 1))
    record = Record(service.topics.workloads, 0, 7, encoded.key, encoded.value, encoded.headers)
    [(key, step)] = processor.split(record)
    assert isinstance(key, bytes)
    state = processor.on_record(step, None)
    assert isinstance(state, WorkloadState)
    await processor.flush()  # what the transport stores next is what was accepted since
    parts = processor.dump(None, state)
    assert parts[SNAPSHOT_PART].startswith(b"podcost-record/1\n")
    wakeup = processor.wakeup(processor.load(key, parts))
    assert wakeup is not None  # pending: its deadline
    assert processor.stored_wakeup(key, parts) == wakeup
    # Decided: no wake-up, from the progress part alone.
    decided = replace(state, progress=replace(state.progress, verdict=Verdict.COMPLETE))
    both = {**parts, **dump_parts(state, decided)}
    assert processor.wakeup(processor.load(key, both)) is None
    assert processor.stored_wakeup(key, both) is None

    header, _, value = parts[SNAPSHOT_PART].partition(b"\n")[2].partition(b"\n")
    older = json.loads(header)
    del older["version"]
    without = b"podcost-record/1\n" + json.dumps(older).encode() + b"\n" + value
    assert processor.stored_wakeup(key, {**parts, SNAPSHOT_PART: without}) is UNKNOWN
    assert processor.wakeup(processor.load(key, {**parts, SNAPSHOT_PART: without})) == wakeup
    core_format = dump_parts(None, state)
    assert processor.stored_wakeup(key, core_format) is UNKNOWN
