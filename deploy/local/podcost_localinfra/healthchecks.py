"""The timer podman's health checks lack where systemd is not the init.

podman 4 runs a container's health check from a transient systemd timer it creates at start;
without systemd the check never runs, the container stays ``starting``, and compose's
``depends_on: condition: service_healthy`` (and ``up --wait``) never completes. This daemon
does what the timer does: every running container that has a health check gets it run at its
interval (the first one at once), through podman's own API on its socket
(``GET /libpod/containers/<id>/healthcheck``), which records the result and moves the status
to ``healthy`` or, after its retries, ``unhealthy`` exactly as the timer's run would.

Started and stopped by its pid by :mod:`.compose`: ``python -m podcost_localinfra.healthchecks
<socket>``; it ends by itself when the socket goes away.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

API = "/v4.0.0/libpod"
#: How often the container list is read (a new container's first check waits at most this).
POLL_SECONDS = 1.0


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over podman's unix socket."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._path))
        self.sock = sock


def _get(sock: Path, path: str, timeout: float = 60.0) -> tuple[int, Any]:
    connection = _UnixConnection(sock, timeout)
    try:
        connection.request("GET", f"{API}{path}")
        response = connection.getresponse()
        body = response.read()
        return response.status, json.loads(body) if body else None
    finally:
        connection.close()


def _interval(sock: Path, container_id: str) -> float | None:
    """The container's health-check interval in seconds; None when it has no check."""
    status, inspected = _get(sock, f"/containers/{container_id}/json")
    if status != 200:
        return None
    check = (inspected.get("Config") or {}).get("Healthcheck") or {}
    test = check.get("Test") or []
    if not test or test[0] == "NONE":
        return None
    nanoseconds = check.get("Interval") or 30_000_000_000
    return max(float(nanoseconds) / 1e9, 1.0)


def run(sock: Path) -> None:
    """Run every running container's check at its interval until ``sock`` disappears."""
    intervals: dict[str, float | None] = {}
    due: dict[str, float] = {}
    running: dict[str, Future[object]] = {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        while sock.exists():
            try:
                status, listed = _get(sock, "/containers/json")
            except OSError:
                time.sleep(POLL_SECONDS)
                continue
            now = time.monotonic()
            ids = {entry["Id"] for entry in listed or []} if status == 200 else set()
            for container_id in ids:
                if container_id not in intervals:
                    intervals[container_id] = _interval(sock, container_id)
                interval = intervals[container_id]
                if interval is None or now < due.get(container_id, now):
                    continue
                if container_id in running and not running[container_id].done():
                    continue  # a check still running: the timer does not stack them
                due[container_id] = now + interval
                running[container_id] = pool.submit(
                    _get, sock, f"/containers/{container_id}/healthcheck"
                )
            for gone in set(intervals) - ids:
                intervals.pop(gone, None)
                due.pop(gone, None)
                running.pop(gone, None)
            time.sleep(POLL_SECONDS)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m podcost_localinfra.healthchecks <podman socket>", file=sys.stderr)
        return 2
    run(Path(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
