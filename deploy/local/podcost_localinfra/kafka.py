"""A real single-node Apache Kafka broker (KRaft, broker+controller in one JVM) on 127.0.0.1.

Called by the CLI (``make kafka-up`` / ``make kafka-down``) and by the test fixtures. Ports are
free ports picked at start, so two runs never collide; the run directory holds the config, the
data, the log and the pid. ``stop_broker`` / ``start_broker`` take a running broker away by its
pid and bring it back (same ports, node id, data and log dirs; KRaft recovers from its own
storage): a real broker outage for the tests.

``start(run_dir, secure=Layout(...))`` starts the secure variant instead (``kafka_secure``): a
SASL_SSL listener with SCRAM users, one per component, and topic ACLs; no PLAINTEXT listener.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import build, kafka_secure, process
from .kafka_secure import Layout, Secrets

BROKER = "kafka"
#: The line the broker logs once it serves; a restart appends to the same log.
STARTED = "Kafka Server started"

PLAINTEXT_LISTENERS = """\
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
"""

SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
controller.listener.names=CONTROLLER
log.dirs={data_dir}
num.partitions=3
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.flush.interval.messages=1000000
# The record limit (message.max.bytes) is Kafka's default, 1,048,588 bytes a batch: the tests
# meet the limit production does.
"""

LOG4J_PROPERTIES = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaServer=INFO
log4j.logger.kafka.server.KafkaRaftServer=INFO
log4j.logger.kafka.server.BrokerServer=INFO
"""


@dataclass(frozen=True)
class KafkaBroker:
    """A started broker."""

    run_dir: Path
    bootstrap: str
    pid: int
    started_in: float
    secrets: Secrets | None = None
    """The secure broker's CA file, passwords and admin config; ``None`` for PLAINTEXT."""

    def stop(self) -> None:
        process.stop_all(self.run_dir)

    def stop_broker(self) -> int:
        """See :func:`stop_broker`."""
        return stop_broker(self.run_dir)

    def start_broker(self, timeout: float = 90.0) -> float:
        """See :func:`start_broker`."""
        return start_broker(self.run_dir, timeout)


def stop_broker(run_dir: Path) -> int:
    """Stop the broker of ``run_dir`` by its pid (SIGTERM: a controlled shutdown, SIGKILL after
    15 s); returns the pid. Every client request fails (connection refused) until
    :func:`start_broker`."""
    return process.stop(run_dir, BROKER)


def start_broker(run_dir: Path, timeout: float = 90.0) -> float:
    """Start the broker of ``run_dir`` again with the command line it was started with (same
    ports, node id and log dirs, so the same topics, offsets and groups); wait until it serves
    again (a new "Kafka Server started" in its log and its port open). Returns the seconds."""
    port = int((run_dir / "bootstrap").read_text().strip().rsplit(":", 1)[1])
    log = run_dir / "logs" / f"{BROKER}.log"
    seen = log.read_text(errors="replace").count(STARTED) if log.exists() else 0
    daemon = process.restart(run_dir, BROKER)
    return process.wait_until(
        daemon,
        lambda: process.tcp_open(port) and log.read_text(errors="replace").count(STARTED) > seen,
        timeout,
        "serving again",
    )


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise process.StartError("java is not on PATH; the Kafka broker needs a JRE (17+)")
    return java


def new_cluster_id() -> str:
    """A KRaft cluster id: the 22-character URL-safe base64 of a random UUID, as Kafka's
    ``Uuid.randomUuid()`` makes it, which also draws again when the text starts with ``-``
    (the storage tool would read such an id as an option: 1 start in 64 failed)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def start(run_dir: Path, timeout: float = 90.0, *, secure: Layout | None = None) -> KafkaBroker:
    """Build (if needed), configure, format and start a broker in ``run_dir``; with ``secure``,
    the SASL_SSL broker whose users and ACLs ``kafka_secure`` derives from that layout."""
    lib = build.ensure_kafka_tools()
    run_dir.mkdir(parents=True, exist_ok=True)
    port, controller_port = process.free_port(), process.free_port()
    data_dir = run_dir / "data"
    secrets: Secrets | None = None
    listeners, scram = PLAINTEXT_LISTENERS, []
    if secure is not None:
        secrets, listeners = kafka_secure.prepare(run_dir, secure)
        scram = kafka_secure.scram_format_args(secrets.passwords)
    (run_dir / "server.properties").write_text(
        SERVER_PROPERTIES.format(port=port, controller_port=controller_port, data_dir=data_dir)
        + listeners.format(port=port, controller_port=controller_port)
    )
    (run_dir / "log4j.properties").write_text(LOG4J_PROPERTIES)
    cluster_id = new_cluster_id()
    classpath = f"{lib}/*"
    log4j = f"-Dlog4j.configuration=file:{run_dir / 'log4j.properties'}"
    _tool(
        [_java(), log4j, "-cp", classpath, "kafka.tools.StorageTool", "format",
         "-t", cluster_id, "-c", str(run_dir / "server.properties"), "--ignore-formatted",
         *scram],
        "format the storage",
    )  # fmt: skip
    started = time.monotonic()
    daemon = process.start(
        run_dir,
        BROKER,
        [_java(), "-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1",
         "-Djava.awt.headless=true", log4j, "-cp", classpath, "kafka.Kafka",
         str(run_dir / "server.properties")],
    )  # fmt: skip
    process.wait_until(
        daemon,
        lambda: process.tcp_open(port) and STARTED in daemon.log.read_text(errors="replace"),
        timeout,
        "serving",
    )
    bootstrap = f"127.0.0.1:{port}"
    if secure is not None and secrets is not None:
        acl_command = [_java(), log4j, "-XX:TieredStopAtLevel=1", "-cp", classpath,
                       "kafka.admin.AclCommand", "--bootstrap-server", bootstrap,
                       "--command-config", str(secrets.admin_config)]  # fmt: skip
        calls = kafka_secure.acl_command_args(kafka_secure.acl_matrix(secure))
        try:
            # One JVM per call (about 2.5 s each, mostly start-up): a few at a time.
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda args: _tool([*acl_command, *args], "create ACLs"), calls))
        except process.StartError:
            process.stop_all(run_dir)
            raise
    (run_dir / "bootstrap").write_text(bootstrap + "\n")
    return KafkaBroker(run_dir, bootstrap, daemon.pid, time.monotonic() - started, secrets)


def _tool(argv: list[str], doing: str) -> None:
    """Run one of Kafka's command-line tools; a failure is a ``StartError`` with its output."""
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-3000:]
        raise process.StartError(f"kafka could not {doing}: {output}")
