"""The secure broker's layout for the tests, and bus settings that are one of its principals.

Used by the ``secure_kafka_broker`` fixture (``tests/conftest.py``) and the tests of the secure
broker (``tests/integration/test_secure_kafka.py``, ``tests/e2e/test_secure_pipeline.py``): the
broker is started once per session with :data:`LAYOUT`, whose topics are the services' default
names (so its ACLs are about what the services use unless told otherwise) and whose clusters are
the snapshots' cluster and one more (two annotator principals, to show that neither reads the
other's costs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podcost_bus import BusSettings
from podcost_localinfra.kafka_secure import MECHANISM, Layout
from tests.support.snapshots import CLUSTER

OTHER_CLUSTER = "prod-us-1"
LAYOUT = Layout(clusters=(CLUSTER, OTHER_CLUSTER))


@dataclass(frozen=True)
class SecureBroker:
    """A running SASL_SSL broker: its address, its CA (PEM) and each user's password."""

    bootstrap: str
    ca_file: Path
    passwords: dict[str, str]
    run_dir: Path

    def settings(self, user: str, *, password: str | None = None, **fields: Any) -> BusSettings:
        """Bus settings that connect as ``user`` (with its own password unless ``password``)
        over SASL_SSL, verifying the broker with the CA; ``fields`` override the rest."""
        return BusSettings(
            bootstrap_servers=self.bootstrap,
            client_id=f"podcost-test-{user}",
            security_protocol="SASL_SSL",
            ssl_cafile=self.ca_file,
            sasl_mechanism=MECHANISM,
            sasl_username=user,
            sasl_password=self.passwords[user] if password is None else password,
            **fields,
        )

    def env(self, user: str) -> dict[str, str]:
        """The ``PODCOST_KAFKA_*`` variables of :meth:`settings`, for a podcost process."""
        return {
            "PODCOST_KAFKA": self.bootstrap,
            "PODCOST_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "PODCOST_KAFKA_SSL_CAFILE": str(self.ca_file),
            "PODCOST_KAFKA_SASL_MECHANISM": MECHANISM,
            "PODCOST_KAFKA_SASL_USERNAME": user,
            "PODCOST_KAFKA_SASL_PASSWORD": self.passwords[user],
        }
