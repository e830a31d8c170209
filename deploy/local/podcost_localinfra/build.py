"""Builds (once) the real servers podcost is tested against, into the cache.

- Kafka: the broker's runtime jars copied from Maven Central by ``deploy/local/kafka/pom.xml``.
- kube-apiserver, kube-controller-manager, kube-scheduler: built from the Go module proxy by the
  module in ``deploy/local/kube-build``.
- etcd: built by the module in ``deploy/local/etcd-build``.
- kwok: ``go install``-ed, and its stage definitions copied from the module cache.
- helm: built by the module in ``deploy/local/helm-build``, for the chart tests
  (``deploy/helm/podcost``), with prometheus-operator's ServiceMonitor CRD copied from its
  module so the chart's ServiceMonitor can be checked by the API server.
- docker-compose: the standalone Compose v2 CLI, built by the module in
  ``deploy/local/compose-build``, so ``docker-compose.yml`` is validated by the real
  implementation (``config`` needs no Docker engine).
- jaeger: the all-in-one binary (OTLP receiver, in-memory storage, query API), built by the
  module in ``deploy/local/jaeger-build``, for the tracing tests.
- prometheus and promtool: built by the module in ``deploy/local/prometheus-build``, for the
  alert-rule tests (``promtool test rules``) and the scraping tests.
- karpenter-kwok: Karpenter with its kwok cloud provider (its ``kwok`` main package), built by
  the module in ``deploy/local/karpenter-build``, with its CRDs copied from the module, for the
  node-autoscaler tests and benchmark.

Each step is idempotent: a stamp records a hash of its inputs and the step is skipped while the
stamp matches. A file lock serialises concurrent builds (two test runs, or make and pytest);
helm, docker-compose, jaeger and prometheus have their own locks, so their tests never wait
behind a long control-plane build.
Called by ``podcost_localinfra.cli`` and by the test fixtures.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import paths

KUBE_TOOLS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


class BuildError(RuntimeError):
    """A build step failed; the message names the step and the log to read."""


def _log(message: str) -> None:
    print(f"[localinfra] {message}", file=sys.stderr, flush=True)


@contextmanager
def _build_lock(name: str = "build") -> Iterator[None]:
    lock_path = paths.cache_dir() / f".{name}.lock"
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _digest(*parts: str | Path) -> str:
    sha = hashlib.sha256()
    for part in parts:
        sha.update(part.read_bytes() if isinstance(part, Path) else part.encode())
    return sha.hexdigest()


def _stamp_ok(stamp: Path, digest: str, outputs: list[Path]) -> bool:
    return (
        stamp.exists()
        and stamp.read_text() == digest
        and all(output.exists() for output in outputs)
    )


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Never fetch a toolchain: the machine's Go builds all of it. Keep the machine's proxy settings.
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0")
    return env


def _run(step: str, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    log_dir = paths.cache_dir() / "logs"
    log_dir.mkdir(exist_ok=True)
    log_file = log_dir / f"build-{step}.log"
    started = time.monotonic()
    _log(f"building {step} (log: {log_file}) ...")
    with log_file.open("w") as log:
        result = subprocess.run(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = "".join(log_file.read_text().splitlines(keepends=True)[-20:])
        raise BuildError(
            f"building {step} failed (exit {result.returncode}); see {log_file}\n{tail}"
        )
    _log(f"built {step} in {time.monotonic() - started:.1f}s")


def go_version() -> str:
    return subprocess.run(
        ["go", "version"], capture_output=True, text=True, check=True, env=_go_env()
    ).stdout.strip()


def ensure_kafka() -> Path:
    """The directory of the broker's jars, copied from Maven Central on first use."""
    pom = paths.LOCAL_DIR / "kafka" / "pom.xml"
    lib = paths.kafka_lib_dir()
    stamp = lib.parent / ".stamp"
    digest = _digest(pom)
    if _stamp_ok(stamp, digest, [lib / f"kafka_2.13-{paths.KAFKA_VERSION}.jar"]):
        return lib
    staging = lib.parent / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    _run(
        "kafka-jars",
        [
            "mvn", "-B", "-q", "-f", str(pom),
            "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
        ],
        cwd=pom.parent,
    )  # fmt: skip
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)
    stamp.write_text(digest)
    return lib


def _ensure_go_module_build(
    step: str, module: Path, targets: list[str], ldflags: str, *, output: str | None = None
) -> None:
    """Build ``targets`` into the bin dir, each named after its package, or the one target as
    ``output`` (for a main package whose directory name is no command name)."""
    if output is None:
        outputs = [paths.bin_dir() / Path(target).name for target in targets]
        destination = f"{paths.bin_dir()}/"
    else:
        outputs = [paths.bin_dir() / output]
        destination = str(outputs[0])
    stamp = paths.bin_dir() / f".{step}.stamp"
    digest = _digest(module / "go.mod", module / "go.sum", ldflags, go_version())
    if _stamp_ok(stamp, digest, outputs):
        return
    argv = ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", destination, *targets]
    _run(step, argv, cwd=module, env=_go_env())
    stamp.write_text(digest)


def ensure_kube() -> None:
    """kube-apiserver, kube-controller-manager and kube-scheduler in the cache's bin dir."""
    version = paths.KUBE_VERSION
    major, minor = version.lstrip("v").split(".")[:2]
    ldflags = (
        f"-s -w -X k8s.io/component-base/version.gitVersion={version}"
        f" -X k8s.io/component-base/version.gitMajor={major}"
        f" -X k8s.io/component-base/version.gitMinor={minor}"
        " -X k8s.io/component-base/version.gitTreeState=clean"
    )
    targets = [f"k8s.io/kubernetes/cmd/{tool}" for tool in KUBE_TOOLS]
    _ensure_go_module_build("kube", paths.LOCAL_DIR / "kube-build", targets, ldflags)


def ensure_etcd() -> None:
    """etcd in the cache's bin dir (built as a tool of deploy/local/etcd-build)."""
    module = paths.LOCAL_DIR / "etcd-build"
    target = paths.bin_dir() / "etcd"
    stamp = paths.bin_dir() / ".etcd.stamp"
    digest = _digest(module / "go.mod", module / "go.sum", go_version())
    if _stamp_ok(stamp, digest, [target]):
        return
    argv = ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(target),
            "go.etcd.io/etcd/server/v3"]  # fmt: skip
    _run("etcd", argv, cwd=module, env=_go_env())
    stamp.write_text(digest)


def ensure_kwok() -> None:
    """kwok in the cache's bin dir, and its stages gathered into one config file."""
    target = paths.bin_dir() / "kwok"
    stamp = paths.bin_dir() / ".kwok.stamp"
    stages = paths.kwok_stages_file()
    digest = _digest(paths.KWOK_VERSION, go_version(), *KWOK_STAGES)
    if _stamp_ok(stamp, digest, [target, stages]):
        return
    env = _go_env() | {"GOBIN": str(paths.bin_dir())}
    _run("kwok", ["go", "install", f"sigs.k8s.io/kwok/cmd/kwok@{paths.KWOK_VERSION}"],
         cwd=paths.cache_dir(), env=env)  # fmt: skip
    modcache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    stage_root = Path(modcache) / f"sigs.k8s.io/kwok@{paths.KWOK_VERSION}" / "kustomize" / "stage"
    documents = [(stage_root / stage).read_text().strip() for stage in KWOK_STAGES]
    stages.write_text("\n---\n".join(documents) + "\n")
    stamp.write_text(digest)


def ensure_helm() -> Path:
    """helm in the cache's bin dir, stamped with its version (``paths.HELM_VERSION``)."""
    internal = "helm.sh/helm/v4/internal/version"
    ldflags = f"-s -w -X {internal}.version={paths.HELM_VERSION} -X {internal}.gitTreeState=clean"
    _ensure_go_module_build(
        "helm", paths.LOCAL_DIR / "helm-build", ["helm.sh/helm/v4/cmd/helm"], ldflags
    )
    return paths.helm_binary()


PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator"
SERVICEMONITOR_CRD = "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"


def ensure_servicemonitor_crd() -> Path:
    """The ServiceMonitor CRD of ``paths.PROMETHEUS_OPERATOR_VERSION``, from the module proxy."""
    target = paths.servicemonitor_crd_file()
    if target.exists():
        return target
    version = paths.PROMETHEUS_OPERATOR_VERSION
    env = _go_env()
    _run("servicemonitor-crd", ["go", "mod", "download", f"{PROMETHEUS_OPERATOR}@{version}"],
         cwd=paths.cache_dir(), env=env)  # fmt: skip
    modcache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    source = Path(modcache) / f"{PROMETHEUS_OPERATOR}@{version}" / SERVICEMONITOR_CRD
    partial = target.with_suffix(".partial")
    shutil.copyfile(source, partial)
    partial.rename(target)
    return target


def ensure_helm_tool() -> Path:
    """helm and the ServiceMonitor CRD the chart tests use; returns helm's path."""
    with _build_lock("helm-build"):
        ensure_servicemonitor_crd()
        return ensure_helm()


def ensure_compose() -> Path:
    """docker-compose in the cache's bin dir, stamped with ``paths.COMPOSE_VERSION``."""
    ldflags = f"-s -w -X github.com/docker/compose/v2/internal.Version={paths.COMPOSE_VERSION}"
    _ensure_go_module_build(
        "compose", paths.LOCAL_DIR / "compose-build", ["github.com/docker/compose/v2/cmd"],
        ldflags, output="docker-compose",
    )  # fmt: skip
    return paths.compose_binary()


def ensure_compose_tool() -> Path:
    """docker-compose, which the compose tests run ``config`` with; returns its path."""
    with _build_lock("compose-build"):
        return ensure_compose()


def ensure_jaeger() -> Path:
    """jaeger in the cache's bin dir, stamped with ``paths.JAEGER_VERSION``."""
    internal = "github.com/jaegertracing/jaeger/internal/version"
    ldflags = f"-s -w -X {internal}.latestVersion={paths.JAEGER_VERSION}"
    _ensure_go_module_build(
        "jaeger", paths.LOCAL_DIR / "jaeger-build",
        ["github.com/jaegertracing/jaeger/cmd/jaeger"], ldflags,
    )  # fmt: skip
    return paths.jaeger_binary()


def ensure_jaeger_tool() -> Path:
    """jaeger, which the tracing tests export to; returns its path."""
    with _build_lock("jaeger-build"):
        return ensure_jaeger()


def ensure_prometheus() -> None:
    """prometheus and promtool in the cache's bin dir, stamped with ``paths.PROMETHEUS_VERSION``."""
    common = "github.com/prometheus/common/version"
    ldflags = (
        f"-s -w -X {common}.Version={paths.PROMETHEUS_VERSION}"
        f" -X {common}.Branch=HEAD -X {common}.Revision={paths.PROMETHEUS_MODULE_VERSION}"
    )
    targets = [f"github.com/prometheus/prometheus/cmd/{cmd}" for cmd in ("prometheus", "promtool")]
    _ensure_go_module_build("prometheus", paths.LOCAL_DIR / "prometheus-build", targets, ldflags)


def ensure_prometheus_tools() -> tuple[Path, Path]:
    """prometheus and promtool; returns their paths (server, tool)."""
    with _build_lock("prometheus-build"):
        ensure_prometheus()
        return paths.prometheus_binary(), paths.promtool_binary()


#: Karpenter's CRDs in its module: the kwok chart's (the core ones) and the KWOKNodeClass.
KARPENTER_CRDS = (
    "kwok/charts/crds/karpenter.sh_nodepools.yaml",
    "kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
    "kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
    "kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
    "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
)


def ensure_karpenter() -> None:
    """karpenter-kwok in the cache's bin dir, and its CRDs in ``paths.karpenter_crds_dir()``."""
    module = paths.LOCAL_DIR / "karpenter-build"
    ldflags = f"-s -w -X sigs.k8s.io/karpenter/pkg/operator.Version={paths.KARPENTER_VERSION}"
    _ensure_go_module_build(
        "karpenter", module, ["sigs.k8s.io/karpenter/kwok"], ldflags, output="karpenter-kwok"
    )
    crds = paths.karpenter_crds_dir()
    stamp = crds / ".stamp"
    digest = _digest(module / "go.mod", *KARPENTER_CRDS)
    if _stamp_ok(stamp, digest, [crds / Path(crd).name for crd in KARPENTER_CRDS]):
        return
    env = _go_env()
    source = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/karpenter"],
        capture_output=True, text=True, check=True, env=env, cwd=module,
    ).stdout.strip()  # fmt: skip
    partial = crds.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for crd in KARPENTER_CRDS:
        shutil.copyfile(Path(source) / crd, partial / Path(crd).name)
    (partial / ".stamp").write_text(digest)
    shutil.rmtree(crds, ignore_errors=True)
    partial.rename(crds)


def ensure_karpenter_tool() -> Path:
    """karpenter-kwok and its CRDs; returns the binary's path."""
    with _build_lock("karpenter-build"):
        ensure_karpenter()
        return paths.karpenter_binary()


def ensure_cluster_tools() -> None:
    with _build_lock():
        ensure_etcd()
        ensure_kwok()
        ensure_kube()


def ensure_kafka_tools() -> Path:
    with _build_lock():
        return ensure_kafka()


#: What ``make tools`` builds (``podcost-localinfra build``): what the demo, ``make kafka-up`` and
#: ``make cluster-up`` need, and the chart and compose checks.
DEFAULT_GROUPS = ("kafka", "cluster", "helm", "compose")
#: Built only when named (``build --only jaeger``, ``make observability-tools``) or by the tests
#: that use them: the demo and the local servers never need them.
OBSERVABILITY_GROUPS = ("jaeger", "prometheus")
#: Built only when named (``build --only karpenter``, ``make karpenter-tools``): the long
#: node-autoscaler tests and their benchmark.
AUTOSCALER_GROUPS = ("karpenter",)
TOOL_GROUPS = DEFAULT_GROUPS + OBSERVABILITY_GROUPS + AUTOSCALER_GROUPS


def ensure_all(only: str | None = None) -> None:
    """The ``DEFAULT_GROUPS``, or only one group of ``TOOL_GROUPS``."""
    if only in (None, "kafka"):
        ensure_kafka_tools()
    if only in (None, "cluster"):
        ensure_cluster_tools()
    if only in (None, "helm"):
        ensure_helm_tool()
    if only in (None, "compose"):
        ensure_compose_tool()
    if only == "jaeger":
        ensure_jaeger_tool()
    if only == "prometheus":
        ensure_prometheus_tools()
    if only == "karpenter":
        ensure_karpenter_tool()
