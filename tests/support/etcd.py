"""Writing an object straight into the control plane's etcd, behind the API server's back.

The one way a test can give a pod what the API server refuses today but a real cluster can
still hold: an invalid ``controller.kubernetes.io/pod-deletion-cost`` (kube-apiserver v1.36
rejects one on create and on update, ``ValidatePodSpecificAnnotations``, while pods written when
the PodDeletionCost gate was off, or before it validated, keep theirs). The API server reads a
JSON object from etcd as well as its own protobuf (its storage codec falls back to the universal
deserializer), and its watch delivers the change like any other.

Works on a control plane started by ``podcost_localinfra`` (the session fixture, or
``make cluster-up``): etcd's client URL is read from the command line of the etcd process whose
pid the run directory (the kubeconfig's directory) records. Used by the integration tests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The API server's default ``--etcd-prefix``.
PREFIX = "/registry"


def etcd_endpoint(kubeconfig: Path) -> str | None:
    """The client URL of the etcd behind the control plane of ``kubeconfig``; ``None`` when it
    was not started by ``podcost_localinfra`` on this machine."""
    pid_files = sorted((kubeconfig.parent / "pids").glob("*-etcd.pid"))
    if not pid_files:
        return None
    cmdline = Path(f"/proc/{pid_files[0].read_text().strip()}/cmdline")
    if not cmdline.exists():
        return None
    for argument in cmdline.read_bytes().decode().split("\0"):
        if argument.startswith("--listen-client-urls="):
            return argument.partition("=")[2].split(",")[0]
    return None


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


async def put_pod(endpoint: str, pod: Mapping[str, Any]) -> None:
    """Store ``pod`` (its JSON as the API serves it) as it is, through etcd's JSON gateway."""
    meta = pod["metadata"]
    stored = {**pod, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
    body = json.dumps(
        {
            "key": _b64(f"{PREFIX}/pods/{meta['namespace']}/{meta['name']}"),
            "value": _b64(json.dumps(stored)),
        }
    ).encode()
    request = urllib.request.Request(
        f"{endpoint}/v3/kv/put", data=body, headers={"Content-Type": "application/json"}
    )

    def put() -> None:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    await asyncio.to_thread(put)
