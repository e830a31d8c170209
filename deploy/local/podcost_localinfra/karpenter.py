"""Karpenter (with its kwok cloud provider) against a running control plane of ``cluster``.

Called by the node-autoscaler tests and benchmark. ``start`` installs Karpenter's CRDs (the
API server takes their YAML as it ships), writes the instance types the kwok provider offers,
and starts ``karpenter-kwok`` by pid with the control plane's kubeconfig: leader election off,
metrics and health probes on free ports, short batching windows so a test's pending pods are
provisioned in seconds. Karpenter has no webhooks to serve (v1 dropped them). Its nodes are
plain Node objects the provider creates; the control plane's kwok (``--manage-all-nodes``)
makes them Ready and plays their pods' lifecycle, as for any other node.

The offered capacity is one instance type (``INSTANCE_TYPE``: 4 CPUs, 16 GiB) in spot and
on-demand in three zones, so every node Karpenter makes is alike and a consolidation can only
delete a node (no cheaper type to replace it with): nodes freed and pods evicted are then
counted without ambiguity.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import build, paths, process

NAME = "karpenter"
ZONES = ("test-zone-a", "test-zone-b", "test-zone-c")
INSTANCE_TYPE = "c-4x-amd64-linux"
#: Prices per hour of ``INSTANCE_TYPE`` by capacity type (the kwok provider's own for it).
PRICES = {"spot": 0.076, "on-demand": 0.109}
INSTANCE_RESOURCES = {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "20Gi"}


@dataclass(frozen=True)
class Karpenter:
    """A started Karpenter."""

    run_dir: Path
    pid: int
    metrics: str
    """Its Prometheus endpoint, ``http://127.0.0.1:<port>/metrics``."""
    started_in: float

    def stop(self) -> None:
        process.stop_all(self.run_dir)


def instance_types(
    zones: tuple[str, ...] = ZONES, prices: dict[str, float] | None = None
) -> list[dict[str, object]]:
    """The kwok provider's instance-types file (``INSTANCE_TYPES_FILE_PATH``): ``INSTANCE_TYPE``
    offered in each capacity type of ``prices`` in each of ``zones``."""
    offerings = [
        {
            "Price": price,
            "Available": True,
            "Requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [capacity]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]},
            ],
        }
        for zone in zones
        for capacity, price in (prices or PRICES).items()
    ]
    return [
        {
            "name": INSTANCE_TYPE,
            "offerings": offerings,
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": INSTANCE_RESOURCES,
        }
    ]


def _request(
    info: dict[str, str], method: str, path: str, body: bytes | None = None, content_type: str = ""
) -> tuple[int, bytes]:
    """One request to the control plane's API server as its admin: the HTTP status and body."""
    context = ssl.create_default_context(cafile=info["ca"])
    request = urllib.request.Request(f"{info['server']}{path}", data=body, method=method)
    request.add_header("Authorization", f"Bearer {info['token']}")
    if content_type:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()


def _established(info: dict[str, str], name: str) -> bool:
    status, body = _request(info, "GET", f"{CRDS_PATH}/{name}")
    if status != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def install_crds(plane_run_dir: Path, timeout: float = 60.0) -> None:
    """Create Karpenter's CRDs (an existing one is kept) and wait until each is established."""
    info = json.loads((plane_run_dir / "cluster.json").read_text())
    names: list[str] = []
    for crd in sorted(paths.karpenter_crds_dir().glob("*.yaml")):
        status, body = _request(info, "POST", CRDS_PATH, crd.read_bytes(), "application/yaml")
        if status not in (201, 409):
            raise process.StartError(f"creating the CRD of {crd.name}: HTTP {status} {body!r}")
        group, plural = crd.stem.split("_", 1)  # <group>_<plural>.yaml, named <plural>.<group>
        names.append(f"{plural}.{group}")
    deadline = time.monotonic() + timeout
    for name in names:
        while not _established(info, name):
            if time.monotonic() > deadline:
                raise process.StartError(f"the CRD {name} never became established")
            time.sleep(0.2)


def start(
    run_dir: Path,
    plane_run_dir: Path,
    *,
    timeout: float = 120.0,
    zones: tuple[str, ...] = ZONES,
    prices: dict[str, float] | None = None,
    log_level: str = "info",
) -> Karpenter:
    """Build (if needed) Karpenter, install its CRDs into the control plane of
    ``plane_run_dir`` (``cluster.start``'s run directory) and start it in ``run_dir``; wait until
    it is ready (``/readyz``: caches synced, CRDs mapped)."""
    binary = build.ensure_karpenter_tool()
    run_dir.mkdir(parents=True, exist_ok=True)
    install_crds(plane_run_dir, timeout)
    types_file = run_dir / "instance-types.json"
    process.write_json(types_file, instance_types(zones, prices))
    metrics_port, health_port = process.free_port(), process.free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "KUBECONFIG": str(plane_run_dir / "kubeconfig"),
        "DISABLE_LEADER_ELECTION": "true",
        "METRICS_PORT": str(metrics_port),
        "HEALTH_PROBE_PORT": str(health_port),
        "INSTANCE_TYPES_FILE_PATH": str(types_file),
        "LOG_LEVEL": log_level,
        # A test's pods arrive together: close the provisioning batch soon after they stop.
        "BATCH_MAX_DURATION": "3s",
        "BATCH_IDLE_DURATION": "500ms",
        "CPU_REQUESTS": "1000",
    }
    started = time.monotonic()
    daemon = process.start(run_dir, NAME, [str(binary)], env)
    process.wait_until(
        daemon,
        lambda: process.https_ok(f"http://127.0.0.1:{health_port}/readyz"),
        timeout,
        "ready (/readyz)",
    )
    return Karpenter(
        run_dir=run_dir,
        pid=daemon.pid,
        metrics=f"http://127.0.0.1:{metrics_port}/metrics",
        started_in=time.monotonic() - started,
    )
