"""The strategy contract (``Strategy``, ``args_from_mapping``) and the registry with its plugins."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from typing import Any

import pytest
from tests.unit import plugin_fixture

from podcost_core.model import PodUID, Snapshot
from podcost_core.strategies import (
    age,
    capacity_type,
    co_location,
    karpenter,
    node_consolidation,
    priority_qos,
    topology_spread,
    untolerated_taints,
    work_in_progress,
)
from podcost_core.strategies.base import (
    Strategy,
    StrategyArgsError,
    is_label_key,
)
from podcost_core.strategies.registry import (
    BUILTIN,
    BUILTIN_REGISTRY,
    ENTRY_POINT_GROUP,
    PluginError,
    UnknownStrategyError,
    build_registry,
    default_registry,
    get_strategy,
    load_plugins,
)

MODULES = [
    topology_spread,
    capacity_type,
    untolerated_taints,
    priority_qos,
    age,
    work_in_progress,
    co_location,
    node_consolidation,
    karpenter,
]


def entry(name: str, attribute: str) -> EntryPoint:
    return EntryPoint(name, f"tests.unit.plugin_fixture:{attribute}", ENTRY_POINT_GROUP)


def no_score(snapshot: Snapshot, args: Any) -> dict[PodUID, float]:
    return {}


@pytest.mark.parametrize("module", MODULES, ids=lambda module: module.NAME)
def test_every_builtin_module_is_one_registered_strategy_with_frozen_defaulted_args(
    module: Any,
) -> None:
    strategy = module.STRATEGY
    assert BUILTIN[module.NAME] is strategy
    assert strategy.name == module.NAME
    assert strategy.args_type is module.Args
    assert strategy.score is module.score
    assert "Callers" in (module.__doc__ or "")
    args = strategy.default_args()
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.__setattr__(dataclasses.fields(args)[0].name, None)


def test_the_builtin_registry_lists_exactly_the_eight_strategies() -> None:
    assert sorted(BUILTIN) == sorted(module.NAME for module in MODULES)
    assert dict(BUILTIN_REGISTRY) == dict(BUILTIN)


def test_only_topology_spread_is_a_spread_strategy() -> None:
    assert [name for name, strategy in BUILTIN.items() if strategy.spread] == ["topology-spread"]


def test_an_unknown_strategy_is_an_error_naming_it_and_listing_the_known_ones() -> None:
    with pytest.raises(UnknownStrategyError) as raised:
        get_strategy("zone", BUILTIN_REGISTRY)
    message = str(raised.value)
    assert "'zone'" in message
    assert all(name in message for name in BUILTIN)


def test_the_default_registry_is_built_once_and_holds_the_builtins() -> None:
    assert default_registry() is default_registry()
    assert get_strategy("age") is age.STRATEGY


def test_a_plugin_from_an_entry_point_joins_the_builtins() -> None:
    registry = build_registry([entry("name-length", "STRATEGY")])
    assert registry.get_strategy("name-length") is plugin_fixture.STRATEGY
    assert set(registry) == {*BUILTIN, "name-length"}


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        pytest.param([entry("name-length", "NOPE")], "cannot be loaded", id="import fails"),
        pytest.param([entry("name-length", "NOT_A_STRATEGY")], "not a Strategy", id="not one"),
        pytest.param([entry("name-length", "MISNAMED")], "under another name", id="misnamed"),
        pytest.param([entry("age", "AGE_AGAIN")], "built-in strategy 'age'", id="builtin clash"),
        pytest.param(
            [entry("name-length", "STRATEGY"), entry("name-length", "STRATEGY")],
            "collides with the plugin",
            id="plugin clash",
        ),
    ],
)
def test_a_broken_plugin_is_a_start_up_error_naming_it(
    entries: list[EntryPoint], message: str
) -> None:
    with pytest.raises(PluginError, match=message) as raised:
        load_plugins(entries)
    assert entries[-1].value in str(raised.value)


def test_no_entry_points_means_no_plugins() -> None:
    assert load_plugins([]) == {}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(
            lambda: Strategy("Bad_Name", age.Args, no_score, "x"), "lower-case", id="bad name"
        ),
        pytest.param(lambda: Strategy("ok", dict, no_score, "x"), "dataclass", id="args type"),
        pytest.param(lambda: Strategy("ok", age.Args, no_score, " "), "one", id="no description"),
        pytest.param(
            lambda: Strategy("ok", age.Args, no_score, "two\nlines"), "one", id="two lines"
        ),
    ],
)
def test_a_strategy_wrapper_rejects_what_the_contract_forbids(build: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        build()


def test_args_without_defaults_are_rejected_when_the_strategy_is_declared() -> None:
    @dataclass(frozen=True)
    class NeedsValue:
        value: int

    with pytest.raises(TypeError, match="'value' needs a default"):
        Strategy("needs-value", NeedsValue, no_score, "x")


@pytest.mark.parametrize(
    ("strategy", "raw", "expected"),
    [
        pytest.param(age.STRATEGY, {}, age.Args(), id="empty means defaults"),
        pytest.param(
            age.STRATEGY,
            {"direction": "older-first", "saturation_seconds": "3600"},
            age.Args(direction="older-first", saturation_seconds=3600.0),
            id="strings from annotations",
        ),
        pytest.param(
            age.STRATEGY, {"saturation_seconds": 60}, age.Args(saturation_seconds=60.0), id="int"
        ),
        pytest.param(priority_qos.STRATEGY, {"qos": "false"}, priority_qos.Args(qos=False), id="b"),
        pytest.param(priority_qos.STRATEGY, {"qos": False}, priority_qos.Args(qos=False), id="b2"),
        pytest.param(
            untolerated_taints.STRATEGY,
            {"effects": "NoSchedule;NoExecute"},
            untolerated_taints.Args(effects=("NoSchedule", "NoExecute")),
            id="list from an annotation",
        ),
        pytest.param(
            untolerated_taints.STRATEGY,
            {"effects": ["PreferNoSchedule"]},
            untolerated_taints.Args(effects=("PreferNoSchedule",)),
            id="list from a file",
        ),
        pytest.param(
            co_location.STRATEGY,
            {"required_weight": "2.5", "same_node_weight": 0},
            co_location.Args(required_weight=2.5, same_node_weight=0.0),
            id="floats",
        ),
    ],
)
def test_args_from_mapping_builds_args_from_policy_data(
    strategy: Strategy[Any], raw: dict[str, object], expected: object
) -> None:
    assert strategy.args_from_mapping(raw) == expected


@pytest.mark.parametrize(
    ("strategy", "raw", "arg", "message"),
    [
        pytest.param(age.STRATEGY, {"direction": "sideways"}, "direction", "one of", id="choice"),
        pytest.param(age.STRATEGY, {"saturation_seconds": "0"}, "saturation_seconds", "posit"),
        pytest.param(age.STRATEGY, {"saturation_seconds": "soon"}, "saturation_seconds", "numb"),
        pytest.param(age.STRATEGY, {"saturation_seconds": "nan"}, "saturation_seconds", "finite"),
        pytest.param(age.STRATEGY, {"saturation_seconds": True}, "saturation_seconds", "number"),
        pytest.param(age.STRATEGY, {"colour": "red"}, "colour", "known: direction", id="unknown"),
        pytest.param(priority_qos.STRATEGY, {"qos": "maybe"}, "qos", "true or false", id="bool"),
        pytest.param(
            topology_spread.STRATEGY, {"topology_key": "not a key"}, "topology_key", "label"
        ),
        pytest.param(capacity_type.STRATEGY, {"value": "spot"}, "value", "together with label"),
        pytest.param(untolerated_taints.STRATEGY, {"effects": ""}, "effects", "at least one"),
        pytest.param(untolerated_taints.STRATEGY, {"effects": [1]}, "effects", "list of strings"),
        pytest.param(co_location.STRATEGY, {"required_weight": "-1"}, "required_weight", "least"),
        pytest.param(node_consolidation.STRATEGY, {"measure": "gpu"}, "measure", "one of"),
        pytest.param(work_in_progress.STRATEGY, {"annotation": 5}, "annotation", "string"),
    ],
)
def test_bad_args_are_an_error_naming_the_strategy_and_the_arg(
    strategy: Strategy[Any], raw: dict[str, object], arg: str, message: str
) -> None:
    with pytest.raises(StrategyArgsError, match=message) as raised:
        strategy.args_from_mapping(raw)
    assert raised.value.strategy == strategy.name
    assert raised.value.arg == arg
    assert repr(strategy.name) in str(raised.value)
    assert repr(arg) in str(raised.value)


def test_co_location_needs_at_least_one_positive_weight() -> None:
    zero = {"same_node_weight": 0, "required_weight": 0, "preferred_weight": 0}
    with pytest.raises(StrategyArgsError, match="at least one"):
        co_location.STRATEGY.args_from_mapping(zero)


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("topology.kubernetes.io/zone", True),
        ("rack", True),
        ("podcost.dev/hourly-price", True),
        ("a_b.c-d", True),
        ("", False),
        ("/zone", False),
        ("Example.COM/zone", False),
        ("zone/", False),
        ("-zone", False),
        ("a b", False),
        ("x" * 64, False),
        ("x" * 63, True),
    ],
)
def test_is_label_key_follows_the_kubernetes_rules(key: str, valid: bool) -> None:
    assert is_label_key(key) is valid
