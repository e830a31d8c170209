"""The compatibility promise of ``docs/guides/compatibility.md``, held by the message contracts.

- Every kind as the previous release (``tests/previous-release.toml``) encodes it is read by this
  one, through the reader its consumers use (``tests/unit/data/contracts/previous.json``, written
  by ``python -m tests.support.previous fixtures`` with the previous release's own code).
- This release encodes every kind exactly as ``current.json`` says, which the same command
  checked the previous release reads: a change of the encoding fails here until the fixtures
  are written again, and writing them proves the previous release still reads it.
- A newer producer's additive fields, at every level of every kind, are ignored.
- A newer schema version, in the header or in the payload, and a kind the reader does not know,
  are refused with a reason that says so (the consumer dead-letters the record with it).
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import pytest
from tests.support import contract_samples
from tests.support.previous import FIXTURES, pinned_commit

from podcost_contracts.messages import (
    SCHEMA_HEADER,
    DecodeError,
    DesiredCostsMessage,
    StrategyRanksMessage,
    WorkloadSnapshotMessage,
    decode_workload_record,
)
from podcost_core.aggregate import DECISION_UNREAD

INPUTS: dict[str, Any] = json.loads((FIXTURES / "inputs.json").read_text())
PREVIOUS: dict[str, Any] = json.loads((FIXTURES / "previous.json").read_text())
CURRENT: dict[str, Any] = json.loads((FIXTURES / "current.json").read_text())
KINDS = sorted(contract_samples.KINDS)
REGENERATE = "python -m tests.support.previous fixtures"
#: The field a newer producer adds, at every level.
NEWER = "added_by_a_newer_release"
#: The kinds whose samples hold models inside the message.
NESTED = ("workload-snapshot", "strategy-ranks-batch", "desired-costs", "release-costs")


def _expected(kind: str) -> Any:
    return contract_samples.KINDS[kind].model_validate(INPUTS[kind])


def test_the_fixtures_cover_every_kind_and_are_of_the_pinned_previous_release() -> None:
    assert sorted(INPUTS) == KINDS
    assert sorted(set(PREVIOUS) - {"commit"}) == KINDS
    assert PREVIOUS["commit"] == pinned_commit(), (
        f"tests/previous-release.toml moved: regenerate the fixtures ({REGENERATE})"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_as_the_previous_release_encodes_it_is_read_by_this_one(kind: str) -> None:
    assert contract_samples.read(kind, PREVIOUS[kind]) == _expected(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_this_release_encodes_every_kind_as_the_previous_release_was_shown_to_read(
    kind: str,
) -> None:
    current = contract_samples.encode_all({kind: INPUTS[kind]})[kind]
    assert current == CURRENT[kind], (
        f"the {kind} encoding changed: check that the change is additive "
        f"(docs/guides/compatibility.md) and regenerate the fixtures ({REGENERATE}), which "
        "checks that the previous release reads it"
    )


# --- a newer producer's additive fields ---------------------------------------------------


@functools.cache
def _schema(kind: str) -> dict[str, Any]:
    """The JSON schema of ``kind``'s model (pydantic builds it anew on every call)."""
    return contract_samples.KINDS[kind].model_json_schema()


def _with_newer_fields(value: Any, schema: dict[str, Any], defs: dict[str, Any]) -> int:
    """Add :data:`NEWER` to every object of ``value`` that is a model (not a mapping such as
    scores or labels), following the JSON schema of the message; how many it added to."""
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:  # an optional field: the branch of the value's JSON type
        for branch in schema["anyOf"]:
            target = branch
            while "$ref" in target:
                target = defs[target["$ref"].rsplit("/", 1)[1]]
            if (target.get("type") == "object") == isinstance(value, dict) and (
                target.get("type") == "array"
            ) == isinstance(value, list):
                return _with_newer_fields(value, branch, defs)
        return 0
    added = 0
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name in value:
                added += _with_newer_fields(value[name], sub, defs)
        value[NEWER] = {"nested": [1, "two", None]}
        added += 1
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for item in value.values():
            added += _with_newer_fields(item, schema["additionalProperties"], defs)
    elif isinstance(value, list):
        items = schema.get("prefixItems") or [schema.get("items", {})] * len(value)
        for item, sub in zip(value, items, strict=False):
            added += _with_newer_fields(item, sub, defs)
    return added


@pytest.mark.parametrize("kind", KINDS)
def test_fields_a_newer_release_adds_at_any_level_are_ignored(kind: str) -> None:
    schema = _schema(kind)
    record = copy.deepcopy(CURRENT[kind])
    payload = json.loads(record["value"])
    added = _with_newer_fields(payload, schema, schema.get("$defs", {}))
    # Every model of the sample got one (the snapshot's pods, nodes, replica sets; a decision's
    # pods and their terms; ...), not just the top.
    assert added >= (2 if kind in NESTED else 1), added
    record["value"] = json.dumps(payload)
    assert contract_samples.read(kind, record) == _expected(kind)


def test_the_aggregator_s_partial_read_of_a_snapshot_ignores_newer_fields_too() -> None:
    kind = WorkloadSnapshotMessage.KIND
    schema = _schema(kind)
    payload = json.loads(CURRENT[kind]["value"])
    _with_newer_fields(payload, schema, schema["$defs"])
    headers = {k: v.encode() for k, v in CURRENT[kind]["headers"].items()}
    whole = decode_workload_record(json.dumps(payload).encode(), headers, unread=DECISION_UNREAD)
    assert whole.snapshot.workload == _expected(kind).snapshot.workload
    assert [p.uid for p in whole.snapshot.pods] == [p.uid for p in _expected(kind).snapshot.pods]


# --- what this release refuses -------------------------------------------------------------


def _refused(kind: str, record: dict[str, Any]) -> str:
    with pytest.raises(DecodeError) as raised:
        contract_samples.read(kind, record)
    return raised.value.reason


@pytest.mark.parametrize("kind", KINDS)
def test_a_newer_schema_version_is_refused_with_a_reason_that_names_it(kind: str) -> None:
    newer = copy.deepcopy(CURRENT[kind])
    newer["headers"][SCHEMA_HEADER] = f"{kind}/2"
    payload = json.loads(newer["value"])
    payload["schema_version"] = 2
    newer["value"] = json.dumps(payload)
    expected = f"unsupported schema version 2 for {kind} (supported: 1)"
    assert _refused(kind, newer) == expected
    # Without the header (a producer that sets none), the payload's own version is refused: the
    # record is read as its topic's first kind, which the reason names.
    del newer["headers"][SCHEMA_HEADER]
    assert _refused(kind, newer).startswith("unsupported schema version 2 for ")


@pytest.mark.parametrize(
    ("kind", "topic"),
    [(WorkloadSnapshotMessage.KIND, "workloads"), (StrategyRanksMessage.KIND, "ranks"),
     (DesiredCostsMessage.KIND, "costs")],
)  # fmt: skip
def test_a_kind_this_release_does_not_know_is_refused_on_every_topic(kind: str, topic: str) -> None:
    unknown = copy.deepcopy(CURRENT[kind])
    unknown["headers"][SCHEMA_HEADER] = "workload-forecast/1"
    reason = _refused(kind, unknown)
    assert "workload-forecast/1" in reason, (topic, reason)
