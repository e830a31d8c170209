"""``docker compose up`` on a machine with no Docker engine: podman's Docker-compatible API.

- Engine: ``podman system service --time=0 unix://<run dir>/podman.sock``, with the project's
  ``containers.conf`` (``image.engine_env``: the ``runc`` runtime, rlimits below the machine's
  hard limits), started and stopped by its pid; ``DOCKER_HOST`` points the compose binary that
  ``make tools`` builds at it. Compose's default network is a real bridge (netavark), with
  container names resolved by aardvark-dns and ports published on 127.0.0.1.
- Health checks: podman 4 schedules a container's health check with a transient systemd timer,
  and where systemd is not the init there is none, so a check never runs and compose's
  ``depends_on: condition: service_healthy`` waits forever. :mod:`.healthchecks` is the timer:
  a daemon started next to the API service that runs each container's check at its interval
  through the API, so the compose file stays what Docker runs.
- Images: ``podcost:<version>`` (``image.ensure_image``) exists before ``up``, so compose uses it;
  compose builds the broker's image itself from ``deploy/compose/kafka`` on the Debian base
  ``image.ensure_base`` makes (``PODCOST_DEBIAN_IMAGE``), the broker's jars and Jaeger are the
  ones ``make tools-kafka`` and ``make observability-tools`` build, mounted read-only.

Called by the CLI (``make compose-up`` / ``make compose-down``) and by the compose test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import build, image, paths, process

ENGINE = "podman-service"
HEALTHCHECKS = "healthchecks"


def socket_path(run_dir: Path) -> Path:
    return run_dir / "podman.sock"


def docker_host(run_dir: Path) -> str:
    return f"unix://{socket_path(run_dir)}"


@dataclass(frozen=True)
class Engine:
    """A started API service and its health-check timer, in ``run_dir``."""

    run_dir: Path
    docker_host: str

    def stop(self) -> list[str]:
        return process.stop_all(self.run_dir)


def start_engine(run_dir: Path, timeout: float = 60.0) -> Engine:
    """podman's API service on a socket of ``run_dir`` and the health-check timer beside it."""
    image.ensure_engine()
    run_dir.mkdir(parents=True, exist_ok=True)
    sock = socket_path(run_dir)
    sock.unlink(missing_ok=True)
    service = process.start(
        run_dir, ENGINE, ["podman", "system", "service", "--time=0", docker_host(run_dir)],
        env=image.engine_env(),
    )  # fmt: skip
    process.wait_until(service, sock.exists, timeout, f"listening on {sock}")
    timer = process.start(
        run_dir, HEALTHCHECKS,
        [sys.executable, "-m", "podcost_localinfra.healthchecks", str(sock)],
        env=dict(os.environ),
    )  # fmt: skip
    process.wait_until(timer, lambda: True, timeout, "started")
    return Engine(run_dir, docker_host(run_dir))


def compose_env(engine: Engine, kubeconfig: Path | None = None) -> dict[str, str]:
    """The environment ``docker compose`` runs in here: the engine, the Debian base, the broker's
    jars and Jaeger from the cache, and the cluster's kubeconfig."""
    env = dict(os.environ) | {
        "DOCKER_HOST": engine.docker_host,
        "PODCOST_DEBIAN_IMAGE": image.BASE_IMAGE,
        "PODCOST_KAFKA_LIBS": str(paths.kafka_lib_dir()),
        "PODCOST_JAEGER": str(paths.jaeger_binary()),
        # compose's own build of the broker's image, without BuildKit (podman's API has none).
        "DOCKER_BUILDKIT": "0",
        "COMPOSE_BAKE": "false",
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def ensure_images() -> None:
    """What the compose file runs and compose cannot build here: podcost's image (its base is
    no registry image), the Debian base, the broker's jars, Jaeger and the compose binary."""
    build.ensure_kafka_tools()
    build.ensure_jaeger_tool()
    build.ensure_compose_tool()
    image.ensure_image()  # the engine and the Debian base too


def compose(
    engine: Engine,
    *argv: str,
    project_dir: Path,
    kubeconfig: Path | None = None,
    timeout: float = 600.0,
) -> subprocess.CompletedProcess[str]:
    """``docker-compose --project-directory project_dir <argv>`` against ``engine``."""
    return subprocess.run(
        [str(paths.compose_binary()), "--project-directory", str(project_dir), *argv],
        env=compose_env(engine, kubeconfig), capture_output=True, text=True, timeout=timeout,
        cwd=project_dir,
    )  # fmt: skip


def up(engine: Engine, project_dir: Path, kubeconfig: Path | None = None) -> float:
    """``docker compose up --detach --wait``: every service started and every health check
    passed; the seconds it took. Fails with compose's output."""
    started = time.monotonic()
    result = compose(engine, "up", "--detach", "--wait", "--wait-timeout", "600",
                     project_dir=project_dir, kubeconfig=kubeconfig)  # fmt: skip
    if result.returncode != 0:
        raise process.StartError(f"docker compose up failed:\n{result.stdout}{result.stderr}")
    return time.monotonic() - started


def down(engine: Engine, project_dir: Path) -> None:
    """``docker compose down``: the project's containers and network removed (images kept)."""
    result = compose(engine, "down", "--timeout", "10", project_dir=project_dir)
    if result.returncode != 0:
        raise process.StartError(f"docker compose down failed:\n{result.stdout}{result.stderr}")
