"""The rules that keep ``make test`` free of long tests and ``make test-long`` from running
nothing (``tests/support/selection.py``, applied by ``tests/conftest.py``)."""

from __future__ import annotations

import pytest
from tests.support.selection import empty_long_run, wants_long


@pytest.mark.parametrize(
    ("markexpr", "decides"),
    [
        ("", False),
        ("integration", False),
        ("e2e or integration", False),
        ("long", True),
        ("long and e2e", True),
        ("not long", True),
        ("longer", False),
    ],
)
def test_long_tests_are_left_out_unless_the_mark_expression_names_long(
    markexpr: str, decides: bool
) -> None:
    assert wants_long(markexpr) is decides


@pytest.mark.parametrize(
    ("markexpr", "selected", "error"),
    [
        ("long", 0, True),
        ("  long ", 0, True),
        ("long and e2e", 0, True),
        ("long", 2, False),
        ("not long", 0, False),
        ("", 0, False),
        ("integration", 0, False),
    ],
)
def test_a_long_run_that_selects_nothing_is_an_error(
    markexpr: str, selected: int, error: bool
) -> None:
    reason = empty_long_run(markexpr, selected)
    assert (reason is not None) is error
    if reason is not None:
        assert "selected no test" in reason
