"""The pipeline over the secure broker, every component its own process and its own principal.

The chart rendered by the real helm in ``core`` mode (a ranker per strategy of a two-strategy
policy, and the faust aggregator) and in ``agent`` mode for cluster ``prod-eu-1`` (the watcher
and the annotator), with ``kafka.securityProtocol: SASL_SSL``, SCRAM-SHA-512 and one SASL Secret
per component (``kafka.sasl.secretNames``). Each container becomes a ``python -m podcost``
process (``tests/support/services.py``) against ``secure_kafka_broker``, given what its Secret
would hold: its own user and password, and the local CA file in place of the mounted one. The
broker's ACLs let each write only its own output topic; the test passes only if a snapshot of a
real Deployment goes watcher → rankers → aggregator → annotator and every pod gets its cost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import ControlPlane
from tests.support.kube import COST_ANNOTATION, KubeTestCluster, costed_by_podcost
from tests.support.secure_kafka import SecureBroker
from tests.support.services import ServiceSpec, assert_alive, chart_specs, processes, series
from tests.support.snapshots import CLUSTER
from tests.support.tools import require_helm

from podcost_localinfra.kafka_secure import annotator_user

pytestmark = pytest.mark.e2e

STRATEGIES = ("topology-spread", "age")
#: The Secret of each component, and the broker user whose credentials it holds.
SECRETS = {
    "watcher": ("kafka-watcher", "watcher"),
    "annotator": ("kafka-annotator", annotator_user(CLUSTER)),
    "ranker": ("kafka-ranker", "ranker"),
    "aggregator": ("kafka-aggregator", "aggregator"),
}


def _user_of(spec: ServiceSpec) -> str:
    component = spec.name.split("/", 1)[1]
    return SECRETS["ranker" if component.startswith("ranker-") else component][1]


async def test_every_component_with_its_own_credentials_costs_the_pods_over_tls_and_scram(
    secure_kafka_broker: SecureBroker,
    control_plane: ControlPlane,
    kube: KubeTestCluster,
    tmp_path: Path,
) -> None:
    broker = secure_kafka_broker
    helm = require_helm()
    run = f"secure-{uuid.uuid4().hex[:6]}"
    kafka = {
        "bootstrapServers": broker.bootstrap,
        "securityProtocol": "SASL_SSL",
        "tls": {"caSecret": {"name": "kafka-ca"}},
        "sasl": {
            "mechanism": "SCRAM-SHA-512",
            "secretNames": {role: secret for role, (secret, _) in SECRETS.items()},
        },
    }
    policy = {"strategies": [{"name": name, "weight": 1} for name in STRATEGIES]}
    core = chart_specs(helm, {"mode": "core", "kafka": kafka, "policy": policy}, prefix="core/")
    agent = chart_specs(
        helm,
        {"mode": "agent", "clusterName": CLUSTER, "kafka": kafka, "watch": {"namespace": run}},
        prefix="agent/",
    )
    specs: list[ServiceSpec] = []
    for spec in [*core, *agent]:
        # The chart names the user and password by Secret reference only (not rendered into a
        # process's env): here they are what that component's Secret would hold.
        assert "PODCOST_KAFKA_SASL_USERNAME" not in spec.env
        assert spec.env["PODCOST_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        own = broker.env(_user_of(spec))
        kubeconfig = {"KUBECONFIG": str(control_plane.kubeconfig)} if "agent/" in spec.name else {}
        specs.append(dataclasses.replace(spec, env={**spec.env, **own, **kubeconfig}))
    assert sorted(s.name for s in specs) == sorted(
        ["agent/watcher", "agent/annotator", "core/aggregator",
         *(f"core/ranker-{name}" for name in STRATEGIES)]
    )  # fmt: skip

    await kube.create_namespace(run)
    nodes = [f"{run}-{zone}" for zone in ("a", "b", "c")]
    try:
        await asyncio.gather(*(
            kube.create_node(node, zone=f"zone-{node[-1]}", labels={"fleet": run})
            for node in nodes
        ))  # fmt: skip
        await kube.create_deployment(run, "web", 4, opt_in=True, node_selector={"fleet": run})
        await kube.wait_ready(run, "web", 4)
        async with processes(specs, env={}, log_dir=tmp_path, ready_timeout=240) as running:
            pods: list[Any] = []

            async def costed() -> bool:
                nonlocal pods
                assert_alive(running)
                pods = await kube.active_pods(run, "web")
                # Pods may keep the 0 a missing annotation reads as: one write proves the path.
                return len(pods) == 4 and any(costed_by_podcost(pod.raw) for pod in pods)

            await kube.wait_for(costed, "the pods costed by podcost", 180, 0.5)
            metrics = await running["agent/annotator"].metrics()
            consumed = {
                (labels["topic"], labels["outcome"]): value
                for labels, value in series(metrics, "podcost_messages_consumed_total")
            }
            assert consumed.get((f"podcost.costs.{CLUSTER}", "ok"), 0) >= 1, consumed
            costs = sorted(int((pod.raw.metadata.annotations or {}).get(COST_ANNOTATION, 0))
                           for pod in pods)  # fmt: skip
            print(f"costs written over the secure broker: {costs}")
    finally:
        await kube.delete_namespace(run)
        await kube.delete_nodes(nodes)
