"""The fleet registry as the core holds it: every cluster without a file, the listed ones with
one, a changed file read again at the next check (a ConfigMap's swap included), and a file
that turns bad keeping the clusters read last."""

from __future__ import annotations

from pathlib import Path

import pytest

from podcost.runtime.fleet import FleetKeys, FleetRegistry
from podcost_contracts.fleet import RegistryError


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_without_a_file_every_cluster_is_served() -> None:
    registry = FleetRegistry(None)
    assert registry.serves("anything-at-all")
    assert registry.clusters is None


def test_a_changed_file_is_read_at_the_next_check_and_not_before(tmp_path: Path) -> None:
    path = tmp_path / "clusters.txt"
    path.write_text("prod-eu-1\n")
    ticks = Ticks()
    registry = FleetRegistry(path, monotonic=ticks, check_every_s=1.0)
    assert registry.serves("prod-eu-1")
    assert not registry.serves("prod-us-1")
    # Kubernetes swaps a mounted ConfigMap's file for a new one.
    swapped = tmp_path / "clusters.new"
    swapped.write_text("prod-eu-1\nprod-us-1\n")
    swapped.replace(path)
    assert not registry.serves("prod-us-1")  # not looked at again within the second
    ticks.now = 1.0
    assert registry.serves("prod-us-1")
    path.write_text("prod-us-1\n")
    ticks.now = 2.0
    assert not registry.serves("prod-eu-1")


def test_a_file_turned_bad_keeps_the_clusters_read_last(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "clusters.txt"
    path.write_text("prod-eu-1\n")
    ticks = Ticks()
    registry = FleetRegistry(path, monotonic=ticks, check_every_s=1.0)
    path.write_text("prod-eu-1\nProd_US\n")
    ticks.now = 1.0
    assert registry.serves("prod-eu-1")
    assert "line 2" in caplog.text
    path.unlink()
    ticks.now = 2.0
    assert registry.serves("prod-eu-1")


def test_a_core_whose_registry_cannot_be_read_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FleetRegistry.open(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("not_a_name\n")
    with pytest.raises(RegistryError):
        FleetRegistry.open(bad)


def test_a_cluster_has_left_the_fleet_once_its_registry_line_or_its_keys_are_gone(
    tmp_path: Path,
) -> None:
    """What lets ``podcost remove-cluster``'s unsigned marker through to the aggregator: a
    registry that no longer lists the cluster, or a keys file with no key of it. Without either
    file no cluster has left (every record takes the usual checks)."""
    assert not FleetRegistry(None).left("prod-us-1")
    assert not FleetKeys(None).left("prod-us-1")
    clusters = tmp_path / "clusters.txt"
    clusters.write_text("prod-eu-1\n")
    registry = FleetRegistry(clusters)
    assert registry.left("prod-us-1")
    assert not registry.left("prod-eu-1")
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"prod-eu-1 {'a' * 32}\n")
    keys = FleetKeys(keys_file)
    assert keys.left("prod-us-1")
    assert not keys.left("prod-eu-1")
