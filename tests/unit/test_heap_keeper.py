"""``HeapKeeper``: what survives goes out of the collector's passes, and a full collection now
and then still frees the cycles that became garbage once frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from podcost.runtime.heap import HeapKeeper


class Node:
    """A container the collector tracks; two of them referring to each other are a cycle."""

    other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the test process's collector as it was: nothing frozen, collecting
    gc.enable()


def test_a_tick_freezes_what_survived_and_only_the_full_pass_frees_a_frozen_cycle() -> None:
    now = [0.0]
    keeper = HeapKeeper(full_every_s=600.0, clock=lambda: now[0])
    kept = Node()
    cycle, partner = Node(), Node()
    cycle.other, partner.other = partner, cycle
    gone = weakref.ref(cycle)

    assert keeper.tick() is False
    assert gc.get_freeze_count() > 0
    del cycle, partner  # garbage now, but frozen: no pass sees it
    gc.collect()
    assert gone() is not None

    now[0] = 599.0
    assert keeper.tick() is False
    assert gone() is not None

    now[0] = 600.0
    assert keeper.tick() is True  # everything collected, frozen part included
    assert gone() is None
    assert gc.get_freeze_count() > 0  # and what survived frozen again
    assert kept.other is None
    assert not gc.isenabled()  # no automatic pass in between
    keeper.stop()  # the service stopped: the process collects again
    assert gc.isenabled()


def test_refcounting_still_frees_what_a_tick_froze() -> None:
    keeper = HeapKeeper(clock=lambda: 0.0)
    state = Node()
    replaced = weakref.ref(state)
    keeper.tick()
    state = Node()  # a decision replaces a workload's state
    assert replaced() is None
