"""Start-to-ready of each podcost service: as a container of the image against as a process.

A script, not a test (``python -m tests.bench.bench_start_to_ready [--rounds 3]``); it prints
numbers and asserts nothing. It builds the image (``podcost_localinfra.image``, warm: seconds),
starts its own broker and control plane, renders the chart (mode ``all`` over Kafka, two
strategies) and, one service at a time so that none competes with another for the CPU, starts
each Deployment's container with podman (``tests.support.containers``: exactly the rendered
spec, in-cluster token for the watcher and annotator) and the same spec as a ``python -m
podcost`` process (``tests.support.services``, the admin kubeconfig), timing each from the
start command to the first ``/readyz`` 200 (polled every half second and every quarter second).
Median of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import uuid
from pathlib import Path

import yaml
from kubernetes_asyncio import config
from tests.support.containers import InCluster, PodContainer, render, rendered_pods
from tests.support.least_privilege import install
from tests.support.services import RELEASE, ServiceProcess, chart_specs
from tests.support.tools import require_helm

from podcost_localinfra import cluster, image, kafka


def values(ref: str, bootstrap: str, run: str) -> dict[str, object]:
    repository, _, tag = ref.rpartition(":")
    registry, _, repository = repository.partition("/")
    kinds = ("workloads", "ranks", "costs", "deadletter")
    return {
        "image": {"registry": registry, "repository": repository, "tag": tag},
        "kafka": {"bootstrapServers": bootstrap,
                  "topics": {kind: f"ready-{run}.{kind}" for kind in kinds}},
        "policy": {"strategies": [{"name": "topology-spread", "weight": 3},
                                  {"name": "capacity-type", "weight": 1}]},
    }  # fmt: skip


async def main(rounds: int) -> None:
    built = image.ensure_image()
    print(f"image {built.ref}: {built.size / 2**20:.1f} MiB (build now {built.seconds:.1f}s)")
    helm = require_helm()
    work = Path(tempfile.mkdtemp(prefix="podcost-ready-"))
    broker = kafka.start(work / "kafka")
    plane = cluster.start(work / "cluster")
    try:
        admin = await config.new_client_from_config(config_file=str(plane.kubeconfig))
        async with admin:
            account = await install(admin, plane.kubeconfig, "default", release=RELEASE)
            kube = yaml.safe_load(plane.kubeconfig.read_text())["clusters"][0]["cluster"]
            host, _, port = kube["server"].removeprefix("https://").rpartition(":")
            ca = await asyncio.to_thread(Path(kube["certificate-authority"]).read_text)
            access = InCluster(await account.token(), ca, host, int(port))
            run = uuid.uuid4().hex[:8]
            rendered = values(built.ref, broker.bootstrap, run)
            objects = render(helm, rendered, "default")
            config_maps = {o["metadata"]["name"]: o.get("data") or {} for o in objects
                           if o["kind"] == "ConfigMap"}  # fmt: skip
            specs = {spec.name: spec for spec in chart_specs(helm, rendered)}
            results: dict[str, dict[str, list[float]]] = {}
            for _ in range(rounds):
                for pod in rendered_pods(objects):
                    times = results.setdefault(pod.name, {"container": [], "process": []})
                    container = PodContainer(
                        pod, built.ref, work / "ctr" / pod.name,
                        config_maps=config_maps, in_cluster=access,
                    )  # fmt: skip
                    container.start()
                    try:
                        await container.wait_ready()
                        assert container.ready_after is not None
                        times["container"].append(container.ready_after)
                    finally:
                        container.stop()
                    proc = ServiceProcess(specs[pod.name],
                                          env={"KUBECONFIG": str(plane.kubeconfig)},
                                          log_dir=work / "proc")  # fmt: skip
                    await proc.start()
                    try:
                        await proc.wait_ready(timeout=120)
                        assert proc.ready_after is not None
                        times["process"].append(proc.ready_after)
                    finally:
                        await proc.stop()
            print(f"{'service':<24} {'container':>10} {'process':>10}  (median of {rounds}, s)")
            for name, times in sorted(results.items()):
                print(f"{name:<24} {statistics.median(times['container']):10.1f} "
                      f"{statistics.median(times['process']):10.1f}")  # fmt: skip
    finally:
        plane.stop()
        broker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))
