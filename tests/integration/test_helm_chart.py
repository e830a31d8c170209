"""The Helm chart (``deploy/helm/podcost``) rendered by the real helm and checked three ways.

- helm itself: ``helm lint --strict`` passes and ``values.schema.json`` rejects bad values, for
  the default values and one values file per way of running podcost (embedded, over Kafka,
  agent, core, TLS + SASL, SASL per component, ServiceMonitor, a custom policy, dry-run).
- podcost itself: every container's arguments parse with the real ``podcost`` CLI (the typer app
  turned into its click command), every ``PODCOST_*`` variable is a field of a settings class
  the command reads and that class accepts the rendered value, every ``OTEL_*`` variable is one
  the OpenTelemetry SDK reads, and the policy ConfigMap is a policy file the core loads.
- Kubernetes 1.36: every rendered object is server-side applied with ``dryRun=All`` and
  ``fieldValidation=Strict`` against the real kube-apiserver (``control_plane``), after the real
  ServiceMonitor CRD from the prometheus-operator module is installed.

helm (``paths.HELM_VERSION``) and the CRD are built into the cache by ``make tools``
(``podcost_localinfra.build.ensure_helm_tool``). Under ``CI=true`` a missing helm fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.core
import typer.main
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient
from opentelemetry import environment_variables as otel_api_variables
from opentelemetry.sdk import environment_variables as otel_sdk_variables
from pydantic import AliasChoices
from pydantic_settings import BaseSettings
from tests.support.kube import KubeTestCluster
from tests.support.tools import require_helm

from podcost.aggregator.settings import AggregatorSettings
from podcost.annotator.settings import AnnotatorSettings
from podcost.cli import COMMANDS, app, load_command
from podcost.ranker.settings import RankerSettings
from podcost.runtime.settings import ServiceSettings
from podcost.watcher.service import WatcherSettings
from podcost_bus import BusSettings
from podcost_contracts.fleet import read_registry
from podcost_core.policy import DEFAULT_POLICY, StrategySpec, load_policy_file
from podcost_core.strategies.registry import default_registry
from podcost_localinfra import paths

pytestmark = pytest.mark.integration

Manifest = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "podcost"
RELEASE = "podcost"
NAMESPACE = "podcost-chart"
KUBE_VERSION = paths.KUBE_VERSION.lstrip("v")
FIELD_MANAGER = "podcost-chart-test"
IN_CI = os.environ.get("CI", "").lower() == "true"

KAFKA = {"bootstrapServers": "kafka-0.kafka:9092,kafka-1.kafka:9092"}
CUSTOM_POLICY: list[Manifest] = [
    {"name": "topology-spread", "tier": 0, "weight": 1},
    {"name": "capacity-type", "tier": 1, "weight": 5, "args": {"price_annotation": "acme.io/p"}},
    {"name": "age", "tier": 1, "weight": 2, "threshold": 3600},
]

#: Prometheus' namespace, as a NetworkPolicy peer.
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}

#: One Kafka principal per component: the Secret each component's SASL credentials come from.
#: A strategy plugin as one more ranker with its own image (the example plugin's strategy).
PLUGIN_RANKER: Manifest = {
    "extraStrategies": ["restarts"],
    "overrides": {"restarts": {"image": {"repository": "acme/podcost-restarts", "tag": "1.0.0"}}},
}
SASL_SECRETS = {
    "watcher": "kafka-watcher",
    "annotator": "kafka-annotator-eu-1",
    "ranker": "kafka-ranker",
    "aggregator": "kafka-aggregator",
}

#: Values files, by name, that must lint, render and pass the API server's strict validation.
CASES: dict[str, Manifest] = {
    "default": {},
    "kafka": {"kafka": KAFKA, "pdb": {"enabled": True}, "watcher": {"replicaCount": 2}},
    "agent": {
        "mode": "agent",
        "clusterName": "eu-1",
        "kafka": KAFKA,
        "watch": {"namespaceSelector": "team=a,tier=b"},
    },
    "core": {"mode": "core", "kafka": KAFKA, "aggregator": {"engine": "consumer"}},
    "fleet-core": {
        "mode": "core",
        "kafka": KAFKA,
        "fleet": {"clusters": ["eu-1", "us-1"], "keysSecret": {"name": "fleet-keys"}},
    },
    "fleet-agent": {
        "mode": "agent",
        "clusterName": "eu-1",
        "kafka": KAFKA,
        "fleet": {"signingKeySecret": {"name": "eu-1-signing", "key": "key"}},
    },
    "rankers-together": {
        "mode": "core",
        "kafka": KAFKA,
        "rankers": {"together": True, "overrides": {"age": {"replicaCount": 3}}},
    },
    "core-compression": {
        "mode": "core",
        "kafka": {**KAFKA, "compression": "none", "aggregatorCompression": "gzip"},
    },
    "tls-sasl": {
        "kafka": {
            **KAFKA,
            "securityProtocol": "SASL_SSL",
            "tls": {
                "caSecret": {"name": "kafka-ca", "key": "ca.pem"},
                "clientSecret": {"name": "kafka-client"},
                "keyPasswordSecret": {"name": "kafka-key-password"},
            },
            "sasl": {"mechanism": "SCRAM-SHA-512", "secretName": "kafka-sasl"},
        },
        "opentelemetry": {
            "endpoint": "http://otel-collector.observability:4318",
            "headersSecret": {"name": "otel-headers"},
            "resourceAttributes": {"deployment.environment": "prod"},
            "sampler": "parentbased_traceidratio",
            "samplerArg": "0.25",
        },
    },
    "sasl-per-component": {
        "kafka": {
            **KAFKA,
            "securityProtocol": "SASL_SSL",
            "tls": {"caSecret": {"name": "kafka-ca"}},
            "sasl": {"mechanism": "SCRAM-SHA-512", "secretNames": SASL_SECRETS},
        },
    },
    "servicemonitor": {
        "kafka": KAFKA,
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    },
    "custom-policy": {
        "kafka": KAFKA,
        "policy": {"strategies": CUSTOM_POLICY, "nonNegativeCosts": False},
        "rankers": {
            "extraStrategies": ["priority-qos"],
            "overrides": {"topology-spread": {"replicaCount": 3}},
        },
        "annotator": {"highWater": 2_000_000, "lowWater": 1_000_000},
    },
    "dry-run": {
        "dryRun": True,
        "leaderElection": {"enabled": False},
        "embedded": {"replicaCount": 1},
        "watcher": {"replicaCount": 1},
        "log": {"level": "DEBUG"},
    },
    # RBAC in a Role of the watched namespace (here the release's, where the dry run applies).
    "one-namespace": {"watch": {"namespace": NAMESPACE}},
    "explain-token": {"http": {"explainTokenSecret": {"name": "podcost-explain"}}},
    "explain-token-agent": {
        "mode": "agent",
        "clusterName": "eu-3",
        "kafka": KAFKA,
        "http": {"explainTokenSecret": {"name": "podcost-explain", "key": "bearer"}},
    },
    "dry-run-agent": {"mode": "agent", "clusterName": "eu-2", "kafka": KAFKA, "dryRun": True},
    "no-cleanup-hook": {"cleanup": {"onUninstall": False}, "adoptFieldManagers": []},
    "plugin-ranker": {"kafka": KAFKA, "rankers": PLUGIN_RANKER},
    # Every component's NetworkPolicy, narrowed to named peers, with tracing on.
    "network-policy": {
        "kafka": {**KAFKA, "bootstrapServers": "kafka-0.kafka:9093,kafka-1.kafka:9094"},
        "networkPolicy": {
            "enabled": True,
            "metricsFrom": [MONITORING],
            "explainFrom": [{"ipBlock": {"cidr": "10.0.0.10/32"}}],
            "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]},
            "kafka": {"extraPorts": [9095]},
        },
        "opentelemetry": {"endpoint": "http://otel-collector.observability:4318"},
    },
    "network-policy-embedded": {"networkPolicy": {"enabled": True}},
    # One replica everywhere: no PodDisruptionBudget, no default spread.
    "single-replicas": {
        "kafka": KAFKA,
        **{c: {"replicaCount": 1} for c in ("watcher", "annotator", "aggregator", "rankers")},
    },
}

#: Values files helm must refuse, with a piece of the one-line reason it must give.
SCHEMA_ERROR = "values don't meet the specifications of the schema"
REJECTED: dict[str, tuple[Manifest, str]] = {
    "agent-without-kafka": ({"mode": "agent", "clusterName": "eu-1"}, SCHEMA_ERROR),
    "agent-without-cluster-name": ({"mode": "agent", "kafka": KAFKA}, SCHEMA_ERROR),
    "cluster-name-not-a-dns-label": ({"clusterName": "EU_1"}, SCHEMA_ERROR),
    "unknown-mode": ({"mode": "everything"}, SCHEMA_ERROR),
    "unknown-key": ({"replicas": 2}, SCHEMA_ERROR),
    "zero-weight": (
        {"policy": {"strategies": [{"name": "age", "weight": 0}]}},
        SCHEMA_ERROR,
    ),
    "sasl-without-mechanism": (
        {"kafka": {**KAFKA, "securityProtocol": "SASL_SSL"}},
        SCHEMA_ERROR,
    ),
    "tls-file-over-plaintext": (
        {"kafka": {**KAFKA, "tls": {"caSecret": {"name": "kafka-ca"}}}},
        SCHEMA_ERROR,
    ),
    "sasl-without-a-secret-for-a-component": (
        {
            "kafka": {
                **KAFKA,
                "securityProtocol": "SASL_SSL",
                "sasl": {
                    "mechanism": "SCRAM-SHA-512",
                    "secretNames": {**SASL_SECRETS, "aggregator": ""},
                },
            },
        },
        "kafka.sasl.secretNames.aggregator or kafka.sasl.secretName must name the aggregator's",
    ),
    "two-watchers-without-election": (
        {"leaderElection": {"enabled": False}, "watcher": {"replicaCount": 2}},
        SCHEMA_ERROR,
    ),
    "bad-log-level": ({"log": {"level": "verbose"}}, SCHEMA_ERROR),
    "duplicate-strategy": (
        {"policy": {"strategies": [{"name": "age"}, {"name": "age", "weight": 2}]}},
        '"age" appears more than once',
    ),
    "override-of-a-strategy-no-ranker-runs": (
        {"kafka": KAFKA, "rankers": {"overrides": {"work-in-progress": {"replicaCount": 2}}}},
        'rankers.overrides.work-in-progress: no ranker runs "work-in-progress"',
    ),
    "names-longer-than-a-dns-label": (
        {"kafka": KAFKA, "fullnameOverride": "p" * 40},
        "is longer than 63 characters: set a shorter fullnameOverride",
    ),
    "low-water-above-high-water": (
        {"annotator": {"highWater": 10, "lowWater": 10}},
        "annotator.lowWater (10) must be below annotator.highWater (10)",
    ),
    "plugin-image-in-embedded-mode": (
        {"rankers": PLUGIN_RANKER},
        "embedded mode runs every strategy in one process of podcost's image",
    ),
    "plugin-image-without-a-repository": (
        {"kafka": KAFKA, "rankers": {**PLUGIN_RANKER, "overrides": {"restarts": {"image": {}}}}},
        SCHEMA_ERROR,
    ),
}

#: The settings classes each ``podcost`` command reads from the environment.
SETTINGS: dict[str, tuple[type[BaseSettings], ...]] = {
    "watcher": (ServiceSettings, BusSettings, WatcherSettings),
    # The annotator reads the watcher's scope and opt-in variables too: it verifies by them.
    "annotator": (ServiceSettings, BusSettings, AnnotatorSettings, WatcherSettings),
    "aggregator": (ServiceSettings, BusSettings, AggregatorSettings),
    "ranker": (ServiceSettings, BusSettings, RankerSettings),
    "run": (ServiceSettings, BusSettings, WatcherSettings, AnnotatorSettings, AggregatorSettings),
    "cleanup": (ServiceSettings, AnnotatorSettings),
}


# --- helm ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm built by ``make tools`` (built now if it is missing)."""
    return require_helm()


def run_helm(helm: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *argv], capture_output=True, text=True, timeout=120)


def values_file(directory: Path, name: str, values: Manifest) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def template_argv(values: Path) -> list[str]:
    return ["template", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--kube-version", KUBE_VERSION, "--values", str(values)]  # fmt: skip


@pytest.fixture(scope="session")
def rendered(
    helm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], list[Manifest]]:
    """The objects ``helm template`` renders for a case of ``CASES`` (rendered once each)."""
    directory = tmp_path_factory.mktemp("values")
    cache: dict[str, list[Manifest]] = {}

    def render(case: str) -> list[Manifest]:
        if case not in cache:
            result = run_helm(helm, *template_argv(values_file(directory, case, CASES[case])))
            assert result.returncode == 0, f"helm template ({case}) failed: {result.stderr}"
            cache[case] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        return cache[case]

    return render


def of_kind(objects: list[Manifest], kind: str) -> list[Manifest]:
    return [obj for obj in objects if obj["kind"] == kind]


def containers(
    objects: list[Manifest], kinds: tuple[str, ...] = ("Deployment",)
) -> Iterator[tuple[Manifest, Manifest]]:
    """(Deployment, container) for every container of every Deployment (or Job, in ``kinds``)."""
    for kind in kinds:
        for workload in of_kind(objects, kind):
            for container in workload["spec"]["template"]["spec"]["containers"]:
                yield workload, container


def env_of(container: Manifest) -> dict[str, str | None]:
    """A container's plain variables by name (``None`` for one taken from a Secret)."""
    return {var["name"]: var.get("value") for var in container["env"]}


def expected_deployments(values: Manifest) -> set[str]:
    """The Deployment names a values file must give: the mode's components, a ranker each."""
    mode = values.get("mode", "all")
    if mode == "all" and not values.get("kafka", {}).get("bootstrapServers"):
        return {f"{RELEASE}-embedded"}
    strategies = [entry["name"] for entry in values.get("policy", {}).get("strategies", [])]
    strategies = strategies or list(DEFAULT_POLICY.names)
    strategies += values.get("rankers", {}).get("extraStrategies", [])
    names = set()
    if mode in ("all", "agent"):
        names |= {f"{RELEASE}-watcher", f"{RELEASE}-annotator"}
    if mode in ("all", "core"):
        rankers = values.get("rankers", {})
        if rankers.get("together"):
            overridden = set(rankers.get("overrides", {}))
            names.add(f"{RELEASE}-rankers")
            strategies = [s for s in strategies if s in overridden]
        names |= {f"{RELEASE}-aggregator", *(f"{RELEASE}-ranker-{s}" for s in strategies)}
    return names


def test_helm_is_the_version_make_tools_pins(helm: Path) -> None:
    result = run_helm(helm, "version", "--template", "{{ .Version }}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == paths.HELM_VERSION


@pytest.mark.parametrize("case", CASES)
def test_the_chart_passes_strict_lint(helm: Path, tmp_path: Path, case: str) -> None:
    values = values_file(tmp_path, case, CASES[case])
    result = run_helm(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                      "--kube-version", KUBE_VERSION, "--values", str(values))  # fmt: skip
    assert result.returncode == 0, f"helm lint --strict ({case}):\n{result.stdout}{result.stderr}"
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("case", REJECTED)
def test_bad_values_are_refused_before_anything_renders(
    helm: Path, tmp_path: Path, case: str
) -> None:
    values, reason = REJECTED[case]
    result = run_helm(helm, *template_argv(values_file(tmp_path, case, values)))
    assert result.returncode != 0, f"helm accepted the {case} values"
    assert reason in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("case", CASES)
def test_each_mode_runs_exactly_its_deployments_each_with_a_service(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    objects = rendered(case)
    deployments = {obj["metadata"]["name"]: obj for obj in of_kind(objects, "Deployment")}
    assert set(deployments) == expected_deployments(CASES[case])
    services = of_kind(objects, "Service")
    assert {service["metadata"]["name"] for service in services} == set(deployments)
    for service in services:
        pod_labels = deployments[service["metadata"]["name"]]["spec"]["template"]["metadata"]
        selector = service["spec"]["selector"]
        assert selector.items() <= pod_labels["labels"].items()
        matched = [
            name for name, deployment in deployments.items()
            if selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        assert matched == [service["metadata"]["name"]], "a Service must select one component"
    pdbs = {pdb["metadata"]["name"] for pdb in of_kind(objects, "PodDisruptionBudget")}
    assert pdbs == {name for name, d in deployments.items() if d["spec"]["replicas"] > 1}


def test_the_rankers_follow_the_policy_with_their_overrides(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    deployments = {
        d["metadata"]["name"]: d for d in of_kind(rendered("custom-policy"), "Deployment")
    }
    for entry in [*CUSTOM_POLICY, {"name": "priority-qos"}]:
        ranker = deployments[f"{RELEASE}-ranker-{entry['name']}"]
        assert ranker["metadata"]["labels"]["podcost.dev/strategy"] == entry["name"]
        args = ranker["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args == ["ranker", "--strategy", entry["name"]]
        assert ranker["spec"]["replicas"] == (3 if entry["name"] == "topology-spread" else 2)


def test_rankers_together_run_every_strategy_without_an_override_in_one_deployment(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    deployments = {
        d["metadata"]["name"]: d for d in of_kind(rendered("rankers-together"), "Deployment")
    }
    together = deployments[f"{RELEASE}-rankers"]
    args = together["spec"]["template"]["spec"]["containers"][0]["args"]
    shared = [name for name in DEFAULT_POLICY.names if name != "age"]
    assert args == ["ranker", *(arg for name in shared for arg in ("--strategy", name))]
    assert "podcost.dev/strategy" not in together["metadata"]["labels"]
    assert together["spec"]["replicas"] == 2
    # Their answers in a record per strategy, as an aggregator of any release reads them.
    env = {
        e["name"]: e.get("value")
        for e in together["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["PODCOST_RANKER_COMBINE_STRATEGIES"] == "false"
    # A strategy with an override keeps a Deployment of its own, with what the override says.
    own = deployments[f"{RELEASE}-ranker-age"]
    assert own["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "ranker", "--strategy", "age",
    ]  # fmt: skip
    assert own["spec"]["replicas"] == 3
    own_env = own["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "PODCOST_RANKER_COMBINE_STRATEGIES" not in {e["name"] for e in own_env}


def test_a_plugins_ranker_runs_its_image_and_the_rest_know_its_strategy_by_name(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    deployments = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]
        for d in of_kind(rendered("plugin-ranker"), "Deployment")
    }
    plugin = deployments.pop(f"{RELEASE}-ranker-restarts")
    assert plugin["image"] == "ghcr.io/acme/podcost-restarts:1.0.0"
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert {c["image"] for c in deployments.values()} == {f"ghcr.io/podcost/podcost:{version}"}
    for name, container in [*deployments.items(), ("plugin", plugin)]:
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        # The annotator resolves no policy; every other component gets the name.
        wanted = None if name.endswith("-annotator") else "restarts"
        assert env.get("PODCOST_REMOTE_STRATEGIES") == wanted, name


@pytest.mark.parametrize("case", CASES)
def test_every_container_runs_a_podcost_command_with_options_it_has(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["podcost"] == "podcost.cli:main"
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    with pytest.raises(Exception, match="No such option: --no-such-option"):
        load_command("ranker").make_context("podcost ranker", ["--no-such-option"])
    registry = default_registry()
    for _, container in containers(rendered(case), ("Deployment", "Job")):
        assert container["command"] == ["podcost"]
        name, *options = container["args"]
        assert name in COMMANDS, name
        command = load_command(name)
        context = command.make_context(f"podcost {name}", list(options))  # raises on a bad one
        for strategy in _as_list(context.params.get("strategy")):
            registry.get_strategy(strategy)
        # The only commands that write to the cluster.
        writes = name in ("annotator", "run", "cleanup")
        assert ("--dry-run" in options) == (writes and bool(CASES[case].get("dryRun"))), name
        assert name in SETTINGS


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    return [str(item) for item in value] if isinstance(value, list | tuple) else [str(value)]


def setting_variables(model: type[BaseSettings]) -> set[str]:
    """The environment variables ``model`` reads (aliases, else env prefix + field name)."""
    prefix = str(model.model_config.get("env_prefix", ""))
    names = set()
    for field_name, field in model.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            choices = [c for c in alias.choices if isinstance(c, str) and c != field_name]
            names |= {choice.upper() for choice in choices}
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(f"{prefix}{field_name}".upper())
    return names


def otel_variables() -> set[str]:
    return {
        value
        for module in (otel_api_variables, otel_sdk_variables)
        for value in vars(module).values()
        if isinstance(value, str) and value.startswith("OTEL_")
    }


@dataclass(frozen=True)
class MountedFile:
    """A file a container sees under one of its mounts, and where it comes from."""

    source: str
    content: str


def mounted_files(
    deployment: Manifest, container: Manifest, objects: list[Manifest]
) -> dict[str, MountedFile]:
    """Every file the container's ConfigMap and Secret volumes put in its filesystem."""
    config_maps = {obj["metadata"]["name"]: obj for obj in of_kind(objects, "ConfigMap")}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    files: dict[str, MountedFile] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            data = config_maps[volume["configMap"]["name"]]["data"]
            for key, content in data.items():
                files[f"{mount['mountPath']}/{key}"] = MountedFile("configmap", content)
        sources = volume.get("projected", {}).get("sources", [])
        if "secret" in volume:
            sources = [{"secret": {"name": volume["secret"]["secretName"],
                                   "items": volume["secret"]["items"]}}]  # fmt: skip
        for source in sources:
            secret = source["secret"]
            for item in secret["items"]:
                name = f"{secret['name']}/{item['key']}"
                files[f"{mount['mountPath']}/{item['path']}"] = MountedFile(name, "from a secret")
    return files


@pytest.mark.parametrize("case", CASES)
def test_every_variable_is_a_setting_its_command_reads_and_accepts(
    rendered: Callable[[str], list[Manifest]],
    case: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = rendered(case)
    otel = otel_variables()
    for deployment, container in containers(objects, ("Deployment", "Job")):
        command = container["args"][0]
        known = set().union(*(setting_variables(model) for model in SETTINGS[command]))
        files = mounted_files(deployment, container, objects)
        environment: dict[str, str] = {}
        for variable in container["env"]:
            name = variable["name"]
            if name.startswith("OTEL_"):
                assert name in otel, f"{command}: {name} is not an OpenTelemetry variable"
                continue
            assert name in known, f"{command}: {name} is not a setting `podcost {command}` reads"
            environment[name] = _resolve(variable, files, tmp_path)
        for name in list(os.environ):
            if name.startswith(("PODCOST_", "POD_", "OTEL_")):
                monkeypatch.delenv(name)
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        for model in SETTINGS[command]:
            model()  # a value the service would refuse raises ValidationError here
        if "PODCOST_POLICY_FILE" in environment:
            load_policy_file(environment["PODCOST_POLICY_FILE"])


def _resolve(variable: Manifest, files: Mapping[str, MountedFile], tmp_path: Path) -> str:
    """The value a variable has in the pod; mounted files are copied under ``tmp_path``."""
    if "valueFrom" in variable:
        source = variable["valueFrom"]
        if "fieldRef" in source:
            return {"metadata.name": "podcost-watcher-0", "metadata.namespace": NAMESPACE}[
                source["fieldRef"]["fieldPath"]
            ]
        return "a-value-from-a-secret"  # as long as a token must be
    value = str(variable["value"])
    if not value.startswith("/"):
        return value
    assert value in files, f"{variable['name']}={value} is not a file any volume provides"
    local = tmp_path / value.lstrip("/")
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_text(files[value].content)
    return str(local)


def _policy_in(objects: list[Manifest]) -> tuple[StrategySpec, ...]:
    [config_map] = [
        c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-policy")
    ]
    return tuple(
        StrategySpec(e["name"], e.get("weight", 1), e.get("tier", 0), e.get("args", {}),
                     e.get("threshold"))
        for e in json.loads(config_map["data"]["policy.json"])["strategies"]
    )  # fmt: skip


def test_the_default_policy_file_is_podcosts_built_in_default(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    assert _policy_in(rendered("default")) == DEFAULT_POLICY.specs


def test_a_custom_policy_reaches_the_policy_file_unchanged(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    expected = tuple(
        StrategySpec(e["name"], e["weight"], e["tier"], e.get("args", {}), e.get("threshold"))
        for e in CUSTOM_POLICY
    )  # fmt: skip
    assert _policy_in(rendered("custom-policy")) == expected


@pytest.mark.parametrize(("case", "non_negative"), [("default", True), ("custom-policy", False)])
def test_the_non_negative_costs_value_reaches_the_policy_file(
    rendered: Callable[[str], list[Manifest]], case: str, non_negative: bool, tmp_path: Path
) -> None:
    [config_map] = [
        c for c in of_kind(rendered(case), "ConfigMap") if c["metadata"]["name"].endswith("-policy")
    ]
    path = tmp_path / "policy.json"
    path.write_text(config_map["data"]["policy.json"])
    assert load_policy_file(path).non_negative_costs is non_negative


def test_the_fleet_registry_and_the_keys_reach_the_aggregator_and_the_key_the_watcher(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    core = rendered("fleet-core")
    [registry] = [c for c in of_kind(core, "ConfigMap") if c["metadata"]["name"].endswith("-fleet")]
    assert read_registry(registry["data"]["clusters.txt"]) == {"eu-1", "us-1"}
    files = {
        workload["metadata"]["name"]: {
            name: value
            for name, value in env_of(container).items()
            if name in ("PODCOST_FLEET_FILE", "PODCOST_FLEET_KEYS_FILE",
                        "PODCOST_WATCHER_SIGNING_KEY_FILE")
        }
        for objects in (core, rendered("fleet-agent"))
        for workload, container in containers(objects)
    }  # fmt: skip
    assert files[f"{RELEASE}-aggregator"] == {
        "PODCOST_FLEET_FILE": "/etc/podcost/fleet/clusters.txt",
        "PODCOST_FLEET_KEYS_FILE": "/etc/podcost/fleet-keys/keys.txt",
    }
    assert files[f"{RELEASE}-watcher"] == {
        "PODCOST_WATCHER_SIGNING_KEY_FILE": "/etc/podcost/signing/signing.key"
    }
    others = {name: found for name, found in files.items()
              if name not in (f"{RELEASE}-aggregator", f"{RELEASE}-watcher")}  # fmt: skip
    assert all(not found for found in others.values()), others
    # No fleet ConfigMap without a registry: the default serves every cluster.
    assert not [c for c in of_kind(rendered("core"), "ConfigMap")
                if c["metadata"]["name"].endswith("-fleet")]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_pods_run_locked_down_and_only_agents_get_an_api_token(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    for deployment, container in containers(rendered(case)):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        talks_to_kubernetes = container["args"][0] in ("watcher", "annotator", "run")
        assert pod["automountServiceAccountToken"] is talks_to_kubernetes
        assert pod["serviceAccountName"] == RELEASE
        probes = {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
        assert probes == {"/healthz", "/readyz"}


def sasl_secrets(container: Manifest) -> set[str]:
    """The Secrets a container's SASL username and password come from."""
    return {
        entry["valueFrom"]["secretKeyRef"]["name"]
        for entry in container.get("env") or []
        if entry["name"] in ("PODCOST_KAFKA_SASL_USERNAME", "PODCOST_KAFKA_SASL_PASSWORD")
    }


def test_each_component_is_its_own_kafka_principal_from_its_own_secret(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    found = {
        deployment["metadata"]["name"]: sasl_secrets(container)
        for deployment, container in containers(rendered("sasl-per-component"))
    }
    assert found == {
        name: {SASL_SECRETS["ranker" if "-ranker-" in name else name.removeprefix(f"{RELEASE}-")]}
        for name in expected_deployments(CASES["sasl-per-component"])
    }
    # One shared Secret still works for all (secretNames empty).
    shared = {frozenset(sasl_secrets(c)) for _, c in containers(rendered("tls-sasl"))}
    assert shared == {frozenset({"kafka-sasl"})}


@pytest.mark.parametrize("case", CASES)
def test_uninstall_runs_podcost_cleanup_as_podcosts_service_account_where_an_annotator_runs(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    objects = rendered(case)
    jobs = of_kind(objects, "Job")
    annotates = CASES[case].get("mode", "all") != "core"
    hook = annotates and CASES[case].get("cleanup", {}).get("onUninstall", True)
    assert len(jobs) == (1 if hook else 0)
    for job in jobs:
        annotations = job["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
        pod = job["spec"]["template"]["spec"]
        assert (pod["restartPolicy"], pod["serviceAccountName"]) == ("Never", RELEASE)
        assert pod["automountServiceAccountToken"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True
        [container] = pod["containers"]
        assert container["args"][0] == "cleanup"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        env = {variable["name"]: variable.get("value") for variable in container["env"]}
        assert env["PODCOST_ANNOTATOR_QPS"] == str(CASES[case].get("annotator", {}).get("qps", 20))
    # The hook runs with the release's RBAC: its service account may list and patch pods.
    if jobs:
        roles = [*of_kind(objects, "ClusterRole"), *of_kind(objects, "Role")]
        verbs = {
            verb
            for role in roles
            for rule in role["rules"]
            if "pods" in rule["resources"]
            for verb in rule["verbs"]
        }
        assert {"list", "patch"} <= verbs


@pytest.mark.parametrize("case", CASES)
def test_only_what_runs_in_a_cluster_is_given_a_cluster_name(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    for deployment, container in containers(rendered(case)):
        env = env_of(container)
        in_a_cluster = container["args"][0] in ("watcher", "annotator", "run")
        assert ("PODCOST_CLUSTER" in env) is in_a_cluster, deployment["metadata"]["name"]
        if in_a_cluster:
            assert env["PODCOST_CLUSTER"] == CASES[case].get("clusterName", "local")


@pytest.mark.parametrize("case", ["kafka", "agent", "core"])
def test_the_core_batches_its_fetches_and_the_annotator_fetches_at_once(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    found = {}
    for _, container in containers(rendered(case)):
        env = env_of(container)
        fetch = (
            env.get("PODCOST_KAFKA_FETCH_MIN_BYTES"),
            env.get("PODCOST_KAFKA_FETCH_MAX_WAIT_MS"),
        )
        found[container["args"][0]] = fetch
    expected = {"ranker": ("65536", "100"), "aggregator": ("65536", "100"),
                "annotator": ("1", None), "watcher": (None, None)}  # fmt: skip
    assert found == {command: expected[command] for command in found}
    commands = {"agent": {"watcher", "annotator"}, "core": {"ranker", "aggregator"}}
    assert set(found) == commands.get(case, commands["agent"] | commands["core"])


@pytest.mark.parametrize("case", ["kafka", "core"])
def test_the_aggregator_keeps_its_own_batch_compression_by_default(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    # Its costs records are gzipped one by one: the chart's global compression is the others'.
    found = {}
    for _, container in containers(rendered(case)):
        found[container["args"][0]] = env_of(container).get("PODCOST_KAFKA_COMPRESSION")
    assert found.pop("aggregator") is None
    assert set(found.values()) == {"zstd"}


def test_the_aggregators_batch_compression_is_set_apart_from_the_others(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    found: dict[str, set[str | None]] = {}
    for _, container in containers(rendered("core-compression")):
        command = container["args"][0]
        found.setdefault(command, set()).add(env_of(container).get("PODCOST_KAFKA_COMPRESSION"))
    assert found == {"aggregator": {"gzip"}, "ranker": {"none"}}


def test_the_service_monitor_scrapes_every_metrics_service(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    objects = rendered("servicemonitor")
    [monitor] = of_kind(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    for service in of_kind(objects, "Service"):
        assert selector.items() <= service["metadata"]["labels"].items()
        assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert of_kind(rendered("kafka"), "ServiceMonitor") == []


def test_the_dashboard_ships_in_a_configmap_grafana_picks_up(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    [dashboard] = [
        c for c in of_kind(rendered("default"), "ConfigMap")
        if c["metadata"]["name"].endswith("-dashboard")
    ]  # fmt: skip
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard["data"]["podcost.json"])
    assert shipped == json.loads((CHART / "dashboards" / "podcost.json").read_text())


# --- podcost's own pods: replicas, budgets, spread, resources, network ------------------------


def replicas_of(objects: list[Manifest]) -> dict[str, int]:
    """Each Deployment's replicas, by component."""
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["replicas"]
        for d in of_kind(objects, "Deployment")
    }


@pytest.mark.parametrize("case", ["default", "kafka", "agent", "core"])
def test_every_component_runs_two_replicas_by_default_a_standby_or_a_share_of_the_work(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    replicas = replicas_of(rendered(case))
    assert replicas
    assert set(replicas.values()) == {2}, replicas


@pytest.mark.parametrize("case", ["default", "kafka", "custom-policy", "single-replicas"])
def test_a_disruption_budget_guards_each_replicated_deployment_and_none_a_single_replica(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    objects = rendered(case)
    budgets = {p["metadata"]["name"]: p["spec"] for p in of_kind(objects, "PodDisruptionBudget")}
    for deployment in of_kind(objects, "Deployment"):
        name, spec = deployment["metadata"]["name"], deployment["spec"]
        if spec["replicas"] < 2:
            assert name not in budgets, f"{name} has one replica: its budget would block drains"
            continue
        budget = budgets.pop(name)
        assert budget["maxUnavailable"] == 1
        assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        pod_labels = spec["template"]["metadata"]["labels"]
        assert budget["selector"]["matchLabels"].items() <= pod_labels.items()
        assert budget["selector"] == spec["selector"]
    assert not budgets, f"budgets for no Deployment: {sorted(budgets)}"
    if case == "single-replicas":
        assert not of_kind(objects, "PodDisruptionBudget")


@pytest.mark.parametrize("case", ["default", "kafka", "custom-policy", "single-replicas"])
def test_replicated_components_spread_over_zones_then_nodes(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    for deployment in of_kind(rendered(case), "Deployment"):
        spec = deployment["spec"]
        constraints = spec["template"]["spec"].get("topologySpreadConstraints")
        if spec["replicas"] < 2:
            assert constraints is None
            continue
        assert [c["topologyKey"] for c in constraints] == [
            "topology.kubernetes.io/zone",
            "kubernetes.io/hostname",
        ]
        for constraint in constraints:
            assert constraint["labelSelector"] == spec["selector"]
            assert constraint["maxSkew"] == 1
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
            assert constraint["matchLabelKeys"] == ["pod-template-hash"]


def test_a_components_own_spread_replaces_the_default(helm: Path, tmp_path: Path) -> None:
    selector = {"matchLabels": {"app.kubernetes.io/component": "watcher"}}
    own = [{"topologyKey": "rack", "maxSkew": 2, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": selector}]  # fmt: skip
    values = {"kafka": KAFKA, "watcher": {"topologySpreadConstraints": own}}
    result = run_helm(helm, *template_argv(values_file(tmp_path, "own-spread", values)))
    assert result.returncode == 0, result.stderr
    spreads = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"][
            "topologySpreadConstraints"
        ]
        for d in of_kind([doc for doc in yaml.safe_load_all(result.stdout) if doc], "Deployment")
    }
    assert spreads.pop("watcher") == own
    assert all(s[0]["topologyKey"] == "topology.kubernetes.io/zone" for s in spreads.values())


#: The requests each component's measurements chose (values.yaml names the measurements).
MEASURED = {
    "watcher": {"cpu": "100m", "memory": "192Mi"},
    "annotator": {"cpu": "100m", "memory": "192Mi"},
    "aggregator": {"cpu": "200m", "memory": "160Mi"},
    "ranker": {"cpu": "50m", "memory": "96Mi"},
    "run": {"cpu": "200m", "memory": "256Mi"},
}


@pytest.mark.parametrize("case", ["default", "kafka"])
def test_each_component_requests_what_it_was_measured_to_use_with_a_memory_limit_only(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    for _, container in containers(rendered(case)):
        resources = container["resources"]
        assert resources["requests"] == MEASURED[container["args"][0]]
        assert set(resources["limits"]) == {"memory"}, "a CPU limit throttles a busy watcher"


def _memory_mib(quantity: str) -> float:
    units = {"Mi": 1.0, "Gi": 1024.0}
    return float(quantity[:-2]) * units[quantity[-2:]]


@pytest.mark.parametrize("case", ["default", "kafka"])
def test_every_memory_limit_leaves_room_above_the_request(
    rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    for deployment, container in containers(rendered(case)):
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        ratio = _memory_mib(limits["memory"]) / _memory_mib(requests["memory"])
        assert ratio >= 2, f"{deployment['metadata']['name']}: limit {limits}, request {requests}"
        assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30


def _policies(objects: list[Manifest]) -> dict[str, Manifest]:
    return {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p["spec"]
        for p in of_kind(objects, "NetworkPolicy")
    }


def _egress_ports(policy: Manifest) -> set[int]:
    return {port["port"] for rule in policy["egress"] for port in rule["ports"]}


def test_no_network_policy_unless_asked(rendered: Callable[[str], list[Manifest]]) -> None:
    for case in ("default", "kafka", "agent", "core"):
        assert not of_kind(rendered(case), "NetworkPolicy")


def test_each_component_may_reach_only_what_it_uses(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    objects = rendered("network-policy")
    policies = _policies(objects)
    components = set(replicas_of(objects))
    assert set(policies) == components | {"cleanup"}
    for component, policy in policies.items():
        assert policy["policyTypes"] == ["Ingress", "Egress"]
        assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        ports = _egress_ports(policy)
        dns = {53}
        if component == "cleanup":
            assert policy["ingress"] == []
            assert ports == dns | {443, 6443}
            continue
        kafka, otlp = {9093, 9094, 9095}, {4318}
        api = {443, 6443} if component in ("watcher", "annotator") else set()
        assert ports == dns | kafka | otlp | api, component
        [ingress] = policy["ingress"]
        assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
        explain = [{"ipBlock": {"cidr": "10.0.0.10/32"}}] if component == "annotator" else []
        assert ingress["from"] == [MONITORING, *explain], component
        api_rules = [r for r in policy["egress"] if {p["port"] for p in r["ports"]} == {443, 6443}]
        narrowed = [[{"ipBlock": {"cidr": "10.0.0.0/24"}}]] if api else []
        assert [r["to"] for r in api_rules] == narrowed


def test_the_embedded_deployment_reaches_the_api_server_and_no_broker(
    rendered: Callable[[str], list[Manifest]],
) -> None:
    policies = _policies(rendered("network-policy-embedded"))
    assert set(policies) == {"embedded", "cleanup"}
    assert _egress_ports(policies["embedded"]) == {53, 443, 6443}
    # No peers given: the release namespace's pods may scrape, nothing else may reach /explain.
    assert policies["embedded"]["ingress"][0]["from"] == [{"podSelector": {}}]


# --- the API server --------------------------------------------------------------------------


@pytest.fixture(scope="session")
async def dynamic(
    kube: KubeTestCluster, helm: Path, tmp_path_factory: pytest.TempPathFactory
) -> DynamicClient:
    """A dynamic client on the real API server, with the test namespace and the real
    ServiceMonitor CRD in place."""
    cache = tmp_path_factory.mktemp("discovery") / "discovery.json"
    client: DynamicClient = await DynamicClient(kube.api, cache_file=str(cache))
    namespaces = await client.resources.get(api_version="v1", kind="Namespace")
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    await client.server_side_apply(namespaces, namespace, field_manager=FIELD_MANAGER)
    crds = await client.resources.get(
        api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition"
    )
    crd = yaml.safe_load(paths.servicemonitor_crd_file().read_text())
    await client.server_side_apply(crds, crd, field_manager=FIELD_MANAGER, force_conflicts=True)
    await _until_established(client, crds, crd["metadata"]["name"])
    return client


async def _until_established(client: DynamicClient, crds: Any, name: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        current = await client.get(crds, name=name)
        conditions = (current.to_dict().get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        assert time.monotonic() < deadline, f"the CRD {name} was not Established within 30s"
        await asyncio.sleep(0.2)


async def refusal(dynamic: DynamicClient, obj: Manifest) -> str | None:
    """Why the API server refuses to apply ``obj`` (dry run, strict field validation), or None.

    The dynamic client hands back a failure as a ``Status`` object instead of raising."""
    resource = await dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    try:
        applied = await dynamic.server_side_apply(
            resource, obj, namespace=NAMESPACE if resource.namespaced else None,
            field_manager=FIELD_MANAGER, dry_run="All",
            query_params=[("fieldValidation", "Strict")],
        )  # fmt: skip
    except ApiException as error:
        return f"{error.status} {error.body}"
    answer: Manifest = applied.to_dict()
    if answer["kind"] == "Status" and obj["kind"] != "Status":
        return f"{answer.get('code')} {answer.get('message')}"
    assert (answer["kind"], answer["metadata"]["name"]) == (obj["kind"], obj["metadata"]["name"])
    return None


@pytest.mark.parametrize("case", CASES)
async def test_kubernetes_accepts_every_rendered_object_under_strict_validation(
    dynamic: DynamicClient, rendered: Callable[[str], list[Manifest]], case: str
) -> None:
    objects = rendered(case)
    refused = []
    for obj in objects:
        reason = await refusal(dynamic, obj)
        if reason is not None:
            refused.append(f"{obj['kind']}/{obj['metadata']['name']}: {reason}")
    assert not refused, "\n".join(refused)
    assert {obj["kind"] for obj in objects} >= {"Deployment", "Service", "ConfigMap"}


async def test_the_strict_check_refuses_a_field_kubernetes_does_not_know(
    dynamic: DynamicClient, rendered: Callable[[str], list[Manifest]]
) -> None:
    [deployment] = of_kind(rendered("default"), "Deployment")
    misspelt = json.loads(json.dumps(deployment))
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    reason = await refusal(dynamic, misspelt)
    assert reason is not None
    assert "readinessProbes: field not declared in schema" in reason


#: Two kwok nodes in two zones that only the spread test's pods are pinned to.
SPREAD_NODES = {"chart-spread-a": "chart-zone-a", "chart-spread-b": "chart-zone-b"}
SPREAD_LABEL = {"podcost.dev/chart-test": "spread"}


async def test_the_watchers_run_in_two_zones_and_a_drain_evicts_one_at_a_time(
    kube: KubeTestCluster, dynamic: DynamicClient, helm: Path, tmp_path: Path
) -> None:
    """The chart's replicas, spread and budget as the real scheduler, disruption controller and
    eviction API take them: two watcher replicas land in two zones, and with the nodes cordoned
    (a drain) the budget lets one be evicted and refuses the second until the first is back.
    The spread is made a requirement here (DoNotSchedule): the default, ScheduleAnyway, is a
    preference the scheduler may pass over (a node it has not seen yet), which would make the
    placement a matter of timing."""
    values = {"kafka": KAFKA, "watcher": {"nodeSelector": SPREAD_LABEL},
              "topologySpread": {"whenUnsatisfiable": "DoNotSchedule"}}  # fmt: skip
    result = run_helm(helm, *template_argv(values_file(tmp_path, "spread", values)))
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    watcher = f"{RELEASE}-watcher"
    wanted = {("ServiceAccount", RELEASE), ("ConfigMap", f"{RELEASE}-policy"),
              ("Deployment", watcher), ("PodDisruptionBudget", watcher)}  # fmt: skip
    chosen = [o for o in objects if (o["kind"], o["metadata"]["name"]) in wanted]
    assert len(chosen) == len(wanted)
    for name, zone in SPREAD_NODES.items():
        await kube.create_node(name, zone=zone, labels=SPREAD_LABEL)
    applied: list[tuple[Any, Manifest]] = []
    try:
        for obj in chosen:
            resource = await dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            await dynamic.server_side_apply(
                resource, obj, namespace=NAMESPACE, field_manager=FIELD_MANAGER
            )
            applied.append((resource, obj))
        selector = "app.kubernetes.io/component=watcher,app.kubernetes.io/instance=" + RELEASE

        async def pods() -> list[Any]:
            found = await kube.core.list_namespaced_pod(NAMESPACE, label_selector=selector)
            return [p for p in found.items if p.metadata.deletion_timestamp is None]

        async def both_ready() -> bool:
            ready = [p for p in await pods() if p.status.conditions and any(
                c.type == "Ready" and c.status == "True" for c in p.status.conditions)]  # fmt: skip
            return len(ready) == 2

        await kube.wait_for(both_ready, "two watcher pods Ready", timeout=90)
        placed = {p.spec.node_name for p in await pods()}
        assert {SPREAD_NODES[node] for node in placed} == set(SPREAD_NODES.values())

        policy = client.PolicyV1Api(kube.api)

        async def one_disruption_allowed() -> bool:
            budget = await policy.read_namespaced_pod_disruption_budget(
                f"{RELEASE}-watcher", NAMESPACE
            )
            return bool(budget.status and budget.status.disruptions_allowed == 1)

        await kube.wait_for(one_disruption_allowed, "the budget to allow one disruption")
        for name in SPREAD_NODES:
            await kube.core.patch_node(name, {"spec": {"unschedulable": True}})
        first, second = await pods()

        async def evict(pod: Any) -> None:
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod.metadata.name, "namespace": NAMESPACE}}  # fmt: skip
            await kube.core.create_namespaced_pod_eviction(pod.metadata.name, NAMESPACE, body)

        await evict(first)
        with pytest.raises(ApiException) as refused:
            await evict(second)
        assert refused.value.status == 429
        assert "disruption budget" in str(refused.value.body)
    finally:
        for resource, obj in reversed(applied):
            with contextlib.suppress(ApiException):
                await dynamic.delete(resource, name=obj["metadata"]["name"], namespace=NAMESPACE)

        async def gone() -> bool:
            found = await kube.core.list_namespaced_pod(NAMESPACE, label_selector=selector)
            return not found.items

        await kube.wait_for(gone, "the watcher pods deleted", timeout=60)
        await kube.delete_nodes(list(SPREAD_NODES))
