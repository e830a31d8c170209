"""Which tests a run selects: the opt-in ``long`` tests, and the check that a long run is not empty.

``tests/conftest.py`` calls these from ``pytest_collection_modifyitems``: a ``long`` test runs
only when the marker expression (``-m``) names ``long`` (``make test-long`` runs ``-m long``),
so ``make test`` never runs the long variants; and a run asked for ``-m long`` that selects no
test at all is an error, not a green run of nothing. Pure, so ``tests/unit/test_selection.py``
checks the rules without running pytest inside pytest.
"""

from __future__ import annotations

import re

LONG = "long"

_WORD = re.compile(rf"\b{LONG}\b")


def wants_long(markexpr: str) -> bool:
    """Whether the ``-m`` expression speaks of the ``long`` mark at all (``long``,
    ``long and e2e``, ``not long``): then it decides, else long tests are left out."""
    return bool(_WORD.search(markexpr))


def empty_long_run(markexpr: str, selected: int) -> str | None:
    """Why a run is an error: ``-m long`` (alone, or with other marks) that selected no test;
    ``None`` when the run is fine."""
    expression = markexpr.strip()
    asks_for_long = wants_long(expression) and not re.search(rf"\bnot\s+{LONG}\b", expression)
    if asks_for_long and selected == 0:
        return (
            f"-m {expression!r} selected no test: the long runs (e.g. the 300 differential "
            "scenarios) are missing their @pytest.mark.long"
        )
    return None
