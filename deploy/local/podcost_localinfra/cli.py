"""``podcost-localinfra``: the Makefile's entry to build, start and stop the local servers.

``kafka-up`` prints the bootstrap address as its last line; ``cluster-up`` prints
``export KUBECONFIG=<path>`` as its last line. Both keep their state in a fixed run directory
under the cache (``PODCOST_RUN_DIR`` overrides it) so the matching ``-down`` finds the pids.
Re-running ``-up`` while the servers are up prints the same last line and starts nothing.

``reference`` writes the generated reference pages (``reference``): the CLI, settings, metrics,
Helm values and message pages under ``docs/reference/`` and the chart's README; ``reference
--check`` writes nothing and exits 1 naming each page that is out of date.

``image`` installs the container engine and builds ``podcost:<version>`` (``image``); its last
line is the image's name.

``compose-up`` runs ``docker compose up --detach --wait`` of the repository's
``docker-compose.yml`` against podman's Docker-compatible API (``compose``), with ``$KUBECONFIG``
as the cluster's kubeconfig; its last line is ``export DOCKER_HOST=<socket>`` for
``docker-compose`` commands of your own. ``compose-down`` runs ``docker compose down`` and stops
the API service.

``kafka-up --secure`` starts the secure broker instead (its own run directory, ``kafka-secure``):
SASL_SSL only, one SCRAM user per component and topic ACLs (``kafka_secure``); ``--cluster``
names the clusters that get an annotator user. The CA file, the passwords and an admin client
config are printed (stderr) with where they are; ``kafka-down --secure`` stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from . import build, cluster, compose, image, kafka, kafka_secure, paths, process


def _run_dir(kind: str) -> Path:
    override = os.environ.get("PODCOST_RUN_DIR")
    return Path(override) / kind if override else paths.run_root() / kind


def _running(run_dir: Path) -> bool:
    pid_files = list((run_dir / "pids").glob("*.pid")) if (run_dir / "pids").exists() else []
    if not pid_files:
        return False
    pids = [int(pid_file.read_text()) for pid_file in pid_files]
    return all(process.Daemon("", pid, Path()).alive() for pid in pids)


def kafka_up(secure: kafka_secure.Layout | None = None) -> int:
    run_dir = _run_dir("kafka-secure" if secure else "kafka")
    if _running(run_dir):
        print((run_dir / "bootstrap").read_text().strip())
        return 0
    process.stop_all(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    broker = kafka.start(run_dir, secure=secure)
    print(f"kafka {paths.KAFKA_VERSION} started in {broker.started_in:.1f}s (pid {broker.pid})",
          file=sys.stderr)  # fmt: skip
    if broker.secrets is not None:
        print(f"  SASL_SSL, {kafka_secure.MECHANISM}; CA: {broker.secrets.ca_file}\n"
              f"  passwords of {', '.join(broker.secrets.passwords)}: {run_dir}/credentials.json\n"
              f"  admin client config: {broker.secrets.admin_config}", file=sys.stderr)  # fmt: skip
    print(broker.bootstrap)
    return 0


def cluster_up() -> int:
    run_dir = _run_dir("cluster")
    if _running(run_dir):
        info = json.loads((run_dir / "cluster.json").read_text())
        print(f"export KUBECONFIG={info['kubeconfig']}")
        return 0
    process.stop_all(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.monotonic()
    control_plane = cluster.start(run_dir)
    for name, seconds in control_plane.timings.items():
        print(f"  {name:<24} up in {seconds:5.1f}s", file=sys.stderr)
    print(f"control plane {paths.KUBE_VERSION} at {control_plane.server} "
          f"in {time.monotonic() - started:.1f}s", file=sys.stderr)  # fmt: skip
    print(f"export KUBECONFIG={control_plane.kubeconfig}")
    return 0


def compose_up() -> int:
    run_dir = _run_dir("compose")
    project = image.repo_root()
    compose.ensure_images()
    if _running(run_dir):
        engine = compose.Engine(run_dir, compose.docker_host(run_dir))
    else:
        process.stop_all(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        engine = compose.start_engine(run_dir)
    kubeconfig = os.environ.get("KUBECONFIG")
    seconds = compose.up(engine, project, Path(kubeconfig) if kubeconfig else None)
    print(f"docker compose up --wait: every service healthy in {seconds:.1f}s", file=sys.stderr)
    print(f"export DOCKER_HOST={engine.docker_host}")
    return 0


def compose_down() -> int:
    run_dir = _run_dir("compose")
    if _running(run_dir):
        compose.down(compose.Engine(run_dir, compose.docker_host(run_dir)), image.repo_root())
    return down("compose")


def down(kind: str) -> int:
    run_dir = _run_dir(kind)
    for name, peak in process.peak_memory(run_dir).items():
        print(f"  {name:<24} peak RSS {peak / 2**20:7.1f} MiB", file=sys.stderr)
    stopped = process.stop_all(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    print(f"{kind}: stopped {', '.join(stopped) if stopped else 'nothing'}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="podcost-localinfra", description=__doc__)
    parser.add_argument(
        "command",
        choices=[
            "build",
            "image",
            "kafka-up",
            "kafka-down",
            "cluster-up",
            "cluster-down",
            "compose-up",
            "compose-down",
            "reference",
        ],
    )
    parser.add_argument("--only", choices=build.TOOL_GROUPS, help="build: only this group of tools")
    parser.add_argument(
        "--secure", action="store_true",
        help="kafka-up/-down: the SASL_SSL broker with one SCRAM user per component and ACLs",
    )  # fmt: skip
    parser.add_argument(
        "--cluster", action="append", default=[],
        help="kafka-up --secure: a cluster whose annotator gets a user (repeatable) [local]",
    )  # fmt: skip
    parser.add_argument(
        "--check", action="store_true",
        help="reference: write nothing; exit 1 naming each generated page that is out of date",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "reference":
        from . import reference  # imports the podcost packages: only for this command

        return reference.main(Path.cwd(), check=args.check)
    try:
        if args.command == "build":
            build.ensure_all(args.only)
            return 0
        if args.command == "image":
            built = image.ensure_image()
            print(f"{built.ref}: {built.size / 2**20:.1f} MiB, built in {built.seconds:.1f}s",
                  file=sys.stderr)  # fmt: skip
            print(built.ref)
            return 0
        if args.command == "kafka-up":
            clusters = tuple(args.cluster) or ("local",)
            return kafka_up(kafka_secure.Layout(clusters=clusters) if args.secure else None)
        if args.command == "cluster-up":
            return cluster_up()
        if args.command == "compose-up":
            return compose_up()
        if args.command == "compose-down":
            return compose_down()
        kind = args.command.removesuffix("-down")
        return down(f"{kind}-secure" if args.secure and kind == "kafka" else kind)
    except (build.BuildError, process.StartError) as error:
        print(f"podcost-localinfra: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
