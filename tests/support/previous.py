"""The previous release of podcost, built from a pinned commit of this repository: what the
rolling-upgrade test (``tests/e2e/test_rolling_upgrade.py``) runs beside this checkout, and what
encodes the contract fixtures (``tests/unit/test_contract_compatibility.py``).

The commit is named once, in ``tests/previous-release.toml``. :func:`ensure_previous` extracts
``git archive <commit>`` into ``~/.cache/podcost/previous/<commit>/src`` and syncs that tree's
own locked environment next to it (``uv sync --frozen``; uv's cache is shared, so a warm sync
takes seconds), once per commit. The test runs the previous release's processes with its
interpreter, and renders its Deployments with its own chart.

Regenerate the fixtures (after moving the commit, or after a change of what the messages
encode)::

    .venv/bin/python -m tests.support.previous fixtures

It encodes the samples of ``tests/unit/data/contracts/inputs.json`` with the previous release
(``previous.json``) and with this checkout (``current.json``), and checks, with the previous
release's own decoders, that it reads every current encoding: the promise of
``docs/guides/compatibility.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from podcost_localinfra import build, paths

ROOT = Path(__file__).resolve().parents[2]
PINNED = ROOT / "tests" / "previous-release.toml"
FIXTURES = ROOT / "tests" / "unit" / "data" / "contracts"
SAMPLES = Path(__file__).with_name("contract_samples.py")


class PreviousUnavailable(RuntimeError):
    """The previous release cannot be built here (the commit is not in this clone, or its
    environment does not sync)."""


def pinned_commit() -> str:
    """The commit ``tests/previous-release.toml`` names."""
    commit = str(tomllib.loads(PINNED.read_text())["commit"])
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        raise ValueError(f"{PINNED}: commit {commit!r} is not a full 40-hex commit id")
    return commit


@dataclass(frozen=True)
class Previous:
    """The previous release, built: its commit, source tree and interpreter."""

    commit: str
    src: Path
    python: Path

    @property
    def chart(self) -> Path:
        return self.src / "deploy" / "helm" / "podcost"


def ensure_previous(commit: str | None = None) -> Previous:
    """The previous release's tree and environment, built once per commit."""
    commit = commit or pinned_commit()
    present = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    if present.returncode != 0:
        raise PreviousUnavailable(
            f"commit {commit} (tests/previous-release.toml) is not in this clone: the "
            "rolling-upgrade test needs a full clone of main (git fetch --unshallow)"
        )
    home = paths.cache_dir() / "previous" / commit
    src, venv = home / "src", home / "venv"
    python = venv / "bin" / "python"
    stamp = home / ".built"
    with build._build_lock(f"previous-{commit[:12]}"):
        if stamp.exists() and python.exists():
            return Previous(commit, src, python)
        if src.exists():
            shutil.rmtree(src)
        src.mkdir(parents=True)
        archive = home / "src.tar"
        with archive.open("wb") as out:
            result = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT,
                                    stdout=out, stderr=subprocess.PIPE)  # fmt: skip
        if result.returncode != 0:
            raise PreviousUnavailable(f"git archive {commit}: {result.stderr.decode().strip()}")
        with tarfile.open(archive) as tar:
            tar.extractall(src, filter="data")
        archive.unlink()
        env = dict(os.environ) | {
            "UV_PROJECT_ENVIRONMENT": str(venv),
            "UV_PYTHON_DOWNLOADS": "never",
        }
        # The interpreter and uv the Makefile's setup uses (``python3 -m uv``).
        python3 = shutil.which("python3") or "python3"
        try:
            build._run(
                f"previous-{commit[:12]}",
                [python3, "-m", "uv", "sync", "--frozen", "--all-extras", "--python", python3],
                cwd=src,
                env=env,
            )
        except build.BuildError as error:
            raise PreviousUnavailable(str(error)) from error
        stamp.write_text(commit)
    return Previous(commit, src, python)


# --- the contract fixtures -------------------------------------------------------------------


def _samples(python: Path | str, *argv: str) -> str:
    """``contract_samples.py argv`` run by ``python`` (its own podcost, not this checkout's)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(python), str(SAMPLES), *argv],
        capture_output=True, text=True, env=env, cwd=SAMPLES.parent, timeout=120,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{python} {SAMPLES.name} {' '.join(argv)}:\n{result.stderr}")
    return result.stdout


def write_fixtures() -> None:
    """``previous.json`` and ``current.json`` from ``inputs.json``; fails if the previous
    release cannot read a current encoding."""
    previous = ensure_previous()
    inputs = FIXTURES / "inputs.json"
    encoded = {
        "previous": _samples(previous.python, "encode", str(inputs)),
        "current": _samples(sys.executable, "encode", str(inputs)),
    }
    for name, text in encoded.items():
        data = json.loads(text)
        if name == "previous":
            data = {"commit": previous.commit, **data}
        (FIXTURES / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    verdicts = json.loads(
        _samples(previous.python, "decode", str(FIXTURES / "current.json"), str(inputs))
    )
    refused = {kind: verdict for kind, verdict in verdicts.items() if verdict != "ok"}
    if refused:
        raise SystemExit(f"the previous release refuses current encodings: {refused}")
    print(f"wrote {FIXTURES}/previous.json ({previous.commit[:12]}) and current.json; "
          f"the previous release reads every current encoding ({len(verdicts)} kinds)")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:] == ["fixtures"]:
        write_fixtures()
    elif sys.argv[1:] == ["build"]:
        print(ensure_previous())
    else:
        raise SystemExit("usage: python -m tests.support.previous fixtures|build")
