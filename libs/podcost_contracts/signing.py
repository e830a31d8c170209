"""Per-cluster identity on the bus: a watcher signs every record it publishes with its
cluster's key, and the core accepts a snapshot of cluster B only if it is signed with one of B's
keys.

Pure functions and the key file format. The watcher (``podcost.watcher.service``) signs with
``PODCOST_WATCHER_SIGNING_KEY_FILE``; the aggregator (``podcost.aggregator.processor``) verifies
with ``PODCOST_FLEET_KEYS_FILE`` (read again when it changes, ``podcost.runtime.fleet``) and
dead-letters a record whose signature is missing or matches none of its cluster's keys.

The signature is HMAC-SHA256 over the record's key and value (``<key>\\n<value>``), in the
header :data:`SIGNATURE_HEADER` as ``v1=<hex>``. The key names the cluster, so a watcher holding
only cluster A's key cannot make a record the core takes as B's; the value is covered, so a
record cannot be altered on the way. Trace headers are not covered (they steer no decision).

Rotation without downtime: the keys file lists up to :data:`MAX_KEYS_PER_CLUSTER` keys per
cluster and any of them verifies. Add the new key to the core's file, roll the cluster's watcher
onto it, then remove the old key.

Keys file format: one line per cluster, ``<cluster> <key> [<key>]``, blank lines and ``#``
comments ignored; a key is at least :data:`MIN_KEY_CHARS` characters (e.g. ``openssl rand -hex
32``) and is used as its UTF-8 bytes. A signing key file holds one key (surrounding white space
ignored).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Final

from podcost_contracts.topics import cluster_name_problem

#: The record header carrying a watcher's signature.
SIGNATURE_HEADER: Final = "podcost-signature"
_VERSION: Final = b"v1="
#: Keys a cluster may have at once: the current one and the next (or previous).
MAX_KEYS_PER_CLUSTER: Final = 2
#: The shortest key accepted: 32 hex characters are 128 bits.
MIN_KEY_CHARS: Final = 32


class KeysError(ValueError):
    """A key file cannot be read (the line is named; the keys never are)."""


def signature(key: bytes, record_key: bytes, value: bytes) -> bytes:
    """The :data:`SIGNATURE_HEADER` value of a record with ``record_key`` and ``value``."""
    mac = hmac.new(key, record_key + b"\n" + value, hashlib.sha256)
    return _VERSION + mac.hexdigest().encode("ascii")


def verified(keys: Sequence[bytes], record_key: bytes, value: bytes, header: bytes | None) -> bool:
    """Whether ``header`` is the signature of the record by one of ``keys``."""
    if header is None or not header.startswith(_VERSION):
        return False
    return any(hmac.compare_digest(signature(key, record_key, value), header) for key in keys)


def _check_key(key: str, where: str) -> bytes:
    if len(key) < MIN_KEY_CHARS:
        raise KeysError(f"{where}: a key must be at least {MIN_KEY_CHARS} characters")
    return key.encode("utf-8")


def read_signing_key(text: str) -> bytes:
    """The key of a signing key file."""
    return _check_key(text.strip(), "the signing key")


def read_keys(text: str) -> Mapping[str, tuple[bytes, ...]]:
    """The accepted keys of each cluster in keys file ``text``."""
    keys: dict[str, tuple[bytes, ...]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        cluster, given = fields[0], fields[1:]
        problem = cluster_name_problem(cluster)
        if problem is not None:
            raise KeysError(f"line {number}: {problem}")
        if not 1 <= len(given) <= MAX_KEYS_PER_CLUSTER:
            raise KeysError(
                f"line {number}: {cluster} needs 1 to {MAX_KEYS_PER_CLUSTER} keys, got {len(given)}"
            )
        if cluster in keys:
            raise KeysError(f"line {number}: {cluster} is listed twice")
        keys[cluster] = tuple(_check_key(key, f"line {number}") for key in given)
    return keys
