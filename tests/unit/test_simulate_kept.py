"""``podcost simulate`` on a dump of a workload the lablabs controller steered: the costs it
wrote (near 2^31, outside podcost's band) are adopted by default and rewritten into podcost's
order; costs anyone else set are kept, named with who set them, and the result says whether
they change the outcome; ``--adopt-kept`` shows the outcome with them adopted; a dump without
managedFields gets a warning saying what is assumed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from podcost.cli import app

runner = CliRunner()
COST = "controller.kubernetes.io/pod-deletion-cost"
ZONE = "topology.kubernetes.io/zone"
T0 = "2024-05-01T12:00:00Z"

#: 2 zones, 5 pods (a1-a3 in zone-a, b1-b2 in zone-b): the cost each carries and its manager.
LABLABS_DUMP_COSTS: dict[str, tuple[int, str]] = {
    "a1": (2**31 - 1, "manager"),
    "a2": (2**31 - 2, "manager"),
    "a3": (2**31 - 3, "manager"),
    "b1": (2**31 - 4, "manager"),
    "b2": (2**31 - 5, "manager"),
}


def _dump(costs: dict[str, tuple[int, str]], *, managed_fields: bool = True) -> dict[str, Any]:
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "rs-web-1",
             "controller": True}  # fmt: skip
    items: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": f"node-{zone[-1]}", "labels": {ZONE: zone}}}
        for zone in ("zone-a", "zone-b")
    ]  # fmt: skip
    items.append({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "uid": "d-web",
                     "annotations": {"pod-deletion-cost.lablabs.io/enabled": "true"}},
        "spec": {"replicas": 5, "selector": {"matchLabels": {"app": "web"}}},
    })  # fmt: skip
    items.append({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": "shop", "uid": "rs-web-1",
                     "creationTimestamp": T0,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": "web", "uid": "d-web", "controller": True}]},
        "spec": {"replicas": 5, "selector": {"matchLabels": {"app": "web"}}},
    })  # fmt: skip
    for name in ("a1", "a2", "a3", "b1", "b2"):
        meta: dict[str, Any] = {
            "name": f"web-{name}", "namespace": "shop", "uid": f"uid-{name}",
            "creationTimestamp": T0, "labels": {"app": "web"}, "ownerReferences": [owner],
        }  # fmt: skip
        if name in costs:
            value, manager = costs[name]
            meta["annotations"] = {COST: str(value)}
            if managed_fields:
                fields = {"f:metadata": {"f:annotations": {f"f:{COST}": {}}}}
                meta["managedFields"] = [{"manager": manager, "operation": "Update",
                                          "time": T0, "fieldsType": "FieldsV1",
                                          "fieldsV1": fields}]  # fmt: skip
        items.append({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": f"node-{name[0]}", "containers": [{"name": "app"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": T0}]},
        })  # fmt: skip
    return {"apiVersion": "v1", "kind": "List", "items": items}


def simulate(tmp_path: Path, dump: dict[str, Any], *args: str) -> tuple[dict[str, Any], str]:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(dump))
    argv = ["simulate", "--snapshot", str(path), "--workload", "shop/web", "--replicas", "4"]
    result = runner.invoke(app, [*argv, "--output", "json", *args])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_without_adopting_the_lablabs_costs_the_skew_grows_and_simulate_says_why(
    tmp_path: Path,
) -> None:
    # b1 and b2 carry lablabs' lowest costs: kept, they decide alone and zone-b loses a pod.
    result, _ = simulate(tmp_path, _dump(LABLABS_DUMP_COSTS), "--adopt-field-managers", "")
    assert (result["skew_before"], result["skew_after"]) == (1, 2)
    assert result["victims"] == ["web-b2"]
    assert {kept["pod"]: kept["set_by"] for kept in result["kept_costs"]} == {
        f"web-{name}": ["manager"] for name in LABLABS_DUMP_COSTS
    }
    assert not any(kept["in_band"] for kept in result["kept_costs"])
    assert result["kept_costs_change_outcome"] is True


def test_by_default_the_lablabs_costs_are_adopted_and_the_skew_is_least(tmp_path: Path) -> None:
    result, _ = simulate(tmp_path, _dump(LABLABS_DUMP_COSTS))
    assert (result["skew_before"], result["skew_after"]) == (1, 0)
    assert result["victims"][0].startswith("web-a")
    assert result["kept_costs"] == []


def test_a_kubectl_cost_is_kept_and_adopt_kept_shows_the_outcome_without_it(
    tmp_path: Path,
) -> None:
    costs = {"b2": (-(2**31), "kubectl-annotate")}  # a person forces b2 out first
    kept, _ = simulate(tmp_path, _dump(costs))
    assert kept["victims"] == ["web-b2"]
    assert kept["kept_costs"] == [
        {"pod": "web-b2", "cost": -(2**31), "set_by": ["kubectl-annotate"], "in_band": False}
    ]
    assert kept["kept_costs_change_outcome"] is True
    assert kept["kept_costs_adopted"] is False
    adopted, _ = simulate(tmp_path, _dump(costs), "--adopt-kept")
    assert adopted["victims"][0].startswith("web-a")
    assert adopted["skew_after"] == 0
    assert adopted["kept_costs_adopted"] is True


def test_a_kept_cost_that_agrees_with_podcost_does_not_change_the_outcome(tmp_path: Path) -> None:
    costs = {"b1": (5_000, "kubectl-annotate")}  # a zone-b pod kept high: podcost agrees
    result, _ = simulate(tmp_path, _dump(costs))
    assert result["kept_costs"][0]["in_band"] is True
    assert result["kept_costs_change_outcome"] is False


def test_a_dump_without_managed_fields_is_warned_about_and_its_costs_are_kept(
    tmp_path: Path,
) -> None:
    result, stderr = simulate(tmp_path, _dump(LABLABS_DUMP_COSTS, managed_fields=False))
    assert "5 pod(s) of the workload carry a deletion cost but no managedFields" in stderr
    assert "--show-managed-fields" in stderr
    assert [kept["set_by"] for kept in result["kept_costs"]] == [None] * 5  # unknown
    assert result["skew_after"] == 2
    assert result["kept_costs_change_outcome"] is True


def test_the_table_names_the_kept_costs_and_who_set_them(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(_dump({"b2": (-(2**31), "kubectl-annotate")})))
    result = runner.invoke(app, ["simulate", "--snapshot", str(path), "--workload", "shop/web",
                                 "--replicas", "4", "--output", "table"])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "kubectl-annotate" in result.stdout
    assert "adopting them changes the outcome" in result.stdout
