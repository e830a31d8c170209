"""Fuzzing the boundary with raw Kubernetes JSON, and the deletion-cost parser.

Raw pods, nodes and dumps with one part of a valid object changed (a huge or odd number, a huge
string, a wrong type, NaN, deep nesting, a removed or doubled part) convert or raise a
``ConversionError``, never another exception; what converts also travels on the bus as a
snapshot. Any deletion-cost string gives the documented answer (``deletion_cost_error``: the
reason it is invalid, or ``None``), agreeing with ``strconv.ParseInt(value, 10, 32)`` computed
here without ``int()``. Quantities and timestamps of any text parse or raise
``ConversionError``. Case counts: ``tests/support/fuzz.py``.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.fuzz import fuzz, mutated_json

from podcost_contracts.messages import EncodeError, WorkloadSnapshotMessage, decode, encode
from podcost_core import quantities
from podcost_core.kubejson import ConversionError, parse_time
from podcost_core.model import DELETION_COST_ANNOTATION, FIELD_MANAGER
from podcost_core.quantities import parse_quantity
from podcost_core.snapshots import load_objects, snapshot_for_workload
from podcost_core.tomodel import node_from_json, pod_from_json
from podcost_core.victims import INT32_MAX, INT32_MIN, deletion_cost_error, parse_deletion_cost

DUMP: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "shop-dump.json").read_text(encoding="utf-8")
)
ITEMS: list[dict[str, Any]] = DUMP["items"]
POD = next(item for item in ITEMS if item["kind"] == "Pod")
NODE = next(item for item in ITEMS if item["kind"] == "Node")
#: A pod with every part the converter reads, so that mutations reach each of them.
FULL_POD: dict[str, Any] = {
    **POD,
    "metadata": {
        **POD["metadata"],
        "annotations": {DELETION_COST_ANNOTATION: "-7"},
        "deletionTimestamp": None,
        "managedFields": [
            {
                "manager": FIELD_MANAGER,
                "operation": "Apply",
                "time": "2024-05-01T12:00:00Z",
                "fieldsV1": {
                    "f:metadata": {"f:annotations": {f"f:{DELETION_COST_ANNOTATION}": {}}}
                },
            }
        ],
    },
    "spec": {
        **POD["spec"],
        "priority": 100,
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        "initContainers": [
            {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}}
        ],
        "overhead": {"cpu": "10m"},
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "zone"}
                ],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "podAffinityTerm": {
                            "labelSelector": {
                                "matchExpressions": [
                                    {"key": "app", "operator": "In", "values": ["web"]}
                                ]
                            },
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ],
            }
        },
    },
    "status": {
        **POD.get("status", {}),
        "containerStatuses": [{"name": "app", "restartCount": 2}],
        "initContainerStatuses": [{"name": "side", "restartCount": 1}],
    },
}


def _converted_or_refused(convert: Any) -> Any:
    """What ``convert()`` returns, or ``None`` if it raised ``ConversionError`` (with a reason);
    any other exception fails the test."""
    try:
        return convert()
    except ConversionError as error:
        refused = error
    assert str(refused)
    return None


@fuzz()
@given(raw=mutated_json(FULL_POD))
def test_any_raw_pod_converts_or_is_a_conversion_error(raw: Any) -> None:
    _converted_or_refused(lambda: pod_from_json(raw))


@fuzz(share=0.5)
@given(raw=mutated_json(NODE))
def test_any_raw_node_converts_or_is_a_conversion_error(raw: Any) -> None:
    _converted_or_refused(lambda: node_from_json(raw))


@fuzz()
@given(data=st.data())
def test_any_dump_gives_a_snapshot_that_travels_or_a_conversion_error(data: st.DataObject) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(ITEMS) - 1))
    item = data.draw(mutated_json(ITEMS[index]))
    dump = {**DUMP, "items": [*ITEMS[:index], item, *ITEMS[index + 1 :]]}
    snapshot = _converted_or_refused(
        lambda: snapshot_for_workload(load_objects(dump), "shop", "web")
    )
    if snapshot is None:
        return
    # What the watcher publishes of it, every consumer reads back.
    message = WorkloadSnapshotMessage.of(snapshot, emitted_at=1.0)
    try:
        encoded = encode(message)
    except EncodeError:  # text that is not Unicode (a lone surrogate): the watcher skips it
        return
    assert decode(WorkloadSnapshotMessage, encoded.value, encoded.headers) == message


QUANTITY_TEXT = st.one_of(
    st.text(max_size=20),
    st.from_regex(
        r"[+-]?[0-9]{0,30}(\.[0-9]{0,30})?([eE][+-]?[0-9]{1,12}|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?",
        fullmatch=True,
    ),
    st.sampled_from(["1" * 5000, "0" * 5000 + "1", "1e99999999", "1E-99999999", "." + "0" * 5000]),
)


@fuzz(share=0.5)
@given(text=st.one_of(QUANTITY_TEXT, st.integers(), st.floats()))
def test_any_quantity_parses_or_is_a_conversion_error(text: str | int | float) -> None:
    value = _converted_or_refused(lambda: parse_quantity(text))
    assert value is None or isinstance(value, Fraction)


@fuzz(share=0.5)
@given(
    text=st.one_of(
        st.none(),
        st.text(max_size=40),
        st.datetimes().map(lambda moment: moment.isoformat()),
        st.builds(
            lambda moment, offset: moment.isoformat() + offset,
            st.datetimes(),
            st.sampled_from(["Z", "+14:00", "-14:00", "+23:59", "-00:01"]),
        ),
    )
)
def test_any_timestamp_parses_or_is_a_conversion_error(text: str | None) -> None:
    _converted_or_refused(lambda: parse_time(text))


def _parse_int32_like_go(value: str) -> str | None:
    """``GetDeletionCostFromPodAnnotations`` written apart from the code under test: the first
    character rule, then ``strconv.ParseInt(value, 10, 32)`` by ``Decimal`` (no digit limit)."""
    if not value:
        return "empty"
    if not (value[0] == "-" or value == "0" or "1" <= value[0] <= "9"):
        return "invalid value"
    if re.fullmatch(r"-?[0-9]+", value, flags=re.ASCII) is None:
        return "invalid syntax"
    if not INT32_MIN <= Decimal(value) <= INT32_MAX:
        return "value out of int32 range"
    return None


COST_TEXT = st.one_of(
    st.text(max_size=16),
    st.from_regex(r"-?0{0,5000}[0-9]{0,12}", fullmatch=True),
    st.integers().map(str),
    st.sampled_from(["1" * 5000, "-" + "1" * 5000, "-" + "0" * 5000 + "7", "9" * 4301]),
)


@fuzz()
@given(value=COST_TEXT)
def test_any_deletion_cost_string_is_read_as_the_controller_reads_it(value: str) -> None:
    expected = _parse_int32_like_go(value)
    problem = deletion_cost_error(value)
    assert (problem is None) == (expected is None)
    if problem is not None:
        assert problem.startswith(expected or "")
        assert parse_deletion_cost(value) == 0
    else:
        assert parse_deletion_cost(value) == Decimal(value)


# Every case the fuzzing found, kept as a table (the fixes are in podcost_core.quantities,
# podcost_core.kubejson and podcost_core.victims).
FOUND_COSTS = [
    pytest.param("1" * 5000, "value out of int32 range", id="5000 digits (int() raised)"),
    pytest.param("-" + "1" * 5000, "value out of int32 range", id="-5000 digits"),
    pytest.param("-" + "0" * 5000 + "7", None, id="-7 after 5000 zeros (ParseInt reads -7)"),
]


@pytest.mark.parametrize(("value", "problem"), FOUND_COSTS)
def test_a_deletion_cost_that_crashed_the_parser_gets_the_documented_answer(
    value: str, problem: str | None
) -> None:
    found = deletion_cost_error(value)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(problem)
    assert parse_deletion_cost(value) == (-7 if problem is None else 0)


FOUND_QUANTITIES = [
    pytest.param("1" * 5000, id="5000 digits (int() raised ValueError)"),
    pytest.param("1e99999999", id="huge exponent (10**exponent took minutes)"),
    pytest.param("1E-99999999", id="huge negative exponent"),
    pytest.param("1e" + "9" * 5000, id="5000-digit exponent (int() raised ValueError)"),
]


@pytest.mark.parametrize("text", FOUND_QUANTITIES)
def test_a_quantity_that_crashed_the_parser_is_a_conversion_error(text: str) -> None:
    with pytest.raises(ConversionError, match="is out of range"):
        parse_quantity(text)


def test_a_quantity_padded_with_zeros_reads_as_its_value() -> None:
    assert parse_quantity("0" * 5000 + "1.5" + "0" * 5000 + "Ki") == Fraction(1536)
    assert parse_quantity("2Ei") == 2 * 2**60  # a binary suffix, not an exponent


def test_only_short_quantity_strings_are_kept_parsed() -> None:
    # Parsed quantities are cached per string; a long one (hand-made: the API server serves
    # canonical forms) would make the cache hold megabytes, so it is parsed every time.
    padded = "0" * 100_000 + "3"
    kept = quantities._cached_quantity_text.cache_info().currsize
    assert parse_quantity(padded) == 3
    assert quantities._cached_quantity_text.cache_info().currsize == kept
    assert parse_quantity("123m") is parse_quantity("123m")  # short: parsed once, handed out


@pytest.mark.parametrize(
    "text", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"], ids=["min", "max"]
)
def test_a_timestamp_beyond_the_datetime_range_in_utc_is_a_conversion_error(text: str) -> None:
    # astimezone(UTC) raised OverflowError.
    with pytest.raises(ConversionError, match="is out of range"):
        parse_time(text)


def test_a_pod_with_fields_v1_that_are_not_objects_converts() -> None:
    # cost_owner called .get on the int and raised AttributeError.
    raw = {
        **FULL_POD,
        "metadata": {
            **FULL_POD["metadata"],
            "managedFields": [{"manager": FIELD_MANAGER, "fieldsV1": {"f:metadata": 5}}],
        },
    }
    assert pod_from_json(raw).cost_owner.value == "other"


def test_a_pod_with_a_5000_digit_deletion_cost_converts_with_the_cost_invalid() -> None:
    raw = {
        **FULL_POD,
        "metadata": {**FULL_POD["metadata"], "annotations": {DELETION_COST_ANNOTATION: "1" * 5000}},
    }
    pod = pod_from_json(raw)
    assert (pod.deletion_cost, pod.deletion_cost_raw) == (0, "1" * 5000)


@pytest.mark.parametrize(
    "amount", [10**5000, -(10**400), 1e308], ids=["10**5000", "-10**400", "1e308"]
)
def test_a_numeric_quantity_beyond_any_the_api_serves_is_a_conversion_error(
    amount: int | float,
) -> None:
    # A node's allocatable cpu of 10**5000 converted, and the watcher's snapshot of it was one
    # that every consumer refused (JSON parsers stop at 4300 digits).
    with pytest.raises(ConversionError, match="is out of range"):
        parse_quantity(amount)


def test_a_pod_priority_beyond_int64_is_a_conversion_error() -> None:
    raw = {**FULL_POD, "spec": {**FULL_POD["spec"], "priority": 10**30}}
    with pytest.raises(ConversionError, match=r"spec\.priority"):
        pod_from_json(raw)


def test_a_pod_whose_namespace_is_a_huge_number_is_a_conversion_error() -> None:
    # The error message printed the namespace, and str() of a 5000-digit int raised ValueError.
    raw = {**FULL_POD, "metadata": {**FULL_POD["metadata"], "namespace": 10**5000}}
    with pytest.raises(ConversionError, match=r"metadata\.namespace"):
        pod_from_json(raw)
