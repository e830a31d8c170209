"""``podcost-localinfra``: the Makefile's entry to build, start and stop the local servers.

``kafka-up`` prints the bootstrap address as its last line; ``cluster-up`` prints
``export KUBECONFIG=<path>`` as its last line. Both keep their state in a fixed run directory
under the cache (``PODCOST_RUN_DIR`` overrides it) so the matching ``-down`` finds the pids.
Re-running ``-up`` while the servers are up prints the same last line and starts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from . import build, cluster, kafka, paths, process


def _run_dir(kind: str) -> Path:
    override = os.environ.get("PODCOST_RUN_DIR")
    return Path(override) / kind if override else paths.run_root() / kind


def _running(run_dir: Path) -> bool:
    pid_files = list((run_dir / "pids").glob("*.pid")) if (run_dir / "pids").exists() else []
    if not pid_files:
        return False
    pids = [int(pid_file.read_text()) for pid_file in pid_files]
    return all(process.Daemon("", pid, Path()).alive() for pid in pids)


def kafka_up() -> int:
    run_dir = _run_dir("kafka")
    if _running(run_dir):
        print((run_dir / "bootstrap").read_text().strip())
        return 0
    process.stop_all(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    broker = kafka.start(run_dir)
    print(f"kafka {paths.KAFKA_VERSION} started in {broker.started_in:.1f}s (pid {broker.pid})",
          file=sys.stderr)  # fmt: skip
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
        choices=["build", "kafka-up", "kafka-down", "cluster-up", "cluster-down"],
    )
    parser.add_argument("--only", choices=build.TOOL_GROUPS, help="build: only this group of tools")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build.ensure_all(args.only)
            return 0
        if args.command == "kafka-up":
            return kafka_up()
        if args.command == "cluster-up":
            return cluster_up()
        return down(args.command.removesuffix("-down"))
    except (build.BuildError, process.StartError) as error:
        print(f"podcost-localinfra: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
