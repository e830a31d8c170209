"""What an operator's command asks of the Kafka cluster about one cluster of the fleet: when
its agent last published, whether its annotators' consumer group has members, how far a group
has read, and the deletions that remove the cluster (its costs topic, its annotators' group).

``podcost remove-cluster`` (``podcost.commands.remove_cluster``) calls these; nothing here
decides anything. Only this package imports aiokafka.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.protocol.admin import DeleteGroupsRequest

from podcost_bus.kafka import _bus_error, _client_options, _start
from podcost_bus.settings import BusSettings

#: Kafka's error codes a group deletion answers with that are not failures of the request.
_GROUP_ID_NOT_FOUND = 69
_NON_EMPTY_GROUP = 68


@dataclass(frozen=True, slots=True)
class GroupState:
    """A consumer group as the broker describes it."""

    exists: bool
    members: int
    state: str
    """``Empty``, ``Stable``, ``PreparingRebalance``, ... (``Dead``: it does not exist)."""


class FleetAdmin:
    """An admin client and a consumer without a group, over ``settings``; ``async with``."""

    def __init__(self, settings: BusSettings) -> None:
        self.settings = settings
        self._admin: Any = None

    async def __aenter__(self) -> FleetAdmin:
        admin = AIOKafkaAdminClient(**_client_options(self.settings))
        try:
            await _start(admin.start(), self.settings)
        except (KafkaError, OSError) as error:
            await admin.close()
            where = self.settings.bootstrap_servers
            raise _bus_error(error, f"cannot reach Kafka at {where}") from error
        self._admin = admin
        return self

    async def __aexit__(self, *exc: object) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()

    async def topics(self) -> set[str]:
        """Every topic the broker has."""
        try:
            return set(await self._admin.list_topics())
        except KafkaError as error:
            raise _bus_error(error, "cannot list the topics") from error

    async def delete_topics(self, topics: Iterable[str]) -> None:
        wanted = list(topics)
        if not wanted:
            return
        try:
            await self._admin.delete_topics(wanted)
        except KafkaError as error:
            raise _bus_error(error, f"cannot delete the topics {wanted}") from error

    async def group(self, group: str) -> GroupState:
        try:
            [response] = await self._admin.describe_consumer_groups([group])
        except KafkaError as error:
            raise _bus_error(error, f"cannot describe the consumer group {group!r}") from error
        # DescribeGroups v0..: (error_code, group_id, state, protocol_type, protocol, members...)
        described = response.groups[0]
        state, members = described[2], described[5]
        return GroupState(exists=state != "Dead", members=len(members), state=state)

    async def delete_group(self, group: str) -> bool:
        """Delete ``group`` (its committed offsets); ``False`` if it did not exist. A group with
        members is refused by the broker (a ``BusError``)."""
        try:
            coordinator = await self._admin.find_coordinator(group)
            response = await self._admin._send_request(DeleteGroupsRequest([group]), coordinator)
        except KafkaError as error:
            raise _bus_error(error, f"cannot delete the consumer group {group!r}") from error
        [(_, code)] = response.results
        if code == _GROUP_ID_NOT_FOUND:
            return False
        if code == _NON_EMPTY_GROUP:
            raise _bus_error(KafkaError(f"the group {group!r} has members"), "cannot delete it")
        if code != 0:
            raise _bus_error(KafkaError(f"error code {code}"), f"cannot delete {group!r}")
        return True

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        """The offsets ``group`` has committed on ``topic``, by partition."""
        try:
            offsets = await self._admin.list_consumer_group_offsets(group)
        except KafkaError as error:
            raise _bus_error(error, f"cannot read the offsets of {group!r}") from error
        return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}

    async def last_published(
        self, topic: str, prefix: bytes, since: float, *, ignore: bytes = b""
    ) -> float | None:
        """When (POSIX seconds) the latest record of ``topic`` whose key starts with
        ``prefix`` (and is not ``ignore``) was written, among those written since ``since``;
        ``None``: none was. Reads only the records of that window (``offsets_for_times``),
        without a consumer group."""
        consumer = AIOKafkaConsumer(**_client_options(self.settings), enable_auto_commit=False)
        try:
            await _start(consumer.start(), self.settings)
            cluster = await consumer._client.fetch_all_metadata()
            partitions = cluster.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, partition) for partition in sorted(partitions)]
            if not tps:
                return None
            consumer.assign(tps)
            starts = await consumer.offsets_for_times({tp: int(since * 1000) for tp in tps})

            ends: Mapping[TopicPartition, int] = await consumer.end_offsets(tps)

            latest: float | None = None
            for tp in tps:
                found = starts.get(tp)
                if found is None or found.offset >= ends[tp]:
                    continue
                consumer.seek(tp, found.offset)
                while await consumer.position(tp) < ends[tp]:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    for record in batch.get(tp, []):
                        key = record.key
                        if key is not None and key.startswith(prefix) and key != ignore:
                            stamp = record.timestamp / 1000
                            latest = stamp if latest is None else max(latest, stamp)
            return latest
        except KafkaError as error:
            raise _bus_error(error, f"cannot read {topic!r}") from error
        finally:
            await consumer.stop()


async def wait_until_read(
    admin: FleetAdmin, group: str, topic: str, offsets: Mapping[int, int], *, within: float
) -> bool:
    """Whether ``group`` commits past every ``offsets`` (partition → offset) of ``topic``
    within ``within`` seconds (polled every half second)."""
    deadline = time.monotonic() + within
    while True:
        committed = await admin.committed(group, topic)
        if all(committed.get(partition, -1) > offset for partition, offset in offsets.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.5)
