"""The lazy ``kubernetes_asyncio.client`` (``podcost_kube.lazyclient``): a fast start, the same
classes, working deserialisation. Each check runs in a fresh interpreter, since an eager import
anywhere in the test process would hide what the hook does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from podcost_kube.lazyclient import _lazy_names


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_the_kube_client_does_not_import_the_models_or_the_apis() -> None:
    out = _python(
        """
        import sys
        import podcost_kube.client, podcost_kube.leader, podcost_kube.informer
        loaded = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.")]
        print("v1_pod", "kubernetes_asyncio.client.models.v1_pod" in sys.modules)
        print("core", "kubernetes_asyncio.client.api.core_v1_api" in sys.modules)
        print("models", sum(".models." in m for m in loaded))
        """
    )
    assert "v1_pod False" in out
    assert "core False" in out
    assert "models 0" in out


def test_names_resolve_on_first_use_to_the_eager_classes() -> None:
    out = _python(
        """
        import sys
        import podcost_kube
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client import V1Pod, CoreV1Api, models, api
        assert "kubernetes_asyncio.client.models.v1_pod" in sys.modules
        from kubernetes_asyncio.client.models.v1_pod import V1Pod as eager_pod
        from kubernetes_asyncio.client.api.core_v1_api import CoreV1Api as eager_core
        assert V1Pod is eager_pod is models.V1Pod is client.V1Pod
        assert CoreV1Api is eager_core is api.CoreV1Api
        assert client.AppsV1Api.__module__ == "kubernetes_asyncio.client.api.apps_v1_api"
        assert client.rest.RESTClientObject  # a submodule, as after an eager import
        assert "V1Pod" in client.__all__ and "V1Pod" in dir(models)
        assert "CoordinationV1Api" in dir(client)
        assert client.__version__
        assert not hasattr(client, "NoSuchThing") and not hasattr(models, "no_such_module")
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_deserialisation_builds_models_it_never_imported() -> None:
    out = _python(
        """
        import asyncio, json, sys
        import podcost_kube
        from kubernetes_asyncio import client

        class Response:
            data = json.dumps({
                "kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
                "items": [{"metadata": {"name": "web-1", "namespace": "shop",
                                        "annotations": {"a": "b"}},
                           "spec": {"containers": [{"name": "c", "image": "i"}]}}],
            })

        async def main():
            async with client.ApiClient() as api:
                assert "kubernetes_asyncio.client.models.v1_pod_list" not in sys.modules
                pods = api.deserialize(Response(), "V1PodList")
                from kubernetes_asyncio.client.models.v1_container import V1Container
                assert isinstance(pods.items[0].spec.containers[0], V1Container)
                print(pods.items[0].metadata.name, pods.metadata.resource_version)
                print(api.sanitize_for_serialization(pods)["items"][0]["metadata"]["annotations"])

        asyncio.run(main())
        """
    )
    assert out.splitlines() == ["web-1 7", "{'a': 'b'}"]


def test_kubeconfig_loading_and_watch_work_with_the_lazy_client() -> None:
    out = _python(
        """
        import podcost_kube
        from kubernetes_asyncio import config, watch, client
        from kubernetes_asyncio.config.kube_config import KubeConfigLoader
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
               "clusters": [{"name": "k", "cluster": {"server": "https://k:6443"}}],
               "users": [{"name": "u", "user": {"token": "t"}}],
               "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
        import asyncio
        async def main():
            conf = client.Configuration()
            await config.load_kube_config_from_dict(cfg, client_configuration=conf)
            print(conf.host)
            w = watch.Watch()
            print(w.get_return_type(client.CoreV1Api().list_namespaced_pod))
        asyncio.run(main())
        """
    )
    assert out.splitlines() == ["https://k:6443", "V1Pod"]


@pytest.mark.parametrize(
    "source",
    [
        "import os\n",
        "from a.b import *\n",
        "from .b import C\n",
        "X = compute()\n",
        "def f(): pass\n",
        "from a.b import C\nif C: pass\n",
    ],
)
def test_an_init_that_is_not_plain_imports_is_executed_eagerly(source: str) -> None:
    assert _lazy_names(source) is None


def test_the_generated_init_shape_is_read_as_lazy_names() -> None:
    names, values = _lazy_names(
        '"""doc"""\nfrom __future__ import absolute_import\n__version__ = "1"\n'
        "from a.b.c import C\nfrom a.d import E as F\n__all__ = ['C', 'F']\n"
    ) or ({}, {})
    assert names == {"C": "a.b.c.C", "F": "a.d.E"}
    assert values == {"__version__": "1", "__all__": ["C", "F"]}


def test_podcost_run_imports_none_of_what_its_first_write_does_not_need() -> None:
    # The start of ``podcost run`` (from process start to first write): no generated model
    # or API class, no Kafka client for the in-process bus, no HTTP stack before it serves.
    out = _python(
        """
        import sys
        import podcost.cli, podcost.commands.run
        client = "kubernetes_asyncio.client"
        heavy = (f"{client}.models.v1_pod", f"{client}.api.core_v1_api",
                 "aiokafka", "faust", "fastapi", "uvicorn")
        print(sorted(name for name in heavy if name in sys.modules))
        """
    )
    assert out.strip() == "[]"
