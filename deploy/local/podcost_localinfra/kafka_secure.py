"""What makes the local broker a secure one: TLS, SCRAM users, one per component, and topic ACLs.

Called by ``kafka.start(run_dir, secure=Layout(...))`` (``podcost-localinfra kafka-up --secure``,
the ``secure_kafka_broker`` test fixture). Nothing here is a stand-in: the certificates are made
with openssl (a CA, and a broker certificate for ``IP:127.0.0.1`` and ``DNS:localhost`` in a
PKCS12 keystore), the users are SCRAM-SHA-512 credentials written into the broker's metadata when
its storage is formatted (``StorageTool format --add-scram``), and the ACLs are created by
Kafka's own ``kafka.admin.AclCommand`` through the SASL_SSL listener as the super user ``admin``.

The broker's listeners:

- ``SASL_SSL`` on a free port of 127.0.0.1: the only one clients use, also the inter-broker one.
- ``CONTROLLER``, ``SASL_PLAINTEXT`` with the PLAIN mechanism on another free port of
  127.0.0.1: the broker's own link to its KRaft controller. PLAIN with a static JAAS user, so
  that this link needs nothing from the metadata log the SCRAM credentials live in (the layout
  described in KAFKA-15513). Only ``admin`` has a password there, and it is a super user.

:func:`acl_matrix` is the policy, as data: each component's principal may write (and create)
only its own output topic and the dead-letter topic, and read only its inputs, in its own
consumer group. ``allow.everyone.if.no.acl.found=false``: whatever is not granted is refused.
"""

from __future__ import annotations

import itertools
import json
import secrets
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import process

#: The SASL mechanism of the client listener.
MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"

#: The secure listeners and what they need; the broker template in ``kafka`` adds the rest.
LISTENERS = """\
listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=SASL_SSL://127.0.0.1:{port}
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms={mechanism}
sasl.mechanism.inter.broker.protocol={mechanism}
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=\
org.apache.kafka.common.security.scram.ScramLoginModule required \
username="{admin}" password="{admin_password}";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=\
org.apache.kafka.common.security.plain.PlainLoginModule required \
username="{admin}" password="{admin_password}" user_{admin}="{admin_password}";
ssl.keystore.type=PKCS12
ssl.keystore.location={keystore}
ssl.keystore.password={store_password}
ssl.truststore.type=PKCS12
ssl.truststore.location={truststore}
ssl.truststore.password={store_password}
ssl.client.auth=none
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:{admin}
allow.everyone.if.no.acl.found=false
"""


@dataclass(frozen=True)
class Layout:
    """The names the ACLs are about. The defaults are the services' own defaults
    (``podcost_contracts.topics``, the ranker's group prefix, the aggregator's app id, the
    annotator's group prefix); ``tests/unit/test_kafka_acls.py`` checks that they
    agree."""

    workloads: str = "podcost.workloads"
    ranks: str = "podcost.ranks"
    costs: str = "podcost.costs"
    """The prefix of the per-cluster costs topics, ``<costs>.<cluster>``."""
    deadletter: str = "podcost.deadletter"
    clusters: tuple[str, ...] = ("local",)
    """One watcher principal, ``watcher-<cluster>``, and one annotator principal,
    ``annotator-<cluster>``, per cluster."""
    ranker_group_prefix: str = "podcost-ranker-"
    aggregator_app_id: str = "podcost-aggregator"
    """The faust app id: the aggregator's consumer group and its internal topics' prefix."""
    annotator_group: str = "podcost-annotator"
    """A cluster's annotators join ``<annotator_group>.<cluster>``."""

    def costs_for(self, cluster: str) -> str:
        return f"{self.costs}.{cluster}"


def annotator_user(cluster: str) -> str:
    return f"annotator-{cluster}"


def watcher_user(cluster: str) -> str:
    """Each cluster's watcher has its own principal, so one cluster's credential can be revoked
    alone; which cluster a snapshot is of is proven by its signature (the core's keys file)."""
    return f"watcher-{cluster}"


def users(layout: Layout) -> list[str]:
    """The component principals (SCRAM user names), ``admin`` not included."""
    return [
        *(watcher_user(c) for c in layout.clusters),
        "ranker",
        "aggregator",
        *(annotator_user(c) for c in layout.clusters),
    ]


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW rule: ``User:<principal>`` may ``operation`` on a ``resource`` named ``name``
    (or, with ``pattern`` ``prefixed``, on every one whose name starts with ``name``), from
    any host."""

    principal: str
    resource: str
    """``topic`` or ``group``."""
    name: str
    operation: str
    """Kafka's operation names: ``Read``, ``Write``, ``Create``, ``Describe``."""
    pattern: str = "literal"


def acl_matrix(layout: Layout) -> list[Acl]:
    """Every ACL of the secure broker, sorted. ``Read`` and ``Write`` imply ``Describe`` in
    Kafka; ``Create`` on a topic a component writes lets it create that topic at start-up
    (``ensure_topics``); the idempotent producer needs no cluster permission since Kafka 3.0
    (``Write`` on a topic suffices, KIP-679)."""
    rules: list[Acl] = []

    def writes(principal: str, topic: str, pattern: str = "literal") -> None:
        rules.extend(Acl(principal, "topic", topic, op, pattern) for op in ("Write", "Create"))

    def reads(principal: str, topic: str) -> None:
        rules.append(Acl(principal, "topic", topic, "Read"))

    for cluster in layout.clusters:
        writes(watcher_user(cluster), layout.workloads)
        writes(watcher_user(cluster), layout.deadletter)

    reads("ranker", layout.workloads)
    rules.append(Acl("ranker", "group", layout.ranker_group_prefix, "Read", "prefixed"))
    writes("ranker", layout.ranks)
    writes("ranker", layout.deadletter)

    # The faust app reads snapshots and ranks; its group and its internal topics (the tables'
    # changelogs, the partition assignor's leader topic) are named by its app id.
    app = layout.aggregator_app_id
    reads("aggregator", layout.workloads)
    reads("aggregator", layout.ranks)
    rules.append(Acl("aggregator", "group", app, "Read"))
    writes("aggregator", f"{layout.costs}.", "prefixed")
    writes("aggregator", layout.deadletter)
    rules.extend(
        Acl("aggregator", "topic", f"{app}-", op, "prefixed") for op in ("Read", "Write", "Create")
    )

    for cluster in layout.clusters:
        user = annotator_user(cluster)
        reads(user, layout.costs_for(cluster))
        rules.append(Acl(user, "group", f"{layout.annotator_group}.{cluster}", "Read"))
        writes(user, layout.deadletter)
    return sorted(rules)


def acl_command_args(rules: Iterable[Acl]) -> list[list[str]]:
    """``AclCommand --add`` argument lists that create ``rules``: one per principal, pattern
    type and set of operations (the command applies every operation to every resource given)."""
    by_resource: dict[tuple[str, str, str, str], set[str]] = {}
    for rule in rules:
        key = (rule.principal, rule.pattern, rule.resource, rule.name)
        by_resource.setdefault(key, set()).add(rule.operation)
    calls: dict[tuple[str, str, tuple[str, ...]], list[tuple[str, str]]] = {}
    for (principal, pattern, resource, name), ops in sorted(by_resource.items()):
        calls.setdefault((principal, pattern, tuple(sorted(ops))), []).append((resource, name))
    argv: list[list[str]] = []
    for (principal, pattern, operations), resources in calls.items():
        args = ["--add", "--allow-principal", f"User:{principal}", "--allow-host", "*",
                "--resource-pattern-type", pattern]  # fmt: skip
        args += itertools.chain.from_iterable(("--operation", op) for op in operations)
        args += itertools.chain.from_iterable((f"--{kind}", name) for kind, name in resources)
        argv.append(args)
    return argv


@dataclass(frozen=True)
class Secrets:
    """Where a secure broker's client material is, and the passwords (``credentials.json`` in
    the run directory, readable by its owner only)."""

    ca_file: Path
    """The CA certificate (PEM) clients verify the broker with."""
    passwords: Mapping[str, str]
    """SCRAM password by user name, ``admin`` included."""
    admin_config: Path
    """A Kafka client config (``--command-config``) that is ``admin`` over SASL_SSL."""


def _run(argv: list[str], cwd: Path) -> None:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise process.StartError(f"{' '.join(argv[:2])} failed: {result.stderr.strip()[-2000:]}")


def _openssl(tls_dir: Path, *args: str) -> None:
    _run(["openssl", *args], tls_dir)


def make_certificates(tls_dir: Path, store_password: str) -> None:
    """A CA, a broker key and certificate signed by it (SAN ``IP:127.0.0.1``, ``DNS:localhost``),
    the broker's PKCS12 keystore and a PKCS12 truststore with the CA (for the broker's own
    SASL_SSL client side)."""
    tls_dir.mkdir(parents=True, exist_ok=True)
    days = "30"
    _openssl(tls_dir, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", days,
             "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=podcost local CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    _openssl(tls_dir, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key",
             "-out", "broker.csr", "-subj", "/CN=localhost")  # fmt: skip
    (tls_dir / "broker.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl(tls_dir, "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", days, "-extfile", "broker.ext",
             "-out", "broker.pem")  # fmt: skip
    _openssl(tls_dir, "pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key",
             "-certfile", "ca.pem", "-name", "broker", "-out", "broker.p12",
             "-passout", f"pass:{store_password}")  # fmt: skip
    _run(["keytool", "-importcert", "-noprompt", "-alias", "podcost-ca", "-file", "ca.pem",
          "-keystore", "truststore.p12", "-storetype", "PKCS12", "-storepass", store_password],
         tls_dir)  # fmt: skip


def prepare(run_dir: Path, layout: Layout) -> tuple[Secrets, str]:
    """Certificates, passwords and the admin client config in ``run_dir``; returns them and the
    ``server.properties`` lines of the secure listeners (with ``{port}`` and
    ``{controller_port}`` left to fill)."""
    tls_dir = run_dir / "tls"
    store_password = secrets.token_hex(16)
    make_certificates(tls_dir, store_password)
    passwords = {user: secrets.token_hex(16) for user in [ADMIN, *users(layout)]}
    credentials = run_dir / "credentials.json"
    credentials.touch(mode=0o600)
    credentials.write_text(json.dumps(passwords, indent=2) + "\n")
    admin_config = run_dir / "admin.properties"
    admin_config.touch(mode=0o600)
    admin_config.write_text(
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={MECHANISM}\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{passwords[ADMIN]}";\n'
        "ssl.truststore.type=PKCS12\n"
        f"ssl.truststore.location={tls_dir / 'truststore.p12'}\n"
        f"ssl.truststore.password={store_password}\n"
    )
    listeners = LISTENERS.format(
        port="{port}",
        controller_port="{controller_port}",
        mechanism=MECHANISM,
        admin=ADMIN,
        admin_password=passwords[ADMIN],
        keystore=tls_dir / "broker.p12",
        truststore=tls_dir / "truststore.p12",
        store_password=store_password,
    )
    return Secrets(tls_dir / "ca.pem", passwords, admin_config), listeners


def scram_format_args(passwords: Mapping[str, str]) -> list[str]:
    """``StorageTool format`` arguments that write every user's SCRAM credential."""
    return list(
        itertools.chain.from_iterable(
            ("--add-scram", f"{MECHANISM}=[name={user},password={password}]")
            for user, password in passwords.items()
        )
    )


def read_secrets(run_dir: Path) -> Secrets:
    """The :class:`Secrets` of a secure broker already prepared in ``run_dir``."""
    return Secrets(
        run_dir / "tls" / "ca.pem",
        json.loads((run_dir / "credentials.json").read_text()),
        run_dir / "admin.properties",
    )


def client_env(run_dir: Path, user: str) -> dict[str, str]:
    """The ``PODCOST_KAFKA_*`` variables that make a podcost service ``user`` on the secure
    broker of ``run_dir`` (bootstrap address included)."""
    found = read_secrets(run_dir)
    return {
        "PODCOST_KAFKA": (run_dir / "bootstrap").read_text().strip(),
        "PODCOST_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "PODCOST_KAFKA_SSL_CAFILE": str(found.ca_file),
        "PODCOST_KAFKA_SASL_MECHANISM": MECHANISM,
        "PODCOST_KAFKA_SASL_USERNAME": user,
        "PODCOST_KAFKA_SASL_PASSWORD": found.passwords[user],
    }
