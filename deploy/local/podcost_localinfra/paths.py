"""Where the local infrastructure lives: build inputs in the repo, builds and run state in a cache.

Called by every other module of ``podcost_localinfra``. The cache (default
``~/.cache/podcost``, override with ``PODCOST_CACHE``) keeps slow steps (Kafka jars, Go builds)
between runs and outside the repo, as CI on the same machine reuses it.
"""

from __future__ import annotations

import os
from pathlib import Path

KAFKA_VERSION = "3.9.2"
KUBE_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
#: Must match the helm.sh/helm/v4 requirement in deploy/local/helm-build/go.mod.
HELM_VERSION = "v4.3.1"
#: Must match the github.com/docker/compose/v2 requirement in deploy/local/compose-build/go.mod
#: (the newest stable release of the module the Go module proxy serves).
COMPOSE_VERSION = "v2.40.3"
#: The prometheus-operator module whose ServiceMonitor CRD the chart tests install (the newest
#: version the Go module proxy serves for the root module).
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"

#: Must match the github.com/jaegertracing/jaeger requirement in deploy/local/jaeger-build/go.mod.
JAEGER_VERSION = "v1.76.0"
#: Must match the github.com/prometheus/prometheus requirement in
#: deploy/local/prometheus-build/go.mod; the module's v0.316.0 is Prometheus 3.16.0.
PROMETHEUS_MODULE_VERSION = "v0.316.0"
PROMETHEUS_VERSION = "3.16.0"

#: Must match the sigs.k8s.io/karpenter requirement in deploy/local/karpenter-build/go.mod: the
#: newest release whose go.mod the machine's Go (1.26.8) accepts (v1.14.3 asks for 1.26.10 and
#: v1.15.0 for 1.26.9, and the build never fetches a toolchain).
KARPENTER_VERSION = "v1.14.1"

#: deploy/local in the repo: the pom and the Go modules that describe what to build.
LOCAL_DIR = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """The cache root; created on first use."""
    root = Path(os.environ.get("PODCOST_CACHE", Path.home() / ".cache" / "podcost"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def bin_dir() -> Path:
    path = cache_dir() / "bin"
    path.mkdir(parents=True, exist_ok=True)
    return path


def kafka_lib_dir() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}" / "lib"


def helm_binary() -> Path:
    """The helm built by ``make tools`` (``podcost-localinfra build --only helm``)."""
    return bin_dir() / "helm"


def compose_binary() -> Path:
    """The standalone docker-compose built by ``make tools`` (``build --only compose``)."""
    return bin_dir() / "docker-compose"


def jaeger_binary() -> Path:
    """Jaeger's all-in-one binary (``podcost-localinfra build --only jaeger``)."""
    return bin_dir() / "jaeger"


def prometheus_binary() -> Path:
    """The Prometheus server (``podcost-localinfra build --only prometheus``)."""
    return bin_dir() / "prometheus"


def promtool_binary() -> Path:
    """promtool, built with the Prometheus server (``build --only prometheus``)."""
    return bin_dir() / "promtool"


def karpenter_binary() -> Path:
    """Karpenter with its kwok cloud provider (``podcost-localinfra build --only karpenter``)."""
    return bin_dir() / "karpenter-kwok"


def karpenter_crds_dir() -> Path:
    """Karpenter's CustomResourceDefinitions (NodePool, NodeClaim, ..., KWOKNodeClass), copied
    from its module by the same build."""
    return cache_dir() / f"karpenter-{KARPENTER_VERSION}-crds"


def servicemonitor_crd_file() -> Path:
    """prometheus-operator's ServiceMonitor CustomResourceDefinition, copied from its module."""
    return cache_dir() / f"prometheus-operator-{PROMETHEUS_OPERATOR_VERSION}-servicemonitors.yaml"


def kwok_stages_file() -> Path:
    return cache_dir() / f"kwok-{KWOK_VERSION}-stages.yaml"


def run_root() -> Path:
    """Run directories of servers started by ``make kafka-up`` / ``make cluster-up``."""
    path = cache_dir() / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path
