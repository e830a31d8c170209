"""The bus adapter: the only package that imports aiokafka and faust.

Services import from here: the ``Bus`` / ``Consumer`` protocols and ``Record``, ``open_bus`` to
get the bus their settings ask for (``KafkaBus`` when ``PODCOST_KAFKA`` is set, else the
in-process ``MemoryBus``), and the typed helpers that publish contract messages and dead-letter
what cannot be decoded.

``KafkaBus`` and ``KafkaConsumer`` are imported on first use (PEP 562): aiokafka costs about half
a second, which an embedded ``podcost run`` (the in-process bus) does not pay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from podcost_bus.memory import MemoryBus, MemoryConsumer
from podcost_bus.messaging import dead_letter, decode_or_dead_letter, publish_message
from podcost_bus.protocol import (
    Bus,
    BusError,
    Consumer,
    Delivery,
    OffsetReset,
    Record,
    TopicPartition,
)
from podcost_bus.settings import BusSettings
from podcost_contracts.messages import BATCHED_GZIP_ABOVE, DEFAULT_GZIP_THRESHOLD

if TYPE_CHECKING:
    from podcost_bus.kafka import KafkaBus, KafkaConsumer

__all__ = [
    "Bus",
    "BusError",
    "BusSettings",
    "Consumer",
    "Delivery",
    "KafkaBus",
    "KafkaConsumer",
    "MemoryBus",
    "MemoryConsumer",
    "OffsetReset",
    "Record",
    "TopicPartition",
    "dead_letter",
    "decode_or_dead_letter",
    "gzip_threshold",
    "key_partitioner",
    "open_bus",
    "publish_message",
]


def open_bus(settings: BusSettings) -> Bus:
    """The bus ``settings`` ask for, not started: Kafka if bootstrap servers are set, else an
    in-process bus (embedded mode: call this once and hand the same bus to every service)."""
    if settings.bootstrap_servers:
        from podcost_bus.kafka import KafkaBus

        return KafkaBus(settings)
    return MemoryBus(partitions=settings.partitions)


def key_partitioner(bus: Bus, settings: BusSettings) -> Callable[[bytes], int]:
    """The partition ``bus`` gives a record keyed by the argument, in the topics podcost
    creates (all have ``settings.partitions``): where a workload's snapshots are, and where a
    ranker's batch of answers must go for the aggregator holding those workloads to read it."""
    if isinstance(bus, MemoryBus):
        return bus.partition_of
    from podcost_bus.kafka import key_partition

    partitions = settings.partitions

    def partition_of(key: bytes) -> int:
        return key_partition(key, partitions)  # remembered there: asked for every answer

    return partition_of


def __getattr__(name: str) -> Any:
    if name in ("KafkaBus", "KafkaConsumer"):
        from podcost_bus import kafka

        return getattr(kafka, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def gzip_threshold(bus: Bus, settings: BusSettings) -> int:
    """Above how many bytes of JSON a producer on ``bus`` gzips a record's value one by one
    (``podcost_contracts.messages.encode``): left to the producer's batch compression up to
    ``BATCHED_GZIP_ABOVE`` when it has one (zstd by default: cheaper, and as small or smaller),
    else above ``DEFAULT_GZIP_THRESHOLD`` (no compression, or the in-memory bus, which
    compresses nothing). For a record one consumer reads; the watcher gzips its snapshots above
    the default either way, since every ranker process inflates each of them once for all its
    readers while each of its consumers would decompress a batch."""
    if isinstance(bus, MemoryBus) or settings.compression == "none":
        return DEFAULT_GZIP_THRESHOLD
    return BATCHED_GZIP_ABOVE
