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
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from tests.conftest import ControlPlane
from tests.support.kube import COST_ANNOTATION, KubeTestCluster, costed_by_podcost
from tests.support.secure_kafka import OTHER_CLUSTER, SecureBroker
from tests.support.services import ServiceSpec, assert_alive, chart_specs, processes, series
from tests.support.snapshots import CLUSTER
from tests.support.snapshots import snapshot as deployment
from tests.support.tools import require_helm

from podcost_bus import BusError, KafkaBus
from podcost_contracts.messages import WorkloadSnapshotMessage, encode
from podcost_contracts.signing import SIGNATURE_HEADER, signature
from podcost_localinfra.kafka_secure import annotator_user, watcher_user

pytestmark = pytest.mark.e2e

STRATEGIES = ("topology-spread", "age")
#: The Secret of each component, and the broker user whose credentials it holds.
SECRETS = {
    "watcher": ("kafka-watcher", watcher_user(CLUSTER)),
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
    # Each cluster's signing key; the core's keys file and registry list both clusters.
    keys = {cluster: uuid.uuid4().hex * 2 for cluster in (CLUSTER, OTHER_CLUSTER)}
    files = {
        "PODCOST_FLEET_KEYS_FILE": "".join(f"{c} {k}\n" for c, k in keys.items()),
        "PODCOST_FLEET_FILE": f"{CLUSTER}\n{OTHER_CLUSTER}\n",
        "PODCOST_WATCHER_SIGNING_KEY_FILE": keys[CLUSTER],
    }
    fleet = {
        "clusters": [CLUSTER, OTHER_CLUSTER],
        "keysSecret": {"name": "podcost-fleet-keys"},
        "signingKeySecret": {"name": "podcost-signing-key"},
    }
    core = chart_specs(
        helm, {"mode": "core", "kafka": kafka, "policy": policy, "fleet": fleet}, prefix="core/"
    )
    agent = chart_specs(
        helm,
        {"mode": "agent", "clusterName": CLUSTER, "kafka": kafka, "watch": {"namespace": run},
         "fleet": fleet},
        prefix="agent/",
    )  # fmt: skip
    specs: list[ServiceSpec] = []
    for spec in [*core, *agent]:
        # The chart mounts the registry, the keys and the signing key where the env says: here
        # they are files with what the ConfigMap and the Secrets would hold.
        for variable, text in files.items():
            if variable in spec.env:
                path = tmp_path / variable.lower()
                path.write_text(text)
                spec = dataclasses.replace(spec, env={**spec.env, variable: str(path)})
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
            refusals = await _publish_as_others(broker, keys)
            aggregator = running["core/aggregator"]

            async def dead_lettered() -> bool:
                forged = await aggregator.sample(
                    "podcost_messages_consumed_total", topic="podcost.workloads", outcome="forged"
                )
                return forged >= 1

            await kube.wait_for(dead_lettered, "the forged snapshot dead-lettered", 60, 0.5)
            refusals[watcher_user(OTHER_CLUSTER)] = (
                "accepted by the broker, dead-lettered by "
                "the core: not signed with a key of " + CLUSTER
            )
            width = max(map(len, refusals))
            print(f"publishing a snapshot of {CLUSTER} to podcost.workloads, by principal:")
            for user, answer in refusals.items():
                print(f"  {user.ljust(width)}  {answer}")
            assert set(refusals) == {"ranker", annotator_user(CLUSTER),
                                     watcher_user(OTHER_CLUSTER)}  # fmt: skip
    finally:
        await kube.delete_namespace(run)
        await kube.delete_nodes(nodes)


async def _publish_as_others(broker: SecureBroker, keys: dict[str, str]) -> dict[str, str]:
    """Publish a snapshot of CLUSTER as the watcher of OTHER_CLUSTER (signed with its own key:
    what that credential can do) and try as the ranker and CLUSTER's annotator; what the broker
    answered, by principal (the forged one's fate is the core's, checked by the caller)."""
    message = WorkloadSnapshotMessage.of(deployment(pods=2, nodes=2), emitted_at=time.time())
    encoded = encode(message)
    forged_key = keys[OTHER_CLUSTER].encode()
    mark = signature(forged_key, encoded.key or b"", encoded.value)
    headers = {**encoded.headers, SIGNATURE_HEADER: mark}
    answers: dict[str, str] = {}
    async with KafkaBus(broker.settings(watcher_user(OTHER_CLUSTER))) as other:
        await other.publish("podcost.workloads", encoded.key, encoded.value, headers)
    for user in ("ranker", annotator_user(CLUSTER)):
        async with KafkaBus(broker.settings(user)) as bus:
            with pytest.raises(BusError) as refused:
                await bus.publish("podcost.workloads", encoded.key, encoded.value, headers)
        assert isinstance(refused.value.__cause__, TopicAuthorizationFailedError)
        answers[user] = "refused by the broker: TopicAuthorizationFailed"
    return answers
