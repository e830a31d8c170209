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
- ``PODCOST_ADOPT_FIELD_MANAGERS``: comma-separated field managers whose deletion costs podcost
  takes over as its own (rewrites into its order, also when outside its band), besides its own
  ``podcost``; costs any other manager set (``kubectl-annotate``, a person, an unknown tool)
  are kept. Empty adopts nothing more [``manager``: the lablabs pod-deletion-cost-controller]
- ``PODCOST_CLOCK_SKEW``: seconds a record's time stamp (``emitted_at``, ``changed_at``) may
  lie ahead of this service's clock; a record stamped later is dead-lettered and counted
  (``podcost_messages_consumed{outcome="future"}``), never ordered before genuine ones [300]
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from podcost_contracts.stamps import DEFAULT_CLOCK_SKEW
from podcost_contracts.topics import ClusterName
from podcost_core.model import DEFAULT_ADOPTED_MANAGERS, FIELD_MANAGER

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
    adopt_field_managers: Annotated[tuple[str, ...], NoDecode] = DEFAULT_ADOPTED_MANAGERS
    clock_skew: float = Field(default=DEFAULT_CLOCK_SKEW, ge=0, le=86_400)

    @field_validator("adopt_field_managers", mode="before")
    @classmethod
    def _split_managers(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @property
    def adopted(self) -> frozenset[str]:
        """The field managers whose costs count as podcost's own: its own and the adopted."""
        return frozenset({FIELD_MANAGER, *self.adopt_field_managers})

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
