"""The fuzz tests' hypothesis settings and their case count.

Every fuzz test (``tests/unit/test_fuzz_*.py``) is decorated with :func:`fuzz`, which runs it
under one of two hypothesis settings profiles and marks it ``fuzz`` (so ``make test`` runs it,
and so does ``make test-long``, which selects ``-m "long or fuzz"``):

- ``podcost-fuzz`` (``make test``): :data:`BASE_EXAMPLES` cases per test, a few thousand in all;
- ``podcost-fuzz-long`` (``PODCOST_LONG=1``, what ``make test-long`` sets with ``-m long``):
  :data:`LONG_EXAMPLES` per test, more than 100,000 in all.

So one definition of each test serves both runs, and a plain ``make test`` never runs the long
counts. :data:`CASES` counts the cases each test really ran (shrinking included);
``tests/conftest.py`` prints the counts at the end of the session.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

LONG = os.environ.get("PODCOST_LONG") == "1"
BASE_EXAMPLES = 150
LONG_EXAMPLES = 5_500

_COMMON: dict[str, Any] = {
    "deadline": None,  # a 2-core machine shared with servers: timing is not the property
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
    "print_blob": True,
}
settings.register_profile("podcost-fuzz", max_examples=BASE_EXAMPLES, **_COMMON)
settings.register_profile("podcost-fuzz-long", max_examples=LONG_EXAMPLES, **_COMMON)
PROFILE = settings.get_profile("podcost-fuzz-long" if LONG else "podcost-fuzz")

#: Cases run per fuzz test (parametrized variants add up under one name).
CASES: Counter[str] = Counter()

T = TypeVar("T", bound=Callable[..., Any])


def fuzz(share: float = 1.0) -> Callable[[T], T]:
    """Run a ``@given`` test under the profile of this run, with ``share`` times its cases,
    counted in :data:`CASES`, and marked ``fuzz``. Apply it above ``@given``."""

    def apply(test: T) -> T:
        handle = getattr(test, "hypothesis", None)
        if handle is None:
            raise TypeError(f"{test.__name__}: @fuzz goes above @given")
        inner = handle.inner_test
        name = test.__name__
        counted: Callable[..., Any]
        if inspect.iscoroutinefunction(inner):

            @functools.wraps(inner)
            async def counted(*args: Any, **kwargs: Any) -> Any:
                CASES[name] += 1
                return await inner(*args, **kwargs)
        else:

            @functools.wraps(inner)
            def counted(*args: Any, **kwargs: Any) -> Any:
                CASES[name] += 1
                return inner(*args, **kwargs)

        handle.inner_test = counted
        examples = max(1, round(PROFILE.max_examples * share))
        configured = settings(PROFILE, max_examples=examples)(test)
        marked: T = pytest.mark.fuzz(configured)
        return marked

    return apply


def summary() -> list[str]:
    """The lines the session prints: the total, then each test's count."""
    if not CASES:
        return []
    profile = "podcost-fuzz-long" if LONG else "podcost-fuzz"
    lines = [f"fuzz cases run: {sum(CASES.values())} (profile {profile})"]
    lines += [f"  {count:>8}  {name}" for name, count in sorted(CASES.items())]
    return lines


# --- mutating valid JSON documents -----------------------------------------------------------

Path = tuple[str | int, ...]


def _nested(depth: int) -> list[Any]:
    inner: list[Any] = []
    for _ in range(depth):
        inner = [inner]
    return inner


#: Python values put in place of one part of a valid document: huge and odd numbers, NaN and
#: infinity, odd and huge strings, deep nesting, wrong types.
HOSTILE_VALUES: list[object] = [
    10**5000,
    -(10**400),
    2**31,
    2**63,
    -1,
    0,
    1.5,
    float("nan"),
    float("inf"),
    -float("inf"),
    1e308,
    True,
    None,
    "",
    "1" * 5000,
    "-" + "0" * 4400 + "1",
    "1e99999999",
    "0001-01-01T00:00:00+14:00",
    "\ud800",
    "\x00",
    "\u202e\u0301\U0001f600",
    "x" * 100_000,
    [],
    {},
    [1, "a", None],
    {"f:metadata": 5},
    _nested(40),
]


def json_paths(node: Any, at: Path = ()) -> list[Path]:
    """Every place in a JSON document: the root, each member and each element, depth first."""
    found = [at]
    if isinstance(node, dict):
        for name, child in node.items():
            found += json_paths(child, (*at, name))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += json_paths(child, (*at, index))
    return found


def json_set(node: Any, path: Path, value: Any) -> Any:
    """A copy of ``node`` with ``value`` at ``path``."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {**node, head: json_set(node[head], rest, value)}
    copy = list(node)
    copy[int(head)] = json_set(copy[int(head)], rest, value)
    return copy


def json_edit(node: Any, path: Path, edit: str, extra: object) -> Any:
    """A copy of ``node`` without the member at ``path`` (``drop``), with the list element
    there doubled (``double``), or with an unknown member ``extra`` beside it (otherwise)."""
    if not path:
        return node
    *parent_path, last = path
    parent = node
    for step in parent_path:
        parent = parent[step]
    if isinstance(parent, dict) and edit == "drop":
        replaced: Any = {name: child for name, child in parent.items() if name != last}
    elif isinstance(parent, list) and edit == "double":
        at = int(last)
        replaced = [*parent[: at + 1], parent[at], *parent[at + 1 :]]
    elif isinstance(parent, dict):
        replaced = {**parent, "unknown_field": extra}
    else:
        return node
    return json_set(node, tuple(parent_path), replaced)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated_json(draw: st.DrawFn, document: Any) -> Any:
    """``document`` (decoded JSON) with one part replaced, removed, doubled or added to."""
    path = draw(st.sampled_from(json_paths(document)))
    how = draw(st.sampled_from(["hostile", "json", "drop", "double", "extra"]))
    value = draw(st.sampled_from(HOSTILE_VALUES)) if how != "json" else draw(JSON_VALUES)
    if how in ("hostile", "json"):
        return json_set(document, path, value)
    return json_edit(document, path, how, value)
