"""podcost's service account, with only the chart's RBAC and admission policy, against the real
kube-apiserver: it can do what the services do and nothing else.

The chart's ``templates/rbac.yaml`` and ``templates/admission-policy.yaml`` are rendered by the
real helm and created with the admin credentials; every request below is then made with a token
the TokenRequest API issued for the service account, and nothing else. What the services call
is allowed: the informer's list and watch of pods, nodes, ReplicaSets and Deployments, the
annotator's read and compare-and-swap patch of the deletion cost, ``podcost cleanup``'s list and
guarded removal of it (the uninstall hook), the leader election's Lease.
Anything else is refused: by RBAC (delete or create a pod, secrets, nodes, subresources, events)
or, for a patch RBAC must allow, by the admission policy (labels, other annotations, spec, owner
references, finalizers). The effective permissions are read back with SelfSubjectRulesReview and
must be exactly the list the chart promises, with no wildcard.
"""

from __future__ import annotations

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
from podcost.annotator.settings import AnnotatorSettings
from podcost_kube.client import Kube, KubeError
from podcost_kube.informer import WORKLOAD_RESOURCES, Informer
from podcost_kube.leader import KubeLeases

pytestmark = pytest.mark.integration

#: The permissions the chart promises, as (API group, resource, verb, resource name) rules.
CLUSTER_RULES = {
    *(("", "pods", verb, "") for verb in ("get", "list", "watch", "patch")),
    *(("", resource, verb, "") for resource in ("nodes", "namespaces")
      for verb in ("get", "list", "watch")),
    *(("apps", resource, verb, "") for resource in ("replicasets", "deployments")
      for verb in ("get", "list", "watch")),
}  # fmt: skip

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

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def lease(self) -> str:
        return self.account.lease


def _pod(name: str) -> dict[str, Any]:
    """A pod that is never scheduled (a scheduling gate), so nothing but the test changes it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "lp"},
                     "annotations": {"team": "checkout", COST_ANNOTATION: "10"}},
        "spec": {
            "schedulingGates": [{"name": "podcost.dev/never"}],
            "containers": [{"name": "app", "image": "registry.local/podcost/app:1"}],
            "terminationGracePeriodSeconds": 0,
        },
    }  # fmt: skip


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
        for name in ("target", "probe"):
            await kube.core.create_namespaced_pod(namespace, _pod(name))
        path = await account.kubeconfig(tmp_path_factory.mktemp("sa") / "kubeconfig")
        api = await config.new_client_from_config(config_file=str(path))
        async with api:
            ready = Installed(account, api, namespace, "target")
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
                "probe", installed.namespace, {"metadata": {"labels": {"probe": uuid.uuid4().hex}}}
            )
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
    for value in ("5", "-2147483648", "2147483647", "0", None):
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


async def test_the_effective_permissions_are_exactly_the_charts_with_no_wildcard(
    installed: Installed, kube: KubeTestCluster, tmp_path: Path
) -> None:
    # What every authenticated user may do (self reviews), learnt from an account bound to
    # nothing, is not podcost's doing; everything else must be the chart's list.
    nobody = ServiceAccount(installed.namespace, "nobody", [], kube.api,
                            installed.account.admin_kubeconfig)  # fmt: skip
    await kube.core.create_namespaced_service_account(
        installed.namespace, {"metadata": {"name": "nobody"}}
    )
    path = await nobody.kubeconfig(tmp_path / "nobody")
    async with await config.new_client_from_config(config_file=str(path)) as nobody_api:
        baseline = await _rules(nobody_api, installed.namespace)

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


# --- what the chart renders for other values --------------------------------------------------


def _kinds(values: dict[str, str]) -> list[str]:
    return sorted(obj["kind"] for obj in render("podcost", "ops", values))


@pytest.mark.usefixtures("helm")
def test_the_chart_renders_rbac_and_policy_only_where_asked() -> None:
    everything = ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]  # fmt: skip
    assert _kinds({}) == everything
    assert _kinds({"leaderElection.enabled": "false"}) == sorted(
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
