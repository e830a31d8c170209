"""``podcost cleanup`` against the real control plane: it removes exactly the deletion costs
podcost's field manager wrote, with a guarded PATCH, and leaves every other cost: one set with
``kubectl annotate``, one the lablabs controller wrote (adopted while podcost runs, but never
podcost's value), and one someone changes between the list and the PATCH (a real concurrent
write through the API: the PATCH's ``test`` refuses, the pod is read again, its cost is no
longer podcost's and stays). Also run as the command (``podcost cleanup`` through the CLI with
``$KUBECONFIG``), and timed over 200 pods within the annotator's default budget.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio import config
from tests.conftest import ControlPlane
from tests.support.kube import COST_ANNOTATION, KubeTestCluster
from typer.testing import CliRunner

from podcost.annotator.cleanup import Outcome, clean_up
from podcost.annotator.settings import AnnotatorSettings
from podcost.cli import app
from podcost_core.kubejson import cost_managers
from podcost_kube.client import CostChanged, Kube

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]


@dataclass
class Space:
    namespace: str
    nodes: list[str]
    label: str
    """The value of the nodes' ``cleanup`` label, which the pods select."""
    kube: Kube


@pytest.fixture
async def space(control_plane: ControlPlane, kube: KubeTestCluster) -> AsyncIterator[Space]:
    suffix = uuid.uuid4().hex[:4]
    namespace = await kube.create_namespace(f"cleanup-{RUN}-{suffix}")
    label = f"{RUN}-{suffix}"
    nodes = [f"cleanup-{label}-{index}" for index in range(2)]
    for node in nodes:
        await kube.create_node(node, zone="a", labels={"cleanup": label})
    api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield Space(namespace, nodes, label, Kube(api))
    finally:
        await api.close()
        await kube.delete_namespace(namespace)
        await kube.delete_nodes(nodes)


async def _pods(kube: KubeTestCluster, space: Space, count: int) -> list[str]:
    await kube.create_deployment(
        space.namespace, "web", count, node_selector={"cleanup": space.label}
    )
    return sorted(pod.name for pod in await kube.wait_ready(space.namespace, "web", count, 180))


async def _write_as(kube: KubeTestCluster, space: Space, pod: str, cost: int, manager: str) -> None:
    body = {"metadata": {"annotations": {COST_ANNOTATION: str(cost)}}}
    await kube.core.patch_namespaced_pod(pod, space.namespace, body, field_manager=manager)


async def _costs(
    kube: KubeTestCluster, space: Space
) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    return {
        pod["metadata"]["name"]: (
            (pod["metadata"].get("annotations") or {}).get(COST_ANNOTATION),
            cost_managers(pod["metadata"]),
        )
        for pod in await kube.raw_pods(space.namespace, "web")
    }


class ChangedMeanwhile:
    """The real adapter; just before the first removal of ``pod`` someone (field manager
    ``kubectl-annotate``) sets its cost through the API: a real write racing the cleanup."""

    def __init__(self, kube: Kube, test_kube: KubeTestCluster, space: Space, pod: str) -> None:
        self.kube, self.test_kube, self.space, self.pod = kube, test_kube, space, pod
        self.raced = False

    async def list_pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return await self.kube.list_pods(namespace)

    async def read_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        return await self.kube.read_pod(namespace, name)

    async def remove_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, *, seen: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        if pod == self.pod and not self.raced:
            self.raced = True
            await _write_as(self.test_kube, self.space, pod, 7, "kubectl-annotate")
        return await self.kube.remove_deletion_cost_if_unchanged(namespace, pod, seen=seen)


async def test_cleanup_removes_only_podcosts_own_costs_and_keeps_one_changed_meanwhile(
    kube: KubeTestCluster, space: Space
) -> None:
    pods = await _pods(kube, space, 6)
    ours, person, lablabs, raced = pods[:3], pods[3], pods[4], pods[5]
    for index, pod in enumerate([*ours, raced]):
        await space.kube.patch_deletion_cost(space.namespace, pod, 100 * index)
    await _write_as(kube, space, person, 1000, "kubectl-annotate")
    await _write_as(kube, space, lablabs, 2**31 - 1, "manager")

    racing = ChangedMeanwhile(space.kube, kube, space, raced)
    report = await clean_up(racing, AnnotatorSettings(), namespace=space.namespace)

    assert racing.raced
    assert (report.pods, report.own) == (6, 4)
    assert report.outcomes == {Outcome.REMOVED: 3, Outcome.KEPT: 1}
    after = await _costs(kube, space)
    assert all(after[pod] == (None, ()) for pod in ours)
    assert after[person] == ("1000", ("kubectl-annotate",))
    assert after[lablabs] == (str(2**31 - 1), ("manager",))
    assert after[raced] == ("7", ("kubectl-annotate",))


async def test_a_guarded_removal_refuses_a_value_changed_since_the_read(
    kube: KubeTestCluster, space: Space
) -> None:
    [pod] = await _pods(kube, space, 1)
    await space.kube.patch_deletion_cost(space.namespace, pod, 5)
    seen = await space.kube.read_pod(space.namespace, pod)
    await space.kube.patch_deletion_cost(space.namespace, pod, 6)  # podcost's own, rewritten
    with pytest.raises(CostChanged):
        await space.kube.remove_deletion_cost_if_unchanged(space.namespace, pod, seen=seen)
    assert (await _costs(kube, space))[pod][0] == "6"


async def test_the_cleanup_command_removes_podcosts_costs_and_says_what_it_did(
    control_plane: ControlPlane,
    kube: KubeTestCluster,
    space: Space,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pods = await _pods(kube, space, 3)
    for pod in pods[:2]:
        await space.kube.patch_deletion_cost(space.namespace, pod, 1)
    await _write_as(kube, space, pods[2], 3, "kubectl-annotate")
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    # The command sets up logging on the runner's stderr, which closes after the run.
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    dry = await asyncio.to_thread(
        CliRunner().invoke, app, ["cleanup", "-n", space.namespace, "--dry-run", "-o", "json"]
    )
    assert dry.exit_code == 0, dry.stderr
    assert json.loads(dry.stdout)["dry_run"] == 2
    assert [value for value, _ in (await _costs(kube, space)).values()].count("1") == 2
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["cleanup", "--namespace", space.namespace, "--output", "json"]
    )
    assert result.exit_code == 0, result.stderr
    counts = json.loads(result.stdout)
    assert (counts["podcost_costs"], counts["removed"], counts["error"]) == (2, 2, 0)
    after = await _costs(kube, space)
    assert sorted(value for value, _ in after.values() if value is not None) == ["3"]


@pytest.mark.parametrize("qps", [20.0, 200.0])
async def test_cleaning_up_200_pods_takes_what_the_write_budget_allows(
    kube: KubeTestCluster, space: Space, qps: float
) -> None:
    pods = await _pods(kube, space, 200)
    writes = asyncio.Semaphore(16)

    async def write(index: int, pod: str) -> None:
        async with writes:
            await space.kube.patch_deletion_cost(space.namespace, pod, index)

    await asyncio.gather(*(write(index, pod) for index, pod in enumerate(pods)))
    budget = AnnotatorSettings(qps=qps, burst=40)
    started = time.monotonic()
    report = await clean_up(space.kube, budget, namespace=space.namespace)
    took = time.monotonic() - started
    assert report.outcomes == {Outcome.REMOVED: 200}
    # 40 at once, then qps per second: the budget, not the API server, sets the pace.
    floor = (200 - budget.burst) / qps
    print(f"cleanup of 200 pods at qps={qps:g} burst={budget.burst}: {took:.2f}s "
          f"(budget floor {floor:.2f}s)")  # fmt: skip
    assert took >= floor * 0.95
    assert all(value is None for value, _ in (await _costs(kube, space)).values())
