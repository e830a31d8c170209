"""Fuzzing the policy parsers: any ``podcost.dev/*`` or lablabs annotations, any annotation text,
any policy file (bytes, YAML, JSON, decoded data) gives a ``Policy`` or a ``PolicyError`` naming
the culprit, never another exception. The watcher, every ranker and the aggregator parse a
workload's annotations from each snapshot they read, so an exception here would stop them on
that snapshot at every restart. Case counts: ``tests/support/fuzz.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.fuzz import fuzz

from podcost_core.policy import (
    ARGS_PREFIX,
    ENABLED,
    LABLABS_ENABLED,
    LABLABS_SPREAD_BY,
    LABLABS_TYPE,
    SPREAD_BY,
    STRATEGIES,
    THRESHOLD_PREFIX,
    Policy,
    PolicyError,
    load_policy_file,
    parse_args,
    parse_strategies,
    policy_from_annotations,
    policy_from_data,
    policy_from_text,
)
from podcost_core.strategies.registry import BUILTIN_REGISTRY

T = TypeVar("T")
NAMES = sorted(BUILTIN_REGISTRY)
ODD_TEXT = [
    "1" * 5000,
    "0" * 4400 + "1",
    "1" + "0" * 400,
    "1e999",
    "nan",
    "inf",
    "-1",
    "0",
    "",
    " ",
    "=",
    "|",
    ",",
    ";",
    "\x00",
    "\ud800",
    "٣",
    "x" * 10_000,
]
TOKENS = st.one_of(
    st.sampled_from(NAMES),
    st.sampled_from(ODD_TEXT),
    st.text(max_size=12),
    st.sampled_from(["=", "|", ",", ";", " ", "zone", "true", "effects", "topology_key"]),
)
#: Annotation text built from the grammar's own pieces, so that the parser gets past its first
#: check more often than with arbitrary text.
GRAMMAR_TEXT = st.lists(TOKENS, max_size=12).map("".join)
VALUES = st.one_of(GRAMMAR_TEXT, st.text(max_size=30), st.sampled_from(ODD_TEXT))
KEYS = st.one_of(
    st.sampled_from(
        [ENABLED, STRATEGIES, SPREAD_BY, LABLABS_ENABLED, LABLABS_TYPE, LABLABS_SPREAD_BY]
    ),
    st.builds(
        lambda prefix, name: prefix + name,
        st.sampled_from([ARGS_PREFIX, THRESHOLD_PREFIX]),
        st.one_of(st.sampled_from(NAMES), st.text(max_size=10)),
    ),
    st.text(max_size=20).map(lambda text: "podcost.dev/" + text),
)
ARG_NAMES = [
    "direction",
    "saturation_seconds",
    "topology_key",
    "effects",
    "label",
    "value",
    "price_annotation",
    "measure",
    "same_node_weight",
    "required_weight",
    "preferred_weight",
    "annotation",
]


def _outcome(make: Callable[[], T]) -> T | PolicyError:
    """What ``make()`` returns, or the ``PolicyError`` it raised (with a culprit and a reason);
    any other exception fails the test."""
    try:
        return make()
    except PolicyError as error:
        refused = error
    assert refused.culprit
    assert refused.reason
    return refused


def _policy_or_error(make: Callable[[], Policy]) -> None:
    assert isinstance(_outcome(make), Policy | PolicyError)


@fuzz()
@given(annotations=st.dictionaries(KEYS, VALUES, max_size=6))
def test_any_podcost_or_lablabs_annotations_give_a_policy_or_a_policy_error(
    annotations: dict[str, str],
) -> None:
    _policy_or_error(lambda: policy_from_annotations(annotations))
    # The same through the cache the services use, and with the built-ins only.
    _policy_or_error(lambda: policy_from_annotations(annotations, registry=BUILTIN_REGISTRY))


@fuzz(share=0.5)
@given(text=VALUES)
def test_any_strategies_or_args_text_parses_or_gives_a_policy_error(text: str) -> None:
    assert isinstance(_outcome(lambda: parse_strategies(text)), tuple | PolicyError)
    assert isinstance(_outcome(lambda: parse_args(text, culprit=ARGS_PREFIX)), dict | PolicyError)


ENTRY_VALUES = st.one_of(
    JSON_SCALARS := st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=10**300, max_value=10**420),
        st.floats(),
        st.text(max_size=10),
        st.sampled_from(ODD_TEXT),
    ),
    st.lists(st.text(max_size=10), max_size=3),
    st.dictionaries(st.sampled_from(ARG_NAMES), JSON_SCALARS, max_size=3),
)
ENTRIES = st.one_of(
    st.fixed_dictionaries(
        {"name": st.one_of(st.sampled_from(NAMES), st.text(max_size=10))},
        optional={
            "weight": ENTRY_VALUES,
            "tier": ENTRY_VALUES,
            "threshold": ENTRY_VALUES,
            "args": st.dictionaries(
                st.one_of(st.sampled_from(ARG_NAMES), st.text(max_size=8)),
                ENTRY_VALUES,
                max_size=3,
            ),
        },
    ),
    ENTRY_VALUES,
)
DOCUMENTS = st.one_of(
    st.fixed_dictionaries(
        {"strategies": st.one_of(st.lists(ENTRIES, max_size=4), ENTRY_VALUES)},
        optional={"version": ENTRY_VALUES, "extra": ENTRY_VALUES},
    ),
    ENTRY_VALUES,
)


@fuzz()
@given(document=DOCUMENTS)
def test_any_decoded_policy_document_gives_a_policy_or_a_policy_error(document: object) -> None:
    _policy_or_error(lambda: policy_from_data(document, registry=BUILTIN_REGISTRY))


def _as_json(document: object) -> str:
    try:
        return json.dumps(document)
    except ValueError:  # a float that JSON has no literal for is fine to leave out here
        return "{}"


POLICY_TEXT = st.one_of(
    st.text(max_size=200),
    DOCUMENTS.map(_as_json),
    st.sampled_from(
        [
            "[" * 50_000,
            "- " * 3_000 + "x",
            "{a: " * 2_000,
            "a: &a [x]\nb: [*a, *a, *a]",
            "a: !!python/object:os.system x",
            "a: !!binary zz",
            "a: 2001-13-45",
            "strategies: [{name: age, weight: " + "1" * 5000 + "}]",
            '{"strategies": [{"name": "age", "args": {"saturation_seconds": 1' + "0" * 400 + "}}]}",
        ]
    ),
)


@fuzz()
@given(text=POLICY_TEXT, fmt=st.sampled_from(["yaml", "json"]))
def test_any_policy_text_gives_a_policy_or_a_policy_error(text: str, fmt: str) -> None:
    _policy_or_error(
        lambda: policy_from_text(text, fmt=fmt, registry=BUILTIN_REGISTRY)  # type: ignore[arg-type]
    )


@fuzz(share=0.5)
@given(
    content=st.one_of(
        st.binary(max_size=200), POLICY_TEXT.map(lambda text: text.encode("utf-8", "surrogatepass"))
    ),
    suffix=st.sampled_from([".yaml", ".json", ".yml", ""]),
)
def test_any_policy_file_gives_a_policy_or_a_policy_error(
    tmp_path_factory: pytest.TempPathFactory, content: bytes, suffix: str
) -> None:
    path = tmp_path_factory.mktemp("policy") / f"policy{suffix}"
    path.write_bytes(content)
    _policy_or_error(lambda: load_policy_file(path, registry=BUILTIN_REGISTRY))


# Every case the fuzzing found, kept as a table (the fixes are in podcost_core.policy and
# podcost_core.strategies.base).
FOUND_TEXT = [
    pytest.param("[" * 50_000, "json", "nested too deeply", id="deep JSON (RecursionError)"),
    pytest.param("- " * 3_000 + "x", "yaml", "nested too deeply", id="deep YAML (RecursionError)"),
    pytest.param(
        '{"strategies": [{"name": "age", "args": {"saturation_seconds": 1' + "0" * 400 + "}}]}",
        "json",
        "expected a finite number",
        id="a float arg of 10**400 (float() raised OverflowError)",
    ),
]


@pytest.mark.parametrize(("text", "fmt", "reason"), FOUND_TEXT)
def test_a_policy_text_that_crashed_the_parser_gives_a_policy_error(
    text: str, fmt: str, reason: str
) -> None:
    with pytest.raises(PolicyError, match=reason):
        policy_from_text(text, fmt=fmt, registry=BUILTIN_REGISTRY)  # type: ignore[arg-type]


def test_a_policy_file_that_is_not_utf8_gives_a_policy_error(tmp_path: Path) -> None:
    # read_text raised UnicodeDecodeError, which load_policy_file did not catch.
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"\xff\xfe strategies: []")
    with pytest.raises(PolicyError, match="is not UTF-8 text"):
        load_policy_file(path)
