"""Soak benchmark: a fleet of clusters under moderate churn for hours, over one core of processes,
with every process watched for what piles up: memory, file descriptors, threads, the aggregator's
changelogs and states, and the consumer groups' lag; a rolling restart of the core half-way; and
at the end, the final costs against the pure core's decision for the final objects.

A script, not a test (``python -m tests.bench.bench_soak [--clusters 5] [--minutes 120]
[--rate R] [--sample-every S]``); it prints numbers and asserts nothing. It starts its own control
plane and Kafka broker (``podcost_localinfra``) unless ``PODCOST_USE_KUBECONFIG=1`` with
``KUBECONFIG``, and ``PODCOST_KAFKA``, point at running ones (then the changelogs' bytes on disk
and the broker's own usage are not measured: ``--kafka-data DIR`` names the broker's log dir).
``tests/e2e/test_soak.py`` runs it for 10 minutes and asserts the slopes (``make test-long``).

Method:

- The fleet is ``bench_fleet``'s: the core as the chart's core mode starts it (a ``podcost
  ranker`` process per strategy and ``podcost aggregator``, ``procs.chart_core_specs``), and per
  cluster ``c<i>`` the real watcher and annotator (dry run) of ``bench_agent --role agent``,
  fed a synthetic watch stream by a churn process through the watcher's informer path; the
  agents of several clusters share an agent process (``--agent-processes``).
- The churn is ``bench_pipeline.Churn`` (pods replaced, readiness flapping, status noise) plus
  workloads that come and go (:class:`SoakChurn`): a share of the events (``--workload-share``)
  deletes a Deployment (its ReplicaSet and pods after it, as the garbage collector does) or
  creates one under a new name, keeping each cluster near ``--workloads`` live workloads while
  the history of workloads ever created grows all run long. State kept per workload that
  outlived its workload would pile up with that history.
- Every ``--sample-every`` seconds: each process's resident memory, open file descriptors and
  threads (``/proc/<pid>/status``, ``/proc/<pid>/fd``), the broker's included when this script
  started it; the aggregator's ``podcost_aggregator_states``; the bytes of the aggregator's
  changelog topics on the broker's disk (the ``.log`` segment files of their partition
  directories in the broker's log dir: what compaction must keep bounded; index files are
  preallocated and left out); and each consumer group's lag on this run's topics as the broker
  tells it (end offsets minus committed offsets, ``tests.support.broker.lag_by_group``).
- Half-way, a rolling restart of every core process: stop one (SIGTERM), start it again, wait
  until it is ready, then the next.
- At the end the churn stops and writes its final objects; the fleet settles (every event taken
  in, the debouncers empty, every group's lag 0); then for every live workload the last decision
  on its cluster's costs topic is compared with the pure core's decision
  (``podcost_core.combine.rank``, ``labels.label_costs``, ``implied.drop_implied``, as
  ``podcost_core.simulate`` decides) for the snapshot ``podcost_core.snapshots`` builds from the
  final objects, taken at the instant the watcher's last snapshot of it says (the age strategy
  reads it). The undisturbed twin: what the code under test was never asked.
- Slopes: per metric, least squares over the samples after the warm-up (``--warm-up-minutes``,
  from the start, and for a restarted process from its restart), leaving out the restart window;
  a process's series has one intercept per incarnation (pid), one slope for all: a restart is
  not growth.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from kubernetes_asyncio import config as kube_config
from tests.bench import procs
from tests.bench.bench_pipeline import (
    FLEET_END,
    REPO,
    ZONES,
    Churn,
    Event,
    RemoteOffer,
    Templates,
    Workload,
    churn_output,
    read_templates,
    serve_offer,
)
from tests.bench.record import record
from tests.support.broker import lag_by_group, last_records, written_to
from tests.support.kube import KubeTestCluster
from tests.support.services import ServiceProcess, chart_policy, metric_key, processes

from podcost.runtime.heap import HEAP_DUMP_ENV, HEAP_DUMP_FROM_ENV
from podcost_contracts.messages import (
    DesiredCostsMessage,
    WorkloadSnapshotMessage,
    decode_costs_record,
    decode_workload_record,
    is_live_set,
)
from podcost_contracts.topics import Topics
from podcost_core.combine import rank
from podcost_core.implied import drop_implied
from podcost_core.labels import band_for, current_costs, label_costs
from podcost_core.model import Snapshot
from podcost_core.policy import Policy
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_localinfra import build, cluster, kafka

MIB = 2**20
HOUR = 3600.0


@dataclass(frozen=True)
class SoakConfig:
    """What a soak runs: the fleet, the churn, how long and how often it looks."""

    clusters: int = 5
    minutes: float = 120.0
    rate: float = 50.0
    """Pod events/s offered to the whole fleet, the same share to every cluster."""
    sample_every: float = 30.0
    warm_up_minutes: float | None = None
    """Samples left out of the slopes after the start and after a restart; ``None``: a sixth of
    the run, at most 15 minutes."""
    workloads: int = 20
    """Live Deployments per cluster the churn stays near."""
    pods: int = 10
    namespaces: int = 4
    nodes: int = 20
    workload_share: float = 0.01
    """Share of the churn's events that delete or create a Deployment."""
    agent_processes: int = 2
    shared_rankers: bool = False
    """One process for every strategy's ranker instead of one per strategy."""
    restart: bool = True
    settle_timeout: float = 600.0
    heap_dump: Path | None = None
    """When set, the agent processes trace their allocations (``PODCOST_HEAP_DUMP``: a
    directory per process under it) from the end of the warm-up (``PODCOST_HEAP_DUMP_FROM``:
    traced from their start, a loaded machine's agents failed to reach the broker) and dump
    them then and when the churn stops, for ``tests.bench.heap_diff``: the second dump holds
    what was allocated after the warm-up and still lives (tracing every process slows a loaded
    machine past the aggregator's stall bound)."""

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    @property
    def warm_up_s(self) -> float:
        if self.warm_up_minutes is not None:
            return self.warm_up_minutes * 60.0
        return min(15.0, self.minutes / 6.0) * 60.0


# --- the churn: pods, and workloads that come and go ---------------------------------------------


class SoakChurn(Churn):
    """``Churn``, plus Deployments deleted and created (:data:`SoakConfig.workload_share` of the
    events), and the objects as last sent kept, to be written out at the end (:meth:`objects`).

    A deletion: the Deployment goes, then its ReplicaSet, then its pods one by one, as the
    garbage collector deletes them. A creation: a Deployment under a name never used before,
    its ReplicaSet, then its pods, Running and Ready. Each cluster stays within one workload of
    ``workloads``; the names ever used keep growing."""

    def __init__(
        self, templates: Templates, *, workloads: int, pods: int, namespaces: int, nodes: int,
        seed: int, workload_share: float,
    ) -> None:  # fmt: skip
        self.sent: dict[tuple[str, str, str], bytes] = {}
        """(kind, namespace, name) → the object as last sent, for those not deleted."""
        super().__init__(templates, workloads=workloads, pods=pods, namespaces=namespaces,
                         nodes=nodes, seed=seed)  # fmt: skip
        self.target = workloads
        self.namespace_count = namespaces
        self.workload_share = workload_share
        self.live = set(range(workloads))
        self.slots_of: dict[int, list[int]] = defaultdict(list)
        for slot, owner in enumerate(self.owner):
            self.slots_of[owner].append(slot)
        self.free: list[int] = []
        """Slots of deleted pods, for the pods of the next workload created."""
        self.created = workloads
        self.deleted = 0

    def _emit(self, kind: str, event: str, obj: Any) -> Event:
        kind, line = super()._emit(kind, event, obj)
        meta = obj["metadata"]
        key = (kind, meta.get("namespace", ""), meta["name"])
        if event == "DELETED":
            self.sent.pop(key, None)
        else:
            self.sent[key] = line
        return kind, line

    def next_event(self, now: float) -> Event:
        if (not self._followups or self._followups[0].due > now) and (
            self.rng.random() < self.workload_share
        ):
            event = self._workload_change(now)
            if event is not None:
                return event
        return super().next_event(now)

    def _workload_change(self, now: float) -> Event | None:
        live = len(self.live)
        if live > self.target or (live == self.target and self.rng.random() < 0.5):
            return self._delete_workload(now)
        return self._create_workload(now)

    def _delete_workload(self, now: float) -> Event | None:
        settled = self.busy | self.absent
        quiet = [w for w in sorted(self.live) if settled.isdisjoint(self.slots_of[w])]
        if not quiet:
            return None
        index = self.rng.choice(quiet)
        self.live.discard(index)
        self.deleted += 1
        workload = self.workloads[index]
        slots = self.slots_of.pop(index)
        self.busy.update(slots)
        deployment = orjson.loads(self.sent[("Deployment", workload.namespace, workload.name)])
        replicaset = orjson.loads(
            self.sent[("ReplicaSet", workload.namespace, workload.replicaset)]
        )

        def replicaset_gone(at: float) -> Event:
            for order, slot in enumerate(slots):
                self._later(at + 0.05 + 0.01 * order, pod_gone(slot))
            return self._emit("ReplicaSet", "DELETED", replicaset["object"])

        def pod_gone(slot: int) -> Callable[[float], Event]:
            def gone(at: float) -> Event:
                self.absent.add(slot)
                self.busy.discard(slot)
                self.free.append(slot)
                return self._emit("Pod", "DELETED", self.pods[slot])

            return gone

        self._later(now + 0.05, replicaset_gone)
        return self._emit("Deployment", "DELETED", deployment["object"])

    def _create_workload(self, now: float) -> Event:
        index = len(self.workloads)
        replicaset = f"app-{index:04d}-{self._suffix(10)}"
        workload = Workload(
            namespace=f"synthetic-{index % self.namespace_count:02d}",
            name=f"app-{index:04d}",
            replicaset=replicaset,
            replicaset_uid=str(uuid.UUID(int=self.rng.getrandbits(128))),
            template_hash=replicaset.rsplit("-", 1)[1],
        )
        self.workloads.append(workload)
        self.live.add(index)
        self.created += 1
        deployment, replicaset_object = self._workload_objects(workload)
        slots = []
        for _ in range(self.per_workload):
            pod = self._new_pod(index, now)
            self._schedule(pod)
            self._run(pod, now)
            if self.free:
                slot = self.free.pop()
                self.pods[slot], self.owner[slot] = pod, index
            else:
                slot = len(self.pods)
                self.pods.append(pod)
                self.owner.append(index)
            # Not a candidate for pod churn until it is sent.
            self.busy.add(slot)
            self.absent.add(slot)
            slots.append(slot)
        self.slots_of[index] = slots

        def replicaset_added(at: float) -> Event:
            for order, slot in enumerate(slots):
                self._later(at + 0.05 + 0.01 * order, pod_added(slot))
            return self._emit("ReplicaSet", "ADDED", replicaset_object)

        def pod_added(slot: int) -> Callable[[float], Event]:
            def added(at: float) -> Event:
                self.absent.discard(slot)
                self.busy.discard(slot)
                return self._emit("Pod", "ADDED", self.pods[slot])

            return added

        self._later(now + 0.05, replicaset_added)
        return self._emit("Deployment", "ADDED", deployment)

    def objects(self) -> list[dict[str, Any]]:
        """Every object sent and not deleted, as last sent, with its ``kind``."""
        out = []
        for (kind, _, _), line in self.sent.items():
            obj: dict[str, Any] = orjson.loads(line)["object"]
            obj["kind"] = kind
            out.append(obj)
        return out


def churn_main(args: argparse.Namespace) -> None:
    """A churn process for several clusters (``--churn-from TEMPLATES --churn-clusters K
    --dump-to FILE``): ``bench_fleet.churn_main``'s stream (lines ``<i> <kind> <watch line>``,
    the K fleets first and one ``-`` line after them) of :class:`SoakChurn` clusters; when stdin
    closes, each cluster's objects as last sent and the events sent after its fleet go to
    ``FILE`` (JSON)."""
    raw = json.loads(Path(args.churn_from).read_text())
    churns = [
        SoakChurn(Templates(**raw), workloads=args.workloads, pods=args.pods,
                  namespaces=args.namespaces, nodes=args.nodes, seed=args.churn_seed + i,
                  workload_share=args.workload_share)
        for i in range(args.churn_clusters)
    ]  # fmt: skip
    out = churn_output()
    for index, churn in enumerate(churns):
        out.writelines(b"%d %s %s\n" % (index, kind.encode(), line) for kind, line in churn.fleet())
    out.write(FLEET_END)
    out.flush()
    sent = [0] * len(churns)
    turn = itertools.cycle(range(len(churns)))

    def events(count: int, wall: float) -> list[bytes]:
        batch = []
        for _ in range(count):
            index = next(turn)
            kind, line = churns[index].next_event(wall)
            sent[index] += 1
            batch.append(b"%d %s %s\n" % (index, kind.encode(), line))
        return batch

    serve_offer(out, events)
    out.flush()
    dump = [
        {"sent": sent[i], "created": churn.created, "deleted": churn.deleted,
         "objects": churn.objects()}
        for i, churn in enumerate(churns)
    ]  # fmt: skip
    partial = Path(f"{args.dump_to}.partial")
    partial.write_bytes(orjson.dumps(dump))
    partial.rename(args.dump_to)


# --- what is sampled --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessSample:
    """One process at one instant, from ``/proc``."""

    pid: int
    rss_bytes: int
    fds: int
    threads: int


def process_sample(pid: int) -> ProcessSample | None:
    """``None`` once the process is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kib = int(fields.get("VmRSS", "0 kB").split()[0])
    return ProcessSample(pid, rss_kib * 1024, fds, int(fields["Threads"].strip()))


def changelog_bytes(data_dir: Path, app_id: str) -> int:
    """The bytes of the ``.log`` segments of the changelog topics of the faust app ``app_id``
    in the broker's log dir ``data_dir`` (one directory per partition, ``<topic>-<p>``)."""
    total = 0
    for directory in data_dir.glob(f"{app_id}-*-changelog-*"):
        for segment in directory.glob("*.log"):
            with contextlib.suppress(OSError):
                total += segment.stat().st_size
    return total


@dataclass
class Sample:
    at: float
    """Seconds since the churn started."""
    processes: dict[str, ProcessSample]
    states: float | None
    changelog_bytes: int | None
    lags: dict[str, int] | None
    """Per consumer group (``None``: the broker could not tell)."""


# --- slopes ----------------------------------------------------------------------------------


def slope_per_hour(points: Iterable[tuple[float, float, Hashable]]) -> float | None:
    """Least-squares slope of ``(seconds, value, segment)`` points, per hour, with an intercept
    of its own for each segment (a process's incarnations: a restart is a step, not a trend);
    ``None`` when no segment has two distinct times."""
    segments: dict[Hashable, list[tuple[float, float]]] = defaultdict(list)
    for at, value, segment in points:
        segments[segment].append((at, value))
    num = den = 0.0
    for pts in segments.values():
        if len(pts) < 2:
            continue
        t_mean = sum(t for t, _ in pts) / len(pts)
        y_mean = sum(y for _, y in pts) / len(pts)
        num += sum((t - t_mean) * (y - y_mean) for t, y in pts)
        den += sum((t - t_mean) ** 2 for t, _ in pts)
    return None if den == 0 else num / den * HOUR


@dataclass(frozen=True)
class Restart:
    name: str
    stopped_at: float
    ready_at: float
    ready_after: float
    """Seconds from its start to ready."""


@dataclass
class Crash:
    """A podcost process that exited by itself, started again as its Deployment's kubelet
    would."""

    name: str
    at: float
    code: int | None
    cause: str
    """The last line of its log that names an error."""


@dataclass
class Comparison:
    """The final costs against the pure core's decision, per live workload."""

    live: int = 0
    equal: int = 0
    differ: list[str] = field(default_factory=list)
    """Workload keys whose last decision is not the oracle's (with the first difference)."""
    undecided: list[str] = field(default_factory=list)
    """Live workloads without a decision for their last snapshot."""
    gone: int = 0
    """Workloads whose last record on the workloads topic says they are gone."""

    @property
    def matches(self) -> bool:
        return self.live > 0 and self.equal == self.live


@dataclass
class SoakResult:
    config: SoakConfig
    samples: list[Sample]
    restarts: list[Restart]
    started: dict[int, float]
    """pid → seconds since the churn started when it was started (0 for the first ones)."""
    roles: dict[str, str]
    """process name → core, agents, churn or broker."""
    settled_in: float | None = None
    created: int = 0
    """Workloads ever created in the fleet (the initial ones included)."""
    deleted: int = 0
    live: int = 0
    events: int = 0
    final_lags: dict[str, int] | None = None
    final_states: float | None = None
    comparison: Comparison | None = None
    crashes: list[Crash] = field(default_factory=list)
    """Processes that exited by themselves (each started again)."""

    @property
    def window(self) -> tuple[float, float] | None:
        if not self.restarts:
            return None
        return self.restarts[0].stopped_at, self.restarts[-1].ready_at

    def counted(self, at: float, since: float = 0.0) -> bool:
        """Whether a sample at ``at`` enters the slopes: after the warm-up from ``since``,
        outside the restart window."""
        window = self.window
        inside = window is not None and window[0] <= at <= window[1]
        return at >= since + self.config.warm_up_s and not inside

    def process_slope(self, name: str, value: Callable[[ProcessSample], float]) -> float | None:
        return slope_per_hour(
            (s.at, value(p), p.pid)
            for s in self.samples
            if (p := s.processes.get(name)) is not None
            and self.counted(s.at, self.started.get(p.pid, 0.0))
        )

    def fleet_slope(self, value: Callable[[Sample], float | None]) -> float | None:
        return slope_per_hour(
            (s.at, v, 0) for s in self.samples if self.counted(s.at) and (v := value(s)) is not None
        )

    def counted_samples(self) -> list[Sample]:
        return [s for s in self.samples if self.counted(s.at)]

    def process_names(self) -> list[str]:
        order = {"core": 0, "agents": 1, "churn": 2, "broker": 3}
        return sorted(self.roles, key=lambda n: (order.get(self.roles[n], 9), n))


def rss_mib(p: ProcessSample) -> float:
    return p.rss_bytes / MIB


def fds(p: ProcessSample) -> float:
    return float(p.fds)


def threads(p: ProcessSample) -> float:
    return float(p.threads)


def total_lag(s: Sample) -> float | None:
    return None if s.lags is None else float(sum(s.lags.values()))


def changelog_mib(s: Sample) -> float | None:
    return None if s.changelog_bytes is None else s.changelog_bytes / MIB


# --- the oracle --------------------------------------------------------------------------------


def oracle_costs(snapshot: Snapshot, policy: Policy) -> dict[str, int]:
    """The pure core's decision for ``snapshot``, as ``podcost_core.simulate`` makes it: pod
    uid → cost."""
    combined = rank(snapshot, policy)
    current = current_costs(snapshot.pods)
    band = band_for(policy.non_negative_costs)
    labelling = label_costs(combined.order, {p.uid: p.replicaset for p in snapshot.pods},
                            current, band=band)  # fmt: skip
    labelling = drop_implied(labelling, combined.order, snapshot, current, band=band)
    return {str(uid): cost for uid, cost in labelling.costs.items()}


async def compare_with_oracle(
    brokers: str, topics: Topics, clusters: Sequence[str], dumps: Sequence[Mapping[str, Any]],
    policy: Policy,
) -> Comparison:  # fmt: skip
    """Each live workload's last decision against :func:`oracle_costs` of its final objects
    (see the module docstring)."""
    costs_topics = [topics.costs_for(name) for name in clusters]
    last = await last_records(brokers, [topics.workloads, *costs_topics])
    snapshots: dict[str, WorkloadSnapshotMessage] = {}
    got = Comparison()
    for key, (value, headers) in last[topics.workloads].items():
        if is_live_set(key):
            continue
        message = decode_workload_record(value, headers, key=key)
        if isinstance(message, WorkloadSnapshotMessage):
            snapshots[message.key] = message
        else:
            got.gone += 1
    decisions: dict[str, DesiredCostsMessage] = {}
    for topic in costs_topics:
        for key, (value, headers) in last[topic].items():
            decision = decode_costs_record(value, headers, key=key)
            if isinstance(decision, DesiredCostsMessage):
                decisions[decision.key] = decision
    for name, dump in zip(clusters, dumps, strict=True):
        objects = load_objects(dump["objects"])
        for namespace, workload in sorted(objects.deployments):
            got.live += 1
            oracle = snapshot_for_workload(objects, namespace, workload, "Deployment", name)
            key = oracle.workload.key
            seen, decision = snapshots.get(key), decisions.get(key)
            if seen is None or decision is None or decision.version != seen.version:
                got.undecided.append(key)
                continue
            # Ages are read at the instant the watcher took its snapshot.
            oracle = dataclasses.replace(oracle, taken_at=seen.snapshot.taken_at)
            expected = oracle_costs(oracle, policy)
            decided = {pod.uid: pod.cost for pod in decision.costs}
            if decided == expected:
                got.equal += 1
            else:
                first = next(
                    (f"{uid}: decided {decided.get(uid)}, oracle {expected.get(uid)}"
                     for uid in sorted(set(decided) | set(expected))
                     if decided.get(uid) != expected.get(uid)),
                    "",
                )  # fmt: skip
                got.differ.append(f"{key} ({first})")
    return got


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Host:
    """One agent process and the churn process that feeds it."""

    name: str
    clusters: list[str]
    churn: asyncio.subprocess.Process
    offer: RemoteOffer
    dump: Path
    hold: int
    """A write end of the stream kept open, so the agent reads on after the churn ends."""


class Soak:
    """The fleet's processes while the soak runs, and what it samples."""

    def __init__(
        self, config: SoakConfig, running: Mapping[str, ServiceProcess], hosts: Sequence[Host],
        core: Sequence[str], topics: Topics, brokers: str, app_id: str,
        data_dir: Path | None, broker_pid: int | None,
    ) -> None:  # fmt: skip
        self.config = config
        self.running = running
        self.hosts = hosts
        self.core = list(core)
        self.topics = topics
        self.brokers = brokers
        self.app_id = app_id
        self.data_dir = data_dir
        self.broker_pid = broker_pid
        self.clusters = [name for host in hosts for name in host.clusters]
        self.t0 = time.monotonic()
        self.result = SoakResult(config, [], [], {}, self.roles())
        self._written: int | None = None
        """The run's topics' end offsets, summed, at the last :meth:`settled`."""

    def roles(self) -> dict[str, str]:
        out = {name: "core" for name in self.core}
        out.update({host.name: "agents" for host in self.hosts})
        out.update({f"churn-{i}": "churn" for i in range(len(self.hosts))})
        if self.broker_pid:
            out["kafka broker"] = "broker"
        return out

    def run_topics(self) -> list[str]:
        return [self.topics.workloads, self.topics.ranks,
                *(self.topics.costs_for(name) for name in self.clusters)]  # fmt: skip

    def pids(self) -> dict[str, int]:
        out = {name: p.pid for name, p in self.running.items() if p.alive}
        out.update({f"churn-{i}": h.churn.pid for i, h in enumerate(self.hosts)
                    if h.churn.returncode is None})  # fmt: skip
        if self.broker_pid:
            out["kafka broker"] = self.broker_pid
        return out

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def states(self) -> float | None:
        aggregator = self.running["aggregator"]
        if not aggregator.alive:
            return None
        try:
            return await aggregator.sample("podcost_aggregator_states")
        except AssertionError:
            return None

    async def sample(self) -> Sample:
        at = self.now()
        taken = {name: s for name, pid in self.pids().items() if (s := process_sample(pid))}
        states = await self.states()
        lags = await lag_by_group(self.brokers, self.run_topics())
        changelog = None if self.data_dir is None else changelog_bytes(self.data_dir, self.app_id)
        got = Sample(at, taken, states, changelog, lags)
        self.result.samples.append(got)
        return got

    async def sampling(self, log: Callable[[str], None]) -> None:
        """A sample every ``sample_every`` seconds, until cancelled; a line of it now and then."""
        every = self.config.sample_every
        printed = -1e9
        while True:
            got = await self.sample()
            if got.at - printed >= max(every, 60.0):
                printed = got.at
                log(describe_sample(got))
            await asyncio.sleep(max(0.0, every - (self.now() - got.at)))

    def set_rate(self, rate: float) -> None:
        for host in self.hosts:
            host.offer.set_rate(rate * len(host.clusters) / len(self.clusters))

    async def rolling_restart(self, log: Callable[[str], None]) -> None:
        """Every core process in turn: stop, start, wait until ready."""
        for name in self.core:
            process = self.running[name]
            stopped_at = self.now()
            code = await process.stop()
            await process.start()
            self.result.started[process.pid] = self.now()
            await process.wait_ready(600)
            ready_at = self.now()
            assert process.ready_after is not None
            self.result.restarts.append(Restart(name, stopped_at, ready_at, process.ready_after))
            log(f"  restarted {name} (exit {code}): ready {process.ready_after:.1f}s after its "
                f"start, {ready_at - stopped_at:.1f}s after its stop")  # fmt: skip

    def dump_heaps(self) -> None:
        """SIGUSR1 to the agent processes: each writes its next heap dump."""
        for process in self.running.values():
            if process.alive and process.spec.name.startswith("agents-"):
                os.kill(process.pid, signal.SIGUSR1)

    async def restart_exited(self, log: Callable[[str], None], *, churning: bool = True) -> None:
        """Start every podcost process that exited by itself again, as the kubelet restarts a
        Deployment's container, and record it (:class:`Crash`): a crash shows in the report
        instead of ending the soak. A churn process that ended while ``churning`` stops it."""
        for host in self.hosts:
            if churning and host.churn.returncode is not None:
                raise RuntimeError(f"the churn process of {host.name} ended by itself")
        for name, process in self.running.items():
            if process.alive:
                continue
            code = process.returncode
            tail = process.log_tail(80).splitlines()
            cause = (
                f"killed by signal {-code}" if code is not None and code < 0
                else next((line for line in reversed(tail)
                           if "Error" in line or "ERROR" in line or "Exception" in line),
                          tail[-1] if tail else "")
            )  # fmt: skip
            crash = Crash(name, self.now(), code, cause.strip())
            self.result.crashes.append(crash)
            log(f"  {name} exited by itself (code {crash.code}) at {crash.at / 60:.1f} min: "
                f"{crash.cause}; started again")  # fmt: skip
            await process.start()
            self.result.started[process.pid] = self.now()
            await process.wait_ready(600)

    async def agent_counters(self) -> dict[str, dict[str, float]]:
        """Per cluster: events taken in, workloads in the debouncer, the annotator's queue."""
        out: dict[str, dict[str, float]] = {}
        for host in self.hosts:
            metrics = await self.running[host.name].metrics()
            for name in host.clusters:
                out[name] = {
                    what: metrics.get(metric_key(f"podcost_bench_{what}", cluster=name), 0.0)
                    for what in ("events_fed", "debouncer_pending", "annotator_queue")
                }
        return out

    async def settled(self, sent: Mapping[str, int] | None) -> bool:
        """Every event sent taken in (when ``sent`` is known), nothing in the debouncers or the
        annotators' queues, every group's lag 0, and no record written to the run's topics
        since the previous call: groups are read one after another, so a snapshot published
        meanwhile (a watcher's periodic resync) could pass between them unseen."""
        written = await written_to(self.brokers, self.run_topics())
        quiet, self._written = written == self._written, written
        if not quiet:
            return False
        counters = await self.agent_counters()
        for name, values in counters.items():
            if sent is not None and values["events_fed"] < sent[name]:
                return False
            if values["debouncer_pending"] or values["annotator_queue"]:
                return False
        lags = await lag_by_group(self.brokers, self.run_topics())
        return lags is not None and bool(lags) and not any(lags.values())


async def until(check: Callable[[], Any], timeout: float, what: str) -> float:
    """Poll the coroutine function ``check`` every second until it holds; the seconds taken."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        await asyncio.sleep(1.0)
    return time.monotonic() - started


async def run_soak(
    config: SoakConfig, kubeconfig: str, brokers: str, *, broker_run_dir: Path | None = None,
    kafka_data: Path | None = None, log: Callable[[str], None] = print,
) -> SoakResult:  # fmt: skip
    """Run a soak against the control plane of ``kubeconfig`` (nodes and one pod of its own, for
    the templates; the watchers watch an empty namespace) and the broker at ``brokers`` (its
    log dir ``kafka_data``, or ``<broker_run_dir>/data``, for the changelogs' bytes)."""
    api = await kube_config.new_client_from_config(config_file=kubeconfig)
    async with api:
        helpers = KubeTestCluster(api)
        run = uuid.uuid4().hex[:8]
        label = {"bench-soak": run}
        nodes = {zone: f"bench-soak-{run}-{zone}" for zone in ZONES}
        namespace = ""
        try:
            await asyncio.gather(*(
                helpers.create_node(name, zone=zone, labels=label, pods="50")
                for zone, name in nodes.items()
            ))  # fmt: skip
            namespace = await helpers.create_namespace(f"bench-soak-{run}")
            with tempfile.TemporaryDirectory(prefix="podcost-bench-soak-") as tmp:
                work = Path(tmp)
                templates = work / "templates.json"
                templates.write_text(
                    json.dumps(dataclasses.asdict(await read_templates(api, helpers, label)))
                )
                data_dir = kafka_data or (broker_run_dir / "data" if broker_run_dir else None)
                broker_pid = broker_pid_of(broker_run_dir) if broker_run_dir else None
                return await _run(config, run, namespace, templates, work, kubeconfig, brokers,
                                  data_dir, broker_pid, log)  # fmt: skip
        finally:
            if namespace:
                await helpers.delete_namespace(namespace)
            await helpers.delete_nodes(list(nodes.values()))


def broker_pid_of(run_dir: Path) -> int | None:
    found = sorted((run_dir / "pids").glob(f"[0-9][0-9]-{kafka.BROKER}.pid"))
    return int(found[0].read_text().strip()) if found else None


async def _run(
    config: SoakConfig, run: str, namespace: str, templates: Path, work: Path, kubeconfig: str,
    brokers: str, data_dir: Path | None, broker_pid: int | None, log: Callable[[str], None],
) -> SoakResult:  # fmt: skip
    names = [f"c{i}" for i in range(config.clusters)]
    host_count = min(config.clusters, config.agent_processes)
    groups = [names[i::host_count] for i in range(host_count)]
    core = procs.chart_core_specs(build.ensure_helm(), brokers, run,
                                  shared_rankers=config.shared_rankers)  # fmt: skip
    app_id = f"bench-{run}-aggregator"
    specs = list(core)
    hosts: list[Host] = []
    try:
        for index, group in enumerate(groups):
            stream = work / f"stream-{index}"
            os.mkfifo(stream)
            # O_RDWR: opening a FIFO for writing alone would wait for its reader.
            write_end = os.open(stream, os.O_RDWR)
            dump = work / f"final-{index}.json"
            churn = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.bench.bench_soak", "--churn-from", str(templates),
                "--churn-clusters", str(len(group)), "--churn-seed", str(1 + 1000 * index),
                "--dump-to", str(dump), "--workloads", str(config.workloads),
                "--pods", str(config.pods), "--namespaces", str(config.namespaces),
                "--nodes", str(config.nodes), "--workload-share", str(config.workload_share),
                stdin=asyncio.subprocess.PIPE, stdout=write_end, cwd=REPO,
            )  # fmt: skip
            name = f"agents-{index}"
            hosts.append(Host(name, group, churn, RemoteOffer(churn), dump, write_end))
            specs.append(procs.agent_spec(
                name, ["--role", "agent", "--clusters", ",".join(group), "--stream", str(stream)],
                {"PODCOST_CLUSTER": group[0], "KUBECONFIG": kubeconfig,
                 "PODCOST_WATCHER_NAMESPACE": namespace, "PODCOST_DRY_RUN": "true",
                 # Reads come from the cache, not the API server: no request budget.
                 "PODCOST_ANNOTATOR_QPS": "10000", "PODCOST_ANNOTATOR_BURST": "10000",
                 "PODCOST_ANNOTATOR_GROUP": f"bench-{run}"},
                core[0],
            ))  # fmt: skip
        if config.heap_dump is not None:
            specs = [
                dataclasses.replace(
                    spec,
                    env={
                        **spec.env,
                        HEAP_DUMP_ENV: str(config.heap_dump / spec.name),
                        HEAP_DUMP_FROM_ENV: "signal",
                    },
                )
                if spec.name.startswith("agents-")
                else spec
                for spec in specs
            ]
        logs = work / "logs"
        logs.mkdir()
        async with processes(specs, env={}, log_dir=logs, ready_timeout=600) as running:
            env = core[0].env
            topics = Topics(workloads=env["PODCOST_TOPIC_WORKLOADS"],
                            ranks=env["PODCOST_TOPIC_RANKS"], costs=env["PODCOST_TOPIC_COSTS"],
                            deadletter=env["PODCOST_TOPIC_DEADLETTER"])  # fmt: skip
            soak = Soak(config, running, hosts, [spec.name for spec in core], topics, brokers,
                        app_id, data_dir, broker_pid)  # fmt: skip

            async def fleets_in() -> bool:
                took = [await running[h.name].sample("podcost_bench_fleet_objects")
                        for h in hosts]  # fmt: skip
                return all(t > 0 for t in took)

            await until(fleets_in, 600, "the agent processes taking in their fleets")
            first = await until(lambda: soak.settled(None), 600, "the first decisions")
            log(f"{config.clusters} clusters of {config.workloads} Deployments x {config.pods} "
                f"pods in {host_count} agent process(es), {len(core)} core processes; first "
                f"decisions settled in {first:.0f}s. Churn {config.rate:g} events/s for "
                f"{config.minutes:g} min, sampling every {config.sample_every:g}s, warm-up "
                f"{config.warm_up_s / 60:.1f} min")  # fmt: skip
            soak.t0 = time.monotonic()
            soak.set_rate(config.rate)
            sampler = asyncio.create_task(soak.sampling(log), name="soak sampling")
            try:
                half = config.seconds / 2
                dumped = False
                while soak.now() < config.seconds:
                    if (
                        config.heap_dump is not None
                        and not dumped
                        and (soak.now() >= config.warm_up_s)
                    ):
                        dumped = True
                        soak.dump_heaps()
                    if config.restart and not soak.result.restarts and soak.now() >= half:
                        log(f"rolling restart of the core at {soak.now() / 60:.1f} min:")
                        await soak.rolling_restart(log)
                    await asyncio.sleep(min(5.0, max(0.0, config.seconds - soak.now())))
                    await soak.restart_exited(log)
                    if sampler.done():
                        sampler.result()
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            soak.set_rate(0)
            if config.heap_dump is not None:
                soak.dump_heaps()
            dumps: list[dict[str, Any]] = []
            for host in hosts:
                assert host.churn.stdin is not None
                host.churn.stdin.close()
                if await host.churn.wait() != 0:
                    raise RuntimeError(f"the churn process of {host.name} failed")
                dumps.extend(orjson.loads(host.dump.read_bytes()))
            by_cluster = dict(zip([n for h in hosts for n in h.clusters], dumps, strict=True))
            sent = {name: int(d["sent"]) for name, d in by_cluster.items()}
            result = soak.result
            result.events = sum(sent.values())
            result.created = sum(int(d["created"]) for d in dumps)
            result.deleted = sum(int(d["deleted"]) for d in dumps)
            result.settled_in = await until(lambda: soak.settled(sent), config.settle_timeout,
                                            "the fleet settling after the churn")  # fmt: skip
            final = await soak.sample()
            result.final_lags, result.final_states = final.lags, final.states
            ordered = [by_cluster[name] for name in names]
            result.comparison = await compare_with_oracle(brokers, topics, names, ordered,
                                                          chart_policy())  # fmt: skip
            result.live = result.comparison.live
            await soak.restart_exited(log, churning=False)
            return result
    finally:
        for host in hosts:
            if host.churn.returncode is None:
                host.churn.kill()
            await host.churn.wait()
            os.close(host.hold)


# --- the report -----------------------------------------------------------------------------------


def describe_sample(s: Sample) -> str:
    core = sum(p.rss_bytes for n, p in s.processes.items()
               if n.startswith("ranker") or n == "aggregator") / MIB  # fmt: skip
    lag = "?" if s.lags is None else f"{sum(s.lags.values())}"
    changelog = "-" if s.changelog_bytes is None else f"{s.changelog_bytes / MIB:.1f} MiB"
    states = "?" if s.states is None else f"{s.states:.0f}"
    return (f"  {s.at / 60:6.1f} min: core RSS {core:.0f} MiB, aggregator states {states}, "
            f"changelogs {changelog}, lag {lag}")  # fmt: skip


def fmt_slope(value: float | None, unit: str, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:+.{digits}f} {unit}/h"


def report(result: SoakResult, log: Callable[[str], None] = print) -> None:
    counted = result.counted_samples()
    log(f"\nSamples: {len(result.samples)} ({len(counted)} after the warm-up and outside the "
        f"restart window"
        + (f" {result.window[0] / 60:.1f}-{result.window[1] / 60:.1f} min" if result.window
           else "")
        + ")")  # fmt: skip
    headers = ["process", "RSS first/last MiB", "RSS slope", "fds last", "fds slope",
               "threads last", "threads slope"]  # fmt: skip
    rows = []
    for name in result.process_names():
        series = [s.processes[name] for s in result.samples if name in s.processes]
        if not series:
            continue
        rows.append([
            name, f"{rss_mib(series[0]):.0f} / {rss_mib(series[-1]):.0f}",
            fmt_slope(result.process_slope(name, rss_mib), "MiB"),
            str(series[-1].fds), fmt_slope(result.process_slope(name, fds), "fds"),
            str(series[-1].threads), fmt_slope(result.process_slope(name, threads), "threads"),
        ])  # fmt: skip
    print_table(headers, rows, log)
    log("Fleet:")
    log(f"  aggregator states: slope {fmt_slope(result.fleet_slope(lambda s: s.states), 'states')}"
        f", max after warm-up {max((s.states or 0 for s in counted), default=0):.0f}, final "
        f"{result.final_states}; live workloads at the end {result.live}, created over the run "
        f"{result.created}, deleted {result.deleted}")  # fmt: skip
    log(f"  changelogs on disk: slope {fmt_slope(result.fleet_slope(changelog_mib), 'MiB')}, "
        f"last {describe_changelog(result)}")  # fmt: skip
    worst = max((total_lag(s) or 0 for s in counted), default=0)
    log(
        f"  consumer lag (all groups): slope "
        f"{fmt_slope(result.fleet_slope(total_lag), 'records')}, max after warm-up {worst:.0f}"
    )
    groups = sorted({g for s in result.samples if s.lags for g in s.lags})
    for group in groups:
        slope = result.fleet_slope(group_lag(group))
        log(f"    {group}: slope {fmt_slope(slope, 'records')}, final "
            f"{(result.final_lags or {}).get(group, '?')}")  # fmt: skip
    for restart in result.restarts:
        log(f"  restart {restart.name}: stopped at {restart.stopped_at / 60:.1f} min, ready "
            f"{restart.ready_at - restart.stopped_at:.1f}s later")  # fmt: skip
    log(f"Processes that exited by themselves (started again): {len(result.crashes)}")
    for crash in result.crashes:
        log(f"  {crash.name} at {crash.at / 60:.1f} min, code {crash.code}: {crash.cause}")
    comparison = result.comparison
    if comparison is not None:
        log(f"Settled {result.settled_in:.0f}s after the churn stopped ({result.events:,} events "
            f"sent). Final costs vs the pure core's decision: {comparison.equal}/"
            f"{comparison.live} live workloads equal"
            + ("" if comparison.matches else
               f"; differ {len(comparison.differ)}, undecided {len(comparison.undecided)}: "
               + "; ".join((comparison.differ + comparison.undecided)[:5]))
            + f" ({comparison.gone} workloads gone)")  # fmt: skip


def group_lag(group: str) -> Callable[[Sample], float | None]:
    def lag(s: Sample) -> float | None:
        return None if s.lags is None or group not in s.lags else float(s.lags[group])

    return lag


def describe_changelog(result: SoakResult) -> str:
    last = next((s.changelog_bytes for s in reversed(result.samples)
                 if s.changelog_bytes is not None), None)  # fmt: skip
    return "not measured (broker's log dir unknown)" if last is None else f"{last / MIB:.1f} MiB"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                log: Callable[[str], None]) -> None:  # fmt: skip
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    log(rule)
    for index, cells in enumerate([headers, *rows]):
        log("| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |")
        if index == 0:
            log(rule)
    log(rule)


def role_slope(result: SoakResult, role: str, value: Callable[[ProcessSample], float]) -> str:
    """The largest slope among the processes of ``role``."""
    slopes = [s for name in result.roles if result.roles[name] == role
              if (s := result.process_slope(name, value)) is not None]  # fmt: skip
    if not slopes:
        return "n/a"
    return f"{max(slopes):+.1f}"


def record_result(result: SoakResult) -> None:
    config = result.config
    comparison = result.comparison
    equal = f"{comparison.equal}/{comparison.live}" if comparison else "?"
    record(
        "bench_soak",
        f"{config.clusters} simulated clusters under churn ({config.rate:g} pod events/s, "
        f"{config.workload_share:.0%} workload creations/deletions) for {config.minutes:g} min "
        "over one core of processes, rolling restart of the core half-way",
        [
            f"RSS slope per hour, largest: core {role_slope(result, 'core', rss_mib)} MiB, "
            f"agents {role_slope(result, 'agents', rss_mib)} MiB",
            f"fds per hour, largest: core {role_slope(result, 'core', fds)}, threads "
            f"{role_slope(result, 'core', threads)}",
            f"aggregator states {fmt_slope(result.fleet_slope(lambda s: s.states), '')}, "
            f"{result.final_states} at the end for {result.live} live workloads "
            f"({result.created} created)",
            f"changelogs {fmt_slope(result.fleet_slope(changelog_mib), 'MiB')}",
            f"final costs equal to the pure core's: {equal}",
            f"processes that exited by themselves: {len(result.crashes)}"
            + "".join(
                f"; {c.name} at {c.at / 60:.0f} min ({c.cause[:120]})" for c in result.crashes
            ),
        ],
    )


# --- entry point ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    defaults = SoakConfig()
    parser.add_argument("--clusters", type=int, default=defaults.clusters)
    parser.add_argument("--minutes", type=float, default=defaults.minutes)
    parser.add_argument("--rate", type=float, default=defaults.rate,
                        help="pod events/s for the whole fleet")  # fmt: skip
    parser.add_argument("--sample-every", type=float, default=defaults.sample_every,
                        help="seconds between samples")  # fmt: skip
    parser.add_argument("--warm-up-minutes", type=float, default=None,
                        help="left out of the slopes [a sixth of the run, at most 15]")  # fmt: skip
    parser.add_argument("--workloads", type=int, default=defaults.workloads,
                        help="live Deployments per cluster")  # fmt: skip
    parser.add_argument("--pods", type=int, default=defaults.pods, help="per workload")
    parser.add_argument("--namespaces", type=int, default=defaults.namespaces)
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="per cluster")
    parser.add_argument("--workload-share", type=float, default=defaults.workload_share,
                        help="share of the events that delete or create a Deployment")  # fmt: skip
    parser.add_argument("--agent-processes", type=int, default=defaults.agent_processes)
    parser.add_argument("--rankers", choices=("apart", "shared"), default="apart")
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument("--heap-dump", default=None, metavar="DIR",
                        help="trace the agent processes' allocations; dumps at the end of "
                             "the warm-up and of the churn in DIR/<process> (tests.bench."
                             "heap_diff)")  # fmt: skip
    parser.add_argument("--kafka-data", default=None,
                        help="the log dir of PODCOST_KAFKA's broker")  # fmt: skip
    parser.add_argument("--churn-from", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--churn-clusters", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--churn-seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--dump-to", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.churn_from:
        churn_main(args)
        return
    config = SoakConfig(
        clusters=args.clusters, minutes=args.minutes, rate=args.rate,
        sample_every=args.sample_every, warm_up_minutes=args.warm_up_minutes,
        workloads=args.workloads, pods=args.pods, namespaces=args.namespaces, nodes=args.nodes,
        workload_share=args.workload_share, agent_processes=args.agent_processes,
        shared_rankers=args.rankers == "shared", restart=not args.no_restart,
        heap_dump=Path(args.heap_dump) if args.heap_dump else None,
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        if os.environ.get("PODCOST_USE_KUBECONFIG") == "1" and os.environ.get("KUBECONFIG"):
            kubeconfig = os.environ["KUBECONFIG"]
        else:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            control_plane = cluster.start(run_dir / "cluster")
            stack.callback(control_plane.stop)
            kubeconfig = str(control_plane.kubeconfig)
        brokers = os.environ.get("PODCOST_KAFKA")
        broker_run_dir = None
        if not brokers:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            broker = kafka.start(run_dir / "kafka")
            stack.callback(broker.stop)
            brokers, broker_run_dir = broker.bootstrap, broker.run_dir
        kafka_data = Path(args.kafka_data) if args.kafka_data else None
        result = asyncio.run(run_soak(config, kubeconfig, brokers, broker_run_dir=broker_run_dir,
                                      kafka_data=kafka_data))  # fmt: skip
        report(result)
        record_result(result)


if __name__ == "__main__":
    main()
