"""Real podcost processes for the tests, started exactly as the Helm chart's containers start.

The fleet tests (``tests/e2e/test_fleet.py`` and the restart/outage tests built on it) run each
component as its own OS process, ``python -m podcost <args>``, with the container's arguments and
environment from ``helm template`` of ``deploy/helm/podcost`` (:func:`chart_specs`), so what runs
is what the chart deploys, not a hand-written copy of it. :func:`processes` starts a set of them,
waits until every one answers ``GET /readyz`` with 200, and stops them at the end.

Local stand-ins for what a pod has and a process does not, and nothing else:

- the downward API: ``POD_NAME`` is the spec's name made a DNS label, ``POD_NAMESPACE`` the
  Deployment's namespace;
- ConfigMap volumes (the policy file) are written under the process's own directory next to its
  log, and every env value that names a path under one is pointed at the local copy; an
  ``emptyDir`` at ``/tmp`` becomes a private ``TMPDIR``;
- each process serves its HTTP endpoints on a free port of 127.0.0.1 (``PODCOST_HTTP_HOST`` /
  ``PODCOST_HTTP_PORT``) instead of the container's 8080.

The test's own environment is not inherited where a container would not have it: ``PODCOST_*``,
``OTEL_*``, ``KUBECONFIG`` and ``POD_*`` come only from the spec and the ``env`` given here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from podcost_core.policy import Policy, policy_from_data

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "podcost"
RELEASE = "podcost"
#: The namespace ``helm template`` renders into (the chart's objects, the watcher's Lease).
NAMESPACE = "default"

#: Variables of the test's own environment a container would not have.
_NOT_INHERITED = ("PODCOST_", "OTEL_", "KUBECONFIG", "POD_")
#: A container path that is an ``emptyDir`` here becomes this variable when it is ``/tmp``.
_TMP = "/tmp"


@dataclass(frozen=True)
class ServiceSpec:
    """One component process: what the chart's container runs."""

    name: str
    """Unique in a test, e.g. ``a/watcher``, ``core/ranker-age``; names the log file."""
    args: tuple[str, ...]
    """The podcost CLI arguments as the container gives them, e.g. ``("ranker", "--strategy",
    "age")``."""
    env: Mapping[str, str]
    """The container's environment with literal values (``PODCOST_*``, ``OTEL_*`` ...)."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Files the container has from ConfigMap volumes: container path → content."""
    scratch: tuple[str, ...] = ()
    """Container directories that are ``emptyDir`` volumes (``/tmp``)."""
    module: str = "podcost"
    """What ``python -m`` runs: the podcost CLI, or another entry point that bootstraps the
    real services (the benchmarks' agent processes, ``tests.bench.bench_agent``)."""
    python: str | None = None
    """The interpreter that runs it: another release's environment (the rolling-upgrade test's
    previous release), or ``None`` for this checkout's."""


# --- the chart -----------------------------------------------------------------------------------

#: The chart's replicated components. Its production default runs two of each (a standby or a
#: partition share); the tests run one of each unless their values ask for more, so that a test
#: of the whole pipeline does not start every process twice.
REPLICATED = ("watcher", "annotator", "aggregator", "rankers", "embedded")


def chart_policy_document(non_negative: bool | None = None) -> dict[str, Any]:
    """The policy file the chart's values render (``policy-configmap.yaml``), as data; with
    ``non_negative``, as rendered with ``policy.nonNegativeCosts`` set so."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]
    wanted = values.get("nonNegativeCosts", False) if non_negative is None else non_negative
    return {"version": 1, "strategies": values["strategies"], "non_negative_costs": bool(wanted)}


def chart_policy(non_negative: bool | None = None) -> Policy:
    """The cluster default policy the chart's values render: what every component of a
    chart-rendered fleet loads from ``PODCOST_POLICY_FILE`` (:func:`chart_policy_document`)."""
    return policy_from_data(chart_policy_document(non_negative), source="the chart's policy")


def one_replica_each(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with ``replicaCount: 1`` for every replicated component that sets none."""
    merged = dict(values)
    for component in REPLICATED:
        own = dict(merged.get(component) or {})
        own.setdefault("replicaCount", 1)
        merged[component] = own
    return merged


def chart_specs(
    helm: Path,
    values: Mapping[str, Any],
    *,
    prefix: str = "",
    namespace: str = NAMESPACE,
    chart: Path = CHART,
) -> list[ServiceSpec]:
    """One spec per container of every Deployment ``helm template`` renders with ``values``
    (over :func:`one_replica_each`; of this checkout's chart, or of ``chart``: another
    release's).

    A spec is named ``<prefix><component>`` (``watcher``, ``annotator``, ``aggregator``,
    ``ranker-<strategy>``; ``/<container>`` added when a pod has several containers), and a
    Deployment of ``n > 1`` replicas gives ``n`` specs suffixed ``#1`` … ``#n``. Env entries with
    a literal ``value`` are kept; ``valueFrom`` the downward API's ``metadata.name`` /
    ``metadata.namespace`` get local values; other ``valueFrom`` (Secrets) are left out.
    """
    rendered = subprocess.run(
        [str(helm), "template", RELEASE, str(chart), "--namespace", namespace, "--values", "-"],
        input=yaml.safe_dump(one_replica_each(values)), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    if rendered.returncode != 0:
        raise AssertionError(f"helm template failed: {rendered.stderr.strip()}")
    objects = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    config_maps = {
        obj["metadata"]["name"]: obj.get("data") or {}
        for obj in objects
        if obj["kind"] == "ConfigMap"
    }
    specs: list[ServiceSpec] = []
    for deployment in (obj for obj in objects if obj["kind"] == "Deployment"):
        meta = deployment["metadata"]
        component = meta["labels"].get("app.kubernetes.io/component") or meta["name"]
        pod = deployment["spec"]["template"]["spec"]
        volumes = {volume["name"]: volume for volume in pod.get("volumes") or []}
        containers = pod["containers"]
        replicas = int(deployment["spec"].get("replicas", 1))
        for container in containers:
            base = f"{prefix}{component}"
            if len(containers) > 1:
                base = f"{base}/{container['name']}"
            names = [base] if replicas == 1 else [f"{base}#{i}" for i in range(1, replicas + 1)]
            files, scratch = _mounts(container, volumes, config_maps)
            for name in names:
                env = _literal_env(container.get("env") or [], name, meta.get("namespace"))
                args = (*container.get("command", [])[1:], *container.get("args", []))
                specs.append(ServiceSpec(name, tuple(str(a) for a in args), env, files, scratch))
    return specs


def _literal_env(entries: list[dict[str, Any]], name: str, namespace: str | None) -> dict[str, str]:
    downward = {"metadata.name": pod_name(name), "metadata.namespace": namespace or NAMESPACE}
    env: dict[str, str] = {}
    for entry in entries:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        path = (entry.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        if path in downward:
            env[entry["name"]] = downward[path]
    return env


def _mounts(
    container: Mapping[str, Any],
    volumes: Mapping[str, Mapping[str, Any]],
    config_maps: Mapping[str, Mapping[str, str]],
) -> tuple[dict[str, str], tuple[str, ...]]:
    files: dict[str, str] = {}
    scratch: list[str] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"], {})
        target = mount["mountPath"].rstrip("/")
        if "emptyDir" in volume:
            scratch.append(target)
        elif "configMap" in volume:
            data = config_maps.get(volume["configMap"]["name"], {})
            items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                files[f"{target}/{item['path']}"] = data[item["key"]]
    return files, tuple(scratch)


def pod_name(name: str) -> str:
    """A spec name as a pod name would look (``a/ranker-age#2`` → ``a-ranker-age-2``)."""
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "podcost"


# --- one process ---------------------------------------------------------------------------------

_ports_given: set[int] = set()


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on now (and not handed out before in this run)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in _ports_given:
            _ports_given.add(port)
            return port


def metric_key(name: str, /, **labels: str) -> str:
    """The key :meth:`ServiceProcess.metrics` uses: ``name{a="x",b="y"}``, labels sorted."""
    if not labels:
        return name
    inner = ",".join(f'{key}="{labels[key]}"' for key in sorted(labels))
    return f"{name}{{{inner}}}"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition → ``{metric_key(sample name, **labels): value}``."""
    parsed: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            parsed[metric_key(sample.name, **sample.labels)] = float(sample.value)
    return parsed


_KEY = re.compile(r"^(?P<name>[^{]+)(?:\{(?P<labels>.*)\})?$")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def series(metrics: Mapping[str, float], name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called ``name``: (its labels, its value)."""
    found = []
    for key, value in metrics.items():
        match = _KEY.match(key)
        if match is not None and match.group("name") == name:
            labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"] or "")}
            found.append((labels, value))
    return found


def sample(metrics: Mapping[str, float], name: str, /, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 if none):
    ``sample(m, "podcost_patches_total")`` is every patch, ``result="ok"`` the successful ones."""
    return float(
        sum(
            value
            for have, value in series(metrics, name)
            if all(have.get(k) == v for k, v in labels.items())
        )
    )


class ServiceProcess:
    """One real OS process, ``python -m podcost <args>`` (or the spec's ``module``), with its
    own HTTP port and log."""

    def __init__(self, spec: ServiceSpec, *, env: Mapping[str, str], log_dir: Path) -> None:
        self.spec = spec
        self.pid = 0
        self.port = 0
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.name)
        self.log_path = log_dir / f"{slug}.log"
        self.root = log_dir / f"{slug}.fs"
        """Where the process's ConfigMap files and scratch directories live."""
        self._extra = dict(env)
        self._process: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        """``time.monotonic()`` when the process was last started."""
        self.ready_after: float | None = None
        """Seconds from the last start until ``/readyz`` first answered 200 (imports included)."""

    # -- life ----------------------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """What the process is started with: the test's environment minus what a container
        would not have, the spec's env, the extra env, local paths and the HTTP address."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
        # Paths into the ConfigMap mounts; /tmp is TMPDIR instead, since the test's own local
        # paths (a kubeconfig) live under /tmp too.
        mounts = {str(Path(path).parent) for path in self.spec.files}
        for key, value in self.spec.env.items():
            under = any(value == m or value.startswith(f"{m}/") for m in mounts)
            env[key] = str(self.root) + value if under else value
        env.update(self._extra)
        if _TMP in self.spec.scratch:
            env["TMPDIR"] = str(self.root) + _TMP
        env["PODCOST_HTTP_HOST"] = "127.0.0.1"
        env["PODCOST_HTTP_PORT"] = str(self.port)
        return env

    async def start(self) -> None:
        """Start the process on a free port; stdout and stderr go to ``log_path``."""
        if self._process is not None and self._process.returncode is None:
            raise RuntimeError(f"{self.spec.name} is already running (pid {self.pid})")
        self._materialize()
        self.port = free_port()
        with self.log_path.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                self.spec.python or sys.executable, "-m", self.spec.module, *self.spec.args,
                env=self.environment(), stdin=asyncio.subprocess.DEVNULL,
                stdout=log, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        self.pid = self._process.pid
        self.started_at, self.ready_after = time.monotonic(), None

    def _materialize(self) -> None:
        """The container's ConfigMap files and scratch directories, under ``root``."""
        for path, content in self.spec.files.items():
            local = Path(str(self.root) + path)
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(content)
        for directory in self.spec.scratch:
            Path(str(self.root) + directory).mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.returncode

    async def wait_ready(self, timeout: float = 60) -> None:
        """Poll ``GET /readyz`` until it answers 200; fail with the log's tail if the process
        exits first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive:
                await self._reap()
                raise AssertionError(
                    f"{self.spec.name} exited with {self.returncode} before it was ready; "
                    f"its log ends:\n{self.log_tail()}"
                )
            status, _ = await self._get("/readyz")
            if status == 200:
                if self.ready_after is None:
                    self.ready_after = time.monotonic() - self.started_at
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.spec.name} not ready after {timeout}s (/readyz: {status}); "
                    f"its log ends:\n{self.log_tail()}"
                )
            await asyncio.sleep(0.25)

    async def is_ready(self) -> bool:
        """Whether ``GET /readyz`` answers 200 now (``False`` while nothing listens)."""
        return await self.readyz() == 200

    async def readyz(self) -> int:
        """The status ``GET /readyz`` answers now (0 while nothing listens)."""
        status, _ = await self._get("/readyz")
        return status

    def kill(self) -> None:
        """SIGKILL: a real crash, nothing flushed, no goodbye to the broker."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)

    async def stop(self, timeout: float = 15) -> int:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; the exit code."""
        process = self._process
        if process is None:
            raise RuntimeError(f"{self.spec.name} was never started")
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        return await process.wait()

    async def _reap(self) -> None:
        if self._process is not None:
            await self._process.wait()

    # -- observing -----------------------------------------------------------------------------

    async def metrics(self) -> dict[str, float]:
        """``GET /metrics`` parsed (:func:`parse_metrics`)."""
        status, body = await self.get_listening("/metrics")
        if status != 200:
            raise AssertionError(f"{self.spec.name}: GET /metrics answered {status}")
        return parse_metrics(body)

    async def sample(self, name: str, /, **labels: str) -> float:
        """One number of ``/metrics`` (see :func:`sample`)."""
        return sample(await self.metrics(), name, **labels)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def get_listening(self, path: str, wait: float = 10.0) -> tuple[int, str]:
        """(status, body) of a GET, waiting up to ``wait`` seconds for the port to listen while
        the process runs: ``podcost run`` opens its HTTP port only once its services are ready
        or ``runner.HTTP_DEFER_S`` after its start, so its first write is not delayed."""
        deadline = time.monotonic() + wait
        while True:
            status, body = await self._get(path)
            if status != 0 or not self.alive or time.monotonic() > deadline:
                return status, body
            await asyncio.sleep(0.1)

    async def _get(self, path: str) -> tuple[int, str]:
        """(status, body) of a GET on the process's port; status 0 when nothing answers."""
        url = f"http://127.0.0.1:{self.port}{path}"

        def get() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    return int(response.status), response.read().decode()
            except urllib.error.HTTPError as error:
                return int(error.code), error.read().decode(errors="replace")
            except (urllib.error.URLError, OSError):
                return 0, ""

        return await asyncio.to_thread(get)

    def __repr__(self) -> str:
        return f"ServiceProcess({self.spec.name!r}, pid={self.pid}, port={self.port})"


# --- a set of processes --------------------------------------------------------------------------


def dead_report(running: Iterable[ServiceProcess]) -> str:
    """The exit codes and log tails of the processes that are not running, or ''."""
    return "\n".join(
        f"--- {p.spec.name} exited with {p.returncode}; its log ends:\n{p.log_tail()}"
        for p in running
        if p.returncode is not None
    )


def assert_alive(running: Mapping[str, ServiceProcess] | Iterable[ServiceProcess]) -> None:
    """Fail, with their log tails, if any of ``running`` has exited."""
    procs = list(running.values()) if isinstance(running, Mapping) else list(running)
    report = dead_report(procs)
    if report:
        raise AssertionError(f"a podcost process stopped by itself:\n{report}")


@contextlib.asynccontextmanager
async def processes(
    specs: Iterable[ServiceSpec],
    *,
    env: Mapping[str, str],
    log_dir: Path,
    ready_timeout: float = 90,
) -> AsyncIterator[dict[str, ServiceProcess]]:
    """Start one process per spec (``env`` merged over each spec's env: ``KUBECONFIG``,
    ``PODCOST_KAFKA``, topics ...), wait until all are ready, yield them by name, and stop them
    all at the end. An error in the block gets the log tails of the processes that died."""
    started: dict[str, ServiceProcess] = {}
    for spec in specs:
        if spec.name in started:
            raise ValueError(f"two specs are named {spec.name!r}")
        started[spec.name] = ServiceProcess(spec, env=env, log_dir=log_dir)
    try:
        for proc in started.values():
            await proc.start()
        await _all_ready(started.values(), ready_timeout)
        yield started
    except BaseException as error:
        report = dead_report(started.values())
        if report and isinstance(error, Exception):
            error.add_note(f"podcost processes that died:\n{report}")
        raise
    finally:
        await asyncio.gather(*(p.stop() for p in started.values() if p.pid))


async def _all_ready(procs: Iterable[ServiceProcess], timeout: float) -> None:
    """Wait for every process to be ready; the first failure cancels the other waits."""
    waits = [asyncio.create_task(p.wait_ready(timeout), name=p.spec.name) for p in procs]
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
