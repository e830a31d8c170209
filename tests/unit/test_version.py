"""Which build runs, said the same way everywhere: the version read from the package metadata
(one source of truth, ``pyproject.toml``), the revision the image's build stamps, in
``podcost_build_info``, ``/healthz`` (``test_runner_http``), the span resource and the first log
line of a service; the build inputs that repeat the version (the chart's ``appVersion``, the
Dockerfile's ``VERSION``, the Compose image tag) kept equal to it; logs in UTC to the
millisecond with the trace and span ids."""

from __future__ import annotations

import io
import json
import logging
import platform
import re
import tomllib
from collections.abc import Iterator

import pytest
import yaml
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.support.deploy_files import ROOT, read_dockerfile

from podcost.runtime.logs import JsonFormatter, TextFormatter, configure_logging, utc_timestamp
from podcost.runtime.telemetry import setup_tracing, tracer
from podcost.runtime.version import BuildSettings, build, identify, package_version

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]


def test_the_version_is_read_from_the_package_metadata_of_pyproject() -> None:
    assert package_version() == VERSION
    assert build().version == VERSION
    assert build().python == platform.python_version()


def test_the_charts_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((ROOT / "deploy/helm/podcost/Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION


def test_the_dockerfiles_version_argument_is_the_package_version() -> None:
    dockerfile = read_dockerfile()
    runtime = dockerfile.stages[-1]
    args = dict(i.value.partition("=")[::2] for i in runtime.all("ARG"))  # `ARG NAME`: ""
    assert args["VERSION"] == VERSION
    # The revision argument reaches the services as PODCOST_REVISION.
    assert runtime.env(dockerfile.global_args)["PODCOST_REVISION"] == args["REVISION"]
    assert any("PODCOST_REVISION=${REVISION}" in i.value for i in runtime.all("ENV"))


def test_the_compose_image_is_tagged_with_the_package_version() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    assert re.findall(r"image: podcost:(\S+)", compose) == [VERSION]


def test_the_revision_comes_from_podcost_revision_else_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PODCOST_REVISION", "0123abc")
    assert identify(BuildSettings()).revision == "0123abc"
    monkeypatch.delenv("PODCOST_REVISION")
    assert identify(BuildSettings()).revision == "unknown"
    first, second = identify(BuildSettings()), identify(BuildSettings())
    assert first.instance != second.instance  # each process its own instance id


def test_the_span_resource_names_the_service_version_and_instance() -> None:
    provider = setup_tracing("podcost-test", [InMemorySpanExporter()], set_global=False)
    attributes = provider.resource.attributes
    assert attributes["service.name"] == "podcost-test"
    assert attributes["service.version"] == VERSION
    assert attributes["service.instance.id"] == build().instance
    assert attributes["vcs.revision"] == build().revision


def record(message: str = "hello") -> logging.LogRecord:
    entry = logging.makeLogRecord({"msg": message, "levelname": "INFO", "name": "podcost.t"})
    entry.created = 1_795_907_722.1234  # 2026-11-28T23:15:22.123Z
    return entry


def test_timestamps_are_utc_to_the_millisecond() -> None:
    assert utc_timestamp(1_795_907_722.1234) == "2026-11-28T23:15:22.123Z"
    assert json.loads(JsonFormatter().format(record()))["time"] == "2026-11-28T23:15:22.123Z"
    assert TextFormatter().format(record()).startswith("2026-11-28T23:15:22.123Z INFO podcost.t")


def test_a_log_line_in_a_span_carries_its_trace_and_span_ids() -> None:
    provider = setup_tracing("podcost-test", [InMemorySpanExporter()], set_global=False)
    with tracer(provider).start_as_current_span("work") as span:
        entry = json.loads(JsonFormatter().format(record()))
        text = TextFormatter().format(record())
    context = span.get_span_context()
    assert entry["trace_id"] == format(context.trace_id, "032x")
    assert entry["span_id"] == format(context.span_id, "016x")
    assert text.endswith(f"trace_id={entry['trace_id']} span_id={entry['span_id']}")
    outside = json.loads(JsonFormatter().format(record()))
    assert "trace_id" not in outside
    assert "span_id" not in outside


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.mark.usefixtures("root_logging")
@pytest.mark.parametrize("level", ["INFO", "ERROR"])
def test_a_services_first_log_line_names_the_service_and_its_build(
    monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging(level, "json", service="podcost-watcher")
    first = json.loads(stream.getvalue().splitlines()[0])
    identity = build()
    assert first["message"].startswith(f"podcost-watcher starting: podcost {VERSION}")
    assert (first["service"], first["version"], first["revision"], first["python"]) == (
        "podcost-watcher", VERSION, identity.revision, identity.python,
    )  # fmt: skip
    assert first["instance"] == identity.instance
