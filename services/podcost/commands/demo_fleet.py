"""``podcost demo --fleet``: the demo's scale-in in two clusters served by one core over Kafka.

Starts a Kafka broker and two control planes (``eu-1`` and ``us-1``) from the local
infrastructure and runs podcost as the chart's fleet mode does, every component its own
``python -m podcost`` process joined by the broker: an agent per cluster (a watcher and an
annotator, each with that cluster's kubeconfig) and one core (a ranker per strategy the demo's
workloads ask for, and the aggregator). ``podcost.commands.demo`` then plays its scenario in
each cluster in turn. Stops every process and server it started, also on Ctrl-C and on error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from podcost.commands.demo_progress import Steps

CLUSTERS = ("eu-1", "us-1")
STOP_GRACE = 10.0
"""Seconds a process has to stop on SIGTERM before it is killed."""


class FleetError(RuntimeError):
    """The fleet cannot go on; the message says what went wrong, in one line."""


@dataclass(frozen=True)
class FleetServers:
    """The broker and the control planes the fleet runs against."""

    bootstrap: str
    kubeconfigs: Mapping[str, Path]
    """Cluster name → its kubeconfig."""
    logs: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def fleet_servers(steps: Steps) -> Iterator[FleetServers]:
    """Build (once) and start a broker and one control plane per cluster; stop them after."""
    try:
        from podcost_localinfra import build, cluster, kafka, process
    except ImportError as error:
        message = "needs the local infrastructure; run `make demo-fleet` in a checkout"
        raise FleetError(message) from error
    with steps.step("Building the broker and the control plane (cached after the first time)"):
        build.ensure_kafka_tools()
        build.ensure_cluster_tools()
    run_dir = Path(tempfile.mkdtemp(prefix="podcost-demo-fleet-"))
    keep = False
    try:
        with steps.step("Starting a Kafka broker"):
            broker = kafka.start(run_dir / "kafka")
        kubeconfigs: dict[str, Path] = {}
        for name in CLUSTERS:
            with steps.step(f"Starting cluster {name}: etcd, kube-apiserver, controller-manager, "
                            "scheduler, kwok"):  # fmt: skip
                kubeconfigs[name] = cluster.start(run_dir / name).kubeconfig
        yield FleetServers(broker.bootstrap, kubeconfigs, run_dir / "podcost")
    except BaseException:
        keep = True  # the servers' logs say why
        raise
    finally:
        with steps.step("Stopping the control planes and the broker"):
            for name in reversed(CLUSTERS):
                process.stop_all(run_dir / name)
            process.stop_all(run_dir / "kafka")
        if keep:
            print(f"podcost demo: server and process logs kept in {run_dir}", file=sys.stderr)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


@dataclass
class _Process:
    name: str
    port: int
    popen: subprocess.Popen[bytes]
    log: IO[bytes]
    log_path: Path


class Fleet:
    """podcost's processes: a watcher and an annotator per cluster, a ranker per strategy and
    the aggregator."""

    def __init__(self) -> None:
        self._processes: list[_Process] = []

    def add(self, process: _Process) -> None:
        self._processes.append(process)

    def __len__(self) -> int:
        return len(self._processes)

    def healthy(self) -> None:
        """Raise if a process stopped by itself."""
        for proc in self._processes:
            code = proc.popen.poll()
            if code is not None:
                raise FleetError(f"podcost's {proc.name} exited with {code} (log: {proc.log_path})")

    async def ready(self) -> int:
        """How many processes answer ``/readyz`` with 200; raises if one stopped."""
        self.healthy()

        def probe(port: int) -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                    return bool(answer.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        answers = await asyncio.gather(
            *(asyncio.to_thread(probe, proc.port) for proc in self._processes)
        )
        return sum(answers)

    def stop(self) -> None:
        """SIGTERM every process, the agents first; kill what is still running after the grace."""
        for proc in reversed(self._processes):  # started core first, agents last
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self._processes:
            try:
                proc.popen.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
            proc.log.close()


def _components(strategies: Sequence[str]) -> list[tuple[str, str | None, list[str]]]:
    """(name, cluster or None for the core, podcost's arguments) of every process."""
    agents = [(f"{cluster}/{role}", cluster, [role])
              for cluster in CLUSTERS for role in ("watcher", "annotator")]  # fmt: skip
    core = [(f"core/ranker-{name}", None, ["ranker", "--strategy", name]) for name in strategies]
    return [*core, ("core/aggregator", None, ["aggregator"]), *agents]


@contextlib.contextmanager
def fleet_processes(
    servers: FleetServers, strategies: Sequence[str], namespace: str
) -> Iterator[Fleet]:
    """Start the fleet's processes against ``servers``; stop them when the block ends."""
    servers.logs.mkdir(parents=True, exist_ok=True)
    # The user's own PODCOST_* settings would change the demo: the processes get only these.
    base = {key: value for key, value in os.environ.items() if not key.startswith("PODCOST_")}
    base |= {
        "PODCOST_KAFKA": servers.bootstrap,
        "PODCOST_HTTP_HOST": "127.0.0.1",
        "PODCOST_LOG_FORMAT": "text",
        "PODCOST_WATCHER_NAMESPACE": namespace,
        "PODCOST_WATCHER_DEBOUNCE_SECONDS": "0.2",
        "PODCOST_WATCHER_MAX_DELAY_SECONDS": "1",
        "PODCOST_WATCHER_LEADER_ELECTION": "false",
    }
    fleet = Fleet()
    try:
        for name, cluster, args in _components(strategies):
            port = _free_port()
            env = base | {"PODCOST_HTTP_PORT": str(port)}
            if cluster is not None:
                env |= {"PODCOST_CLUSTER": cluster, "KUBECONFIG": str(servers.kubeconfigs[cluster])}
            log_path = servers.logs / f"{name.replace('/', '-')}.log"
            log = log_path.open("wb")
            popen = subprocess.Popen(
                [sys.executable, "-m", "podcost", *args], env=env, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            fleet.add(_Process(name, port, popen, log, log_path))
        yield fleet
    finally:
        fleet.stop()
