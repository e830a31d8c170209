"""podcost's image, built by a real engine, runs what the Helm chart deploys.

The image is built by ``podcost_localinfra.image`` (``make image``: podman from Debian's
packages, a bookworm Python 3.11 base made by mmdebstrap; layers cached, so a warm build takes
seconds). Then every Deployment the chart renders (mode ``all`` over Kafka: watcher, annotator,
aggregator, a ranker per strategy) runs as a container of it with exactly its rendered spec
(``tests.support.containers``): command, args, env, user 65532, read-only root with the chart's
``emptyDir`` volumes, capabilities dropped, and the in-cluster configuration of the chart's
ServiceAccount (a TokenRequest token, the CA, ``KUBERNETES_SERVICE_HOST``/``_PORT``) against the
real control plane; its probes are polled as the kubelet would, and each answers ``/healthz``,
``/readyz`` and ``/metrics``. A container that cannot honour a chart setting fails: shown by
breaking one setting at a time. Under ``CI=true`` an image that cannot be built fails.
"""

from __future__ import annotations

import asyncio
import copy
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from tests.conftest import ControlPlane, unavailable
from tests.support import containers
from tests.support.containers import ChartContainerError, InCluster, PodContainer, RenderedPod
from tests.support.kube import COST_ANNOTATION, KubeTestCluster, costed_by_podcost
from tests.support.least_privilege import ServiceAccount, install
from tests.support.secure_kafka import SecureBroker
from tests.support.services import RELEASE, parse_metrics, sample
from tests.support.snapshots import CLUSTER
from tests.support.tools import require_helm

from podcost_localinfra import build
from podcost_localinfra import image as engine
from podcost_localinfra.kafka_secure import MECHANISM

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def podcost_image() -> str:
    """``podcost:<version>`` built from the working tree (cached layers: fast when warm)."""
    try:
        return engine.ensure_image().ref
    except (build.BuildError, OSError, subprocess.SubprocessError) as error:
        unavailable(f"the podcost image cannot be built: {error}")


@pytest.fixture(scope="module")
def helm() -> Path:
    return require_helm()


def chart_values(image_ref: str, bootstrap: str, run: str) -> dict[str, Any]:
    repository, _, tag = image_ref.rpartition(":")
    registry, _, repository = repository.partition("/")
    return {
        "image": {"registry": registry, "repository": repository, "tag": tag},
        "kafka": {
            "bootstrapServers": bootstrap,
            "topics": {
                kind: f"containers-{run}.{kind}"
                for kind in ("workloads", "ranks", "costs", "deadletter")
            },
        },
        "policy": {
            "strategies": [
                {"name": "topology-spread", "weight": 3},
                {"name": "capacity-type", "weight": 1},
            ]
        },
    }


def run_podman(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *argv], env=engine.engine_env(), capture_output=True, text=True, timeout=120
    )


def test_the_image_runs_podcost_as_the_chart_runs_it(podcost_image: str) -> None:
    result = run_podman(
        "run", "--rm", "--read-only", "--read-only-tmpfs=false", "--user", "65532:65532",
        "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        podcost_image, "--help",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for command in ("watcher", "ranker", "aggregator", "annotator", "run", "simulate"):
        assert command in result.stdout
    labels = engine.inspect(podcost_image)["Labels"]
    assert isinstance(labels, dict)
    assert labels["org.opencontainers.image.version"] == engine.version()


def test_the_image_carries_no_installer(podcost_image: str) -> None:
    result = run_podman(
        "run", "--rm", "--entrypoint", "/bin/sh", podcost_image, "-c",
        "for tool in pip pip3 uv gcc cc; do command -v $tool; done; "
        "python3 -c 'import pip' 2>/dev/null && echo pip-module; true",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


async def in_cluster(
    kube: KubeTestCluster, control_plane: ControlPlane, namespace: str, release: str
) -> tuple[InCluster, ServiceAccount]:
    """The chart's ServiceAccount and RBAC of ``release`` installed in ``namespace``; a pod's
    view of them (uninstall the account when done)."""
    account = await install(kube.api, control_plane.kubeconfig, namespace, release=release)
    token = await account.token()
    cluster = yaml.safe_load(control_plane.kubeconfig.read_text())["clusters"][0]["cluster"]
    host, _, port = cluster["server"].removeprefix("https://").rpartition(":")
    ca = await asyncio.to_thread(Path(cluster["certificate-authority"]).read_text)
    return InCluster(token, ca, host, int(port)), account


def pods_of(
    helm: Path, podcost_image: str, bootstrap: str, namespace: str, run: str,
    release: str = RELEASE,
) -> tuple[list[RenderedPod], dict[str, dict[str, str]]]:  # fmt: skip
    values = chart_values(podcost_image, bootstrap, run)
    objects = containers.render(helm, values, namespace, release)
    config_maps = {o["metadata"]["name"]: o.get("data") or {} for o in objects
                   if o["kind"] == "ConfigMap"}  # fmt: skip
    return containers.rendered_pods(objects), config_maps


async def test_every_deployment_the_chart_renders_runs_as_a_container_of_the_image(
    podcost_image: str, helm: Path, kafka_bootstrap: str, kube: KubeTestCluster,
    control_plane: ControlPlane, tmp_path: Path,
) -> None:  # fmt: skip
    run = uuid.uuid4().hex[:6]
    release = f"podcost-{run}"  # the ClusterRole's name: a release of its own
    namespace = await kube.create_namespace(f"ctr-{run}")
    access, account = await in_cluster(kube, control_plane, namespace, release)
    try:
        await _run_every_deployment(podcost_image, helm, kafka_bootstrap, kube, tmp_path,
                                    namespace, release, access, account.name)  # fmt: skip
    finally:
        await account.uninstall()
        await kube.delete_namespace(namespace)


async def _run_every_deployment(
    podcost_image: str, helm: Path, kafka_bootstrap: str, kube: KubeTestCluster, tmp_path: Path,
    namespace: str, release: str, access: InCluster, account: str,
) -> None:  # fmt: skip
    pods, config_maps = pods_of(helm, podcost_image, kafka_bootstrap, namespace, release, release)
    names = sorted(pod.name for pod in pods)
    assert names == ["aggregator", "annotator", "ranker-capacity-type",
                     "ranker-topology-spread", "watcher"]  # fmt: skip
    assert {pod.service_account for pod in pods} == {account}
    running = [
        PodContainer(pod, podcost_image, tmp_path / pod.name, config_maps=config_maps,
                     in_cluster=access)
        for pod in pods
    ]  # fmt: skip
    with containers.stopped_at_exit(running):
        for container in running:
            container.start()
        await asyncio.gather(*(container.wait_ready() for container in running))
        for container in running:
            for path in ("/healthz", "/readyz"):
                status, _ = container.get(path)
                assert status == 200, f"{container.pod.name} {path}: {status}"
            status, body = container.get("/metrics")
            assert status == 200
            assert any(name.startswith("podcost_") for name in parse_metrics(body))
        # Only the pods that call the API server carry a token (automountServiceAccountToken).
        mounted = {c.pod.name for c in running if c.pod.automount}
        assert mounted == {"watcher", "annotator"}
        # The watcher took its Lease with its service account's token: in-cluster access works.
        lease = await client.CoordinationV1Api(kube.api).read_namespaced_lease(
            f"{release}-watcher", namespace
        )
        assert lease.spec.holder_identity == "watcher"
        for container in running:
            assert container.stop() == 0, f"{container.pod.name}:\n{container.logs()}"


def _drop_tmp(pod: RenderedPod) -> None:
    pod.container["volumeMounts"] = [
        m for m in pod.container["volumeMounts"] if m["mountPath"] != "/tmp"
    ]


def _wrong_probe_path(pod: RenderedPod) -> None:
    pod.container["readinessProbe"]["httpGet"]["path"] = "/ready"


def _wrong_port(pod: RenderedPod) -> None:
    pod.container["ports"][0]["containerPort"] = 9090


def _missing_cluster(pod: RenderedPod) -> None:
    # Over Kafka, an agent without its cluster's name refuses to start.
    pod.container["env"] = [e for e in pod.container["env"] if e["name"] != "PODCOST_CLUSTER"]


def _missing_secret(pod: RenderedPod) -> None:
    pod.container["env"].append(
        {"name": "PODCOST_KAFKA_SASL_PASSWORD",
         "valueFrom": {"secretKeyRef": {"name": "absent", "key": "password"}}}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("component", "breaking", "reason"),
    [
        # The aggregator's data directory is under /tmp: without the emptyDir, unwritable.
        ("aggregator", _drop_tmp, r"exited with \d+(.|\n)*Read-only file system"),
        ("ranker-capacity-type", _wrong_probe_path, "404, the service serves no such path"),
        ("ranker-capacity-type", _wrong_port, "the service listens on 8080"),
        ("annotator", _missing_cluster, "exited with 2 before"),
        ("ranker-capacity-type", _missing_secret, "absent/password, which does not exist"),
    ],
    ids=[
        "unwritable-tmp",
        "probe-on-a-wrong-path",
        "wrong-port",
        "missing-variable",
        "missing-secret",
    ],
)
async def test_a_chart_setting_the_container_cannot_honour_fails(
    podcost_image: str, helm: Path, kafka_bootstrap: str, tmp_path: Path,
    component: str, breaking: Callable[[RenderedPod], None], reason: str,
) -> None:  # fmt: skip
    pods, config_maps = pods_of(helm, podcost_image, kafka_bootstrap, "default", "broken")
    pod = next(p for p in pods if p.name == component)
    broken = RenderedPod(pod.name, pod.namespace, pod.pod, copy.deepcopy(pod.container))
    breaking(broken)
    container = PodContainer(broken, podcost_image, tmp_path, config_maps=config_maps)

    async def run() -> None:
        container.start()
        await container.wait_ready(timeout=60)

    with containers.stopped_at_exit([container]), pytest.raises(ChartContainerError, match=reason):
        await run()


@pytest.fixture(scope="module")
def plugin_image(podcost_image: str) -> str:
    """The example plugin's image, layered on ``podcost_image``."""
    try:
        return engine.ensure_plugin_image().ref
    except (build.BuildError, OSError, subprocess.SubprocessError) as error:
        unavailable(f"the plugin's image cannot be built: {error}")


async def test_the_example_plugin_is_one_more_ranker_with_its_own_image_and_sways_the_costs(
    podcost_image: str, plugin_image: str, helm: Path, kafka_bootstrap: str,
    kube: KubeTestCluster, control_plane: ControlPlane, tmp_path: Path,
) -> None:  # fmt: skip
    run = uuid.uuid4().hex[:6]
    release = f"podcost-{run}"
    namespace = await kube.create_namespace(f"plugin-{run}")
    account = await install(kube.api, control_plane.kubeconfig, namespace,
                            {"watch.namespace": namespace}, release=release)  # fmt: skip
    nodes = [f"plugin-{run}-{zone}" for zone in ("zone-a", "zone-b")]
    try:
        for node, zone in zip(nodes, ("zone-a", "zone-b"), strict=True):
            await kube.create_node(node, zone=zone, labels={"plugin": run})
        # As a platform team adds a strategy: the plugin's ranker runs the plugin's image, and
        # every other component podcost's, which knows `restarts` by name only.
        values = chart_values(podcost_image, kafka_bootstrap, release)
        values["policy"]["strategies"].append({"name": "restarts", "weight": 2})
        values["rankers"] = {"overrides": {"restarts": {"image": _image_values(plugin_image)}}}
        values["watch"] = {"namespace": namespace}
        objects = containers.render(helm, values, namespace, release)
        config_maps = {o["metadata"]["name"]: o.get("data") or {} for o in objects
                       if o["kind"] == "ConfigMap"}  # fmt: skip
        pods = containers.rendered_pods(objects)
        images = {pod.name: pod.container["image"] for pod in pods}
        assert images.pop("ranker-restarts") == plugin_image
        assert set(images.values()) == {podcost_image}
        text = await asyncio.to_thread(control_plane.kubeconfig.read_text)
        cluster = yaml.safe_load(text)["clusters"][0]["cluster"]
        host, _, port = cluster["server"].removeprefix("https://").rpartition(":")
        ca = await asyncio.to_thread(Path(cluster["certificate-authority"]).read_text)
        access = InCluster(await account.token(), ca, host, int(port))
        running = [
            PodContainer(pod, pod.container["image"], tmp_path / pod.name,
                         config_maps=config_maps, in_cluster=access)
            for pod in pods
        ]  # fmt: skip
        with containers.stopped_at_exit(running):
            for container in running:
                container.start()
            await asyncio.gather(*(container.wait_ready() for container in running))
            by_name = {c.pod.name: c for c in running}
            await kube.create_deployment(namespace, "web", 4, opt_in=True,
                                         node_selector={"plugin": run})  # fmt: skip
            await kube.wait_ready(namespace, "web", 4)

            seen: dict[str, Any] = {}

            async def costs() -> dict[str, int]:
                found = {}
                for pod in await kube.active_pods(namespace, "web"):
                    if costed_by_podcost(pod.raw):
                        found[pod.name] = int(pod.raw.metadata.annotations[COST_ANNOTATION])
                return found

            async def costed_with_every_strategy() -> bool:
                ranked = await by_name["ranker-restarts"].metrics()
                agg = await by_name["aggregator"].metrics()
                seen.update(
                    costs=await costs(),
                    ranked=sample(ranked, "podcost_snapshots_ranked_total", strategy="restarts"),
                    complete=sample(agg, "podcost_combinations_total", completeness="complete"),
                )
                # A pod may keep the 0 a missing cost reads as, where 0 is its place.
                return bool(seen["costs"]) and seen["ranked"] > 0 and seen["complete"] > 0

            async def restarted_goes_first(pod_name: str) -> bool:
                seen["costs"] = found = await costs()
                cost = found.get(pod_name, 0)
                return all(cost < other for name, other in found.items() if name != pod_name)

            try:
                await kube.wait_for(costed_with_every_strategy, "costs with the plugin's ranks", 90)
                # The pod podcost keeps longest crash-loops: only the plugin's strategy reads
                # restarts, so only its ranks can make that pod the first to go.
                kept = max(seen["costs"], key=seen["costs"].__getitem__)
                await _set_restarts(kube, namespace, kept, 10)
                await kube.wait_for(
                    lambda: restarted_goes_first(kept), "the restarted pod deleted first", 90
                )
            except AssertionError as error:
                error.add_note(f"seen: {seen}")
                for container in running:
                    error.add_note(f"--- {container.pod.name}:\n{container.logs(15)}")
                raise
            for container in running:
                assert container.stop() == 0, f"{container.pod.name}:\n{container.logs()}"
    finally:
        await account.uninstall()
        await kube.delete_namespace(namespace)
        await kube.delete_nodes(nodes)


async def _set_restarts(kube: KubeTestCluster, namespace: str, name: str, count: int) -> None:
    """Give pod ``name``'s containers ``count`` restarts (its status, as a kubelet reports)."""
    pod = await kube.core.read_namespaced_pod(name, namespace)
    statuses = [
        {"name": status.name, "restartCount": count, "ready": status.ready,
         "image": status.image, "imageID": status.image_id or "",
         "state": {"running": {"startedAt": status.state.running.started_at.isoformat()}}}
        for status in pod.status.container_statuses
    ]  # fmt: skip
    await kube.core.patch_namespaced_pod_status(
        name, namespace, {"status": {"containerStatuses": statuses}}
    )


async def test_with_tls_and_a_scram_user_per_component_every_container_joins_the_secure_broker(
    podcost_image: str, helm: Path, secure_kafka_broker: SecureBroker, kube: KubeTestCluster,
    control_plane: ControlPlane, tmp_path: Path,
) -> None:  # fmt: skip
    # The broker's ACLs are about the services' default topic names and the annotator of
    # CLUSTER: the chart's defaults, and clusterName CLUSTER.
    broker = secure_kafka_broker
    run = uuid.uuid4().hex[:6]
    release = f"podcost-{run}"
    namespace = await kube.create_namespace(f"sasl-{run}")
    access, account = await in_cluster(kube, control_plane, namespace, release)
    users = {"watcher": f"watcher-{CLUSTER}", "ranker": "ranker", "aggregator": "aggregator",
             "annotator": f"annotator-{CLUSTER}"}  # fmt: skip
    ca = await asyncio.to_thread(broker.ca_file.read_text)
    secrets = {"kafka-ca": {"ca.crt": ca}} | {
        f"kafka-{role}": {"username": user, "password": broker.passwords[user]}
        for role, user in users.items()
    }
    values = {
        "clusterName": CLUSTER,
        "image": _image_values(podcost_image),
        "kafka": {
            "bootstrapServers": broker.bootstrap,
            "securityProtocol": "SASL_SSL",
            "tls": {"caSecret": {"name": "kafka-ca"}},
            "sasl": {
                "mechanism": MECHANISM,
                "secretNames": {role: f"kafka-{role}" for role in users},
            },
        },
        "policy": {"strategies": [{"name": "topology-spread"}, {"name": "age"}]},
        "watch": {"namespace": namespace},
    }
    nodes = [f"sasl-{run}-{zone}" for zone in ("zone-a", "zone-b")]
    try:
        # A workload first: the annotator is ready once its costs topic exists, which the
        # aggregator creates by writing the first decision.
        for node, zone in zip(nodes, ("zone-a", "zone-b"), strict=True):
            await kube.create_node(node, zone=zone, labels={"sasl": run})
        await kube.create_deployment(namespace, "web", 4, opt_in=True,
                                     node_selector={"sasl": run})  # fmt: skip
        await kube.wait_ready(namespace, "web", 4)
        objects = containers.render(helm, values, namespace, release)
        config_maps = {o["metadata"]["name"]: o.get("data") or {} for o in objects
                       if o["kind"] == "ConfigMap"}  # fmt: skip
        pods = containers.rendered_pods(objects)
        assert sorted(p.name for p in pods) == ["aggregator", "annotator", "ranker-age",
                                                "ranker-topology-spread", "watcher"]  # fmt: skip
        running = [
            PodContainer(pod, podcost_image, tmp_path / pod.name, secrets=secrets,
                         config_maps=config_maps, in_cluster=access)
            for pod in pods
        ]  # fmt: skip
        with containers.stopped_at_exit(running):
            for container in running:
                container.start()
            await asyncio.gather(*(container.wait_ready(timeout=240) for container in running))

            async def costed() -> bool:
                pods = await kube.active_pods(namespace, "web")
                return any(costed_by_podcost(pod.raw) for pod in pods)

            await kube.wait_for(costed, "costs written over the secure broker", 90)
            for container in running:
                status, _ = container.get("/readyz")
                assert status == 200, container.pod.name
                assert container.stop() == 0, f"{container.pod.name}:\n{container.logs()}"
    finally:
        await account.uninstall()
        await kube.delete_namespace(namespace)
        await kube.delete_nodes(nodes)


def _image_values(ref: str) -> dict[str, str]:
    repository, _, tag = ref.rpartition(":")
    registry, _, repository = repository.partition("/")
    return {"registry": registry, "repository": repository, "tag": tag}
