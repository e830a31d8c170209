"""The Helm chart's Deployments run as real containers of podcost's image, with podman.

kwok has no kubelet, so the container specs the chart renders are executed here instead, by
podman with exactly what each one says (:func:`rendered_pods` reads them out of ``helm
template``; :class:`PodContainer` runs one):

- the image, ``command`` (the entry point) and ``args``;
- ``env``: literal values (``$(VAR)`` references expanded as the kubelet does), the downward API,
  and ``secretKeyRef`` / ``configMapKeyRef`` from the Secrets and ConfigMaps given (a missing one
  that is not ``optional`` fails, as the kubelet refuses to start such a pod);
- ``securityContext`` (pod and container, the container's winning): ``runAsUser``/``runAsGroup``
  as ``--user``, ``runAsNonRoot`` checked, ``readOnlyRootFilesystem`` as ``--read-only``,
  ``capabilities.drop``/``add``, ``allowPrivilegeEscalation: false`` as ``no-new-privileges``,
  the seccomp profile (``RuntimeDefault`` is the engine's default profile);
- volumes at their ``mountPath``: ``emptyDir`` a tmpfs (mode 1777, ``sizeLimit``), ``configMap``
  and ``secret`` their files, read-only;
- the service account's in-cluster configuration, when ``automountServiceAccountToken`` allows
  it: a token of that ServiceAccount from the TokenRequest API, the API server's CA and the
  namespace under ``/var/run/secrets/kubernetes.io/serviceaccount``, and
  ``KUBERNETES_SERVICE_HOST``/``_PORT`` naming the API server;
- ``resources.limits.memory`` as the container's memory limit;
- the probes (``startupProbe``, ``readinessProbe``, ``livenessProbe``), polled over HTTP at the
  rendered path and port as the kubelet would.

One local stand-in: the containers share the host's network (to reach the API server and the
broker on the loopback), so each one's HTTP port would collide; the port the chart declares
(``containerPort``) must be the one its probes name and the one ``PODCOST_HTTP_PORT`` gives the
service, and only then is it moved to a free port of the host, probes with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from podcost_localinfra import image as engine
from tests.support.services import CHART, RELEASE, ServiceSpec, free_port, parse_metrics

Object = dict[str, Any]
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: What the service reads as its HTTP port (podcost.runtime.settings.ServiceSettings.http_port).
HTTP_PORT_VARIABLE = "PODCOST_HTTP_PORT"


class ChartContainerError(AssertionError):
    """A rendered container spec that podman, standing in for the kubelet, cannot honour."""


def render(
    helm: Path, values: Mapping[str, Any], namespace: str, release: str = RELEASE
) -> list[Object]:
    """Every object ``helm template`` renders for ``values``."""
    rendered = subprocess.run(
        [str(helm), "template", release, str(CHART), "--namespace", namespace, "--values", "-"],
        input=yaml.safe_dump(dict(values)), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if rendered.returncode != 0:
        raise AssertionError(f"helm template failed: {rendered.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


@dataclass(frozen=True)
class InCluster:
    """What a pod of a service account gets to reach its API server."""

    token: str
    ca: str
    host: str
    port: int


@dataclass(frozen=True)
class RenderedPod:
    """One container of one rendered Deployment, with its pod's spec around it."""

    name: str
    """``<prefix><component>`` (``/<container>`` added when the pod has several)."""
    namespace: str
    pod: Object
    container: Object

    @property
    def service_account(self) -> str:
        return str(self.pod.get("serviceAccountName") or "default")

    @property
    def automount(self) -> bool:
        return bool(self.pod.get("automountServiceAccountToken", True))


def rendered_pods(objects: list[Object], *, prefix: str = "") -> list[RenderedPod]:
    """One :class:`RenderedPod` per container of every Deployment among ``objects``."""
    pods = []
    for deployment in (obj for obj in objects if obj["kind"] == "Deployment"):
        meta = deployment["metadata"]
        component = meta["labels"].get("app.kubernetes.io/component") or meta["name"]
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"]:
            name = f"{prefix}{component}"
            if len(pod["containers"]) > 1:
                name = f"{name}/{container['name']}"
            pods.append(RenderedPod(name, meta.get("namespace") or "default", pod, container))
    return pods


def _security(pod: RenderedPod) -> Object:
    merged: Object = dict(pod.pod.get("securityContext") or {})
    merged.update(pod.container.get("securityContext") or {})
    return merged


def _expand(value: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` references to earlier variables, ``$$`` escapes, as the kubelet expands."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, value)


def _quantity_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity.removesuffix(suffix)) * factor)
    return int(quantity)


@dataclass
class PodContainer:
    """One rendered container run by podman (detached), stopped and removed by :meth:`stop`."""

    pod: RenderedPod
    image: str
    work_dir: Path
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    in_cluster: InCluster | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Variables the test sets on top (topic names of a fresh run); never a chart setting."""
    port: int = 0
    container_id: str = ""
    started_at: float = 0.0
    ready_after: float | None = None
    _exit_code: int | None = None
    _checked_at: float = 0.0

    # -- the spec, checked and turned into podman's arguments ----------------------------------

    def env(self) -> dict[str, str]:
        pod, spec = self.pod, self.pod.container
        downward = {
            "metadata.name": re.sub(r"[^a-z0-9-]+", "-", pod.name.lower()).strip("-"),
            "metadata.namespace": pod.namespace,
            "spec.serviceAccountName": pod.service_account,
            "status.podIP": "127.0.0.1",
            "spec.nodeName": "localhost",
        }
        env: dict[str, str] = {}
        for source in spec.get("envFrom") or []:
            raise ChartContainerError(f"{pod.name}: envFrom {source} is not run here")
        for entry in spec.get("env") or []:
            name = entry["name"]
            if "value" in entry:
                env[name] = _expand(str(entry["value"]), env)
                continue
            value_from = entry.get("valueFrom") or {}
            if "fieldRef" in value_from:
                path = value_from["fieldRef"]["fieldPath"]
                if path not in downward:
                    raise ChartContainerError(f"{pod.name}: {name} from {path}: not served")
                env[name] = downward[path]
            elif "secretKeyRef" in value_from or "configMapKeyRef" in value_from:
                kind = "secretKeyRef" if "secretKeyRef" in value_from else "configMapKeyRef"
                ref = value_from[kind]
                store = self.secrets if kind == "secretKeyRef" else self.config_maps
                found = store.get(ref["name"], {}).get(ref["key"])
                if found is None:
                    if ref.get("optional"):
                        continue
                    raise ChartContainerError(
                        f"{pod.name}: {name} needs {kind} {ref['name']}/{ref['key']}, which "
                        "does not exist (the kubelet would not start the pod)"
                    )
                env[name] = found
            else:
                raise ChartContainerError(f"{pod.name}: {name}: {value_from} is not served")
        return env

    def http_port(self, env: Mapping[str, str]) -> int:
        """The container port the chart's probes use, checked against what the service
        listens on (``PODCOST_HTTP_PORT``, else the image's own default)."""
        spec = self.pod.container
        ports = {p.get("name"): int(p["containerPort"]) for p in spec.get("ports") or []}
        probe_ports: set[int] = set()
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = spec.get(kind)
            if probe is None:
                continue
            if "httpGet" not in probe:
                raise ChartContainerError(f"{self.pod.name}: {kind} is not an HTTP probe")
            port = probe["httpGet"]["port"]
            if isinstance(port, str) and not port.isdigit():
                if port not in ports:
                    raise ChartContainerError(f"{self.pod.name}: {kind} names no port {port!r}")
                port = ports[port]
            probe_ports.add(int(port))
        listening = env.get(HTTP_PORT_VARIABLE) or self._image_env().get(HTTP_PORT_VARIABLE)
        if listening is None:
            raise ChartContainerError(f"{self.pod.name}: no {HTTP_PORT_VARIABLE} anywhere")
        if probe_ports and probe_ports != {int(listening)}:
            raise ChartContainerError(
                f"{self.pod.name}: probes on port {sorted(probe_ports)}, the service listens on "
                f"{listening}"
            )
        if int(listening) not in ports.values():
            raise ChartContainerError(
                f"{self.pod.name}: the service listens on {listening}, the chart declares "
                f"{sorted(ports.values())}"
            )
        return int(listening)

    def _image_env(self) -> dict[str, str]:
        config = engine.inspect(self.image).get("Config")
        entries = config.get("Env", []) if isinstance(config, dict) else []
        return dict(str(e).partition("=")[::2] for e in entries)

    def _files(
        self, name: str, data: Mapping[str, str], items: list[Object] | None,
        mode: int = 0o644, directory: Path | None = None,
    ) -> Path:  # fmt: skip
        """The files of a ConfigMap or Secret volume (or one source of a projected one): each
        key (or the ``items`` chosen) with ``mode`` (``defaultMode``, an item's ``mode``), owned
        by group ``fsGroup`` as the kubelet sets them, so a mode the user cannot read fails."""
        directory = directory or self.work_dir / "volumes" / f"{name}-{uuid.uuid4().hex[:4]}"
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        group = (self.pod.pod.get("securityContext") or {}).get("fsGroup")
        chosen = items or [{"key": key, "path": key} for key in data]
        for item in chosen:
            if item["key"] not in data:
                raise ChartContainerError(f"{self.pod.name}: volume {name} has no {item['key']}")
            target = directory / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[item["key"]])
            target.chmod(int(item.get("mode", mode)))
            if group is not None:
                os.chown(target, 0, int(group))
        return directory

    def _source(self, kind: str, source: Object) -> Mapping[str, str] | None:
        """The data of the ConfigMap or Secret a volume (source) names; None if it may be
        absent (``optional``); fails when it must exist and does not."""
        name = source.get("secretName") or source["name"]  # a secret volume's, or a source's
        store = self.config_maps if kind == "configMap" else self.secrets
        if name in store:
            return store[name]
        if source.get("optional"):
            return None
        raise ChartContainerError(f"{self.pod.name}: {kind} {name} does not exist")

    def argv(self) -> list[str]:
        """The ``podman run`` command line for the rendered spec."""
        pod, spec = self.pod, self.pod.container
        security = _security(pod)
        slug = re.sub("[^a-z0-9]+", "-", pod.name)
        argv = ["podman", "run", "--detach", "--network", "host",
                "--name", f"podcost-{slug}-{uuid.uuid4().hex[:6]}"]  # fmt: skip
        user = security.get("runAsUser")
        if security.get("runAsNonRoot"):
            effective = user if user is not None else self._image_user()
            if str(effective).split(":")[0] in ("", "0", "root"):
                raise ChartContainerError(f"{pod.name}: runAsNonRoot, but it would run as root")
        if user is not None:
            group = security.get("runAsGroup")
            argv += ["--user", f"{user}:{group}" if group is not None else str(user)]
        if security.get("readOnlyRootFilesystem"):
            argv.append("--read-only")
            argv.append("--read-only-tmpfs=false")  # only the volumes the chart gives are writable
        for capability in (security.get("capabilities") or {}).get("drop") or []:
            argv += ["--cap-drop", capability]
        for capability in (security.get("capabilities") or {}).get("add") or []:
            argv += ["--cap-add", capability]
        if security.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        seccomp = (security.get("seccompProfile") or {}).get("type", "RuntimeDefault")
        if seccomp == "Unconfined":
            argv += ["--security-opt", "seccomp=unconfined"]
        elif seccomp != "RuntimeDefault":
            raise ChartContainerError(f"{pod.name}: seccomp profile {seccomp} is not run here")
        memory = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
        if memory:
            argv += ["--memory", str(_quantity_bytes(str(memory)))]
        argv += self._volume_args()
        env = self.env()
        self.port = free_port()
        declared = self.http_port(env)
        del declared  # checked; the host network needs a port of its own
        env[HTTP_PORT_VARIABLE] = str(self.port)
        if self.in_cluster is not None and pod.automount:
            env["KUBERNETES_SERVICE_HOST"] = self.in_cluster.host
            env["KUBERNETES_SERVICE_PORT"] = str(self.in_cluster.port)
        env.update(self.extra_env)
        for name, value in env.items():
            argv += ["--env", f"{name}={value}"]
        command = spec.get("command")
        if command:
            argv += ["--entrypoint", json.dumps(command)]
        return [*argv, self.image, *[str(a) for a in spec.get("args") or []]]

    def _image_user(self) -> str:
        config = engine.inspect(self.image).get("Config")
        return str(config.get("User", "")) if isinstance(config, dict) else ""

    def _volume_args(self) -> list[str]:
        pod, spec = self.pod, self.pod.container
        volumes = {volume["name"]: volume for volume in pod.pod.get("volumes") or []}
        argv: list[str] = []
        for mount in spec.get("volumeMounts") or []:
            if mount.get("subPath"):
                raise ChartContainerError(f"{pod.name}: subPath mounts are not run here")
            volume = volumes.get(mount["name"])
            if volume is None:
                raise ChartContainerError(f"{pod.name}: mounts a volume {mount['name']} it lacks")
            target = mount["mountPath"]
            if "emptyDir" in volume:
                options = [f"destination={target}", "tmpfs-mode=1777"]
                size = (volume["emptyDir"] or {}).get("sizeLimit")
                if size:
                    options.append(f"tmpfs-size={_quantity_bytes(str(size))}")
                argv += ["--mount", ",".join(["type=tmpfs", *options])]
            elif "configMap" in volume or "secret" in volume:
                kind = "configMap" if "configMap" in volume else "secret"
                data = self._source(kind, volume[kind])
                if data is None:
                    continue
                mode = int(volume[kind].get("defaultMode", 0o644))
                directory = self._files(mount["name"], data, volume[kind].get("items"), mode)
                argv += ["--volume", f"{directory}:{target}:ro"]
            elif "projected" in volume:
                mode = int(volume["projected"].get("defaultMode", 0o644))
                directory = self.work_dir / "volumes" / f"{mount['name']}-{uuid.uuid4().hex[:4]}"
                for source in volume["projected"].get("sources") or []:
                    kinds = [k for k in ("configMap", "secret") if k in source]
                    if not kinds:
                        raise ChartContainerError(f"{pod.name}: projected {source} not run here")
                    data = self._source(kinds[0], source[kinds[0]])
                    if data is not None:
                        items = source[kinds[0]].get("items")
                        self._files(mount["name"], data, items, mode, directory)
                directory.mkdir(parents=True, exist_ok=True)
                argv += ["--volume", f"{directory}:{target}:ro"]
            else:
                raise ChartContainerError(f"{pod.name}: volume {volume} is not run here")
        if self.in_cluster is not None and pod.automount:
            account = self._files(
                "serviceaccount",
                {"token": self.in_cluster.token, "ca.crt": self.in_cluster.ca,
                 "namespace": pod.namespace},
                None,
            )  # fmt: skip
            argv += ["--volume", f"{account}:{SERVICE_ACCOUNT_DIR}:ro"]
        return argv

    # -- life ----------------------------------------------------------------------------------

    def start(self) -> None:
        argv = self.argv()
        self.started_at, self.ready_after = time.monotonic(), None
        result = subprocess.run(
            argv, env=engine.engine_env(), capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            raise ChartContainerError(f"{self.pod.name}: podman run failed: {result.stderr}")
        self.container_id = result.stdout.strip()

    def state(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            engine.podman("inspect", "--format", "{{json .State}}", self.container_id)
        )
        return found

    def logs(self, lines: int = 40) -> str:
        result = subprocess.run(
            ["podman", "logs", "--tail", str(lines), self.container_id],
            env=engine.engine_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return result.stdout + result.stderr

    def get(self, path: str, timeout: float = 2) -> tuple[int, str]:
        """``GET path`` on the container's HTTP port: (status, body); status 0 if refused."""
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")
        except (urllib.error.URLError, OSError):
            return 0, ""

    def _probe(self, kind: str) -> bool:
        probe = self.pod.container[kind]
        status, _ = self.get(
            probe["httpGet"]["path"], timeout=float(probe.get("timeoutSeconds", 1))
        )
        return 200 <= status < 400

    def _not_found(self, kind: str) -> bool:
        status, _ = self.get(self.pod.container[kind]["httpGet"]["path"])
        return status == 404

    async def wait_ready(self, timeout: float = 120) -> None:
        """The kubelet's order: the startup probe until it passes (at most ``failureThreshold``
        periods), then the readiness probe until it passes; the container must stay running
        and the liveness probe must pass once ready. Polls every half second, not the
        rendered period, to measure the time to ready; fails with the container's log."""
        spec = self.pod.container
        deadline = time.monotonic() + timeout
        for kind in ("startupProbe", "readinessProbe"):
            if kind not in spec:
                continue
            limit = float(spec[kind].get("failureThreshold", 3)) * float(
                spec[kind].get("periodSeconds", 10)
            ) + float(spec[kind].get("initialDelaySeconds", 0))
            started = time.monotonic()
            while not await asyncio.to_thread(self._probe, kind):
                if self._not_found(kind):
                    raise ChartContainerError(
                        f"{self.pod.name}: {kind} on {spec[kind]['httpGet']['path']}: 404, "
                        "the service serves no such path"
                    )
                state = await asyncio.to_thread(self.state)
                if not state.get("Running"):
                    raise ChartContainerError(
                        f"{self.pod.name} exited with {state.get('ExitCode')} before its "
                        f"{kind} passed:\n{self.logs()}"
                    )
                elapsed = time.monotonic() - started
                if kind == "startupProbe" and elapsed > limit:
                    raise ChartContainerError(
                        f"{self.pod.name}: {kind} failed for {elapsed:.0f}s (the kubelet "
                        f"restarts it after {limit:.0f}s):\n{self.logs()}"
                    )
                if time.monotonic() > deadline:
                    raise ChartContainerError(
                        f"{self.pod.name}: {kind} not passed in {timeout:.0f}s:\n{self.logs()}"
                    )
                await asyncio.sleep(0.5)  # the probe period, shortened
        self.ready_after = time.monotonic() - self.started_at
        if "livenessProbe" in spec and not await asyncio.to_thread(self._probe, "livenessProbe"):
            raise ChartContainerError(f"{self.pod.name}: ready but not live:\n{self.logs()}")

    # -- what the fleet checks read of a running component (as of a ServiceProcess) ---------

    @property
    def spec(self) -> ServiceSpec:
        """The component as a :class:`ServiceSpec` (its name and arguments)."""
        args = (*(self.pod.container.get("command") or [])[1:], *self.pod.container.get("args", []))
        return ServiceSpec(self.pod.name, tuple(str(a) for a in args), {})

    @property
    def returncode(self) -> int | None:
        """None while the container runs, else its exit code (asked of podman at most every
        few seconds: a check loop asks often, and each ``podman inspect`` is a process)."""
        if not self.container_id:
            return None
        now = time.monotonic()
        if self._exit_code is None and now - self._checked_at > 3:
            self._checked_at = now
            state = self.state()
            if not state.get("Running"):
                self._exit_code = int(state.get("ExitCode", -1))
        return self._exit_code

    @property
    def alive(self) -> bool:
        return bool(self.container_id) and self.returncode is None

    def log_tail(self, lines: int = 40) -> str:
        return self.logs(lines)

    async def metrics(self) -> dict[str, float]:
        """``GET /metrics`` parsed."""
        status, body = await asyncio.to_thread(self.get, "/metrics")
        if status != 200:
            raise AssertionError(f"{self.pod.name}: GET /metrics answered {status}")
        return parse_metrics(body)

    def stop(self, grace: int = 10) -> int | None:
        """Stop (SIGTERM, then SIGKILL after ``grace`` seconds, as a pod's deletion does),
        remove, and return the exit code."""
        if not self.container_id:
            return None
        engine.podman("stop", "--time", str(grace), self.container_id, check=False, timeout=120)
        code = self.state().get("ExitCode")
        engine.podman("rm", "--force", self.container_id, check=False, timeout=120)
        return int(code) if code is not None else None


@contextlib.contextmanager
def stopped_at_exit(containers: list[PodContainer]) -> Iterator[list[PodContainer]]:
    """Yield ``containers`` and stop every started one at the end, whatever happened."""
    try:
        yield containers
    finally:
        for container in containers:
            with contextlib.suppress(Exception):
                container.stop()
