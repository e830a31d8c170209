"""The fleet of ``test_fleet.py`` with every podcost component a container of the built image.

Two real control planes and one real broker, as in ``tests/e2e/test_fleet.py``; the image built
by ``podcost_localinfra.image`` (``make image``). The chart is rendered in ``agent`` mode for
clusters ``a`` and ``b`` and in ``core`` mode once, and each rendered Deployment runs as a podman
container with exactly its spec (``tests/support/containers.py``): the agents reach their cluster
with the in-cluster configuration of the chart's ServiceAccount installed there (a TokenRequest
token, the CA, ``KUBERNETES_SERVICE_HOST``/``_PORT``), not with a kubeconfig. Then the fleet
checks of ``test_fleet.py`` (every pod costed by podcost, each annotator reading only its own
cluster's topic, no request to ``b`` for ``a``'s records, scale-in to the least zone skew), and
every component answers ``/healthz``, ``/readyz`` and ``/metrics`` and exits 0 on SIGTERM.

About a minute on this loaded two-core machine (the process fleet of ``test_fleet.py`` takes
longer: the image's virtualenv has its bytecode compiled at build time), so it is in ``make
test``.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import ControlPlane, unavailable
from tests.e2e.test_fleet import Cluster, _clean, _fleet_checks, _prepare
from tests.support import containers
from tests.support.containers import InCluster, PodContainer
from tests.support.kube import KubeTestCluster
from tests.support.least_privilege import ServiceAccount, install
from tests.support.services import parse_metrics
from tests.support.tools import require_helm

from podcost_bus import BusSettings
from podcost_core.policy import DEFAULT_POLICY
from podcost_localinfra import build
from podcost_localinfra import image as engine

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def podcost_image() -> str:
    try:
        return engine.ensure_image().ref
    except (build.BuildError, OSError) as error:
        unavailable(f"the podcost image cannot be built: {error}")


def _image_values(ref: str) -> dict[str, str]:
    repository, _, tag = ref.rpartition(":")
    registry, _, repository = repository.partition("/")
    return {"registry": registry, "repository": repository, "tag": tag}


async def _access(
    cluster: Cluster, control_plane: ControlPlane, release: str, namespace: str
) -> tuple[InCluster, ServiceAccount]:
    """The chart's ServiceAccount and RBAC (watching ``namespace``) installed in ``default``."""
    account = await install(cluster.kube.api, control_plane.kubeconfig, "default",
                            {"watch.namespace": namespace}, release=release)  # fmt: skip
    text = await asyncio.to_thread(control_plane.kubeconfig.read_text)
    server = yaml.safe_load(text)["clusters"][0]["cluster"]
    ca = await asyncio.to_thread(Path(server["certificate-authority"]).read_text)
    host, _, port = server["server"].removeprefix("https://").rpartition(":")
    return InCluster(await account.token(), ca, host, int(port)), account


async def test_a_fleet_of_containers_costs_every_pod_and_scales_in_to_the_least_skew(
    podcost_image: str,
    kafka_bootstrap: str,
    control_plane: ControlPlane,
    second_control_plane: ControlPlane,
    kube: KubeTestCluster,
    second_kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    helm = require_helm()
    run = f"ctrfleet-{uuid.uuid4().hex[:6]}"
    namespace = run
    planes = {"a": control_plane, "b": second_control_plane}
    clusters = {
        "a": Cluster("a", kube, control_plane.kubeconfig),
        "b": Cluster("b", second_kube, second_control_plane.kubeconfig),
    }
    bus_settings = BusSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_workloads=f"{run}.workloads", topic_ranks=f"{run}.ranks",
        topic_costs=f"{run}.costs", topic_deadletter=f"{run}.deadletter",
    )  # fmt: skip
    topics = bus_settings.topics
    kafka: dict[str, Any] = {
        "bootstrapServers": kafka_bootstrap,
        "topics": {"workloads": topics.workloads, "ranks": topics.ranks,
                   "costs": topics.costs, "deadletter": topics.deadletter},
    }  # fmt: skip
    image = _image_values(podcost_image)
    accounts: list[ServiceAccount] = []
    running: list[PodContainer] = []
    try:
        await asyncio.gather(*(_prepare(c, namespace, run) for c in clusters.values()))
        core_objects = containers.render(
            helm, {"mode": "core", "kafka": kafka, "image": image}, "default", f"{run}-core"
        )
        for pod in containers.rendered_pods(core_objects, prefix="core/"):
            running.append(PodContainer(
                pod, podcost_image, tmp_path / pod.name,
                config_maps=_config_maps(core_objects),
                # faust's consumer group and changelog topics: this run's own.
                extra_env={"PODCOST_AGGREGATOR_APP_ID": f"{run}-aggregator"},
            ))  # fmt: skip
        for name, cluster in clusters.items():
            release = f"{run}-{name}"
            access, account = await _access(cluster, planes[name], release, namespace)
            accounts.append(account)
            values = {"mode": "agent", "clusterName": name, "kafka": kafka, "image": image,
                      "watch": {"namespace": namespace}}  # fmt: skip
            objects = containers.render(helm, values, "default", release)
            for pod in containers.rendered_pods(objects, prefix=f"{name}/"):
                running.append(PodContainer(
                    pod, podcost_image, tmp_path / pod.name,
                    config_maps=_config_maps(objects), in_cluster=access,
                ))  # fmt: skip
        names = sorted(c.pod.name for c in running)
        assert names == sorted([
            "core/aggregator", *(f"core/ranker-{s}" for s in DEFAULT_POLICY.names),
            "a/watcher", "a/annotator", "b/watcher", "b/annotator",
        ])  # fmt: skip
        with containers.stopped_at_exit(running):
            for container in running:
                container.start()
            await asyncio.gather(*(c.wait_ready(timeout=240) for c in running))
            by_name = {c.pod.name: c for c in running}
            await _fleet_checks(clusters, by_name, namespace, bus_settings)  # type: ignore[arg-type]
            for container in running:
                for path in ("/healthz", "/readyz"):
                    status, _ = container.get(path)
                    assert status == 200, f"{container.pod.name} {path}: {status}"
                status, body = container.get("/metrics")
                assert status == 200
                assert any(key.startswith("podcost_") for key in parse_metrics(body))
            for container in running:
                assert container.stop() == 0, f"{container.pod.name}:\n{container.logs()}"
    finally:
        for account in accounts:
            await account.uninstall()
        await asyncio.gather(*(_clean(cluster, namespace) for cluster in clusters.values()))


def _config_maps(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o.get("data") or {} for o in objects if o["kind"] == "ConfigMap"}
