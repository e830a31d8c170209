"""Scale benchmark on the real control plane: how large a cluster podcost and this machine's
control plane hold, and what podcost costs there.

A script, not a test (not part of ``make test``)::

    uv run python -m tests.bench.bench_scale --pods 10000,50000,150000 --pods-per-node 30
    uv run python -m tests.bench.bench_scale --pods 5000,10000 --service watcher

It starts its own control plane in a temporary directory (``podcost_localinfra``: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler at qps 500, kwok running nodes and
pods; ``--nodes-to-score-percent`` sets the scheduler's ``percentageOfNodesToScore``, which by
default has it filter and score a third of 1,667 nodes for every pod, and ``--kwok-parallelism``
how many pods kwok moves on at once, 4 by default), or uses the cluster of ``$KUBECONFIG`` when
``PODCOST_USE_KUBECONFIG=1`` (then the control plane's processes are not on this machine and
their RSS/CPU read "n/a"; what the bench created is deleted at the end).

Method, for each size of ``--pods`` in turn (the cluster grows step by step, never shrinks):

1. **Grow.** Create the missing kwok nodes (``ceil(pods / --pods-per-node)``; zones ``z0..z2``
   round robin, every ``--spot-every``-th node ``karpenter.sh/capacity-type=spot``, the rest
   ``on-demand``) with ``--concurrency`` requests in flight, then the missing opted-in
   Deployments (``podcost.dev/enabled: "true"``, ``--replicas`` pods each) in namespace
   ``scale``, or round robin over ``scale-0`` … with ``--namespaces``. Pods are *not* pinned:
   the real scheduler places them (its pods/s is measured from
   its ``scheduler_schedule_attempts_total{result="scheduled"}``). Printed: time until every node
   is Ready, until every Deployment reports all replicas ready (kwok runs them), the scheduler's
   pods/s, and the RSS of etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
   (``/proc``), etcd's database size.
2. **podcost.** A fresh ``podcost run`` (embedded mode: watcher, rankers, aggregator and
   annotator in one OS process over the in-memory bus; cluster-wide watch; the chart's defaults
   unless ``--annotator-qps``) is started against the cluster as it is. *Initial sync* is the time
   from the process's start until its log says ``watcher synced`` (imports included; polled
   every 0.1 s). *First decision for every workload* is the time until ``/readyz`` answers 200:
   the embedded annotator is not ready until it has written the decisions of the watcher's first
   pass (every opted-in workload once). *Nothing left to write* is the time until
   ``podcost_queue_depth`` and ``podcost_consumer_lag`` are 0 and ``podcost_patches_total``
   has not moved for 5 s. Both are bounded by the annotator's write budget (20 writes/s by
   default; a first costing writes about one PATCH per new pod): for a large run pass
   ``--annotator-qps`` (e.g. 200) or expect ``new pods / 20`` seconds per step.
   *Memory per pod*: the process's RSS once converged minus the RSS of the same command run
   against the empty cluster at the start (``baseline``), divided by the cluster's pods.
3. **Steady state.** ``--steady-seconds`` with nothing changing: PATCHes counted by podcost
   (``podcost_patches_total``) and by the API server (``apiserver_request_total{verb="PATCH",
   resource="pods",subresource=""}`` delta: metadata patches only; kwok's status patches are the
   ``status`` subresource). Goal 0. The CPU of every process over this window is the idle CPU.
4. **Churn.** ``--churn-seconds`` at ``--churn-rate`` operations/s, alternately deleting a random
   pod (its ReplicaSet replaces it) and scaling a random Deployment one up (and that one down
   again on the next scale operation). Events/s is the rate of pod watch events a cluster-wide
   watch of the bench's own receives (what the watcher's pod informer receives as well).
   *Event → cost latency* p50/p99 is **podcost's own histogram**
   ``podcost_event_to_annotation_seconds`` (from the change that caused a snapshot to the patch
   that wrote its cost; only changes that led to a write), its bucket deltas over the window
   interpolated as Prometheus' ``histogram_quantile`` does: a bucket's resolution (…, 0.5, 1,
   2.5, 5 s …). *CPU per 1,000 events/s* of each process is (CPU during churn − idle CPU) /
   (events/s during churn − events/s idle) × 1000, in cores. Writes during the churn are
   ``podcost_patches_total`` by ``result`` (only ``ok`` is a PATCH the API server took; the
   others are attempts that wrote nothing) next to the API server's count of pod PATCHes.
5. ``podcost run`` is stopped (SIGTERM) before the next step.

``--service watcher`` measures the fleet's per-cluster ``podcost watcher`` alone instead of
``podcost run``: over a real Kafka broker (``podcost_localinfra.kafka``, the one
``bench_fleet.py`` starts; or ``$PODCOST_KAFKA``'s), with ``PODCOST_CLUSTER=scale``, and no
annotator (the watcher needs none: it only publishes snapshots; nothing writes costs, so there
are no PATCHes and no event → cost latency to report). Its baseline is the same command against
the empty cluster: its RSS once synced, and once settled (its ``podcost_snapshots_published_total``
unchanged for 5 s, then 5 s more). Per step: *initial sync* (process start to the log's
``watcher synced``); RSS per pod above the baseline's at sync; *first pass published* (to the
log's ``first pass published``: every opted-in workload's snapshot queued on the bus); RSS per
pod above the settled baseline once the first pass is published and it has settled, and again
after the churn has settled. The steady state and the churn are steps 3 and 4 (CPU per 1,000
events/s of the watcher and of the broker; snapshots published instead of writes).

``--heap-dump DIR`` attributes podcost's memory: every ``podcost run`` (or ``podcost watcher``)
gets ``PODCOST_HEAP_DUMP=DIR/run<n>`` (``podcost.runtime.heap``), traces its allocations with
``--heap-frames`` frames (slower: the timings of such a run mean nothing) and dumps its heap at
sync and once converged (the watcher: once settled, again after the churn, and its baseline
once settled); the bench prints the allocation sites that grew between the first two, in bytes
per pod (``tests.bench.heap_diff``; run it on two files with ``--by traceback`` for who called).
``--heap-frames 0`` traces nothing (the RSS is as usual) and prints pymalloc's account of its
arenas at both points: how much of the RSS it holds, and how much of that is in use.

A step fails (and, with ``--keep-going``, growth stops there but the summary is still printed)
when a wait times out (timeouts scale with the size: ``--timeout-per-1k`` seconds per 1,000 new
pods, at least 300 s), a request fails, a process dies, or MemAvailable falls under
``--min-free-gib`` before growing. The last line says the largest size reached and what stopped
it. Everything started is stopped on exit, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import contextlib
import json
import math
import os
import random
import re
import signal
import ssl
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families
from tests.bench import heap_diff
from tests.bench.procs import usage
from tests.support.services import ServiceProcess, ServiceSpec, metric_key, sample, series

from podcost.runtime.metrics import LATENCY_BUCKETS
from podcost_localinfra import cluster, kafka

NAMESPACE = "scale"
#: A label on every Deployment the bench creates (not on their pods), whatever its namespace.
BENCH_LABEL = "podcost-bench=scale"
NODE_PREFIX = "scale-n"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
PODCOST = "podcost-run"
WATCHER = "podcost-watcher"
#: The cluster name the bench's ``podcost watcher`` publishes as (``PODCOST_CLUSTER``).
CLUSTER = "scale"
#: Seconds without a write (and an empty queue) that count as "nothing left to write".
QUIET = 5.0

# --- pure helpers -------------------------------------------------------------------------------


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a histogram given as cumulative ``(upper bound, count)`` buckets
    (``+Inf`` last), interpolated linearly inside a bucket as Prometheus does; ``None`` when the
    histogram is empty; ``inf`` when it lies in the ``+Inf`` bucket (beyond the last bound: where
    Prometheus would say the last finite bound)."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return math.inf
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def bucket_deltas(
    before: Mapping[str, float], after: Mapping[str, float], name: str
) -> list[tuple[float, float]]:
    """``(le, count after − count before)`` for every ``<name>_bucket`` sample of ``after``."""
    out = []
    for key, value in after.items():
        match = re.match(rf'^{re.escape(name)}_bucket\{{.*le="([^"]+)".*\}}$', key)
        if match:
            out.append((float(match.group(1)), value - before.get(key, 0.0)))
    return out


def parse_summed(text: str, prefixes: Iterable[str] = ()) -> dict[str, float]:
    """Prometheus text → ``{metric_key: value}``, samples of the same key summed (embedded mode
    serves one registry per service, so a name can appear once per service). With ``prefixes``
    only the lines of those metric names are parsed (an API server's page is large)."""
    wanted = tuple(prefixes)
    if wanted:
        comments = tuple(f"# {kind} {p}" for kind in ("TYPE", "HELP") for p in wanted)
        lines = text.splitlines()
        text = "\n".join(line for line in lines if line.startswith((*wanted, *comments)))
        text += "\n"
    parsed: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for item in family.samples:
            key = metric_key(item.name, **item.labels)
            parsed[key] = parsed.get(key, 0.0) + float(item.value)
    return parsed


def patches_by_result(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """``podcost_patches_total`` by its ``result`` label (ok = a PATCH the API server took;
    gone, conflict, throttled, error, dry_run, skipped_foreign, refused: no write), ``after``
    minus ``before``; results that did not move are left out."""
    moved = {}
    for labels, value in series(after, "podcost_patches_total"):
        delta = value - sample(before, "podcost_patches_total", **labels)
        if delta:
            result = labels.get("result", "")
            moved[result] = moved.get(result, 0.0) + delta
    return moved


def per_thousand(busy: float, idle: float, rate: float, idle_rate: float) -> float | None:
    """Cores per 1,000 events/s: the extra CPU (``busy − idle``, in cores) over the extra event
    rate; ``None`` when the rate did not rise."""
    extra = rate - idle_rate
    if extra <= 0:
        return None
    return max(0.0, busy - idle) / extra * 1000


@dataclass(frozen=True)
class Layout:
    """What the cluster holds at one size."""

    pods: int
    nodes: int
    deployments: int
    replicas: int


def layout(pods: int, pods_per_node: int, replicas: int) -> Layout:
    """Deployments of ``replicas`` pods (rounded up to whole Deployments) on one node per
    ``pods_per_node`` pods."""
    deployments = max(1, -(-pods // replicas))
    total = deployments * replicas
    return Layout(total, max(1, -(-total // pods_per_node)), deployments, replicas)


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 2**20:,.0f} MiB" if abs(value) >= 2**20 else f"{value / 1024:,.1f} KiB"


def fmt(value: float | None, spec: str = ".1f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def stamp(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}Z] {message}", flush=True)


def log_interval(text: str, first: str, second: str) -> float | None:
    """Seconds between the first log line containing ``first`` and the first one containing
    ``second`` after it, by the lines' UTC timestamps (``YYYY-mm-ddTHH:MM:SS.mmmZ``)."""
    found: list[float] = []
    for line in text.splitlines():
        if (first if not found else second) in line:
            match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z", line)
            if match is None:
                return None
            moment = time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")
            found.append(calendar.timegm(moment) + int(match.group(2)) / 1000)
            if len(found) == 2:
                return found[1] - found[0]
    return None


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


# --- the control plane from outside --------------------------------------------------------------


class ControlPlane:
    """The daemons of a ``podcost_localinfra`` run directory (pids, ports), or nothing."""

    def __init__(self, run_dir: Path | None) -> None:
        self.pids: dict[str, int] = {}
        self.ports: dict[str, str] = {}
        if run_dir is None:
            return
        for pid_file in (run_dir / "pids").glob("[0-9][0-9]-*.pid"):
            name = pid_file.stem.split("-", 1)[1]
            self.pids[name] = int(pid_file.read_text().strip())
            command = json.loads((run_dir / "pids" / f"{name}.command.json").read_text())
            for arg in command.get("argv", []) if isinstance(command, dict) else command:
                if match := re.match(r"--(?:secure-port|listen-client-urls)=(.*)", arg):
                    self.ports[name] = match.group(1)

    def rss(self) -> dict[str, int]:
        return {name: u.rss_bytes for name, pid in self.pids.items() if (u := usage(pid))}

    def _get(self, url: str) -> str:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with urllib.request.urlopen(url, timeout=30, context=context) as response:
            return str(response.read().decode())

    async def scrape(self, name: str, prefixes: Sequence[str]) -> dict[str, float]:
        """``/metrics`` of a daemon that serves them without credentials (scheduler, etcd)."""
        port = self.ports.get(name)
        if port is None:
            return {}
        url = f"{port}/metrics" if port.startswith("http") else f"https://127.0.0.1:{port}/metrics"
        try:
            return parse_summed(await asyncio.to_thread(self._get, url), prefixes)
        except OSError:
            return {}


async def apiserver_metrics(api: client.ApiClient, prefixes: Sequence[str]) -> dict[str, float]:
    response = await api.call_api(
        "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False,
        header_params={"Accept": "text/plain"},
    )  # fmt: skip
    try:
        text = (await response.read()).decode()
    finally:
        response.release()
    return parse_summed(text, prefixes)


def pod_patches(metrics: Mapping[str, float]) -> float:
    return sample(metrics, "apiserver_request_total", verb="PATCH", resource="pods",
                  subresource="")  # fmt: skip


# --- growing the cluster --------------------------------------------------------------------------


async def bounded(concurrency: int, jobs: Iterable[Callable[[], Awaitable[Any]]]) -> None:
    limit = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[Any]]) -> None:
        async with limit:
            await job()

    await asyncio.gather(*(one(job) for job in jobs))


def node_body(index: int, spot_every: int, max_pods: int) -> dict[str, Any]:
    name = f"{NODE_PREFIX}{index}"
    capacity = "spot" if spot_every and index % spot_every == 0 else "on-demand"
    allocatable = {"cpu": "32", "memory": "128Gi", "pods": str(max_pods)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                "topology.kubernetes.io/zone": f"z{index % 3}",
                                "karpenter.sh/capacity-type": capacity}},
        "spec": {},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }  # fmt: skip


def namespaces(count: int) -> list[str]:
    """The bench's namespaces: ``scale`` alone, or ``scale-0`` … ``scale-<count-1>``."""
    return [NAMESPACE] if count == 1 else [f"{NAMESPACE}-{k}" for k in range(count)]


def deployment_body(index: int, replicas: int) -> dict[str, Any]:
    labels = {"app": f"d{index}"}
    key, value = BENCH_LABEL.split("=")
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"d{index}", "labels": {**labels, key: value},
                     "annotations": {"podcost.dev/enabled": "true"}},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "containers": [{"name": "app", "image": "registry.local/podcost/app:1"}],
                "terminationGracePeriodSeconds": 0,
            }},
        },
    }  # fmt: skip


def show_growth(before: Path | None, after: Path | None, pods: int, between: str) -> None:
    """Print what grew between two heap dumps (``tests.bench.heap_diff``), in bytes per pod."""
    if not (before and after and before.exists() and after.exists()):
        return
    stamp(f"  what grew between {between} (tests.bench.heap_diff)")
    for line in heap_diff.diff(str(before), str(after), by="lineno", top=30, pods=pods, frames=1):
        print("   ", line, flush=True)


async def created(make: Callable[[], Awaitable[Any]]) -> None:
    """``make()``, a 409 (already there: a step retried) being fine; 429/5xx retried."""
    for attempt in range(20):
        try:
            await make()
            return
        except ApiException as error:
            if error.status == 409:
                return
            if error.status not in (429, 500, 503, 504) or attempt == 19:
                raise
            await asyncio.sleep(min(5.0, 0.2 * 2**attempt))


async def paged(list_page: Callable[..., Awaitable[Any]], **kwargs: Any) -> list[Any]:
    items, token = [], None
    while True:
        page = await list_page(limit=500, _continue=token, **kwargs)
        items.extend(page.items)
        token = page.metadata._continue
        if not token:
            return items


async def wait_until(
    check: Callable[[], Awaitable[tuple[bool, str]]], what: str, timeout: float,
    interval: float = 5.0, progress: float = 30.0,
) -> float:  # fmt: skip
    """Poll ``check()`` (done, progress text) until done; progress lines every ``progress`` s;
    ``TimeoutError`` naming ``what`` and the last progress after ``timeout``. Returns seconds."""
    start = time.monotonic()
    last_print = start
    while True:
        done, text = await check()
        now = time.monotonic()
        if done:
            return now - start
        if now - start > timeout:
            raise TimeoutError(f"{what}: not done after {timeout:.0f}s ({text})")
        if now - last_print >= progress:
            stamp(f"  waiting for {what}: {text} ({now - start:.0f}s)")
            last_print = now
        await asyncio.sleep(interval)


# --- the bench ------------------------------------------------------------------------------------


@dataclass
class Step:
    """What one size measured; ``None`` where it did not get that far."""

    target: Layout
    numbers: dict[str, Any] = field(default_factory=dict)
    grown: bool = False
    converged: bool = False
    failure: str | None = None


class Bench:
    def __init__(self, api: client.ApiClient, kubeconfig: str, args: argparse.Namespace,
                 plane: ControlPlane, log_dir: Path) -> None:  # fmt: skip
        self.api, self.kubeconfig, self.args, self.plane = api, kubeconfig, args, plane
        self.core, self.apps = client.CoreV1Api(api), client.AppsV1Api(api)
        self.log_dir = log_dir
        self.nodes = 0
        self.deployments = 0
        self.rng = random.Random(args.seed)
        self.namespaces = namespaces(args.namespaces)
        self.baseline_rss: int | None = None
        self.baseline_sync: float | None = None
        self.watcher_baseline_rss: int | None = None
        self.watcher_baseline_sync_rss: int | None = None
        self.runs = 0
        self.previous: tuple[int, int] | None = None
        """(pods, converged RSS of podcost run) of the last step that converged."""
        self.brokers: str | None = None
        """The Kafka broker ``podcost watcher`` publishes to (``--service watcher``)."""
        self.broker_pid: int | None = None

    # -- growth ----------------------------------------------------------------------------------

    def namespace_of(self, index: int) -> str:
        """The namespace of Deployment ``d<index>`` (round robin over ``--namespaces``)."""
        return self.namespaces[index % len(self.namespaces)]

    async def setup(self) -> None:
        for namespace in self.namespaces:
            with contextlib.suppress(ApiException):
                await self.core.create_namespace({"metadata": {"name": namespace}})
        for namespace in self.namespaces:
            for _ in range(120):
                accounts = await self.core.list_namespaced_service_account(namespace)
                if any(sa.metadata.name == "default" for sa in accounts.items):
                    break
                await asyncio.sleep(0.5)
            else:
                raise TimeoutError(f"no default service account in namespace {namespace}")

    async def grow(self, step: Step) -> None:
        target, args = step.target, self.args
        timeout = max(300.0, args.timeout_per_1k * (target.pods - self.deployments
                                                    * target.replicas) / 1000)  # fmt: skip
        max_pods = max(110, 2 * args.pods_per_node)
        sched_before = await self.plane.scrape("kube-scheduler", ["scheduler_schedule_attempts"])
        cpu_before = {k: u for k, pid in self.plane.pids.items() if (u := usage(pid))}
        grow_start = start = time.monotonic()
        new_nodes = range(self.nodes, target.nodes)
        stamp(f"creating {len(new_nodes):,} nodes ({self.nodes:,} → {target.nodes:,})")
        await bounded(args.concurrency, (
            lambda i=i: created(lambda: self.core.create_node(node_body(i, args.spot_every,
                                                                        max_pods)))
            for i in new_nodes))  # fmt: skip
        self.nodes = target.nodes
        step.numbers["nodes created s"] = time.monotonic() - start

        async def nodes_ready() -> tuple[bool, str]:
            nodes = await paged(self.core.list_node, label_selector="type=kwok")
            ready = sum(
                1
                for n in nodes
                if n.metadata.name.startswith(NODE_PREFIX)
                and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            )
            return ready >= target.nodes, f"{ready:,}/{target.nodes:,} Ready"  # fmt: skip

        await wait_until(nodes_ready, "nodes Ready", timeout)
        step.numbers["nodes Ready s"] = time.monotonic() - start

        start = time.monotonic()
        new = range(self.deployments, target.deployments)
        stamp(f"creating {len(new):,} Deployments of {target.replicas} "
              f"({self.deployments:,} → {target.deployments:,})")  # fmt: skip
        await bounded(args.concurrency, (
            lambda i=i: created(lambda: self.apps.create_namespaced_deployment(
                self.namespace_of(i), deployment_body(i, target.replicas)))
            for i in new))  # fmt: skip
        self.deployments = target.deployments
        step.numbers["pods new this step"] = len(new) * target.replicas
        step.numbers["deployments created s"] = time.monotonic() - start

        async def pods_ready() -> tuple[bool, str]:
            deployments = await paged(self.apps.list_deployment_for_all_namespaces,
                                      label_selector=BENCH_LABEL)  # fmt: skip
            ready = sum(d.status.ready_replicas or 0 for d in deployments)
            return ready >= target.pods, f"{ready:,}/{target.pods:,} pods ready"

        try:
            await wait_until(pods_ready, "pods Running", timeout)
        finally:
            took = time.monotonic() - start
            sched_after = await self.plane.scrape("kube-scheduler",
                                                  ["scheduler_schedule_attempts"])  # fmt: skip
            scheduled = sample(sched_after, "scheduler_schedule_attempts_total",
                               result="scheduled") - sample(
                sched_before, "scheduler_schedule_attempts_total", result="scheduled")  # fmt: skip
            unschedulable = sample(sched_after, "scheduler_schedule_attempts_total",
                                   result="unschedulable")  # fmt: skip
            step.numbers["pods Running s"] = took
            step.numbers["scheduler pods/s"] = scheduled / took if sched_after else None
            step.numbers["scheduler unschedulable (total)"] = unschedulable if sched_after else None
            step.numbers["pods Running/s"] = len(new) * target.replicas / took if took else None
            # Which daemon was busy while growing: a bottleneck shows as ~1 core or more.
            grow_cpu = cpu_since(self.plane.pids, cpu_before, time.monotonic() - grow_start)
            for name, cpu in sorted(grow_cpu.items(), key=lambda kv: -kv[1]):
                step.numbers[f"growth CPU {name}"] = cpu
        step.grown = True

    async def control_plane_numbers(self, step: Step) -> None:
        for name, rss in self.plane.rss().items():
            step.numbers[f"RSS {name}"] = rss
        etcd = await self.plane.scrape("etcd", ["etcd_mvcc_db_total_size_in_bytes"])
        step.numbers["etcd db size"] = etcd.get("etcd_mvcc_db_total_size_in_bytes")
        step.numbers["MemAvailable"] = mem_available()

    # -- podcost ----------------------------------------------------------------------------------

    def spec(self, service: str = PODCOST) -> ServiceSpec:
        env = {"PODCOST_LOG_FORMAT": "text", "PODCOST_LOG_LEVEL": "INFO"}
        if self.args.annotator_qps and service == PODCOST:
            env["PODCOST_ANNOTATOR_QPS"] = str(self.args.annotator_qps)
            env["PODCOST_ANNOTATOR_BURST"] = str(int(2 * self.args.annotator_qps))
        if self.args.heap_dump:
            env["PODCOST_HEAP_DUMP"] = str(self.args.heap_dump / f"run{self.runs}")
            env["PODCOST_HEAP_DUMP_FRAMES"] = str(self.args.heap_frames)
        if service == WATCHER:
            if self.brokers is None:
                raise RuntimeError("podcost watcher needs a Kafka broker")
            env["PODCOST_KAFKA"] = self.brokers
            env["PODCOST_CLUSTER"] = CLUSTER
            return ServiceSpec(WATCHER, ("watcher",), env)
        return ServiceSpec(PODCOST, ("run",), env)

    async def start_podcost(self, service: str = PODCOST) -> ServiceProcess:
        self.runs += 1
        proc = ServiceProcess(self.spec(service), env={"KUBECONFIG": self.kubeconfig},
                              log_dir=self.log_dir / f"run{self.runs}")  # fmt: skip
        await proc.start()
        return proc

    async def synced(
        self, proc: ServiceProcess, timeout: float, line: str = "watcher synced"
    ) -> tuple[float, float | None]:
        """Seconds from the start until the log has a line containing ``line`` (by default: the
        watcher synced), and from the log's ``podcost running`` (``podcost run``'s services
        started, imports done) to that line by the log's own timestamps (``None`` if either
        line is missing: ``podcost watcher`` logs no ``podcost running``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive:
                raise RuntimeError(f"{proc.spec.name} exited with {proc.returncode}:\n"
                                   f"{proc.log_tail()}")  # fmt: skip
            text = proc.log_path.read_text(errors="replace") if proc.log_path.exists() else ""
            if line in text:
                return time.monotonic() - proc.started_at, log_interval(
                    text, "podcost running", line)  # fmt: skip
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{proc.spec.name}: no {line!r} after {timeout:.0f}s")

    async def heap_dump(self, proc: ServiceProcess) -> Path | None:
        """With ``--heap-dump``: have the podcost process dump its traced heap (SIGUSR1) and
        wait for the file; its path."""
        if not self.args.heap_dump:
            return None
        directory = self.args.heap_dump / f"run{self.runs}"
        n = len(list(directory.glob("heap-*.txt"))) + 1
        os.kill(proc.pid, signal.SIGUSR1)
        done = directory / f"heap-{n}.txt"
        deadline = time.monotonic() + 300
        while not done.exists() and time.monotonic() < deadline and proc.alive:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        text = done.read_text().splitlines() if done.exists() else ["none"]
        stamp(f"  heap dump {n}: {text[0]}")
        for line in text[1:]:
            # The free lists of each type (``3 free PyFloatObjects``, …) are left out: a few KB.
            if line.startswith(("malloc: ", "mappings: ")) or (
                line.startswith("pymalloc: ") and " free " not in line
            ):
                print("   ", line, flush=True)
        return directory / f"heap-{n}.tracemalloc"

    async def podcost_metrics(self, proc: ServiceProcess) -> dict[str, float]:
        # Traced (--heap-dump), the process is several times slower: its port opens later.
        status, body = await proc.get_listening("/metrics", 120 if self.args.heap_dump else 10)
        if status != 200:
            raise RuntimeError(f"{proc.spec.name}: GET /metrics answered {status}:\n"
                               f"{proc.log_tail()}")  # fmt: skip
        return parse_summed(body)

    async def converge(self, proc: ServiceProcess, timeout: float) -> tuple[float, float]:
        """(seconds until /readyz, seconds until nothing is left to write), from the start."""

        async def ready_now() -> tuple[bool, str]:
            if not proc.alive:
                raise RuntimeError(f"podcost run exited:\n{proc.log_tail()}")
            if await proc.is_ready():
                return True, ""
            metrics = await self.podcost_metrics(proc)
            return False, (
                f"{sample(metrics, 'podcost_combinations_total'):,.0f} decisions, "
                f"{sample(metrics, 'podcost_patches_total'):,.0f} patches, "
                f"queue {sample(metrics, 'podcost_queue_depth'):,.0f}"
            )

        await wait_until(ready_now, "podcost ready (first decisions written)", timeout, 0.5)
        ready = time.monotonic() - proc.started_at
        await self.drained(proc, timeout)
        return ready, time.monotonic() - proc.started_at - QUIET

    async def drained(
        self, proc: ServiceProcess, timeout: float, counter: str = "podcost_patches_total"
    ) -> float:
        """Wait until ``podcost_queue_depth`` and ``podcost_consumer_lag`` are 0 and ``counter``
        (``podcost_patches_total``; the watcher's: ``podcost_snapshots_published_total``) has
        not moved for ``QUIET`` seconds; the seconds until it last moved."""
        start = time.monotonic()
        quiet_since, last = start, -1.0

        async def idle() -> tuple[bool, str]:
            nonlocal quiet_since, last
            if not proc.alive:
                raise RuntimeError(f"{proc.spec.name} exited:\n{proc.log_tail()}")
            metrics = await self.podcost_metrics(proc)
            moved = sample(metrics, counter)
            depth = sample(metrics, "podcost_queue_depth") + sample(metrics, "podcost_consumer_lag")
            if moved != last or depth:
                quiet_since, last = time.monotonic(), moved
            quiet = time.monotonic() - quiet_since
            return quiet >= QUIET and not depth, f"{counter} {moved:,.0f}, queue+lag {depth:,.0f}"

        what = "nothing left to write" if counter == "podcost_patches_total" else "settled"
        await wait_until(idle, what, timeout, interval=0.5)
        return max(0.0, time.monotonic() - start - QUIET)

    async def baseline(self) -> None:
        """The RSS of ``podcost run`` on the empty cluster, once converged and 10 s after; of
        ``podcost watcher`` instead with ``--service watcher``, once settled and 5 s after."""
        if self.args.service == "watcher":
            stamp("baseline: podcost watcher on the empty cluster")
            proc = await self.start_podcost(WATCHER)
            try:
                await self.synced(proc, 120)
                got = usage(proc.pid)
                self.watcher_baseline_sync_rss = got.rss_bytes if got else None
                await self.drained(proc, 120, "podcost_snapshots_published_total")
                await asyncio.sleep(5)
                got = usage(proc.pid)
                self.watcher_baseline_rss = got.rss_bytes if got else None
                await self.heap_dump(proc)  # what the allocator holds without a pod
            finally:
                await proc.stop()
            stamp(f"watcher baseline RSS {fmt_bytes(self.watcher_baseline_rss)} settled, "
                  f"{fmt_bytes(self.watcher_baseline_sync_rss)} at sync")  # fmt: skip
            return
        stamp("baseline: podcost run on the empty cluster")
        proc = await self.start_podcost()
        try:
            _, self.baseline_sync = await self.synced(proc, 120)
            await self.converge(proc, 120)
            await asyncio.sleep(10)
            got = usage(proc.pid)
            self.baseline_rss = got.rss_bytes if got else None
        finally:
            await proc.stop()
        stamp(f"baseline RSS {fmt_bytes(self.baseline_rss)}, sync on the empty cluster "
              f"{fmt(self.baseline_sync, '.2f', 's')} after the services started")  # fmt: skip

    async def measure(self, step: Step) -> None:
        """Steps 2 to 5 for the service of ``--service``."""
        if self.args.service == "watcher":
            await self.measure_watcher(step)
        else:
            await self.measure_run(step)

    async def measure_run(self, step: Step) -> None:
        n, args = step.numbers, self.args
        pods = step.target.pods
        timeout = max(300.0, args.timeout_per_1k * pods / 1000)
        stamp(f"starting podcost run against {pods:,} pods")
        proc = await self.start_podcost()
        try:
            (
                n["podcost initial sync s"],
                n["podcost sync after services started s"],
            ) = await self.synced(proc, timeout)
            synced = usage(proc.pid)
            n["podcost RSS at sync"] = synced.rss_bytes if synced else None
            stamp(f"  synced after {n['podcost initial sync s']:.1f}s")
            at_sync = await self.heap_dump(proc)
            ready, quiet = await self.converge(proc, timeout + pods / 10)
            n["podcost first decision, every workload s"] = ready
            n["podcost nothing left to write s"] = quiet
            metrics = await self.podcost_metrics(proc)
            n["podcost decisions"] = sample(metrics, "podcost_combinations_total")
            for result, count in patches_by_result({}, metrics).items():
                n[f"podcost patches {result} (first costing)"] = count
            n["podcost snapshots published"] = sample(metrics, "podcost_snapshots_published_total")
            stamp(f"  converged: ready {ready:.1f}s, nothing to write {quiet:.1f}s")
            await asyncio.sleep(5)
            converged = usage(proc.pid)
            if converged:
                n["podcost RSS converged"] = converged.rss_bytes
                n["MemAvailable with podcost run"] = mem_available()
                if self.baseline_rss is not None:
                    n["podcost bytes/pod"] = (converged.rss_bytes - self.baseline_rss) / pods
                if self.previous is not None and pods > self.previous[0]:
                    grown_by = pods - self.previous[0]
                    n["podcost bytes/pod, marginal since last step"] = (
                        converged.rss_bytes - self.previous[1]
                    ) / grown_by
                self.previous = (pods, converged.rss_bytes)
            at_converged = await self.heap_dump(proc)
            show_growth(at_sync, at_converged, pods, "the sync and every cost written")
            step.converged = True
            await self.steady_and_churn(step, proc)
        finally:
            await proc.stop(60)

    async def steady_and_churn(
        self, step: Step, proc: ServiceProcess, service: str = PODCOST
    ) -> None:
        """Steps 3 and 4 of the method for ``podcost run`` or (``service=WATCHER``) ``podcost
        watcher``: no writes nor event → cost latency then, its snapshots published instead,
        and its RSS once settled after the churn."""
        n, args = step.numbers, self.args
        pods = step.target.pods
        watcher = service == WATCHER
        who = "watcher" if watcher else "podcost"
        counter_name = "podcost_snapshots_published_total" if watcher else "podcost_patches_total"
        pids = {**self.plane.pids, service: proc.pid}
        if self.broker_pid is not None:
            pids["kafka broker"] = self.broker_pid
        counter = EventCounter(self.api)
        await counter.start()
        try:
            # Steady state.
            stamp(f"  steady state for {args.steady_seconds:.0f}s")
            own_before = await self.podcost_metrics(proc)
            api_before = await apiserver_metrics(self.api, ["apiserver_request_total"])
            cpu_before = {k: u for k, pid in pids.items() if (u := usage(pid))}
            events_before, start = counter.events, time.monotonic()
            await asyncio.sleep(args.steady_seconds)
            idle_seconds = time.monotonic() - start
            idle_events = (counter.events - events_before) / idle_seconds
            idle_cpu = cpu_since(pids, cpu_before, idle_seconds)
            own_after = await self.podcost_metrics(proc)
            api_after = await apiserver_metrics(self.api, ["apiserver_request_total"])
            if watcher:
                n["steady watcher snapshots published"] = sample(
                    own_after, counter_name) - sample(own_before, counter_name)  # fmt: skip
            else:
                n["steady podcost patches (any result)"] = sample(
                    own_after, counter_name) - sample(own_before, counter_name)  # fmt: skip
                n["steady apiserver pod PATCHes"] = pod_patches(api_after) - pod_patches(
                    api_before)  # fmt: skip
            n["steady pod events/s"] = idle_events
            for name, cpu in idle_cpu.items():
                n[f"idle CPU {name}"] = cpu

            # Churn.
            stamp(f"  churn at {args.churn_rate:g} ops/s for {args.churn_seconds:.0f}s")
            cpu_before = {k: u for k, pid in pids.items() if (u := usage(pid))}
            events_before, start = counter.events, time.monotonic()
            ops = await self.churn(args.churn_seconds, args.churn_rate)
            churn_seconds = time.monotonic() - start
            rate = (counter.events - events_before) / churn_seconds
            busy_cpu = cpu_since(pids, cpu_before, churn_seconds)
            stamp("  churn over; waiting until " + ("the watcher has settled" if watcher
                                                   else "nothing is left to write"))  # fmt: skip
            n[f"churn {'settled' if watcher else 'drained'} after s"] = await self.drained(
                proc, args.drain_timeout, counter_name)  # fmt: skip
            own_churn = await self.podcost_metrics(proc)
            n["churn ops done"] = ops
            n["churn pod events/s"] = rate
            if watcher:
                n["churn watcher snapshots published"] = sample(
                    own_churn, counter_name) - sample(own_after, counter_name)  # fmt: skip
            else:
                api_churn = await apiserver_metrics(self.api, ["apiserver_request_total"])
                name = "podcost_event_to_annotation_seconds"
                deltas = bucket_deltas(own_after, own_churn, name)
                for result, count in patches_by_result(own_after, own_churn).items():
                    n[f"churn podcost patches {result}"] = count
                n["churn apiserver pod PATCHes"] = pod_patches(api_churn) - pod_patches(api_after)
                if ops:
                    n["churn podcost patches ok per op"] = (
                        n.get("churn podcost patches ok", 0.0) / ops)  # fmt: skip
                n["churn costs written (histogram count)"] = sum(
                    v for le, v in deltas if math.isinf(le))  # fmt: skip
                n["event→cost p50 s"] = histogram_quantile(deltas, 0.5)
                n["event→cost p99 s"] = histogram_quantile(deltas, 0.99)
            for key, cpu in busy_cpu.items():
                n[f"churn CPU {key}"] = cpu
                n[f"cores per 1k events/s {key}"] = per_thousand(
                    cpu, idle_cpu.get(key, 0.0), rate, idle_events)  # fmt: skip
            if watcher:
                await asyncio.sleep(5)
                after = usage(proc.pid)
                if after:
                    n[f"{who} RSS after churn"] = after.rss_bytes
                    base = self.watcher_baseline_rss
                    if base is not None:
                        n[f"{who} bytes/pod after churn"] = (after.rss_bytes - base) / pods
        finally:
            await counter.stop()

    async def measure_watcher(self, step: Step) -> None:
        """``podcost watcher`` alone over Kafka (``--service watcher``): its initial sync,
        RSS per pod at sync and once its first pass is published and it has settled, then the
        steady state and the churn as for ``podcost run``."""
        n, args = step.numbers, self.args
        pods = step.target.pods
        timeout = max(300.0, args.timeout_per_1k * pods / 1000)
        stamp(f"starting podcost watcher against {pods:,} pods")
        proc = await self.start_podcost(WATCHER)
        try:
            n["watcher initial sync s"], _ = await self.synced(proc, timeout)
            synced = usage(proc.pid)
            if synced:
                n["watcher RSS at sync"] = synced.rss_bytes
                if self.watcher_baseline_sync_rss is not None:
                    n["watcher bytes/pod at sync"] = (
                        synced.rss_bytes - self.watcher_baseline_sync_rss) / pods  # fmt: skip
            stamp(f"  synced after {n['watcher initial sync s']:.1f}s")
            at_sync = await self.heap_dump(proc)
            n["watcher first pass published s"], _ = await self.synced(
                proc, timeout, "first pass published")  # fmt: skip
            await self.drained(proc, timeout, "podcost_snapshots_published_total")
            metrics = await self.podcost_metrics(proc)
            n["watcher snapshots published"] = sample(metrics, "podcost_snapshots_published_total")
            await asyncio.sleep(5)
            settled = usage(proc.pid)
            if settled:
                n["watcher RSS settled"] = settled.rss_bytes
                n["MemAvailable with podcost watcher"] = mem_available()
                if self.watcher_baseline_rss is not None:
                    n["watcher bytes/pod"] = (
                        settled.rss_bytes - self.watcher_baseline_rss) / pods  # fmt: skip
            stamp(f"  first pass published after {n['watcher first pass published s']:.1f}s, "
                  f"settled")  # fmt: skip
            at_settled = await self.heap_dump(proc)
            show_growth(at_sync, at_settled, pods, "the sync and the first pass settled")
            step.converged = True
            await self.steady_and_churn(step, proc, WATCHER)
            await self.heap_dump(proc)
        finally:
            await proc.stop(60)

    async def churn(self, seconds: float, rate: float) -> int:
        """Alternately delete a random pod (of a random Deployment, listed by its label: a
        cluster-wide list of every pod would cost the bench more than the cluster at 100,000
        pods) and scale a random Deployment up one (and the previous one back down), ``rate``
        operations per second; returns the operations done."""
        scaled: int | None = None
        tasks: set[asyncio.Task[None]] = set()
        errors: list[BaseException] = []
        done = 0

        async def op(index: int) -> None:
            nonlocal scaled, done
            try:
                if index % 2 == 0:
                    victim = self.rng.randrange(self.deployments)
                    namespace = self.namespace_of(victim)
                    pods = await self.core.list_namespaced_pod(
                        namespace, label_selector=f"app=d{victim}"
                    )
                    if pods.items:
                        with contextlib.suppress(ApiException):
                            await self.core.delete_namespaced_pod(
                                self.rng.choice(pods.items).metadata.name, namespace,
                                grace_period_seconds=0,
                            )  # fmt: skip
                else:
                    if scaled is not None:
                        which, scaled = scaled, None
                        await self.apps.patch_namespaced_deployment_scale(
                            f"d{which}", self.namespace_of(which),
                            {"spec": {"replicas": self.args.replicas}},
                        )  # fmt: skip
                    else:
                        scaled = self.rng.randrange(self.deployments)
                        await self.apps.patch_namespaced_deployment_scale(
                            f"d{scaled}", self.namespace_of(scaled),
                            {"spec": {"replicas": self.args.replicas + 1}},
                        )  # fmt: skip
                done += 1
            except Exception as error:  # reported after the window
                errors.append(error)  # fmt: skip

        start = time.monotonic()
        index = 0
        while time.monotonic() - start < seconds:
            task = asyncio.create_task(op(index))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
            await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
        await asyncio.gather(*tasks)
        if scaled is not None:
            await self.apps.patch_namespaced_deployment_scale(
                f"d{scaled}", self.namespace_of(scaled), {"spec": {"replicas": self.args.replicas}}
            )
        if len(errors) > done:
            raise RuntimeError(f"churn: {len(errors)} operations failed, e.g. {errors[0]!r}")
        return done

    async def cleanup(self) -> None:
        """Only when the cluster is not the bench's own: delete what it created."""
        stamp("deleting the bench's namespaces and nodes")
        for namespace in self.namespaces:
            with contextlib.suppress(ApiException):
                await self.core.delete_namespace(namespace)
        nodes = [f"{NODE_PREFIX}{i}" for i in range(self.nodes)]
        await bounded(self.args.concurrency, (lambda n=n: self._delete_node(n) for n in nodes))

    async def _delete_node(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            await self.core.delete_node(name)


def cpu_since(
    pids: Mapping[str, int], before: Mapping[str, Any], seconds: float
) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        now, then = usage(pid), before.get(name)
        if now is not None and then is not None:
            out[name] = (now.cpu_seconds - then.cpu_seconds) / seconds
    return out


class EventCounter:
    """A cluster-wide watch of pods from now on that only counts its events (lines)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.events = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listed = await client.CoreV1Api(self.api).list_pod_for_all_namespaces(limit=1)
        self._task = asyncio.create_task(self._watch(listed.metadata.resource_version))

    async def _watch(self, version: str) -> None:
        while True:
            response = await self.api.call_api(
                "/api/v1/pods", "GET", auth_settings=["BearerToken"], _preload_content=False,
                query_params=[("watch", "true"), ("resourceVersion", version),
                              ("allowWatchBookmarks", "true"), ("timeoutSeconds", "3600")],
                _request_timeout=3700,
            )  # fmt: skip
            try:
                async for line in response.content:
                    if b'"type":"BOOKMARK"' in line[:40]:
                        version = json.loads(line)["object"]["metadata"]["resourceVersion"]
                        continue
                    self.events += 1
                    if b'"type":"ERROR"' in line[:40]:
                        listed = await client.CoreV1Api(self.api).list_pod_for_all_namespaces(
                            limit=1)  # fmt: skip
                        version = listed.metadata.resource_version
                        break
            finally:
                response.release()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


# --- printing -----------------------------------------------------------------------------------


def show(step: Step) -> None:
    t = step.target
    failed = "" if step.failure is None else f"  FAILED: {step.failure}"
    print(f"\n== {t.pods:,} pods on {t.nodes:,} nodes ({t.deployments:,} Deployments of "
          f"{t.replicas}){failed}")  # fmt: skip
    for key, value in step.numbers.items():
        if value is None:
            text = "n/a"
        elif key.startswith(("RSS", "podcost RSS", "watcher RSS", "etcd db size", "MemAvailable")):
            text = fmt_bytes(value)
        elif isinstance(value, float) and math.isinf(value):
            text = f"> {LATENCY_BUCKETS[-1]:g} (beyond the histogram's last bucket)"
        elif key.startswith(("podcost bytes/pod", "watcher bytes/pod")):
            text = f"{value:,.0f} B/pod (goal <= 1,536)"
        elif key.startswith(("idle CPU", "churn CPU", "growth CPU")):
            text = f"{value:.2f} cores"
        elif key.startswith("cores per 1k"):
            text = f"{value:.3f} cores"
        elif key.endswith(" s"):
            text = f"{value:,.2f}"
        else:
            text = f"{value:,.1f}" if isinstance(value, float) and value % 1 else f"{value:,.0f}"
        print(f"  {key:<44} {text}")
    sys.stdout.flush()


def summary(steps: Sequence[Step], stopped_by: str | None, service: str = "run") -> None:
    grown = [s for s in steps if s.grown]
    converged = [s for s in steps if s.converged]
    reached = grown[-1].target if grown else None
    if stopped_by is None:
        stopped_by = "nothing: every requested size was reached (ask for more with --pods)"
    columns = (
        [
            ("pods Running s", "grow s", ".0f"),
            ("watcher initial sync s", "sync s", ".1f"),
            ("watcher bytes/pod at sync", "B/pod sync", ",.0f"),
            ("watcher first pass published s", "passed s", ".1f"),
            ("watcher bytes/pod", "B/pod settled", ",.0f"),
            ("watcher bytes/pod after churn", "B/pod churned", ",.0f"),
            ("churn pod events/s", "events/s", ".1f"),
            (f"cores per 1k events/s {WATCHER}", "cores/1k ev/s", ".2f"),
        ]
        if service == "watcher"
        else [
            ("pods Running s", "grow s", ".0f"),
            ("podcost initial sync s", "sync s", ".1f"),
            ("podcost bytes/pod", "B/pod", ",.0f"),
            ("podcost first decision, every workload s", "decided s", ".0f"),
            ("podcost nothing left to write s", "written s", ".0f"),
            ("steady apiserver pod PATCHes", "idle PATCH", ".0f"),
            ("churn pod events/s", "events/s", ".1f"),
            ("event→cost p50 s", "p50 s", ".2f"),
            ("event→cost p99 s", "p99 s", ".2f"),
            (f"cores per 1k events/s {PODCOST}", "cores/1k ev/s", ".2f"),
        ]
    )
    print("\n== summary")
    print(f"{'pods':>9}{'nodes':>7}" + "".join(f"{title:>14}" for _, title, _ in columns))
    for step in steps:
        cells = "".join(f"{fmt(step.numbers.get(key), spec):>14}" for key, _, spec in columns)
        print(f"{step.target.pods:>9,}{step.target.nodes:>7,}{cells}")
    print()
    if converged:
        top = converged[-1].target
        what = "podcost watcher settled" if service == "watcher" else "podcost converged"
        print(f"{what} up to {top.pods:,} pods / {top.nodes:,} nodes")
    pods, nodes = (reached.pods, reached.nodes) if reached else (0, 0)
    print(f"largest reached: {pods:,} pods / {nodes:,} nodes; stopped by: {stopped_by}", flush=True)


async def bench(kubeconfig: str, args: argparse.Namespace, run_dir: Path | None,
                log_dir: Path, broker: tuple[str, int | None] | None = None) -> None:  # fmt: skip
    api = await config.new_client_from_config(config_file=kubeconfig)
    plane = ControlPlane(run_dir)
    sizes = [layout(p, args.pods_per_node, args.replicas) for p in args.pods]
    steps: list[Step] = []
    stopped_by: str | None = None
    async with api:
        runner = Bench(api, kubeconfig, args, plane, log_dir)
        if broker is not None:
            runner.brokers, runner.broker_pid = broker
        try:
            await runner.setup()
            await runner.baseline()
            for target in sizes:
                step = Step(target)
                steps.append(step)
                free = mem_available()
                if free < args.min_free_gib * 2**30:
                    stopped_by = (
                        f"memory: MemAvailable {fmt_bytes(free)} < {args.min_free_gib} GiB "
                        f"before growing to {target.pods:,} pods"
                    )
                    steps.pop()
                    break
                stamp(f"step: {target.pods:,} pods on {target.nodes:,} nodes")
                try:
                    await runner.grow(step)
                    await runner.control_plane_numbers(step)
                    await runner.measure(step)
                except (Exception, TimeoutError) as error:
                    step.failure = f"{type(error).__name__}: {error}".splitlines()[0][:300]
                    with contextlib.suppress(Exception):
                        await runner.control_plane_numbers(step)
                    show(step)
                    where = "growing the cluster" if not step.grown else "measuring podcost"
                    stopped_by = f"{where} at {target.pods:,} pods: {step.failure}"
                    if not args.keep_going:
                        raise
                    break
                except asyncio.CancelledError:  # Ctrl-C or SIGTERM: say where, then stop
                    step.failure = "interrupted"
                    show(step)
                    where = "growing the cluster" if not step.grown else "measuring podcost"
                    stopped_by = f"interrupted (Ctrl-C or SIGTERM), {where} at {target.pods:,} pods"
                    raise
                show(step)
        finally:
            summary(steps, stopped_by, args.service)
            if run_dir is None and not args.keep_objects:
                await runner.cleanup()


def _sigterm(*_: object) -> None:
    """SIGTERM as Ctrl-C: inside ``asyncio.run`` its SIGINT handler cancels the bench's task, so
    every ``finally`` (podcost run stopped, the control plane stopped) runs."""
    signal.raise_signal(signal.SIGINT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=lambda s: [int(p) for p in s.split(",")],
                        default=[2000, 5000], help="sizes, comma-separated, growing")  # fmt: skip
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--replicas", type=int, default=30, help="pods per Deployment")
    parser.add_argument("--spot-every", type=int, default=5, help="every n-th node is spot")
    parser.add_argument("--concurrency", type=int, default=32, help="create requests in flight")
    parser.add_argument(
        "--annotator-qps",
        type=float,
        default=None,
        help="PODCOST_ANNOTATOR_QPS (burst 2x); default: the service's (20)",
    )
    parser.add_argument("--steady-seconds", type=float, default=60)
    parser.add_argument("--churn-seconds", type=float, default=60)
    parser.add_argument("--churn-rate", type=float, default=10, help="operations/s")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=900,
        help="after the churn, longest wait for nothing left to write",
    )
    parser.add_argument(
        "--timeout-per-1k",
        type=float,
        default=60,
        help="seconds per 1,000 pods for each wait (at least 300 s)",
    )
    parser.add_argument("--min-free-gib", type=float, default=1.0)
    parser.add_argument(
        "--nodes-to-score-percent",
        type=int,
        default=None,
        help="the scheduler's percentageOfNodesToScore (default: its own, from the cluster's "
        "size); a low one grows a large cluster faster",
    )
    parser.add_argument(
        "--kwok-parallelism",
        type=int,
        default=None,
        help="pod stages, node stages and node leases kwok plays at once (default: its own, 4)",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="a failed step stops the growth; the summary is still printed",
    )
    parser.add_argument(
        "--keep-objects",
        action="store_true",
        help="with PODCOST_USE_KUBECONFIG=1: leave the nodes and namespace",
    )
    parser.add_argument(
        "--namespaces",
        type=int,
        default=1,
        help="Deployments round robin over this many namespaces (scale-0, …; 1: all in scale). "
        "The scheduler's default topology spreading counts, for every pod it places, the pods "
        "of its namespace on every node: with 40,000 pods in one namespace it bound 15-20 pods/s",
    )
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument(
        "--service",
        choices=("run", "watcher"),
        default="run",
        help="what is measured: podcost run (embedded), or podcost watcher alone over a Kafka "
        "broker (the bench's own unless PODCOST_KAFKA names one)",
    )
    parser.add_argument(
        "--heap-dump",
        type=Path,
        default=None,
        help="a directory: podcost run traces its heap (PODCOST_HEAP_DUMP, slower and larger) "
        "and dumps it at sync and once converged; what grew between is printed",
    )
    parser.add_argument("--heap-frames", type=int, default=1,
                        help="with --heap-dump: frames traced per allocation (0: none, only "
                        "the RSS and pymalloc's account of its arenas)")  # fmt: skip
    args = parser.parse_args()
    if args.pods != sorted(args.pods):
        parser.error("--pods must grow")
    signal.signal(signal.SIGTERM, _sigterm)
    stamp(f"bench_scale: sizes {args.pods}, {args.pods_per_node} pods/node, "
          f"{args.replicas} replicas/Deployment, {os.cpu_count()} cores, "
          f"MemAvailable {fmt_bytes(mem_available())}")  # fmt: skip
    try:
        run(args)
    except KeyboardInterrupt:
        stamp("interrupted; everything the bench started is stopped")
        sys.exit(130)


def run(args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="podcost-scale-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        log_dir = Path(tmp) / "podcost"
        broker: tuple[str, int | None] | None = None
        if args.service == "watcher":
            if os.environ.get("PODCOST_KAFKA"):
                broker = (os.environ["PODCOST_KAFKA"], None)
            else:
                started = kafka.start(Path(tmp) / "kafka")
                stack.callback(started.stop)
                broker = (started.bootstrap, started.pid)
                stamp(f"Kafka broker up in {started.started_in:.1f}s ({started.bootstrap})")
        if os.environ.get("PODCOST_USE_KUBECONFIG") == "1" and os.environ.get("KUBECONFIG"):
            asyncio.run(bench(os.environ["KUBECONFIG"], args, None, log_dir, broker))
            return
        started_at = time.monotonic()
        control_plane = cluster.start(
            Path(tmp) / "cluster",
            nodes_to_score_percent=args.nodes_to_score_percent,
            kwok_parallelism=args.kwok_parallelism,
        )
        stamp(f"control plane up in {time.monotonic() - started_at:.1f}s ({tmp})")
        try:
            asyncio.run(bench(str(control_plane.kubeconfig), args, control_plane.run_dir, log_dir,
                              broker))  # fmt: skip
        finally:
            stamp("stopping the control plane")
            control_plane.stop()


if __name__ == "__main__":
    main()
