"""The informer and the watcher's decisions against the real control plane: the cache converges
to what the API holds, podcost's own cost writes change no workload while other changes do, a
node relabel touches the workloads on the node, bookmarks move the resourceVersion without
reaching the handlers, and a 410 Gone leads to a relist that loses nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from tests.support.kube import KubeTestCluster
from tests.support.tasks import leak_check

from podcost_core.backoff import Backoff
from podcost_core.model import DELETION_COST_ANNOTATION
from podcost_kube.client import Kube
from podcost_kube.informer import NODE, POD, WORKLOAD_RESOURCES, Informer, Resource
from podcost_kube.store import Change, ChangeType, Store
from podcost_kube.workloads import DEPLOYMENT, WorkloadKey, touched_by

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
FAST = Backoff(initial_seconds=0.05, maximum_seconds=1.0, max_failures=10)


@dataclass
class Space:
    """This module's namespace and nodes."""

    namespace: str
    nodes: tuple[str, str]
    selector: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
async def space(kube: KubeTestCluster) -> AsyncIterator[Space]:
    namespace = await kube.create_namespace(f"informer-{RUN}")
    nodes = (f"informer-{RUN}-1", f"informer-{RUN}-2")
    for name, zone in zip(nodes, ("a", "b"), strict=True):
        await kube.create_node(name, zone=zone, labels={"informer-test": RUN})
    yield Space(namespace, nodes, {"informer-test": RUN})
    await kube.delete_namespace(namespace)
    await kube.delete_nodes(nodes)


@dataclass
class Recorder:
    """A handler that keeps every change with the workloads it touched."""

    store: Store
    seen: list[tuple[Change, frozenset[WorkloadKey]]] = field(default_factory=list)

    def __call__(self, change: Change) -> None:
        self.seen.append((change, touched_by(change, self.store)))

    def of(self, kind: str, name: str) -> Iterator[tuple[Change, frozenset[WorkloadKey]]]:
        return ((c, t) for c, t in self.seen if c.kind == kind and c.key.name == name)


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    async with leak_check():
        yield


def informer_for(kube: KubeTestCluster, space: Space, **options: Any) -> tuple[Informer, Recorder]:
    informer = Informer(
        Kube(kube.api), options.pop("resources", WORKLOAD_RESOURCES),
        namespace=space.namespace, backoff=FAST, **options,
    )  # fmt: skip
    recorder = Recorder(informer.store)
    informer.add_handler(recorder)
    return informer, recorder


async def api_state(kube: KubeTestCluster, namespace: str) -> dict[tuple[str, str], str]:
    """Namespaced objects by (kind, name) → resourceVersion, and nodes by name, per the API."""
    dump = await Kube(kube.api).dump(namespace)
    return {
        (item["kind"], item["metadata"]["name"]): (
            "" if item["kind"] == "Node" else item["metadata"]["resourceVersion"]
        )
        for item in dump["items"]
    }


def store_state(store: Store) -> dict[tuple[str, str], str]:
    return {
        (key.kind, key.name): (
            "" if key.kind == "Node" else str(obj["metadata"]["resourceVersion"])
        )
        for kind in ("Pod", "Node", "ReplicaSet", "Deployment")
        for key in store.keys(kind)
        if (obj := store.get(kind, key.namespace, key.name)) is not None
    }


async def converged(kube: KubeTestCluster, informer: Informer, namespace: str) -> None:
    """Wait until the store holds exactly what the API holds (nodes by name, since kwok's
    heartbeats keep changing their versions)."""

    async def same() -> bool:
        if informer.error is not None:
            raise informer.error
        return store_state(informer.store) == await api_state(kube, namespace)

    await kube.wait_for(same, "the informer cache to match the API", timeout=20, interval=0.1)


async def until(
    kube: KubeTestCluster,
    informer: Informer,
    condition: Callable[[], object],
    what: str,
    timeout: float = 20,
) -> None:
    """Wait for ``condition``; fail at once, with its reason, if ``informer`` fails."""

    async def check() -> bool:
        if informer.error is not None:
            raise informer.error
        return bool(condition())

    await kube.wait_for(check, what, timeout=timeout, interval=0.05)


async def relabel(
    kube: KubeTestCluster, informer: Informer, space: Space, pod: str, label: tuple[str, str],
    what: str,
) -> None:  # fmt: skip
    """Set ``label`` on ``pod`` through the API; wait until ``informer``'s cache shows it."""
    name, value = label
    await kube.core.patch_namespaced_pod(
        pod, space.namespace, {"metadata": {"labels": {name: value}}}
    )

    def labelled() -> bool:
        kept = informer.store.get("Pod", space.namespace, pod) or {}
        return kept.get("metadata", {}).get("labels", {}).get(name) == value

    await until(kube, informer, labelled, what)


async def deployment(kube: KubeTestCluster, space: Space, name: str, replicas: int) -> WorkloadKey:
    await kube.create_deployment(
        space.namespace, name, replicas, opt_in=True, node_selector=space.selector
    )
    await kube.wait_ready(space.namespace, name, replicas, timeout=30)
    return WorkloadKey(space.namespace, DEPLOYMENT, name)


@pytest.mark.usefixtures("no_leaked_tasks")
async def test_the_cache_converges_to_the_api_after_creates_updates_and_deletes(
    kube: KubeTestCluster, space: Space
) -> None:
    informer, recorder = informer_for(kube, space)
    async with informer:
        await informer.wait_synced()
        await deployment(kube, space, "converge", 3)
        pods = await kube.active_pods(space.namespace, "converge")
        await kube.core.patch_namespaced_pod(
            pods[0].name, space.namespace, {"metadata": {"labels": {"touched": "yes"}}}
        )
        await kube.core.delete_namespaced_pod(pods[1].name, space.namespace)
        await kube.scale(space.namespace, "converge", 2)
        await kube.wait_ready(space.namespace, "converge", 2, timeout=30)
        await converged(kube, informer, space.namespace)

    relabelled = [
        change
        for change, _ in recorder.of("Pod", pods[0].name)
        if (change.new or {}).get("metadata", {}).get("labels", {}).get("touched") == "yes"
    ]
    assert relabelled, "the label change should have reached the handler"
    types = {change.type for change, _ in recorder.seen if change.kind == "Pod"}
    assert types == {ChangeType.ADDED, ChangeType.MODIFIED, ChangeType.DELETED}
    assert any(c.type is ChangeType.DELETED for c, _ in recorder.of("Pod", pods[1].name))
    # Every item is stored as kubectl prints it, kind and apiVersion included.
    for kind in ("Pod", "ReplicaSet", "Deployment"):
        for obj in informer.store.objects(kind, space.namespace):
            assert (obj["kind"], bool(obj["apiVersion"])) == (kind, True)


@pytest.mark.usefixtures("no_leaked_tasks")
async def test_a_metadata_only_informer_keeps_the_same_objects_without_spec_or_status(
    kube: KubeTestCluster, space: Space
) -> None:
    # What the annotator's view watches (``ClusterView.resources``): the API server sends
    # PartialObjectMetadata, and the store holds each object under its own kind, metadata only.
    resources = tuple(replace(resource, metadata_only=True) for resource in WORKLOAD_RESOURCES)
    whole, _ = informer_for(kube, space)
    informer, recorder = informer_for(kube, space, resources=resources)
    async with whole, informer:
        await informer.wait_synced()
        await deployment(kube, space, "metaonly", 2)
        first = (await kube.active_pods(space.namespace, "metaonly"))[0].name
        await kube.set_deletion_cost(space.namespace, first, 5)
        await relabel(kube, informer, space, first, ("meta", "only"),
                      "the label in the metadata-only cache")  # fmt: skip
        await converged(kube, informer, space.namespace)
        await converged(kube, whole, space.namespace)
        for kind in ("Pod", "ReplicaSet", "Deployment", "Node"):
            objects = informer.store.objects(kind, None if kind == "Node" else space.namespace)
            assert objects, kind
            for obj in objects:
                assert set(obj) == {"apiVersion", "kind", "metadata"}, (kind, sorted(obj))
                resource = next(r for r in WORKLOAD_RESOURCES if r.kind == kind)
                assert (obj["kind"], obj["apiVersion"]) == (kind, resource.api_version)
                name = obj["metadata"]["name"]
                namespace = obj["metadata"].get("namespace", "")
                full = whole.store.get(kind, namespace, name)
                assert full is not None, (kind, name)
                assert kind == "Node" or "spec" in full, (kind, name)
                # The metadata readers use is the same as a whole object's, as kept.
                for field_name in ("uid", "labels", "annotations", "ownerReferences"):
                    assert obj["metadata"].get(field_name) == full["metadata"].get(field_name)
        pod = informer.store.get("Pod", space.namespace, first) or {}
        assert pod["metadata"]["annotations"][DELETION_COST_ANNOTATION] == "5"
    assert any(change.kind == "Pod" and change.type is ChangeType.MODIFIED
               for change, _ in recorder.seen)  # fmt: skip


@pytest.mark.usefixtures("no_leaked_tasks")
async def test_podcost_writing_a_cost_changes_no_workload_while_a_label_change_does(
    kube: KubeTestCluster, space: Space
) -> None:
    informer, recorder = informer_for(kube, space)
    async with informer:
        await informer.wait_synced()
        web = await deployment(kube, space, "costs", 2)
        first, second = (pod.name for pod in await kube.active_pods(space.namespace, "costs"))

        def annotation(name: str) -> str | None:
            pod = informer.store.get("Pod", space.namespace, name) or {}
            return pod.get("metadata", {}).get("annotations", {}).get(DELETION_COST_ANNOTATION)

        await Kube(kube.api).patch_deletion_cost(space.namespace, first, 42)
        await until(
            kube, informer, lambda: annotation(first) == "42", "podcost's cost in the cache"
        )
        await kube.set_deletion_cost(space.namespace, second, 7)  # a person's write
        await until(
            kube, informer, lambda: annotation(second) == "7", "the person's cost in the cache"
        )
        await relabel(kube, informer, space, first, ("extra", "label"), "the label in the cache")

    def cost_of(obj: dict[str, Any] | None) -> str | None:
        annotations = (obj or {}).get("metadata", {}).get("annotations", {})
        value: str | None = annotations.get(DELETION_COST_ANNOTATION)
        return value

    [own_write] = [t for c, t in recorder.of("Pod", first) if cost_of(c.new) != cost_of(c.old)]
    [their_write] = [t for c, t in recorder.of("Pod", second) if cost_of(c.new) != cost_of(c.old)]
    [label_change] = [
        t
        for c, t in recorder.of("Pod", first)
        if c.new and c.new["metadata"].get("labels", {}).get("extra")
        and not (c.old or {}).get("metadata", {}).get("labels", {}).get("extra")
    ]  # fmt: skip
    assert own_write == frozenset()
    assert their_write == {web}
    assert label_change == {web}


@pytest.mark.usefixtures("no_leaked_tasks")
async def test_a_node_relabel_touches_the_workloads_with_pods_on_it(
    kube: KubeTestCluster, space: Space
) -> None:
    informer, recorder = informer_for(kube, space)
    async with informer:
        await informer.wait_synced()
        for name in ("left", "right"):
            await deployment(kube, space, name, 2)
        await converged(kube, informer, space.namespace)
        node = space.nodes[0]
        # Every Deployment of the namespace (earlier tests' too) with a pod on the node.
        listed = await kube.core.list_namespaced_pod(space.namespace)
        expected = {
            WorkloadKey(space.namespace, DEPLOYMENT, pod.metadata.labels["app"])
            for pod in listed.items
            if pod.spec.node_name == node
        }
        assert len(expected) >= 1, "the scheduler should have put a pod on the first node"
        # A heartbeat, as the kubelet (here kwok) writes one: a status-only change.
        beat = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        beaten = await kube.core.patch_node_status(
            node, {"status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": beat}]}}
        )
        # The store keeps no condition of a node (``project_node``): the heartbeat's version.
        beat_version = beaten.metadata.resource_version
        await kube.core.patch_node(node, {"metadata": {"labels": {"relabelled": RUN}}})

        def relabelled() -> bool:
            found = informer.store.get("Node", "", node) or {}
            return found.get("metadata", {}).get("labels", {}).get("relabelled") == RUN

        await until(kube, informer, relabelled, "the new node label in the cache")

    def node_changes(has: Callable[[dict[str, Any]], bool]) -> list[frozenset[WorkloadKey]]:
        return [
            touched
            for change, touched in recorder.of("Node", node)
            if change.type is ChangeType.MODIFIED
            and change.new is not None
            and has(change.new)
            and not (change.old is not None and has(change.old))
        ]

    def heartbeat(obj: dict[str, Any]) -> bool:
        return bool(obj["metadata"].get("resourceVersion") == beat_version)

    def label(obj: dict[str, Any]) -> bool:
        return bool(obj["metadata"].get("labels", {}).get("relabelled") == RUN)

    # The store keeps nothing a heartbeat changes: no change to touch anything with.
    assert node_changes(heartbeat) == []
    assert node_changes(label) == [expected]


@pytest.mark.usefixtures("no_leaked_tasks")
async def test_bookmarks_move_the_resource_version_without_reaching_the_handlers(
    kube: KubeTestCluster, space: Space
) -> None:
    # A selector no pod matches: the pod watch sees nothing but bookmarks. The API server sends
    # one 2 s before a watch's deadline, so the watches must last longer than that.
    informer, recorder = informer_for(
        kube, space, resources=[POD, NODE], label_selector="nothing=here", watch_timeout=3
    )
    async with informer:
        await informer.wait_synced()
        listed = informer.resource_version("Pod")
        # A pod the selector filters out: the watch gets no event for it, but the watch cache's
        # version moves past it, and the next bookmark says so.
        await kube.core.create_namespaced_pod(space.namespace, {
            "metadata": {"name": "bookmark", "labels": {"app": "bookmark"}},
            "spec": {"containers": [{"name": "app", "image": "registry.local/podcost/app:1"}],
                     "nodeSelector": space.selector, "terminationGracePeriodSeconds": 0},
        })  # fmt: skip
        await until(
            kube,
            informer,
            lambda: (
                informer.stats("Pod").bookmarks >= 1 and informer.resource_version("Pod") != listed
            ),
            "a bookmark on the pod watch",
            timeout=30,
        )
    assert informer.stats("Pod").events == 0
    assert all(change.kind in ("Pod", "Node") and change.key.name for change, _ in recorder.seen)
    assert not [change for change, _ in recorder.seen if change.kind == "Pod"]


# --- 410 Gone -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def widgets(kube: KubeTestCluster, space: Space) -> AsyncIterator[Resource]:
    """A CRD created now. Its watch cache starts at the current version, so a watch from
    version "1" is answered 410 Gone, whatever else this cluster has seen."""
    group = f"t{RUN}.test.podcost.dev"
    extensions = client.ApiextensionsV1Api(kube.api)
    body = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }],
        },
    }  # fmt: skip
    await extensions.create_custom_resource_definition(body)
    resource = Resource("Widget", f"{group}/v1", "widgets")
    custom = client.CustomObjectsApi(kube.api)

    async def established() -> bool:
        crd = await extensions.read_custom_resource_definition(f"widgets.{group}")
        conditions = (crd.status.conditions if crd.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    async def served() -> bool:
        try:
            await custom.list_namespaced_custom_object(group, "v1", space.namespace, "widgets")
        except ApiException as error:
            if error.status in (404, 429):  # not yet routed; its watch cache initializing
                return False
            raise
        return True

    await kube.wait_for(established, "the Widget CRD to be established", timeout=30)
    await kube.wait_for(served, "the Widget CRD to be served", timeout=30)
    yield resource
    await extensions.delete_custom_resource_definition(f"widgets.{group}")


async def put_widget(
    kube: KubeTestCluster, space: Space, widgets: Resource, name: str, size: int
) -> None:
    group, version = widgets.api_version.split("/")
    custom = client.CustomObjectsApi(kube.api)
    body = {"apiVersion": widgets.api_version, "kind": "Widget",
            "metadata": {"name": name}, "size": size}  # fmt: skip
    try:
        await custom.create_namespaced_custom_object(
            group, version, space.namespace, "widgets", body
        )
    except ApiException as error:
        if error.status != 409:
            raise
        await custom.patch_namespaced_custom_object(
            group, version, space.namespace, "widgets", name, {"size": size},
            _content_type="application/merge-patch+json",
        )  # fmt: skip


async def delete_widget(kube: KubeTestCluster, space: Space, widgets: Resource, name: str) -> None:
    group, version = widgets.api_version.split("/")
    await client.CustomObjectsApi(kube.api).delete_namespaced_custom_object(
        group, version, space.namespace, "widgets", name
    )


async def widget_versions(kube: KubeTestCluster, space: Space, widgets: Resource) -> dict[str, str]:
    group, version = widgets.api_version.split("/")
    listed = await client.CustomObjectsApi(kube.api).list_namespaced_custom_object(
        group, version, space.namespace, "widgets"
    )
    return {
        item["metadata"]["name"]: item["metadata"]["resourceVersion"] for item in listed["items"]
    }


@pytest.mark.usefixtures("no_leaked_tasks")
async def test_a_watch_from_an_expired_version_relists_without_losing_objects(
    kube: KubeTestCluster, space: Space, widgets: Resource
) -> None:
    for name in ("w1", "w2", "w3"):
        await put_widget(kube, space, widgets, name, 1)
    informer, recorder = informer_for(kube, space, resources=[widgets])
    async with informer:
        await informer.wait_synced()
    assert sorted(key.name for key in informer.store.keys("Widget")) == ["w1", "w2", "w3"]
    recorder.seen.clear()

    # While nobody watches: one widget goes, one changes, one comes. Then the informer resumes
    # from a version long compacted out of the watch cache.
    await delete_widget(kube, space, widgets, "w1")
    await put_widget(kube, space, widgets, "w2", 2)
    await put_widget(kube, space, widgets, "w4", 1)
    informer.rewatch("Widget", "1")
    async with informer:
        await until(
            kube, informer, lambda: informer.stats("Widget").lists == 2, "the relist after 410"
        )
        await put_widget(kube, space, widgets, "w5", 1)  # and the watch goes on after it
        await until(
            kube, informer, lambda: informer.store.get("Widget", space.namespace, "w5"), "w5"
        )

    stats = informer.stats("Widget")
    assert (stats.expired, stats.errors) == (1, 0)
    assert "410" in stats.last_error
    stored = {
        key.name: str(obj["metadata"]["resourceVersion"])
        for key in informer.store.keys("Widget")
        if (obj := informer.store.get("Widget", key.namespace, key.name)) is not None
    }
    assert stored == await widget_versions(kube, space, widgets)
    # The relist reported exactly what changed meanwhile, and nothing about w3.
    assert [(c.type, c.key.name) for c, _ in recorder.seen] == [
        (ChangeType.DELETED, "w1"),
        (ChangeType.MODIFIED, "w2"),
        (ChangeType.ADDED, "w4"),
        (ChangeType.ADDED, "w5"),
    ]


@pytest.mark.usefixtures("no_leaked_tasks")
async def test_a_pod_watch_restarted_from_version_one_still_converges(
    kube: KubeTestCluster, space: Space
) -> None:
    # The pod watch cache may still hold every event since the cluster started (then it replays
    # them) or not (then it answers 410 and the informer relists): either way nothing is lost.
    informer, _ = informer_for(kube, space)
    async with informer:
        await informer.wait_synced()
        await deployment(kube, space, "replay", 2)
        informer.rewatch("Pod", "1")
        await kube.scale(space.namespace, "replay", 3)
        await kube.wait_ready(space.namespace, "replay", 3, timeout=30)
        await converged(kube, informer, space.namespace)
    assert informer.error is None
