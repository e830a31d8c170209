"""The annotator's own view of its own cluster: what it checks a decision against before it
writes (``plan.verify``).

``AnnotatorService`` (``podcost.annotator.service``) runs one, and its intake and writer
(``intake.Verifier``, ``writer``) ask it, for every pod a decision names, whether the pod exists
with that uid, which workload owns it, and whether that workload is opted in.
:class:`InformerView` keeps it current with an informer (``podcost_kube.informer.Informers``)
over the pods, ReplicaSets and Deployments of the annotator's scope (one per watched namespace,
or one over all; and the namespaces, when a namespace selector opts workloads in): the same
lists and watches the watcher makes, with the same RBAC, so the annotator trusts nothing it
reads on the bus; of the objects' metadata only (``PartialObjectMetadata``), which is all the
checks read. The base :class:`ClusterView` is a view its owner keeps current: through
:meth:`ClusterView.apply` (the unit tests do), or a ``Store`` another informer of the same
process fills.

It also remembers the uids of the pods it saw deleted in the last ``DELETED_MEMORY_SECONDS``
(at most ``DELETED_MEMORY`` of them), so that a decision about a pod deleted since (a scale-in,
the usual race) ends as ``gone`` at once instead of waiting for a pod that will not come; one
that arrives later still ends so, after a read of the pod (404). Bounded by time, not only by
count, so that what it keeps follows the rate of deletions, not the history of every pod that
ever ran. Its owner hears of every deletion it observes (:attr:`ClusterView.deletions`): the
annotator forgets what it kept about a pod or a workload that is gone.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from podcost.annotator.plan import Scope
from podcost_core.backoff import Backoff
from podcost_kube.client import Kube
from podcost_kube.informer import (
    DEPLOYMENT,
    NAMESPACE,
    POD,
    REPLICASET,
    SERVICE_BACKOFF,
    Informers,
    Resource,
)
from podcost_kube.store import Change, ChangeType, RawObject, Store

#: How many deleted pod uids a view remembers at most.
DELETED_MEMORY = 50_000
#: How long a view remembers a deleted pod's uid: longer than a decision made before the
#: deletion takes to arrive, but for a backlog; a later one costs a read of the pod.
DELETED_MEMORY_SECONDS = 600.0


class ClusterView:
    """Pods and their owners by namespace and name, and the pods seen deleted."""

    def __init__(
        self,
        scope: Scope,
        *,
        store: Store | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scope = scope
        self.store = store if store is not None else Store()
        self._wall = wall
        self._monotonic = monotonic
        self._deleted: OrderedDict[str, float] = OrderedDict()
        """Uids of the pods seen deleted, oldest first, with when (``monotonic``)."""
        self.deletions: list[Callable[[Change], None]] = []
        """Called with every deletion the view observes (of any kind it keeps), after it."""
        self.synced_at: float | None = wall()
        """When (POSIX seconds) the view first held the whole scope; ``None`` until then."""

    def synced(self) -> bool:
        """Whether the view holds the whole scope (a view fed by its owner always does)."""
        return self.synced_at is not None

    def deleted(self, uid: str) -> bool:
        """Whether the view saw the pod with ``uid`` deleted (within the memory's bounds)."""
        return uid in self._deleted

    @property
    def deleted_kept(self) -> int:
        """How many deleted pods' uids the view remembers now."""
        return len(self._deleted)

    def pod(self, namespace: str, name: str) -> RawObject | None:
        return self.store.get(POD.kind, namespace, name)

    def apply(self, kind: str, change_type: ChangeType, obj: RawObject) -> None:
        """Apply one watch event to the view (what a view's owner feeds it with)."""
        change = self.store.apply(kind, change_type, obj)
        if change is not None:
            self.observe(change)

    def observe(self, change: Change) -> None:
        """Remember a deleted pod's uid, and tell :attr:`deletions` of every deletion (the
        informer's handler)."""
        if change.type is not ChangeType.DELETED or change.old is None:
            return
        if change.kind == POD.kind:
            self._remember_deleted(change.old)
        for listener in self.deletions:
            listener(change)

    def _remember_deleted(self, pod: RawObject) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        now = self._monotonic()
        deleted = self._deleted
        if isinstance(uid, str) and uid:
            deleted[uid] = now
            deleted.move_to_end(uid)
        horizon = now - DELETED_MEMORY_SECONDS
        while deleted and (len(deleted) > DELETED_MEMORY or next(iter(deleted.values())) < horizon):
            deleted.popitem(last=False)

    def resources(self) -> tuple[Resource, ...]:
        """What the view lists and watches: pods and their owners (and the namespaces, whose
        labels a namespace selector reads), their metadata only: a write is checked against
        uids, owner references, labels and annotations, all metadata (``plan.verify``), so the
        API server need not send, nor the annotator decode and keep, any spec or status."""
        kinds: tuple[Resource, ...] = (POD, REPLICASET, DEPLOYMENT)
        if self.scope.rules.namespace_selector is not None:
            kinds = (*kinds, NAMESPACE)
        return tuple(replace(kind, metadata_only=True) for kind in kinds)

    async def run(self) -> None:
        """Keep the view current until cancelled; raise if that fails for good. A view fed by
        its owner has nothing to do."""


class SharedView(ClusterView):
    """A :class:`ClusterView` over the store another informer of the same process keeps current
    (``podcost run``: the watcher's, so that one process holds the cluster once), trusted from
    when that informer has listed everything (``synced``). The owner calls :meth:`observe` with
    its changes. It reads the API server as the watcher does, never the bus: verification
    against it still trusts nothing a record says."""

    def __init__(
        self,
        scope: Scope,
        *,
        store: Store,
        synced: Callable[[], bool],
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(scope, store=store, wall=wall)
        self._source_synced = synced
        self.synced_at = None

    def synced(self) -> bool:
        if not self._source_synced():
            return False
        if self.synced_at is None:
            self.synced_at = self._wall()
        return True


class InformerView(ClusterView):
    """A :class:`ClusterView` an informer keeps current, over ``kube``."""

    def __init__(
        self,
        kube: Kube,
        scope: Scope,
        *,
        wall: Callable[[], float] = time.time,
        backoff: Backoff = SERVICE_BACKOFF,
    ) -> None:
        self.backoff = backoff
        super().__init__(scope, wall=wall)
        self.kube = kube
        self.synced_at = None

    async def run(self) -> None:
        self.synced_at = None  # a restart lists again before the view is trusted
        informer = Informers(
            self.kube,
            self.resources(),
            namespaces=self.scope.namespaces,
            store=self.store,
            handlers=(self.observe,),
            backoff=self.backoff,
        )
        async with informer:
            await informer.wait_synced()
            self.synced_at = self._wall()
            await informer.join()
