"""Daemons started in the background with a log and a pid file, stopped by pid.

Called by ``kafka`` and ``cluster``. A daemon runs in its own session so that ``make kafka-up``
can exit and leave it running; ``stop_all`` ends every daemon whose pid file is in a run
directory, in reverse start order. ``stop`` ends one daemon by its pid and ``restart`` starts it
again with the very command line it was started with (kept next to its pid file), in the same
place of the start order: how a test takes a server away and brings it back (a real outage).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Children started by this process, by pid: kept so they can be reaped (and so that dropping a
#: running ``Popen`` does not warn); daemons left for ``make *-down`` are found by pid file instead.
_children: dict[int, subprocess.Popen[bytes]] = {}


class StartError(RuntimeError):
    """A server did not come up; the message names it and quotes the end of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except FileNotFoundError:
        return "(no log)"


@dataclass(frozen=True)
class Daemon:
    """A started server: its name, pid and log."""

    name: str
    pid: int
    log: Path

    def alive(self) -> bool:
        child = _children.get(self.pid)
        if child is not None:
            return child.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        # A zombie child counts as dead.
        try:
            waited, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True
        return waited == 0


def start(
    run_dir: Path, name: str, argv: Sequence[str], env: dict[str, str] | None = None
) -> Daemon:
    """Start ``argv`` detached, logging to ``run_dir/logs/<name>.log``; record its pid."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "pids").mkdir(parents=True, exist_ok=True)
    order = len(list((run_dir / "pids").glob("*.pid")))
    command = {"order": order, "argv": list(argv), "env": env}
    (run_dir / "pids" / f"{name}.command.json").write_text(json.dumps(command))
    return _spawn(run_dir, name, list(argv), env, order)


def _spawn(
    run_dir: Path, name: str, argv: list[str], env: dict[str, str] | None, order: int
) -> Daemon:
    log = run_dir / "logs" / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            cwd=run_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _children[proc.pid] = proc
    (run_dir / "pids" / f"{order:02d}-{name}.pid").write_text(str(proc.pid))
    return Daemon(name, proc.pid, log)


def stop(run_dir: Path, name: str, timeout: float = 15.0) -> int:
    """Stop the daemon ``name`` of ``run_dir`` by its pid (SIGTERM, SIGKILL after ``timeout``);
    its pid file goes, its command stays for :func:`restart`. Returns the pid it had."""
    [pid_file] = (run_dir / "pids").glob(f"[0-9][0-9]-{name}.pid")
    pid = int(pid_file.read_text().strip())
    _terminate(pid, timeout)
    pid_file.unlink()
    return pid


def restart(run_dir: Path, name: str) -> Daemon:
    """Start the daemon ``name`` of ``run_dir`` again, stopped by :func:`stop`: the same command
    line and environment, so the same ports, data and certificates."""
    if list((run_dir / "pids").glob(f"[0-9][0-9]-{name}.pid")):
        raise StartError(f"{name} is still running in {run_dir}")
    command = json.loads((run_dir / "pids" / f"{name}.command.json").read_text())
    return _spawn(run_dir, name, command["argv"], command["env"], command["order"])


def wait_until(
    daemon: Daemon, ready: Callable[[], bool], timeout: float, what: str, interval: float = 0.2
) -> float:
    """Poll ``ready`` until it holds; fail early if the daemon died. Returns seconds waited."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if not daemon.alive():
            raise StartError(f"{daemon.name} exited before {what}:\n{log_tail(daemon.log)}")
        try:
            if ready():
                return time.monotonic() - started
        except OSError:
            pass
        time.sleep(interval)
    raise StartError(f"{daemon.name} not {what} after {timeout:.0f}s:\n{log_tail(daemon.log)}")


def tcp_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def https_ok(url: str, token: str | None = None, ca_file: Path | None = None) -> bool:
    """GET ``url`` and report whether it answered 200."""
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    if context is None:
        context = ssl._create_unverified_context()
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return False


def peak_memory(run_dir: Path) -> dict[str, int]:
    """Peak resident memory (VmHWM, bytes) of each running daemon recorded in ``run_dir``."""
    peaks: dict[str, int] = {}
    for pid_file in sorted((run_dir / "pids").glob("*.pid")) if (run_dir / "pids").exists() else []:
        try:
            status = Path(f"/proc/{pid_file.read_text().strip()}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peaks[pid_file.stem.split("-", 1)[1]] = int(line.split()[1]) * 1024
    return peaks


def stop_all(run_dir: Path, timeout: float = 15.0) -> list[str]:
    """Stop every daemon recorded in ``run_dir`` (reverse start order); return their names."""
    pid_dir = run_dir / "pids"
    stopped: list[str] = []
    if not pid_dir.exists():
        return stopped
    for pid_file in sorted(pid_dir.glob("*.pid"), reverse=True):
        pid = int(pid_file.read_text().strip())
        _terminate(pid, timeout)
        pid_file.unlink()
        stopped.append(pid_file.stem.split("-", 1)[1])
    return stopped


def _terminate(pid: int, timeout: float) -> None:
    child = _children.pop(pid, None)
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        if child is not None:
            child.wait()
        return
    if child is not None:
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pid, signal.SIGKILL)
            child.wait()
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Daemon("", pid, Path()).alive():
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    # Reap it if it is our child, so no zombie outlives the test session.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
