"""List and watch Kubernetes objects into a :class:`~podcost_kube.store.Store`: the informer.

The watcher service runs :class:`Informers` over pods, nodes, ReplicaSets and Deployments
(optionally namespaces, or any other resource, e.g. a CRD): one :class:`Informer` for every
namespace, or with a list of namespaces one for the cluster-scoped resources and one per
namespace, all over one store. It subscribes a handler that turns each
:class:`~podcost_kube.store.Change` into the workloads it touches (``podcost_kube.workloads``).

What it does, per resource, as client-go's reflector does:

- list (paged, most recent state) into the store, then watch from the list's resourceVersion
  with ``allowWatchBookmarks``; every event moves the resourceVersion on, a BOOKMARK only moves
  the resourceVersion (it never reaches the store or the handlers);
- when the server ends a watch (its ``timeoutSeconds``), watch again from the last version;
- on 410 Gone (the version was compacted away) relist at once; the relist replaces the store's
  content and reports only what changed meanwhile, so no object is lost or spuriously deleted;
- on any other watch or list error, back off (podcost's one retry policy,
  ``podcost_core.backoff``: exponential, full jitter, capped, and at least as long as the
  server's ``retryAfterSeconds``) and relist; after
  ``Backoff.max_failures`` failures in a row, or at once on a permanent error (401, 403, 404), the
  informer fails: :meth:`Informer.wait_synced` and :meth:`Informer.join` raise
  :class:`InformerFailed` naming the resource. A service sets ``max_failures=None``
  (:data:`SERVICE_BACKOFF`): an API server outage, however long, is waited out and followed by a
  relist, never a failure; :meth:`Informer.failing_for` says how long it has lasted so far, for
  readiness.

Objects stay raw JSON from the socket to the store: responses are read with
``_preload_content=False`` and parsed with ``orjson.loads`` (twice ``json.loads``' speed, and
its cache of keys shares one string per key name across objects), never deserialised into
client-library models (``tests/bench/bench_informer.py`` measures why). A watch line of whole
pods, the stream that never rests, is decoded only as far as the store keeps the pod
(``podcost_core.projection.decode_pod_line``: the rest is skipped unread), compared as it is
with the version the store holds, and kept next to it only if it changes something, taking its
unchanged parts (``keep_pod``); an update that changes nothing the store keeps is no change and
costs a comparison (``Store.apply``), a deletion keeps nothing: ``tests/bench/bench_watcher.py``
measures the watcher's whole path per event against ``orjson.loads`` of the same lines. Of
each object's ``managedFields`` the store keeps only who owns the deletion cost
(``podcost_core.projection.slim_managed_fields``), as client-go informers are told to drop them with
a transform: all podcost reads of them, and a third of a pod's JSON (more of a node's). Of a pod
it keeps only the fields podcost reads, with its repeated strings interned and its parts equal
to other pods' (labels, owner, containers, tolerations, conditions...) shared with them
(``podcost_core.projection.project_pod``): most of a pod's spec and status is read by nothing. Of
a node it keeps all but the status fields nothing reads (``project_node``: of its status only
the allocatable resources), of a ReplicaSet or a Deployment all but its pod template, kept as a
digest that tells templates apart, and its well-formed conditions (``project_workload``): 0.4 KB
a pod less at 30 pods a node and a Deployment (``tests/bench/bench_store_memory.py``).
Handlers run synchronously in the informer's task, after the store has been updated, and must be
quick; a handler that raises fails the informer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from podcost_core.backoff import Backoff
from podcost_core.projection import (
    SharedParts,
    decode_pod_line,
    keep_pod,
    project_node,
    project_pod,
    project_workload,
    slim_decoded_pod,
    slim_managed_fields,
)
from podcost_kube.client import Kube, KubeError
from podcost_kube.store import (
    Change,
    ChangeType,
    RawObject,
    Store,
    resource_version,
)

log = logging.getLogger(__name__)

Handler = Callable[[Change], None]
"""Called with every change of the store, after it is applied."""


@dataclass(frozen=True, slots=True)
class Resource:
    """A kind of object the informer lists and watches."""

    kind: str
    """The object kind, e.g. ``Pod``; the store's first key."""
    api_version: str
    """``v1`` for the core group, else ``group/version``."""
    plural: str
    """The resource name in URLs, e.g. ``pods``."""
    namespaced: bool = True
    metadata_only: bool = False
    """List and watch only the objects' metadata (``PartialObjectMetadata``, as client-go's
    metadata informers do): the API server leaves out the spec and the status, and the store
    keeps the metadata under the resource's own kind and apiVersion. For a reader of owners,
    labels and annotations only (the annotator's view): a kwok pod's watch line is half the
    bytes, and decoding and keeping it about half the CPU (``tests/bench/bench_watch_path``)."""

    def accept(self, *, watch: bool) -> str:
        """The ``Accept`` header of a list (``watch`` false) or a watch of the resource. A
        metadata-only one falls back to whole objects from a server that cannot convert them,
        which the store keeps the same way, only larger."""
        if not self.metadata_only:
            return "application/json"
        partial = "PartialObjectMetadata" if watch else "PartialObjectMetadataList"
        return f"application/json;as={partial};g=meta.k8s.io;v=v1,application/json"

    def typed(self, obj: RawObject) -> RawObject:
        """``obj`` under the resource's kind and apiVersion: a metadata-only object comes as a
        ``meta.k8s.io/v1`` ``PartialObjectMetadata``, and list items come without either."""
        if self.metadata_only:
            obj["apiVersion"] = self.api_version
            obj["kind"] = self.kind
        else:
            # List items come without their kind; the store keeps them as kubectl prints them.
            obj.setdefault("apiVersion", self.api_version)
            obj.setdefault("kind", self.kind)
        return obj

    def path(self, namespace: str | None = None) -> str:
        """The collection URL, in one namespace when given (and the kind is namespaced)."""
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"


POD = Resource("Pod", "v1", "pods")
NODE = Resource("Node", "v1", "nodes", namespaced=False)
REPLICASET = Resource("ReplicaSet", "apps/v1", "replicasets")
DEPLOYMENT = Resource("Deployment", "apps/v1", "deployments")
NAMESPACE = Resource("Namespace", "v1", "namespaces", namespaced=False)
#: What the watcher needs to build workload snapshots.
WORKLOAD_RESOURCES: tuple[Resource, ...] = (POD, NODE, REPLICASET, DEPLOYMENT)


# --- errors, named by what happens next ------------------------------------------------------


class ResourceExpired(KubeError):
    """410 Gone: the resourceVersion is too old to watch from. Relist now."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=410, retriable=True)


#: Objects per list page. Each page is parsed whole (every field of every pod, about 13 KB of
#: Python objects a kwok pod) before what is kept of it is: the allocator's arenas that peak
#: leaves are not given back, so a smaller page leaves less (250 rather than 500: 0.2 KB a pod
#: less at 10,000 pods; 100 rather than 250: 0.4 KB a pod less of arenas in a relist of 10,000
#: kwok-like pods without a cluster) for more requests (a list of 10,000 pods: 100).
PAGE_SIZE = 100


def _kept(kind: str, obj: RawObject, shared: SharedParts) -> RawObject:
    """What the store keeps of ``obj``: without the managedFields nobody reads, and of a pod
    only what podcost reads, its parts equal to other pods' shared with them
    (``podcost_core.projection.project_pod``); of a node all but the status fields nothing reads
    (``project_node``), of a ReplicaSet or a Deployment all but its pod template, kept as a
    digest, and its well-formed status conditions (``project_workload``)."""
    slim = slim_managed_fields(obj)
    if kind == POD.kind:
        return project_pod(slim, shared)
    if kind == NODE.kind:
        return project_node(slim, shared)
    if kind in (REPLICASET.kind, DEPLOYMENT.kind):
        return project_workload(slim, shared)
    return slim


class InformerFailed(RuntimeError):
    """The informer stopped for good: a permanent error, too many failures in a row, or a handler
    that raised. ``kind`` names the resource it happened on."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def _status_error(status: Mapping[str, Any], what: str) -> KubeError:
    """The error a ``Status`` object (an error response or an ERROR watch event) stands for."""
    code = int(status.get("code") or 0)
    message = f"{what}: HTTP {code} {status.get('reason', '')}: {status.get('message', '')}"
    if code == 410:
        return ResourceExpired(message)
    # 401, 403, 404, 400, 422: asking again will not help.
    permanent = code in (400, 401, 403, 404, 405, 406, 422)
    details = status.get("details")
    retry_after = details.get("retryAfterSeconds") if isinstance(details, Mapping) else None
    return KubeError(
        message,
        status=code,
        retriable=not permanent,
        retry_after=float(retry_after) if isinstance(retry_after, int | float) else None,
    )


# --- watch events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One decoded line of a watch stream: ADDED, MODIFIED, DELETED or BOOKMARK."""

    type: str
    obj: RawObject
    partial: bool = False
    """``obj`` holds only what the store keeps of the object, as ``decode_pod_line`` decodes a
    pod (``apply_event`` keeps it with ``keep_pod``); else it is the whole object."""

    @property
    def resource_version(self) -> str:
        return resource_version(self.obj)


#: The event types a watch line that is not an error carries.
EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


def decode_event(
    line: bytes | str, what: str = "watch", resource: Resource | None = None
) -> WatchEvent:
    """Decode one watch line; an ERROR event raises the error it carries
    (:class:`ResourceExpired` for 410), a malformed line a retriable :class:`KubeError`.

    A line of a watch of whole pods (``resource``) is decoded only as far as the store keeps the
    pod (``podcost_core.projection.decode_pod_line``, a :attr:`WatchEvent.partial` event): the
    rest of the line is skipped unread. A line that decoder refuses (an ERROR event's
    ``Status``, a malformed line or pod) is decoded whole, as any other kind's."""
    if resource is not None and resource.kind == POD.kind and not resource.metadata_only:
        decoded = decode_pod_line(line)
        if decoded is not None:
            kind_of_event, kept = decoded
            if kind_of_event in EVENT_TYPES and resource_version(kept):
                return WatchEvent(kind_of_event, kept, partial=True)
    try:
        event = orjson.loads(line)
    except ValueError as error:
        raise KubeError(f"{what}: undecodable watch line: {error}", retriable=True) from None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise KubeError(f"{what}: watch line without an object: {str(line)[:200]}", retriable=True)
    event_type = event.get("type")
    obj: RawObject = event["object"]
    if event_type == "ERROR":
        raise _status_error(obj, what)
    if event_type not in EVENT_TYPES:
        raise KubeError(f"{what}: unknown watch event type {event_type!r}", retriable=True)
    if not resource_version(obj):
        raise KubeError(f"{what}: {event_type} event without a resourceVersion", retriable=True)
    return WatchEvent(event_type, obj)


#: Each change type by its name (a lookup, not an ``Enum`` call per event).
_CHANGE_TYPES: dict[str, ChangeType] = {change.value: change for change in ChangeType}


def apply_event(
    store: Store, resource: Resource, event: WatchEvent, shared: SharedParts
) -> Change | None:
    """What an informer of ``resource`` does with a watch event (not a bookmark): keep what
    podcost reads of the object (under the resource's kind, :meth:`Resource.typed`; projected,
    its parts shared through ``shared``; a :attr:`WatchEvent.partial` pod kept next to the
    version the store holds, ``keep_pod``) in ``store``; the change, if any, goes to the
    informer's handlers. The benchmarks feed synthetic watch lines through this too."""
    kind = resource.kind
    obj = resource.typed(event.obj)
    if event.partial:
        change_type = _CHANGE_TYPES[event.type]
        if change_type is ChangeType.DELETED:
            # Nothing of the deleted version is kept: the store drops the one it holds.
            return store.apply(kind, change_type, obj)
        # Compared as it is with the version held (slimmed, it equals what would be kept of
        # it), and kept only if it changes something, next to that version: the parts it did
        # not change are taken from it.
        slim_decoded_pod(obj)

        def keep(pod: RawObject, held: RawObject | None) -> RawObject:
            return keep_pod(pod, held, shared, slimmed=True)

        return store.apply(kind, change_type, obj, keep=keep)
    return store.apply(kind, _CHANGE_TYPES[event.type], _kept(kind, obj, shared))


# --- backoff -----------------------------------------------------------------------------------


#: What a one-off caller uses: the one retry policy (``podcost_core.backoff``), giving up after
#: ten failures in a row.
DEFAULT_BACKOFF = Backoff(max_failures=10)


#: What a long-running service uses unless it passes its own (``ServiceSettings.backoff``):
#: retriable failures never end the informer, however many.
SERVICE_BACKOFF = Backoff()


# --- the informer ------------------------------------------------------------------------------


@dataclass(slots=True)
class ResourceStats:
    """Counters of one resource's list/watch loop (for metrics and tests)."""

    lists: int = 0
    """Complete lists, the first one included."""
    pages: int = 0
    watches: int = 0
    """Watch requests made."""
    events: int = 0
    """ADDED/MODIFIED/DELETED events received (duplicates included)."""
    bookmarks: int = 0
    expired: int = 0
    """410 Gone answers."""
    errors: int = 0
    """Other failures (each followed by a backoff and a relist)."""
    last_error: str = ""


@dataclass(slots=True)
class _State:
    resource: Resource
    stats: ResourceStats = field(default_factory=ResourceStats)
    resource_version: str | None = None
    """Where the next watch starts; ``None``: list first."""
    synced: bool = False
    failures: int = 0
    failing_since: float | None = None
    """``time.monotonic()`` of the first failure since the server last answered a request."""
    rewatch_from: str | None = None
    response: aiohttp.ClientResponse | None = None


class Informer:
    """Lists and watches ``resources`` into :attr:`store`; calls handlers with every change.

    Use as ``async with Informer(kube) as informer: await informer.wait_synced()``; leaving the
    block stops every task and closes every connection. ``namespace`` and ``label_selector``
    restrict the namespaced resources; cluster-scoped ones (nodes, namespaces) are always whole.
    """

    def __init__(
        self,
        kube: Kube,
        resources: Sequence[Resource] = WORKLOAD_RESOURCES,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        store: Store | None = None,
        handlers: Iterable[Handler] = (),
        page_size: int = PAGE_SIZE,
        watch_timeout: float = 300.0,
        request_timeout: float = 60.0,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        kinds = [resource.kind for resource in resources]
        if not kinds or len(set(kinds)) != len(kinds):
            raise ValueError(f"an informer needs distinct resources, got {kinds}")
        if watch_timeout < 1:
            raise ValueError("watch_timeout must be at least one second")
        self.kube = kube
        self.store = store if store is not None else Store()
        self.namespace = namespace
        self.label_selector = label_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.request_timeout = request_timeout
        self.backoff = backoff or DEFAULT_BACKOFF
        self._sleep = sleep
        self._rng = rng
        self._handlers: list[Handler] = list(handlers)
        self._states = {resource.kind: _State(resource) for resource in resources}
        self._tasks: list[asyncio.Task[None]] = []
        self._progress = asyncio.Event()
        self._error: InformerFailed | None = None
        self._stopping = False
        self._shared = SharedParts()
        """The parts of pods kept once for all the pods that have them (``project_pod``)."""

    # --- public -------------------------------------------------------------------------------

    def add_handler(self, handler: Handler) -> None:
        """Call ``handler`` with every later change."""
        self._handlers.append(handler)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._states)

    @property
    def synced(self) -> bool:
        """Every resource has been listed at least once."""
        return all(state.synced for state in self._states.values())

    @property
    def error(self) -> InformerFailed | None:
        """Why the informer failed, if it did."""
        return self._error

    def stats(self, kind: str) -> ResourceStats:
        return self._states[kind].stats

    def failing_for(self, now: float | None = None) -> float:
        """Seconds the API server has been failing this informer's requests without one
        answered (the longest over its resources; 0 while they are answered). ``now`` is
        ``time.monotonic()`` by default; safe to call from any thread."""
        now = time.monotonic() if now is None else now
        since = [s.failing_since for s in list(self._states.values()) if s.failing_since]
        return max((now - start for start in since), default=0.0)

    def resource_version(self, kind: str) -> str | None:
        """The version the watch of ``kind`` resumes from (``None`` until listed)."""
        return self._states[kind].resource_version

    async def start(self) -> None:
        """Start one list/watch task per resource."""
        if self._tasks:
            raise RuntimeError("the informer is already started")
        self._stopping = False
        self._error = None
        for state in self._states.values():
            name = f"informer:{state.resource.kind}"
            self._tasks.append(asyncio.create_task(self._guard(state), name=name))

    async def stop(self) -> None:
        """Stop every task and close every connection; idempotent."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def __aenter__(self) -> Informer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def wait_synced(self) -> None:
        """Return once every resource is listed; raise :class:`InformerFailed` if it failed."""
        await self._wait_until(lambda: self.synced)

    async def join(self) -> None:
        """Wait until the informer fails (raising why) or is stopped."""
        await self._wait_until(lambda: self._stopping or not self._tasks)

    def rewatch(self, kind: str, resource_version: str) -> None:
        """Drop the current watch of ``kind`` and watch again from ``resource_version``.

        An operator's and a test's lever: a version the server no longer holds answers 410
        Gone, which the informer must survive by relisting.
        """
        state = self._states[kind]
        state.rewatch_from = resource_version
        if state.response is not None:
            state.response.close()

    # --- the loop -----------------------------------------------------------------------------

    async def _wait_until(self, done: Callable[[], bool]) -> None:
        while True:
            # Cleared before checking, in the same step: a wake-up cannot be lost.
            self._progress.clear()
            if self._error is not None:
                raise self._error
            if done():
                return
            if self._stopping or not self._tasks:
                raise RuntimeError("the informer is not running")
            await self._progress.wait()

    def _fail(self, error: InformerFailed) -> None:
        if self._error is None:
            self._error = error
            log.error("informer failed: %s", error)
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self._progress.set()

    async def _guard(self, state: _State) -> None:
        try:
            await self._run(state)
        except InformerFailed as error:
            self._fail(error)
        except Exception as error:  # a bug: stop loudly rather than leave a dead resource
            failed = InformerFailed(state.resource.kind, f"unexpected error: {error!r}")
            failed.__cause__ = error
            self._fail(failed)
        finally:
            self._progress.set()

    async def _run(self, state: _State) -> None:
        kind = state.resource.kind
        while True:
            try:
                if state.rewatch_from is not None:
                    state.resource_version, state.rewatch_from = state.rewatch_from, None
                if state.resource_version is None:
                    await self._relist(state)
                    if state.rewatch_from is not None:
                        continue  # asked for during the relist
                await self._watch(state)
            except KubeError as error:
                if state.rewatch_from is not None:
                    continue  # the error is the closing of the dropped watch
                await self._after_failure(state, error)
            except (aiohttp.ClientError, TimeoutError) as error:
                if state.rewatch_from is not None:
                    continue
                wrapped = KubeError(f"{kind}: {type(error).__name__}: {error}", retriable=True)
                await self._after_failure(state, wrapped)

    async def _after_failure(self, state: _State, error: KubeError) -> None:
        kind = state.resource.kind
        state.resource_version = None  # whatever went wrong, relist
        state.failures += 1
        if state.failing_since is None and not isinstance(error, ResourceExpired):
            state.failing_since = time.monotonic()
        state.stats.last_error = str(error)
        if isinstance(error, ResourceExpired):
            state.stats.expired += 1
            log.info("%s; relisting", error)
        else:
            state.stats.errors += 1
            log.warning("%s; relisting after a backoff", error)
        if not error.retriable:
            raise InformerFailed(kind, str(error)) from error
        if self.backoff.exhausted(state.failures):
            raise InformerFailed(
                kind, f"{state.failures} failures in a row, the last: {error}"
            ) from error
        # The first 410 after a healthy watch relists at once, as client-go does.
        if not (isinstance(error, ResourceExpired) and state.failures == 1):
            delay = self.backoff.delay(state.failures, self._rng, at_least=error.retry_after)
            await self._sleep(delay)

    async def _request(
        self,
        state: _State,
        query: list[tuple[str, str]],
        limits: aiohttp.ClientTimeout,
        *,
        watch: bool = False,
    ) -> aiohttp.ClientResponse:
        """A GET on the resource's collection, answered with the raw response (status 200)."""
        response: aiohttp.ClientResponse = await self.kube.api.call_api(
            state.resource.path(self.namespace),
            "GET",
            query_params=query,
            header_params={"Accept": state.resource.accept(watch=watch)},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=limits,
        )
        if response.status < 500:
            state.failing_since = None  # answered (a 4xx too: the server works)
        if response.status != 200:
            try:
                body = await response.read()
            finally:
                response.release()
            try:
                status = json.loads(body)
            except ValueError:
                status = {"code": response.status, "message": body[:200].decode(errors="replace")}
            if not isinstance(status, dict):
                status = {"code": response.status}
            status.setdefault("code", response.status)
            raise _status_error(status, f"{state.resource.kind}: GET")
        return response

    def _selectors(self, state: _State) -> list[tuple[str, str]]:
        if state.resource.namespaced and self.label_selector:
            return [("labelSelector", self.label_selector)]
        return []

    async def _relist(self, state: _State) -> None:
        """A complete, paged list of the current state into the store."""
        resource = state.resource
        items: list[RawObject] = []
        token = ""
        version = ""
        while True:
            query = [*self._selectors(state), ("limit", str(self.page_size))]
            if token:
                query.append(("continue", token))
            response = await self._request(
                state, query, aiohttp.ClientTimeout(total=self.request_timeout)
            )
            try:
                page = orjson.loads(await response.read())
            except ValueError as error:
                raise KubeError(
                    f"{resource.kind}: undecodable list: {error}", retriable=True
                ) from error
            finally:
                response.release()
            state.stats.pages += 1
            for item in page.get("items") or []:
                items.append(_kept(resource.kind, resource.typed(item), self._shared))
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion", ""))
            token = str(meta.get("continue") or "")
            # The page as parsed (every field of every object) goes before the next is read: two
            # alive at once made the sync's peak, which the allocator's arenas keep for good.
            del page, meta
            if not token:
                break
        if not version:
            raise KubeError(f"{resource.kind}: list without a resourceVersion", retriable=True)
        scope = self.namespace if resource.namespaced and self.namespace else None
        changes = self.store.replace(resource.kind, items, namespace=scope)
        state.resource_version = version
        state.stats.lists += 1
        log.debug("%s: listed %d objects at %s", resource.kind, len(items), version)
        self._dispatch(state, changes)
        if not state.synced:
            state.synced = True
            self._progress.set()

    async def _watch(self, state: _State) -> None:
        """One watch request, until the server ends it; raises on errors."""
        resource = state.resource
        assert state.resource_version is not None
        server_timeout = int(self.watch_timeout * (1 + self._rng()))
        query = [
            *self._selectors(state),
            ("watch", "true"),
            ("resourceVersion", state.resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(server_timeout)),
        ]
        # No total timeout; a read that stalls past the server's own timeout is a dead stream.
        limits = aiohttp.ClientTimeout(
            sock_connect=self.request_timeout, sock_read=server_timeout + 30
        )
        response = await self._request(state, query, limits, watch=True)
        state.response = response
        state.stats.watches += 1
        what = f"{resource.kind}: watch"
        started = asyncio.get_running_loop().time()
        lines = 0
        try:
            async for line in response.content:
                if not line.strip():
                    continue
                lines += 1
                event = decode_event(line, what, resource)
                state.failures = 0  # the stream works
                state.resource_version = event.resource_version
                if event.type == "BOOKMARK":
                    state.stats.bookmarks += 1
                    continue
                state.stats.events += 1
                change = apply_event(self.store, resource, event, self._shared)
                if change is not None:
                    self._dispatch(state, [change])
        finally:
            state.response = None
            response.close()
        lasted = asyncio.get_running_loop().time() - started
        if not lines and lasted < 1 and state.rewatch_from is None:
            # A server that ends every watch at once would otherwise be asked again in a loop.
            raise KubeError(f"{what} ended at once, without an event", retriable=True)

    def _dispatch(self, state: _State, changes: Iterable[Change]) -> None:
        for change in changes:
            for handler in self._handlers:
                try:
                    handler(change)
                except Exception as error:
                    key = change.key
                    raise InformerFailed(
                        state.resource.kind,
                        f"handler {getattr(handler, '__qualname__', handler)!r} raised on "
                        f"{change.type} {key.namespace}/{key.name}: {error!r}",
                    ) from error


# --- several namespaces ------------------------------------------------------------------------


class Informers:
    """Informers over one store, run and awaited as one: the watcher's view of the namespaces it
    watches.

    Watching every namespace (``namespaces`` empty or ``None``) is one :class:`Informer`. Watching
    a list of namespaces is one informer for the cluster-scoped resources (nodes, namespaces) and
    one per namespace for the namespaced ones, each listing and watching its own namespace only:
    what a Role per namespace allows, where a list across namespaces needs a ClusterRole. Every
    informer applies its changes to ``store`` and calls ``handlers``; a relist of one namespace
    leaves the others' objects alone (``Store.replace`` with its namespace).
    """

    def __init__(
        self,
        kube: Kube,
        resources: Sequence[Resource] = WORKLOAD_RESOURCES,
        *,
        namespaces: Sequence[str] | None = None,
        store: Store | None = None,
        handlers: Iterable[Handler] = (),
        backoff: Backoff | None = None,
    ) -> None:
        self.store = store if store is not None else Store()
        handlers = tuple(handlers)
        scoped = [resource for resource in resources if resource.namespaced]
        whole = [resource for resource in resources if not resource.namespaced]
        if len(set(namespaces or ())) != len(namespaces or ()):
            raise ValueError(f"namespaces listed twice: {list(namespaces or ())}")

        def informer(of: Sequence[Resource], namespace: str | None) -> Informer:
            return Informer(kube, of, namespace=namespace, store=self.store, handlers=handlers,
                            backoff=backoff)  # fmt: skip

        if not namespaces:
            self.informers = [informer(resources, None)]
        else:
            self.informers = [informer(whole, None)] if whole else []
            self.informers += [informer(scoped, namespace) for namespace in namespaces]

    @property
    def error(self) -> InformerFailed | None:
        """Why one of the informers failed, if one did."""
        return next((i.error for i in self.informers if i.error is not None), None)

    def failing_for(self, now: float | None = None) -> float:
        """The longest :meth:`Informer.failing_for` of them."""
        return max((informer.failing_for(now) for informer in self.informers), default=0.0)

    async def __aenter__(self) -> Informers:
        try:
            for informer in self.informers:
                await informer.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop every informer; idempotent."""
        for informer in self.informers:
            await informer.stop()

    async def wait_synced(self) -> None:
        """Return once every informer has listed everything; raise the first failure."""
        await self._first_failure_or_all(informer.wait_synced() for informer in self.informers)

    async def join(self) -> None:
        """Wait until one informer fails (raising why) or every one is stopped."""
        await self._first_failure_or_all(informer.join() for informer in self.informers)

    @staticmethod
    async def _first_failure_or_all(waits: Iterable[Awaitable[None]]) -> None:
        tasks = [asyncio.ensure_future(wait) for wait in waits]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
