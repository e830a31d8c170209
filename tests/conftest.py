"""Session fixtures for the real servers: a Kafka broker and a Kubernetes control plane.

Both are built and started by the project's own code (``podcost_localinfra``) on free loopback
ports, once per test session, and stopped at its end. ``PODCOST_KAFKA`` / ``KUBECONFIG`` with
``PODCOST_USE_KUBECONFIG=1`` point the tests at servers already running (``make kafka-up`` /
``make cluster-up``) instead. The fleet tests ask for a second control plane
(``second_control_plane``), started the same way. Under ``CI=true`` a server that cannot be
built or started fails the run; elsewhere the tests that need it are skipped with the reason.

Selection: ``@pytest.mark.long`` tests run only when ``-m`` names ``long`` (``make test-long``),
and a ``-m long`` run that selects no test fails (``tests/support/selection.py``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from kubernetes_asyncio import config
from mode.threads import WorkerThread

from podcost_localinfra import build, cluster, kafka, kafka_secure, process
from tests.support.hang import set_timer
from tests.support.kube import KubeTestCluster
from tests.support.secure_kafka import LAYOUT, SecureBroker
from tests.support.selection import LONG, empty_long_run, wants_long

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(trylast=True)  # after ``-m`` and ``-k`` have deselected what they do
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markexpr = str(config.getoption("markexpr", "") or "")
    if not wants_long(markexpr):
        long_runs = [item for item in items if item.get_closest_marker(LONG) is not None]
        if long_runs:
            config.hook.pytest_deselected(items=long_runs)
            items[:] = [item for item in items if item.get_closest_marker(LONG) is None]
    reason = empty_long_run(markexpr, len(items))
    if reason is not None:
        raise pytest.UsageError(reason)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> bool | None:
    """A test that hangs shows its asyncio tasks' stacks (``tests/support/hang.py``)."""
    return set_timer(item, settings)


@pytest.fixture(autouse=True)
def _no_consumer_thread_outlives_its_test() -> Iterator[None]:
    """faust runs its consumer in a thread of its own (mode's ``WorkerThread``): one that outlived
    its test would go on fetching through every later test, and aiokafka draws from the global
    ``random`` at each fetch, which hypothesis takes for a strategy that uses it. The test that
    leaves one running fails, by name."""
    yield
    deadline = time.monotonic() + 10.0
    while True:
        left = [t for t in threading.enumerate() if isinstance(t, WorkerThread) and t.is_alive()]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"threads outlived the test: {[t.name for t in left]}"


def unavailable(message: str) -> NoReturn:
    """What a test does when a real server or tool it needs is missing: skipped, and failed under
    ``CI=true``, where a missing server is a failure."""
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _unavailable(what: str, error: BaseException) -> NoReturn:
    unavailable(f"{what} is unavailable: {error}")


@dataclass(frozen=True)
class Broker:
    """A running Kafka broker: its bootstrap address, and its run directory when it is one of
    ``podcost_localinfra``'s (which a test may stop and start again)."""

    bootstrap: str
    run_dir: Path | None = None


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A real Kafka broker."""
    external = os.environ.get("PODCOST_KAFKA")
    if external:
        yield Broker(external)
        return
    try:
        broker = kafka.start(tmp_path_factory.mktemp("kafka"))
    except (build.BuildError, process.StartError, OSError) as error:
        _unavailable("the Kafka broker", error)
    yield Broker(broker.bootstrap, broker.run_dir)
    broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Broker) -> str:
    """The bootstrap address of a real Kafka broker."""
    return kafka_broker.bootstrap


@pytest.fixture(scope="session")
def secure_kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A real Kafka broker that requires TLS and SASL/SCRAM, with the ACLs of
    ``tests.support.secure_kafka.LAYOUT``. ``PODCOST_SECURE_KAFKA_RUN_DIR`` points at one
    already running (``podcost-localinfra kafka-up --secure --cluster prod-eu-1 --cluster
    prod-us-1``: its run directory)."""
    external = os.environ.get("PODCOST_SECURE_KAFKA_RUN_DIR")
    if external:
        run_dir = Path(external)
        found = kafka_secure.read_secrets(run_dir)
        bootstrap = (run_dir / "bootstrap").read_text().strip()
        yield SecureBroker(bootstrap, found.ca_file, dict(found.passwords), run_dir)
        return
    try:
        broker = kafka.start(tmp_path_factory.mktemp("kafka-secure"), secure=LAYOUT)
    except (build.BuildError, process.StartError, OSError) as error:
        _unavailable("the secure Kafka broker", error)
    assert broker.secrets is not None
    yield SecureBroker(
        broker.bootstrap, broker.secrets.ca_file, dict(broker.secrets.passwords), broker.run_dir
    )
    broker.stop()


@dataclass(frozen=True)
class ControlPlane:
    """A running control plane: where its kubeconfig is, and its run directory when it is one
    of ``podcost_localinfra``'s (whose kube-apiserver a test may stop and start again)."""

    kubeconfig: Path
    run_dir: Path | None = None


def _control_plane(
    factory: pytest.TempPathFactory, external: str, run_dir: str, what: str
) -> Iterator[ControlPlane]:
    """The one running at ``$<external>`` when ``PODCOST_USE_KUBECONFIG=1``, else one started in
    a fresh ``run_dir`` and stopped after the session."""
    if os.environ.get("PODCOST_USE_KUBECONFIG") == "1" and os.environ.get(external):
        kubeconfig = Path(os.environ[external])
        ours = (kubeconfig.parent / "cluster.json").exists()  # ``make cluster-up``'s
        yield ControlPlane(kubeconfig, kubeconfig.parent if ours else None)
        return
    try:
        started = cluster.start(factory.mktemp(run_dir))
    except (build.BuildError, process.StartError, OSError) as error:
        _unavailable(what, error)
    yield ControlPlane(started.kubeconfig, started.run_dir)
    started.stop()


async def _kube(plane: ControlPlane) -> AsyncIterator[KubeTestCluster]:
    api = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    async with api:
        yield KubeTestCluster(api)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A real kube-apiserver with kube-controller-manager, kube-scheduler and kwok."""
    yield from _control_plane(
        tmp_path_factory, "KUBECONFIG", "cluster", "the Kubernetes control plane"
    )


@pytest.fixture(scope="session")
async def kube(control_plane: ControlPlane) -> AsyncIterator[KubeTestCluster]:
    """Helpers over the real API server (nodes, Deployments, scaling, victims)."""
    async for helpers in _kube(control_plane):
        yield helpers


@pytest.fixture(scope="session")
def second_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Another real control plane, for the fleet tests (two clusters, one core): started the
    same way as ``control_plane``, only by the tests that ask for it. ``PODCOST_KUBECONFIG_2``
    with ``PODCOST_USE_KUBECONFIG=1`` points at one already running."""
    yield from _control_plane(
        tmp_path_factory, "PODCOST_KUBECONFIG_2", "cluster-2",
        "the second Kubernetes control plane",
    )  # fmt: skip


@pytest.fixture(scope="session")
async def second_kube(second_control_plane: ControlPlane) -> AsyncIterator[KubeTestCluster]:
    """``kube`` for the second control plane."""
    async for helpers in _kube(second_control_plane):
        yield helpers


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After the run: how many fuzz cases ran, per test (``tests/support/fuzz.py``)."""
    fuzz = sys.modules.get("tests.support.fuzz")
    for line in fuzz.summary() if fuzz is not None else []:
        terminalreporter.write_line(line)
