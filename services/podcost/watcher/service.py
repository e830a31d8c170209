"""The watcher: keeps an informer cache of the cluster and publishes each opted-in workload's
whole current view (a ``WorkloadSnapshotMessage``) whenever something that matters to it changes.

``podcost watcher`` runs it alone; embedded mode (``podcost run``) runs it next to the other
services; tests build it with :func:`bootstrap`. Every change the informer delivers goes through
``podcost_kube.workloads.touched_by`` (which already ignores podcost's own cost writes, so there
is no feedback loop, and status noise), into a per-workload debouncer, so a burst of pod events
becomes one snapshot. A pod that lands on or leaves a node also touches the node's other workloads
whose ``node-consolidation`` order it moves (``node_load_neighbours``: the node started or stopped
holding other workloads' pods), if their policy reads node load (``reads_node_load``); any other
bind leaves them be. Each emission is built from the cache as it is then, resolved against the
workload's opt-in and policy, and published in a ``podcost.snapshot`` span whose W3C context
rides in the record's headers: the root of the trace of that cost decision.

Snapshot versions. The debouncer counts emissions per workload from 1 in each process (a
workload seen again after it was gone, or after a spell standing by, counts on from above every
version forgotten: the debouncer keeps no version of a workload gone); the published version is
``incarnation * 10**6 + count``, the incarnation being the start time in milliseconds, so
versions keep growing across watcher restarts.

Leader election (``PODCOST_WATCHER_LEADER_ELECTION``), so that two replicas can run: once its
cache is synced, each replica campaigns for a Lease (``podcost_kube.leader``). Both keep their
cache warm and are ready; only the leader touches the debouncer and publishes. A replica that
becomes the leader touches every opted-in workload once, so nothing that changed while it stood
by is left unpublished; one that stops leading drops what is still pending. A snapshot that was
being published as leadership was lost may still go out; the aggregator keeps the latest by
``emitted_at``, and the new leader stamps its snapshots from the moment it took over, and
never below the takeover floor (``LeaderElector.floor``: the last holder's ``renewTime`` plus
its lease duration, on the last holder's clock), so a new leader whose clock runs behind the
old one's is not taken for the stale one. For that long after a takeover, latencies measured
from ``changed_at`` read short.

Workloads that go. When a workload this watcher published is no longer ranked (deleted, opted
out, or its policy became invalid), the watcher publishes a ``WorkloadGoneMessage`` under its
key, once: rankers skip it and the aggregator drops its state and, unless it was deleted, asks
the annotator to remove the costs podcost wrote on its pods. One deleted or opted out while no
watcher ran is never said to be gone that way: after every sync (the first list, a takeover of
the Lease, each periodic resync) the watcher publishes its cluster's *live set*, the keys of every
workload it ranks as its cache shows them then (a ``WorkloadGoneMessage`` with ``live``, to every
partition of the workloads topic), and the aggregator forgets every state of the cluster the set
leaves out that is older than the set.

Publishing does not wait for each snapshot's acknowledgement: snapshots are queued on the bus
(which keeps one workload's records in order), at most ``MAX_IN_FLIGHT`` unacknowledged, and one
the bus cannot deliver ends the watcher, whose restart publishes every workload again. Once the
cache is synced it is frozen out of the garbage collector's passes (``settle_heap``), and again
once the first pass is published and delivered (its converted pods), the allocator's free memory
given back; that memory is given back every few seconds after (``trim_forever``).

API server outages. The informer waits by the process's retry policy (``ServiceSettings.backoff``:
full jitter, capped): it retries for as long as the outage lasts and relists after it, never
giving up on a retriable error. While its requests
have been failing for ``PODCOST_WATCHER_UNREADY_AFTER_SECONDS`` the watcher is not ready (logged
when it begins and ends).

The first pass (:meth:`WatcherService.first_pass`): once synced, every opted-in workload is
published once; the versions of that pass are what embedded mode's annotator must write before
it is ready again after a start (the costs are current). The pods of all its snapshots are
converted before the first is published, so that what the cache keeps of them is not strewn
among what publishing leaves behind.

Pods are converted through a ``PodCache`` (once per pod version), which is also where a pod
with an invalid deletion cost is reported, once per version: counted in
``podcost_invalid_annotations`` and logged; it is ranked as a pod without a cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Tracer
from pydantic import AliasChoices, Field, FilePath, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from podcost.runtime.clock import Clock, WallClock
from podcost.runtime.events import recorder
from podcost.runtime.heap import HeapKeeper, settle_heap, trim_forever
from podcost.runtime.metrics import Families, Metrics
from podcost.runtime.settings import ServiceSettings
from podcost.runtime.telemetry import (
    ATTR_PODS,
    ATTR_VERSION,
    ATTR_WORKLOAD,
    SPAN_SNAPSHOT,
    inject,
    sending,
    tracer,
    workload_resource,
)
from podcost_bus import Bus, BusSettings, Delivery, MemoryBus, open_bus
from podcost_contracts.messages import (
    GONE_DELETED,
    GONE_UNLISTED,
    Encoded,
    EncodeError,
    WorkloadGoneMessage,
    WorkloadSnapshotMessage,
    encode,
    live_set_key,
)
from podcost_contracts.signing import SIGNATURE_HEADER, read_signing_key, signature
from podcost_contracts.topics import Topics
from podcost_core.backoff import Backoff
from podcost_core.kubejson import ConversionError, LabelSelectorJSON
from podcost_core.model import DELETION_COST_ANNOTATION, Pod
from podcost_core.policy import PolicyError, load_policy_file, reads_node_load
from podcost_core.tomodel import invalid_deletion_cost
from podcost_kube.client import Kube
from podcost_kube.debounce import Debouncer, Emission
from podcost_kube.events import EventRecorder, EventType, ObjectRef
from podcost_kube.informer import NAMESPACE, SERVICE_BACKOFF, WORKLOAD_RESOURCES, Informers
from podcost_kube.leader import LeaderElector, check_timing
from podcost_kube.podcache import PodCache
from podcost_kube.snapshots import convert_snapshot_pods, workload_snapshot
from podcost_kube.store import Change, ChangeType, Store
from podcost_kube.workloads import (
    OptInRules,
    WorkloadKey,
    node_load_neighbours,
    opted_in_workloads,
    touched_by,
    workload_policy,
)

log = logging.getLogger("podcost.watcher")

#: A namespace name (RFC 1123 label), as ``PODCOST_WATCHER_NAMESPACE`` lists them.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

VERSION_SPAN = 10**6
#: Snapshots queued on the bus and not yet acknowledged before publishing waits for the oldest.
MAX_IN_FLIGHT = 256
#: How often the watcher's :class:`HeapKeeper` freezes what survived (``WatcherService.keep_heap``).
KEEP_HEAP_EVERY_S = 1.0
#: Pods with an invalid cost remembered as reported; when full, forgotten (reported again).
REPORTED_LIMIT = 4096


class WatcherSettings(BaseSettings):
    """Watcher settings; environment variables ``PODCOST_WATCHER_*``:

    - ``PODCOST_WATCHER_NAMESPACE``: watch these namespaces only, ``ns[,ns]``; each is listed
      and watched on its own, so a Role in each is all the RBAC it needs [all namespaces]
    - ``PODCOST_WATCHER_NAMESPACE_SELECTOR``: opt in every workload of the namespaces whose
      labels match, ``key=value[,key=value]`` [none]
    - ``PODCOST_WATCHER_DEFAULT_ENABLED``: opt in workloads that say nothing [false]
    - ``PODCOST_WATCHER_DEBOUNCE_SECONDS``: quiet time that ends a burst of changes [0.2]
    - ``PODCOST_WATCHER_MAX_DELAY_SECONDS``: longest a changed workload waits to be published
      under constant churn [2.0]
    - ``PODCOST_WATCHER_LEADER_ELECTION``: run as one of several replicas, publishing only while
      holding the Lease below; needs RBAC to get, create and update ``leases`` in the
      ``coordination.k8s.io`` group in the Lease's namespace [false]
    - ``PODCOST_WATCHER_LEASE_NAME``: the Lease; replicas that watch different namespaces must
      use different ones [podcost-watcher]
    - ``PODCOST_WATCHER_LEASE_NAMESPACE``, else ``POD_NAMESPACE`` (the downward API's
      ``metadata.namespace``, so the Lease lives next to the watcher's Deployment and its RBAC):
      the Lease's namespace [default]
    - ``PODCOST_WATCHER_LEADER_IDENTITY``, else ``POD_NAME``: this replica's name in the Lease;
      unique per replica [hostname_pid]
    - ``PODCOST_WATCHER_LEASE_DURATION_SECONDS``: how long the others wait for a leader that
      stopped renewing before they take over (whole seconds, rounded up) [10]
    - ``PODCOST_WATCHER_RENEW_DEADLINE_SECONDS``: a leader that could not renew for this long
      stops publishing; less than the lease duration [7]
    - ``PODCOST_WATCHER_RETRY_PERIOD_SECONDS``: how often the leader renews and the others try
      [1]. Shorter than client-go's 15/10/2, so that a standby has taken over within 15 s of a
      leader's crash even in the worst case: the lease, plus up to 2.2 retry periods until the
      standby first sees the last renewal, plus up to 2.2 until its next try (14.4 s); measured
      in ``tests/e2e/test_watcher_failover.py``. The cost is a Lease write per second.
    - ``PODCOST_WATCHER_UNREADY_AFTER_SECONDS``: how long the API server may fail every list and
      watch before the watcher reports not ready (it goes on retrying) [10]
    - ``PODCOST_WATCHER_SIGNING_KEY_FILE``: this cluster's signing key (a file holding one key
      of at least 32 characters; the chart mounts it from a Secret): every record the watcher
      publishes carries its HMAC signature (``podcost_contracts.signing``), which a core with
      ``PODCOST_FLEET_KEYS_FILE`` requires [unset: records are not signed]
    - ``PODCOST_WATCHER_RESYNC_SECONDS``: how often the leader publishes every opted-in workload
      again although nothing changed, each period drawn within ±10 % so that a fleet's
      watchers do not resync together; 0 never does [600]. What a write left wrong for good (an
      error, a refusal, a cost podcost's own field manager set that the watcher ignores) is
      decided and written again then; a pod whose cost is right costs no request (the annotator
      compares with the cost the snapshot shows).
    """

    model_config = SettingsConfigDict(
        env_prefix="PODCOST_WATCHER_", frozen=True, extra="ignore", populate_by_name=True
    )

    namespace: str | None = Field(
        default=None,
        description="Watch these namespaces only, ns[,ns]; each is listed and watched on its "
        "own, so a Role in each is all the RBAC it needs. Unset: every namespace.",
    )
    namespace_selector: str | None = Field(
        default=None,
        description="Opt in every workload of the namespaces whose labels match, "
        "key=value[,key=value].",
    )
    default_enabled: bool = Field(
        default=False, description="Opt in the workloads that say nothing about podcost."
    )
    debounce_seconds: float = Field(
        default=0.2, gt=0, description="Seconds of quiet that end a burst of changes."
    )
    max_delay_seconds: float = Field(
        default=2.0,
        gt=0,
        description="The most seconds a changed workload waits to be published under constant "
        "churn.",
    )
    leader_election: bool = Field(
        default=False,
        description="Run as one of several replicas, publishing only while holding the Lease; "
        "needs RBAC on leases (coordination.k8s.io) in the Lease's namespace.",
    )
    lease_name: str = Field(
        default="podcost-watcher",
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="The Lease; replicas that watch different namespaces must use different ones.",
    )
    lease_namespace: str = Field(
        default="default",
        min_length=1,
        validation_alias=AliasChoices(
            "PODCOST_WATCHER_LEASE_NAMESPACE", "POD_NAMESPACE", "lease_namespace"
        ),
        description="The Lease's namespace; else POD_NAMESPACE (the downward API's "
        "metadata.namespace), so the Lease lives next to the watcher's Deployment.",
    )
    leader_identity: str | None = Field(
        default=None,
        min_length=1,
        validation_alias=AliasChoices(
            "PODCOST_WATCHER_LEADER_IDENTITY", "POD_NAME", "leader_identity"
        ),
        description="This replica's name in the Lease, unique per replica; else POD_NAME, "
        "else hostname_pid.",
    )
    lease_duration_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds the others wait for a leader that stopped renewing before they "
        "take over (whole seconds, rounded up).",
    )
    renew_deadline_seconds: float = Field(
        default=7.0,
        gt=0,
        description="Seconds a leader may fail to renew before it stops publishing; less than "
        "the lease duration.",
    )
    retry_period_seconds: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between the leader's renewals and the others' tries.",
    )
    unready_after_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds the API server may fail every list and watch before the watcher "
        "reports not ready (it goes on retrying).",
    )
    resync_seconds: float = Field(
        default=600.0,
        ge=0,
        description="Seconds between republishing every opted-in workload's snapshot (with "
        "10 % jitter; 0 turns it off), so outcomes that ended a write for good are driven "
        "again; unchanged decisions write nothing.",
    )

    signing_key_file: FilePath | None = Field(
        default=None,
        description="This cluster's signing key file: every record published carries its "
        "signature; unset: records are not signed.",
    )

    @model_validator(mode="after")
    def _election_timing(self) -> Self:
        check_timing(
            self.lease_duration_seconds,
            self.renew_deadline_seconds,
            self.retry_period_seconds,
            names=(
                "PODCOST_WATCHER_LEASE_DURATION_SECONDS",
                "PODCOST_WATCHER_RENEW_DEADLINE_SECONDS",
                "PODCOST_WATCHER_RETRY_PERIOD_SECONDS",
            ),
        )
        return self

    @field_validator("namespace")
    @classmethod
    def _namespace_list(cls, value: str | None) -> str | None:
        names = [name.strip() for name in (value or "").split(",")]
        if value is None or names == [""]:
            return None
        for name in names:
            if not DNS_LABEL.fullmatch(name):
                raise ValueError(f"{name!r} is not a namespace name (a DNS label)")
        if len(set(names)) != len(names):
            raise ValueError(f"a namespace is listed twice in {value!r}")
        return ",".join(names)

    def namespaces(self) -> tuple[str, ...] | None:
        """The namespaces watched, ``None`` for all of them."""
        return tuple(self.namespace.split(",")) if self.namespace else None

    def identity(self) -> str:
        """This replica's name in the Lease: the setting, else ``hostname_pid``."""
        return self.leader_identity or f"{socket.gethostname()}_{os.getpid()}"

    def opt_in_rules(self, settings: ServiceSettings) -> OptInRules:
        """The opt-in rules these settings describe; a bad policy file raises ``PolicyError``."""
        selector: LabelSelectorJSON | None = None
        if self.namespace_selector:
            labels = {}
            for part in self.namespace_selector.split(","):
                key, eq, value = part.partition("=")
                if not eq or not key.strip():
                    raise ValueError(
                        f"PODCOST_WATCHER_NAMESPACE_SELECTOR: {part!r} is not key=value"
                    )
                labels[key.strip()] = value.strip()
            selector = {"matchLabels": labels}
        # Only with remote strategies does a registry of its own go in: without one,
        # policy_from_annotations keeps its cache of the policies it resolved.
        registry = settings.strategy_registry() if settings.remote_strategies else None
        default_policy = (
            load_policy_file(settings.policy_file, registry=registry)
            if settings.policy_file is not None
            else None
        )
        return OptInRules(selector, self.default_enabled, default_policy, registry)


@dataclass
class WatcherService:
    """Informer → touched workloads → debouncer → snapshot → bus."""

    kube: Kube
    bus: Bus
    topics: Topics
    rules: OptInRules
    cluster: str
    settings: WatcherSettings
    metrics: Metrics
    tracer: Tracer
    clock: Clock
    adopt: frozenset[str] = frozenset()
    backoff: Backoff = SERVICE_BACKOFF
    """How the informers wait before relisting after a failure (the process's retry policy)."""
    """Field managers whose deletion costs count as podcost's own (``ServiceSettings.adopted``)."""
    signing_key: bytes | None = None
    """This cluster's key: every record published is signed with it (``None``: not signed)."""
    name: str = "watcher"
    events: EventRecorder | None = None
    """Its Kubernetes Events: a workload opted in, or refused for an invalid policy."""
    keeper: HeapKeeper | None = None
    """Keeps the collector's passes off the cache once settled (:meth:`keep_heap`); ``None``:
    the collector runs as :func:`settle_heap` left it."""

    def __post_init__(self) -> None:
        self.store = Store()
        self.observers: list[Callable[[Change], None]] = []
        """More handlers of the informer's changes, called after the watcher's own (embedded
        mode: the annotator's view, which shares :attr:`store`)."""
        self.incarnation = int(self.clock.now() * 1000)
        self.debouncer: Debouncer[WorkloadKey] = Debouncer(
            window=self.settings.debounce_seconds,
            max_delay=self.settings.max_delay_seconds,
            clock=self.clock,
        )
        self._ready = False
        self._outage = False
        """The API server has failed the informer's requests for too long (not ready)."""
        self._pass_pending: set[WorkloadKey] | None = None
        self._pass: dict[str, int] = {}
        #: The first pass's workloads, which the publishing loop emits before any other.
        self._due_now: list[WorkloadKey] = []
        self._settle_due = False
        """The first pass is published: settle the heap once the bus has delivered it."""
        self._change_seen_at: dict[WorkloadKey, float] = {}
        self.pods = PodCache(on_convert=self._check_pod, adopt=self.adopt)
        self._reported: dict[str, str | None] = {}
        """Per uid, the invalid cost last reported for the pod (at most ``REPORTED_LIMIT``)."""
        self._published: set[WorkloadKey] = set()
        """The workloads this watcher published a snapshot of and no tombstone since."""
        self._node_load: set[WorkloadKey] = set()
        """Those whose policy reads what other pods take from their nodes
        (``reads_node_load``): touched when a pod lands on or leaves one of their nodes."""
        self._live_set_due = asyncio.Event()
        """A sync happened: publish the live set (:meth:`_publish_live_sets`)."""
        self._in_flight: deque[asyncio.Future[Delivery]] = deque()
        """Snapshots queued on the bus, oldest first, until acknowledged."""
        self._delivery_error: BaseException | None = None
        self._delivery_failed = asyncio.Event()
        self._heap_settled = asyncio.Event()
        """The first pass is published and the heap settled: :meth:`keep_heap` starts."""
        self.elector: LeaderElector | None = None
        if self.settings.leader_election:
            self.elector = LeaderElector(
                self.kube,
                self.settings.lease_name,
                self.settings.lease_namespace,
                self.settings.identity(),
                lease_duration=self.settings.lease_duration_seconds,
                renew_deadline=self.settings.renew_deadline_seconds,
                retry_period=self.settings.retry_period_seconds,
                on_started_leading=self._on_started_leading,
                on_stopped_leading=self._on_stopped_leading,
            )
        self.metrics.leading.set(0 if self.elector is not None else 1)
        self._informer: Informers | None = None
        # Read at each scrape: the alerts on an unsynced watcher and an unreachable API server.
        self.metrics.informer_synced.set_function(lambda: 1.0 if self._ready else 0.0)
        self.metrics.api_server_failing.set_function(self._failing_for)

    def _failing_for(self) -> float:
        """Seconds the API server has failed every request of the informer and the Lease."""
        informer, elector = self._informer, self.elector
        return max(
            informer.failing_for() if informer is not None else 0.0,
            elector.failing_for() if elector is not None else 0.0,
        )

    def ready(self) -> bool:
        """Synced and the API server answering; a standby replica is ready too (it takes over
        with a warm cache)."""
        return self._ready and not self._outage

    def synced(self) -> bool:
        """Whether :attr:`store` holds the whole cluster (listed since the informer started)."""
        return self._ready

    def first_pass(self) -> dict[str, int] | None:
        """Per workload key, the version of the snapshot the first pass after the sync
        published; ``None`` until every opted-in workload of that pass is published (or found
        to need none). A standby replica's is empty: the leader's costs are not its to wait for.
        """
        if not self.leading():
            return {}
        if self._pass_pending is None or self._pass_pending:
            return None
        return dict(self._pass)

    def _floor(self) -> float:
        """The least stamp this watcher may give a snapshot: after a takeover, later than every
        stamp of the leader before it, whatever the two clocks say (``LeaderElector.floor``)."""
        return 0.0 if self.elector is None else self.elector.floor

    def leading(self) -> bool:
        """Whether this watcher publishes: always without leader election, else while it leads."""
        return self.elector is None or self.elector.is_leader

    def _on_change(self, change: Change) -> None:
        self.pods.observe(change)
        if change.kind == "Pod" and change.type is ChangeType.DELETED and change.old is not None:
            self._reported.pop(str((change.old.get("metadata") or {}).get("uid")), None)
        if not self.leading():
            return  # the store is updated all the same; becoming the leader touches everything
        keys = touched_by(change, self.store, convert_pod=self._convert_quietly, adopt=self.adopt)
        for key in keys:
            self._change_seen_at.setdefault(key, self.clock.now())
            self.debouncer.touch(key)
        if self._node_load and change.kind == "Pod":
            # The other workloads on the nodes the pod landed on or left whose order it moved
            # (only through whether a node holds other pods: see node_load_neighbours).
            for key in node_load_neighbours(self.store, change):
                if key in self._node_load and key not in keys:
                    self._change_seen_at.setdefault(key, self.clock.now())
                    self.debouncer.touch(key)

    def _convert_quietly(self, raw: Mapping[str, Any]) -> Pod:
        # Deciding whether a change matters converts through the cache, so the snapshot that
        # follows finds the new version converted; reported only if a snapshot shows it.
        return self.pods.convert(raw, report=False)

    def _on_started_leading(self) -> None:
        now = self.clock.now()
        keys = opted_in_workloads(self.store, self.rules)
        for key in keys:
            # Seen now: the last leader may have published later changes than ours.
            self._change_seen_at[key] = now
            self.debouncer.touch(key)
        self.metrics.leading.set(1)
        self._live_set_due.set()
        log.info("leading: publishing all %d opted-in workloads once", len(keys))

    def _on_stopped_leading(self) -> None:
        self._change_seen_at.clear()
        self._published.clear()  # the next leader says what is gone
        self._node_load.clear()
        # Its versions too: workloads deleted while it stands by are never emitted here to be
        # forgotten one by one (the versions of a later lead still grow past these).
        self.debouncer.forget_all()
        self.metrics.leading.set(0)
        log.info("standing by: no longer publishing")

    async def run(self) -> None:
        resources = WORKLOAD_RESOURCES
        if self.rules.namespace_selector is not None:
            resources = (*resources, NAMESPACE)
        informer = Informers(
            self.kube,
            resources,
            namespaces=self.settings.namespaces(),
            store=self.store,
            handlers=(self._on_change, *self.observers),
            backoff=self.backoff,
        )
        self._informer = informer
        # Only what it writes: on a broker with ACLs it may not even see the ranks topic.
        await self.bus.ensure_topics([self.topics.workloads, self.topics.deadletter])
        self.metrics.record_topic_drift(self.bus.topic_drift())
        async with informer:
            await informer.wait_synced()
            self._ready = True
            log.info("watcher synced: %d pods, %d nodes", self.store.count("Pod"),
                     self.store.count("Node"))  # fmt: skip
            settle_heap()
            self._start_first_pass()
            self._live_set_due.set()
            tasks = [
                asyncio.create_task(self._publish_forever(), name="watcher-publish"),
                asyncio.create_task(informer.join(), name="watcher-informer"),
                asyncio.create_task(self._fail_on_lost_delivery(), name="watcher-deliveries"),
                asyncio.create_task(self._watch_outage(informer), name="watcher-outage"),
                asyncio.create_task(trim_forever(), name="watcher-trim"),
                asyncio.create_task(self.keep_heap(), name="watcher-heap"),
                asyncio.create_task(self._resync_forever(), name="watcher-resync"),
                asyncio.create_task(self._publish_live_sets(), name="watcher-live-set"),
            ]
            if self.events is not None:
                tasks.append(asyncio.create_task(self.events.run(), name="watcher-events"))
            if self.elector is not None:
                # Only now: a replica that leads must have the whole cluster in its cache.
                tasks.append(asyncio.create_task(self.elector.run(), name="watcher-elector"))
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # re-raise the failure that ended the watcher
            finally:
                self._ready = False
                for task in tasks:
                    task.cancel()  # the elector steps down, then releases its Lease
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _resync_forever(self) -> None:
        """Every ``resync_seconds`` (±10 %), touch every opted-in workload (while leading)."""
        period = self.settings.resync_seconds
        if period <= 0:
            await asyncio.Event().wait()  # never: the task lives as long as the others
        while True:
            await asyncio.sleep(period * random.uniform(0.9, 1.1))
            if self.leading():
                self.resync()

    def resync(self) -> None:
        """Publish every opted-in workload again, through the debouncer like any change."""
        now = self.clock.now()
        keys = opted_in_workloads(self.store, self.rules)
        for key in keys:
            self._change_seen_at.setdefault(key, now)
            self.debouncer.touch(key)
        self._live_set_due.set()
        log.info("resync: publishing all %d opted-in workloads again", len(keys))

    async def _publish_live_sets(self) -> None:
        """After each sync, while leading, publish the live set (see the module docstring)."""
        while True:
            await self._live_set_due.wait()
            self._live_set_due.clear()
            if self.leading():
                await self.publish_live_set()

    async def publish_live_set(self) -> int:
        """Publish the keys of every workload ranked now to every partition of the workloads
        topic (stamped now, never below the takeover floor, as snapshots are): the aggregator
        forgets the states of this cluster's other workloads published before. Returns how
        many keys it held; 0, with an error logged, when the set is too large for one record
        (nothing is forgotten then)."""
        listed_at = max(self.clock.now(), self._floor())
        keys = opted_in_workloads(self.store, self.rules)
        message = WorkloadGoneMessage(
            key=live_set_key(self.cluster).text(),
            version=self.incarnation * VERSION_SPAN,
            reason=GONE_UNLISTED,
            emitted_at=listed_at,
            changed_at=listed_at,
            live=tuple(key.bus_key(self.cluster) for key in keys),
        )
        try:
            encoded = encode(message)
        except EncodeError as error:
            log.error("the live set of %d workloads cannot be published (the core keeps the "
                      "states of workloads gone while no watcher ran): %s", len(keys),
                      error)  # fmt: skip
            return 0
        deliveries = await self.bus.broadcast(
            self.topics.workloads, encoded.key, encoded.value, self._signed(encoded)
        )
        self.metrics.produced.labels(self.topics.workloads).inc(len(deliveries))
        log.info("published the live set: %d workloads", len(keys))
        return len(keys)

    def _start_first_pass(self) -> None:
        """Every opted-in workload is due once now (most are already, from the initial list)."""
        keys = opted_in_workloads(self.store, self.rules)
        self._pass_pending, self._pass = set(keys), {}
        if self.leading():
            for key in keys:
                self._change_seen_at.setdefault(key, self.clock.now())
            # Due now: the cache is whole, a quiet window would only delay the first costs.
            self._due_now = list(keys)

    def _passed(self, key: WorkloadKey, version: int | None) -> None:
        """``key`` was published at ``version`` (``None``: nothing to publish for it)."""
        pending = self._pass_pending
        if pending is None or key not in pending:
            return
        pending.discard(key)
        if version is not None:
            self._pass[key.bus_key(self.cluster)] = version
        if not pending:
            log.info("first pass published: %d workloads", len(self._pass))
            # The converted pods are long-lived too; the pass's transient buffers are not:
            # settled once the bus has delivered them (_publish_forever).
            self._settle_due = True

    async def _watch_outage(self, informer: Informers) -> None:
        """Flip readiness when the informer's requests have failed for too long, and back."""
        limit = self.settings.unready_after_seconds
        elector = self.elector
        while True:
            # Open watches can outlive a server that takes no new request (a kube-apiserver
            # shutting down drains them): the Lease's failing requests tell that outage.
            failing = max(informer.failing_for(), elector.failing_for() if elector else 0.0)
            if failing >= limit and not self._outage:
                self._outage = True
                log.error("not ready: the API server has failed every request for %.1fs; "
                          "retrying until it answers", failing)  # fmt: skip
            elif failing == 0 and self._outage:
                self._outage = False
                log.warning("ready again: the API server answers the informer")
            await asyncio.sleep(min(1.0, limit / 4))

    async def _emissions(self) -> AsyncIterator[Emission[WorkloadKey]]:
        """The first pass's workloads at once, then what the debouncer emits."""
        first, self._due_now = self.debouncer.take(self._due_now), []
        await self._convert_first(emission.key for emission in first)
        for emission in first:
            yield emission
        del first  # this generator lives as long as the watcher
        async for emission in self.debouncer:
            yield emission

    async def _convert_first(self, keys: Iterable[WorkloadKey]) -> None:
        """Convert the pods of the first pass's snapshots before any of them is published
        (``convert_snapshot_pods``: the same pods, reported the same, as publishing would).

        Each ``Pod`` the cache keeps is then laid out next to the others, not among what
        publishing leaves behind for a while (a summed entry for every pod on a snapshot's
        nodes not converted yet, encoded records, the bus's deliveries): once that is freed,
        the allocator could not give back the memory the pods were strewn over (about
        0.2 KB a pod at 10,000 pods). Publishing then finds every pod converted; the
        pass finds each workload's pods twice (10,000 pods: 0.3 s more CPU, once). It stops
        once the cache is full (``POD_CACHE_SIZE`` pods): the pods after would push out those
        before, to be converted again by publishing."""
        for key in keys:
            if not self.leading() or len(self.pods) >= self.pods.size:
                return  # beyond the cache's size, publishing would convert them again
            if workload_policy(self.store, key, self.rules).enabled:
                with contextlib.suppress(ConversionError):
                    convert_snapshot_pods(self.store, key, self.pods)
            await asyncio.sleep(0)

    async def _publish_forever(self) -> None:
        async for emission in self._emissions():
            if self.leading():
                await self.publish(emission)
            else:  # touched before leadership was lost: the new leader publishes it
                self._change_seen_at.pop(emission.key, None)
            if self._settle_due:
                self._settle_due = False
                await self._settle_when_delivered()
            # Several keys due at once come out without a pause: let the loop turn between
            # snapshots, so that services sharing it (embedded mode) are not held up a whole
            # round of snapshot building at a time.
            await asyncio.sleep(0)

    async def _settle_when_delivered(self) -> None:
        """Settle the heap (``settle_heap``: the C allocator's free memory goes back) once every
        snapshot queued on the bus is acknowledged: the bus's buffers of the first pass, up to
        ``MAX_IN_FLIGHT`` snapshots, are freed then, after the pass is published."""
        waiting = [acked for acked in self._in_flight if not acked.done()]
        if waiting:
            await asyncio.wait(waiting)
        del waiting
        # The acknowledged ones go now, not at the next snapshot: what they hold goes with them.
        while self._in_flight and self._in_flight[0].done():
            self._in_flight.popleft()
        settle_heap()
        self._heap_settled.set()

    async def keep_heap(self) -> None:
        """Once the first pass is published and the heap settled, tick :attr:`keeper` every
        ``KEEP_HEAP_EVERY_S`` of the watcher's clock (none: wait forever): the cache keeps being
        replaced, a pod at a time, and each replaced pod outlives the young generations, so that
        with the collector on a full pass walked the cache every few seconds of churn: a fifth
        of the watcher's CPU per event in ``tests/bench/bench_watcher.py``. Reference cycles
        that became garbage wait for the keeper's full collection."""
        keeper = self.keeper
        if keeper is None:
            await asyncio.Event().wait()
            return
        try:
            await self._heap_settled.wait()
            while True:
                keeper.tick()
                await self.clock.sleep(KEEP_HEAP_EVERY_S)
        finally:
            keeper.stop()

    async def publish(self, emission: Emission[WorkloadKey]) -> bool:
        """Publish the snapshot of one emitted workload; ``False`` when there is nothing to say
        (gone, opted out, invalid policy, unreadable objects; each logged)."""
        key = emission.key
        changed_at = max(self._change_seen_at.pop(key, emission.first_touch), self._floor())
        policy = workload_policy(self.store, key, self.rules)
        version = self.incarnation * VERSION_SPAN + emission.version
        if not policy.enabled:
            if policy.error is not None:
                log.warning("not ranking %s: %s", key.bus_key(self.cluster), policy.error)
                self._tell(key, "Warning", "PolicyRefused", f"not ranked: {policy.error}")
            await self._gone(key, version, changed_at, policy.error)
            # Nothing of a workload no longer ranked is kept: its name may never come back.
            self.debouncer.forget(key)
            self._passed(key, None)
            return False
        try:
            snapshot = workload_snapshot(
                self.store,
                key,
                cluster=self.cluster,
                version=version,
                taken_at=self.clock.now(),
                pods=self.pods,
            )
        except ConversionError as error:
            log.warning("cannot snapshot %s: %s", key.bus_key(self.cluster), error)
            self._passed(key, None)
            return False
        bus_key = snapshot.workload.key
        with self.tracer.start_as_current_span(
            SPAN_SNAPSHOT,
            kind=SpanKind.PRODUCER,
            attributes={**sending(self.topics.workloads, bus_key), **workload_resource(bus_key)},
        ) as span:
            span.set_attribute(ATTR_WORKLOAD, bus_key)
            span.set_attribute(ATTR_VERSION, version)
            span.set_attribute(ATTR_PODS, len(snapshot.pods))
            # Both are when the burst's first change was seen: it orders the snapshots, and
            # event-to-annotation latency is measured from it.
            message = WorkloadSnapshotMessage.of(
                snapshot, emitted_at=changed_at, changed_at=changed_at
            )
            try:
                encoded = encode(message, trace=inject())
            except EncodeError as error:  # too large, or text that is not Unicode
                log.error("snapshot of %s cannot be published: %s", snapshot.workload.key,
                          error)  # fmt: skip
                self._passed(key, None)
                return False
            if self._delivery_error is not None:
                raise self._delivery_error  # the bus lost an earlier snapshot: stop publishing
            # Queued, not awaited: waiting for each acknowledgement would hold every snapshot
            # behind the broker's round trip. The bus keeps one key's records in order, and a
            # record it cannot deliver ends the watcher (see _fail_on_lost_delivery).
            acked = await self.bus.send(
                self.topics.workloads, encoded.key, encoded.value, self._signed(encoded)
            )
        if key not in self._published:
            self._tell(key, "Normal", "OptedIn", f"ranked by podcost ({policy.source}): "
                       f"{len(snapshot.pods)} pods, snapshot version {version}")  # fmt: skip
        self._published.add(key)
        if policy.policy is not None and reads_node_load(policy.policy):
            self._node_load.add(key)
        else:
            self._node_load.discard(key)
        self._track(asyncio.ensure_future(acked))
        while self._in_flight and self._in_flight[0].done():
            self._in_flight.popleft()
        if len(self._in_flight) > MAX_IN_FLIGHT:
            await asyncio.wait([self._in_flight[0]])
        self._passed(key, version)
        return True

    def _signed(self, encoded: Encoded) -> Mapping[str, bytes]:
        """``encoded``'s headers, with this cluster's signature if the watcher has a key."""
        if self.signing_key is None:
            return encoded.headers
        mark = signature(self.signing_key, encoded.key or b"", encoded.value)
        return {**encoded.headers, SIGNATURE_HEADER: mark}

    def _tell(self, key: WorkloadKey, type: EventType, reason: str, note: str) -> None:
        """An event on the workload (``kubectl describe`` shows it)."""
        if self.events is None:
            return
        raw = self.store.get(key.kind, key.namespace, key.name)
        if raw is None:
            return
        ref = ObjectRef.of(raw, api_version="apps/v1", kind=key.kind)
        self.events.record(ref, type=type, reason=reason, action="Rank", note=note)

    def _track(self, acked: asyncio.Future[Delivery]) -> None:
        self._in_flight.append(acked)
        if acked.done():
            self._delivered(acked)
        else:
            acked.add_done_callback(self._delivered)

    def _delivered(self, acked: asyncio.Future[Delivery]) -> None:
        """Count an acknowledged snapshot; remember the first one the bus could not deliver."""
        if acked.cancelled():
            return  # the bus stopped while it was queued: the watcher is stopping too
        error = acked.exception()
        if error is None:
            self.metrics.snapshots_published.inc()
            self.metrics.produced.labels(self.topics.workloads).inc()
        elif self._delivery_error is None:
            self._delivery_error = error
            self._delivery_failed.set()

    async def _fail_on_lost_delivery(self) -> None:
        """End the watcher as soon as a queued snapshot is lost (its restart publishes every
        opted-in workload again, as when ``publish`` itself fails)."""
        await self._delivery_failed.wait()
        assert self._delivery_error is not None, "set before the event"
        raise self._delivery_error

    async def _gone(
        self, key: WorkloadKey, version: int, changed_at: float, error: PolicyError | None
    ) -> None:
        """Tell the rankers and the aggregator that ``key`` is no longer ranked (deleted, opted
        out, invalid policy), once, if this watcher published it."""
        if key not in self._published:
            return  # not ranked as far as this watcher knows (or already said): nothing to say
        self._published.discard(key)
        self._node_load.discard(key)
        deleted = self.store.get(key.kind, key.namespace, key.name) is None
        reason = GONE_DELETED if deleted else "opted out" if error is None else f"invalid: {error}"
        message = WorkloadGoneMessage(
            key=key.bus_key(self.cluster),
            version=version,
            reason=reason,
            emitted_at=changed_at,
            changed_at=changed_at,
        )
        encoded = encode(message)
        await self.bus.publish(
            self.topics.workloads, encoded.key, encoded.value, self._signed(encoded)
        )
        self.metrics.produced.labels(self.topics.workloads).inc()
        log.info("%s is gone (%s): told the pipeline to forget it", message.key, reason)

    def _check_pod(self, pod: Pod) -> None:
        """Report a pod whose cost the controller cannot read, once per value it has (the cache
        hands a pod over once per conversion of a version, again after it left the cache)."""
        problem = invalid_deletion_cost(pod)
        if problem is None:
            self._reported.pop(pod.uid, None)
            return
        if self._reported.get(pod.uid) == pod.deletion_cost_raw:
            return
        if len(self._reported) >= REPORTED_LIMIT:
            self._reported.clear()
        self._reported[pod.uid] = pod.deletion_cost_raw
        self.metrics.invalid_annotations.labels(DELETION_COST_ANNOTATION).inc()
        log.warning(
            "pod %s/%s: its %s is not a cost the controller can read (%s): ranked as a pod "
            "without one",
            pod.namespace, pod.name, DELETION_COST_ANNOTATION, problem,
            extra={"pod": f"{pod.namespace}/{pod.name}", "value": pod.deletion_cost_raw},
        )  # fmt: skip


def bootstrap(
    settings: ServiceSettings,
    bus_settings: BusSettings,
    watcher_settings: WatcherSettings | None = None,
    *,
    kube: Kube,
    bus: Bus | None = None,
    clock: Clock | None = None,
    tracer_provider: TracerProvider | None = None,
    families: Families | None = None,
) -> WatcherService:
    """The watcher (composition root of ``podcost watcher``, embedded mode and the tests).

    A bad policy file or namespace selector raises at once, naming the setting. ``families``:
    the process's metric families (default: a registry of its own).
    """
    watcher_settings = watcher_settings or WatcherSettings()
    try:
        rules = watcher_settings.opt_in_rules(settings)
    except PolicyError as error:
        raise ValueError(f"PODCOST_POLICY_FILE: {error}") from error
    bus = bus if bus is not None else open_bus(bus_settings)
    return WatcherService(
        kube=kube,
        bus=bus,
        topics=bus_settings.topics,
        rules=rules,
        cluster=settings.cluster,
        settings=watcher_settings,
        metrics=Metrics("watcher", families),
        tracer=tracer(tracer_provider),
        clock=clock if clock is not None else WallClock(),
        adopt=settings.adopted,
        backoff=settings.backoff(),
        signing_key=(
            None
            if watcher_settings.signing_key_file is None
            else read_signing_key(watcher_settings.signing_key_file.read_text(encoding="utf-8"))
        ),
        events=recorder(settings, kube, "watcher"),
        # Over the in-memory bus the process is `podcost run`'s, whose other services allocate
        # as much: the collector stays on there (as the aggregator's keeper does).
        keeper=None if isinstance(bus, MemoryBus) else HeapKeeper(),
    )
