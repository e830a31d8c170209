"""podcost's service account, with only the chart's RBAC and admission policy, against the real
kube-apiserver: it can do what the services do and nothing else.

The chart's ``templates/rbac.yaml`` and ``templates/admission-policy.yaml`` are rendered by the
real helm and created with the admin credentials; every request below is then made with a token
the TokenRequest API issued for the service account, and nothing else. What the services call
is allowed: the informer's list and watch of pods, nodes, ReplicaSets and Deployments (the
watcher's, and the annotator's own view of pods, ReplicaSets and Deployments it verifies
decisions against), the annotator's read and compare-and-swap patch of the deletion cost,
``podcost cleanup``'s list and guarded removal of it (the uninstall hook), the leader
election's Lease.
Anything else is refused: by RBAC (delete or create a pod, secrets, nodes, subresources, events)
or, for a patch RBAC must allow, by the admission policy (labels, other annotations, spec, owner
references, finalizers; a cost outside podcost's band; a cost on a pod no ReplicaSet controls).
The effective permissions are read back with SelfSubjectRulesReview and must be exactly the list
the chart promises, with no wildcard.

Twice: with the default values (podcost watches every namespace: a ClusterRole), and with
``watch.namespace`` listing two namespaces (a Role in each for pods, ReplicaSets and
Deployments; the ClusterRole keeps nodes and namespaces): there, pods elsewhere cannot even be
listed, and a cost write elsewhere is refused by the policy too when RBAC is widened by hand.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from tests.conftest import ControlPlane
from tests.support.kube import COST_ANNOTATION, KubeTestCluster
from tests.support.least_privilege import ServiceAccount, install, one, render
from tests.support.tools import require_helm

from podcost.annotator.cleanup import Outcome, clean_up
from podcost.annotator.plan import Scope
from podcost.annotator.settings import AnnotatorSettings
from podcost.annotator.view import InformerView
from podcost_core.labels import DEFAULT_BAND, INT32_MAX, INT32_MIN
from podcost_kube.client import Kube, KubeError
from podcost_kube.events import EventRecorder, EventSettings, ObjectRef
from podcost_kube.informer import (
    NAMESPACE,
    WORKLOAD_RESOURCES,
    Informer,
    InformerFailed,
    Informers,
)
from podcost_kube.leader import KubeLeases

pytestmark = pytest.mark.integration

#: The permissions the chart promises, as (API group, resource, verb, resource name) rules:
#: on the namespaced resources of workloads (cluster-wide, or in the one watched namespace)...
WORKLOAD_RULES = {
    *(("", "pods", verb, "") for verb in ("get", "list", "watch", "patch")),
    *(("apps", resource, verb, "") for resource in ("replicasets", "deployments")
      for verb in ("get", "list", "watch")),
    # Events on them, through the events API only (a series' count is a patch).
    *(("events.k8s.io", "events", verb, "") for verb in ("create", "patch")),
}  # fmt: skip
#: ... and on the cluster-scoped ones, always cluster-wide: nodes, and namespaces only with
#: ``watch.namespaceSelector`` (the one reason the watcher reads them).
NODE_RULES = {("", "nodes", verb, "") for verb in ("get", "list", "watch")}
NAMESPACE_RULES = {("", "namespaces", verb, "") for verb in ("get", "list", "watch")}
CLUSTER_RULES = WORKLOAD_RULES | NODE_RULES

Rule = tuple[str, str, str, str]


def lease_rules(lease: str) -> set[Rule]:
    """Leader election's rules, in the release namespace only."""
    group = "coordination.k8s.io"
    return {(group, "leases", "create", ""), (group, "leases", "get", lease),
            (group, "leases", "update", lease)}  # fmt: skip


@pytest.fixture(scope="module")
def helm() -> Path:
    """The real helm binary, built once into the cache."""
    return require_helm()


@dataclass
class Installed:
    """The chart's RBAC and policy on the cluster, and a client that is only the account."""

    account: ServiceAccount
    api: ApiClient
    namespace: str
    pod: str
    """A pod of a ReplicaSet, cost 10 and annotation team=checkout: what the tests patch."""
    probe: str
    """Another pod of that ReplicaSet: what waiting for the policy patches."""

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def lease(self) -> str:
        return self.account.lease


#: Never scheduled (a scheduling gate), so nothing but the test changes the pod.
POD_SPEC = {
    "schedulingGates": [{"name": "podcost.dev/never"}],
    "containers": [{"name": "app", "image": "registry.local/podcost/app:1"}],
    "terminationGracePeriodSeconds": 0,
}
POD_META = {"labels": {"app": "lp"}, "annotations": {"team": "checkout", COST_ANNOTATION: "10"}}


def _pod(name: str) -> dict[str, Any]:
    """A bare pod (no owner, and labels no ReplicaSet selects, so none adopts it): podcost never
    ranks one, so it may not set its cost."""
    meta = {**POD_META, "name": name, "labels": {"app": "bare"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": POD_SPEC}


async def replicaset_pods(kube: KubeTestCluster, namespace: str, replicas: int = 2) -> list[str]:
    """Create ReplicaSet ``lp`` of ``POD_META``/``POD_SPEC`` pods; the names of the pods the real
    ReplicaSet controller made (each with its controller owner reference)."""
    await client.AppsV1Api(kube.api).create_namespaced_replica_set(namespace, {
        "metadata": {"name": "lp"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": POD_META["labels"]},
                 "template": {"metadata": POD_META, "spec": POD_SPEC}},
    })  # fmt: skip
    names: list[str] = []

    async def created() -> bool:
        nonlocal names
        pods = await kube.core.list_namespaced_pod(namespace, label_selector="app=lp")
        names = sorted(pod.metadata.name for pod in pods.items)
        return len(names) == replicas

    await kube.wait_for(created, f"{replicas} pods of ReplicaSet {namespace}/lp", timeout=60)
    return names


async def refusal(call: Awaitable[Any]) -> tuple[int, str]:
    """The HTTP status and message with which the API server refuses ``call``."""
    try:
        await call
    except ApiException as error:
        message = json.loads(error.body or "{}").get("message", error.body)
        return int(error.status), str(message)
    raise AssertionError("the request was allowed")


@pytest.fixture(scope="module")
async def installed(
    helm: Path, control_plane: ControlPlane, kube: KubeTestCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Installed]:  # fmt: skip
    namespace = await kube.create_namespace(f"lp-{uuid.uuid4().hex[:6]}")
    account = await install(kube.api, control_plane.kubeconfig, namespace)
    try:
        target, probe = await replicaset_pods(kube, namespace)
        path = await account.kubeconfig(tmp_path_factory.mktemp("sa") / "kubeconfig")
        api = await config.new_client_from_config(config_file=str(path))
        async with api:
            ready = Installed(account, api, namespace, target, probe)
            await _policy_in_force(ready, kube)
            yield ready
    finally:
        await account.uninstall()
        await kube.delete_namespace(namespace)


async def _policy_in_force(installed: Installed, kube: KubeTestCluster) -> None:
    """Wait until the policy reaches the API server's admission caches (``install`` waited for
    the bindings): until then a label change on the probe pod by the account goes through."""
    policy = one(installed.account.objects, "ValidatingAdmissionPolicy")["metadata"]["name"]

    async def denied_by_the_policy() -> bool:
        try:
            await installed.core.patch_namespaced_pod(
                installed.probe, installed.namespace,
                {"metadata": {"labels": {"probe": uuid.uuid4().hex}}},
            )  # fmt: skip
        except ApiException as error:
            if error.status == 403 and policy in (error.body or ""):
                return True
            raise
        return False

    await kube.wait_for(denied_by_the_policy, "the admission policy in force", timeout=60)


async def _annotations(kube: KubeTestCluster, installed: Installed) -> dict[str, str]:
    pod = await kube.core.read_namespaced_pod(installed.pod, installed.namespace)
    return dict(pod.metadata.annotations or {})


def _cost_patch(value: str | None, **more: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {COST_ANNOTATION: value, **more}}}


# --- what the services do is allowed ----------------------------------------------------------


async def test_the_account_may_set_change_and_remove_the_deletion_cost(
    installed: Installed, kube: KubeTestCluster
) -> None:
    for value in ("5", str(DEFAULT_BAND.low), str(DEFAULT_BAND.high), "0", None):
        await installed.core.patch_namespaced_pod(
            installed.pod, installed.namespace, _cost_patch(value)
        )
        annotations = await _annotations(kube, installed)
        assert annotations.get(COST_ANNOTATION) == value
        assert annotations["team"] == "checkout"
    await installed.core.patch_namespaced_pod(installed.pod, installed.namespace, _cost_patch("10"))


async def test_the_annotators_read_and_compare_and_swap_patch_pass(
    installed: Installed, kube: KubeTestCluster
) -> None:
    pods = Kube(installed.api)
    seen = await pods.read_pod(installed.namespace, installed.pod)
    written = await pods.patch_deletion_cost_if_unchanged(
        installed.namespace, installed.pod, 42, seen=seen
    )
    assert written["metadata"]["annotations"][COST_ANNOTATION] == "42"
    await pods.patch_deletion_cost(installed.namespace, installed.pod, 10)
    assert (await _annotations(kube, installed))[COST_ANNOTATION] == "10"


async def test_the_account_writes_events_and_counts_their_series_through_the_events_api(
    installed: Installed, kube: KubeTestCluster
) -> None:
    pod = await kube.core.read_namespaced_pod(installed.pod, installed.namespace)
    ref = ObjectRef("v1", "Pod", installed.namespace, installed.pod, pod.metadata.uid)
    settings = EventSettings(series_flush_seconds=3600)
    recorder = EventRecorder(Kube(installed.api), "podcost.dev/annotator", "lp-0", settings)
    task = asyncio.create_task(recorder.run())
    try:
        for _ in range(3):
            recorder.record(ref, type="Warning", reason="CostRefused", action="WriteCosts",
                            note="refused for the least-privilege test")  # fmt: skip
        await recorder.idle()
        await recorder.flush()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert recorder.counts["failed"] == 0
    assert recorder.counts["created"] == 1
    found = await client.EventsV1Api(kube.api).list_namespaced_event(
        installed.namespace, field_selector=f"regarding.name={installed.pod}"
    )
    [event] = [e for e in found.items if e.reporting_instance == "lp-0"]
    assert event.series.count == 3


async def test_the_annotators_own_view_lists_and_watches_as_the_account(
    installed: Installed, kube: KubeTestCluster
) -> None:
    view = InformerView(Kube(installed.api), Scope())
    assert [r.kind for r in view.resources()] == ["Pod", "ReplicaSet", "Deployment"]
    task = asyncio.create_task(view.run(), name="annotator-view")
    try:
        await kube.wait_for(lambda: _done_or(task, view.synced), "the view synced", timeout=30)
        assert view.pod(installed.namespace, installed.pod) is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _done_or(task: asyncio.Task[None], synced: Callable[[], bool]) -> bool:
    if task.done():
        task.result()  # the view's informer failed (403 ...): raise why
        raise AssertionError("the view stopped by itself")
    return synced()


async def test_podcost_cleanup_as_the_account_removes_its_cost_and_nothing_else(
    installed: Installed, kube: KubeTestCluster
) -> None:
    # What the chart's uninstall hook does, with nothing but the account's token.
    pods = Kube(installed.api)
    await pods.patch_deletion_cost(installed.namespace, installed.pod, 10)  # podcost's own
    report = await clean_up(pods, AnnotatorSettings(), namespace=installed.namespace)
    assert report.outcomes == {Outcome.REMOVED: 1}
    annotations = await _annotations(kube, installed)
    assert COST_ANNOTATION not in annotations
    assert annotations["team"] == "checkout"
    await pods.patch_deletion_cost(installed.namespace, installed.pod, 10)


async def test_the_informer_lists_and_watches_every_workload_resource_cluster_wide(
    installed: Installed, kube: KubeTestCluster
) -> None:
    async with Informer(Kube(installed.api), WORKLOAD_RESOURCES) as informer:
        await informer.wait_synced()

        async def watching() -> bool:
            if informer.error is not None:
                raise informer.error
            return all(informer.stats(kind).watches >= 1 for kind in informer.kinds)

        await kube.wait_for(watching, "a watch of every resource", timeout=30)
        assert informer.store.count("Pod") >= 2


async def test_leader_election_may_create_read_and_renew_only_its_own_lease(
    installed: Installed,
) -> None:
    leases = KubeLeases(Kube(installed.api))
    spec = {"holderIdentity": "podcost-0", "leaseDurationSeconds": 15}
    assert await leases.get(installed.namespace, installed.lease) is None
    created = await leases.create(installed.namespace, installed.lease, spec)  # type: ignore[arg-type]
    renewed = await leases.replace(created, {**spec, "holderIdentity": "podcost-1"})  # type: ignore[typeddict-item]
    assert renewed["spec"]["holderIdentity"] == "podcost-1"
    read = await leases.get(installed.namespace, installed.lease)
    assert read is not None
    assert read["spec"]["holderIdentity"] == "podcost-1"
    for namespace, name in ((installed.namespace, "another-lease"), ("default", installed.lease)):
        with pytest.raises(KubeError, match="HTTP 403") as refused:
            await leases.get(namespace, name)
        assert refused.value.status == 403


# --- the admission policy: one annotation and nothing else ------------------------------------


POLICY_DENIALS = {
    "a changed label": ({"metadata": {"labels": {"app": "other"}}}, "labels differ"),
    "an added label": ({"metadata": {"labels": {"tier": "web"}}}, "labels differ"),
    "an added annotation": (_cost_patch("11", other="1"), "another annotation differs"),
    "a changed annotation": (_cost_patch("11", team="payments"), "another annotation differs"),
    "a removed annotation": (
        {"metadata": {"annotations": {"team": None}}}, "another annotation differs"
    ),
    "activeDeadlineSeconds": ({"spec": {"activeDeadlineSeconds": 30}}, "the spec differs"),
    "a container image": (
        {"spec": {"containers": [{"name": "app", "image": "registry.local/evil:1"}]}},
        "the spec differs",
    ),
    "a finalizer": (
        {"metadata": {"finalizers": ["podcost.dev/hold"]}}, "owner references or finalizers"
    ),
    "an owner reference": (
        {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                                           "name": "x", "uid": str(uuid.uuid4())}]}},
        "owner references or finalizers",
    ),
}  # fmt: skip


@pytest.mark.parametrize("change", list(POLICY_DENIALS))
async def test_the_policy_denies_any_change_but_the_deletion_cost(
    change: str, installed: Installed, kube: KubeTestCluster
) -> None:
    body, reason = POLICY_DENIALS[change]
    before = await kube.core.read_namespaced_pod(installed.pod, installed.namespace)
    status, message = await refusal(
        installed.core.patch_namespaced_pod(installed.pod, installed.namespace, body)
    )
    assert status == 403, message
    policy = one(installed.account.objects, "ValidatingAdmissionPolicy")["metadata"]["name"]
    assert f"ValidatingAdmissionPolicy '{policy}'" in message
    assert f"podcost may change only the {COST_ANNOTATION} annotation: {reason}" in message
    after = await kube.core.read_namespaced_pod(installed.pod, installed.namespace)
    assert after.metadata.resource_version == before.metadata.resource_version


@pytest.mark.parametrize("value", ["abc", "+5", "007", "1.5", "2147483648", "-2147483649", ""])
async def test_a_deletion_cost_that_is_not_an_int32_is_refused(
    value: str, installed: Installed, kube: KubeTestCluster
) -> None:
    status, message = await refusal(
        installed.core.patch_namespaced_pod(installed.pod, installed.namespace, _cost_patch(value))
    )
    # The API server's own pod validation parses the cost as the ReplicaSet controller does and
    # answers 422 before admission runs; the policy's int32 check stands behind it.
    assert status == 422, message
    assert COST_ANNOTATION in message
    assert (await _annotations(kube, installed))[COST_ANNOTATION] == "10"


BAND_MESSAGE = f"podcost may set {COST_ANNOTATION} only to an integer in its band"

#: Costs the API server itself accepts (int32) that podcost never writes: the band's neighbours
#: and int32's ends, left to people who force a pod first or last by hand.
OUT_OF_BAND = [DEFAULT_BAND.high + 1, DEFAULT_BAND.low - 1, INT32_MAX, INT32_MIN]


@pytest.mark.parametrize("value", OUT_OF_BAND)
async def test_a_cost_outside_podcosts_band_is_refused(
    value: int, installed: Installed, kube: KubeTestCluster
) -> None:
    status, message = await refusal(
        installed.core.patch_namespaced_pod(
            installed.pod, installed.namespace, _cost_patch(str(value))
        )
    )
    assert status == 403, message
    assert BAND_MESSAGE in message
    assert (await _annotations(kube, installed))[COST_ANNOTATION] == "10"


async def test_a_persons_cost_outside_the_band_may_be_replaced_or_removed(
    installed: Installed, kube: KubeTestCluster
) -> None:
    # overwriteForeign replaces it with a cost in the band; a cleanup removes it.
    person = str(INT32_MIN)
    for value in (str(DEFAULT_BAND.low), None):
        await kube.set_deletion_cost(installed.namespace, installed.pod, person)
        await installed.core.patch_namespaced_pod(
            installed.pod, installed.namespace, _cost_patch(value)
        )
        assert (await _annotations(kube, installed)).get(COST_ANNOTATION) == value
    await kube.set_deletion_cost(installed.namespace, installed.pod, "10")


async def test_a_cost_on_a_pod_no_replicaset_controls_is_refused_but_may_be_removed(
    installed: Installed, kube: KubeTestCluster
) -> None:
    await kube.core.create_namespaced_pod(installed.namespace, _pod("bare"))
    try:
        status, message = await refusal(
            installed.core.patch_namespaced_pod("bare", installed.namespace, _cost_patch("5"))
        )
        assert status == 403, message
        assert f"podcost may set {COST_ANNOTATION} only on a pod a ReplicaSet controls" in message
        await installed.core.patch_namespaced_pod("bare", installed.namespace, _cost_patch(None))
        bare = await kube.core.read_namespaced_pod("bare", installed.namespace)
        assert COST_ANNOTATION not in (bare.metadata.annotations or {})
    finally:
        await kube.core.delete_namespaced_pod("bare", installed.namespace, grace_period_seconds=0)


# --- RBAC: nothing else at all ----------------------------------------------------------------


Call = Callable[[Installed], Awaitable[Any]]

RBAC_DENIALS: dict[str, tuple[Call, str]] = {
    "delete a pod": (
        lambda i: i.core.delete_namespaced_pod(i.pod, i.namespace), 'cannot delete resource "pods"'
    ),
    "create a pod": (
        lambda i: i.core.create_namespaced_pod(i.namespace, _pod("intruder")),
        'cannot create resource "pods"',
    ),
    "list secrets": (
        lambda i: i.core.list_namespaced_secret(i.namespace), 'cannot list resource "secrets"'
    ),
    "read a secret": (
        lambda i: i.core.read_namespaced_secret("any", i.namespace),
        'cannot get resource "secrets"',
    ),
    "patch a node": (
        lambda i: i.core.patch_node("any", {"spec": {"unschedulable": True}}),
        'cannot patch resource "nodes"',
    ),
    "patch a pod's status": (
        lambda i: i.core.patch_namespaced_pod_status(i.pod, i.namespace, {"status": {}}),
        'cannot patch resource "pods/status"',
    ),
    "evict a pod": (
        lambda i: i.core.create_namespaced_pod_eviction(
            i.pod, i.namespace, {"metadata": {"name": i.pod, "namespace": i.namespace}}
        ),
        'cannot create resource "pods/eviction"',
    ),
    "scale a Deployment": (
        lambda i: client.AppsV1Api(i.api).patch_namespaced_deployment_scale(
            "any", i.namespace, {"spec": {"replicas": 0}}
        ),
        'cannot patch resource "deployments/scale"',
    ),
    "create an event": (
        lambda i: i.core.create_namespaced_event(
            i.namespace, {"metadata": {"generateName": "x-"}, "involvedObject": {},
                          "reason": "x", "message": "x"},
        ),
        'cannot create resource "events"',
    ),
    "delete a lease": (
        lambda i: client.CoordinationV1Api(i.api).delete_namespaced_lease(i.lease, i.namespace),
        'cannot delete resource "leases"',
    ),
}  # fmt: skip


@pytest.mark.parametrize("action", list(RBAC_DENIALS))
async def test_rbac_refuses_what_the_services_never_do(action: str, installed: Installed) -> None:
    call, expected = RBAC_DENIALS[action]
    status, message = await refusal(call(installed))
    assert status == 403, message
    assert f'User "{installed.account.username}" {expected}' in message


#: More than the chart grants, in a namespace of its own: what the policy must still refuse.
WIDER_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]},
    {"apiGroups": [""], "resources": ["pods/status", "pods/ephemeralcontainers"],
     "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
]  # fmt: skip

WIDER_ACTIONS: dict[str, Callable[[client.CoreV1Api, str], Awaitable[Any]]] = {
    "delete a pod": lambda core, ns: core.delete_namespaced_pod("target", ns),
    "create a pod": lambda core, ns: core.create_namespaced_pod(ns, _pod("intruder")),
    "patch a pod's status": lambda core, ns: core.patch_namespaced_pod_status(
        "target", ns, {"status": {"message": "patched by podcost"}}
    ),
    "add an ephemeral container": lambda core, ns: core.patch_namespaced_pod_ephemeralcontainers(
        "target", ns,
        {"spec": {"ephemeralContainers": [{"name": "debug", "image": "registry.local/dbg:1"}]}},
    ),
    "evict a pod": lambda core, ns: core.create_namespaced_pod_eviction(
        "target", ns, {"metadata": {"name": "target", "namespace": ns}}
    ),
}  # fmt: skip


async def test_the_policy_still_refuses_all_but_patches_where_rbac_is_wider(
    installed: Installed, kube: KubeTestCluster
) -> None:
    namespace = await kube.create_namespace(f"lp-wide-{uuid.uuid4().hex[:6]}")
    rbac = client.RbacAuthorizationV1Api(kube.api)
    policy = one(installed.account.objects, "ValidatingAdmissionPolicy")["metadata"]["name"]
    try:
        await kube.core.create_namespaced_pod(namespace, _pod("target"))
        await rbac.create_namespaced_role(
            namespace, {"metadata": {"name": "wider"}, "rules": WIDER_RULES}
        )
        await rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "wider"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "wider"},
            "subjects": [{"kind": "ServiceAccount", "name": installed.account.name,
                          "namespace": installed.namespace}],
        })  # fmt: skip
        for action, call in WIDER_ACTIONS.items():
            refused: tuple[int, str] = (0, "")

            async def past_rbac(call: Any = call) -> bool:
                nonlocal refused
                refused = await refusal(call(installed.core, namespace))
                return "cannot" not in refused[1]  # RBAC's "cannot <verb>": not in force yet

            await kube.wait_for(past_rbac, f"the wider role in force for: {action}", 30)
            status, message = refused
            assert status == 403, (action, message)
            assert f"ValidatingAdmissionPolicy '{policy}'" in message, (action, message)
            assert "podcost may only patch pods" in message, (action, message)
        assert [
            p.metadata.name for p in (await kube.core.list_namespaced_pod(namespace)).items
        ] == ["target"]
    finally:
        await kube.delete_namespace(namespace)


async def _rules(api: ApiClient, namespace: str) -> set[Rule]:
    review = await client.AuthorizationV1Api(api).create_self_subject_rules_review(
        {"spec": {"namespace": namespace}}
    )
    assert not review.status.incomplete, review.status.evaluation_error
    rules: set[Rule] = set()
    for rule in review.status.resource_rules:
        for group in rule.api_groups or [""]:
            for resource in rule.resources or []:
                for verb in rule.verbs:
                    for name in rule.resource_names or [""]:
                        rules.add((group, resource, verb, name))
    return rules


async def _baseline(installed: Installed, kube: KubeTestCluster, tmp_path: Path) -> set[Rule]:
    """What every authenticated user may do (self reviews), learnt from an account bound to
    nothing: not podcost's doing."""
    nobody = ServiceAccount(installed.namespace, "nobody", [], kube.api,
                            installed.account.admin_kubeconfig)  # fmt: skip
    await kube.core.create_namespaced_service_account(
        installed.namespace, {"metadata": {"name": "nobody"}}
    )
    path = await nobody.kubeconfig(tmp_path / "nobody")
    async with await config.new_client_from_config(config_file=str(path)) as nobody_api:
        return await _rules(nobody_api, installed.namespace)


async def test_the_effective_permissions_are_exactly_the_charts_with_no_wildcard(
    installed: Installed, kube: KubeTestCluster, tmp_path: Path
) -> None:
    baseline = await _baseline(installed, kube, tmp_path)
    here = await _rules(installed.api, installed.namespace)
    elsewhere = await _rules(installed.api, "default")
    assert here - baseline == CLUSTER_RULES | lease_rules(installed.lease)
    assert elsewhere - baseline == CLUSTER_RULES
    assert all("*" not in part for rule in here | elsewhere for part in rule), here


async def test_the_policy_type_checks_against_the_pod_schema(
    installed: Installed, kube: KubeTestCluster
) -> None:
    name = one(installed.account.objects, "ValidatingAdmissionPolicy")["metadata"]["name"]
    admission = client.AdmissionregistrationV1Api(kube.api)
    policy = await admission.read_validating_admission_policy(name)

    async def checked() -> bool:
        nonlocal policy
        policy = await admission.read_validating_admission_policy(name)
        status = policy.status
        return status is not None and status.observed_generation == policy.metadata.generation

    await kube.wait_for(checked, f"type checking of {name}", timeout=30)
    checking = policy.status.type_checking
    warnings = checking.expression_warnings if checking is not None else None
    assert not warnings, [warning.warning for warning in warnings or []]


# --- one watched namespace: RBAC and the policy scoped to it -------------------------------


@dataclass
class Scoped(Installed):
    """The chart installed with ``watch.namespace``: the account lives in ``namespace`` (the
    release's), watches ``watched`` and ``second``; ``other`` is a namespace it does not watch."""

    watched: str = ""
    watched_pod: str = ""
    second: str = ""
    second_pods: tuple[str, ...] = ()
    other: str = ""
    other_pod: str = ""

    @property
    def scope(self) -> list[str]:
        return [self.watched, self.second]


@pytest.fixture(scope="module")
async def scoped(
    helm: Path, control_plane: ControlPlane, kube: KubeTestCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Scoped]:  # fmt: skip
    suffix = uuid.uuid4().hex[:6]
    release, watched, second, other = [
        await kube.create_namespace(f"lps-{role}-{suffix}")
        for role in ("rel", "shop", "web", "other")
    ]
    account = await install(
        kube.api, control_plane.kubeconfig, release,
        {"watch.namespace": f"{watched},{second}", "watch.namespaceSelector": "podcost=on"},
    )  # fmt: skip
    try:
        target, probe = await replicaset_pods(kube, watched)
        second_pods = await replicaset_pods(kube, second)
        other_pod, _ = await replicaset_pods(kube, other)
        path = await account.kubeconfig(tmp_path_factory.mktemp("sa") / "kubeconfig")
        async with await config.new_client_from_config(config_file=str(path)) as api:
            ready = Scoped(account, api, release, target, probe, watched, target, second,
                           tuple(second_pods), other, other_pod)  # fmt: skip
            # The policy is waited for on the watched namespace's pods.
            await _policy_in_force(Installed(account, api, watched, target, probe), kube)
            yield ready
    finally:
        await account.uninstall()
        for namespace in (watched, second, other, release):
            await kube.delete_namespace(namespace)


async def test_with_watched_namespaces_the_annotators_write_there_passes(
    scoped: Scoped, kube: KubeTestCluster
) -> None:
    pods = Kube(scoped.api)
    for namespace, pod in (
        (scoped.watched, scoped.watched_pod),
        (scoped.second, scoped.second_pods[0]),
    ):
        seen = await pods.read_pod(namespace, pod)
        written = await pods.patch_deletion_cost_if_unchanged(
            namespace, pod, DEFAULT_BAND.high, seen=seen
        )
        assert written["metadata"]["annotations"][COST_ANNOTATION] == str(DEFAULT_BAND.high)
        await pods.patch_deletion_cost(namespace, pod, 10)
        read = await kube.core.read_namespaced_pod(pod, namespace)
        assert read.metadata.annotations[COST_ANNOTATION] == "10"


SCOPED_RBAC_DENIALS: dict[str, tuple[Callable[[Scoped], Awaitable[Any]], str]] = {
    "list pods in another namespace": (
        lambda s: s.core.list_namespaced_pod(s.other),
        'cannot list resource "pods" in API group "" in the namespace "{other}"',
    ),
    "list pods in every namespace": (
        lambda s: s.core.list_pod_for_all_namespaces(),
        'cannot list resource "pods" in API group "" at the cluster scope',
    ),
    "read a pod in another namespace": (
        lambda s: s.core.read_namespaced_pod(s.other_pod, s.other),
        'cannot get resource "pods" in API group "" in the namespace "{other}"',
    ),
    "write a cost in another namespace": (
        lambda s: s.core.patch_namespaced_pod(s.other_pod, s.other, _cost_patch("5")),
        'cannot patch resource "pods" in API group "" in the namespace "{other}"',
    ),
    "list ReplicaSets in another namespace": (
        lambda s: client.AppsV1Api(s.api).list_namespaced_replica_set(s.other),
        'cannot list resource "replicasets" in API group "apps" in the namespace "{other}"',
    ),
    "watch Deployments in every namespace": (
        lambda s: client.AppsV1Api(s.api).list_deployment_for_all_namespaces(watch=True,
                                                                              timeout_seconds=1),
        'cannot watch resource "deployments" in API group "apps" at the cluster scope',
    ),
}  # fmt: skip


@pytest.mark.parametrize("action", list(SCOPED_RBAC_DENIALS))
async def test_with_watched_namespaces_rbac_refuses_workloads_elsewhere(
    action: str, scoped: Scoped
) -> None:
    call, expected = SCOPED_RBAC_DENIALS[action]
    status, message = await refusal(call(scoped))
    assert status == 403, message
    assert f'User "{scoped.account.username}" {expected.format(other=scoped.other)}' in message


async def test_with_watched_namespaces_the_policy_refuses_a_cost_elsewhere_where_rbac_allows(
    scoped: Scoped, kube: KubeTestCluster
) -> None:
    rbac = client.RbacAuthorizationV1Api(kube.api)
    policy = one(scoped.account.objects, "ValidatingAdmissionPolicy")["metadata"]["name"]
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    await rbac.create_namespaced_role(scoped.other, {"metadata": {"name": "wider"}, "rules": rules})
    await rbac.create_namespaced_role_binding(scoped.other, {
        "metadata": {"name": "wider"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "wider"},
        "subjects": [{"kind": "ServiceAccount", "name": scoped.account.name,
                      "namespace": scoped.namespace}],
    })  # fmt: skip
    try:
        refused: tuple[int, str] = (0, "")

        async def past_rbac() -> bool:
            nonlocal refused
            refused = await refusal(
                scoped.core.patch_namespaced_pod(scoped.other_pod, scoped.other, _cost_patch("5"))
            )
            return "cannot" not in refused[1]  # RBAC's "cannot patch": the role not in force yet

        await kube.wait_for(past_rbac, "the wider role in force", timeout=30)
        status, message = refused
        assert status == 403, message
        assert f"ValidatingAdmissionPolicy '{policy}'" in message
        watched = ", ".join(scoped.scope)
        assert f"podcost may write deletion costs only in the namespaces it watches: {watched}" in (
            message
        )
        other = await kube.core.read_namespaced_pod(scoped.other_pod, scoped.other)
        assert other.metadata.annotations[COST_ANNOTATION] == "10"
    finally:
        await rbac.delete_namespaced_role_binding("wider", scoped.other)
        await rbac.delete_namespaced_role("wider", scoped.other)


async def test_with_watched_namespaces_the_informer_lists_and_watches_that_namespace(
    scoped: Scoped, kube: KubeTestCluster
) -> None:
    kube_client = Kube(scoped.api)
    resources = (*WORKLOAD_RESOURCES, NAMESPACE)  # as the watcher with a namespace selector
    async with Informers(kube_client, resources, namespaces=scoped.scope) as informers:
        await informers.wait_synced()

        async def watching() -> bool:
            if informers.error is not None:
                raise informers.error
            return all(
                informer.stats(kind).watches >= 1
                for informer in informers.informers
                for kind in informer.kinds
            )

        await kube.wait_for(watching, "a watch of every resource", timeout=30)
        pods = {
            (pod["metadata"]["namespace"], pod["metadata"]["name"])
            for pod in informers.store.objects("Pod", None)
        }
        assert pods == {
            (scoped.watched, scoped.watched_pod), (scoped.watched, scoped.probe),
            *((scoped.second, pod) for pod in scoped.second_pods),
        }  # fmt: skip
        # Nodes once, cluster-wide; pods, ReplicaSets, Deployments once per watched namespace.
        assert [informer.kinds for informer in informers.informers] == [
            ("Node", "Namespace"),
            *[("Pod", "ReplicaSet", "Deployment")] * 2,
        ]
    # Every namespace, as a watcher without PODCOST_WATCHER_NAMESPACE would ask: refused for good.
    async with Informer(kube_client, WORKLOAD_RESOURCES) as everywhere:
        with pytest.raises(InformerFailed, match="HTTP 403"):
            await everywhere.wait_synced()


async def test_with_watched_namespaces_the_effective_permissions_are_scoped(
    scoped: Scoped, kube: KubeTestCluster, tmp_path: Path
) -> None:
    baseline = await _baseline(scoped, kube, tmp_path)
    watched = await _rules(scoped.api, scoped.watched)
    second = await _rules(scoped.api, scoped.second)
    release = await _rules(scoped.api, scoped.namespace)
    other = await _rules(scoped.api, scoped.other)
    cluster_wide = NODE_RULES | NAMESPACE_RULES  # this install sets watch.namespaceSelector
    assert watched - baseline == WORKLOAD_RULES | cluster_wide
    assert second - baseline == WORKLOAD_RULES | cluster_wide
    assert release - baseline == cluster_wide | lease_rules(scoped.lease)
    assert other - baseline == cluster_wide
    assert all("*" not in part for rule in watched | release | other for part in rule)


# --- what the chart renders for other values --------------------------------------------------


def _kinds(values: dict[str, str]) -> list[str]:
    return sorted(obj["kind"] for obj in render("podcost", "ops", values))


@pytest.mark.usefixtures("helm")
def test_the_chart_renders_rbac_and_policy_only_where_asked() -> None:
    everything = ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]  # fmt: skip
    assert _kinds({}) == everything
    single = {"watcher.replicaCount": "1", "embedded.replicaCount": "1"}
    assert _kinds({"leaderElection.enabled": "false", **single}) == sorted(
        set(everything) - {"Role", "RoleBinding"}
    )
    assert _kinds({"admissionPolicy.enabled": "false"}) == everything[:4]
    assert _kinds({"rbac.create": "false"}) == everything[4:]
    kafka = {"kafka.bootstrapServers": "kafka:9092"}
    assert (
        _kinds({"mode": "agent", "clusterName": "eu-1", **kafka}) == everything
    )  # the watcher and the annotator
    assert _kinds({"mode": "core", **kafka}) == []  # rankers and the aggregator never call it
    rendered = render("podcost", "ops", {"serviceAccount.name": "robot"})
    assert one(rendered, "ClusterRoleBinding")["subjects"] == [
        {"kind": "ServiceAccount", "name": "robot", "namespace": "ops"}
    ]
    condition = one(rendered, "ValidatingAdmissionPolicy")["spec"]["matchConditions"][0]
    expected = "request.userInfo.username == 'system:serviceaccount:ops:robot'"
    assert condition["expression"] == expected
    scoped = render("podcost", "ops", {"watch.namespace": "shop"})
    assert sorted(obj["kind"] for obj in scoped) == sorted(
        [*everything, "Role", "RoleBinding"]
    )  # the workloads' Role and binding, in the watched namespace
    assert {(obj["kind"], obj["metadata"].get("namespace")) for obj in scoped
            if obj["kind"] in ("Role", "RoleBinding")} == {
        ("Role", "shop"), ("RoleBinding", "shop"), ("Role", "ops"), ("RoleBinding", "ops")
    }  # fmt: skip
    # Namespaces are read (and granted) only to match watch.namespaceSelector.
    for values, resources in (
        ({}, ["nodes"]),
        ({"watch.namespaceSelector": "a=b"}, ["nodes", "namespaces"]),
    ):
        cluster_role = one(render("podcost", "ops", values), "ClusterRole")
        assert [r["resources"] for r in cluster_role["rules"] if r["apiGroups"] == [""]
                and "pods" not in r["resources"]] == [resources]  # fmt: skip
