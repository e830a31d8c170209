"""The crash tests' judgement rules (``tests/support/twin.py``): what counts as a rewound cost,
which decision a pod's cost is the newest of, and that a seed always gives the same scenario."""

from __future__ import annotations

import pytest
from tests.support.twin import Decision, newest_costs, percentile, rewinds, scenario

D1 = Decision((9.0, 1, True, 10.0), {"p": 5, "q": 1}, 10.0)
D2 = Decision((10.0, 2, True, 11.0), {"p": 7, "q": 1}, 11.0)
D3 = Decision((11.0, 3, True, 12.0), {"p": 9}, 12.0)


@pytest.mark.parametrize(
    ("observed", "rewound"),
    [
        pytest.param([None, 5, 7, 9], [], id="forward-through-every-decision"),
        pytest.param([None, 9], [], id="straight-to-the-newest"),
        pytest.param([5, 9, 7], [(9, 7)], id="back-to-an-older-decision"),
        pytest.param([7, 5, 9], [(7, 5)], id="a-replayed-tail-rewinds-then-catches-up"),
        pytest.param([5, 5, 9], [], id="the-same-value-twice"),
        pytest.param([5, 42], [(42, 42)], id="a-value-no-decision-desired"),
        pytest.param([9], [(9, 9)], id="read-before-any-decision-desired-it"),
    ],
)
def test_a_cost_is_rewound_when_it_goes_back_to_an_older_decisions_value(
    observed: list[int | None], rewound: list[tuple[int, int]]
) -> None:
    # Read at 12.5, 13.5 ...: every decision is out by then, except for the read at 11.5.
    at = [12.5 + i for i in range(len(observed))]
    if observed == [9]:
        at = [11.5]
    found = rewinds([D3, D1, D2], {"p": list(zip(at, observed, strict=True))})
    assert [(r.earlier, r.later) for r in found] == rewound


def test_a_value_a_newer_decision_desires_again_is_not_a_rewind() -> None:
    again = Decision((12.0, 4, True, 13.0), {"p": 5}, 13.0)
    # 5 read at 10.5 (from D1), 9 at 12.5 (D3), 5 again at 13.5 (the newer decision's).
    assert rewinds([D1, D2, D3, again], {"p": [(10.5, 5), (12.5, 9), (13.5, 5)]}) == []


def test_each_pods_cost_is_the_newest_decision_that_names_it() -> None:
    assert newest_costs([D3, D2, D1]) == {"p": 9, "q": 1}


def test_a_seed_always_gives_the_same_scenario_and_visits_the_victims_in_turn() -> None:
    victims = ("w", "x", "y", "z")
    assert scenario(5, victims) == scenario(5, victims)
    assert [scenario(seed, victims).fault.victim for seed in range(4)] == list(victims)
    for seed in range(50):
        plan = scenario(seed, victims)
        kinds = [step.kind for step in plan.steps]
        first_in = kinds.index("scale-in")
        assert set(kinds[first_in:]) == {"scale-in"}, "scale-ins come last"
        assert -1 <= plan.fault.at < len(plan.steps)


def test_the_percentile_is_by_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([1.0, 9.0], 1.0) == 9.0
    assert percentile([], 0.5) == 0.0
