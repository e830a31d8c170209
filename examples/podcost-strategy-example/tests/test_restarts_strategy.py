"""The ``restarts`` example plugin: its scores, its args, and that podcost finds it through the
``podcost.strategies`` entry point and deletes the most-restarted pods first."""

from __future__ import annotations

import pytest

from podcost_core.combine import rank
from podcost_core.model import NodeName, Phase, Pod, PodUID, Snapshot, WorkloadRef
from podcost_core.policy import PolicyError, policy_from_annotations
from podcost_core.strategies.base import StrategyArgsError
from podcost_core.strategies.registry import build_registry, default_registry
from podcost_restarts import strategy
from podcost_restarts.strategy import Args, score


def _pod(name: str, restarts: int = 0, sidecar_restarts: int = 0) -> Pod:
    return Pod(
        uid=PodUID(f"uid-{name}"),
        name=name,
        namespace="shop",
        node=NodeName("node-1"),
        phase=Phase.RUNNING,
        ready=True,
        ready_since=1_000.0,
        created=900.0,
        replicaset="web-1",
        restarts=restarts,
        sidecar_restarts=sidecar_restarts,
    )


def _snapshot(*pods: Pod) -> Snapshot:
    return Snapshot(WorkloadRef("local", "shop", "Deployment", "web"), pods, taken_at=2_000.0)


@pytest.mark.parametrize(
    ("restarts", "sidecar_restarts", "args", "expected"),
    [
        pytest.param(0, 0, Args(), 10.0, id="never restarted: kept"),
        pytest.param(3, 0, Args(), 7.0, id="three restarts"),
        pytest.param(10, 0, Args(), 0.0, id="at the saturation"),
        pytest.param(400, 0, Args(), 0.0, id="past the saturation ties with it"),
        pytest.param(1, 4, Args(), 6.0, id="a sidecar's restarts count"),
        pytest.param(1, 4, Args(count_sidecars=False), 9.0, id="unless told not to"),
        pytest.param(2, 0, Args(saturation=2), 0.0, id="a lower saturation"),
    ],
)
def test_a_pod_scores_the_saturation_less_its_capped_restarts(
    restarts: int, sidecar_restarts: int, args: Args, expected: float
) -> None:
    pod = _pod("a", restarts, sidecar_restarts)
    assert score(_snapshot(pod), args) == {pod.uid: expected}


def test_every_pod_of_the_snapshot_gets_a_score() -> None:
    pods = [_pod(f"p{index}", restarts=index) for index in range(5)]
    scores = score(_snapshot(*pods), Args())
    assert list(scores) == [pod.uid for pod in pods]
    assert list(scores.values()) == [10.0, 9.0, 8.0, 7.0, 6.0]


def test_a_saturation_below_one_is_refused_naming_the_arg() -> None:
    with pytest.raises(StrategyArgsError, match="'restarts', arg 'saturation': must be at least 1"):
        strategy.STRATEGY.args_from_mapping({"saturation": "0"})


def test_args_come_from_annotation_strings() -> None:
    args = strategy.STRATEGY.args_from_mapping({"saturation": "5", "count_sidecars": "false"})
    assert args == Args(saturation=5, count_sidecars=False)


def test_the_installed_entry_point_registers_the_strategy() -> None:
    assert default_registry().get_strategy("restarts") is strategy.STRATEGY
    assert build_registry()["restarts"] is strategy.STRATEGY


def test_a_policy_deletes_the_most_restarted_pods_first() -> None:
    pods = [_pod("calm"), _pod("flaky", restarts=2), _pod("crashloop", restarts=30)]
    policy = policy_from_annotations({"podcost.dev/strategies": "restarts"})
    order = rank(_snapshot(*pods), policy).flat()
    assert order == [PodUID("uid-crashloop"), PodUID("uid-flaky"), PodUID("uid-calm")]


def test_bad_args_in_an_annotation_are_a_policy_error_naming_the_strategy() -> None:
    with pytest.raises(PolicyError, match="restarts"):
        policy_from_annotations(
            {"podcost.dev/strategies": "restarts", "podcost.dev/args.restarts": "saturation=-1"}
        )
