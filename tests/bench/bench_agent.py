"""A bench agent process: the REAL watcher and/or annotator services, bootstrapped as
``podcost watcher`` / ``podcost annotator`` bootstrap them (settings from the environment), fed
a synthetic watch stream instead of the API server's watch lines.

``python -m tests.bench.bench_agent --role watcher|annotator|agent [--clusters a,b] [--stream
FIFO]``, started by ``bench_pipeline`` (mode "Kafka, one process per service": one watcher
process and one annotator process), ``bench_fleet`` and ``bench_soak`` (role ``agent``: one
process hosting, per cluster of ``--clusters``, a watcher and an annotator with that
cluster's settings: its own costs topic, consumer group and Kafka clients, as separate agents
would have; 100 agent processes would not fit two cores).

- The watcher runs for real: its informer lists and watches the API server (``$KUBECONFIG``;
  ``PODCOST_WATCHER_NAMESPACE`` names an empty namespace), and each line read from ``--stream``
  (a FIFO written by a churn process: ``bench_pipeline.churn_main``, or ``bench_fleet``'s or
  ``bench_soak``'s multi-cluster churn whose lines start with the cluster's index) goes through
  ``decode_event``, ``apply_event`` (the object projected as the informer keeps it, then
  ``Store.apply``) and the watcher's informer handler, exactly as a line from the API server.
- The annotator runs dry-run (``PODCOST_DRY_RUN=true``). Its pod reads are answered from a
  store of the synthetic cluster instead of the API server, since no real API server here serves
  5,000 synthetic pod events/s: role ``annotator`` (alone in its process, as the chart's agent
  mode runs it) keeps its own view, fed from ``--stream`` (the churn's metadata-only lines of the
  same events: ``bench_pipeline.Churn.view_copy``) the way its informer keeps it from its
  metadata-only watches of pods, ReplicaSets and Deployments (``apply_event``, then the view's
  handler; the other kinds are not watched), and reads the pods from that view (``CachedPods``;
  the annotator reads only their metadata), so every decision is verified against the
  workloads and goes through the whole plan path. Role ``agent`` reads the pods from its own
  cluster's watcher cache, which is also its view, as ``podcost run`` shares the watcher's
  (``SharedView``) and ``bench_pipeline``'s in-process modes do; the view observes the
  watcher's changes as an observer of the watcher, as there (it remembers the pods deleted,
  and the annotator forgets what it kept of pods and workloads gone).

Besides the services' own metrics, the process's ``/metrics`` (``PODCOST_HTTP_PORT``) has what
the bench needs to see from outside, per cluster (``podcost_bench_*{cluster}``): events taken in
from the stream (``events_fed``: the bench compares it with the offer), workloads waiting in the
debouncer, and key + value + headers of every record the annotator's consumer returned
(``annotator_read_bytes``); and ``podcost_bench_fleet_objects`` once the initial fleet is in. A
process hosting several clusters' services also repeats, per cluster, the services' own counters
the bench reads (snapshots published, decisions consumed, dry-run writes, write queue), since
the services' samples would carry the same labels in one ``/metrics``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, cast

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from tests.bench.bench_pipeline import FLEET_END, VIEWED, WATCHED, CachedPods, consumed

from podcost.annotator import AnnotatorService, AnnotatorSettings
from podcost.annotator import bootstrap as bootstrap_annotator
from podcost.annotator.plan import Scope
from podcost.annotator.view import ClusterView
from podcost.runtime.heap import heap_dumps_on_signal
from podcost.runtime.metrics import Metrics
from podcost.runtime.runner import Service, serve
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherService, WatcherSettings
from podcost.watcher.service import bootstrap as bootstrap_watcher
from podcost_bus import Bus, BusSettings, Consumer, Record, open_bus
from podcost_core.projection import SharedParts
from podcost_kube.client import Kube, connect
from podcost_kube.informer import apply_event, decode_event
from podcost_kube.store import Change, Store

READ_CHUNK = 1 << 22


# --- bytes an annotator reads ---------------------------------------------------------------


@dataclass
class ReadBytes:
    total: int = 0


class CountingConsumer:
    """The real consumer, counting the bytes of the records it returns."""

    def __init__(self, inner: Consumer, count: ReadBytes) -> None:
        self._inner = inner
        self._count = count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:  # fmt: skip
        await self._inner.__aexit__(exc_type, exc, traceback)

    async def poll(
        self, *, max_wait: float | None = None, max_records: int | None = None
    ) -> list[Record]:
        records = await self._inner.poll(max_wait=max_wait, max_records=max_records)
        self._count.total += sum(
            len(r.key or b"") + len(r.value) + sum(len(k) + len(v) for k, v in r.headers.items())
            for r in records
        )
        return records


class CountingBus:
    """The real bus, whose consumers count what they read."""

    def __init__(self, inner: Bus, count: ReadBytes) -> None:
        self._inner = inner
        self.count = count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:  # fmt: skip
        await self._inner.__aexit__(exc_type, exc, traceback)

    def consumer(self, topics: Sequence[str], **options: Any) -> Consumer:
        return CountingConsumer(self._inner.consumer(topics, **options), self.count)  # type: ignore[return-value]


# --- one cluster's agent --------------------------------------------------------------------


@dataclass
class Agent:
    cluster: str
    watcher: WatcherService | None = None
    annotator: AnnotatorService | None = None
    read: ReadBytes = field(default_factory=ReadBytes)
    fed: int = 0
    view: ClusterView | None = None
    """The annotator's own view, fed from the stream (an annotator without a watcher)."""
    shared: SharedParts = field(default_factory=SharedParts)
    """The parts the objects it keeps share, as its informer's (``apply_event``)."""


class Feed:
    """Reads the stream and hands each line to its cluster's watcher; a service of the
    process (``serve`` runs it) so that a failure ends the process."""

    name = "bench-feed"

    def __init__(self, agents: Sequence[Agent], stream: str | None, *, multi: bool) -> None:
        self.agents = agents
        self.stream = stream
        self.multi = multi
        self.fleet_objects = 0
        self.metrics = cast(Metrics, FeedMetrics())  # all the runner reads is the registry
        self.metrics.registry.register(FeedCollector(self))

    def ready(self) -> bool:
        return True

    def deliver(self, agent: Agent, kind: str, line: bytes) -> None:
        # As bench_pipeline.WatchStream.deliver: what the informer does with a watch line.
        # The watcher's informer, or else the annotator's own view's (which watches fewer kinds).
        # Every handler the informer would call: the watcher's own, then its observers (role
        # agent: the annotator's view over the watcher's cache, as ``podcost run`` shares it).
        handlers: Sequence[Callable[[Change], None]]
        if agent.watcher is not None:
            store, resource = agent.watcher.store, WATCHED[kind]
            handlers = (agent.watcher._on_change, *agent.watcher.observers)
        elif agent.view is not None and kind in VIEWED:
            store, handlers, resource = agent.view.store, (agent.view.observe,), VIEWED[kind]
        else:
            return
        event = decode_event(line, f"{kind}: watch", resource)
        change = apply_event(store, resource, event, agent.shared)
        if change is not None:
            for handle in handlers:
                handle(change)

    def split(self, line: bytes) -> tuple[Agent, str, bytes]:
        if self.multi:
            index, _, line = line.partition(b" ")
            agent = self.agents[int(index)]
        else:
            agent = self.agents[0]
        kind, _, event = line.partition(b" ")
        return agent, kind.decode(), event

    async def run(self) -> None:
        if self.stream is None:
            await asyncio.Event().wait()
            return
        # Synced first (the informer's initial list in the cache); the watcher has no event.
        while not all(a.watcher is None or a.watcher.ready() for a in self.agents):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        lines = asyncio.StreamReader(limit=READ_CHUNK)
        # The churn process holds the write end already: opening the read end does not wait.
        pipe = os.fdopen(os.open(self.stream, os.O_RDONLY), "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(lines), pipe
        )
        try:
            count = 0
            while (line := await lines.readline()) != FLEET_END:
                if not line:
                    raise RuntimeError("the churn process ended before sending the fleet")
                self.deliver(*self.split(line))
                count += 1
            self.fleet_objects = count
            fed = 0
            while line := await lines.readline():
                agent, kind, event = self.split(line)
                self.deliver(agent, kind, event)
                agent.fed += 1
                fed += 1
                if fed % 50 == 0:
                    await asyncio.sleep(0)  # readline does not yield while lines are buffered
        finally:
            transport.close()


class FeedMetrics:
    """The feed's own registry only (a ``Metrics`` would add its own zero-valued samples of
    the services' names to ``/metrics``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.get_sample_value(name, labels) or 0.0


#: Per cluster: (name, help, value of the agent or None when it has not that service).
PER_CLUSTER: tuple[tuple[str, str, Callable[[Agent], float | None]], ...] = (
    ("podcost_bench_events_fed", "Events taken in from the stream.",
     lambda a: a.fed if a.watcher else None),
    ("podcost_bench_debouncer_pending", "Workloads waiting in the watcher's debouncer.",
     lambda a: a.watcher.debouncer.pending if a.watcher else None),
    ("podcost_bench_snapshots", "Snapshots the watcher published.",
     lambda a: _value(a.watcher.metrics, "podcost_messages_produced_total",
                      topic=a.watcher.topics.workloads) if a.watcher else None),
    ("podcost_bench_annotator_read_bytes", "Key + value + headers of the records the annotator "
     "read.", lambda a: a.read.total if a.annotator else None),
    ("podcost_bench_annotator_consumed", "Records of its costs topic the annotator consumed.",
     lambda a: consumed(a.annotator.metrics, a.annotator.topic) if a.annotator else None),
    ("podcost_bench_annotator_dry_runs", "Writes the annotator decided and did not make.",
     lambda a: _value(a.annotator.metrics, "podcost_patches_total", result="dry_run")
     if a.annotator else None),
    ("podcost_bench_annotator_queue", "Pod writes pending in the annotator.",
     lambda a: _value(a.annotator.metrics, "podcost_queue_depth") if a.annotator else None),
)  # fmt: skip


class FeedCollector(Collector):
    def __init__(self, feed: Feed) -> None:
        self.feed = feed

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, text, value in PER_CLUSTER:
            family = GaugeMetricFamily(name, text, labels=["cluster"])
            for agent in self.feed.agents:
                got = value(agent)
                if got is not None:
                    family.add_metric([agent.cluster], got)
            yield family
        yield GaugeMetricFamily(
            "podcost_bench_fleet_objects",
            "Objects of the initial fleet taken in (0 until then).",
            value=self.feed.fleet_objects,
        )


async def run(args: argparse.Namespace) -> None:
    settings = ServiceSettings()
    bus_settings = BusSettings()
    clusters = args.clusters.split(",") if args.clusters else [settings.cluster]
    watches = args.role in ("watcher", "agent")
    annotates = args.role in ("annotator", "agent")
    async with contextlib.AsyncExitStack() as stack:
        kube: Kube | None = None
        if watches:
            kube = await stack.enter_async_context(connect())
        agents: list[Agent] = []
        buses: list[Any] = []
        services: list[Service] = []
        for cluster in clusters:
            own = ServiceSettings(cluster=cluster)
            agent = Agent(cluster)
            if watches:
                assert kube is not None
                agent.watcher = bootstrap_watcher(own, bus_settings, WatcherSettings(), kube=kube)
                buses.append(agent.watcher.bus)
                services.append(agent.watcher)
            if annotates:
                # What the annotator verifies decisions against and reads pods from: its
                # cluster's watcher cache, or alone in its process a view of its own, fed from
                # the stream (see the module docstring).
                store = agent.watcher.store if agent.watcher is not None else Store()
                view = ClusterView(Scope(), store=store)
                if agent.watcher is None:
                    if args.stream is None:
                        raise SystemExit("an annotator alone needs --stream for its view")
                    agent.view = view
                else:
                    agent.watcher.observers.append(view.observe)
                pods = CachedPods(store)
                bus = CountingBus(open_bus(bus_settings), agent.read)
                agent.annotator = bootstrap_annotator(
                    own,
                    bus_settings,
                    AnnotatorSettings(),
                    bus=bus,
                    kube=pods,  # type: ignore[arg-type]
                    view=view,
                )
                buses.append(bus)
                services.append(agent.annotator)
            agents.append(agent)
        services.append(Feed(agents, args.stream, multi=args.role == "agent"))
        for bus in buses:
            await stack.enter_async_context(bus)
        await serve(services, settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("watcher", "annotator", "agent"), required=True)
    parser.add_argument("--clusters", default=None, help="default: PODCOST_CLUSTER")
    parser.add_argument("--stream", default=None, help="the churn FIFO")
    args = parser.parse_args()
    os.environ.setdefault("PODCOST_DRY_RUN", "true")
    heap_dumps_on_signal()  # PODCOST_HEAP_DUMP, as every podcost command
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
