"""Settings every service reads, declared once with their environment variable and meaning.

Each service's composition root (``bootstrap``) takes a ``ServiceSettings`` (and the bus
settings from ``podcost_bus.BusSettings``); values are validated at start, so a bad value stops
the service with the variable named. Variables (defaults in brackets):

- ``PODCOST_CLUSTER``: the cluster name in workload keys ``cluster/namespace/kind/name``; it
  also names the cluster's costs topic ``<PODCOST_TOPIC_COSTS>.<cluster>``, so a DNS-1123 label
  [local; ``podcost watcher`` and ``podcost annotator`` over Kafka refuse to start without it,
  since two agents with the same name would write each other's decisions]
- ``PODCOST_HTTP_HOST`` / ``PODCOST_HTTP_PORT``: where ``/healthz``, ``/readyz`` and
  ``/metrics`` are served, and the annotator's ``/explain/{namespace}/{pod}`` [0.0.0.0 / 8080;
  port 0 disables the server]
- ``PODCOST_EXPLAIN_TOKEN``: when set, ``/explain`` answers only requests with
  ``Authorization: Bearer <token>`` (401 otherwise); health, readiness and metrics stay open.
  At least 16 characters (e.g. ``openssl rand -hex 32``) [none: /explain is open]
- ``PODCOST_LOG_LEVEL``: DEBUG, INFO, WARNING or ERROR [INFO]
- ``PODCOST_LOG_FORMAT``: json (one object per line) or text [json]
- ``PODCOST_DRY_RUN``: decide and log everything, write nothing to the cluster [false]
- ``PODCOST_POLICY_FILE``: a policy file (YAML or JSON) used as the cluster default [the
  built-in default policy]
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from podcost_contracts.topics import ClusterName

#: The shortest ``PODCOST_EXPLAIN_TOKEN`` accepted: a guessable token protects nothing.
MIN_TOKEN_LENGTH = 16


class ServiceSettings(BaseSettings):
    """Settings shared by every service (see the module docstring for the variables)."""

    model_config = SettingsConfigDict(env_prefix="PODCOST_", frozen=True, extra="ignore")

    cluster: ClusterName = "local"
    http_host: str = "0.0.0.0"
    http_port: int = Field(default=8080, ge=0, le=65535)
    explain_token: SecretStr | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    dry_run: bool = False
    policy_file: Path | None = None

    @field_validator("explain_token")
    @classmethod
    def _token_long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and len(token.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(f"a token needs at least {MIN_TOKEN_LENGTH} characters")
        return token

    @property
    def cluster_explicit(self) -> bool:
        """Whether ``PODCOST_CLUSTER`` was given (not the default ``local``)."""
        return "cluster" in self.model_fields_set
