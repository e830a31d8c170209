"""The fleet registry and the fleet's signing keys as the core holds them: which clusters it
serves and whose signature makes a snapshot a cluster's, each read again when its file changes
(:class:`WatchedFile`; the keys: :class:`FleetKeys`, format in ``podcost_contracts.signing``).

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
from typing import Final, Generic, TypeVar

from podcost_contracts.fleet import read_registry
from podcost_contracts.signing import read_keys, verified

T = TypeVar("T")

log = logging.getLogger("podcost.fleet")

#: How often the registry looks at its file: a second, so a cluster added to the ConfigMap is
#: served as soon as the kubelet has updated the mounted file.
CHECK_EVERY_S: Final = 1.0


class WatchedFile(Generic[T]):
    """A file's parsed content, read again when the file changed (looked at once per
    ``check_every_s`` at most); a file that turns bad keeps what was read last."""

    def __init__(
        self,
        path: Path,
        parse: Callable[[str], T],
        what: str,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.path = path
        self._parse = parse
        self._what = what
        self._monotonic = monotonic
        self._check_every_s = check_every_s
        self._identity: tuple[int, int, int, int] | None = None
        self.value: T = self._read()
        """What the file held when last read."""
        self._next_check = monotonic() + check_every_s

    def current(self) -> T:
        """The content, the file looked at again if due."""
        now = self._monotonic()
        if now >= self._next_check:
            self._next_check = now + self._check_every_s
            self._reload()
        return self.value

    def _read(self) -> T:
        # The identity first: a bad file is reported once, not at every check.
        stat = os.stat(self.path)
        self._identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        return self._parse(self.path.read_text(encoding="utf-8"))

    def _reload(self) -> None:
        try:
            stat = os.stat(self.path)
            if (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns) == self._identity:
                return
            value = self._read()
        except (OSError, ValueError) as error:
            log.error("the %s %s cannot be read (%s): still using what was read last",
                      self._what, self.path, error)  # fmt: skip
            return
        if value != self.value:
            log.warning("the %s %s changed", self._what, self.path)
        self.value = value


class FleetRegistry:
    """The clusters the core serves (no file: every one)."""

    def __init__(
        self,
        path: Path | None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.path = path
        self._file = (
            None
            if path is None
            else WatchedFile(path, read_registry, "fleet registry", monotonic=monotonic,
                             check_every_s=check_every_s)
        )  # fmt: skip
        if self._file is not None:
            log.info("the fleet registry %s lists %d clusters", path, len(self._file.value))

    @property
    def clusters(self) -> frozenset[str] | None:
        """What the file listed when last read (``None``: no file, every cluster served)."""
        return None if self._file is None else self._file.value

    @classmethod
    def open(cls, path: Path | None) -> FleetRegistry:
        """The registry of ``path``; ``RegistryError`` (or ``OSError``) if it cannot be read at
        start: a core that cannot tell its clusters does not start."""
        return cls(path)

    def serves(self, cluster: str) -> bool:
        """Whether records of ``cluster`` are processed (the file looked at again if due)."""
        return self._file is None or cluster in self._file.current()

    def left(self, cluster: str) -> bool:
        """Whether a registry is kept and no longer lists ``cluster``."""
        return self._file is not None and cluster not in self._file.current()


class FleetKeys:
    """Each cluster's accepted signing keys (``podcost_contracts.signing``; no file: records
    are not asked to be signed)."""

    def __init__(
        self,
        path: Path | None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.path = path
        self._file = (
            None
            if path is None
            else WatchedFile(path, read_keys, "fleet keys file", monotonic=monotonic,
                             check_every_s=check_every_s)
        )  # fmt: skip

    @property
    def required(self) -> bool:
        """Whether every snapshot must be signed."""
        return self._file is not None

    def left(self, cluster: str) -> bool:
        """Whether keys are asked for and ``cluster`` has none any more."""
        return self._file is not None and not self._file.current().get(cluster)

    def verified(self, cluster: str, record_key: bytes, value: bytes, header: bytes | None) -> bool:
        """Whether the record is signed with one of ``cluster``'s keys (no file: always)."""
        if self._file is None:
            return True
        keys = self._file.current().get(cluster, ())
        return verified(keys, record_key, value, header)
