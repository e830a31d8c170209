"""Fleet benchmark: N simulated clusters, each with its own agent (watcher + annotator), and ONE
core (a ranker per strategy and the aggregator), over the real Kafka broker; for N = 1, 5, 20,
50 by default. How the cost grows with N, and which process saturates first.

A script, not a test (``python -m tests.bench.bench_fleet [--clusters 1,5,20,50]
[--rates 250,500,1000,2000,4000] [--step-seconds 5]``); it prints numbers and asserts nothing. It
starts its own control plane and Kafka broker (``podcost_localinfra``) unless
``PODCOST_USE_KUBECONFIG=1`` with ``KUBECONFIG``, and ``PODCOST_KAFKA``, point at running ones.

Method, for each N (a fresh core and fresh topics each time):

- The core runs as the chart's core mode runs it: ``podcost ranker --strategy S`` per strategy
  and ``podcost aggregator``, each its own OS process, with the arguments and environment
  ``helm template`` renders (``procs.chart_core_specs``).
- Cluster ``c<i>`` has its own synthetic watch stream, made as ``bench_pipeline`` makes it
  (``Churn``: pods from a real kwok pod of this control plane, replaced, flapping, status
  noise), its own watcher (``PODCOST_CLUSTER=c<i>``) fed each line through ``decode_event``,
  ``apply_event`` (projected as its informer keeps it) and its informer handler, and its own
  annotator reading only ``<costs>.c<i>`` in group ``<group>.c<i>``, dry-run, reading the pods
  from its own watcher's cache. 100 agent processes would not fit two cores, so the agents of
  several clusters share an agent process (``bench_agent --role agent``, at most
  ``--agent-processes`` of them): each hosts, per cluster, a watcher and an annotator service
  instance with that cluster's settings, and its own Kafka clients, consumer groups and topics,
  as separate agents would. One churn process per agent process writes the streams of its
  clusters into a FIFO.
- The offered rate (pod events/s for the whole fleet, split evenly between the clusters) goes
  up in steps of ``--step-seconds``; 20 times a step (every half second for steps of 10 s or
  less; ``--sample-seconds`` says otherwise) the bench reads each process's counters over
  ``/metrics`` (records published and consumed per topic, events taken in per cluster). Each
  read costs the fleet CPU (every process renders its ``/metrics``, the bench parses them all):
  at N = 20, sampling every half second took about a tenth of the machine, from the processes it
  measures, so long steps sample less often.
  A rate is sustained when the lags stay bounded (``bench_pipeline.judge``: neither the
  watchers' backlog behind the offer nor any consumer's lag climbs, and all is drained within
  two seconds once the offer stops). The steps stop at the first rate not sustained.
- Per step: pod events/s taken in (total and per cluster), decisions/s (records the aggregator
  published to the costs topics), bytes each annotator reads per second (key + value + headers
  of the records its consumer returned; values as published, before the broker's batch
  compression), and each process's CPU (``/proc/<pid>/stat`` utime + stime over the step, as
  a share of one core) and resident memory. Each cluster's annotator has its own lag: the
  decisions the aggregator published to that cluster's costs topic minus those the annotator
  consumed, whatever their outcome.
- The watchers' backlog is what the churn processes were asked for (each its own share of the
  rate, in whole events) minus the events the agents took in.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kubernetes_asyncio import config
from tests.bench import procs
from tests.bench.bench_aggregator import workloads as floor_workloads
from tests.bench.bench_pipeline import (
    FLEET_END,
    REPO,
    SAMPLE_EVERY_S,
    ZONES,
    Churn,
    RemoteOffer,
    Sample,
    Step,
    Templates,
    churn_output,
    holds_within_async,
    judge,
    read_templates,
    serve_offer,
)
from tests.bench.floors import CoreFloors, core_floors, ratio
from tests.bench.record import record
from tests.support.kube import KubeTestCluster
from tests.support.services import ServiceProcess, metric_key, processes

from podcost_bus import BusSettings
from podcost_contracts.topics import Topics
from podcost_localinfra import build, cluster, kafka

#: How many times a step reads the fleet's counters, unless that is more often than every
#: ``SAMPLE_EVERY_S`` (see the module docstring): enough for ``judge`` to tell a climb.
SAMPLES_PER_STEP = 20

# --- the fleet as processes --------------------------------------------------------------------


@dataclass
class Host:
    """One agent process and the churn process that feeds it."""

    name: str
    clusters: list[str]
    churn: asyncio.subprocess.Process
    offer: RemoteOffer


@dataclass
class Fleet:
    """N clusters' agents and one core, as OS processes, watched over their ``/metrics``."""

    clusters: list[str]
    hosts: list[Host]
    running: Mapping[str, ServiceProcess]
    strategies: Mapping[str, int]
    """Per ranker process, how many strategies it runs (one, or all of them together)."""
    topics: Topics
    last: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each process's counters as last read."""

    @property
    def rankers(self) -> list[str]:
        return list(self.strategies)

    @property
    def aggregators(self) -> list[str]:
        return [name for name in self.running if deployment(name) == "aggregator"]

    def set_rate(self, rate: float) -> None:
        """Offer ``rate`` events/s to the fleet, the same share to every cluster."""
        for host in self.hosts:
            host.offer.set_rate(rate * len(host.clusters) / len(self.clusters))

    def offered(self) -> int:
        """Events the churn processes were asked for so far: the sum of the hosts' offers, each
        whole events of its own share (not the whole rate's due, which rounds the sum of the
        shares up by as many as one event per host more than the churns ever send)."""
        return sum(host.offer.offered() for host in self.hosts)

    async def probe(self) -> tuple[Sample, float, dict[str, float]]:
        """The fleet now (a ``Sample``: totals, lags per consumer), the workloads waiting in
        the watchers' debouncers, and the bytes each cluster's annotator has read."""
        names = list(self.running)
        got = await asyncio.gather(*(self.metrics(name) for name in names))
        m = dict(zip(names, got, strict=True))
        topics = self.topics
        agents = {host.name: m[host.name] for host in self.hosts}
        ranks = sum(procs.produced(m[r], topics.ranks) for r in self.rankers)
        aggs = [m[a] for a in self.aggregators]
        # Per cluster: the aggregators count their costs by each cluster's own costs topic.
        decided = {
            name: sum(procs.produced(agg, topics.costs_for(name)) for agg in aggs)
            for name in self.clusters
        }
        decisions = sum(decided.values())
        per: dict[str, dict[str, float]] = {}
        for host in self.hosts:
            for name in host.clusters:
                per[name] = {
                    # An exact key: sample() would scan every key of the process's /metrics.
                    what: agents[host.name].get(
                        metric_key(f"podcost_bench_{what}", cluster=name), 0.0
                    )
                    for what in ("events_fed", "debouncer_pending", "snapshots",
                                 "annotator_read_bytes", "annotator_consumed",
                                 "annotator_dry_runs", "annotator_queue")
                }  # fmt: skip

        def total(what: str) -> float:
            return sum(values[what] for values in per.values())

        snapshots = total("snapshots")
        # A Deployment's replicas share its groups' partitions: lag per Deployment.
        lags: dict[str, float] = {}
        for r in self.rankers:
            lags[deployment(r)] = (
                lags.get(deployment(r), self.strategies[r] * snapshots)
                - procs.consumed(m[r], topics.workloads)
            )  # fmt: skip
        lags["aggregator"] = (
            snapshots - sum(procs.consumed(agg, topics.workloads) for agg in aggs)
            + ranks - sum(procs.consumed(agg, topics.ranks) for agg in aggs)
        )  # fmt: skip
        for name, values in per.items():
            lags[f"annotator {name}"] = decided[name] - values["annotator_consumed"]
        sample_ = Sample(
            at=time.monotonic(),
            offered=self.offered(),
            fed=int(total("events_fed")),
            snapshots=snapshots,
            records=snapshots + ranks + decisions,
            decisions=decisions,
            dry_runs=total("annotator_dry_runs"),
            lags=lags,
            queue=total("annotator_queue"),
        )
        read = {name: values["annotator_read_bytes"] for name, values in per.items()}
        return sample_, total("debouncer_pending"), read

    async def metrics(self, name: str) -> dict[str, float]:
        """A process's counters now, or as last read if it does not answer in time (a loaded
        machine: an agent process hosting a dozen clusters may be too busy to answer within the
        harness's timeout; its counters only grow, so the next read catches up)."""
        try:
            got = await self.running[name].metrics()
        except AssertionError:
            if name not in self.last or not self.running[name].alive:
                raise
            return self.last[name]
        self.last[name] = got
        return got

    async def settled(self) -> bool:
        sample, pending, _ = await self.probe()
        return sample.behind == 0 and pending == 0 and sample.lag == 0 and sample.queue == 0


@dataclass
class FleetStep:
    step: Step
    read_per_s: dict[str, float]
    """Bytes each cluster's annotator read per second."""


@dataclass
class FleetResult:
    clusters: int
    hosts: int
    objects: int
    warm_up_s: float
    steps: list[FleetStep]

    @property
    def best(self) -> FleetStep | None:
        bounded = [s for s in self.steps if s.step.bounded]
        return bounded[-1] if bounded else None

    @property
    def first_unbounded(self) -> FleetStep | None:
        return next((s for s in self.steps if not s.step.bounded), None)


async def run_fleet(
    n: int, helpers: KubeTestCluster, templates: Path, kubeconfig: str, brokers: str,
    args: argparse.Namespace,
) -> FleetResult:  # fmt: skip
    namespace = await helpers.create_namespace(f"bench-fleet-{uuid.uuid4().hex[:5]}")
    run = uuid.uuid4().hex[:8]
    names = [f"c{i}" for i in range(n)]
    host_count = min(n, args.agent_processes)
    groups = [names[i::host_count] for i in range(host_count)]
    churns: list[asyncio.subprocess.Process] = []
    steps: list[FleetStep] = []
    with tempfile.TemporaryDirectory(prefix="podcost-bench-fleet-") as tmp:
        work = Path(tmp)
        core = procs.chart_core_specs(
            build.ensure_helm(), brokers, run, shared_rankers=args.rankers != "apart",
            combine_answers=args.rankers == "combined",
            partitions=args.partitions, replicas=args.core_replicas,
        )  # fmt: skip
        specs = list(core)
        hosts: list[Host] = []
        try:
            for index, group in enumerate(groups):
                stream = work / f"stream-{index}"
                os.mkfifo(stream)
                # O_RDWR: opening a FIFO for writing alone would wait for its reader.
                write_end = os.open(stream, os.O_RDWR)
                churn = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "tests.bench.bench_fleet", "--churn-from",
                    str(templates), "--churn-clusters", str(len(group)),
                    "--churn-seed", str(1 + 1000 * index), "--workloads", str(args.workloads),
                    "--pods", str(args.pods), "--namespaces", str(args.namespaces),
                    "--nodes", str(args.nodes),
                    stdin=asyncio.subprocess.PIPE, stdout=write_end, cwd=REPO,
                )  # fmt: skip
                os.close(write_end)
                churns.append(churn)
                name = f"agents-{index}"
                hosts.append(Host(name, group, churn, RemoteOffer(churn)))
                specs.append(procs.agent_spec(
                    name, ["--role", "agent", "--clusters", ",".join(group), "--stream",
                           str(stream)],
                    {"PODCOST_CLUSTER": group[0], "KUBECONFIG": kubeconfig,
                     "PODCOST_WATCHER_NAMESPACE": namespace, "PODCOST_DRY_RUN": "true",
                     # Reads come from the cache, not the API server: no request budget.
                     "PODCOST_ANNOTATOR_QPS": "10000", "PODCOST_ANNOTATOR_BURST": "10000",
                     "PODCOST_ANNOTATOR_GROUP": f"bench-{run}"},
                    core[0],
                ))  # fmt: skip
            logs = work / "logs"
            logs.mkdir()
            started = time.monotonic()
            extra = kafka_env(args.kafka_env)
            async with processes(specs, env=extra, log_dir=logs, ready_timeout=300) as running:
                env = core[0].env
                ranker_specs = {spec.name: procs.strategies_in(spec) for spec in core}
                strategies = {name: k for name, k in ranker_specs.items() if k}
                fleet = Fleet(names, hosts, running, strategies, BusSettings(
                    topic_workloads=env["PODCOST_TOPIC_WORKLOADS"],
                    topic_ranks=env["PODCOST_TOPIC_RANKS"],
                    topic_costs=env["PODCOST_TOPIC_COSTS"],
                    topic_deadletter=env["PODCOST_TOPIC_DEADLETTER"],
                ).topics)  # fmt: skip

                async def fleet_in() -> bool:
                    took = [await running[h.name].sample("podcost_bench_fleet_objects")
                            for h in hosts]  # fmt: skip
                    return all(t > 0 for t in took)

                if not await holds_within_async(fleet_in, 300):
                    raise RuntimeError("the agent processes did not take in their fleets")
                objects = sum([int(await running[h.name].sample("podcost_bench_fleet_objects"))
                               for h in hosts])  # fmt: skip
                if not await holds_within_async(fleet.settled, 300):
                    raise RuntimeError("timed out waiting for the fleet's first decisions")
                warm_up = time.monotonic() - started
                print(f"\nN = {n}: {n} clusters of {args.workloads} Deployments x {args.pods} "
                      f"pods on {args.nodes} nodes ({objects} objects) in {host_count} agent "
                      f"process(es); processes started and first decisions for all in "
                      f"{warm_up:.1f}s")  # fmt: skip
                pids = {name: p.pid for name, p in running.items()}
                pids.update({f"churn-{i}": c.pid for i, c in enumerate(churns)})
                pids["bench (sampling)"] = os.getpid()
                if args.broker_pid:
                    pids["kafka broker"] = args.broker_pid
                for rate in args.rates:
                    got = await fleet_step(fleet, rate, args, procs.CpuWatch(pids))
                    steps.append(got)
                    report(got, n, args.floors, strategies)
                    if not all(p.alive for p in running.values()):
                        raise RuntimeError("a process ended by itself")
                    if not got.step.bounded:
                        break
        finally:
            for churn in churns:
                if churn.returncode is None:
                    churn.kill()
                await churn.wait()
            await helpers.delete_namespace(namespace)
    return FleetResult(n, host_count, objects, warm_up, steps)


async def fleet_step(
    fleet: Fleet, rate: float, args: argparse.Namespace, cpu: procs.CpuWatch
) -> FleetStep:
    """``bench_pipeline.run_step`` over the fleet's processes."""
    fleet.set_rate(rate)
    end = time.monotonic() + args.step_seconds
    first, _, read_before = await fleet.probe()
    cpu.start()
    samples = []
    read = read_before
    every = args.sample_seconds or max(SAMPLE_EVERY_S, args.step_seconds / SAMPLES_PER_STEP)
    while time.monotonic() < end:
        await asyncio.sleep(min(every, max(0.0, end - time.monotonic())))
        sample, _, read = await fleet.probe()
        samples.append(sample)
    step = Step(rate, samples[-1].at - first.at, samples, first)
    step.usage = cpu.stop(step.seconds)
    step.machine = cpu.machine
    fleet.set_rate(0)
    stopped = time.monotonic()
    if await holds_within_async(fleet.settled, args.drain_seconds):
        step.drain_s = time.monotonic() - stopped
    step.bounded = judge(step)
    per_s = {name: (read[name] - read_before.get(name, 0.0)) / step.seconds for name in read}
    return FleetStep(step, per_s)


# --- the report --------------------------------------------------------------------------------


def describe_floors(step: Step, floors: CoreFloors, strategies: Mapping[str, int]) -> str:
    """The core's CPU per event, per snapshot and per decision beside its floors (``floors``):
    the same work in one process without Kafka, per snapshot as the floors are measured (fewer
    decisions are published than snapshots taken in)."""
    assert step.usage is not None
    events = step.events_per_s
    snapshots = step.per_second(lambda s: s.snapshots)
    decisions = step.per_second(lambda s: s.decisions)
    if min(events, snapshots, decisions) <= 0:
        return "      core CPU per event: no figure (no event, snapshot or decision went through)"
    cpu = {name: used for name, (used, _) in step.usage.items()}
    rankers = sum(cpu.get(name, 0.0) for name in strategies)
    aggregator = sum(used for name, used in cpu.items() if deployment(name) == "aggregator")
    core = rankers + aggregator
    floor_per_event = floors.core * snapshots / events
    ranker_floor = sum(floors.rankers.values())
    return (
        f"      core CPU per event {core / events * 1e3:.3f} ms (floor {floor_per_event * 1e3:.3f} "
        f"ms: {ratio(core / events, floor_per_event)}); per snapshot: rankers "
        f"{rankers / snapshots * 1e3:.3f} ms (floor, each decoding and scoring: "
        f"{ranker_floor * 1e3:.3f} ms, {ratio(rankers / snapshots, ranker_floor)}), aggregator "
        f"{aggregator / snapshots * 1e3:.3f} ms (floor: combine + labels "
        f"{floors.aggregator * 1e3:.3f} ms, {ratio(aggregator / snapshots, floors.aggregator)}); "
        f"aggregator per decision published {aggregator / decisions * 1e3:.3f} ms"
    )


def report(
    got: FleetStep,
    n: int,
    floors: CoreFloors | None = None,
    strategies: Mapping[str, int] | None = None,
) -> None:
    strategies = strategies or {}
    step = got.step
    last = step.samples[-1]
    taken = step.events_per_s
    reads = sorted(got.read_per_s.values()) or [0.0]
    print(
        f"  offered {step.rate:>6,.0f} events/s ({step.rate / n:,.0f} per cluster): took in "
        f"{taken:,.0f}/s, {step.per_second(lambda s: s.snapshots):,.0f} snapshots/s, "
        f"{step.per_second(lambda s: s.decisions):,.0f} decisions/s; annotator reads "
        f"{sum(reads) / len(reads):,.0f} B/s each (max {reads[-1]:,.0f}); lag max "
        f"{step.max_lag:.0f}, end {last.lag:.0f} ({last.laggard}); watchers "
        f"{last.behind:,} events behind; "
        + (f"drained in {step.drain_s:.1f}s" if step.drain_s is not None else "not drained")
        + f" -> {'bounded' if step.bounded else 'NOT bounded'}"
    )  # fmt: skip
    assert step.usage is not None
    print(procs.describe_usage(step.usage, indent="      "))
    if floors is not None:
        print(describe_floors(step, floors, strategies))
    if step.machine is not None:
        print(procs.describe_machine(step.machine, indent="      "))


def kafka_env(pairs: Sequence[str]) -> dict[str, str]:
    """``--kafka-env NAME=VALUE`` pairs as an environment for every process (``PODCOST_KAFKA_*``
    only: anything else would change what is measured without saying so)."""
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("PODCOST_KAFKA_"):
            raise SystemExit(f"--kafka-env takes PODCOST_KAFKA_NAME=VALUE, not {pair!r}")
        env[name] = value
    return env


def deployment(process: str) -> str:
    """The chart's Deployment a process is a replica of (``aggregator#2`` → ``aggregator``)."""
    return process.split("#", 1)[0]


def role(process: str) -> str:
    if process.startswith("agents-"):
        return "agents"
    if process.startswith("ranker") or deployment(process) == "aggregator":
        return "core"
    if process.startswith("churn-") or process == "bench (sampling)":
        return "bench"
    return "broker"


def cores_by_role(step: Step) -> dict[str, float]:
    assert step.usage is not None
    out: dict[str, float] = {}
    for name, (cpu, _) in step.usage.items():
        out[role(name)] = out.get(role(name), 0.0) + cpu
    return out


def rss_by_role(step: Step) -> dict[str, float]:
    assert step.usage is not None
    out: dict[str, float] = {}
    for name, (_, rss) in step.usage.items():
        out[role(name)] = out.get(role(name), 0.0) + rss / 2**20
    return out


def laggard(step: Step) -> str:
    """The consumer furthest behind at the step's worst moment ("none" if nothing lagged)."""
    worst = max(step.samples, key=lambda s: s.lag)
    return worst.laggard if worst.lag > 0 else "none"


def busiest(step: Step) -> str:
    """The process that used most CPU (share of one core) in ``step``, bench processes aside."""
    assert step.usage is not None
    name, (cpu, _) = max(
        ((k, v) for k, v in step.usage.items() if role(k) != "bench"), key=lambda kv: kv[1][0]
    )
    return f"{name} {cpu:.0%}"


def table(results: Sequence[FleetResult]) -> None:
    headers = ["N", "agent procs", "sustained events/s", "per cluster", "decisions/s",
               "annotator B/s (mean/max)", "CPU agents/core/broker", "RSS agents/core MiB",
               "first not sustained", "busiest then (CPU)", "laggard then"]  # fmt: skip
    rows = []
    for result in results:
        best = result.best
        if best is None:
            cells = ["none", "-", "-", "-", "-", "-"]
        else:
            step = best.step
            reads = sorted(best.read_per_s.values()) or [0.0]
            cores, rss = cores_by_role(step), rss_by_role(step)
            cells = [
                f"{step.events_per_s:,.0f}",
                f"{step.events_per_s / result.clusters:,.0f}",
                f"{step.per_second(lambda s: s.decisions):,.0f}",
                f"{sum(reads) / len(reads):,.0f} / {reads[-1]:,.0f}",
                f"{cores.get('agents', 0):.2f} / {cores.get('core', 0):.2f} / "
                f"{cores.get('broker', 0):.2f}",
                f"{rss.get('agents', 0):,.0f} / {rss.get('core', 0):,.0f}",
            ]
        limit = result.first_unbounded or (result.steps[-1] if result.steps else None)
        if result.first_unbounded is not None:
            first = f"{result.first_unbounded.step.rate:,.0f}"
        else:
            first = "none offered"
        rows.append([
            str(result.clusters), str(result.hosts), *cells, first,
            busiest(limit.step) if limit else "-",
            laggard(limit.step) if limit else "-",
        ])  # fmt: skip
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    print(f"\n{rule}")
    for index, cells in enumerate([headers, *rows]):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |")
        if index == 0:
            print(rule)
    print(rule)


def record_results(results: Sequence[FleetResult], args: argparse.Namespace) -> None:
    """Each fleet size's headline figures, one row per N in the results table."""
    replicas = args.core_replicas or 1
    core = "one core of processes" if replicas == 1 else (
        f"one core of processes, {replicas} replicas of each Deployment over "
        f"{args.partitions or 'the chart default'} partitions")  # fmt: skip
    for result in results:
        best = result.best
        if best is None:
            figures = [f"no offered rate sustained (lowest offered {args.rates[0]:,.0f} events/s)"]
        else:
            step = best.step
            per_k = 1000 / max(step.events_per_s, 1.0)
            cores = cores_by_role(step)
            highest = "" if result.first_unbounded else ", the highest offered"
            figures = [
                f"{step.rate:,.0f} events/s sustained{highest} ({step.events_per_s:,.0f} taken "
                f"in, {step.per_second(lambda s: s.decisions):,.0f} decisions/s)",
                f"per 1,000 events/s: agents {cores.get('agents', 0) * per_k:.2f}, core "
                f"{cores.get('core', 0) * per_k:.2f}, broker {cores.get('broker', 0) * per_k:.2f} "
                "cores",
            ]
            snapshots = step.per_second(lambda s: s.snapshots)
            floors: CoreFloors | None = getattr(args, "floors", None)
            if floors is not None and step.events_per_s > 0 and snapshots > 0:
                per_event = cores.get("core", 0) / step.events_per_s
                floor = floors.core * snapshots / step.events_per_s
                figures.append(
                    f"core CPU per event {per_event * 1e3:.2f} ms, {ratio(per_event, floor)} its "
                    "floor (the same decisions in one process without Kafka)"
                )
            if result.first_unbounded is not None:
                figures.append(f"{result.first_unbounded.step.rate:,.0f} events/s not sustained")
        record(
            "bench_fleet",
            f"{result.clusters} simulated cluster{'s' * (result.clusters > 1)}, each with its own "
            f"agent, over {core} ({args.workloads} Deployments x {args.pods} pods each)",
            figures,
            variant=f"n{result.clusters}" + (f"-replicas{replicas}" if replicas > 1 else ""),
        )


def growth(results: Sequence[FleetResult]) -> None:
    """How the cost grows with N, and what saturates first, in words."""
    measured = [r for r in results if r.best is not None]
    print("\nCost per 1,000 sustained events/s (cores, at the best sustained rate), and memory:")
    for result in measured:
        assert result.best is not None
        step = result.best.step
        per_k = 1000 / max(step.events_per_s, 1.0)
        cores, rss = cores_by_role(step), rss_by_role(step)
        reads = list(result.best.read_per_s.values()) or [0.0]
        print(
            f"  N = {result.clusters:>2}: agents {cores.get('agents', 0) * per_k:.2f}, core "
            f"{cores.get('core', 0) * per_k:.2f}, broker {cores.get('broker', 0) * per_k:.2f} "
            f"cores per 1,000 events/s; agents' RSS {rss.get('agents', 0) / result.clusters:,.0f} "
            f"MiB per cluster; each annotator reads "
            f"{sum(reads) / len(reads) / max(step.events_per_s / result.clusters, 1.0):,.0f} B "
            "per event of its own cluster"
        )  # fmt: skip
    if len(measured) >= 2:
        low, high = measured[0], measured[-1]
        assert low.best is not None
        assert high.best is not None

        def per_k(result: FleetResult, what: str) -> float:
            assert result.best is not None
            step = result.best.step
            return cores_by_role(step).get(what, 0.0) * 1000 / max(step.events_per_s, 1.0)

        def ratio(a: float, b: float) -> str:
            return f"x{b / a:.1f}" if a > 0 else "n/a"

        print(
            f"  From N = {low.clusters} to N = {high.clusters}: sustained events/s "
            f"{low.best.step.events_per_s:,.0f} -> {high.best.step.events_per_s:,.0f}; agents' "
            f"cores per 1,000 events/s {ratio(per_k(low, 'agents'), per_k(high, 'agents'))}, "
            f"core's {ratio(per_k(low, 'core'), per_k(high, 'core'))}; decisions/s "
            f"{low.best.step.per_second(lambda s: s.decisions):,.0f} -> "
            f"{high.best.step.per_second(lambda s: s.decisions):,.0f} (every cluster's "
            "workloads are decided by the one core)"
        )  # fmt: skip
    print("What saturates first (at the first rate not sustained, or the last offered):")
    for result in results:
        limit = result.first_unbounded or (result.steps[-1] if result.steps else None)
        if limit is None:
            continue
        state = "not sustained" if result.first_unbounded else "still sustained"
        print(
            f"  N = {result.clusters:>2}: at {limit.step.rate:,.0f} events/s ({state}) the "
            f"busiest process was {busiest(limit.step)} of a core; the consumer furthest behind: "
            f"{laggard(limit.step)}"
        )  # fmt: skip


# --- the churn processes -----------------------------------------------------------------------


def churn_main(args: argparse.Namespace) -> None:
    """A churn process for several clusters (``--churn-from TEMPLATES --churn-clusters K``):
    ``bench_pipeline.churn_main``'s stream, with each line prefixed by the cluster's index
    (``<i> <kind> <watch line>``), the K fleets first and one ``-`` line after them; the rate
    on stdin is this process's total, taken from the clusters in turn."""
    raw = json.loads(Path(args.churn_from).read_text())
    churns = [
        Churn(Templates(**raw), workloads=args.workloads, pods=args.pods,
              namespaces=args.namespaces, nodes=args.nodes, seed=args.churn_seed + i)
        for i in range(args.churn_clusters)
    ]  # fmt: skip
    out = churn_output()
    for index, churn in enumerate(churns):
        out.writelines(b"%d %s %s\n" % (index, kind.encode(), line) for kind, line in churn.fleet())
    out.write(FLEET_END)
    out.flush()
    turn = itertools.cycle(range(len(churns)))

    def events(count: int, wall: float) -> list[bytes]:
        batch = []
        for _ in range(count):
            index = next(turn)
            kind, line = churns[index].next_event(wall)
            batch.append(b"%d %s %s\n" % (index, kind.encode(), line))
        return batch

    serve_offer(out, events)


# --- setup -------------------------------------------------------------------------------------


async def bench(kubeconfig: str, brokers: str, args: argparse.Namespace) -> None:
    api = await config.new_client_from_config(config_file=kubeconfig)
    async with api:
        helpers = KubeTestCluster(api)
        run = uuid.uuid4().hex[:5]
        label = {"bench-fleet": run}
        nodes = {zone: f"bench-fleet-{run}-{zone}" for zone in ZONES}
        try:
            await asyncio.gather(*(
                helpers.create_node(name, zone=zone, labels=label, pods="50")
                for zone, name in nodes.items()
            ))  # fmt: skip
            results = []
            with tempfile.TemporaryDirectory() as tmp:
                templates = Path(tmp) / "t.json"
                templates.write_text(json.dumps(asdict(await read_templates(api, helpers, label))))
                for n in args.clusters:
                    results.append(await run_fleet(n, helpers, templates, kubeconfig, brokers,
                                                   args))  # fmt: skip
            print(
                "\nMethod: one core (a `podcost ranker` process per strategy and `podcost "
                "aggregator`, as the chart's core mode starts them) for N clusters; each "
                "cluster's synthetic watch stream goes through its own real watcher, and its "
                "own annotator (dry run, pods read from its watcher's cache) reads only its own "
                f"costs topic. The agents of several clusters share an agent process (at most "
                f"{args.agent_processes}), each cluster with its own service instances, Kafka "
                "clients, groups and topics. CPU is the share of one core over the step (the "
                "machine has 2); the broker is counted when this script started it."
            )
            table(results)
            growth(results)
            record_results(results, args)
        finally:
            await helpers.delete_nodes(list(nodes.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--clusters", type=lambda v: [int(n) for n in v.split(",")],
                        default=[1, 5, 20, 50], help="fleet sizes N, one run each")  # fmt: skip
    parser.add_argument("--rates", type=lambda v: [float(r) for r in v.split(",")],
                        default=[250, 500, 1000, 2000, 4000],
                        help="offered pod events/s for the whole fleet, one step each; "
                             "stops at the first not sustained")  # fmt: skip
    parser.add_argument("--step-seconds", type=float, default=5.0)
    parser.add_argument(
        "--sample-seconds",
        type=float,
        default=None,
        help="how often a step reads the counters [its length / 20, >= 0.5 s]",
    )
    parser.add_argument("--drain-seconds", type=float, default=5.0,
                        help="longest wait for a step's backlog")  # fmt: skip
    parser.add_argument("--workloads", type=int, default=8, help="per cluster")
    parser.add_argument("--pods", type=int, default=10, help="per workload")
    parser.add_argument("--namespaces", type=int, default=4, help="per cluster")
    parser.add_argument("--nodes", type=int, default=20, help="per cluster")
    parser.add_argument("--agent-processes", type=int, default=4,
                        help="most agent processes; clusters are spread over them")  # fmt: skip
    parser.add_argument("--rankers", choices=("apart", "shared", "combined"), default="apart",
                        help="apart: a ranker process per strategy, as the chart runs them; "
                             "shared: one process runs every strategy's ranker (each in its "
                             "own group), one decode of each snapshot for all; combined: "
                             "shared, with their answers in shared records "
                             "(rankers.combineAnswers)")  # fmt: skip
    parser.add_argument("--core-replicas", type=int, default=None,
                        help="replicas of the aggregator and of each ranker Deployment (the "
                             "chart's replicaCount) [1]")  # fmt: skip
    parser.add_argument("--partitions", type=int, default=None,
                        help="of every topic of the run (at least --core-replicas for every "
                             "replica to get a share) [the chart's]")  # fmt: skip
    parser.add_argument("--kafka-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a PODCOST_KAFKA_* setting for every process (the fetch settings, "
                             "say); repeatable")  # fmt: skip
    parser.add_argument("--churn-from", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--churn-clusters", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--churn-seed", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.broker_pid = None
    if args.churn_from:
        churn_main(args)
        return
    # The floors, measured here before the fleet starts (snapshots of the same size as the
    # fleet's workloads, encoded as the watcher encodes them).
    args.floors = core_floors(floor_workloads(50, args.pods))
    print(
        f"floors per {args.pods}-pod snapshot (process CPU, one process, no Kafka): decode "
        f"{args.floors.decode_whole * 1e3:.3f} ms, every strategy "
        f"{args.floors.scoring * 1e3:.3f} ms, combine + labels "
        f"{args.floors.aggregator * 1e3:.3f} ms: the core {args.floors.core * 1e3:.3f} ms; "
        "each ranker decoding and scoring: "
        + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in args.floors.rankers.items())
        + " ms"
    )
    with contextlib.ExitStack() as stack:
        if os.environ.get("PODCOST_USE_KUBECONFIG") == "1" and os.environ.get("KUBECONFIG"):
            kubeconfig = os.environ["KUBECONFIG"]
        else:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            control_plane = cluster.start(run_dir / "cluster")
            stack.callback(control_plane.stop)
            kubeconfig = str(control_plane.kubeconfig)
        brokers = os.environ.get("PODCOST_KAFKA")
        if not brokers:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            broker = kafka.start(run_dir / "kafka")
            stack.callback(broker.stop)
            brokers = broker.bootstrap
            args.broker_pid = broker.pid
        asyncio.run(bench(kubeconfig, brokers, args))


if __name__ == "__main__":
    main()
