"""The Kubernetes adapter. Importing it makes ``kubernetes_asyncio.client`` load its generated
API and model classes on first use (:mod:`podcost_kube.lazyclient`), not all at start."""

from podcost_kube.lazyclient import install as _install_lazy_client

_install_lazy_client()
