"""The Kafka bus: the ``Bus`` and ``Consumer`` protocols over aiokafka, for a fleet.

``podcost_bus.open_bus`` builds it when ``PODCOST_KAFKA`` is set; the services' lifespans start
and stop it. This module and its package are the only code that imports aiokafka: nothing of the
client library leaves it (records become ``Record``, errors become ``BusError`` with the client's
``retriable`` verdict).

Producer: ``acks=all`` and idempotence (no duplicate or reordered records from the producer's own
retries), batching with a short linger, zstd batch compression (``PODCOST_KAFKA_COMPRESSION``; with
contexts kept between batches, ``podcost_bus.codec``).
Consumer: a group member with ``enable_auto_commit=False``; offsets move only when the caller
commits what it has processed, so delivery is at least once. Pausing a consumer keeps it polling
(so the group does not evict it) while nothing is delivered, also for partitions assigned while
paused.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
from collections import deque
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    CommitFailedError,
    ConsumerStoppedError,
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)
from aiokafka.helpers import create_ssl_context
from aiokafka.partitioner import murmur2

from podcost_bus import codec
from podcost_bus.protocol import (
    BusError,
    Delivery,
    Lifecycle,
    OffsetReset,
    PollingConsumer,
    Record,
    TopicPartition,
)
from podcost_bus.settings import BusSettings
from podcost_contracts.topic_contract import TopicDrift, drift

# Every producer and consumer of the process, faust's included, reads and writes zstd batches with
# kept contexts instead of a new one a batch (podcost_bus.codec).
codec.install()

log = logging.getLogger(__name__)

#: How long one fetch waits when the caller waits without a deadline: short enough that a
#: paused consumer keeps polling (the group evicts a member that stops polling).
_FETCH_SLICE_S: Final = 1.0


def _bus_error(error: BaseException, doing: str) -> BusError:
    """``error`` from aiokafka as a ``BusError`` that says what was being done."""
    if isinstance(error, KafkaTimeoutError | TimeoutError):
        retriable = True  # aiokafka leaves its own timeout unmarked; another try may well work
    elif isinstance(error, KafkaError):
        retriable = bool(error.retriable)
    else:
        retriable = isinstance(error, OSError)  # connection refused, reset, DNS
    return BusError(f"{doing}: {type(error).__name__}: {error}", retriable=retriable)


def _client_options(settings: BusSettings) -> dict[str, Any]:
    """What the producer, the consumers and the admin client share: where and how to connect."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "security_protocol": settings.security_protocol,
        "request_timeout_ms": settings.request_timeout_ms,
    }
    if settings.uses_tls:
        options["ssl_context"] = create_ssl_context(
            cafile=settings.ssl_cafile,
            certfile=settings.ssl_certfile,
            keyfile=settings.ssl_keyfile,
            password=settings.ssl_password.get_secret_value() if settings.ssl_password else None,
        )
    if settings.sasl_mechanism is not None:
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = (
            settings.sasl_password.get_secret_value() if settings.sasl_password else None
        )
    return options


def _key_bytes(key: str | bytes | None) -> bytes | None:
    return key.encode() if isinstance(key, str) else key


#: How long a cancelled client start may go on to end by itself (see :func:`_start`).
START_GRACE_S: Final = 5.0


async def _start(starting: Awaitable[None], settings: BusSettings) -> None:
    """An aiokafka client's ``start()``, not left half-done by a cancellation: cancelled while it
    connects, aiokafka leaves that connection open (``create_conn`` closes nothing when its
    ``connect`` is cancelled), and nothing could close it any more (the client's ``close`` knows
    only the connections it has registered): seen as an unclosed ``AIOKafkaConnection`` of an
    aggregator stopped during its start in ``tests/e2e/test_restarts.py``. A cancellation lets the
    start end first (for :data:`START_GRACE_S` at most: a broker that does not answer is not
    waited for), so that the caller's stop closes what it opened, then goes on."""
    task = asyncio.ensure_future(starting)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task}, timeout=min(START_GRACE_S, settings.request_timeout_ms / 1000))
        if not task.done():
            task.cancel()
        elif not task.cancelled():
            task.exception()  # retrieved: its failure means nothing to a caller going away
        raise


#: How many keys' partitions :func:`key_partition` remembers: murmur2 is pure Python in aiokafka
#: (about 13 µs a key here), asked for every keyed record a producer sends (a decision's costs
#: and its state's changelog records: 3.6 a decision in ``bench_aggregator.py``) and for every
#: due key of a tick, and the keys are the fleet's workloads, which recur.
KEY_PARTITIONS_KEPT: Final = 16384


@functools.lru_cache(maxsize=KEY_PARTITIONS_KEPT)
def key_partition(key: bytes, partitions: int) -> int:
    """The partition the Kafka producers' default partitioner (murmur2) gives ``key``."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


def partition_by_key(
    key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
) -> int:
    """aiokafka's ``DefaultPartitioner`` (the Java client's murmur2 for a key, a random partition
    for none), each key's partition remembered (:func:`key_partition`): the partitioner of
    every producer podcost makes, its own and faust's."""
    if key is None:
        return random.choice(available or all_partitions)
    return all_partitions[key_partition(bytes(key), len(all_partitions))]


class KafkaBus(Lifecycle):
    """The ``Bus`` protocol over a Kafka cluster."""

    def __init__(self, settings: BusSettings) -> None:
        if not settings.bootstrap_servers:
            raise ValueError("KafkaBus needs bootstrap servers (PODCOST_KAFKA)")
        self.settings = settings
        self.plan = settings.topic_plan()
        """The topic contract: what a topic is created with and checked against."""
        self._producer: Any = None
        self._drift: dict[str, tuple[TopicDrift, ...]] = {}

    async def start(self) -> None:
        if self._producer is not None:
            return
        settings = self.settings
        producer = AIOKafkaProducer(
            **_client_options(settings),
            acks="all",
            enable_idempotence=True,
            linger_ms=settings.linger_ms,
            max_batch_size=settings.max_batch_bytes,
            compression_type=None if settings.compression == "none" else settings.compression,
            partitioner=partition_by_key,
        )
        try:
            await _start(producer.start(), settings)
        except asyncio.CancelledError:
            await producer.stop()
            raise
        except (KafkaError, OSError) as error:
            await producer.stop()
            raise _bus_error(
                error, f"cannot reach Kafka at {settings.bootstrap_servers}"
            ) from error
        self._producer = producer

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()  # sends what is queued first

    def topic_drift(self) -> Mapping[str, tuple[TopicDrift, ...]]:
        return dict(self._drift)

    async def ensure_topics(self, topics: Iterable[str]) -> None:
        """Create the missing topics with the settings of the topic contract
        (``podcost_contracts.topic_contract``: partitions, replicas, cleanup policy, retention,
        ``min.insync.replicas``), and return once every partition of every topic has a leader
        (so the first reads and writes do not meet a leader election). An existing topic whose
        settings differ from the contract is left as it is, logged as a warning and kept in
        :meth:`topic_drift` (the services export it as ``podcost_topic_config_drift``).

        On a broker with ACLs a principal may create only the topics it writes: a creation the
        broker refuses (``TopicAuthorizationFailed``) is left to the principal that may, and
        the topic is waited for like the others. Until its writer has created it, the broker
        answers a principal without the right to create it ``TopicAuthorizationFailed`` for it
        too (the metadata request may auto-create), so that is waited for as well; still so at
        the deadline, it is an error that names the missing ACL or the missing writer."""
        wanted = list(dict.fromkeys(topics))
        if not wanted:
            return
        settings = self.settings
        admin = AIOKafkaAdminClient(**_client_options(settings))
        try:
            await _start(admin.start(), settings)
            response = await admin.create_topics(
                [
                    NewTopic(
                        name,
                        num_partitions=spec.partitions if spec else settings.partitions,
                        replication_factor=settings.replication_factor,
                        topic_configs=spec.configs() if spec else {},
                    )
                    for name in wanted
                    for spec in [self.plan.spec_for(name)]
                ]
            )
            _raise_topic_errors(response.topic_errors)
            described = await _wait_for_leaders(admin, wanted, settings.request_timeout_ms / 1000)
            await self._check(admin, described)
        except (KafkaError, OSError) as error:
            raise _bus_error(error, f"cannot create the topics {wanted}") from error
        finally:
            await admin.close()

    async def send(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Awaitable[Delivery]:
        producer = self._started()
        try:
            acked = await producer.send(
                topic, value=value, key=_key_bytes(key), headers=list((headers or {}).items())
            )
        except KafkaError as error:
            raise _bus_error(error, f"cannot publish to {topic!r}") from error
        return _delivery(acked, topic)

    async def publish(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> Delivery:
        return await (await self.send(topic, key, value, headers))

    async def broadcast(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Mapping[str, bytes] | None = None,
    ) -> list[Delivery]:
        producer = self._started()
        try:
            partitions = sorted(await producer.partitions_for(topic))
            acks = [
                _delivery(
                    await producer.send(
                        topic, value=value, key=_key_bytes(key),
                        headers=list((headers or {}).items()), partition=partition,
                    ),
                    topic,
                )
                for partition in partitions
            ]  # fmt: skip
        except KafkaError as error:
            raise _bus_error(error, f"cannot publish to {topic!r}") from error
        return list(await asyncio.gather(*acks))

    def consumer(
        self,
        topics: Sequence[str],
        *,
        group: str,
        offset_reset: OffsetReset = "earliest",
        max_poll_records: int | None = None,
    ) -> KafkaConsumer:
        if not topics:
            raise ValueError("a consumer needs at least one topic")
        return KafkaConsumer(
            self.settings,
            tuple(topics),
            group,
            offset_reset,
            max_poll_records or self.settings.max_poll_records,
        )

    def _started(self) -> Any:
        if self._producer is None:
            raise BusError("the Kafka bus is not started", retriable=False)
        return self._producer

    async def _check(self, admin: Any, described: Sequence[Mapping[str, Any]]) -> None:
        """Compare each described topic with the contract; record and log what differs. A
        principal without ``DescribeConfigs`` on a topic checks its partitions and replicas
        only."""
        specs = {
            topic["topic"]: spec
            for topic in described
            if (spec := self.plan.spec_for(topic["topic"])) is not None
        }
        configs = await _topic_configs(admin, list(specs))
        for topic in described:
            name = topic["topic"]
            spec = specs.get(name)
            if spec is None:
                continue
            partitions = topic["partitions"]
            found = drift(
                spec,
                partitions=len(partitions),
                replication_factor=min(len(p["replicas"]) for p in partitions),
                configs=configs.get(name, {}),
            )
            if found:
                for difference in found:
                    log.warning("topic configuration drift: %s", difference)
                self._drift[name] = tuple(found)
            else:
                self._drift.pop(name, None)


async def _topic_configs(admin: Any, topics: list[str]) -> dict[str, dict[str, str]]:
    """Each topic's configs as the broker describes them (a topic this principal may not
    describe the configs of is left out)."""
    if not topics:
        return {}
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in topics]
    )
    found: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.resources:
            error_code, _, _, name, entries = resource[:5]
            if error_code == 0:
                found[name] = {entry[0]: entry[1] for entry in entries if entry[1] is not None}
    return found


def _raise_topic_errors(topic_errors: Iterable[tuple[Any, ...]]) -> None:
    fine = (0, TopicAlreadyExistsError.errno, TopicAuthorizationFailedError.errno)
    for entry in topic_errors:
        name, code = entry[0], entry[1]
        if code in fine:
            continue
        error_class = for_code(code)
        detail = entry[2] if len(entry) > 2 and entry[2] else error_class.description
        raise BusError(
            f"cannot create the topic {name!r}: {error_class.__name__}: {detail}",
            retriable=bool(error_class.retriable),
        )


async def _wait_for_leaders(
    admin: Any, topics: list[str], within: float
) -> list[Mapping[str, Any]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        described = await admin.describe_topics(topics)
        hidden = sorted(
            topic["topic"]
            for topic in described
            if topic["error_code"] == TopicAuthorizationFailedError.errno
        )
        if hidden and loop.time() >= deadline:
            raise BusError(
                f"the topics {hidden} are not authorized for this principal after {within:g}s "
                "(no ACL lets it describe them, or their writer has not created them yet)",
                retriable=True,
            )
        leaderless = sorted(
            topic["topic"]
            for topic in described
            if topic["error_code"] != 0
            or not topic["partitions"]
            or any(partition["leader"] < 0 for partition in topic["partitions"])
        )
        if not leaderless:
            return list(described)
        if loop.time() >= deadline:
            raise BusError(
                f"the topics {leaderless} have partitions without a leader after {within:g}s",
                retriable=True,
            )
        await asyncio.sleep(0.1)  # the broker's metadata, not our code, is what we wait for


def _delivery(acked: asyncio.Future[Any], topic: str) -> asyncio.Future[Delivery]:
    """aiokafka's acknowledgement future as one of a ``Delivery`` (errors as ``BusError``)."""
    result: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()

    def settle(done: asyncio.Future[Any]) -> None:
        if result.done():
            return
        if done.cancelled():
            result.cancel()
        elif (error := done.exception()) is not None:
            failed = _bus_error(error, f"{topic!r} did not acknowledge a record")
            failed.__cause__ = error  # as ``raise ... from`` does for the other errors
            result.set_exception(failed)
        else:
            metadata = done.result()
            result.set_result(Delivery(metadata.topic, metadata.partition, metadata.offset))

    acked.add_done_callback(settle)
    return result


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, owner: KafkaConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
        self._owner._revoked({TopicPartition(tp.topic, tp.partition) for tp in revoked})

    async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
        self._owner._assigned(list(assigned))


class KafkaConsumer(PollingConsumer):
    """A consumer group member over aiokafka (the ``Consumer`` protocol)."""

    def __init__(
        self,
        settings: BusSettings,
        topics: tuple[str, ...],
        group: str,
        offset_reset: OffsetReset,
        max_poll_records: int,
    ) -> None:
        if max_poll_records < 1:
            raise ValueError("max_poll_records must be at least 1")
        self.settings = settings
        self.topics = topics
        self._group = group
        self._offset_reset = offset_reset
        self._max_poll_records = max_poll_records
        self._consumer: Any = None
        self._buffer: deque[Record] = deque()
        """Fetched, not yet delivered (``__anext__`` takes one record at a time)."""
        self._delivered: dict[TopicPartition, int] = {}
        """Offset past the last record delivered, per owned partition."""
        self._committed: dict[TopicPartition, int] = {}
        self._paused = False
        self._epochs: dict[TopicPartition, int] = {}
        """Per owned partition, the assignment it was given under (``epoch``)."""
        self._assignments = itertools.count(1)

    @property
    def group(self) -> str:
        return self._group

    async def start(self) -> None:
        if self._consumer is not None:
            return
        settings = self.settings
        wait = settings.fetch_max_wait_ms  # unset: aiokafka's own
        fetch_wait = {} if wait is None else {"fetch_max_wait_ms": wait}
        consumer = AIOKafkaConsumer(
            **_client_options(settings),
            group_id=self._group,
            enable_auto_commit=False,
            auto_offset_reset=self._offset_reset,
            max_poll_records=self._max_poll_records,
            fetch_min_bytes=settings.fetch_min_bytes,
            **fetch_wait,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=max(settings.session_timeout_ms // 3, 100),
        )
        consumer.subscribe(list(self.topics), listener=_Rebalance(self))
        self._consumer = consumer  # before starting: the listener may run from then on
        try:
            await _start(consumer.start(), self.settings)
        except (KafkaError, OSError) as error:
            self._consumer = None
            await consumer.stop()
            raise _bus_error(
                error, f"cannot reach Kafka at {settings.bootstrap_servers}"
            ) from error
        except BaseException:
            # Cancelled half-way through start: its group coordinator may already run, and
            # would join the group and hold partitions that nobody then reads.
            self._consumer = None
            await consumer.stop()
            raise

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        self._buffer.clear()
        self._delivered.clear()
        self._committed.clear()
        self._epochs.clear()
        if consumer is not None:
            await consumer.stop()  # leaves the group; commits nothing (auto-commit is off)

    async def poll(
        self, *, max_wait: float | None = None, max_records: int | None = None
    ) -> list[Record]:
        limit = max_records or self._max_poll_records
        loop = asyncio.get_running_loop()
        deadline = None if max_wait is None else loop.time() + max_wait
        while self._consumer is not None:
            if self._buffer and not self._paused:
                return self._deliver(limit)
            wait = _FETCH_SLICE_S if deadline is None else max(0.0, deadline - loop.time())
            # Fetched first, then added: ``self._buffer.extend(await ...)`` would bind the deque
            # before the fetch, and a rebalance during the fetch (which can then return the new
            # assignment's first records) must find these records in the buffer it filters.
            fetched = await self._fetch(min(wait, _FETCH_SLICE_S), limit)
            self._buffer.extend(fetched)
            if self._buffer and not self._paused:
                return self._deliver(limit)
            if deadline is not None and loop.time() >= deadline:
                break
        return []

    async def commit(self, records: Iterable[Record] | None = None) -> dict[TopicPartition, int]:
        consumer = self._consumer
        if consumer is None:
            return {}
        if records is None:
            wanted = dict(self._delivered)
        else:
            wanted = {}
            for record in records:
                wanted[record.tp] = max(wanted.get(record.tp, 0), record.offset + 1)
        owned = self.assignment()
        offsets = {
            tp: offset
            for tp, offset in wanted.items()
            if tp in owned and self._committed.get(tp) != offset
        }
        if not offsets:
            return {}
        try:
            await consumer.commit(
                {KafkaTopicPartition(tp.topic, tp.partition): off for tp, off in offsets.items()}
            )
        except (CommitFailedError, IllegalStateError) as error:
            # The group rebalanced since these records were fetched: whoever owns the
            # partitions now reads them again from the last commit. Nothing is lost.
            log.warning("commit of %s dropped after a rebalance: %s", offsets, error)
            return {}
        except KafkaError as error:
            raise _bus_error(error, f"cannot commit {offsets} for group {self._group!r}") from error
        self._committed.update(offsets)
        return offsets

    def pause(self) -> None:
        self._paused = True
        if self._consumer is not None:
            self._consumer.pause(*self._consumer.assignment())

    def resume(self) -> None:
        self._paused = False
        if self._consumer is not None:
            self._consumer.resume(*self._consumer.assignment())

    @property
    def paused(self) -> bool:
        return self._paused

    def assignment(self) -> frozenset[TopicPartition]:
        if self._consumer is None:
            return frozenset()
        return frozenset(
            TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()
        )

    def epoch(self, tp: TopicPartition) -> int | None:
        return self._epochs.get(tp) if tp in self.assignment() else None

    async def lag(self) -> dict[TopicPartition, int]:
        consumer = self._consumer
        owned = [KafkaTopicPartition(tp.topic, tp.partition) for tp in self.assignment()]
        if consumer is None or not owned:
            return {}
        # Asked of the broker: a paused partition is not fetched, so the high-water mark a
        # fetch reports would stand still exactly while the lag grows.
        try:
            ends = await consumer.end_offsets(owned)
            lags = {}
            for kafka_tp in owned:
                tp = TopicPartition(kafka_tp.topic, kafka_tp.partition)
                try:
                    position: int = await consumer.position(kafka_tp)
                except IllegalStateError:
                    continue  # revoked by a rebalance meanwhile: its lag is another member's
                buffered = sum(1 for record in self._buffer if record.tp == tp)
                lags[tp] = max(0, ends[kafka_tp] - position) + buffered
        except KafkaError as error:
            raise _bus_error(error, f"cannot read the lag of group {self._group!r}") from error
        return lags

    # --- internals ----------------------------------------------------------------------------

    async def _fetch(self, wait: float, limit: int) -> list[Record]:
        try:
            batches = await self._consumer.getmany(timeout_ms=int(wait * 1000), max_records=limit)
        except ConsumerStoppedError:
            return []
        except KafkaError as error:
            raise _bus_error(error, f"cannot read {list(self.topics)}") from error
        return [
            Record(
                topic=raw.topic,
                partition=raw.partition,
                offset=raw.offset,
                key=raw.key,
                value=raw.value if raw.value is not None else b"",
                headers={name: value or b"" for name, value in raw.headers},
                timestamp=raw.timestamp / 1000,
            )
            for records in batches.values()
            for raw in records
        ]

    def _deliver(self, limit: int) -> list[Record]:
        taken = [self._buffer.popleft() for _ in range(min(limit, len(self._buffer)))]
        for record in taken:
            self._delivered[record.tp] = record.offset + 1
        return taken

    def _revoked(self, revoked: set[TopicPartition]) -> None:
        # Filtered in place: the buffer stays the one object that ``poll`` fills.
        kept = [record for record in self._buffer if record.tp not in revoked]
        self._buffer.clear()
        self._buffer.extend(kept)
        for tp in revoked:
            self._delivered.pop(tp, None)
            self._committed.pop(tp, None)
            self._epochs.pop(tp, None)

    def _assigned(self, assigned: list[Any]) -> None:
        for raw in assigned:
            self._epochs[TopicPartition(raw.topic, raw.partition)] = next(self._assignments)
        if self._paused and assigned and self._consumer is not None:
            self._consumer.pause(*assigned)
