"""A real broker outage in the middle of a run loses no decision: the Kafka broker is stopped by
its pid while an opted-in Deployment scales and its pods change readiness, and started again
(same ports, node id and log dirs: KRaft recovers from its own storage) after 15 s (30 s under
``-m long``). Every service rides it out in place: the test is their supervisor and would restart
one that exited, and asserts none had to be. The consumer groups' lag then drains to zero, and
the costs on the pods order them exactly as an undisturbed twin run orders its own.

The twin is a real run, not podcost's model: the same services in embedded mode (in-memory bus,
so the outage cannot touch it) watch a twin namespace with a twin set of nodes, and the test
drives both namespaces through the identical sequence of changes at the same moments. Each node
holds one pod (required anti-affinity) and has its own hourly price, and the workloads rank by
``capacity-type`` alone (the most expensive node's pod goes first): a pod is known across the
two runs by its node's index. At the end both Deployments fill all their nodes, so both runs
end with the same pods in the same places, and the cost order over the node indices must be
the same. The numeric values may differ: podcost keeps the costs already written (fewest
writes), so the numbers depend on what each run wrote on the way; only the order reaches the
ReplicaSet controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from kubernetes_asyncio import config
from tests.conftest import Broker, ControlPlane, unavailable
from tests.support.broker import consumer_lag
from tests.support.kube import KubeTestCluster
from tests.support.pipeline import fresh_kafka_settings

from podcost.embedded import Pipeline, bootstrap
from podcost.runtime.runner import Service
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings, MemoryBus
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_kube.client import Kube
from podcost_localinfra import kafka

pytestmark = pytest.mark.e2e

NODES = 8
STRATEGY = "capacity-type"
PRICE = "podcost.dev/hourly-price"


@dataclass
class Run:
    """One of the two runs: its namespace, nodes (by index) and pipeline tasks."""

    namespace: str
    pipeline: Pipeline
    build: Callable[[], Pipeline]
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    restarts: list[str] = field(default_factory=list)

    def node(self, index: int) -> str:
        return f"{self.namespace}-n{index}"

    def start(self, service: Service) -> None:
        self.tasks[service.name] = asyncio.create_task(service.run(), name=service.name)

    def supervise(self) -> None:
        """Restart, as a supervisor would, a service that exited (and record it); a service that
        failed with an error that is not the outage's fails the test."""
        for name, task in list(self.tasks.items()):
            if not task.done():
                continue
            error = task.exception()
            self.restarts.append(f"{name}: {error!r}")
            fresh = next(s for s in self.build().services if s.name == name)
            self.start(fresh)


async def _node_costs(kube: KubeTestCluster, run: Run) -> dict[int, int | None]:
    """Node index → the deletion cost of the (one, active) pod on it."""
    costs: dict[int, int | None] = {}
    for pod in await kube.active_pods(run.namespace, "web"):
        if pod.node is None:
            continue
        raw = (pod.raw.metadata.annotations or {}).get(DELETION_COST_ANNOTATION)
        costs[int(pod.node.rsplit("-n", 1)[1])] = None if raw is None else int(raw)
    return costs


def _order(costs: dict[int, int | None]) -> list[int]:
    """The node indices from first deleted to last (by cost; a missing cost counts as 0)."""
    return sorted(costs, key=lambda index: (costs[index] or 0, index))


@pytest.mark.parametrize(
    "outage_s",
    [
        pytest.param(15.0, id="15s"),
        pytest.param(30.0, id="30s", marks=[pytest.mark.long, pytest.mark.timeout(600)]),
    ],
)
async def test_a_broker_outage_mid_run_ends_in_the_costs_of_an_undisturbed_twin(
    outage_s: float,
    kafka_broker: Broker,
    control_plane: ControlPlane,
    kube: KubeTestCluster,
) -> None:
    if kafka_broker.run_dir is None:
        unavailable("the broker is not podcost_localinfra's: it cannot be stopped")
    run_id = uuid.uuid4().hex[:6]
    cluster = f"bo-{run_id}"
    bus_settings = fresh_kafka_settings(kafka_broker.bootstrap, "brokerout")
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    runs: list[Run] = []
    async with api:
        client = Kube(api)

        def pipeline_for(namespace: str, kafka_bus: bool) -> Callable[[], Pipeline]:
            memory = None if kafka_bus else MemoryBus()

            def build() -> Pipeline:
                return bootstrap(
                    ServiceSettings(cluster=cluster, http_port=0),
                    bus_settings if kafka_bus else BusSettings(),
                    kube=client,
                    bus=memory if memory is not None else (runs[0].pipeline.bus if runs else None),
                    watcher_settings=WatcherSettings(namespace=namespace, debounce_seconds=0.2),
                    strategies=[STRATEGY],
                )

            return build

        for name, over_kafka in ((f"bo-{run_id}", True), (f"twin-{run_id}", False)):
            namespace = await kube.create_namespace(name)
            build = pipeline_for(namespace, over_kafka)
            runs.append(Run(namespace, build(), build))
        outage, twin = runs
        try:
            for run in runs:
                for index in range(NODES):
                    await kube.create_node(run.node(index), zone="zone-a",
                                           labels={"broker-outage": run.namespace})  # fmt: skip
                    await kube.core.patch_node(
                        run.node(index), {"metadata": {"annotations": {PRICE: str(index + 1)}}}
                    )
                await run.pipeline.bus.start()
                for service in run.pipeline.services:
                    run.start(service)

            async def both(change: Callable[[Run], Awaitable[object]]) -> None:
                await asyncio.gather(*(change(run) for run in runs))

            def supervise() -> None:
                for run in runs:
                    run.supervise()

            async def create(run: Run) -> None:
                await kube.create_deployment(
                    run.namespace, "web", 4, opt_in=True, one_per_node=True,
                    node_selector={"broker-outage": run.namespace},
                    annotations={"podcost.dev/strategies": f"{STRATEGY}=1"},
                )  # fmt: skip

            await both(create)

            async def all_costed(count: int) -> bool:
                supervise()
                for run in runs:
                    costs = await _node_costs(kube, run)
                    # A first costing leaves the last pod to go at the 0 a missing annotation
                    # reads as (every node has its own price: one pod per group).
                    if len(costs) != count or sum(cost is None for cost in costs.values()) > 1:
                        return False
                return True

            await kube.wait_for(lambda: all_costed(4), "the first costs in both runs", 90)

            stopped_at = time.monotonic()
            await asyncio.to_thread(kafka.stop_broker, kafka_broker.run_dir)
            stop_s = time.monotonic() - stopped_at
            try:
                # While the broker is away: scale up, two pods turn not ready, scale in (the
                # controller takes the unready pods first), and up again to every node.
                await both(lambda run: kube.scale(run.namespace, "web", NODES))
                await both(lambda run: kube.wait_ready(run.namespace, "web", NODES))
                for index in (1, 5):

                    async def unready(run: Run, index: int = index) -> None:
                        [pod] = [p for p in await kube.active_pods(run.namespace, "web")
                                 if p.node == run.node(index)]  # fmt: skip
                        condition = {"type": "Ready", "status": "False"}
                        await kube.patch_pod_status(run.namespace, pod.name,
                                                    {"conditions": [condition]})  # fmt: skip

                    await both(unready)
                await both(lambda run: kube.scale_and_observe(run.namespace, "web", 5))
                await both(lambda run: kube.scale(run.namespace, "web", NODES))
                await both(lambda run: kube.wait_ready(run.namespace, "web", NODES))
                supervise()
                changes_done = time.monotonic() - stopped_at
                await asyncio.sleep(max(0.0, outage_s - (time.monotonic() - stopped_at)))
                supervise()
            finally:
                start_s = await asyncio.to_thread(kafka.start_broker, kafka_broker.run_dir)
            back_at = time.monotonic()

            await kube.wait_for(lambda: all_costed(NODES), "every pod's cost in both runs", 120)

            topics = {bus_settings.topic_workloads, bus_settings.topic_ranks,
                      bus_settings.topics.costs_for(cluster)}  # fmt: skip

            async def settled() -> bool:
                supervise()
                if await consumer_lag(kafka_broker.bootstrap, topics) != 0:
                    return False
                orders = [_order(await _node_costs(kube, run)) for run in runs]
                return orders[0] == orders[1]

            await kube.wait_for(settled, "lag drained and the twin's order", 120, interval=1)
            drained_after = time.monotonic() - back_at
            final = {run.namespace: await _node_costs(kube, run) for run in runs}
            # The twin is not vacuous: it ranks the most expensive node's pod first.
            assert _order(final[twin.namespace]) == list(reversed(range(NODES)))
            assert _order(final[outage.namespace]) == _order(final[twin.namespace])
            assert twin.restarts == []
            assert outage.restarts == [], f"services exited and were restarted: {outage.restarts}"
            same_values = final[outage.namespace] == final[twin.namespace]
            print(
                f"\nbroker away {back_at - stopped_at:.1f}s (stopping took {stop_s:.1f}s, "
                f"starting {start_s:.1f}s; changes made in the first {changes_done:.1f}s); "
                f"lag drained and the twin's order reached "
                f"{drained_after:.1f}s after it was back; numeric costs "
                f"{'equal' if same_values else 'differ'}: {final}"
            )
        finally:
            for run in runs:
                for task in run.tasks.values():
                    task.cancel()
                await asyncio.gather(*run.tasks.values(), return_exceptions=True)
                with contextlib.suppress(Exception):
                    await run.pipeline.bus.stop()
                await kube.delete_namespace(run.namespace)
                await kube.delete_nodes([run.node(index) for index in range(NODES)])
