"""The docs site builds in mkdocs' strict mode, so `make test` fails on a broken link or page.

Each build is a real `mkdocs build --strict` (a subprocess, as `make docs` runs it) into a
temporary directory; the failing cases build a copy of the site with one defect planted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.deploy_files import ROOT

#: What the site includes from outside docs/ (pymdownx.snippets, relative to the root).
INCLUDED = ("CHANGELOG.md", "CONTRIBUTING.md")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )


def copy_site(target: Path) -> Path:
    target.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", target / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", target / "docs")
    for name in INCLUDED:
        shutil.copy(ROOT / name, target / name)
    return target


def test_the_site_builds_strictly_with_every_page_and_the_benchmark_table(tmp_path: Path) -> None:
    built = build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    for page in ("index.html", "reference/cli/index.html", "changelog/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    # The generated table is included, not linked: every recorded row is on the page.
    rows = json.loads((ROOT / "docs" / "benchmarks" / "results.json").read_text())["rows"]
    assert rows
    assert "<table>" in benchmarks
    for row in rows:
        assert row["date"] in benchmarks
        assert f"<code>{row['benchmark']}</code>" in benchmarks


@pytest.mark.parametrize(
    ("defect", "reported"),
    [
        ("[a missing anchor](guides/quickstart.md#no-such-heading)", "no-such-heading"),
        ('--8<-- "docs/benchmarks/no-such-table.md"', "no-such-table.md"),
    ],
    ids=["missing anchor", "missing include"],
)
def test_a_broken_link_or_include_fails_the_strict_build(
    tmp_path: Path, defect: str, reported: str
) -> None:
    root = copy_site(tmp_path / "copy")
    index = root / "docs" / "index.md"
    index.write_text(index.read_text() + "\n" + defect + "\n")
    built = build(root, tmp_path / "site")
    assert built.returncode != 0
    assert reported in built.stdout + built.stderr
