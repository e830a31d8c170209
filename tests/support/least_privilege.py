"""podcost's RBAC and admission policy, from the Helm chart, on a real API server; and a client
that is podcost's service account and nothing more.

Used by ``tests/integration/test_least_privilege.py`` and
``tests/e2e/test_pipeline_least_privilege.py``. ``render`` runs the real helm (built by
``podcost_localinfra``) over ``deploy/helm/podcost``; ``install`` creates what it rendered with the
admin credentials, plus the service account; ``ServiceAccount.kubeconfig`` writes a kubeconfig
whose only credential is a token the TokenRequest API issued for that account, the way a pod's
projected token authenticates it in a cluster.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from podcost_localinfra.cluster import write_kubeconfig
from tests.support.kube import KubeTestCluster
from tests.support.tools import require_helm

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "podcost"
TEMPLATES = ("templates/rbac.yaml", "templates/admission-policy.yaml")

Object = dict[str, Any]


def render(
    release: str,
    namespace: str,
    values: Mapping[str, str] | None = None,
    templates: Sequence[str] = TEMPLATES,
) -> list[Object]:
    """The objects ``helm template --show-only`` renders from ``templates`` of the chart (one
    call per template: helm refuses to show a template that renders nothing, which is how the
    chart switches these off)."""
    helm = require_helm()
    # --set splits on commas: a list value ("a,b") keeps its commas escaped.
    settings = [arg for key, value in (values or {}).items()
                for arg in ("--set", f"{key}={value.replace(',', chr(92) + ',')}")]  # fmt: skip
    objects: list[Object] = []
    for template in templates:
        assert (CHART / template).is_file(), f"the chart has no {template}"
        argv = [str(helm), "template", release, str(CHART), "--namespace", namespace,
                "--show-only", template, *settings]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            if f"could not find template {template}" in result.stderr:
                continue  # it exists (checked above) and renders nothing with these values
            raise AssertionError(f"helm template failed: {result.stderr.strip()}")
        objects += [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return objects


def one(objects: Sequence[Object], kind: str) -> Object:
    """The only object of ``kind`` among ``objects``."""
    found = [obj for obj in objects if obj["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects rendered"
    return found[0]


def _creators(api: ApiClient) -> dict[str, Callable[[Object], Awaitable[Any]]]:
    rbac = client.RbacAuthorizationV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)

    def namespaced(create: Callable[[str, Object], Awaitable[Any]]) -> Callable[[Object], Any]:
        return lambda obj: create(obj["metadata"]["namespace"], obj)

    return {
        "ClusterRole": rbac.create_cluster_role,
        "ClusterRoleBinding": rbac.create_cluster_role_binding,
        "Role": namespaced(rbac.create_namespaced_role),
        "RoleBinding": namespaced(rbac.create_namespaced_role_binding),
        "ValidatingAdmissionPolicy": admission.create_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.create_validating_admission_policy_binding,
    }


def _deleters(api: ApiClient) -> dict[str, Callable[[Object], Awaitable[Any]]]:
    rbac = client.RbacAuthorizationV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)

    def named(delete: Callable[[str], Awaitable[Any]]) -> Callable[[Object], Any]:
        return lambda obj: delete(obj["metadata"]["name"])

    def namespaced(delete: Callable[[str, str], Awaitable[Any]]) -> Callable[[Object], Any]:
        return lambda obj: delete(obj["metadata"]["name"], obj["metadata"]["namespace"])

    return {
        "ClusterRole": named(rbac.delete_cluster_role),
        "ClusterRoleBinding": named(rbac.delete_cluster_role_binding),
        "Role": namespaced(rbac.delete_namespaced_role),
        "RoleBinding": namespaced(rbac.delete_namespaced_role_binding),
        "ValidatingAdmissionPolicy": named(admission.delete_validating_admission_policy),
        "ValidatingAdmissionPolicyBinding": named(
            admission.delete_validating_admission_policy_binding
        ),
    }


@dataclass
class ServiceAccount:
    """podcost's service account, installed with the chart's RBAC and admission policy."""

    namespace: str
    name: str
    objects: list[Object]
    admin: ApiClient
    admin_kubeconfig: Path
    _installed: list[Object] = field(default_factory=list)

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @property
    def lease(self) -> str:
        """The watcher's Lease, the one name the leader-election Role may read and renew."""
        names: list[str] = next(
            rule["resourceNames"]
            for role in self.objects
            if role["kind"] == "Role"
            for rule in role["rules"]
            if "leases" in rule["resources"] and "resourceNames" in rule
        )
        return names[0]

    async def token(self, seconds: int = 3600) -> str:
        """A bound token for the account from the TokenRequest API (``serviceaccounts/token``)."""
        issued = await client.CoreV1Api(self.admin).create_namespaced_service_account_token(
            self.name, self.namespace, {"spec": {"expirationSeconds": seconds}}
        )
        token: str = issued.status.token
        return token

    async def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig at ``path`` whose only credential is a token of the account: the
        admin kubeconfig's server and CA, nothing else of it."""
        admin = yaml.safe_load(self.admin_kubeconfig.read_text())
        cluster = admin["clusters"][0]["cluster"]
        write_kubeconfig(
            path, cluster["server"], Path(cluster["certificate-authority"]),
            await self.token(), self.name,
        )  # fmt: skip
        return path

    def granted(self) -> list[dict[str, str]]:
        """Every (verb, group, resource, name, namespace) the rendered roles grant, as
        SubjectAccessReview resource attributes."""
        granted = []
        for role in self.objects:
            if role["kind"] not in ("ClusterRole", "Role"):
                continue
            namespace = role["metadata"].get("namespace", self.namespace)
            for rule in role["rules"]:
                names = rule.get("resourceNames", [""])
                for group, resource, verb, name in product(
                    rule["apiGroups"], rule["resources"], rule["verbs"], names
                ):
                    granted.append(
                        {"verb": verb, "group": group, "resource": resource, "name": name,
                         "namespace": namespace}
                    )  # fmt: skip
        return granted

    async def wait_authorized(self, timeout: float = 30) -> None:
        """Wait until the API server's authorizer has every binding: each rendered grant is
        allowed to the account (SubjectAccessReview, asked as the admin)."""
        reviews = client.AuthorizationV1Api(self.admin)
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{self.namespace}",
                  "system:authenticated"]  # fmt: skip

        async def allowed() -> bool:
            for attributes in self.granted():
                spec = {"user": self.username, "groups": groups, "resourceAttributes": attributes}
                review = await reviews.create_subject_access_review({"spec": spec})
                if not review.status.allowed:
                    return False
            return True

        await KubeTestCluster.wait_for(allowed, f"the bindings of {self.username}", timeout)

    async def uninstall(self) -> None:
        """Delete what ``install`` created (the namespaced objects go with their namespace)."""
        deleters = _deleters(self.admin)
        for obj in reversed(self._installed):
            try:
                await deleters[obj["kind"]](obj)
            except ApiException as error:
                if error.status != 404:
                    raise
        self._installed.clear()


async def install(
    admin: ApiClient,
    admin_kubeconfig: Path,
    namespace: str,
    values: Mapping[str, str] | None = None,
    release: str | None = None,
) -> ServiceAccount:
    """Render the chart's RBAC and admission policy for ``release`` (a fresh one by default)
    in ``namespace``, create the service account its bindings name and every rendered object,
    as the admin."""
    release = release or f"lp{uuid.uuid4().hex[:6]}"
    objects = render(release, namespace, values)
    subject = one(objects, "ClusterRoleBinding")["subjects"][0]
    account = ServiceAccount(namespace, subject["name"], objects, admin, admin_kubeconfig)
    await client.CoreV1Api(admin).create_namespaced_service_account(
        namespace, {"metadata": {"name": account.name}}
    )
    creators = _creators(admin)
    try:
        for obj in objects:
            await creators[obj["kind"]](obj)
            account._installed.append(obj)
        await account.wait_authorized()
    except BaseException:
        await account.uninstall()
        raise
    return account
