"""docker-compose.yml runs what the code is: every command parses with the real typer CLI,
every ``PODCOST_*`` variable is a setting some service reads (and validates with its value), the
rankers are exactly the default policy's strategies, and the plumbing (Kafka listeners, health
checks, ports, the kubeconfig, the trace path to Jaeger) lines up. ``tests/e2e/test_compose_up.py``
runs the file for real (``make test-long``).

Here the file is checked by reading it, and by the real Compose v2:
the standalone ``docker-compose`` that ``make tools`` builds from the Go module proxy
(``podcost_localinfra.build.ensure_compose_tool``) validates it offline with ``config``, and its
resolved model is cross-checked against how these tests read the file. Under ``CI=true`` a
missing ``docker-compose`` fails; elsewhere those two tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer.main
import yaml
from tests.support.deploy_files import (
    ROOT,
    interpolate,
    read_dockerfile,
    service_env_names,
    settings_classes,
)
from tests.support.tools import require_docker_compose

from podcost.cli import app
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import setup_tracing
from podcost_bus import BusSettings
from podcost_core.policy import DEFAULT_POLICY
from podcost_core.strategies.registry import default_registry
from podcost_localinfra.paths import COMPOSE_VERSION, KAFKA_VERSION, LOCAL_DIR

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PODCOST = {name: s for name, s in SERVICES.items() if str(s["image"]).startswith("podcost:")}
DOCKERFILE = read_dockerfile()
IMAGE_ENV = DOCKERFILE.stages[-1].env(DOCKERFILE.global_args)
CLI = typer.main.get_command(app)

# The services that call the Kubernetes API (README: "Running podcost on a cluster").
CLUSTER_CLIENTS = {"watcher", "annotator"}
PIPELINE = {"watcher", "ranker", "aggregator", "annotator"}
IN_CI = os.environ.get("CI", "").lower() == "true"


def resolve(value: object) -> str:
    """A compose value as `docker compose up` sees it with none of its variables set."""
    return interpolate(str(value), {})


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    raw = service.get("environment", {})
    if isinstance(raw, list):
        raw = dict(item.partition("=")[::2] for item in raw)
    return {name: resolve(value) for name, value in raw.items()}


def container_env(service: Mapping[str, Any]) -> dict[str, str]:
    """What the process in the container sees: the image's ENV, then the service's."""
    return {**IMAGE_ENV, **environment(service)}


def http_port(service: Mapping[str, Any]) -> int:
    default = ServiceSettings.model_fields["http_port"].default
    return int(container_env(service).get("PODCOST_HTTP_PORT", default))


def parse_command(args: list[str]) -> tuple[str, dict[str, Any]]:
    """``args`` through the real CLI parser: (subcommand, its parsed parameters); an unknown
    command or option, or a missing or bad value, raises typer's usage error."""
    with CLI.make_context("podcost", list(args)) as root:
        name, command, rest = CLI.resolve_command(root, list(args))
        assert name is not None
        assert command is not None
        with command.make_context(name, rest, parent=root) as sub:
            return name, dict(sub.params)


def ports(service: Mapping[str, Any]) -> list[tuple[str, int, int, str]]:
    """Published ports as (host ip, host port, container port, protocol)."""
    published = []
    for entry in service.get("ports", []):
        spec, _, protocol = resolve(entry).partition("/")
        parts = spec.split(":")
        assert len(parts) in (2, 3), f"{entry!r}: publish with an explicit host port"
        ip = parts[0] if len(parts) == 3 else "0.0.0.0"
        published.append((ip, int(parts[-2]), int(parts[-1]), protocol or "tcp"))
    return published


def depends_on(service: Mapping[str, Any]) -> dict[str, str]:
    raw = service.get("depends_on", {})
    if isinstance(raw, list):
        return dict.fromkeys(raw, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in raw.items()}


def tmpfs_paths(service: Mapping[str, Any]) -> list[PurePosixPath]:
    raw = service.get("tmpfs", [])
    entries = [raw] if isinstance(raw, str) else raw
    return [PurePosixPath(entry.split(":")[0]) for entry in entries]


def service_running(image_prefix: str) -> str:
    names = [n for n, s in SERVICES.items() if str(s.get("image", "")).startswith(image_prefix)]
    assert len(names) == 1, f"expected one service running {image_prefix}*, found {names}"
    return names[0]


def test_every_podcost_service_is_built_once_from_the_dockerfile() -> None:
    builds = [service["build"] for service in PODCOST.values()]
    assert all(build == builds[0] for build in builds), "the services build different images"
    assert (ROOT / builds[0]["context"] / builds[0]["dockerfile"]).is_file()
    images = {service["image"] for service in PODCOST.values()}
    assert images == {f"podcost:{PYPROJECT['project']['version']}"}


@pytest.mark.parametrize("name", sorted(PODCOST))
def test_the_command_parses_with_the_real_cli(name: str) -> None:
    command, _ = parse_command([str(arg) for arg in PODCOST[name]["command"]])
    assert command in PIPELINE


def test_one_ranker_runs_for_each_strategy_of_the_default_policy() -> None:
    commands = [parse_command([str(a) for a in s["command"]]) for s in PODCOST.values()]
    # --strategy repeats: a ranker process may run several strategies.
    strategies = [name for command, params in commands if command == "ranker"
                  for name in params["strategy"]]  # fmt: skip
    assert len(strategies) == len(set(strategies)), f"a strategy runs twice: {strategies}"
    assert set(strategies) == {spec.name for spec in DEFAULT_POLICY.specs}
    registry = default_registry()
    for strategy in strategies:
        registry.get_strategy(strategy)
    others = sorted(command for command, _ in commands if command != "ranker")
    assert others == ["aggregator", "annotator", "watcher"]


@pytest.mark.parametrize("name", sorted(PODCOST))
def test_every_podcost_variable_is_a_setting_the_service_reads(name: str) -> None:
    known = service_env_names()
    for variable in environment(PODCOST[name]):
        if variable.startswith("PODCOST_"):
            assert variable in known, f"{name}: {variable} is no podcost setting"


@pytest.mark.parametrize("name", sorted(PODCOST))
def test_every_setting_validates_with_the_services_environment(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in list(os.environ):
        if variable.startswith(("PODCOST_", "OTEL_", "KUBECONFIG", "POD_")):
            monkeypatch.delenv(variable)
    for variable, value in container_env(PODCOST[name]).items():
        monkeypatch.setenv(variable, value)
    for model in settings_classes():
        model()  # a bad value raises, naming the variable


def test_the_services_reach_kafka_on_the_listener_it_advertises_to_containers() -> None:
    kafka = environment(SERVICES["kafka"])
    advertised = dict(
        reversed(entry.split("://")) for entry in kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")
    )
    for name, service in PODCOST.items():
        bootstrap = container_env(service)["PODCOST_KAFKA"]
        assert bootstrap in advertised, f"{name}: {bootstrap} is not an advertised listener"
        host, _, port = bootstrap.partition(":")
        assert host == "kafka"
        listeners = kafka["KAFKA_LISTENERS"].split(",")
        assert f"{advertised[bootstrap]}://:{port}" in listeners
        assert advertised[bootstrap] == kafka["KAFKA_INTER_BROKER_LISTENER_NAME"]


def component(name: str) -> str:
    """The pipeline component a podcost service runs (every ranker is ``ranker``)."""
    return "ranker" if name.startswith("ranker-") else name


CREDENTIALS_DIR = "${PODCOST_KAFKA_CREDENTIALS:-./deploy/compose/kafka-credentials}"


@pytest.mark.parametrize("name", sorted(PODCOST))
def test_each_service_reads_only_its_own_components_optional_kafka_credentials(name: str) -> None:
    (env_file,) = PODCOST[name]["env_file"]
    assert env_file == {"path": f"{CREDENTIALS_DIR}/{component(name)}.env", "required": False}
    # Credentials come by file only, never written into the compose file itself.
    assert not [v for v in environment(PODCOST[name]) if v.startswith("PODCOST_KAFKA_SASL")]


def test_the_credentials_directory_is_ignored_by_git() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert f"/{resolve(CREDENTIALS_DIR).removeprefix('./')}/" in ignored


def test_the_broker_is_the_kafka_release_the_tests_run_against() -> None:
    kafka = SERVICES["kafka"]
    assert kafka["image"] == f"podcost-kafka:{KAFKA_VERSION}"
    assert (ROOT / kafka["build"]["context"] / "Dockerfile").is_file()
    # Its jars are the ones `make tools-kafka` assembles (podcost_localinfra.paths).
    (jars,) = kafka["volumes"]
    assert jars["target"] == "/opt/kafka/libs"
    assert jars["read_only"] is True
    assert resolve(jars["source"]) == f"~/.cache/podcost/kafka-{KAFKA_VERSION}/lib"


def test_the_brokers_start_script_turns_every_kafka_variable_into_a_property(
    tmp_path: Path,
) -> None:
    script = (ROOT / "deploy/compose/kafka/kafka-start.sh").read_text()
    # The part before the jars are needed: run it with a stand-in for the config path.
    config = tmp_path / "server.properties"
    lines = script.split("CLASSPATH=")[0].replace("/var/lib/kafka/server.properties", str(config))
    lines = lines.replace("/opt/kafka/libs/*.jar", "/dev/null")
    env = {"PATH": os.environ["PATH"], **environment(SERVICES["kafka"]),
           "KAFKA_HEAP_OPTS": "-Xmx1g", "KAFKA_LOG_DIRS": "/data"}  # fmt: skip
    result = subprocess.run(["sh", "-c", lines], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    properties = dict(line.split("=", 1) for line in config.read_text().splitlines())
    assert properties["node.id"] == "1"
    assert properties["offsets.topic.replication.factor"] == "1"
    assert properties["listener.security.protocol.map"].startswith("PLAINTEXT:PLAINTEXT")
    assert properties["log.dirs"] == "/data"
    assert "heap.opts" not in properties


@pytest.mark.parametrize("name", sorted(PODCOST))
def test_the_container_runs_read_only_as_a_numeric_non_root_user(name: str) -> None:
    service = PODCOST[name]
    assert service.get("read_only") is True
    uid, _, gid = resolve(service["user"]).partition(":")
    assert uid.isdigit(), f"{name}: user {service['user']!r} is not numeric"
    assert int(uid) > 0, f"{name}: runs as root"
    assert not gid or (gid.isdigit() and int(gid) > 0), f"{name}: group {gid!r}"
    writable = tmpfs_paths(service)
    env = container_env(service)
    for variable in ("HOME", "TMPDIR", "PODCOST_AGGREGATOR_DATA_DIR"):
        path = PurePosixPath(env[variable])
        assert any(path.is_relative_to(w) for w in writable), f"{name}: {variable} not on tmpfs"


@pytest.mark.parametrize("name", sorted(PODCOST))
def test_the_health_check_probes_healthz_on_the_services_http_port(name: str) -> None:
    service = PODCOST[name]
    port = http_port(service)
    probe = " ".join(str(word) for word in service["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/healthz" in probe
    assert service["healthcheck"]["test"][0] == "CMD"  # the image has no shell tools to lean on
    # podman's Docker-compatible API splits a CMD check's arguments on whitespace.
    assert not [word for word in service["healthcheck"]["test"] if any(c.isspace() for c in word)]
    assert [container for _, _, container, _ in ports(service)] == [port]


@pytest.mark.parametrize("name", sorted(PODCOST))
def test_only_the_services_that_call_the_api_server_get_the_kubeconfig(name: str) -> None:
    service = PODCOST[name]
    command, _ = parse_command([str(arg) for arg in service["command"]])
    env = container_env(service)
    if command not in CLUSTER_CLIENTS:
        assert "KUBECONFIG" not in env
        assert not service.get("volumes")
        return
    (mount,) = service["volumes"]
    assert mount["type"] == "bind"
    assert mount["read_only"] is True
    assert env["KUBECONFIG"] == mount["target"]
    assert mount["source"].startswith("${KUBECONFIG:-"), "the user's own KUBECONFIG goes first"
    assert resolve(mount["source"]) == "~/.kube/config"


def test_every_dependency_exists_and_podcost_waits_for_a_healthy_broker() -> None:
    for name, service in SERVICES.items():
        for target, condition in depends_on(service).items():
            assert target in SERVICES, f"{name} depends on a missing service {target}"
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[target], f"{target} has no health check"
    for name, service in PODCOST.items():
        assert depends_on(service).get("kafka") == "service_healthy", name


def test_no_two_services_publish_the_same_host_port() -> None:
    seen: dict[tuple[int, str], str] = {}
    for name, service in SERVICES.items():
        for ip, host_port, _, protocol in ports(service):
            assert ip == "127.0.0.1", f"{name} publishes {host_port} beyond this machine"
            other = seen.setdefault((host_port, protocol), name)
            assert other == name, f"{name} and {other} both publish {host_port}/{protocol}"


def test_the_third_party_images_are_pinned() -> None:
    for name, service in SERVICES.items():
        if name in PODCOST:
            continue
        image = resolve(service["image"])
        tag = image.rpartition(":")[2]
        assert ":" in image, f"{name}: {image} has no tag"
        assert tag not in ("", "latest"), f"{name}: {image} is not pinned"


def tracing_config() -> tuple[dict[str, Any], str]:
    """Jaeger's config file (it receives OTLP itself) and the name of its service."""
    name = "jaeger"
    service = SERVICES[name]
    config_flag = next(a for a in service["command"] if str(a).startswith("--config="))
    in_container = config_flag.partition("=")[2]
    mounts = dict(reversed(v.split(":")[:2]) for v in service["volumes"] if isinstance(v, str))
    source = ROOT / mounts[in_container]
    assert source.is_file(), f"{source} is mounted into Jaeger but does not exist"
    return yaml.safe_load(source.read_text()), name


def endpoint_port(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


def test_the_services_send_their_traces_to_a_receiver_of_jaeger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, viewer = tracing_config()
    protocols = config["receivers"]["otlp"]["protocols"]
    assert "otlp" in config["service"]["pipelines"]["traces"]["receivers"]
    published = {container for _, _, container, _ in ports(SERVICES[viewer])}
    for protocol in protocols.values():
        host, _, port = protocol["endpoint"].rpartition(":")
        assert host == "0.0.0.0", "a receiver other containers cannot reach"
        assert int(port) in published
    for name, service in PODCOST.items():
        env = container_env(service)
        # podcost exports OTLP over HTTP (runtime/telemetry.py); the variable says so too.
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf", name
        url = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert url.hostname == viewer, f"{name} sends its spans to {url.hostname}"
        assert url.port == endpoint_port(protocols["http"]["endpoint"])
        assert depends_on(service).get(viewer) is not None
    # And the real tracing set-up, given that environment, exports there.
    endpoint = container_env(next(iter(PODCOST.values())))["OTEL_EXPORTER_OTLP_ENDPOINT"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    provider = setup_tracing("podcost-compose-test", set_global=False)
    try:
        processors = provider._active_span_processor._span_processors
        exporters = [getattr(p, "span_exporter", None) for p in processors]
        assert [getattr(e, "_endpoint", None) for e in exporters] == [f"{endpoint}/v1/traces"]
    finally:
        provider.shutdown()


def test_jaegers_pipeline_names_only_components_it_defines() -> None:
    config, viewer = tracing_config()
    pipeline = config["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        for component in pipeline[kind]:
            assert component in config[kind], f"the pipeline names an undefined {component}"
    for extension in config["service"].get("extensions", []):
        assert extension in config["extensions"]
    query = config["extensions"]["jaeger_query"]["http"]["endpoint"]
    assert endpoint_port(query) == 16686
    assert 16686 in {container for _, _, container, _ in ports(SERVICES[viewer])}


@pytest.fixture(scope="module")
def docker_compose() -> Path:
    """The standalone docker-compose built by ``make tools`` (built now if it is missing)."""
    return require_docker_compose()


def run_compose(
    docker_compose: Path, home: Path, *argv: str, **variables: str
) -> subprocess.CompletedProcess[str]:
    """``docker-compose -f docker-compose.yml <argv>`` in a shell with none of the file's
    variables set but ``variables`` (as ``resolve`` reads it), ``HOME`` giving ``~`` a place."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), **variables}
    return subprocess.run(
        [str(docker_compose), "-f", str(COMPOSE_FILE), *argv],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


def test_docker_compose_is_the_release_make_tools_pins(
    docker_compose: Path, tmp_path: Path
) -> None:
    result = run_compose(docker_compose, tmp_path, "version", "--short")
    assert result.returncode == 0, result.stderr
    assert f"v{result.stdout.strip()}" == COMPOSE_VERSION
    go_mod = (LOCAL_DIR / "compose-build" / "go.mod").read_text()
    assert f"github.com/docker/compose/v2 {COMPOSE_VERSION}" in go_mod


def test_docker_compose_config_accepts_the_file_without_a_warning(
    docker_compose: Path, tmp_path: Path
) -> None:
    result = run_compose(docker_compose, tmp_path, "config", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "docker-compose config warns about the file"


def test_docker_compose_resolves_the_file_as_these_tests_read_it(
    docker_compose: Path, tmp_path: Path
) -> None:
    result = run_compose(docker_compose, tmp_path, "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    resolved: dict[str, dict[str, Any]] = json.loads(result.stdout)["services"]
    assert set(resolved) == set(SERVICES)
    built = {name for name, service in resolved.items() if "build" in service}
    assert built == {*PODCOST, "kafka"}
    for name, service in resolved.items():
        ours = SERVICES[name]
        assert (service.get("environment") or {}) == environment(ours), name
        published = [
            (
                port.get("host_ip", "0.0.0.0"),
                int(port["published"]),
                port["target"],
                port["protocol"],
            )
            for port in service.get("ports", [])
        ]
        assert published == ports(ours), name
        conditions = {
            target: spec["condition"] for target, spec in service.get("depends_on", {}).items()
        }
        assert conditions == depends_on(ours), name
    for name, service in PODCOST.items():
        assert resolved[name]["command"] == [str(arg) for arg in service["command"]], name
        assert resolved[name]["user"] == resolve(service["user"]), name
    # The kubeconfig: `~/.kube/config` (what `resolve` gives) is the caller's home, and the
    # caller's own KUBECONFIG goes first.
    kubeconfig = tmp_path / "cluster.kubeconfig"
    chosen = run_compose(docker_compose, tmp_path, "config", "--format", "json",
                         KUBECONFIG=str(kubeconfig))  # fmt: skip
    assert chosen.returncode == 0, chosen.stderr
    for name in CLUSTER_CLIENTS:
        (default,) = resolved[name]["volumes"]
        assert default["source"] == str(tmp_path / ".kube" / "config"), name
        (mount,) = json.loads(chosen.stdout)["services"][name]["volumes"]
        assert mount["source"] == str(kubeconfig), name


def test_docker_compose_gives_each_component_the_credentials_of_its_own_file(
    docker_compose: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    for user in PIPELINE:
        (credentials / f"{user}.env").write_text(
            "PODCOST_KAFKA_SECURITY_PROTOCOL=SASL_SSL\n"
            "PODCOST_KAFKA_SASL_MECHANISM=SCRAM-SHA-512\n"
            f"PODCOST_KAFKA_SASL_USERNAME={user}\n"
            f"PODCOST_KAFKA_SASL_PASSWORD=password-of-{user}\n"
        )
    result = run_compose(docker_compose, tmp_path, "config", "--format", "json",
                         PODCOST_KAFKA_CREDENTIALS=str(credentials),
                         PODCOST_KAFKA="broker.example:9093")  # fmt: skip
    assert result.returncode == 0, result.stderr
    resolved: dict[str, dict[str, Any]] = json.loads(result.stdout)["services"]
    for name in PODCOST:
        env = resolved[name]["environment"]
        user = component(name)
        assert env["PODCOST_KAFKA"] == "broker.example:9093", name
        assert env["PODCOST_KAFKA_SASL_USERNAME"] == user, name
        assert env["PODCOST_KAFKA_SASL_PASSWORD"] == f"password-of-{user}", name
        with monkeypatch.context() as patched:
            for variable in [v for v in os.environ if v.startswith("PODCOST_")]:
                patched.delenv(variable)
            for variable, value in env.items():
                patched.setenv(variable, value)
            settings = BusSettings()
        assert (settings.security_protocol, settings.sasl_username) == ("SASL_SSL", user)


@pytest.mark.parametrize(
    ("value", "env", "expected"),
    [
        ("${A:-x}", {}, "x"),
        ("${A:-x}", {"A": ""}, "x"),
        ("${A-x}", {"A": ""}, ""),
        ("${A:-65532:65532}", {}, "65532:65532"),
        ("${A}/b", {"A": "a"}, "a/b"),
        ("$A-$$", {"A": "a"}, "a-$"),
        ("${UNSET}", {}, ""),
    ],
)
def test_interpolation_follows_compose(value: str, env: dict[str, str], expected: str) -> None:
    assert interpolate(value, env) == expected
