"""The aggregator forgets a stored state whose snapshot is stamped in the future: one stored
before such records were refused would keep every genuine snapshot of its workload stale for as
long as the changelog keeps it (restarts included)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.support.clock import FakeClock
from tests.support.snapshots import snapshot as deployment

from podcost import aggregator
from podcost.runtime.settings import ServiceSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_core.aggregate import Latest, WorkloadState, dump_parts

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
