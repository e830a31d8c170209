"""A strategy whose code runs in a ranker of its own image is known elsewhere by name only.

The components that keep podcost's image (watcher, aggregator, the other rankers) resolve every
policy that names the plugin's strategy: ``Registry.with_remote`` lets them check its name,
weight and tier, keep its args as written, and combine its ranks with the default normalization,
while anything that would run its code fails naming it. A name nobody declared stays an error.
"""

from __future__ import annotations

import pytest
from tests.support.snapshots import snapshot

from podcost.ranker.service import bootstrap as ranker_bootstrap
from podcost.runtime.settings import ServiceSettings
from podcost_bus import BusSettings
from podcost_core.combine import combine
from podcost_core.policy import (
    Policy,
    PolicyError,
    StrategySpec,
    policy_from_annotations,
    policy_from_data,
)
from podcost_core.strategies.registry import (
    BUILTIN_REGISTRY,
    RemoteArgs,
    RemoteStrategyError,
    UnknownStrategyError,
    remote_strategy,
)

REMOTE = BUILTIN_REGISTRY.with_remote(["restarts"])


def test_a_policy_may_name_and_weigh_a_strategy_declared_remote() -> None:
    policy = policy_from_annotations(
        {"podcost.dev/strategies": "topology-spread | restarts=3, capacity-type=2",
         "podcost.dev/args.restarts": "saturation=5"},
        registry=REMOTE,
    )  # fmt: skip
    bound = {b.name: b for b in policy.bound}
    assert bound["restarts"].weight == 3
    assert bound["restarts"].strategy.remote
    # Its args are its ranker's to build and check: kept as written.
    assert bound["restarts"].args == RemoteArgs({"saturation": "5"})
    assert "restarts" in policy.ranked  # the aggregator waits for its ranker's answer


def test_a_name_nobody_declared_is_still_an_error_naming_it() -> None:
    with pytest.raises(PolicyError, match="restartz"):
        policy_from_annotations({"podcost.dev/strategies": "restartz=3"}, registry=REMOTE)


@pytest.mark.parametrize(
    ("entry", "culprit"),
    [
        ({"name": "restarts", "weight": 0}, "weight must be an integer >= 1"),
        ({"name": "restarts", "tier": -1}, "tier must be an integer >= 0"),
        ({"name": "restarts", "threshold": -2}, "threshold must be a positive number"),
    ],
)
def test_a_remote_strategy_still_gets_its_weight_tier_and_threshold_checked(
    entry: dict[str, object], culprit: str
) -> None:
    with pytest.raises(PolicyError, match=culprit):
        policy_from_data({"strategies": [entry]}, registry=REMOTE)


def test_a_remote_strategy_named_twice_is_an_error() -> None:
    specs = (StrategySpec("restarts"), StrategySpec("restarts", tier=1))
    with pytest.raises(PolicyError, match="more than once"):
        Policy(specs, REMOTE)


def test_an_installed_strategy_keeps_its_code_when_also_declared_remote() -> None:
    registry = BUILTIN_REGISTRY.with_remote(["capacity-type", "restarts"])
    assert registry["capacity-type"] is BUILTIN_REGISTRY["capacity-type"]
    assert registry["restarts"].remote
    assert "restarts" not in registry.installed
    assert BUILTIN_REGISTRY.with_remote([]) is BUILTIN_REGISTRY


def test_running_a_remote_strategy_fails_naming_it() -> None:
    with pytest.raises(RemoteStrategyError, match="'restarts' is not installed in this image"):
        remote_strategy("restarts").score(snapshot(), RemoteArgs())


def test_a_remote_name_must_be_a_strategy_name() -> None:
    with pytest.raises(ValueError, match="lower-case words"):
        BUILTIN_REGISTRY.with_remote(["Restarts!"])


def test_the_combiner_weighs_a_remote_strategys_ranks_with_the_default_normalization() -> None:
    policy = Policy((StrategySpec("restarts"),), REMOTE)
    shot = snapshot(pods=3)
    uids = [pod.uid for pod in shot.pods]
    combined = combine(shot, policy, {"restarts": {uid: float(i) for i, uid in enumerate(uids)}})
    assert not combined.missing
    # Higher score = kept longer: the lowest-scored pod is deleted first.
    assert combined.order[0] == (uids[0],)
    assert combined.normalized["restarts"] == [0, 50, 100]


def test_a_ranker_started_for_a_remote_strategy_refuses_to_start() -> None:
    # (``restarts``, the example plugin, is installed in the test environment.)
    settings = ServiceSettings(remote_strategies=("gpu-idle",))
    with pytest.raises(RemoteStrategyError, match="gpu-idle"):
        ranker_bootstrap(settings, BusSettings(), strategy="gpu-idle")


def test_the_setting_is_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODCOST_REMOTE_STRATEGIES", "restarts, gpu-idle")
    settings = ServiceSettings()
    assert settings.remote_strategies == ("restarts", "gpu-idle")
    assert settings.strategy_registry()["gpu-idle"].remote
    with pytest.raises(UnknownStrategyError):
        ServiceSettings().strategy_registry().get_strategy("nope")
