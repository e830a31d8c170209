"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and kwok for nodes and pod lifecycle (there is no kubelet).

Called by the CLI (``make cluster-up`` / ``make cluster-down``) and by the test fixtures. RBAC is
on; one static token in ``system:masters`` is the admin credential written to the kubeconfig.
Start order: etcd, apiserver (until ``/readyz``), then controller-manager, scheduler and kwok.
Stop is the reverse, each by its own pid. ``stop_apiserver`` / ``start_apiserver`` take the
kube-apiserver of a running control plane away and bring it back (same port, etcd and
certificates; the other daemons keep running): a real API server outage for the tests.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import build, paths, process

SERVICE_CIDR = "10.96.0.0/16"
APISERVER = "kube-apiserver"


@dataclass(frozen=True)
class Cluster:
    """A started control plane."""

    run_dir: Path
    server: str
    token: str
    kubeconfig: Path
    ca_file: Path
    timings: dict[str, float] = field(default_factory=dict)

    def stop(self) -> None:
        process.stop_all(self.run_dir)

    def stop_apiserver(self) -> int:
        """See :func:`stop_apiserver`."""
        return stop_apiserver(self.run_dir)

    def start_apiserver(self, timeout: float = 60.0) -> float:
        """See :func:`start_apiserver`."""
        return start_apiserver(self.run_dir, timeout)


def stop_apiserver(run_dir: Path) -> int:
    """Stop the kube-apiserver of the control plane in ``run_dir`` by its pid; returns the pid.
    Every request fails from now on (connection refused) until :func:`start_apiserver`."""
    return process.stop(run_dir, APISERVER)


def start_apiserver(run_dir: Path, timeout: float = 60.0) -> float:
    """Start the kube-apiserver of ``run_dir`` again, as it was started; wait until it is ready
    (``/readyz``). Returns the seconds that took."""
    info = json.loads((run_dir / "cluster.json").read_text())
    daemon = process.restart(run_dir, APISERVER)
    return process.wait_until(
        daemon,
        lambda: process.https_ok(f"{info['server']}/readyz", info["token"], Path(info["ca"])),
        timeout,
        "ready again (/readyz)",
    )


def _openssl(*argv: str, cwd: Path) -> None:
    subprocess.run(["openssl", *argv], cwd=cwd, check=True, capture_output=True)


def _make_pki(pki: Path) -> None:
    """A CA, a serving cert for 127.0.0.1/localhost, and the service-account key."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "3650",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=podcost-local-ca",
        cwd=pki,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "apiserver.key",
        "-out",
        "apiserver.csr",
        "-subj",
        "/CN=kube-apiserver",
        cwd=pki,
    )
    (pki / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "3650",
        "-out",
        "apiserver.crt",
        "-extfile",
        "san.ext",
        cwd=pki,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)  # fmt: skip


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str, user: str) -> None:
    """A kubeconfig for ``server`` authenticating with a bearer ``token``."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: podcost-local
  cluster:
    server: {server}
    certificate-authority: {ca_file}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: podcost-local
  context:
    cluster: podcost-local
    user: {user}
current-context: podcost-local
"""
    )


#: The API client rate of kube-controller-manager and kube-scheduler (their defaults, 20 and 50
#: requests/s, would pace a kwok cluster's growth).
CLIENT_QPS, CLIENT_BURST = 500, 1000


def _scheduler_args(
    run_dir: Path, kubeconfig: Path, nodes_to_score_percent: int | None
) -> list[str]:
    """kube-scheduler's client flags, or, with ``nodes_to_score_percent``, a configuration file
    saying the same and ``percentageOfNodesToScore`` (the flags' defaults compute it from the
    cluster's size: 50 % less a point per 125 nodes, at least 5 %; a 1,667-node cluster has a
    third of its nodes filtered and scored for every pod, which made the scheduler the slowest
    part of growing a large kwok cluster on 2 cores). It changes nothing below 100 nodes: the
    scheduler always looks at 100 feasible nodes at least."""
    if nodes_to_score_percent is None:
        return [f"--kubeconfig={kubeconfig}", "--leader-elect=false",
                f"--kube-api-qps={CLIENT_QPS}", f"--kube-api-burst={CLIENT_BURST}"]  # fmt: skip
    client = {"kubeconfig": str(kubeconfig), "qps": CLIENT_QPS, "burst": CLIENT_BURST}
    config = run_dir / "kube-scheduler.yaml"
    process.write_json(  # JSON is YAML
        config,
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": client,
            "leaderElection": {"leaderElect": False},
            "percentageOfNodesToScore": nodes_to_score_percent,
        },
    )
    return [f"--config={config}"]


def _kwok_configs(run_dir: Path, parallelism: int | None) -> list[str]:
    """kwok's ``--config`` files: its stages, and with ``parallelism`` a configuration saying how
    many pod stages (a pod's PATCH to Running, say) and node leases it plays at once. Its
    default of 4 each kept 14,000 scheduled pods of a growing kwok cluster Pending for minutes
    (4 PATCHes in flight to a busy API server: 10 pods/s), and let some of 1,667 node leases
    lapse."""
    configs = [f"--config={paths.kwok_stages_file()}"]
    if parallelism is not None:
        config = run_dir / "kwok.yaml"
        process.write_json(  # JSON is YAML
            config,
            {
                "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                "kind": "KwokConfiguration",
                "options": {
                    "podPlayStageParallelism": parallelism,
                    "nodePlayStageParallelism": parallelism,
                    "nodeLeaseParallelism": parallelism,
                },
            },
        )
        configs.append(f"--config={config}")
    return configs


def start(
    run_dir: Path,
    timeout: float = 120.0,
    *,
    nodes_to_score_percent: int | None = None,
    kwok_parallelism: int | None = None,
) -> Cluster:
    """Build (if needed) and start the whole control plane in ``run_dir``
    (``nodes_to_score_percent``: see :func:`_scheduler_args`; ``kwok_parallelism``: see
    :func:`_kwok_configs`)."""
    build.ensure_cluster_tools()
    bin_dir = paths.bin_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    pki = run_dir / "pki"
    _make_pki(pki)
    token = secrets.token_hex(16)
    # token,user,uid,"group1,group2"
    (run_dir / "tokens.csv").write_text(f'{token},admin,admin-uid,"system:masters"\n')
    timings: dict[str, float] = {}

    etcd_port, etcd_peer = process.free_port(), process.free_port()
    etcd = process.start(
        run_dir,
        "etcd",
        [str(bin_dir / "etcd"), "--name=podcost", f"--data-dir={run_dir / 'etcd'}",
         f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
         f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
         f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
         f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
         f"--initial-cluster=podcost=http://127.0.0.1:{etcd_peer}",
         "--unsafe-no-fsync", "--auto-compaction-retention=1", "--quota-backend-bytes=4294967296",
         "--log-level=warn"],
    )  # fmt: skip
    timings["etcd"] = process.wait_until(
        etcd, lambda: process.tcp_open(etcd_port), timeout, "serving"
    )

    api_port = process.free_port()
    server = f"https://127.0.0.1:{api_port}"
    apiserver = process.start(
        run_dir,
        APISERVER,
        [str(bin_dir / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
         "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
         f"--secure-port={api_port}",
         f"--tls-cert-file={pki / 'apiserver.crt'}",
         f"--tls-private-key-file={pki / 'apiserver.key'}",
         f"--client-ca-file={pki / 'ca.crt'}", f"--cert-dir={pki}",
         f"--token-auth-file={run_dir / 'tokens.csv'}", "--authorization-mode=Node,RBAC",
         "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
         f"--service-account-key-file={pki / 'sa.pub'}",
         f"--service-account-signing-key-file={pki / 'sa.key'}",
         f"--service-cluster-ip-range={SERVICE_CIDR}", "--endpoint-reconciler-type=none",
         "--allow-privileged=true", "--enable-priority-and-fairness=true",
         "--max-requests-inflight=400", "--max-mutating-requests-inflight=200",
         "--profiling=false", "--v=1"],
    )  # fmt: skip
    ca_file = pki / "ca.crt"
    timings["kube-apiserver"] = process.wait_until(
        apiserver,
        lambda: process.https_ok(f"{server}/readyz", token, ca_file),
        timeout,
        "ready (/readyz)",
    )
    kubeconfig = run_dir / "kubeconfig"
    write_kubeconfig(kubeconfig, server, ca_file, token, "admin")

    kcm_port, sched_port, kwok_port = process.free_port(), process.free_port(), process.free_port()
    controllers = [
        ("kube-controller-manager",
         [str(bin_dir / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
          "--leader-elect=false", f"--root-ca-file={ca_file}",
          f"--service-account-private-key-file={pki / 'sa.key'}", "--controllers=*",
          "--use-service-account-credentials=false",
          "--bind-address=127.0.0.1", f"--secure-port={kcm_port}",
          "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
          f"--kube-api-qps={CLIENT_QPS}", f"--kube-api-burst={CLIENT_BURST}",
          "--concurrent-replicaset-syncs=10",
          "--v=1"],
         kcm_port),
        ("kube-scheduler",
         [str(bin_dir / "kube-scheduler"),
          *_scheduler_args(run_dir, kubeconfig, nodes_to_score_percent),
          "--bind-address=127.0.0.1", f"--secure-port={sched_port}",
          "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics", "--v=1"],
         sched_port),
        ("kwok",
         [str(bin_dir / "kwok"), f"--kubeconfig={kubeconfig}",
          *_kwok_configs(run_dir, kwok_parallelism), "--manage-all-nodes=true",
          f"--server-address=127.0.0.1:{kwok_port}", "--node-ip=10.0.0.1",
          "--node-lease-duration-seconds=40", "--cidr=10.244.0.0/16"],
         kwok_port),
    ]  # fmt: skip
    daemons = [(process.start(run_dir, name, argv), port) for name, argv, port in controllers]
    for daemon, port in daemons:
        if daemon.name == "kwok":
            check = lambda port=port: process.tcp_open(port)  # noqa: E731
        else:
            check = lambda port=port: process.https_ok(f"https://127.0.0.1:{port}/healthz")  # noqa: E731
        timings[daemon.name] = process.wait_until(daemon, check, timeout, "healthy")
    cluster = Cluster(run_dir, server, token, kubeconfig, ca_file, timings)
    process.write_json(
        run_dir / "cluster.json",
        {"server": server, "kubeconfig": str(kubeconfig), "token": token, "ca": str(ca_file)},
    )
    return cluster
