"""The aggregator's costs JSON (``desired_costs_json``), assembled from fragments, is byte for byte
the message's own dump, whatever text and floats it carries."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic_core import to_json
from tests.support.decisions import complete_decision
from tests.support.snapshots import snapshot as deployment

from podcost.aggregator.processor import _plain, desired_costs, desired_costs_json
from podcost_contracts.messages import EncodeError
from podcost_core.aggregate import Decision
from podcost_core.labels import CurrentCost
from podcost_core.model import Phase

#: Text JSON escapes or that a template would read: quotes, backslashes, control characters,
#: percent signs, non-ASCII, and what separates the fragments.
ODD = ['a"b', "back\\slash", "tab\tnew\nline", "%s%d%%", 'x},{"namespace":"y', "\x00\x1f", "ü€😀"]
#: Floats whose JSON format differs between writers (exponents, signed zero, long fractions).
FLOATS = [0.0, -0.0, 1e-7, 1e-5, 1e16, 1e22, 1.5e300, 123456789.123, 2.0**53, 0.1, 1 / 3]


def decide(pods: int = 7, *, active: bool = True) -> Decision:
    """A complete decision of the default policy (a spread strategy too) for one Deployment."""
    snapshot = replace(
        deployment("web", pods=pods, nodes=3), annotations={"podcost.dev/enabled": "true"}
    )
    if not active:
        snapshot = replace(
            snapshot, pods=tuple(replace(p, phase=Phase.SUCCEEDED) for p in snapshot.pods)
        )
    return complete_decision(snapshot)


def odd(decision: Decision) -> Decision:
    """``decision`` with odd pod names and namespaces, and odd raw scores."""
    pods = tuple(
        replace(pod, namespace=ODD[index % len(ODD)], name=ODD[(index + 3) % len(ODD)] + pod.name)
        for index, pod in enumerate(decision.snapshot.pods)
    )
    raw = {
        name: [FLOATS[(index + offset) % len(FLOATS)] for index in range(len(values))]
        for offset, (name, values) in enumerate(decision.combined.raw.items())
    }
    return replace(decision, snapshot=replace(decision.snapshot, pods=pods),
                   combined=replace(decision.combined, raw=raw), changed_at=1e-9)  # fmt: skip


#: Printable ASCII JSON writes as it is, template characters and separators included.
PLAIN = ["a%sb%d%%", "x},{y:", "[1,2]", "it's", "~`!@#$^&*()_+=|;<>?/"]


def renamed(decision: Decision, names: list[str], *, only: int | None = None) -> Decision:
    """``decision`` with its pods named from ``names`` (every pod, or only pod ``only``)."""
    pods = tuple(
        replace(pod, name=names[index % len(names)] + pod.name)
        if only is None or index == only
        else pod
        for index, pod in enumerate(decision.snapshot.pods)
    )
    return replace(decision, snapshot=replace(decision.snapshot, pods=pods))


def without_previous(decision: Decision) -> Decision:
    """``decision`` where one pod's cost is invalid (no previous) and another is not known."""
    current = dict(decision.current)
    current[decision.combined.uids[1]] = CurrentCost(None)
    del current[decision.combined.uids[2]]
    return replace(decision, current=current)


@pytest.mark.parametrize(
    "decision",
    [
        decide(),
        odd(decide()),
        decide(1),
        decide(3, active=False),
        renamed(decide(), PLAIN),
        renamed(decide(), ['q"uote'], only=4),
        renamed(decide(), ["del\x7f"], only=0),
        renamed(decide(), ["ü"], only=6),
        without_previous(decide()),
        without_previous(odd(decide())),
    ],
    ids=["plain", "odd", "one-pod", "no-pod-ranked", "punctuation", "one-quote", "one-del",
         "one-non-ascii", "no-previous", "odd-no-previous"],
)  # fmt: skip
@pytest.mark.parametrize("emitted_at", [1.0, 1_732_000_000.123456, 0])
def test_the_assembled_json_is_the_message_s_own_dump(
    decision: Decision, emitted_at: float
) -> None:
    expected = desired_costs(decision, emitted_at=emitted_at).model_dump_json().encode()
    assert desired_costs_json(decision, emitted_at=emitted_at) == expected


def test_text_that_is_not_unicode_cannot_be_encoded() -> None:
    decision = decide()
    pods = tuple(replace(pod, name="x\udfff") for pod in decision.snapshot.pods)
    with pytest.raises(EncodeError):
        desired_costs_json(
            replace(decision, snapshot=replace(decision.snapshot, pods=pods)), emitted_at=1.0
        )


def test_plain_text_is_printable_ascii_that_json_writes_as_it_is() -> None:
    for code in range(0x80):
        text = f"a{chr(code)}b"
        plain = _plain(text)
        assert plain == (0x20 <= code < 0x7F and chr(code) not in '"\\'), code
        assert not plain or to_json(text) == f'"{text}"'.encode(), code
    assert _plain("")
    assert not _plain("ü")  # written as it is too, but left to pydantic, as DEL is
