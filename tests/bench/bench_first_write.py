"""Benchmark of a (re)start: from ``podcost run`` being spawned to its first cost PATCH.

A script, not a test (``uv run python -m tests.bench.bench_first_write [--rounds N]
[--kafka HOST:PORT] [--podcost PATH ...]``). It uses the cluster of ``$KUBECONFIG`` when
``PODCOST_USE_KUBECONFIG=1``, else starts its own control plane in a temporary directory
(``podcost_localinfra``). It creates one namespace with an opted-in 10-replica Deployment whose
pods carry no cost, then, per round, spawns ``podcost run`` (embedded; over Kafka with
``--kafka``) watching that namespace, reads its log until the first ``set pod ... cost`` line
(the first PATCH that landed) and stops it, and removes the costs again for the next round.
Prints each round's seconds from spawn to that line, and the median. ``--podcost`` (repeatable,
rounds interleaved) runs other checkouts' entry points, e.g. the main branch's
``.venv/bin/podcost`` next to this one's, for a before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kubernetes_asyncio import config
from tests.support.kube import KubeTestCluster

from podcost_kube.client import Kube
from podcost_localinfra import cluster

PODS = 10
FIRST_WRITE = b"set pod "


async def _first_write(podcost: str, kubeconfig: str, namespace: str, kafka: str | None) -> float:
    env = {
        **os.environ,
        "KUBECONFIG": kubeconfig,
        "PODCOST_WATCHER_NAMESPACE": namespace,
        "PODCOST_HTTP_PORT": "0",
        "PODCOST_LOG_LEVEL": "INFO",
        "PODCOST_CLUSTER": f"bench-{namespace}",
    }
    argv = [podcost, "run"]
    if kafka:
        run = uuid.uuid4().hex[:6]
        argv += ["--kafka", kafka]
        env.update({f"PODCOST_TOPIC_{t.upper()}": f"bench-{run}.{t}"
                    for t in ("workloads", "ranks", "costs", "deadletter")})  # fmt: skip
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(120):
            while True:
                line = await proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"podcost run exited with {await proc.wait()}")
                if FIRST_WRITE in line:
                    return time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(30):
                await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def bench(kubeconfig: str, rounds: int, entries: list[str], kafka: str | None) -> None:
    api = await config.new_client_from_config(config_file=kubeconfig)
    async with api:
        kube = KubeTestCluster(api)
        namespace = await kube.create_namespace(f"first-write-{uuid.uuid4().hex[:6]}")
        node = f"{namespace}-node"
        await kube.create_node(node, zone="zone-a", labels={"bench": namespace})
        try:
            await kube.create_deployment(
                namespace, "web", PODS, opt_in=True, node_selector={"bench": namespace}
            )
            pods = await kube.wait_ready(namespace, "web", PODS)
            seconds: dict[str, list[float]] = {entry: [] for entry in entries}
            for _ in range(rounds):
                for entry in entries:  # interleaved: the machine's load hits each alike
                    seconds[entry].append(await _first_write(entry, kubeconfig, namespace, kafka))
                    for pod in pods:  # no cost again: the next start has writes to make
                        await Kube(api).patch_deletion_cost(namespace, pod.name, None)
            mode = f"over Kafka at {kafka}" if kafka else "embedded"
            for entry, times in seconds.items():
                print(f"podcost run ({mode}, {entry}): process start to first write, {PODS} pods")
                print("  rounds: " + ", ".join(f"{s:.2f}s" for s in times))
                print(f"  median: {statistics.median(times):.2f}s")
        finally:
            await kube.delete_namespace(namespace)
            await kube.delete_nodes([node])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="starts to measure")
    parser.add_argument("--kafka", help="bootstrap servers: run over Kafka, not embedded")
    parser.add_argument(
        "--podcost", action="append", help="a podcost entry point to run (repeatable) [this one]"
    )
    args = parser.parse_args()
    args.podcost = args.podcost or [str(Path(sys.executable).with_name("podcost"))]
    if os.environ.get("PODCOST_USE_KUBECONFIG") == "1" and os.environ.get("KUBECONFIG"):
        asyncio.run(bench(os.environ["KUBECONFIG"], args.rounds, args.podcost, args.kafka))
        return
    with tempfile.TemporaryDirectory(prefix="podcost-bench-") as run_dir:
        control_plane = cluster.start(Path(run_dir))
        try:
            asyncio.run(bench(str(control_plane.kubeconfig), args.rounds, args.podcost, args.kafka))
        finally:
            control_plane.stop()


if __name__ == "__main__":
    main()
