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

It also remembers the uids of the last ``DELETED_MEMORY`` pods it saw deleted, so that a
decision about a pod deleted since (a scale-in, the usual race) ends as ``gone``, as before,
instead of waiting for a pod that will not come.
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

#: How many deleted pod uids a view remembers.
DELETED_MEMORY = 50_000


class ClusterView:
    """Pods and their owners by namespace and name, and the pods seen deleted."""

    def __init__(
        self, scope: Scope, *, store: Store | None = None, wall: Callable[[], float] = time.time
    ) -> None:
        self.scope = scope
        self.store = store if store is not None else Store()
        self._wall = wall
        self._deleted: OrderedDict[str, None] = OrderedDict()
        self.synced_at: float | None = wall()
        """When (POSIX seconds) the view first held the whole scope; ``None`` until then."""

    def synced(self) -> bool:
        """Whether the view holds the whole scope (a view fed by its owner always does)."""
        return self.synced_at is not None

    def deleted(self, uid: str) -> bool:
        """Whether the view saw the pod with ``uid`` deleted (among the last ones)."""
        return uid in self._deleted

    def pod(self, namespace: str, name: str) -> RawObject | None:
        return self.store.get(POD.kind, namespace, name)

    def apply(self, kind: str, change_type: ChangeType, obj: RawObject) -> None:
        """Apply one watch event to the view (what a view's owner feeds it with)."""
        change = self.store.apply(kind, change_type, obj)
        if change is not None:
            self.observe(change)

    def observe(self, change: Change) -> None:
        """Remember a deleted pod's uid (the informer's handler)."""
        if change.kind != POD.kind or change.type is not ChangeType.DELETED or change.old is None:
            return
        uid = (change.old.get("metadata") or {}).get("uid")
        if isinstance(uid, str) and uid:
            self._deleted[uid] = None
            self._deleted.move_to_end(uid)
            while len(self._deleted) > DELETED_MEMORY:
                self._deleted.popitem(last=False)

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
