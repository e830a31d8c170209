"""``future_stamp``: which stamps a reader refuses, against its own clock and allowance."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from podcost_contracts.stamps import DEFAULT_CLOCK_SKEW, future_stamp

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("emitted_at", "changed_at", "refused"),
    [
        (NOW, NOW, None),
        (NOW + DEFAULT_CLOCK_SKEW, None, None),  # at the allowance: admitted
        (NOW - 1e9, None, None),  # old stamps are the version guard's business, not this
        (NOW + DEFAULT_CLOCK_SKEW + 1, None, "emitted_at"),
        (NOW, 1e300, "changed_at"),
        (1e300, 1e300, "emitted_at"),
    ],
)
def test_a_stamp_beyond_the_allowance_is_named_and_others_pass(
    emitted_at: float, changed_at: float | None, refused: str | None
) -> None:
    message = SimpleNamespace(emitted_at=emitted_at, changed_at=changed_at)
    reason = future_stamp(message, now=NOW, allowance=DEFAULT_CLOCK_SKEW)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None
        assert reason.startswith(f"stamped in the future: {refused} ")


def test_a_message_without_stamps_is_never_refused() -> None:
    assert future_stamp(SimpleNamespace(), now=NOW, allowance=0.0) is None
