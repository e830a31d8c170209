"""Per-cluster signatures as pure functions: a record verifies with the key it was signed
with (any of its cluster's, during a rotation) and with no other; altered, it verifies with
none; the key files are read line by line and a short key is refused."""

from __future__ import annotations

import pytest

from podcost.runtime.fleet import FleetKeys
from podcost_contracts.signing import (
    KeysError,
    read_keys,
    read_signing_key,
    signature,
    verified,
)

KEY_A, KEY_B = b"a" * 32, b"b" * 32


def test_a_record_verifies_with_its_key_and_no_other() -> None:
    mark = signature(KEY_A, b"a/shop/Deployment/web", b"{}")
    assert mark.startswith(b"v1=")
    assert verified([KEY_B, KEY_A], b"a/shop/Deployment/web", b"{}", mark)
    assert not verified([KEY_B], b"a/shop/Deployment/web", b"{}", mark)
    assert not verified([KEY_A], b"b/shop/Deployment/web", b"{}", mark)  # another key
    assert not verified([KEY_A], b"a/shop/Deployment/web", b"{ }", mark)  # altered value
    assert not verified([KEY_A], b"a/shop/Deployment/web", b"{}", None)
    assert not verified([KEY_A], b"a/shop/Deployment/web", b"{}", mark[3:])


def test_the_keys_file_holds_one_or_two_keys_per_cluster() -> None:
    text = f"# fleet keys\nprod-eu-1 {'a' * 32}\nprod-us-1 {'b' * 32} {'c' * 40}  # rotating\n"
    assert read_keys(text) == {"prod-eu-1": (b"a" * 32,), "prod-us-1": (b"b" * 32, b"c" * 40)}
    for bad, problem in [
        (f"prod-eu-1 {'a' * 31}", "line 1: a key must be at least 32"),
        ("prod-eu-1", "line 1: prod-eu-1 needs 1 to 2 keys, got 0"),
        (f"prod-eu-1 {'a' * 32} {'b' * 32} {'c' * 32}", "needs 1 to 2 keys, got 3"),
        (f"Prod {'a' * 32}", "line 1: 'Prod' is not a valid cluster name"),
        (f"x {'a' * 32}\nx {'b' * 32}", "line 2: x is listed twice"),
    ]:
        with pytest.raises(KeysError, match=problem):
            read_keys(bad)
    assert read_signing_key(f"  {'k' * 32}\n") == b"k" * 32
    with pytest.raises(KeysError):
        read_signing_key("short")


def test_without_a_keys_file_no_signature_is_asked() -> None:
    keys = FleetKeys(None)
    assert not keys.required
    assert keys.verified("any", b"any/x/Deployment/y", b"", None)
