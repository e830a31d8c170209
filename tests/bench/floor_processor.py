"""The aggregator's records at the least CPU a processor can take: what its transport costs alone.

``bench_aggregator --processor floor`` runs the real transport (the faust app, or the consumer
loop) over the real broker with this processor in place of ``AggregationProcessor``, on the same
backlog. It keeps the aggregator's flow of records and nothing of its work:

- every snapshot record is one step of its key, kept as it came (its raw bytes, what the real
  processor stores in its snapshot part too);
- a ranks record is one step per answer, for the key the answer names: the record is gunzipped
  and parsed (``orjson``, in C) for those keys alone, nothing validated, nothing built;
- once a key has its snapshot and every answer it needs, one costs record of the size a real
  decision's takes (``COSTS_BYTES``, a 25-pod workload's gzipped costs) is queued for the costs
  topic of the key's cluster; :meth:`FloorProcessor.flush` sends everything queued and awaits
  every acknowledgement, as the real processor's does;
- a state is stored in the same two parts as a real one: the snapshot part when a snapshot came,
  the progress part (a count) when answers did, except right after its snapshot with no answer
  yet (as the real processor leaves out a progress its snapshot implies).

So the records read, produced and committed, and the changelog records written, are those of
the real aggregator (the bench prints the changelog count of both), and the decisions per second
it reaches bound what any processor can reach over that transport in one process here. A
measuring device, never a stand-in in a test.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from podcost_bus import Bus, Delivery, Record
from podcost_contracts.messages import CONTENT_ENCODING, GZIP
from podcost_contracts.topics import Topics
from podcost_core.aggregate import PROGRESS_PART, SNAPSHOT_PART

#: The size of a 25-pod workload's costs record: 15 KB of JSON gzipped at level 1, as
#: ``podcost_contracts.messages.FAST_GZIP_BELOW`` says it measured.
COSTS_BYTES = 1800


@dataclass(frozen=True, slots=True)
class FloorState:
    snapshot: bytes | None
    answers: int
    decided: bool


class FloorProcessor:
    """A ``KeyedProcessor`` that does only the aggregator's record bookkeeping (module
    docstring)."""

    parts = (SNAPSHOT_PART, PROGRESS_PART)

    def __init__(self, bus: Bus, topics: Topics, *, needed: int) -> None:
        self.bus = bus
        self.topics = topics
        self.needed = needed
        """Answers a key needs before it is decided (the default policy's ranked strategies)."""
        self._costs = os.urandom(COSTS_BYTES)  # incompressible, as gzipped bytes are
        self._queue: list[tuple[str, bytes | None]] = []
        self._topic_of: dict[bytes, str] = {}
        self._created: set[str] = set()

    def split(self, record: Record) -> Sequence[tuple[bytes | None, Any]]:
        if record.topic == self.topics.workloads:
            return [(record.key, record)]
        value = record.value
        if record.headers.get(CONTENT_ENCODING) == GZIP.encode():
            value = zlib.decompress(value, 16 + zlib.MAX_WBITS)
        answers = orjson.loads(value)["answers"]
        return [(key, key) for key in (answer["key"].encode() for answer in answers)]

    def on_record(self, step: Any, state: FloorState | None) -> FloorState | None:
        """``step``: a snapshot's record, or the key an answer is for."""
        current = state if state is not None else FloorState(None, 0, False)
        if isinstance(step, Record):
            key, new = step.key, FloorState(step.value, current.answers, current.decided)
        else:
            key, new = step, FloorState(current.snapshot, current.answers + 1, current.decided)
        if not new.decided and new.snapshot is not None and new.answers >= self.needed:
            new = FloorState(new.snapshot, new.answers, True)
            self._queue.append((self._costs_topic(key), key))
        return new

    def _costs_topic(self, key: bytes | None) -> str:
        cluster = (key or b"").partition(b"/")[0]
        topic = self._topic_of.get(cluster)
        if topic is None:
            topic = self._topic_of[cluster] = self.topics.costs_for(cluster.decode())
        return topic

    async def flush(self) -> None:
        queued, self._queue = self._queue, []
        for topic in {topic for topic, _ in queued} - self._created:
            await self.bus.ensure_topics([topic])
            self._created.add(topic)
        sent: list[Awaitable[Delivery]] = []
        for topic, key in queued:
            sent.append(await self.bus.send(topic, key, self._costs, {}))
        for acked in sent:
            await acked

    def on_tick(self, key: bytes | None, state: FloorState) -> FloorState | None:
        return None

    def wakeup(self, state: FloorState) -> float | None:
        return None

    def now(self) -> float:
        return time.time()

    def waiting(self, state: FloorState) -> bool:
        return False

    def dump(self, old: FloorState | None, new: FloorState) -> Mapping[str, bytes]:
        parts: dict[str, bytes] = {}
        fresh = new.snapshot is not None and (old is None or old.snapshot is not new.snapshot)
        if fresh and new.snapshot is not None:
            parts[SNAPSHOT_PART] = new.snapshot
        if (old is None or old.answers != new.answers) and not (fresh and new.answers == 0):
            parts[PROGRESS_PART] = b"%d" % new.answers
        return parts

    def load(self, key: bytes | None, parts: Mapping[str, bytes | None]) -> FloorState:
        progress = parts.get(PROGRESS_PART)
        return FloorState(parts.get(SNAPSHOT_PART), int(progress or 0), False)
