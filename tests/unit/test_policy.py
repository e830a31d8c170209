"""Policies: validation, the annotation syntax, lablabs aliases and policy files; every error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podcost_core.policy import (
    DEFAULT_POLICY,
    LABLABS_ENABLED,
    LABLABS_SPREAD_BY,
    LABLABS_TYPE,
    SPREAD_BY,
    STRATEGIES,
    Policy,
    PolicyError,
    StrategySpec,
    format_strategies,
    is_opted_in,
    load_policy_file,
    parse_args,
    parse_strategies,
    policy_from_annotations,
    policy_from_data,
    policy_from_text,
)
from podcost_core.strategies import age, topology_spread, untolerated_taints
from podcost_core.strategies.registry import BUILTIN_REGISTRY, build_registry

S = StrategySpec


def names_weights_tiers(policy: Policy) -> list[tuple[str, int, int]]:
    return [(spec.name, spec.weight, spec.tier) for spec in policy.specs]


# --- validation ---------------------------------------------------------------------------------


def test_a_policy_binds_each_strategy_to_built_args_and_orders_its_tiers() -> None:
    policy = Policy(
        (S("age", 2, tier=5, args={"direction": "older-first"}), S("topology-spread", tier=1)),
        BUILTIN_REGISTRY,
    )
    assert policy.tiers == (1, 5)
    assert [bound.tier_index for bound in policy.bound] == [1, 0]
    assert policy.bound[0].args == age.Args(direction="older-first")
    assert policy.bound[1].args == topology_spread.Args()
    assert policy.names == ("age", "topology-spread")
    assert policy.spec("age") == policy.specs[0]
    assert policy.spec("capacity-type") is None
    assert policy.tier_spans == (101, 201)


@pytest.mark.parametrize(
    ("specs", "culprit", "message"),
    [
        pytest.param((), "policy", "no strategy", id="empty"),
        pytest.param((S("zone"),), "zone", "unknown strategy 'zone'", id="unknown"),
        pytest.param((S("age", 0),), "age", "weight must be an integer >= 1", id="zero weight"),
        pytest.param((S("age", -2),), "age", "weight", id="negative weight"),
        pytest.param((S("age", True),), "age", "weight", id="bool weight"),
        pytest.param((S("age", 1.5),), "age", "weight", id="float weight"),  # type: ignore[arg-type]
        pytest.param((S("age", tier=-1),), "age", "tier must be an integer >= 0", id="tier"),
        pytest.param((S("age", tier="0"),), "age", "tier", id="str tier"),  # type: ignore[arg-type]
        pytest.param((S("age", threshold=0),), "age", "threshold must be a positive", id="zero"),
        pytest.param((S("age", threshold=float("nan")),), "age", "threshold", id="nan"),
        pytest.param((S("age", threshold=True),), "age", "threshold", id="bool threshold"),
        pytest.param(
            (S("topology-spread", threshold=10),), "topology-spread", "spread", id="spread cap"
        ),
        pytest.param((S("age"), S("age", 2)), "age", "more than once", id="duplicate"),
        pytest.param(
            (S("age", args={"direction": "up"}),), "age", "arg 'direction'", id="bad args"
        ),
        pytest.param((S("age", args={"speed": 1}),), "age", "unknown arg", id="unknown arg"),
        pytest.param((S(""),), "''", "non-empty", id="no name"),
    ],
)
def test_an_invalid_policy_is_one_error_naming_the_culprit(
    specs: tuple[StrategySpec, ...], culprit: str, message: str
) -> None:
    with pytest.raises(PolicyError, match=message) as raised:
        Policy(specs, BUILTIN_REGISTRY)
    assert raised.value.culprit == culprit


def test_a_policy_may_name_a_plugin_strategy_when_its_registry_has_it() -> None:
    from importlib.metadata import EntryPoint

    registry = build_registry(
        [EntryPoint("name-length", "tests.unit.plugin_fixture:STRATEGY", "podcost.strategies")]
    )
    policy = Policy((S("name-length", args={"factor": "2"}),), registry)
    assert policy.bound[0].args.factor == 2.0
    with pytest.raises(PolicyError, match="unknown strategy"):
        Policy((S("name-length"),), BUILTIN_REGISTRY)


def test_the_default_policy_puts_topology_spread_alone_on_top_and_weighs_the_rest() -> None:
    assert names_weights_tiers(DEFAULT_POLICY) == [
        ("topology-spread", 1, 0),
        ("priority-qos", 4, 1),
        ("capacity-type", 3, 1),
        ("untolerated-taints", 3, 1),
        ("co-location", 2, 1),
        ("node-consolidation", 1, 1),
        ("age", 1, 1),
    ]
    assert DEFAULT_POLICY.spec("age") == S("age", 1, 1, threshold=age.DAY)


# --- annotation syntax -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("age", [("age", 1, 0)]),
        ("topology-spread=3,capacity-type=1", [("topology-spread", 3, 0), ("capacity-type", 1, 0)]),
        (
            " topology-spread | capacity-type = 3 , age ",
            [("topology-spread", 1, 0), ("capacity-type", 3, 1), ("age", 1, 1)],
        ),
        ("a|b|c=2", [("a", 1, 0), ("b", 1, 1), ("c", 2, 2)]),
    ],
)
def test_the_strategies_annotation_gives_names_weights_and_tiers(
    text: str, expected: list[tuple[str, int, int]]
) -> None:
    assert [(s.name, s.weight, s.tier) for s in parse_strategies(text)] == expected


@pytest.mark.parametrize(
    ("text", "culprit", "message"),
    [
        ("", STRATEGIES, "tier 0 is empty"),
        ("age ||capacity-type", STRATEGIES, "tier 1 is empty"),
        ("age,,capacity-type", STRATEGIES, "empty strategy entry"),
        ("=3", STRATEGIES, "empty strategy entry"),
        ("age=heavy", "age", "weight must be an integer"),
        ("age=1.5", "age", "weight must be an integer"),
    ],
)
def test_a_malformed_strategies_annotation_is_an_error_naming_it(
    text: str, culprit: str, message: str
) -> None:
    with pytest.raises(PolicyError, match=message) as raised:
        parse_strategies(text)
    assert raised.value.culprit == culprit


def test_format_strategies_writes_what_parse_strategies_reads() -> None:
    text = format_strategies(DEFAULT_POLICY)
    assert text == (
        "topology-spread | priority-qos=4, capacity-type=3, untolerated-taints=3, "
        "co-location=2, node-consolidation, age"
    )
    parsed = Policy(parse_strategies(text), BUILTIN_REGISTRY)
    assert names_weights_tiers(parsed) == names_weights_tiers(DEFAULT_POLICY)


def test_parse_args_reads_key_value_pairs_and_rejects_the_rest() -> None:
    assert parse_args("a=1, b = x,, c=", culprit="k") == {"a": "1", "b": "x", "c": ""}
    with pytest.raises(PolicyError, match="expected key=value"):
        parse_args("a", culprit="k")
    with pytest.raises(PolicyError, match="given twice"):
        parse_args("a=1,a=2", culprit="k")


def test_without_policy_annotations_a_workload_gets_the_default_policy() -> None:
    assert policy_from_annotations({"podcost.dev/enabled": "true"}) == DEFAULT_POLICY
    assert policy_from_annotations({"unrelated": "x"}) == DEFAULT_POLICY


def test_the_strategies_annotation_replaces_the_default_policy() -> None:
    policy = policy_from_annotations({STRATEGIES: "topology-spread=3,capacity-type=1"})
    assert names_weights_tiers(policy) == [("topology-spread", 3, 0), ("capacity-type", 1, 0)]


def test_spread_by_sets_the_topology_key_of_topology_spread() -> None:
    policy = policy_from_annotations({SPREAD_BY: " topology.kubernetes.io/rack "})
    assert policy.bound[0].args == topology_spread.Args("topology.kubernetes.io/rack")
    assert names_weights_tiers(policy) == names_weights_tiers(DEFAULT_POLICY)


def test_args_and_threshold_annotations_reach_their_strategy() -> None:
    policy = policy_from_annotations(
        {
            STRATEGIES: "untolerated-taints | age=2",
            "podcost.dev/args.untolerated-taints": "effects=PreferNoSchedule;NoSchedule",
            "podcost.dev/args.age": "direction=older-first, saturation_seconds=60",
            "podcost.dev/threshold.age": "60",
        }
    )
    taints, ages = policy.bound
    assert taints.args == untolerated_taints.Args(effects=("PreferNoSchedule", "NoSchedule"))
    assert ages.args == age.Args(direction="older-first", saturation_seconds=60.0)
    assert ages.spec.threshold == 60.0


@pytest.mark.parametrize(
    ("annotations", "culprit", "message"),
    [
        pytest.param({STRATEGIES: "zone"}, "zone", "unknown strategy", id="unknown"),
        pytest.param({STRATEGIES: "age=0"}, "age", "weight", id="zero weight"),
        pytest.param({STRATEGIES: "age, age"}, "age", "more than once", id="twice"),
        pytest.param(
            {STRATEGIES: "age", SPREAD_BY: "rack"}, SPREAD_BY, "not in the policy", id="spread-by"
        ),
        pytest.param(
            {SPREAD_BY: "rack", "podcost.dev/args.topology-spread": "topology_key=zone"},
            "podcost.dev/args.topology-spread",
            "also set by",
            id="two topology keys",
        ),
        pytest.param(
            {STRATEGIES: "age", "podcost.dev/args.co-location": "x=1"},
            "podcost.dev/args.co-location",
            "not in the policy",
            id="args for an absent strategy",
        ),
        pytest.param(
            {"podcost.dev/args.age": "direction=up"}, "age", "arg 'direction'", id="bad arg"
        ),
        pytest.param(
            {"podcost.dev/args.age": "direction"},
            "podcost.dev/args.age",
            "key=value",
            id="not a pair",
        ),
        pytest.param(
            {"podcost.dev/threshold.age": "high"},
            "podcost.dev/threshold.age",
            "must be a number",
            id="threshold text",
        ),
        pytest.param(
            {"podcost.dev/threshold.age": "-5"}, "age", "must be a positive", id="negative"
        ),
        pytest.param({SPREAD_BY: "not a label"}, "topology-spread", "label", id="bad label"),
        pytest.param({LABLABS_TYPE: "rack"}, LABLABS_TYPE, "unknown type 'rack'", id="lablabs"),
    ],
)
def test_bad_policy_annotations_are_one_error_naming_the_culprit(
    annotations: dict[str, str], culprit: str, message: str
) -> None:
    with pytest.raises(PolicyError, match=message) as raised:
        policy_from_annotations(annotations)
    assert raised.value.culprit == culprit


def test_lablabs_zone_type_and_spread_by_give_the_zone_spread_policy() -> None:
    policy = policy_from_annotations(
        {LABLABS_ENABLED: "true", LABLABS_TYPE: "zone", LABLABS_SPREAD_BY: "topology.io/rack"}
    )
    assert names_weights_tiers(policy) == names_weights_tiers(DEFAULT_POLICY)
    assert policy.bound[0].args == topology_spread.Args("topology.io/rack")


def test_a_lablabs_type_may_name_a_podcost_strategy_which_then_leads() -> None:
    policy = policy_from_annotations({LABLABS_TYPE: "capacity-type"})
    assert names_weights_tiers(policy) == [
        ("capacity-type", 1, 0),
        ("priority-qos", 4, 1),
        ("untolerated-taints", 3, 1),
        ("co-location", 2, 1),
        ("node-consolidation", 1, 1),
        ("age", 1, 1),
    ]


def test_podcost_annotations_win_over_lablabs_ones() -> None:
    policy = policy_from_annotations(
        {
            STRATEGIES: "topology-spread",
            LABLABS_TYPE: "capacity-type",
            SPREAD_BY: "podcost-key",
            LABLABS_SPREAD_BY: "lablabs-key",
        }
    )
    assert names_weights_tiers(policy) == [("topology-spread", 1, 0)]
    assert policy.bound[0].args == topology_spread.Args("podcost-key")


def test_policies_from_annotations_are_cached_by_their_podcost_annotations() -> None:
    first = policy_from_annotations({STRATEGIES: "age", "app": "a"})
    assert policy_from_annotations({"app": "b", STRATEGIES: "age"}) is first


@pytest.mark.parametrize(
    ("annotations", "opted_in"),
    [
        ({"podcost.dev/enabled": "true"}, True),
        ({"podcost.dev/enabled": " True "}, True),
        ({LABLABS_ENABLED: "true"}, True),
        ({"podcost.dev/enabled": "false", LABLABS_ENABLED: "true"}, True),
        ({"podcost.dev/enabled": "yes"}, False),
        ({}, False),
    ],
)
def test_a_workload_opts_in_with_either_enabled_annotation(
    annotations: dict[str, str], opted_in: bool
) -> None:
    assert is_opted_in(annotations) is opted_in


# --- policy files ----------------------------------------------------------------------------

YAML = """
version: 1
strategies:
  - {name: topology-spread}
  - name: capacity-type
    tier: 1
    weight: 3
    args: {price_annotation: acme.io/price, known_labels: false}
  - {name: age, tier: 1, threshold: 3600, args: {saturation_seconds: 3600}}
"""


def test_a_yaml_policy_file_gives_the_same_policy_as_its_json_twin(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(YAML)
    import yaml

    (tmp_path / "policy.json").write_text(json.dumps(yaml.safe_load(YAML)))
    from_yaml = load_policy_file(tmp_path / "policy.yaml")
    from_json = load_policy_file(tmp_path / "policy.json")
    assert from_yaml == from_json
    assert names_weights_tiers(from_yaml) == [
        ("topology-spread", 1, 0),
        ("capacity-type", 3, 1),
        ("age", 1, 1),
    ]
    assert from_yaml.bound[1].args.price_annotation == "acme.io/price"
    assert from_yaml.bound[1].args.known_labels is False
    assert from_yaml.spec("age") == S("age", 1, 1, {"saturation_seconds": 3600}, 3600.0)


def test_non_negative_costs_is_read_from_the_file_and_kept_by_workloads_own_policies() -> None:
    data = {"version": 1, "strategies": [{"name": "karpenter"}], "non_negative_costs": True}
    default = policy_from_data(data)
    assert default.non_negative_costs
    assert not policy_from_data({**data, "non_negative_costs": False}).non_negative_costs
    own = policy_from_annotations({STRATEGIES: "node-consolidation"}, default=default)
    assert own.non_negative_costs
    assert own.names == ("node-consolidation",)
    assert not policy_from_annotations({STRATEGIES: "node-consolidation"}).non_negative_costs
    with pytest.raises(PolicyError, match="non_negative_costs"):
        policy_from_data({**data, "non_negative_costs": "yes"})


@pytest.mark.parametrize(
    ("data", "culprit", "message"),
    [
        pytest.param({"strategies": []}, "test: strategies", "at least 1", id="empty"),
        pytest.param({}, "test: strategies", "required", id="missing"),
        pytest.param(
            {"version": 2, "strategies": [{"name": "age"}]}, "test: version", "1", id="version"
        ),
        pytest.param(
            {"strategies": [{"name": "age", "colour": "red"}]},
            "test: strategies.0.colour",
            "Extra inputs",
            id="extra field",
        ),
        pytest.param(
            {"strategies": [{"name": "age", "weight": "2"}]},
            "test: strategies.0.weight",
            "integer",
            id="weight as text",
        ),
        pytest.param(
            {"strategies": [{"name": "age", "weight": 0}]}, "age", "weight", id="zero weight"
        ),
        pytest.param({"strategies": [{"name": "zone"}]}, "zone", "unknown", id="unknown"),
        pytest.param(
            {"strategies": [{"name": "age", "args": {"direction": 3}}]},
            "age",
            "expected a string",
            id="bad arg",
        ),
        pytest.param(["age"], "test", "valid dictionary", id="not a mapping"),
    ],
)
def test_a_bad_policy_file_is_one_error_naming_the_entry(
    data: object, culprit: str, message: str
) -> None:
    with pytest.raises(PolicyError, match=message) as raised:
        policy_from_data(data, source="test")
    assert raised.value.culprit == culprit


@pytest.mark.parametrize(
    ("text", "fmt"), [("{not json", "json"), ("a: [b", "yaml"), ("- {", "yaml")]
)
def test_a_policy_text_that_does_not_parse_is_an_error_naming_its_format(
    text: str, fmt: str
) -> None:
    with pytest.raises(PolicyError, match=f"not valid {fmt.upper()}"):
        policy_from_text(text, fmt=fmt, source="p")  # type: ignore[arg-type]


def test_a_missing_policy_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot be read") as raised:
        load_policy_file(tmp_path / "absent.yaml")
    assert raised.value.culprit.endswith("absent.yaml")
