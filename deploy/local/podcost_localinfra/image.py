"""The container engine and podcost's image, built from Debian's packages and the repository.

- Engine: Debian's ``podman``, ``buildah``, ``mmdebstrap`` and ``runc``, installed with apt when
  one is missing (``apt-get update`` first). podman reads a ``containers.conf`` this module
  writes into the cache (``CONTAINERS_CONF``): the ``runc`` runtime (``crun`` refuses a hybrid
  cgroup layout) and rlimits below the machine's hard limits (podman's defaults exceed them).
- Base: no registry image can be pulled, so the stand-in for ``python:3.11-slim-bookworm`` is a
  root filesystem ``mmdebstrap`` makes from Debian bookworm's packages (Python 3.11), imported as
  ``localhost/podcost-python:3.11-bookworm`` and rebuilt only when its package list changes.
- Image: the repository's ``Dockerfile`` built with ``podman build`` (layers cached by the
  engine, the uv cache in a cache mount) into ``podcost:<version>`` (the version of
  ``pyproject.toml``), with the Debian base's interpreter path as a build argument and the host's
  CA bundle as a build secret, so the build reaches PyPI wherever the host does.

Called by ``podcost_localinfra.cli`` (``make image``) and by the tests that run the image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import build, paths

ENGINE_PACKAGES = ("podman", "buildah", "mmdebstrap", "runc")
#: The stand-in base: what python:3.11-slim-bookworm gives the Dockerfile (an interpreter that
#: makes virtualenvs, and CA certificates), from Debian's own packages.
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_IMAGE = "localhost/podcost-python:3.11-bookworm"
#: Where Debian's interpreter is (the python image's is /usr/local/bin/python3).
BASE_PYTHON = "/usr/bin/python3"
IMAGE_NAME = "podcost"
#: Below this machine kind's hard limits (open files 20,000, processes 96,365).
ULIMITS = ("nofile=1024:1024", "nproc=1024:1024")
RUNTIME = "runc"


def _log(message: str) -> None:
    print(f"[localinfra] {message}", file=sys.stderr, flush=True)


def repo_root() -> Path:
    return paths.LOCAL_DIR.parent.parent


def version() -> str:
    """podcost's version, from the repository's ``pyproject.toml``."""
    project = tomllib.loads((repo_root() / "pyproject.toml").read_text())
    return str(project["project"]["version"])


def image_ref(tag: str | None = None) -> str:
    return f"localhost/{IMAGE_NAME}:{tag or version()}"


def containers_conf() -> Path:
    """The engine configuration podman reads here (written on each call: it is tiny)."""
    conf = paths.cache_dir() / "containers" / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    ulimits = ", ".join(f'"{limit}"' for limit in ULIMITS)
    text = f'[containers]\ndefault_ulimits = [{ulimits}]\n\n[engine]\nruntime = "{RUNTIME}"\n'
    if not conf.exists() or conf.read_text() != text:
        conf.write_text(text)
    return conf


def engine_env() -> dict[str, str]:
    """The environment podman and buildah run in: the project's ``containers.conf``."""
    return dict(os.environ) | {"CONTAINERS_CONF": str(containers_conf())}


def podman(*argv: str, check: bool = True, timeout: float | None = None) -> str:
    """Run ``podman argv`` with the project's configuration; its stdout."""
    result = subprocess.run(
        ["podman", *argv], env=engine_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise build.BuildError(f"podman {' '.join(argv)} failed: {result.stderr.strip()}")
    return result.stdout


def ensure_engine() -> None:
    """podman, buildah, mmdebstrap and runc from Debian's packages (skipped when present)."""
    missing = [name for name in ENGINE_PACKAGES if shutil.which(name) is None]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise build.BuildError(f"{', '.join(missing)} missing and no apt-get to install them")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ) | {"DEBIAN_FRONTEND": "noninteractive"}
    build._run("apt-update", [*sudo, "apt-get", "update"], cwd=paths.cache_dir(), env=env)
    build._run(
        "container-engine",
        [*sudo, "apt-get", "install", "-y", *ENGINE_PACKAGES],
        cwd=paths.cache_dir(),
        env=env,
    )


def _image_exists(ref: str) -> bool:
    result = subprocess.run(
        ["podman", "image", "exists", ref], env=engine_env(), capture_output=True
    )
    return result.returncode == 0


def ensure_base() -> str:
    """The Debian bookworm Python base image, made once with mmdebstrap and imported."""
    stamp = containers_conf().parent / ".base.stamp"
    digest = build._digest(BASE_SUITE, *BASE_PACKAGES, BASE_IMAGE)
    if stamp.exists() and stamp.read_text() == digest and _image_exists(BASE_IMAGE):
        return BASE_IMAGE
    tarball = containers_conf().parent / f"podcost-python-{BASE_SUITE}.tar"
    partial = tarball.with_name(f"{tarball.name}.partial")
    argv = ["mmdebstrap", "--variant=minbase", "--format=tar",
            f"--include={','.join(BASE_PACKAGES)}",
            BASE_SUITE, str(partial)]  # fmt: skip
    build._run("base-image-rootfs", argv, cwd=paths.cache_dir())
    partial.rename(tarball)
    build._run(
        "base-image-import",
        ["podman", "import", "--change", 'CMD ["python3"]', str(tarball), BASE_IMAGE],
        cwd=paths.cache_dir(),
        env=engine_env(),
    )
    tarball.unlink()  # the image holds it now
    stamp.write_text(digest)
    return BASE_IMAGE


def _ca_bundle() -> Path | None:
    """The host's CA bundle (the one its own TLS clients trust), for the build to reach PyPI."""
    for candidate in (os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@dataclass(frozen=True)
class Built:
    """An image built by :func:`ensure_image`: its name, size and how long the build took."""

    ref: str
    size: int
    seconds: float


def build_argv(ref: str, base: str) -> list[str]:
    """The ``podman build`` command line for the repository's Dockerfile on ``base``."""
    revision = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=repo_root(), capture_output=True, text=True
    ).stdout.strip()
    argv = [
        "podman", "build", "--network", "host", "--layers",
        "--file", str(repo_root() / "Dockerfile"), "--tag", ref,
        "--build-arg", f"PYTHON_IMAGE={base}",
        "--build-arg", f"PYTHON={BASE_PYTHON}",
        "--build-arg", f"VERSION={version()}",
        "--build-arg", f"REVISION={revision or 'unknown'}",
    ]  # fmt: skip
    bundle = _ca_bundle()
    if bundle is not None:
        argv += ["--secret", f"id=ca-certificates,src={bundle}"]
    return [*argv, str(repo_root())]


def ensure_image() -> Built:
    """The engine, the base and ``podcost:<version>`` built from the working tree."""
    with build._build_lock("image-build"):
        ensure_engine()
        base = ensure_base()
        ref = image_ref()
        started = time.monotonic()
        build._run("image", build_argv(ref, base), cwd=repo_root(), env=engine_env())
        seconds = time.monotonic() - started
        size = int(podman("image", "inspect", "--format", "{{.Size}}", ref).strip())
        return Built(ref, size, seconds)


PLUGIN_EXAMPLE = "examples/podcost-strategy-example"


def ensure_plugin_image() -> Built:
    """The example strategy plugin's image, layered on ``podcost:<version>`` (built first)."""
    base = ensure_image()
    with build._build_lock("image-build"):
        project = tomllib.loads((repo_root() / PLUGIN_EXAMPLE / "pyproject.toml").read_text())
        ref = f"localhost/{project['project']['name']}:{project['project']['version']}"
        argv = [
            "podman", "build", "--network", "host", "--layers", "--tag", ref,
            "--build-arg", f"PODCOST_IMAGE={base.ref}",
        ]  # fmt: skip
        bundle = _ca_bundle()
        if bundle is not None:
            argv += ["--secret", f"id=ca-certificates,src={bundle}"]
        started = time.monotonic()
        build._run("plugin-image", [*argv, str(repo_root() / PLUGIN_EXAMPLE)], cwd=repo_root(),
                   env=engine_env())  # fmt: skip
        seconds = time.monotonic() - started
        size = int(podman("image", "inspect", "--format", "{{.Size}}", ref).strip())
        return Built(ref, size, seconds)


def inspect(ref: str) -> dict[str, object]:
    """``podman image inspect`` of ``ref``, parsed."""
    found: list[dict[str, object]] = json.loads(podman("image", "inspect", ref))
    return found[0]
