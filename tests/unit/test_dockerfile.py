"""The Dockerfile keeps its promises, checked by reading it: two stages, a runtime stage that holds
only the builder's virtualenv and no installer or compiler, a numeric non-root user, a read-only
root filesystem that works, ``podcost`` as the entry point, and a build context (.dockerignore)
that holds everything the build copies.

The build itself is run by a real engine (podman, ``make image``) and its containers by
``tests/integration/test_chart_containers.py``; this file checks what holds for any base.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath

import pytest
from packaging.specifiers import SpecifierSet
from tests.support.deploy_files import (
    ROOT,
    DockerIgnore,
    Stage,
    parse_dockerfile,
    read_dockerfile,
    service_env_names,
)

from podcost.runtime.settings import ServiceSettings

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DOCKERFILE = read_dockerfile()
BUILDER, RUNTIME = DOCKERFILE.stages[0], DOCKERFILE.stages[-1]
IGNORE = DockerIgnore.read(ROOT / ".dockerignore")

# Words that mean a stage installs or compiles something.
INSTALLERS = re.compile(
    r"\b(apt-get|apt|apk|yum|dnf|microdnf)\s+(install|add)\b|\bpip3?\s+install\b|\buv\s|\bgcc\b"
    r"|\bbuild-essential\b|\bmake\b"
)


def venv_of(stage: Stage) -> str:
    env = stage.env(DOCKERFILE.global_args)
    assert "UV_PROJECT_ENVIRONMENT" in env, "the builder does not say where uv puts the venv"
    return env["UV_PROJECT_ENVIRONMENT"]


def copies(stage: Stage) -> list[tuple[dict[str, str], list[str], str]]:
    """Each COPY of ``stage`` as (flags, sources, destination)."""
    found = []
    for instruction in stage.all("COPY"):
        flags, args = instruction.flags_and_args()
        found.append((flags, args[:-1], args[-1]))
    return found


def test_the_image_is_built_in_a_builder_stage_and_a_runtime_stage() -> None:
    assert len(DOCKERFILE.stages) >= 2
    assert BUILDER.name == "builder"
    assert RUNTIME.name == "runtime"


def test_both_stages_start_from_the_same_pinned_python_slim_image() -> None:
    # The venv's interpreter is a link into the base image: the two must be the same image.
    assert BUILDER.base == RUNTIME.base
    pinned = r"python:(\d+)\.(\d+)\.(\d+)-slim-[a-z]+(@sha256:[0-9a-f]{64})?"
    match = re.fullmatch(pinned, RUNTIME.base)
    assert match, f"{RUNTIME.base!r} is not a python slim image pinned to a patch release"
    version = ".".join(match.groups()[:3])
    assert version in SpecifierSet(PYPROJECT["project"]["requires-python"])


def test_the_builder_installs_the_locked_environment_without_dev_tools_and_not_editable() -> None:
    syncs = [i.value for i in BUILDER.all("RUN") if re.search(r"\buv sync\b", i.value)]
    assert syncs, "the builder never runs uv sync"
    final = syncs[-1]
    for flag in ("--frozen", "--no-dev", "--no-editable"):
        assert flag in final.split(), f"the last uv sync lacks {flag}: {final}"
    env = BUILDER.env(DOCKERFILE.global_args)
    assert env.get("UV_COMPILE_BYTECODE") == "1", "bytecode must be compiled at build time"
    assert env.get("UV_PYTHON_DOWNLOADS") == "never", "the venv must use the base image's Python"


def test_the_builder_uses_the_uv_version_the_makefile_pins() -> None:
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r"^UV_VERSION\s*:?=\s*(\S+)", makefile, re.MULTILINE)
    assert pinned
    assert BUILDER.args(DOCKERFILE.global_args)["UV_VERSION"] == pinned.group(1)


def test_the_runtime_stage_copies_only_the_builders_virtualenv_to_the_same_path() -> None:
    venv = venv_of(BUILDER)
    copied = copies(RUNTIME)
    assert copied == [({"from": "builder"}, [venv], venv)]
    path = RUNTIME.env(DOCKERFILE.global_args)["PATH"]
    assert path.split(":")[0] == f"{venv}/bin", "the venv's podcost must come first on PATH"


def test_the_runtime_stage_installs_nothing_and_removes_the_base_images_pip() -> None:
    runs = [i.value for i in RUNTIME.all("RUN")]
    for command in runs:
        assert not INSTALLERS.search(command), f"the runtime stage installs something: {command}"
    assert any(re.search(r"pip uninstall\b.*\bpip\b", command) for command in runs)


def test_the_runtime_user_is_numeric_and_not_root() -> None:
    users = RUNTIME.all("USER")
    assert users, "the runtime stage runs as root"
    uid, _, gid = users[-1].value.partition(":")
    assert uid.isdigit(), f"USER {users[-1].value}: the uid must be numeric"
    assert int(uid) > 0, f"USER {users[-1].value}: runs as root"
    assert not gid or (gid.isdigit() and int(gid) > 0), f"USER {users[-1].value}: group"


def test_nothing_needs_writing_outside_tmp() -> None:
    # With a read-only root filesystem and a writable /tmp (tmpfs, emptyDir).
    env = RUNTIME.env(DOCKERFILE.global_args)
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    for name in ("HOME", "TMPDIR", "PODCOST_AGGREGATOR_DATA_DIR"):
        assert PurePosixPath(env[name]).is_relative_to("/tmp"), f"{name}={env[name]}"
    assert PurePosixPath(RUNTIME.all("WORKDIR")[-1].value).is_relative_to("/tmp")


def test_every_podcost_variable_the_image_sets_is_a_real_setting() -> None:
    known = service_env_names()
    for stage in DOCKERFILE.stages:
        for name in stage.env(DOCKERFILE.global_args):
            if name.startswith("PODCOST_"):
                assert name in known, f"{name} is no setting of any podcost service"


def test_the_exposed_port_is_the_services_http_port() -> None:
    default = ServiceSettings.model_fields["http_port"].default
    port = RUNTIME.env(DOCKERFILE.global_args).get("PODCOST_HTTP_PORT", str(default))
    assert [i.value for i in RUNTIME.all("EXPOSE")] == [port]


def test_the_entry_point_is_the_podcost_command() -> None:
    entrypoints = RUNTIME.all("ENTRYPOINT")
    assert entrypoints[-1].exec_form() == ["podcost"]
    assert "podcost" in PYPROJECT["project"]["scripts"]
    # CMD in exec form, so `docker run IMAGE ranker --strategy age` replaces it whole.
    assert RUNTIME.all("CMD")[-1].exec_form() is not None


def test_the_image_carries_oci_labels_that_match_the_project() -> None:
    labels = RUNTIME.labels(DOCKERFILE.global_args)
    assert labels["org.opencontainers.image.title"] == PYPROJECT["project"]["name"]
    assert labels["org.opencontainers.image.version"] == PYPROJECT["project"]["version"]
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]
    assert labels["org.opencontainers.image.base.name"] == RUNTIME.base


def test_the_build_context_sends_every_file_the_build_copies() -> None:
    for stage in DOCKERFILE.stages:
        for flags, sources, _ in copies(stage):
            if "from" in flags:
                continue
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: no such file"
                assert IGNORE.sends(source), f"COPY {source}: .dockerignore leaves it out"


def test_the_build_copies_every_package_the_wheel_holds_and_what_its_metadata_reads() -> None:
    copied = {
        source.rstrip("/")
        for stage in DOCKERFILE.stages
        for flags, sources, _ in copies(stage)
        if "from" not in flags
        for source in sources
    }

    def is_copied(path: str) -> bool:
        return any(path == c or path.startswith(f"{c}/") for c in copied)

    for package in PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
        assert is_copied(package), f"the wheel's package {package} is not copied"
    assert is_copied(PYPROJECT["project"]["readme"])
    assert is_copied("uv.lock")
    for member in PYPROJECT["tool"]["uv"]["workspace"]["members"]:
        assert is_copied(f"{member}/pyproject.toml"), f"workspace member {member} is unreadable"


def test_the_build_context_leaves_out_the_local_environment_and_caches() -> None:
    left_out = (
        ".venv/bin/python", ".git/HEAD", "tests/unit/test_cli.py", "deploy/helm",
        "libs/podcost_core/__pycache__/model.cpython-311.pyc", ".mypy_cache/x",
    )  # fmt: skip
    for path in left_out:
        assert not IGNORE.sends(path), f"{path} would be sent to the builder"
    for package_file in (ROOT / "services" / "podcost").rglob("*.py"):
        assert IGNORE.sends(package_file.relative_to(ROOT).as_posix())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FROM a AS b\nRUN x \\\n  # a comment\n  y\n", ("b", "x y")),
        ("ARG I=img:1\nFROM ${I} AS s\nRUN a\n", ("s", "a")),
        ("# syntax=docker/dockerfile:1\nFROM --platform=$P img AS z\nRUN echo\n", ("z", "echo")),
    ],
)
def test_the_dockerfile_reader_joins_continuations_and_drops_comments(
    text: str, expected: tuple[str, str]
) -> None:
    parsed = parse_dockerfile(text)
    stage = parsed.stages[0]
    assert (stage.name, stage.all("RUN")[0].value) == expected


def test_the_dockerfile_reader_resolves_build_arguments_in_from_and_env() -> None:
    parsed = parse_dockerfile("ARG I=img:1\nFROM ${I}\nARG V=2\nENV A=$V B=${A}/x C=${N:-d}\n")
    assert parsed.stages[0].base == "img:1"
    assert parsed.stages[0].env(parsed.global_args) == {"A": "2", "B": "2/x", "C": "d"}


def test_the_dockerignore_reader_follows_the_last_matching_rule(tmp_path: Path) -> None:
    rules = tmp_path / ".dockerignore"
    rules.write_text("*\n!src\n**/*.pyc\n!keep/me.txt\n")
    ignore = DockerIgnore.read(rules)
    assert ignore.sends("src/a.py")
    assert not ignore.sends("src/pkg/a.pyc")
    assert not ignore.sends("other/file")
    assert ignore.sends("keep/me.txt")
    assert not ignore.sends("keep/other.txt")
