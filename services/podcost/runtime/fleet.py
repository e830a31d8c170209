"""The fleet registry as the core holds it: which clusters it serves, read again when the file
changes.

The aggregator (``podcost.aggregator.processor``) asks :meth:`FleetRegistry.serves` for every
record's cluster before it decodes the record: a record of a cluster the registry does not list
is dead-lettered and counted, creates no state and no costs topic, so a stream of invented
cluster names costs a dead letter each and nothing that stays. The file is the chart's
``fleet.clusters`` ConfigMap, mounted (``PODCOST_FLEET_FILE``, format in
``podcost_contracts.fleet``); Kubernetes swaps a mounted ConfigMap's file in place, so the
registry compares the file's identity (device, inode, size, modification time) at most once per
:data:`CHECK_EVERY_S` and reads it again when that changed. A file that cannot be read or holds
a bad name keeps the clusters read last (logged as an error), so a typo never stops the fleet.

Without a file every cluster is served: embedded mode and a single-cluster core need no
configuration (:meth:`FleetRegistry.open`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from podcost_contracts.fleet import RegistryError, read_registry

log = logging.getLogger("podcost.fleet")

#: How often the registry looks at its file: a second, so a cluster added to the ConfigMap is
#: served as soon as the kubelet has updated the mounted file.
CHECK_EVERY_S: Final = 1.0


class FleetRegistry:
    """The clusters the core serves (``None``: every one)."""

    def __init__(
        self,
        path: Path | None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.path = path
        self._monotonic = monotonic
        self._check_every_s = check_every_s
        self._next_check = float("-inf")
        self._identity: tuple[int, int, int, int] | None = None
        self.clusters: frozenset[str] | None = None
        """What the file listed when last read (``None``: no file, every cluster served)."""
        if path is not None:
            self.clusters = self._read(path)
            self._next_check = monotonic() + check_every_s

    @classmethod
    def open(cls, path: Path | None) -> FleetRegistry:
        """The registry of ``path``; ``RegistryError`` (or ``OSError``) if it cannot be read at
        start: a core that cannot tell its clusters does not start."""
        return cls(path)

    def serves(self, cluster: str) -> bool:
        """Whether records of ``cluster`` are processed (the file looked at again if due)."""
        if self.path is None:
            return True
        now = self._monotonic()
        if now >= self._next_check:
            self._next_check = now + self._check_every_s
            self._reload(self.path)
        clusters = self.clusters
        return clusters is not None and cluster in clusters

    def _read(self, path: Path) -> frozenset[str]:
        # The identity first: a bad file is reported once, not at every check.
        stat = os.stat(path)
        self._identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        clusters = read_registry(path.read_text(encoding="utf-8"))
        log.info("the fleet registry %s lists %d clusters", path, len(clusters))
        return clusters

    def _reload(self, path: Path) -> None:
        try:
            stat = os.stat(path)
            if (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns) == self._identity:
                return
            clusters = self._read(path)
        except (OSError, RegistryError) as error:
            log.error("the fleet registry %s cannot be read (%s): still serving the %d clusters "
                      "read last", path, error, len(self.clusters or ()))  # fmt: skip
            return
        if clusters != self.clusters:
            before = self.clusters or frozenset()
            log.warning("the fleet registry changed: added %s, removed %s",
                        sorted(clusters - before), sorted(before - clusters))  # fmt: skip
        self.clusters = clusters
