"""Benchmark of the whole pipeline, in embedded mode (in-memory bus) and over the real Kafka
broker side by side: sustained pod events per second with bounded consumer lag, Ready → cost
annotation latency on the real control plane, and PATCH requests against the minimum.

A script, not a test (``python -m tests.bench.bench_pipeline [--rates 250,1000,...]``); it prints
numbers and asserts nothing. It starts its own control plane and Kafka broker in temporary
directories (``podcost_localinfra``) unless ``PODCOST_USE_KUBECONFIG=1`` with ``KUBECONFIG``, and
``PODCOST_KAFKA``, point it at running ones. A run that has not ended within ``--timeout``
seconds (by default a bound from its steps, ``run_bound``) stops its processes, deletes its nodes
and exits 1. Every service runs in this one process and event
loop (one core), wired as ``podcost run`` wires them: the watcher, one ranker per strategy of the
default policy, the aggregator (the faust app over Kafka, the consumer loop in memory) and the
annotator; only the bus differs between the two modes.

a. Throughput. The watcher runs for real (its informer lists and watches the API server), but a
   2-core kube-apiserver cannot itself produce thousands of pod events per second, so a separate
   process (this module with ``--churn-from``) makes up watch lines and streams them over a pipe
   at the offered rate: pods made from a real kwok pod of this control plane, churning over many
   workloads (pods replaced through their whole lifecycle, readiness flaps with restarts, and
   status noise the watcher must drop). Each line goes through ``decode_event``, ``apply_event``
   and the watcher's informer handler, exactly as a line read from the API server's socket does;
   the rest of the pipeline runs untouched. The annotator runs in dry-run mode and reads the pods
   from the watcher's cache: the synthetic pods exist only there (the API server would answer
   404), and at thousands of events per second the API server's write budget, not the pipeline,
   would be the limit (``bench_annotator.py`` measures that; b and c below write for real). The
   offered rate goes up in steps; every half second the script samples each consumer's lag
   (records published to its topics minus records it has processed, from the services' own
   counters, the same way over both buses) and how far the watcher is behind the offer. A rate
   is sustained (lag bounded) when neither climbs during the step and, once the offer stops,
   everything pending is done within two seconds (``judge``).
b. Latency. Opted-in Deployments are created and scaled up on kwok nodes; a separate watch on
   their pods records the local time each pod first shows Ready and the time its cost annotation
   first shows (0 when it already carried one at Ready). The annotator writes for real, with its
   default budget.
c. During b, the PATCH requests the annotator sent, against the minimum the labelling asked for:
   per pod, each change of its decided cost across the decisions on the costs topic (from what
   the pod carried when first decided).

A third mode, "Kafka, one process per service" (``--modes ...,kafka-procs``), runs every
service in an OS process of its own, as the chart runs them. In a (``throughput_processes``):
the rankers and the aggregator are ``podcost ranker --strategy S`` / ``podcost aggregator``
started with the arguments and environment ``helm template`` renders for the core
(``procs.chart_core_specs``, through the harness ``tests.support.services``); the watcher and
the annotator each run in a bench agent process (``bench_agent``) that bootstraps the real
service from the environment as the commands do. The churn process writes into a FIFO the
watcher process reads, line by line through the same informer path, and the same lines into a
second FIFO the annotator process reads: its own view of the cluster (pods, ReplicaSets,
Deployments), as its informer would keep it from the API server's watch, which it verifies every
decision against and reads the pods from, so every decision goes through the whole plan path;
no real API server here serves 5,000 synthetic pod events/s, so the view stands in for the API
server's pod reads, and the output says so. The lags are computed as above from each process's
counters, read over its ``/metrics``; the watcher process reports the events it has taken in,
against the offer the bench set. Instead of this process's CPU, each process's share of a core
and its memory are printed (``/proc``). The table gives, for both Kafka modes, the sustained
rate against embedded mode's (goal >= 0.8). In b and c (``latency_processes``) the watcher and
the annotator are the real ``podcost watcher`` / ``podcost annotator`` commands as the chart's
agent mode starts them, against the real control plane; the PATCH requests are then the
annotator's own count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import fcntl
import gc
import heapq
import itertools
import json
import os
import pstats
import random
import select
import statistics
import string
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

import orjson
from kubernetes_asyncio import config
from tests.bench import floors, procs
from tests.bench.record import record as record_row
from tests.support.costs import CountingPods
from tests.support.kube import KubeTestCluster
from tests.support.services import ServiceProcess, chart_specs, processes

from podcost import aggregator, ranker
from podcost.aggregator import AggregatorSettings
from podcost.annotator import AnnotatorSettings, PodAPI
from podcost.annotator import bootstrap as bootstrap_annotator
from podcost.annotator.plan import Scope
from podcost.annotator.view import ClusterView
from podcost.runtime.metrics import Metrics
from podcost.runtime.runner import Service, serve
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherService, WatcherSettings
from podcost.watcher.service import bootstrap as bootstrap_watcher
from podcost_bus import Bus, BusSettings, Consumer, open_bus
from podcost_contracts.messages import DesiredCostsMessage, decode
from podcost_contracts.topics import Topics
from podcost_core.combine import answers_needed
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.projection import SharedParts
from podcost_kube.client import Kube, PodGone
from podcost_kube.informer import (
    POD,
    WORKLOAD_RESOURCES,
    Informer,
    Resource,
    apply_event,
    decode_event,
)
from podcost_kube.store import Change, RawObject, Store
from podcost_localinfra import build, cluster, kafka

GOAL_EVENTS_PER_S = 5_000
GOAL_P99_S = {"embedded": 0.5, "kafka": 1.0}
GOAL_PATCH_RATIO = 1.0
GOAL_KAFKA_RATIO = 0.8
"""Sustained events/s over Kafka against embedded mode."""
SAMPLE_EVERY_S = 0.5
DRAINED_WITHIN_S = 2.0
ZONES = ("zone-a", "zone-b", "zone-c")
CLUSTER = "bench"
REPO = Path(__file__).resolve().parents[2]
F_SETPIPE_SZ = 1031  # Linux fcntl


# --- the two modes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """Embedded (in-memory bus), Kafka (the real broker, faust aggregator), or Kafka with one
    OS process per service (``processes``: see ``throughput_processes``)."""

    name: str
    kafka: str | None
    processes: bool = False

    @property
    def label(self) -> str:
        if self.processes:
            return "Kafka, one process per service"
        return "embedded (in-memory bus)" if self.kafka is None else "Kafka (faust aggregator)"

    def bus_settings(self, run: str) -> BusSettings:
        """Topics of their own, so runs never read each other's records."""
        return BusSettings(
            bootstrap_servers=self.kafka,
            client_id=f"bench-{run}",
            topic_workloads=f"bench-{run}.workloads",
            topic_ranks=f"bench-{run}.ranks",
            topic_costs=f"bench-{run}.costs",
            topic_deadletter=f"bench-{run}.deadletter",
        )


@dataclass
class Pipeline:
    """The services of ``podcost run`` over one bus (``podcost.embedded.bootstrap``'s wiring,
    with the annotator's pod API chosen here)."""

    bus: Bus
    bus_settings: BusSettings
    watcher: WatcherService
    rankers: list[Service]
    aggregator: Service
    annotator: Service
    data_dir: tempfile.TemporaryDirectory[str]

    @property
    def services(self) -> list[Service]:
        return [self.watcher, *self.rankers, self.aggregator, self.annotator]


def build_pipeline(
    mode: Mode, kube: Kube, namespace: str, pods: Callable[[WatcherService], PodAPI],
    annotator: AnnotatorSettings, *, dry_run: bool,
) -> Pipeline:  # fmt: skip
    """The pipeline watching ``namespace`` (and every node); ``pods`` gives the annotator's pod
    API, from the watcher. The annotator verifies decisions against the watcher's informer
    cache (where synthetic pods live), as embedded mode could share it."""
    run = uuid.uuid4().hex[:8]
    bus_settings = mode.bus_settings(run)
    bus = open_bus(bus_settings)
    settings = ServiceSettings(cluster=CLUSTER, http_port=0, dry_run=dry_run)
    data_dir = tempfile.TemporaryDirectory(prefix="podcost-bench-")
    watcher = bootstrap_watcher(
        settings, bus_settings, WatcherSettings(namespace=namespace), kube=kube, bus=bus
    )
    return Pipeline(
        bus=bus,
        bus_settings=bus_settings,
        watcher=watcher,
        rankers=[
            ranker.bootstrap(settings, bus_settings, strategy=name, bus=bus)
            for name in answers_needed(DEFAULT_POLICY)
        ],
        aggregator=aggregator.bootstrap(
            settings,
            bus_settings,
            bus=bus,
            config=AggregatorSettings(
                app_id=f"bench-{run}-aggregator", data_dir=Path(data_dir.name)
            ),
        ),
        annotator=bootstrap_annotator(
            settings,
            bus_settings,
            annotator,
            bus=bus,
            kube=pods(watcher),
            view=ClusterView(Scope(namespaces=(namespace,)), store=watcher.store),
        ),
        data_dir=data_dir,
    )


async def holds_within(check: Callable[[], bool], timeout: float) -> bool:
    """Whether ``check()`` holds within ``timeout`` seconds (returns as soon as it does)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def until(check: Callable[[], bool], what: str, timeout: float) -> None:
    if not await holds_within(check, timeout):
        raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


@contextlib.asynccontextmanager
async def running(pipeline: Pipeline) -> AsyncIterator[None]:
    """Serve the pipeline (as ``podcost run`` does) until the block ends; ready before it."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(pipeline.services, ServiceSettings(http_port=0), bus=pipeline.bus, stop=stop)
    )
    try:
        await until(
            lambda: task.done() or all(s.ready() for s in pipeline.services),
            "every service ready", 120,
        )  # fmt: skip
        if task.done():
            task.result()
        yield
        if task.done():
            task.result()
            raise RuntimeError("the pipeline stopped by itself")
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)
        pipeline.data_dir.cleanup()


# --- counters ----------------------------------------------------------------------------------


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.get_sample_value(name, labels) or 0.0


def produced(metrics: Metrics, topic: str) -> float:
    return counter(metrics, "podcost_messages_produced_total", topic=topic)


def consumed(metrics: Metrics, topic: str) -> float:
    """Records of ``topic`` a service consumed, whatever their outcome (the annotator's
    ``stale`` and ``duplicate`` too: left out, each would be a lag that never drains)."""
    return sum(
        sample.value
        for family in metrics.registry.collect()
        if family.name == "podcost_messages_consumed"
        for sample in family.samples
        if sample.name == "podcost_messages_consumed_total"
        and sample.labels["topic"] == topic
        and sample.labels["component"] == metrics.component
    )


@dataclass(frozen=True)
class Sample:
    """The pipeline at one instant."""

    at: float
    offered: int
    """Synthetic events due by now at the offered rate."""
    fed: int
    """Events the watcher has taken in."""
    snapshots: float
    records: float
    """Records published to the workloads, ranks and costs topics."""
    decisions: float
    dry_runs: float
    lags: Mapping[str, float]
    """Per consumer: records published to the topics it reads that it has not processed yet."""
    queue: float
    """Pod writes pending in the annotator."""

    @property
    def behind(self) -> int:
        return max(0, self.offered - self.fed)

    @property
    def lag(self) -> float:
        return max(self.lags.values())

    @property
    def laggard(self) -> str:
        return max(self.lags, key=lambda name: self.lags[name])


def probe(pipeline: Pipeline, offered: int, fed: int) -> Sample:
    topics = pipeline.bus_settings.topics
    snapshots = produced(pipeline.watcher.metrics, topics.workloads)
    ranks = sum(produced(r.metrics, topics.ranks) for r in pipeline.rankers)
    agg, ann = pipeline.aggregator.metrics, pipeline.annotator.metrics
    decisions = produced(agg, topics.costs_for(CLUSTER))
    lags = {r.name: snapshots - consumed(r.metrics, topics.workloads) for r in pipeline.rankers}
    lags["aggregator"] = (
        snapshots - consumed(agg, topics.workloads) + ranks - consumed(agg, topics.ranks)
    )
    lags["annotator"] = decisions - consumed(ann, topics.costs_for(CLUSTER))
    return Sample(
        at=time.monotonic(),
        offered=offered,
        fed=fed,
        snapshots=snapshots,
        records=snapshots + ranks + decisions,
        decisions=decisions,
        dry_runs=counter(ann, "podcost_patches_total", result="dry_run"),
        lags=lags,
        queue=ann.get_sample_value("podcost_queue_depth") or 0.0,
    )


# --- synthetic churn ---------------------------------------------------------------------------


def rfc3339(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def copy_of(obj: Mapping[str, Any]) -> RawObject:
    copied: RawObject = orjson.loads(orjson.dumps(obj))
    return copied


@dataclass(frozen=True)
class Templates:
    """Real objects of this control plane, read once, that the synthetic ones are made from."""

    pod: RawObject
    replicaset: RawObject
    deployment: RawObject
    node: RawObject


Event = tuple[str, bytes]
"""A kind and one watch line (``{"type": ..., "object": ...}``) as the API server sends it."""

#: What the watcher's informer lists and watches, by kind.
WATCHED: Mapping[str, Resource] = {resource.kind: resource for resource in WORKLOAD_RESOURCES}
#: What an annotator's own view lists and watches, by kind (metadata only).
VIEWED: Mapping[str, Resource] = {
    resource.kind: resource for resource in ClusterView(Scope()).resources()
}


@dataclass
class Workload:
    namespace: str
    name: str
    replicaset: str
    replicaset_uid: str
    template_hash: str


@dataclass(order=True)
class _FollowUp:
    due: float
    order: int
    step: Callable[[float], Event] = field(compare=False)


class Churn:
    """A synthetic fleet and an endless stream of watch events over it.

    Each new action picks a random pod: status noise the watcher must ignore (40 %), a readiness
    flap with a container restart (30 %, Ready again 0.3–1 s later), or a replacement (30 %: the
    pod terminates and is deleted, its successor is added Pending, scheduled, then Running and
    Ready, a few tenths of a second apart, as the ReplicaSet controller, the scheduler and the
    kubelet would). Follow-up events come out when due, before new actions.
    """

    def __init__(
        self, templates: Templates, *, workloads: int, pods: int, namespaces: int, nodes: int,
        seed: int = 1, view_copy: list[bytes] | None = None,
    ) -> None:  # fmt: skip
        self.templates = templates
        self.view_copy = view_copy
        """When given, each event of a kind an annotator's view watches (:data:`VIEWED`) is also
        appended to it as that view's informer receives it: a ``<kind> <watch line>`` of the
        object's metadata only (``PartialObjectMetadata``, what the API server sends a
        metadata-only watch)."""
        self.per_workload = pods
        self.rng = random.Random(seed)
        self._resource_version = itertools.count(10**9)
        self._order = itertools.count()
        self._followups: list[_FollowUp] = []
        self.node_names = [f"synthetic-node-{i:04d}" for i in range(nodes)]
        self.workloads = [
            Workload(
                namespace=f"synthetic-{i % namespaces:02d}",
                name=f"app-{i:04d}",
                replicaset=f"app-{i:04d}-{self._suffix(10)}",
                replicaset_uid=str(uuid.UUID(int=self.rng.getrandbits(128))),
                template_hash="",
            )
            for i in range(workloads)
        ]
        for workload in self.workloads:
            workload.template_hash = workload.replicaset.rsplit("-", 1)[1]
        self.pods: list[RawObject] = []
        self.owner: list[int] = []
        """Per slot: the index of its workload. A replacement takes its predecessor's slot."""
        self.busy: set[int] = set()
        """Slots in a flap or a replacement: no new action until it is over."""
        self.absent: set[int] = set()
        """Slots between a deletion and the successor's arrival."""
        now = time.time()
        for index in range(workloads):
            for _ in range(pods):
                created = now - self.rng.uniform(60, 7 * 86_400)  # ages from a minute to a week
                pod = self._new_pod(index, created)
                self._schedule(pod)
                self._run(pod, created + 1)
                self.pods.append(pod)
                self.owner.append(index)

    # --- the fleet, as ADDED events ----------------------------------------------------------

    def fleet(self) -> Iterator[Event]:
        """Every node, Deployment, ReplicaSet and pod of the fleet, added."""
        for index, name in enumerate(self.node_names):
            yield self._emit("Node", "ADDED", self._node(index, name))
        for workload in self.workloads:
            deployment, replicaset = self._workload_objects(workload)
            yield self._emit("Deployment", "ADDED", deployment)
            yield self._emit("ReplicaSet", "ADDED", replicaset)
        for pod in self.pods:
            yield self._emit("Pod", "ADDED", pod)

    def _node(self, index: int, name: str) -> RawObject:
        node = copy_of(self.templates.node)
        meta = node["metadata"]
        meta.update(name=name, uid=str(uuid.uuid4()))
        meta["labels"] = {
            **meta.get("labels", {}),
            "kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": ZONES[index % len(ZONES)],
            "karpenter.sh/capacity-type": "spot" if index % 4 == 3 else "on-demand",
        }
        taints = [{"key": "maintenance", "value": "soon", "effect": "PreferNoSchedule"}]
        node["spec"] = {**node.get("spec", {}), "taints": taints if index % 10 == 9 else []}
        return node

    def _workload_objects(self, workload: Workload) -> tuple[RawObject, RawObject]:
        replicas = self.per_workload
        deployment = copy_of(self.templates.deployment)
        uid = str(uuid.uuid4())
        labels = {"app": workload.name}
        meta = deployment["metadata"]
        meta.update(name=workload.name, namespace=workload.namespace, uid=uid, labels=labels)
        meta["annotations"] = {**meta.get("annotations", {}), "podcost.dev/enabled": "true"}
        deployment["spec"]["replicas"] = replicas
        deployment["spec"]["selector"] = {"matchLabels": labels}
        deployment["spec"]["template"]["metadata"]["labels"] = labels
        replicaset = copy_of(self.templates.replicaset)
        rs_labels = {**labels, "pod-template-hash": workload.template_hash}
        meta = replicaset["metadata"]
        meta.update(
            name=workload.replicaset, namespace=workload.namespace, uid=workload.replicaset_uid,
            labels=rs_labels,
            ownerReferences=[{"apiVersion": "apps/v1", "kind": "Deployment",
                              "name": workload.name, "uid": uid, "controller": True,
                              "blockOwnerDeletion": True}],
        )  # fmt: skip
        meta["annotations"] = {
            k: v for k, v in meta.get("annotations", {}).items() if not k.startswith("podcost")
        }
        replicaset["spec"]["replicas"] = replicas
        replicaset["spec"]["selector"] = {"matchLabels": rs_labels}
        replicaset["spec"]["template"]["metadata"]["labels"] = rs_labels
        return deployment, replicaset

    # --- pods --------------------------------------------------------------------------------

    def _suffix(self, length: int) -> str:
        return "".join(self.rng.choices(string.ascii_lowercase + string.digits, k=length))

    def _new_pod(self, index: int, created: float) -> RawObject:
        """A Pending, unscheduled pod of workload ``index``, created at ``created``."""
        workload = self.workloads[index]
        pod = copy_of(self.templates.pod)
        meta = pod["metadata"]
        meta.pop("deletionTimestamp", None)
        meta.pop("deletionGracePeriodSeconds", None)
        name = f"{workload.replicaset}-{self._suffix(5)}"
        uid = str(uuid.UUID(int=self.rng.getrandbits(128)))
        meta.update(
            name=name,
            generateName=f"{workload.replicaset}-",
            namespace=workload.namespace,
            uid=uid,
            creationTimestamp=rfc3339(created),
            labels={"app": workload.name, "pod-template-hash": workload.template_hash},
            ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                              "name": workload.replicaset, "uid": workload.replicaset_uid,
                              "controller": True, "blockOwnerDeletion": True}],
        )  # fmt: skip
        spec = pod["spec"]
        spec.pop("nodeName", None)
        spec["priority"] = self.rng.choice((0, 0, 0, 100, 1000))
        burstable = self.rng.random() < 0.7
        for container in spec["containers"]:
            container["resources"] = (
                {"requests": {"cpu": f"{self.rng.choice((50, 100, 250))}m", "memory": "128Mi"}}
                if burstable
                else {}
            )
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable" if burstable else "BestEffort"}
        return pod

    def _schedule(self, pod: RawObject) -> None:
        pod["spec"]["nodeName"] = self.rng.choice(self.node_names)
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
             "lastTransitionTime": pod["metadata"]["creationTimestamp"]},
        ]  # fmt: skip

    def _run(self, pod: RawObject, at: float) -> None:
        """Running and Ready since ``at``, shaped like the template's (kwok's) status."""
        status = copy_of(self.templates.pod["status"])
        since = rfc3339(at)
        status["phase"] = "Running"
        status["qosClass"] = pod["status"]["qosClass"]
        status["startTime"] = since
        status["podIP"] = ".".join(
            ("10", str(self.rng.randrange(256)), str(self.rng.randrange(256)),
             str(self.rng.randrange(1, 255)))
        )  # fmt: skip
        status["podIPs"] = [{"ip": status["podIP"]}]
        for condition in status.get("conditions") or []:
            condition["status"] = "True"
            condition["lastTransitionTime"] = since
        for container in status.get("containerStatuses") or []:
            container.update(ready=True, restartCount=0, started=True)
            container["state"] = {"running": {"startedAt": since}}
        pod["status"] = status

    def _emit(self, kind: str, event: str, obj: RawObject) -> Event:
        obj["metadata"]["resourceVersion"] = str(next(self._resource_version))
        if self.view_copy is not None and kind in VIEWED:
            partial = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": obj["metadata"]}  # fmt: skip
            line = orjson.dumps({"type": event, "object": partial})
            self.view_copy.append(b"%s %s\n" % (kind.encode(), line))
        # Compact, as the API server writes a watch line; orjson rather than the standard
        # library's encoder, which was 70 % of the churn process's CPU (a process that stands
        # in for the API server, on the cores of the pipeline it feeds).
        return kind, orjson.dumps({"type": event, "object": obj})

    def _later(self, due: float, step: Callable[[float], Event]) -> None:
        heapq.heappush(self._followups, _FollowUp(due, next(self._order), step))

    # --- the stream ----------------------------------------------------------------------------

    def next_event(self, now: float) -> Event:
        """The next watch event at wall time ``now``."""
        if self._followups and self._followups[0].due <= now:
            return heapq.heappop(self._followups).step(now)
        slot = self.rng.randrange(len(self.pods))
        while slot in self.absent:
            slot = self.rng.randrange(len(self.pods))
        roll = self.rng.random()
        if slot in self.busy or roll < 0.4:
            return self._noise(slot, now)
        if roll < 0.7:
            return self._flap(slot, now)
        return self._replace(slot, now)

    def _noise(self, slot: int, now: float) -> Event:
        """A status update nothing in a snapshot reads (a probe time)."""
        pod = self.pods[slot]
        for condition in pod["status"].get("conditions") or []:
            if condition["type"] != "Ready":
                condition["lastProbeTime"] = rfc3339(now)
                break
        return self._emit("Pod", "MODIFIED", pod)

    def _set_ready(self, pod: RawObject, ready: bool, now: float) -> None:
        for condition in pod["status"].get("conditions") or []:
            if condition["type"] in ("Ready", "ContainersReady"):
                condition["status"] = "True" if ready else "False"
                condition["lastTransitionTime"] = rfc3339(now)
        for container in pod["status"].get("containerStatuses") or []:
            container["ready"] = ready
            if not ready:
                container["restartCount"] = container.get("restartCount", 0) + 1

    def _flap(self, slot: int, now: float) -> Event:
        pod = self.pods[slot]
        self.busy.add(slot)
        self._set_ready(pod, False, now)

        def ready_again(at: float) -> Event:
            self._set_ready(pod, True, at)
            self.busy.discard(slot)
            return self._emit("Pod", "MODIFIED", pod)

        self._later(now + self.rng.uniform(0.3, 1.0), ready_again)
        return self._emit("Pod", "MODIFIED", pod)

    def _replace(self, slot: int, now: float) -> Event:
        old = self.pods[slot]
        self.busy.add(slot)
        old["metadata"]["deletionTimestamp"] = rfc3339(now)
        old["metadata"]["deletionGracePeriodSeconds"] = 0
        rng = self.rng

        def deleted(at: float) -> Event:
            self.absent.add(slot)
            self._later(at + rng.uniform(0.01, 0.05), added)
            return self._emit("Pod", "DELETED", old)

        def added(at: float) -> Event:
            new = self._new_pod(self.owner[slot], at)
            self.pods[slot] = new
            self.absent.discard(slot)
            self._later(at + rng.uniform(0.05, 0.2), scheduled)
            return self._emit("Pod", "ADDED", new)

        def scheduled(at: float) -> Event:
            pod = self.pods[slot]
            self._schedule(pod)
            self._later(at + rng.uniform(0.2, 0.8), started)
            return self._emit("Pod", "MODIFIED", pod)

        def started(at: float) -> Event:
            pod = self.pods[slot]
            self._run(pod, at)
            self.busy.discard(slot)
            return self._emit("Pod", "MODIFIED", pod)

        self._later(now + rng.uniform(0.05, 0.3), deleted)
        return self._emit("Pod", "MODIFIED", old)


class CachedPods:
    """The annotator's pod reads served from the watcher's informer cache, for the dry run over
    synthetic pods (which exist only there). It never writes."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def read_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        pod = self.store.get("Pod", namespace, name)
        if pod is None:
            raise PodGone(f"pod {namespace}/{name} is not in the cache", status=404)
        return pod

    async def patch_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, cost: int, *, seen: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        raise RuntimeError("the throughput run is a dry run: nothing is written")


FLEET_END = b"-\n"


class Offer:
    """Events due at a rate that changes now and then: what the API server would have sent."""

    def __init__(self) -> None:
        self.rate = 0.0
        self._before = 0.0
        self._since = time.monotonic()

    def due(self, now: float) -> int:
        return int(self._before + (now - self._since) * self.rate)

    def set_rate(self, rate: float, now: float) -> None:
        self._before += (now - self._since) * self.rate
        self._since, self.rate = now, rate


def churn_main(args: argparse.Namespace) -> None:
    """The churn process (``--churn-from TEMPLATES``): the fleet as ADDED lines and a ``-`` line,
    then events at the rate each line on stdin sets (``<events/s> <from, monotonic>``: the
    clock both processes share), until stdin closes. An output line is ``<kind> <watch line>``.
    Writes block while the reader is behind and the offer goes on: a reader that falls behind
    finds the events waiting, as on a watch socket."""
    raw = json.loads(Path(args.churn_from).read_text())
    copies: list[bytes] | None = [] if args.copy_to else None
    churn = Churn(Templates(**raw), workloads=args.workloads, pods=args.pods,
                  namespaces=args.namespaces, nodes=args.nodes, view_copy=copies)  # fmt: skip
    out = churn_output()
    if copies is not None:
        # The annotator's own view of the cluster: what its informer's metadata-only watches
        # of the API server would bring, written in step with the watcher's stream.
        out = cast(BinaryIO, WithCopy(out, pipe_output(os.open(args.copy_to, os.O_RDWR)), copies))
    out.writelines([b"%s %s\n" % (kind.encode(), line) for kind, line in churn.fleet()])
    if copies is not None:
        copies.append(FLEET_END)
    out.write(FLEET_END)
    out.flush()

    def events(count: int, wall: float) -> list[bytes]:
        batch = [churn.next_event(wall) for _ in range(count)]
        return [b"%s %s\n" % (kind.encode(), line) for kind, line in batch]

    serve_offer(out, events)


class WithCopy:
    """Writes what it is given to ``out``, and then, to ``copy``, the lines ``copies`` gathered
    meanwhile (the churn's :attr:`Churn.view_copy` of the same events)."""

    def __init__(self, out: BinaryIO, copy: BinaryIO, copies: list[bytes]) -> None:
        self.out, self.copy, self.copies = out, copy, copies

    def write(self, data: bytes) -> None:
        self.writelines([data])

    def writelines(self, lines: Sequence[bytes]) -> None:
        self.out.writelines(lines)
        self.copy.writelines(self.copies)
        self.copies.clear()

    def flush(self) -> None:
        self.out.flush()
        self.copy.flush()


def churn_output() -> BinaryIO:
    """A churn process's stdout, buffered, on a pipe as deep as a socket's buffers if allowed."""
    return pipe_output(1)


def pipe_output(fd: int) -> BinaryIO:
    """``fd``, buffered, on a pipe as deep as a socket's buffers if allowed."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, 1 << 20)
    return os.fdopen(fd, "wb", buffering=1 << 20)


def serve_offer(out: BinaryIO, events: Callable[[int, float], list[bytes]]) -> None:
    """Write ``events(count, wall time)`` lines at the rate each line on stdin sets
    (``<events/s> <from, monotonic>``), at most 200 at once, until stdin closes. Writes block
    while the reader is behind and the offer goes on: a reader that falls behind finds the
    events waiting, as on a watch socket.

    stdin is read from its descriptor, every line that came: ``sys.stdin.readline()`` would
    keep a second line that arrived with the first (the process was blocked writing meanwhile)
    in its buffer, where ``select`` does not see it, and the rate it sets would wait for the
    next line."""
    offer = Offer()
    sent = 0
    commands = b""
    with contextlib.suppress(BrokenPipeError):
        while True:
            waiting, _, _ = select.select([0], [], [], 0 if offer.rate else 0.05)
            if waiting:
                came = os.read(0, 1 << 16)
                if not came:
                    return
                *lines, commands = (commands + came).split(b"\n")
                for line in lines:
                    rate, since = line.split()
                    offer.set_rate(float(rate), float(since))
            due = offer.due(time.monotonic()) - sent
            if due <= 0:
                time.sleep(0.001)
                continue
            batch = events(min(due, 200), time.time())
            out.writelines(batch)
            out.flush()
            sent += len(batch)


class WatchStream:
    """Watch lines from the churn process, handed to the watcher as its informer hands on each
    line it reads from the API server: ``decode_event``, ``apply_event`` (what the store keeps of
    the object, projected, then ``Store.apply``), then the informer's handler. The lines come
    over a pipe from another process, as they come over a socket from the API server, so making
    them up costs this process nothing."""

    def __init__(self, watcher: WatcherService, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None, "started with stdout=PIPE"
        self.watcher = watcher
        self.process = process
        self.lines = process.stdout
        self.fed = 0
        self.offer = Offer()
        self.shared = SharedParts()
        """The parts the kept objects share, as the watcher's informer's."""

    def offered(self) -> int:
        return self.offer.due(time.monotonic())

    def set_rate(self, rate: float) -> None:
        """Ask the churn process for ``rate`` events/s from now on."""
        assert self.process.stdin is not None, "started with stdin=PIPE"
        now = time.monotonic()
        self.process.stdin.write(f"{rate!r} {now!r}\n".encode())
        self.offer.set_rate(rate, now)

    def deliver(self, kind: str, line: bytes) -> None:
        resource = WATCHED[kind]
        event = decode_event(line, f"{kind}: watch", resource)
        change = apply_event(self.watcher.store, resource, event, self.shared)
        if change is not None:
            # The informer's one handler: what the watcher subscribed with (Informer._dispatch).
            self.watcher._on_change(change)

    async def fleet(self) -> int:
        """Take in the fleet's ADDED events; how many."""
        count = 0
        while (line := await self.lines.readline()) != FLEET_END:
            if not line:
                raise RuntimeError("the churn process ended before sending the fleet")
            kind, _, event = line.partition(b" ")
            self.deliver(kind.decode(), event)
            count += 1
        return count

    async def run(self) -> None:
        while line := await self.lines.readline():
            kind, _, event = line.partition(b" ")
            self.deliver(kind.decode(), event)
            self.fed += 1
            if self.fed % 50 == 0:
                await asyncio.sleep(0)  # readline does not yield while lines are buffered


# --- a. throughput -----------------------------------------------------------------------------


@dataclass
class Step:
    rate: float
    seconds: float
    samples: list[Sample]
    first: Sample
    bounded: bool = False
    gc_seconds: float = 0.0
    """Time spent in garbage collection during the step."""
    gc_full: int = 0
    """Full (generation 2) collections during the step."""
    drain_s: float | None = None
    """How long everything pending took to finish once the offer stopped (``None``: longer
    than the bench waited)."""
    cpu_seconds: float = 0.0
    """CPU time this process used during the step: near the step's length means the one
    core is the limit; well below it while the lag grows means waiting is."""
    usage: Mapping[str, tuple[float, int]] | None = None
    """One process per service: per process, the share of a core it used during the step and
    its resident memory at the end (``cpu_seconds`` and the GC figures are then not taken)."""
    machine: procs.MachineShare | None = None
    """One process per service: what the whole machine's cores did during the step."""

    def per_second(self, of: Callable[[Sample], float]) -> float:
        return (of(self.samples[-1]) - of(self.first)) / self.seconds

    @property
    def events_per_s(self) -> float:
        return self.per_second(lambda s: s.fed)

    @property
    def max_lag(self) -> float:
        return max(s.lag for s in self.samples)


@dataclass
class Throughput:
    mode: Mode
    fleet: str
    warm_up_s: float
    steps: list[Step]

    @property
    def best(self) -> Step | None:
        bounded = [step for step in self.steps if step.bounded]
        return bounded[-1] if bounded else None


def growing(series: Sequence[float], floor: float) -> bool:
    """Whether ``series`` climbs: its lowest point in the last quarter is above ``floor`` and
    above its highest point in the first half (a ripple keeps coming back down)."""
    quarter = series[-max(1, len(series) // 4) :]
    half = series[: max(1, len(series) // 2)]
    return min(quarter) > max(floor, max(half))


def judge(step: Step) -> bool:
    """Bounded: neither the watcher's backlog of events nor the consumers' lag climbed during
    the step, and once the offer stopped everything still pending (events not taken in,
    snapshots not published, records not processed, writes not decided) was done within
    ``DRAINED_WITHIN_S``."""
    return (
        not growing([s.behind for s in step.samples], floor=50)
        and not growing([s.lag for s in step.samples], floor=20)
        and step.drain_s is not None
        and step.drain_s <= DRAINED_WITHIN_S
    )


async def throughput(
    mode: Mode, api: Any, helpers: KubeTestCluster, templates: Path, args: argparse.Namespace
) -> Throughput:
    namespace = await helpers.create_namespace(f"bench-pipeline-a-{uuid.uuid4().hex[:5]}")
    kube = Kube(api)
    # Reads come from the cache, not the API server: the request budget does not apply.
    settings = AnnotatorSettings(group=f"bench-{uuid.uuid4().hex[:6]}", qps=10_000, burst=10_000)
    pipeline = build_pipeline(
        mode, kube, namespace, lambda watcher: CachedPods(watcher.store), settings, dry_run=True
    )
    fleet = (
        f"{args.workloads} Deployments x {args.pods} pods in {args.namespaces} namespaces on "
        f"{args.nodes} nodes"
    )
    steps: list[Step] = []
    profile = cProfile.Profile() if args.profile else None
    churn = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.bench.bench_pipeline", "--churn-from", str(templates),
        "--workloads", str(args.workloads), "--pods", str(args.pods),
        "--namespaces", str(args.namespaces), "--nodes", str(args.nodes),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 22,
        cwd=REPO,
    )  # fmt: skip
    try:
        async with running(pipeline):
            stream = WatchStream(pipeline.watcher, churn)
            started = time.monotonic()
            objects = await stream.fleet()
            await until(lambda: settled(pipeline, stream), "the fleet's first decisions", 180)
            warm_up = time.monotonic() - started
            print(f"\n[{mode.name}] a. throughput: {fleet} ({objects} objects); first decisions "
                  f"for all in {warm_up:.1f}s")  # fmt: skip
            task = asyncio.create_task(stream.run(), name="watch-stream")
            gc_clock = GcClock()
            if profile is not None:
                profile.enable()
            try:
                for rate in args.rates:
                    step = await run_step(
                        pipeline, stream, rate, args.step_seconds, gc_clock, args.drain_seconds
                    )
                    steps.append(step)
                    report_step(step)
            finally:
                if profile is not None:
                    profile.disable()
                gc_clock.close()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        if churn.returncode is None:
            churn.kill()
        await churn.wait()
        await helpers.delete_namespace(namespace)
    if profile is not None:
        path = Path(args.profile) / f"pipeline-{mode.name}.pstats"
        profile.dump_stats(path)
        print(f"  profile of the steps: {path}; the top by own time:")
        pstats.Stats(profile).sort_stats("tottime").print_stats(18)
    return Throughput(mode, fleet, warm_up, steps)


class GcClock:
    """Time this process spends in garbage collection (a callback of the ``gc`` module)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.full += info["generation"] == 2

    def close(self) -> None:
        gc.callbacks.remove(self)


def settled(pipeline: Pipeline, stream: WatchStream) -> bool:
    """Every event taken in, every snapshot published, every record processed, every write
    decided."""
    return (
        stream.fed >= stream.offered()
        and pipeline.watcher.debouncer.pending == 0
        and probe(pipeline, 0, 0).lag == 0
        and (pipeline.annotator.metrics.get_sample_value("podcost_queue_depth") or 0) == 0
    )


async def run_step(
    pipeline: Pipeline, stream: WatchStream, rate: float, seconds: float, gc_clock: GcClock,
    drain_seconds: float,
) -> Step:  # fmt: skip
    stream.set_rate(rate)
    end = time.monotonic() + seconds
    first = probe(pipeline, stream.offered(), stream.fed)
    gc_before, full_before = gc_clock.seconds, gc_clock.full
    cpu_before = time.process_time()
    samples = []
    while time.monotonic() < end:
        await asyncio.sleep(min(SAMPLE_EVERY_S, max(0.0, end - time.monotonic())))
        samples.append(probe(pipeline, stream.offered(), stream.fed))
    step = Step(rate, samples[-1].at - first.at, samples, first)
    step.gc_seconds = gc_clock.seconds - gc_before
    step.gc_full = gc_clock.full - full_before
    step.cpu_seconds = time.process_time() - cpu_before
    # Stop the offer and time the drain; the next step then starts from nothing pending.
    stream.set_rate(0)
    stopped = time.monotonic()
    if await holds_within(lambda: settled(pipeline, stream), drain_seconds):
        step.drain_s = time.monotonic() - stopped
    step.bounded = judge(step)
    return step


def watch_floor(templates: Path, args: argparse.Namespace, count: int = 5000) -> float:
    """The watcher's floor per event: CPU seconds of ``orjson.loads`` per watch line, over
    ``count`` lines of the churn the bench offers (the same generator and fleet)."""
    raw = json.loads(Path(templates).read_text())
    churn = Churn(Templates(**raw), workloads=args.workloads, pods=args.pods,
                  namespaces=args.namespaces, nodes=args.nodes)  # fmt: skip
    for _ in churn.fleet():
        pass
    start = time.time()
    lines = [churn.next_event(start + index / 5000)[1] for index in range(count)]
    return floors.watcher_floor(lines)


def report_step(step: Step, watch_floor: float | None = None) -> None:
    last = step.samples[-1]
    print(
        f"  offered {step.rate:>6,.0f} events/s: took in {step.events_per_s:>6,.0f}/s, "
        f"{step.per_second(lambda s: s.snapshots):>4.0f} snapshots/s, "
        f"{step.per_second(lambda s: s.decisions):>4.0f} decisions/s, "
        f"{step.per_second(lambda s: s.dry_runs):>6,.0f} pod writes decided/s; "
        f"lag max {step.max_lag:.0f}, end {last.lag:.0f} records ({last.laggard}); watcher "
        f"{last.behind:,} events behind; "
        + (f"all drained {step.drain_s:.1f}s after the offer stopped"
           if step.drain_s is not None else "not drained within the wait")
        + f" -> {'bounded' if step.bounded else 'NOT bounded'}"
    )  # fmt: skip
    if step.usage is not None:
        print("    CPU (share of one core) and RSS per process:")
        print(procs.describe_usage(step.usage, indent="      "))
        watcher = step.usage.get("watcher")
        if watcher is not None and watch_floor is not None and step.events_per_s > 0:
            per_event = watcher[0] / step.events_per_s
            print(
                f"      watcher CPU per event {per_event * 1e6:,.0f} us; floor (orjson.loads of "
                f"the same watch lines) {watch_floor * 1e6:,.1f} us: "
                f"{floors.ratio(per_event, watch_floor)} the floor"
            )
        if step.machine is not None:
            print(procs.describe_machine(step.machine, indent="      "))
    else:
        print(
            f"    this process: {step.cpu_seconds:.1f}s of CPU in the {step.seconds:.1f}s step, "
            f"of which garbage collection {step.gc_seconds:.2f}s ({step.gc_full} full "
            "collections)"
        )
    series = " ".join(f"{s.at - step.first.at:.1f}s:{s.lag:.0f}/{s.behind}" for s in step.samples)
    print(f"    consumer lag (records) / watcher behind (events), sampled: {series}")


# --- a, with one OS process per service --------------------------------------------------------


class RemoteOffer:
    """The offer of a churn process whose lines another process reads: ``WatchStream``'s
    ``set_rate`` and ``offered``, without the reading."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.offer = Offer()

    def offered(self) -> int:
        return self.offer.due(time.monotonic())

    def set_rate(self, rate: float) -> None:
        assert self.process.stdin is not None, "started with stdin=PIPE"
        now = time.monotonic()
        self.process.stdin.write(f"{rate!r} {now!r}\n".encode())
        self.offer.set_rate(rate, now)


@dataclass
class Processes:
    """The pipeline as OS processes, watched over their ``/metrics``."""

    running: Mapping[str, ServiceProcess]
    topics: Topics
    cluster: str = CLUSTER

    @property
    def rankers(self) -> list[str]:
        return [name for name in self.running if name.startswith("ranker-")]

    async def probe(self, offered: int) -> tuple[Sample, float]:
        """The pipeline now (as ``probe``), and the workloads waiting in the watcher's
        debouncer."""
        names = list(self.running)
        got = await asyncio.gather(*(self.running[name].metrics() for name in names))
        m = dict(zip(names, got, strict=True))
        topics, watcher, agg, ann = self.topics, m["watcher"], m["aggregator"], m["annotator"]
        snapshots = procs.produced(watcher, topics.workloads)
        ranks = sum(procs.produced(m[r], topics.ranks) for r in self.rankers)
        decisions = procs.produced(agg, topics.costs_for(self.cluster))
        lags = {r: snapshots - procs.consumed(m[r], topics.workloads) for r in self.rankers}
        lags["aggregator"] = (
            snapshots - procs.consumed(agg, topics.workloads)
            + ranks - procs.consumed(agg, topics.ranks)
        )  # fmt: skip
        lags["annotator"] = decisions - procs.consumed(ann, topics.costs_for(self.cluster))
        sample = Sample(
            at=time.monotonic(),
            offered=offered,
            fed=int(procs.sample(watcher, "podcost_bench_events_fed", cluster=self.cluster)),
            snapshots=snapshots,
            records=snapshots + ranks + decisions,
            decisions=decisions,
            dry_runs=procs.sample(ann, "podcost_patches_total", result="dry_run"),
            lags=lags,
            queue=procs.sample(ann, "podcost_queue_depth"),
        )
        pending = procs.sample(watcher, "podcost_bench_debouncer_pending", cluster=self.cluster)
        return sample, pending

    async def settled(self, offer: RemoteOffer) -> bool:
        sample, pending = await self.probe(offer.offered())
        return sample.behind == 0 and pending == 0 and sample.lag == 0 and sample.queue == 0


async def holds_within_async(check: Callable[[], Awaitable[bool]], timeout: float) -> bool:
    """``holds_within`` for a check that has to ask other processes."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def throughput_processes(
    mode: Mode, helpers: KubeTestCluster, templates: Path, kubeconfig: str,
    args: argparse.Namespace,
) -> Throughput:  # fmt: skip
    """a, with every service in its own OS process, as the chart runs them: the rankers and the
    aggregator are ``podcost ranker --strategy S`` / ``podcost aggregator`` started with the
    arguments and environment the chart's core mode renders (``procs.chart_core_specs``); the
    watcher and the annotator each run in a bench agent process (``bench_agent``) that
    bootstraps the real service. The churn process writes into a FIFO the watcher process
    reads, and the same lines into a second FIFO the annotator process reads: its own view of
    the cluster, as its informer would keep it, which it verifies decisions against and reads the
    pods from (the synthetic pods exist nowhere else). Lags come from each process's counters
    over ``/metrics``; CPU and memory from ``/proc``."""
    assert mode.kafka is not None, "over Kafka"
    namespace = await helpers.create_namespace(f"bench-pipeline-p-{uuid.uuid4().hex[:5]}")
    run = uuid.uuid4().hex[:8]
    fleet = (
        f"{args.workloads} Deployments x {args.pods} pods in {args.namespaces} namespaces on "
        f"{args.nodes} nodes"
    )
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="podcost-bench-procs-") as tmp:
        work = Path(tmp)
        core = procs.chart_core_specs(build.ensure_helm(), mode.kafka, run)
        stream, copy = work / "stream", work / "annotator-stream"
        os.mkfifo(stream)
        os.mkfifo(copy)
        agent_env = {"PODCOST_CLUSTER": CLUSTER}
        specs = [
            *core,
            procs.agent_spec("watcher", ["--role", "watcher", "--stream", str(stream)],
                             {**agent_env, "KUBECONFIG": kubeconfig,
                              "PODCOST_WATCHER_NAMESPACE": namespace}, core[0]),
            # Reads are answered from its view, not the API server: no request budget.
            procs.agent_spec("annotator", ["--role", "annotator", "--stream", str(copy)],
                             {**agent_env, "PODCOST_DRY_RUN": "true",
                              "PODCOST_ANNOTATOR_QPS": "10000", "PODCOST_ANNOTATOR_BURST": "10000",
                              "PODCOST_ANNOTATOR_GROUP": f"bench-{run}"}, core[0]),
        ]  # fmt: skip
        # O_RDWR: opening a FIFO for writing alone would wait for its reader.
        write_end = os.open(stream, os.O_RDWR)
        churn = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.bench.bench_pipeline", "--churn-from", str(templates),
            "--workloads", str(args.workloads), "--pods", str(args.pods),
            "--namespaces", str(args.namespaces), "--nodes", str(args.nodes),
            "--copy-to", str(copy), stdin=asyncio.subprocess.PIPE, stdout=write_end, cwd=REPO,
        )  # fmt: skip
        os.close(write_end)
        logs = work / "logs"
        logs.mkdir()
        try:
            started = time.monotonic()
            async with processes(specs, env={}, log_dir=logs, ready_timeout=180) as running:
                pipeline = Processes(running, BusSettings(
                    topic_workloads=core[0].env["PODCOST_TOPIC_WORKLOADS"],
                    topic_ranks=core[0].env["PODCOST_TOPIC_RANKS"],
                    topic_costs=core[0].env["PODCOST_TOPIC_COSTS"],
                    topic_deadletter=core[0].env["PODCOST_TOPIC_DEADLETTER"],
                ).topics)  # fmt: skip
                offer = RemoteOffer(churn)
                watcher = running["watcher"]

                async def fleet_in() -> bool:
                    return await watcher.sample("podcost_bench_fleet_objects") > 0

                if not await holds_within_async(fleet_in, 180):
                    raise RuntimeError("the watcher process did not take in the fleet")
                objects = int(await watcher.sample("podcost_bench_fleet_objects"))
                if not await holds_within_async(lambda: pipeline.settled(offer), 180):
                    raise RuntimeError("timed out waiting for the fleet's first decisions")
                warm_up = time.monotonic() - started
                print(f"\n[{mode.name}] a. throughput: {fleet} ({objects} objects); processes "
                      f"started and first decisions for all in {warm_up:.1f}s")  # fmt: skip
                floor = watch_floor(templates, args)
                pids = {name: p.pid for name, p in running.items()}
                pids["churn"] = churn.pid
                if args.broker_pid:
                    pids["kafka broker"] = args.broker_pid
                for rate in args.rates:
                    step = await run_step_processes(
                        pipeline, offer, rate, args.step_seconds, args.drain_seconds,
                        procs.CpuWatch(pids),
                    )  # fmt: skip
                    steps.append(step)
                    report_step(step, floor)
                    if not all(p.alive for p in running.values()):
                        raise RuntimeError("a service process ended by itself")
        finally:
            if churn.returncode is None:
                churn.kill()
            await churn.wait()
            await helpers.delete_namespace(namespace)
    return Throughput(mode, fleet, warm_up, steps)


async def run_step_processes(
    pipeline: Processes, offer: RemoteOffer, rate: float, seconds: float, drain_seconds: float,
    cpu: procs.CpuWatch,
) -> Step:  # fmt: skip
    """``run_step``, sampling the processes over HTTP."""
    offer.set_rate(rate)
    end = time.monotonic() + seconds
    first, _ = await pipeline.probe(offer.offered())
    cpu.start()
    samples = []
    while time.monotonic() < end:
        await asyncio.sleep(min(SAMPLE_EVERY_S, max(0.0, end - time.monotonic())))
        samples.append((await pipeline.probe(offer.offered()))[0])
    step = Step(rate, samples[-1].at - first.at, samples, first)
    step.usage = cpu.stop(step.seconds)
    step.machine = cpu.machine
    offer.set_rate(0)
    stopped = time.monotonic()
    if await holds_within_async(lambda: pipeline.settled(offer), drain_seconds):
        step.drain_s = time.monotonic() - stopped
    step.bounded = judge(step)
    return step


# --- b and c. latency and PATCHes ------------------------------------------------------------


@dataclass
class Latency:
    mode: Mode
    pods: int
    latencies: list[float]
    before_ready: int
    patches: int
    minimum: int
    decisions: int
    wrong: int
    """Pods whose annotation at the end is not their last decided cost."""

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class PodClock:
    """A watch handler that notes when each pod first shows Ready, and its cost annotation."""

    def __init__(self) -> None:
        self.ready_at: dict[str, float] = {}
        self.annotated_at: dict[str, float] = {}
        self.before_ready = 0
        self.costs: dict[str, int] = {}
        self.unwritten_at: dict[str, float] = {}

    def decided(self, decision: DesiredCostsMessage) -> None:
        """Note a decision as the bench reads it: a Ready pod without a cost annotation that it
        gives cost 0 (what no annotation reads as) is where podcost wants it with no write
        (``podcost_core.implied``) from then on."""
        now = time.perf_counter()
        for pod in decision.costs:
            if pod.cost == 0 and pod.name in self.ready_at and pod.name not in self.costs:
                self.unwritten_at.setdefault(pod.name, now)

    def settled_at(self) -> dict[str, float]:
        """Per Ready pod, when it first carried its decided cost: annotated, or decided to
        need none."""
        return {**self.unwritten_at, **{
            name: min(at, self.unwritten_at.get(name, at)) for name, at in self.annotated_at.items()
        }}  # fmt: skip

    def unwritten(self) -> set[str]:
        """Pods that carried their decided cost without a write before any annotation."""
        return {
            name for name, at in self.unwritten_at.items() if self.annotated_at.get(name, at) >= at
        }

    def latencies(self) -> list[float]:
        return [at - self.ready_at[name] for name, at in self.settled_at().items()]

    def progress(self) -> str:
        return (f"{len(self.ready_at)} Ready, {len(self.annotated_at)} of them annotated since, "
                f"{len(self.unwritten_at)} decided to need none")  # fmt: skip

    def __call__(self, change: Change) -> None:
        now = time.perf_counter()
        pod = change.new
        if pod is None:
            return
        name = pod["metadata"]["name"]
        cost = (pod["metadata"].get("annotations") or {}).get(DELETION_COST_ANNOTATION)
        if cost is not None:
            self.costs[name] = int(cost)
        conditions = pod.get("status", {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        if ready and name not in self.ready_at:
            self.ready_at[name] = now
            if cost is not None:
                self.before_ready += 1
        if cost is not None and name in self.ready_at and name not in self.annotated_at:
            self.annotated_at[name] = now


async def read_decisions(
    reader: Consumer, clock: PodClock, decisions: list[DesiredCostsMessage]
) -> None:
    """Every decision on the costs topic as the bench reads it, until cancelled: kept in
    ``decisions`` and noted by ``clock``."""
    while True:
        for record in await reader.poll(max_wait=0.5):
            decision = decode(DesiredCostsMessage, record.value, record.headers)
            decisions.append(decision)
            clock.decided(decision)


async def latency(
    mode: Mode, api: Any, helpers: KubeTestCluster, node_label: Mapping[str, str],
    args: argparse.Namespace,
) -> Latency:  # fmt: skip
    namespace = await helpers.create_namespace(f"bench-pipeline-b-{uuid.uuid4().hex[:5]}")
    kube = Kube(api)
    counting = CountingPods(kube)
    settings = AnnotatorSettings(group=f"bench-{uuid.uuid4().hex[:6]}")  # the default budget
    pipeline = build_pipeline(mode, kube, namespace, lambda _: counting, settings, dry_run=False)
    clock = PodClock()
    decisions: list[DesiredCostsMessage] = []
    deployments = [f"web-{i}" for i in range(args.deployments)]
    replicas = dict.fromkeys(deployments, 2)
    try:
        async with running(pipeline):
            topics = pipeline.bus_settings.topics
            reader = pipeline.bus.consumer(
                [topics.costs_for(CLUSTER)], group=f"bench-reader-{uuid.uuid4()}"
            )
            watch = Informer(kube, (POD,), namespace=namespace, handlers=(clock,))
            async with reader, watch:
                await watch.wait_synced()

                reading = asyncio.create_task(
                    read_decisions(reader, clock, decisions), name="decisions"
                )
                try:
                    for name in deployments:
                        await helpers.create_deployment(
                            namespace, name, replicas[name], opt_in=True, node_selector=node_label
                        )
                    for round_ in range(args.rounds):
                        await asyncio.sleep(args.round_seconds)
                        name = deployments[round_ % len(deployments)]
                        replicas[name] += args.scale_by
                        await helpers.scale(namespace, name, replicas[name])
                    total = sum(replicas.values())
                    await until(lambda: len(clock.settled_at()) >= total,
                                f"{total} pods Ready and annotated", 120)  # fmt: skip
                    # Settle: the last decisions written, nothing more in flight.
                    await until(
                        lambda: (pipeline.annotator.metrics.get_sample_value(
                            "podcost_queue_depth") or 0) == 0, "the annotator idle", 60,
                    )  # fmt: skip
                    await asyncio.sleep(2.0)
                finally:
                    reading.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reading
    finally:
        await helpers.delete_namespace(namespace)
    minimum, last = minimum_writes(decisions)
    wrong = sum(1 for pod, cost in last.items() if clock.costs.get(pod, 0) != cost)
    latencies = clock.latencies()
    print(f"\n[{mode.name}] b/c. {len(latencies)} pods of {len(deployments)} opted-in "
          f"Deployments made Ready by kwok ({args.rounds} scale-ups of {args.scale_by}, every "
          f"{args.round_seconds:g}s); {len(decisions)} decisions, {counting.total} PATCHes, "
          f"minimum {minimum}; {len(clock.unwritten())} pods carried their decided cost 0 "
          f"without an annotation (timed to that decision)")  # fmt: skip
    return Latency(mode, len(latencies), latencies, clock.before_ready, counting.total, minimum,
                   len(decisions), wrong)  # fmt: skip


async def latency_processes(
    mode: Mode, api: Any, helpers: KubeTestCluster, node_label: Mapping[str, str],
    kubeconfig: str, args: argparse.Namespace,
) -> Latency:  # fmt: skip
    """b and c with every service in its own OS process: the core as in
    ``throughput_processes``, and the real ``podcost watcher`` and ``podcost annotator``
    commands as the chart's agent mode starts them (``chart_specs``; no leader election), against
    the real control plane; the annotator writes with its default budget. The PATCH requests are
    the annotator's own count (``podcost_patches_total``: written, and refused swaps retried)."""
    assert mode.kafka is not None, "over Kafka"
    namespace = await helpers.create_namespace(f"bench-pipeline-b-{uuid.uuid4().hex[:5]}")
    run = uuid.uuid4().hex[:8]
    helm = build.ensure_helm()
    core = procs.chart_core_specs(helm, mode.kafka, run)
    topics_env = {k: v for k, v in core[0].env.items() if k.startswith("PODCOST_TOPIC_")}
    agent = chart_specs(helm, {
        "mode": "agent", "clusterName": CLUSTER, "leaderElection": {"enabled": False},
        "watch": {"namespace": namespace}, "log": {"format": "text", "level": "WARNING"},
        "kafka": {"bootstrapServers": mode.kafka, "topics": {
            kind: topics_env[f"PODCOST_TOPIC_{kind.upper()}"]
            for kind in ("workloads", "ranks", "costs", "deadletter")}},
    })  # fmt: skip
    bus_settings = BusSettings(
        bootstrap_servers=mode.kafka,
        **{f"topic_{k.removeprefix('PODCOST_TOPIC_').lower()}": v for k, v in topics_env.items()},
    )
    kube = Kube(api)
    clock = PodClock()
    decisions: list[DesiredCostsMessage] = []
    deployments = [f"web-{i}" for i in range(args.deployments)]
    replicas = dict.fromkeys(deployments, 2)
    try:
        with tempfile.TemporaryDirectory(prefix="podcost-bench-procs-") as tmp:
            env = {"KUBECONFIG": kubeconfig, "PODCOST_ANNOTATOR_GROUP": f"bench-{run}"}
            async with (
                processes([*core, *agent], env=env, log_dir=Path(tmp), ready_timeout=180)
                as running,
                open_bus(bus_settings) as bus,
            ):  # fmt: skip
                annotator = running["annotator"]
                reader = bus.consumer(
                    [bus_settings.topics.costs_for(CLUSTER)], group=f"bench-reader-{run}"
                )
                watch = Informer(kube, (POD,), namespace=namespace, handlers=(clock,))
                async with reader, watch:
                    await watch.wait_synced()

                    async def idle() -> bool:
                        return await annotator.sample("podcost_queue_depth") == 0

                    reading = asyncio.create_task(
                        read_decisions(reader, clock, decisions), name="decisions"
                    )
                    try:
                        for name in deployments:
                            await helpers.create_deployment(
                                namespace, name, replicas[name], opt_in=True,
                                node_selector=node_label,
                            )  # fmt: skip
                        for round_ in range(args.rounds):
                            await asyncio.sleep(args.round_seconds)
                            name = deployments[round_ % len(deployments)]
                            replicas[name] += args.scale_by
                            await helpers.scale(namespace, name, replicas[name])
                        total = sum(replicas.values())
                        try:
                            await until(lambda: len(clock.settled_at()) >= total,
                                        f"{total} pods Ready and annotated", 180)  # fmt: skip
                        except RuntimeError as error:
                            raise RuntimeError(f"{error}: {clock.progress()}") from None
                        if not await holds_within_async(idle, 60):
                            raise RuntimeError("timed out waiting for the annotator to be idle")
                        await asyncio.sleep(2.0)
                        patches = int(
                            await annotator.sample("podcost_patches_total", result="ok")
                            + await annotator.sample("podcost_patches_total", result="conflict")
                        )
                    finally:
                        reading.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await reading
    finally:
        await helpers.delete_namespace(namespace)
    minimum, last = minimum_writes(decisions)
    wrong = sum(1 for pod, cost in last.items() if clock.costs.get(pod, 0) != cost)
    latencies = clock.latencies()
    print(f"\n[{mode.name}] b/c. {len(latencies)} pods of {len(deployments)} opted-in "
          f"Deployments made Ready by kwok ({args.rounds} scale-ups of {args.scale_by}, every "
          f"{args.round_seconds:g}s); {len(decisions)} decisions, {patches} PATCHes (the "
          f"annotator's count), minimum {minimum}; {len(clock.unwritten())} pods "
          f"carried their decided cost 0 without an annotation (timed to that decision)"
    )  # fmt: skip
    return Latency(mode, len(latencies), latencies, clock.before_ready, patches, minimum,
                   len(decisions), wrong)  # fmt: skip


def minimum_writes(decisions: Sequence[DesiredCostsMessage]) -> tuple[int, dict[str, int]]:
    """Writes the labelling asked for: per pod, each change of its decided cost, starting from
    what it carried when first decided; and each pod's last decided cost."""
    last: dict[str, int | None] = {}
    needed = 0
    for decision in decisions:
        for pod in decision.costs:
            before = last.get(pod.name, pod.previous)
            if pod.cost != before:
                needed += 1
            last[pod.name] = pod.cost
    return needed, {pod: cost for pod, cost in last.items() if cost is not None}


# --- the report --------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


ROWS = (
    ("a. sustained pod events/s, lag bounded", f"{GOAL_EVENTS_PER_S:,}"),
    ("   ratio to the goal", "1.00"),
    ("   ratio to embedded mode", f">= {GOAL_KAFKA_RATIO:.2f}"),
    ("   snapshots/s at that rate", ""),
    ("   max consumer lag at that rate (records)", "bounded"),
    ("   first offered rate not bounded (events/s)", ""),
    ("b. Ready -> annotation p50", ""),
    ("   Ready -> annotation p99", "<= 500 ms embedded, <= 1,000 ms Kafka"),
    ("   pods measured (of which annotated before Ready)", ""),
    ("c. PATCH requests / minimum", f"{GOAL_PATCH_RATIO:.2f}"),
    ("   pods not at their last decided cost", "0"),
)


def column(throughput: Throughput, latency: Latency, embedded: Step | None) -> list[str]:
    """One mode's figures, in the order of ``ROWS``; ``embedded``: embedded mode's best step."""
    best = throughput.best
    if throughput.mode.kafka is None or embedded is None:
        to_embedded = "-"
    else:
        to_embedded = f"{best.rate / embedded.rate:.2f}" if best else "0"
    measured_b = bool(latency.latencies) or latency.patches > 0
    unbounded = next((f"{s.rate:,.0f}" for s in throughput.steps if not s.bounded), "none")
    ratio = latency.patches / latency.minimum if latency.minimum else float("nan")
    return [
        f"{best.rate:,.0f}" if best else "none",
        f"{best.rate / GOAL_EVENTS_PER_S:.2f}" if best else "0",
        to_embedded,
        f"{best.per_second(lambda s: s.snapshots):.0f}" if best else "-",
        f"{best.max_lag:.0f}" if best else "-",
        unbounded,
        ms(statistics.median(latency.latencies)) if latency.latencies else "-",
        ms(latency.quantile(0.99)) if latency.latencies else "-",
        f"{latency.pods} ({latency.before_ready})" if measured_b else "not measured",
        f"{latency.patches} / {latency.minimum} = {ratio:.2f}" if measured_b else "-",
        str(latency.wrong) if measured_b else "-",
    ]


def record_results(
    results: Sequence[tuple[Mode, Throughput, Latency]], args: argparse.Namespace
) -> None:
    """The headline figures of parts a and b, one row each in the results table."""
    if "a" in args.parts and results:
        figures = []
        for mode, throughput, _ in results:
            best = throughput.best
            unbounded = next((s.rate for s in throughput.steps if not s.bounded), None)
            figures.append(
                f"{mode.label}: "
                + (f"{best.rate:,.0f} events/s sustained" if best else "no offered rate sustained")
                + ("" if unbounded is None else f", {unbounded:,.0f} not")
            )
        record_row(
            "bench_pipeline",
            "the whole pipeline (watcher, a ranker per strategy, aggregator, annotator), "
            f"{results[0][1].fleet}: pod events/s sustained with bounded consumer lag",
            figures,
            variant="throughput",
        )
    if "b" in args.parts and results:
        figures = []
        for mode, _, latency in results:
            if latency.latencies:
                figures.append(
                    f"{mode.label}: p50 {ms(statistics.median(latency.latencies))}, "
                    f"p99 {ms(latency.quantile(0.99))}; PATCH requests / minimum "
                    f"{latency.patches} / {latency.minimum}"
                )
        record_row(
            "bench_pipeline",
            f"pod Ready -> the pod carries its decided cost, on the real control plane, "
            f"{results[0][2].pods} pods; PATCH requests against the writes the decisions asked for",
            figures,
            variant="latency",
        )


def table(results: Sequence[tuple[Mode, Throughput, Latency]]) -> None:
    """The summary: a column per mode, the goal last."""
    embedded = next((t.best for mode, t, _ in results if mode.kafka is None), None)
    columns = [column(throughput, latency, embedded) for _, throughput, latency in results]
    headers = ["", *(mode.label for mode, _, _ in results), "goal"]
    body = [
        [label, *(cells[index] for cells in columns), goal]
        for index, (label, goal) in enumerate(ROWS)
    ]
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    print(f"\n{rule}")
    for index, cells in enumerate([headers, *body]):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |")
        if index == 0:
            print(rule)
    print(rule)


# --- setup -------------------------------------------------------------------------------------


async def read_templates(api: Any, helpers: KubeTestCluster, label: Mapping[str, str]) -> Templates:
    """One real pod, its ReplicaSet, Deployment and node, as the API serves them."""
    namespace = await helpers.create_namespace(f"bench-pipeline-t-{uuid.uuid4().hex[:5]}")
    try:
        await helpers.create_deployment(namespace, "template", 1, node_selector=label)
        await helpers.wait_ready(namespace, "template", 1)
        objects = (await Kube(api).dump(namespace))["items"]
    finally:
        await helpers.delete_namespace(namespace)
    pod = next(o for o in objects if o["kind"] == "Pod")

    def one(kind: str, name: str) -> RawObject:
        found: RawObject = next(
            o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name
        )
        return found

    replicaset = one("ReplicaSet", pod["metadata"]["ownerReferences"][0]["name"])
    deployment = one("Deployment", replicaset["metadata"]["ownerReferences"][0]["name"])
    return Templates(pod, replicaset, deployment, one("Node", pod["spec"]["nodeName"]))


async def bench(kubeconfig: str, brokers: str | None, args: argparse.Namespace) -> None:
    api = await config.new_client_from_config(config_file=kubeconfig)
    async with api:
        helpers = KubeTestCluster(api)
        run = uuid.uuid4().hex[:5]
        label = {"bench-pipeline": run}
        nodes = {(zone, spot): f"bench-pipeline-{run}-{zone}-{'spot' if spot else 'od'}"
                 for zone in ZONES for spot in (False, True)}  # fmt: skip
        stack = contextlib.ExitStack()
        try:
            await asyncio.gather(*(
                helpers.create_node(name, zone=zone, labels=label, pods="200",
                                    capacity_type="spot" if spot else "on-demand")
                for (zone, spot), name in nodes.items()
            ))  # fmt: skip
            templates = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "t.json"
            templates.write_text(json.dumps(asdict(await read_templates(api, helpers, label))))
            modes = []
            chosen = args.modes.split(",")
            if "embedded" in chosen:
                modes.append(Mode("embedded", None))
            if "kafka" in chosen and brokers:
                modes.append(Mode("kafka", brokers))
            if "kafka-procs" in chosen and brokers:
                modes.append(Mode("kafka-procs", brokers, processes=True))
            results: list[tuple[Mode, Throughput, Latency]] = []
            for mode in modes:
                if "b" not in args.parts:
                    got_latency = Latency(mode, 0, [], 0, 0, 0, 0, 0)
                elif mode.processes:
                    got_latency = await latency_processes(
                        mode, api, helpers, label, kubeconfig, args
                    )
                else:
                    got_latency = await latency(mode, api, helpers, label, args)
                if "a" not in args.parts:
                    got_throughput = Throughput(mode, "", 0, [])
                elif mode.processes:
                    got_throughput = await throughput_processes(
                        mode, helpers, templates, kubeconfig, args
                    )
                else:
                    got_throughput = await throughput(mode, api, helpers, templates, args)
                results.append((mode, got_throughput, got_latency))
            if not all(mode.processes for mode in modes):
                print(
                    "\nMethod: every service in this one process (one core of the 2); a: synthetic "
                    "watch events into the watcher's informer path, annotator in dry-run reading "
                    "the watcher's cache (the synthetic pods exist only there); b/c: the real "
                    "control plane, kwok making pods Ready, the annotator writing with its default "
                    "budget (20 requests/s, burst 40)."
                )
            if any(mode.processes for mode in modes):
                print(
                    "\nKafka, one process per service: the rankers and the aggregator are `podcost "
                    "ranker`/`podcost aggregator` processes started as the chart's core mode "
                    "starts them; the watcher and the annotator each run in a process of their "
                    "own (tests/bench/bench_agent.py bootstraps the real services) in a, the real "
                    "`podcost watcher`/`podcost annotator` commands (chart agent mode) in b. In a, "
                    "the annotator's pod reads are answered from its own view of the synthetic "
                    "cluster (the same events' metadata, as its metadata-only informer keeps "
                    "them) "
                    "INSTEAD OF THE API SERVER: no real API server here serves 5,000 synthetic "
                    "pod events/s. Lags from each process's /metrics."
                )
            table(results)
            record_results(results, args)
        finally:
            stack.close()
            await helpers.delete_nodes(list(nodes.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--rates",
        type=lambda value: [float(rate) for rate in value.split(",")],
        default=[250, 1000, 2500, 5000],
        help="offered pod events/s, one step each",
    )
    parser.add_argument("--step-seconds", type=float, default=8.0)
    parser.add_argument(
        "--drain-seconds", type=float, default=8.0, help="longest wait for a step's backlog"
    )
    parser.add_argument("--workloads", type=int, default=40)
    parser.add_argument("--pods", type=int, default=25, help="per workload")
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--deployments", type=int, default=3, help="b: opted-in Deployments")
    parser.add_argument("--rounds", type=int, default=12, help="b: scale-ups")
    parser.add_argument("--scale-by", type=int, default=4, help="b: pods added per scale-up")
    parser.add_argument("--round-seconds", type=float, default=1.5)
    parser.add_argument("--modes", default="embedded,kafka,kafka-procs")
    parser.add_argument("--parts", default="a,b", help="a: throughput; b: latency and PATCHes")
    parser.add_argument("--profile", default=None, help="directory for cProfile stats of a")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds for the whole run, then it stops with an error [a bound from the steps]",
    )
    parser.add_argument("--churn-from", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--copy-to", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.broker_pid = None
    if args.churn_from:
        churn_main(args)
        return
    with contextlib.ExitStack() as stack:
        if os.environ.get("PODCOST_USE_KUBECONFIG") == "1" and os.environ.get("KUBECONFIG"):
            kubeconfig = os.environ["KUBECONFIG"]
        else:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            control_plane = cluster.start(run_dir / "cluster")
            stack.callback(control_plane.stop)
            kubeconfig = str(control_plane.kubeconfig)
        brokers = os.environ.get("PODCOST_KAFKA")
        if not brokers and any(m.startswith("kafka") for m in args.modes.split(",")):
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="podcost-")))
            broker = kafka.start(run_dir / "kafka")
            stack.callback(broker.stop)
            brokers = broker.bootstrap
            args.broker_pid = broker.pid
        limit = args.timeout if args.timeout is not None else run_bound(args)
        try:
            asyncio.run(asyncio.wait_for(bench(kubeconfig, brokers, args), limit))
        except TimeoutError:
            # The run's processes and nodes are already stopped and deleted (the cancellation
            # went through every ``async with``/``finally``); the servers stop on the way out.
            print(f"bench_pipeline: the run did not end within {limit:g}s", file=sys.stderr)
            stack.close()
            sys.exit(1)


def run_bound(args: argparse.Namespace) -> float:
    """A bound on the whole run, far beyond what a healthy one takes: per mode, every step and
    its longest drain three times over, the latency part's rounds likewise, and five minutes of
    starting and stopping processes; at least fifteen minutes."""
    modes = len(args.modes.split(","))
    steps = len(args.rates) * (args.step_seconds + args.drain_seconds) if "a" in args.parts else 0
    rounds = args.rounds * args.round_seconds + 120 if "b" in args.parts else 0
    return max(900.0, modes * (3 * (steps + rounds) + 300))


if __name__ == "__main__":
    main()
