"""Several strategies' rankers in one process (``podcost ranker --strategy A --strategy B``, the
chart's ``rankers.together``): each answers every snapshot in its own consumer group, as
separate processes would, over the real broker, and their answers to the same snapshots travel
together in ``ranks-batch`` records, from which the chart's aggregator decides what the pure core
decides; the processes are real ``podcost`` processes with the container's arguments and
environment as the chart renders them (``tests.support.services``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from tests.support.pipeline import eventually, expected_costs, fresh_kafka_settings
from tests.support.services import chart_specs, processes, sample
from tests.support.snapshots import snapshot
from tests.support.tools import require_helm

from podcost.ranker import together_bus_settings
from podcost_bus import open_bus
from podcost_contracts.messages import (
    DesiredCostsMessage,
    RanksBatchMessage,
    StrategyRanksBatchMessage,
    WorkloadSnapshotMessage,
    decode,
    decode_ranks_record,
    encode,
)
from podcost_core.policy import policy_from_text

AGE, CAP = "age", "capacity-type"


async def test_one_process_answers_every_snapshot_for_each_of_its_strategies_in_their_own_groups(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # ... in records of both strategies' answers, from which the aggregator decides as the core.
    bus_settings = fresh_kafka_settings(kafka_bootstrap, "together")
    strategies = [{"name": AGE, "tier": 0, "weight": 1}, {"name": CAP, "tier": 0, "weight": 1}]
    # The chart's core with rankers.together: one Deployment runs both strategies' rankers.
    values = {
        "mode": "core",
        "kafka": {"bootstrapServers": kafka_bootstrap},
        "rankers": {"together": True, "combineAnswers": True},
        "policy": {"strategies": strategies},
    }  # fmt: skip
    specs = {spec.name: spec for spec in chart_specs(require_helm(), values)}
    assert set(specs) == {"aggregator", "rankers"}
    spec = specs["rankers"]
    assert spec.args == ("ranker", "--strategy", AGE, "--strategy", CAP)
    assert spec.env["PODCOST_RANKER_COMBINE_STRATEGIES"] == "true"
    [(path, text)] = spec.files.items()
    assert path == spec.env["PODCOST_POLICY_FILE"]
    policy = policy_from_text(text, fmt="json")  # what the aggregator decides with
    env = {
        "PODCOST_TOPIC_WORKLOADS": bus_settings.topic_workloads,
        "PODCOST_TOPIC_RANKS": bus_settings.topic_ranks,
        "PODCOST_TOPIC_COSTS": bus_settings.topic_costs,
        "PODCOST_TOPIC_DEADLETTER": bus_settings.topic_deadletter,
        "PODCOST_KAFKA_PARTITIONS": "2",
        "PODCOST_RANKER_GROUP": f"{bus_settings.topic_workloads}-rankers",
        "PODCOST_AGGREGATOR_APP_ID": f"{bus_settings.topic_workloads}-aggregator",
        # Both strategies' answers to a snapshot wait for each other however loaded the
        # machine is (they go out as soon as both are there).
        "PODCOST_RANKER_LINGER_MS": "3000",
    }
    items = [snapshot(f"web-{index}", pods=4, seed=index) for index in range(3)]
    bus = open_bus(bus_settings)
    await bus.start()
    costs_topic = bus_settings.topics.costs_for(items[0].workload.cluster)
    await bus.ensure_topics([*bus_settings.topics.shared(), costs_topic])  # read from the start
    try:
        async with processes([spec, specs["aggregator"]], env=env, log_dir=tmp_path) as running:
            rankers = running["rankers"]
            for item in items:
                encoded = encode(WorkloadSnapshotMessage.of(item, emitted_at=time.time()))
                await (await bus.send(bus_settings.topic_workloads, encoded.key, encoded.value,
                                      encoded.headers))  # fmt: skip
            answered: dict[str, set[str]] = {AGE: set(), CAP: set()}
            kinds: set[str] = set()
            decided: dict[str, DesiredCostsMessage] = {}
            topics = [bus_settings.topic_ranks, costs_topic]
            async with bus.consumer(topics, group="together-check") as reader:
                deadline = time.monotonic() + 60
                while len(decided) < len(items) or any(
                    len(keys) < len(items) for keys in answered.values()
                ):
                    assert time.monotonic() < deadline, f"answers so far: {answered}, {decided}"
                    for record in await reader.poll(max_wait=1.0):
                        if record.topic != bus_settings.topic_ranks:
                            costs = decode(DesiredCostsMessage, record.value, record.headers)
                            decided[costs.key] = costs
                            continue
                        message = decode_ranks_record(record.value, record.headers)
                        kinds.add(type(message).KIND)
                        assert isinstance(message, RanksBatchMessage | StrategyRanksBatchMessage)
                        for answer in message.messages():
                            answered[answer.strategy].add(answer.key)
            keys = {item.workload.key for item in items}
            assert answered == {AGE: keys, CAP: keys}
            # Both strategies' answers to the snapshots they read share records.
            assert RanksBatchMessage.KIND in kinds, kinds
            for item in items:
                decision = decided[item.workload.key]
                assert decision.complete
                assert {pod.uid: pod.cost for pod in decision.costs} == expected_costs(item, policy)
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
