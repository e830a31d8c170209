"""The local broker's KRaft cluster id: what the storage tool accepts."""

from __future__ import annotations

import base64
import re
from unittest import mock

from podcost_localinfra import kafka


def test_a_cluster_id_is_22_url_safe_characters_and_never_starts_with_a_dash() -> None:
    for _ in range(2000):
        cluster_id = kafka.new_cluster_id()
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id)
        assert not cluster_id.startswith("-")


def test_an_id_that_would_read_as_an_option_is_drawn_again() -> None:
    dash = base64.urlsafe_b64decode("-E6lQWzaRlyVBYGGy5Yb2Q==")
    plain = base64.urlsafe_b64decode("AE6lQWzaRlyVBYGGy5Yb2Q==")
    draws = [mock.Mock(bytes=dash), mock.Mock(bytes=plain)]
    with mock.patch.object(kafka.uuid, "uuid4", side_effect=draws):
        assert kafka.new_cluster_id() == "AE6lQWzaRlyVBYGGy5Yb2Q"
