"""The Kubernetes adapter: the only module of podcost that imports kubernetes-asyncio.

Services and commands call it to reach a cluster; what comes back is the raw JSON the API serves
(the shapes ``kubectl get -o json`` prints), which ``podcost_core.tomodel`` turns into the model,
so no client-library object ever reaches the core. Cluster access follows every Kubernetes tool:
``$KUBECONFIG`` (or ``~/.kube/config``), else the in-cluster service account.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from podcost_core.model import DELETION_COST_ANNOTATION, FIELD_MANAGER

JSON = dict[str, Any]


class KubeError(RuntimeError):
    """The cluster could not be reached or refused a request.

    ``retriable`` says what happens next: a retriable error (409, 429, 5xx, a timeout, an
    unreachable server) is tried again with backoff by the caller; any other is permanent for
    this request. ``retry_after`` is the wait in seconds the server asked for (its
    ``Retry-After`` header, sent with 429 and some 5xx), ``None`` when it asked for none.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retriable: bool = False,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.retriable = retriable
        self.retry_after = retry_after


class PodGone(KubeError):
    """The pod no longer exists (404): skip it, it is nothing to retry."""


class CostChanged(KubeError):
    """A conditional cost write found the pod no longer as it was read (another pod under its
    name, or another deletion cost on it): nothing was written; read it again and decide again."""


def _pointer_token(key: str) -> str:
    # RFC 6901: "~" is written "~0" and "/" is written "~1" inside a JSON pointer.
    return key.replace("~", "~0").replace("/", "~1")


#: The JSON pointer of the deletion-cost annotation, for JSON patches.
_COST_POINTER = f"/metadata/annotations/{_pointer_token(DELETION_COST_ANNOTATION)}"
_JSON_PATCH = "application/json-patch+json"
#: The query of every write: podcost's field manager owns what it sets.
_AS_PODCOST = (("fieldManager", FIELD_MANAGER),)


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def _error(error: ApiException, what: str) -> KubeError:
    status = int(error.status or 0)
    reason = error.reason or "error"
    if status == 404:
        return PodGone(f"{what}: not found", status=status)
    retriable = status in (409, 429) or status >= 500 or status == 0
    return KubeError(
        f"{what}: HTTP {status} {reason}",
        status=status,
        retriable=retriable,
        retry_after=_retry_after(error),
    )


def _status_message(body: str) -> str:
    """The message of a ``Status`` body (empty when it is not one)."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return ""
    return str(decoded.get("message") or "") if isinstance(decoded, dict) else ""


def _retry_after(error: ApiException) -> float | None:
    # Only the delay-seconds form: the API server never sends an HTTP date here.
    headers = getattr(error, "headers", None)
    raw = headers.get("Retry-After") if headers else None
    try:
        seconds = float(raw) if raw is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _has_causes(error: ApiException) -> bool:
    try:
        status = json.loads(error.body or b"{}")
    except ValueError:
        return False
    details = status.get("details") if isinstance(status, dict) else None
    return isinstance(details, dict) and bool(details.get("causes"))


async def _json_response(response: Any) -> JSON:
    """The JSON body of the ``aiohttp`` response that a call with ``_preload_content=False``
    returns (the client types it as the model it would have built); ``ApiException``, as the
    client raises it, for a status outside 2xx."""
    try:
        body = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = body.decode("utf-8", "replace")
        error.headers = response.headers
        raise error
    decoded: JSON = json.loads(body)
    return decoded


def _unreachable(error: BaseException, what: str) -> KubeError:
    # No answer at all (connection refused or reset, the client's timeout): worth another try.
    return KubeError(f"{what}: {type(error).__name__}: {error}", retriable=True)


@dataclass(frozen=True)
class Kube:
    """A connected API client; build one with ``connect``."""

    api: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
    ) -> JSON:
        """One request answered with the API's JSON, through the client's connection, auth and
        retries but not its generated API classes: ``core_v1_api`` alone is some 30 000 lines
        to import (a few tenths of a second on the first write after a start), and the calls
        that take and return plain JSON need none of it. ``ApiException`` as the client raises
        it for a status outside 2xx."""
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        response = await self.api.call_api(
            path,
            method,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
        )
        return await _json_response(response)

    def to_json(self, obj: Any) -> JSON:
        """A client-library object as the API's JSON."""
        raw: JSON = self.api.sanitize_for_serialization(obj)
        return raw

    async def dump(self, namespace: str | None = None) -> JSON:
        """Pods, nodes, ReplicaSets and Deployments as one ``List``, like
        ``kubectl get pods,nodes,replicasets,deployments -A -o json``."""
        core, apps = self.core, self.apps
        try:
            if namespace:
                listed = await asyncio.gather(
                    core.list_namespaced_pod(namespace),
                    core.list_node(),
                    apps.list_namespaced_replica_set(namespace),
                    apps.list_namespaced_deployment(namespace),
                )
            else:
                listed = await asyncio.gather(
                    core.list_pod_for_all_namespaces(),
                    core.list_node(),
                    apps.list_replica_set_for_all_namespaces(),
                    apps.list_deployment_for_all_namespaces(),
                )
        except ApiException as error:
            raise _error(error, "listing the cluster's objects") from error
        kinds = ("Pod", "Node", "ReplicaSet", "Deployment")
        items: list[JSON] = []
        for kind, result in zip(kinds, listed, strict=True):
            api_version = "apps/v1" if kind in ("ReplicaSet", "Deployment") else "v1"
            for item in self.to_json(result)["items"]:
                items.append({"apiVersion": api_version, "kind": kind, **item})
        return {"apiVersion": "v1", "kind": "List", "items": items}

    async def read_pod(self, namespace: str, name: str) -> JSON:
        """One pod as the API holds it now, with its annotations and managed fields.

        ``PodGone`` if there is no such pod. The annotator reads a pod before it writes its
        cost, to see the value and who set it, and hands the JSON to
        ``patch_deletion_cost_if_unchanged``.
        """
        what = f"reading pod {namespace}/{name}"
        try:
            # Raw JSON: building a V1Pod and serialising it back costs more than the request.
            return await self._request("GET", _pod_path(namespace, name))
        except ApiException as error:
            raise _error(error, what) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error

    async def get_through_service(
        self, namespace: str, service: str, port: str, path: str
    ) -> JSON | None:
        """GET ``path`` of a Service's endpoint through the API server's proxy
        (``/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy{path}``), as ``kubectl
        proxy`` reaches it: with the user's own credentials, which need ``get`` on
        ``services/proxy``. The backend's JSON answer, ``None`` when the backend answered 404;
        ``KubeError`` when the API server refused or found no such Service or no endpoint."""
        what = f"GET {path} of service {namespace}/{service}:{port} through the API server"
        proxy = (
            f"/api/v1/namespaces/{quote(namespace, safe='')}/services/"
            f"{quote(service, safe='')}:{quote(port, safe='')}/proxy{path}"
        )
        try:
            return await self._request("GET", proxy)
        except ApiException as error:
            body = str(error.body or "")
            # The API server's own refusals are Status objects; the backend's 404 is not.
            if error.status == 404 and '"kind":"Status"' not in body.replace(" ", ""):
                return None
            raise KubeError(
                f"{what}: HTTP {error.status} {_status_message(body) or error.reason}",
                status=int(error.status or 0),
            ) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error

    async def create_event(self, namespace: str, body: JSON) -> JSON:
        """Create an ``events.k8s.io/v1`` Event (``podcost_kube.events`` builds it)."""
        what = f"creating event {namespace}/{body['metadata']['name']}"
        path = f"/apis/events.k8s.io/v1/namespaces/{quote(namespace, safe='')}/events"
        try:
            return await self._request("POST", path, body=body)
        except ApiException as error:
            raise _error(error, what) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error

    async def patch_event(self, namespace: str, name: str, patch: JSON) -> JSON:
        """Merge-patch an Event (a series' count and last time)."""
        what = f"patching event {namespace}/{name}"
        path = (
            f"/apis/events.k8s.io/v1/namespaces/{quote(namespace, safe='')}"
            f"/events/{quote(name, safe='')}"
        )
        try:
            return await self._request(
                "PATCH", path, body=patch, content_type="application/merge-patch+json"
            )
        except ApiException as error:
            raise _error(error, what) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error

    async def patch_deletion_cost(self, namespace: str, pod: str, cost: int | None) -> JSON:
        """Set (or with ``None`` remove) the deletion cost of one pod, as podcost's field manager.

        One annotation per request, as a patch of that one key, so that the managed fields show
        which manager owns the value and nothing else on the pod is touched.
        """
        body = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: _cost_value(cost)}}}
        what = f"patching {namespace}/{pod}"
        try:
            patched = await self.core.patch_namespaced_pod(
                pod,
                namespace,
                body,
                field_manager=FIELD_MANAGER,
            )
        except ApiException as error:
            raise _error(error, what) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error
        return self.to_json(patched)

    async def patch_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, cost: int, *, seen: Mapping[str, Any]
    ) -> JSON:
        """Set the deletion cost of one pod as podcost's field manager, only if the pod is still
        the one in ``seen`` (its JSON as read) and still carries the deletion cost it had then.

        A compare-and-swap on that one annotation: a JSON patch whose ``test`` operations the
        API server checks on the object it writes, so a cost someone sets after the read is never
        overwritten, while changes to anything else on the pod (its status, as a new pod goes
        Ready) do not get in the way as a ``resourceVersion`` precondition would. Raises
        ``CostChanged`` if the test fails (read again and decide again), ``PodGone`` on 404.
        """
        meta = seen.get("metadata") or {}
        annotations = meta.get("annotations")
        value = str(cost)
        ops: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")}]
        if annotations is None:  # the API omits an empty map: the pod had no annotations
            ops.append({"op": "test", "path": "/metadata/annotations", "value": None})
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {DELETION_COST_ANNOTATION: value},
                }
            )
        else:
            # ``test`` with null passes exactly when the key is absent (evanphx/json-patch).
            current = annotations.get(DELETION_COST_ANNOTATION)
            ops.append({"op": "test", "path": _COST_POINTER, "value": current})
            ops.append({"op": "add", "path": _COST_POINTER, "value": value})
        return await self._patch_if_unchanged(namespace, pod, ops, f"patching {namespace}/{pod}")

    async def list_pods(self, namespace: str | None = None) -> list[JSON]:
        """Every pod of ``namespace`` (``None``: of the cluster) as the API serves it, with its
        annotations and managed fields (``podcost cleanup`` reads who set each cost)."""
        what = f"listing the pods of {namespace or 'every namespace'}"
        try:
            path = (
                f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
                if namespace
                else "/api/v1/pods"
            )
            items: list[JSON] = (await self._request("GET", path)).get("items") or []
            return items
        except ApiException as error:
            raise _error(error, what) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error

    async def remove_deletion_cost_if_unchanged(
        self, namespace: str, pod: str, *, seen: Mapping[str, Any]
    ) -> JSON:
        """Remove the deletion cost of one pod, as podcost's field manager, only if the pod is
        still the one in ``seen`` and still carries the very value it had then.

        The same compare-and-swap as :meth:`patch_deletion_cost_if_unchanged`: a JSON patch that
        ``test``s the uid and the value before it ``remove``s the annotation, so a cost someone
        set after the read is never removed. ``CostChanged`` if a test fails (nothing removed),
        ``PodGone`` on 404.
        """
        meta = seen.get("metadata") or {}
        current = (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION)
        ops: list[JSON] = [
            {"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
            {"op": "test", "path": _COST_POINTER, "value": current},
            {"op": "remove", "path": _COST_POINTER},
        ]
        what = f"removing the deletion cost of {namespace}/{pod}"
        return await self._patch_if_unchanged(namespace, pod, ops, what)

    async def _patch_if_unchanged(
        self, namespace: str, pod: str, ops: list[JSON], what: str
    ) -> JSON:
        """Send a JSON patch whose ``test`` operations make it a compare-and-swap, as podcost's
        field manager; ``CostChanged`` when a test fails."""
        try:
            return await self._request(
                "PATCH", _pod_path(namespace, pod), query=_AS_PODCOST, body=ops,
                content_type=_JSON_PATCH,
            )  # fmt: skip
        except ApiException as error:
            if error.status == 422 and not _has_causes(error):
                # A failed ``test`` is a bare 422 Invalid; a real validation error names causes.
                raise CostChanged(
                    f"{what}: the pod or its deletion cost changed since it was read",
                    status=422,
                    retriable=True,
                ) from error
            raise _error(error, what) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _unreachable(error, what) from error

    async def scale(self, namespace: str, kind: str, name: str, replicas: int) -> None:
        """Set ``spec.replicas`` of a Deployment or ReplicaSet through its scale subresource."""
        body = {"spec": {"replicas": replicas}}
        try:
            if kind == "Deployment":
                await self.apps.patch_namespaced_deployment_scale(name, namespace, body)
            else:
                await self.apps.patch_namespaced_replica_set_scale(name, namespace, body)
        except ApiException as error:
            raise _error(error, f"scaling {kind} {namespace}/{name}") from error

    async def create(self, objects: Sequence[Mapping[str, Any]]) -> None:
        """Create nodes, namespaces and Deployments (what the demo sets up); existing ones stay."""
        for obj in objects:
            kind, meta = obj["kind"], obj["metadata"]
            body: Any = dict(obj)  # the client accepts plain JSON bodies
            try:
                if kind == "Node":
                    await self.core.create_node(body)
                elif kind == "Namespace":
                    await self.core.create_namespace(body)
                elif kind == "Deployment":
                    await self.apps.create_namespaced_deployment(meta["namespace"], body)
                else:
                    raise KubeError(f"cannot create a {kind}")
            except ApiException as error:
                if error.status != 409:
                    raise _error(error, f"creating {kind} {meta['name']}") from error


_DEFAULT_KUBECONFIG = Path.home() / ".kube" / "config"


def _cost_value(cost: int | None) -> str | None:
    return None if cost is None else str(cost)


@asynccontextmanager
async def connect(kubeconfig: str | None = None, context: str | None = None) -> AsyncIterator[Kube]:
    """Connect with ``kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config`` or in-cluster config;
    ``context``: the kubeconfig's context to use (default: its current one)."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    try:
        if path or _DEFAULT_KUBECONFIG.exists():
            api = await config.new_client_from_config(config_file=path, context=context)
        elif context is not None:
            raise KubeError(f"no kubeconfig holds context {context!r}")
        else:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            api = client.ApiClient()
    except (ConfigException, OSError) as error:
        raise KubeError(f"no cluster access: {error}") from error
    async with api:
        yield Kube(api)
