"""``docker compose up`` of the repository's ``docker-compose.yml``, for real.

The compose binary ``make tools`` builds, against podman's Docker-compatible API service
(``podcost_localinfra.compose``: the engine from Debian's packages, its health checks run by the
project's timer where systemd is not the init). Nothing is pulled: the podcost services run
``podcost:<version>`` (``make image``), compose builds the broker's image from
``deploy/compose/kafka`` on the Debian base made by mmdebstrap, the broker's jars and Jaeger are
the ones the project builds. The services are on compose's own bridge network and reach the real
control plane through its gateway (``host.containers.internal``; a relay makes the loopback-only
kube-apiserver reachable there, the kubeconfig inline as the compose file asks).

Pass: ``up --wait`` returns with every service running and every health check healthy, every
podcost service answers ``/healthz`` on the port the file publishes, an opted-in Deployment's
pods get podcost's costs, Jaeger (the compose file's tracing
service) holds a decision's trace from the watcher's snapshot to the annotator's patch, and
``down`` removes every container.

About four minutes on a loaded two-core machine (twelve containers start, a JVM among them;
``up --wait`` alone took 160-170 s at a load average of 40-70), and it publishes the compose
file's fixed host ports, so two runs cannot share a machine: ``make test-long``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import ControlPlane, unavailable
from tests.support.kube import COST_ANNOTATION, KubeTestCluster, costed_by_podcost
from tests.support.relay import relay

from podcost.runtime.telemetry import SPAN_PATCH, SPAN_SNAPSHOT
from podcost_localinfra import build, compose, process

pytestmark = [pytest.mark.e2e, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
ZONES = ("zone-a", "zone-b", "zone-c")
JAEGER = "http://127.0.0.1:16686"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[compose.Engine]:
    """podman's API service and the health-check timer, with every image the file needs."""
    try:
        compose.ensure_images()
        started = compose.start_engine(tmp_path / "engine")
    except (build.BuildError, process.StartError, OSError) as error:
        unavailable(f"docker compose cannot run here: {error}")
    try:
        yield started
    finally:
        started.stop()


def container_kubeconfig(control_plane: ControlPlane, port: int, path: Path) -> Path:
    """The control plane's kubeconfig as a container on compose's network uses it: the server at
    the network's gateway, the CA inline, the serving certificate's own name checked."""
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    ca = Path(cluster.pop("certificate-authority")).read_bytes()
    cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    cluster["server"] = f"https://host.containers.internal:{port}"
    cluster["tls-server-name"] = "localhost"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)  # the containers' user (65532) reads it
    return path


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except OSError:
        return 0


def _published_http_port(service: dict[str, Any]) -> int:
    (entry,) = service["ports"]
    return int(str(entry).split(":")[1])


def _services(engine: compose.Engine) -> list[dict[str, Any]]:
    result = compose.compose(engine, "ps", "--all", "--format", "json", project_dir=ROOT)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


async def test_docker_compose_up_runs_the_pipeline_that_costs_a_real_clusters_pods(
    engine: compose.Engine,
    control_plane: ControlPlane,
    kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    run = f"compose-{uuid.uuid4().hex[:6]}"
    namespace, app = run, "web"
    nodes = {f"{run}-{zone}-{i}": zone for zone in ZONES for i in range(2)}
    api_port = int(
        yaml.safe_load(control_plane.kubeconfig.read_text())["clusters"][0]["cluster"][
            "server"
        ].rpartition(":")[2]
    )
    async with relay(api_port) as port:
        kubeconfig = container_kubeconfig(control_plane, port, tmp_path / "kubeconfig")
        try:
            took = await asyncio.to_thread(compose.up, engine, ROOT, kubeconfig)
            print(f"docker compose up --wait: {took:.1f}s")
            # Every service runs; every one with a health check is healthy.
            states = {s["Service"]: s for s in await asyncio.to_thread(_services, engine)}
            assert set(states) == set(COMPOSE["services"])
            for name, state in states.items():
                assert state["State"] == "running", f"{name}: {state['Status']}"
                if "healthcheck" in COMPOSE["services"][name]:
                    assert state["Health"] == "healthy", f"{name}: {state['Status']}"
            podcost = {
                n: s
                for n, s in COMPOSE["services"].items()
                if str(s["image"]).startswith("podcost:")
            }
            for name, service in podcost.items():
                url = f"http://127.0.0.1:{_published_http_port(service)}/healthz"
                assert await asyncio.to_thread(_status, url) == 200, name

            await kube.create_namespace(namespace)
            await asyncio.gather(*(kube.create_node(n, zone=z) for n, z in nodes.items()))
            await kube.create_deployment(namespace, app, 6, opt_in=True)
            await kube.wait_ready(namespace, app, 6)

            async def costed() -> bool:
                pods = await kube.active_pods(namespace, app)
                # podcost's cost on every pod, or none: the 0 a missing cost reads as, where 0
                # is that pod's place in the order (no write needed).
                ours = [costed_by_podcost(p.raw) for p in pods]
                bare = [COST_ANNOTATION not in (p.raw.metadata.annotations or {}) for p in pods]
                done = all(a or b for a, b in zip(ours, bare, strict=True))
                return len(pods) == 6 and sum(ours) >= 5 and done

            await kube.wait_for(costed, "every pod costed by the compose pipeline", 120, 0.5)

            async def traced() -> bool:
                query = urllib.parse.urlencode(
                    {"service": "podcost-annotator", "operation": SPAN_PATCH, "limit": "20"}
                )
                found = await asyncio.to_thread(_get_json, f"{JAEGER}/api/traces?{query}")
                for trace in found.get("data") or []:
                    names = {span["operationName"] for span in trace["spans"]}
                    services = {p["serviceName"] for p in trace["processes"].values()}
                    wanted = {"podcost-watcher", "podcost-aggregator"}
                    if SPAN_SNAPSHOT in names and wanted <= services:
                        return True
                return False

            await kube.wait_for(traced, "a decision's trace in the compose file's Jaeger", 60, 1)
        finally:
            logs = compose.compose(engine, "logs", "--tail", "30", project_dir=ROOT)
            print(logs.stdout[-20000:])
            await asyncio.to_thread(compose.down, engine, ROOT)
            await kube.delete_namespace(namespace)
            await kube.delete_nodes(list(nodes))
    assert await asyncio.to_thread(_services, engine) == []
