"""Several strategies' rankers in one process (``podcost ranker --strategy A --strategy B``, the
chart's ``rankers.together``): each answers every snapshot in its own consumer group, as
separate processes would, over the real broker; the process is a real ``podcost`` process with
the container's arguments and environment as the chart renders them (``tests.support.services``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from tests.support.pipeline import eventually, fresh_kafka_settings
from tests.support.services import chart_specs, processes, sample
from tests.support.snapshots import snapshot
from tests.support.tools import require_helm

from podcost.ranker import together_bus_settings
from podcost_bus import open_bus
from podcost_contracts.messages import (
    StrategyRanksBatchMessage,
    WorkloadSnapshotMessage,
    decode_ranks_record,
    encode,
)

AGE, CAP = "age", "capacity-type"


async def test_one_process_answers_every_snapshot_for_each_of_its_strategies_in_their_own_groups(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    bus_settings = fresh_kafka_settings(kafka_bootstrap, "together")
    # The chart's core with rankers.together: one Deployment runs both strategies' rankers.
    values = {
        "mode": "core",
        "kafka": {"bootstrapServers": kafka_bootstrap},
        "rankers": {"together": True},
        "policy": {"strategies": [{"name": AGE, "tier": 0, "weight": 1},
                                  {"name": CAP, "tier": 0, "weight": 1}]},
    }  # fmt: skip
    specs = {spec.name: spec for spec in chart_specs(require_helm(), values)}
    assert set(specs) == {"aggregator", "rankers"}
    spec = specs["rankers"]
    assert spec.args == ("ranker", "--strategy", AGE, "--strategy", CAP)
    env = {
        "PODCOST_TOPIC_WORKLOADS": bus_settings.topic_workloads,
        "PODCOST_TOPIC_RANKS": bus_settings.topic_ranks,
        "PODCOST_TOPIC_COSTS": bus_settings.topic_costs,
        "PODCOST_TOPIC_DEADLETTER": bus_settings.topic_deadletter,
        "PODCOST_KAFKA_PARTITIONS": "2",
        "PODCOST_RANKER_GROUP": f"{bus_settings.topic_workloads}-rankers",
    }
    items = [snapshot(f"web-{index}", pods=4, seed=index) for index in range(3)]
    bus = open_bus(bus_settings)
    await bus.start()
    try:
        async with processes([spec], env=env, log_dir=tmp_path) as running:
            rankers = running["rankers"]
            for item in items:
                encoded = encode(WorkloadSnapshotMessage.of(item, emitted_at=time.time()))
                await (await bus.send(bus_settings.topic_workloads, encoded.key, encoded.value,
                                      encoded.headers))  # fmt: skip
            answered: dict[str, set[str]] = {AGE: set(), CAP: set()}
            async with bus.consumer([bus_settings.topic_ranks], group="together-check") as reader:
                deadline = time.monotonic() + 60
                while any(len(keys) < len(items) for keys in answered.values()):
                    assert time.monotonic() < deadline, f"answers so far: {answered}"
                    for record in await reader.poll(max_wait=1.0):
                        message = decode_ranks_record(record.value, record.headers)
                        assert isinstance(message, StrategyRanksBatchMessage)
                        answered[message.strategy].update(a.key for a in message.answers)
            keys = {item.workload.key for item in items}
            assert answered == {AGE: keys, CAP: keys}
            metrics = await rankers.metrics()
            # Each strategy consumed every snapshot once, as its own component.
            for name in (AGE, CAP):
                consumed = sample(
                    metrics, "podcost_messages_consumed_total",
                    component=f"ranker-{name}", topic=bus_settings.topic_workloads,
                )  # fmt: skip
                assert consumed == len(items)
            groups = await asyncio.wait_for(committed_groups(kafka_bootstrap), 30)
            prefix = f"{bus_settings.topic_workloads}-rankers"
            assert {f"{prefix}-{AGE}", f"{prefix}-{CAP}"} <= groups
    finally:
        await bus.stop()


async def committed_groups(bootstrap: str) -> set[str]:
    """The consumer groups the broker knows."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {group for group, _ in await admin.list_consumer_groups()}
    finally:
        await admin.close()


async def test_two_processes_of_rankers_together_read_the_same_partitions_in_every_group(
    kafka_bootstrap: str,
) -> None:
    # Two replicas of the rankers' Deployment, each a bus with the process's own client id and
    # a consumer per strategy's group: every group must give each process the same partitions,
    # or its strategies would each decode records the others never read.
    base = fresh_kafka_settings(kafka_bootstrap, "aligned").model_copy(update={"partitions": 6})
    groups = [f"{base.topic_workloads}-rankers-{name}" for name in ("a", "b", "c", "d")]
    async with contextlib.AsyncExitStack() as stack:
        buses = []
        for _ in range(2):
            bus = open_bus(together_bus_settings(base))
            await stack.enter_async_context(bus)
            buses.append(bus)
        await buses[0].ensure_topics([base.topic_workloads])
        consumers = [
            [
                await stack.enter_async_context(bus.consumer([base.topic_workloads], group=group))
                for group in groups
            ]
            for bus in buses
        ]

        def settled() -> bool:
            # Each group's two members hold three partitions each (the group has rebalanced).
            return all(len(c.assignment()) == 3 for process in consumers for c in process)

        await eventually(settled, "both processes' consumers hold three partitions each", 60)
        for process in consumers:
            assert len({c.assignment() for c in process}) == 1, [
                sorted(tp.partition for tp in c.assignment()) for c in process
            ]
