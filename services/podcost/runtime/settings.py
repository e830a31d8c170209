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
- ``PODCOST_FLEET_FILE``: the fleet registry (one cluster name a line; the chart mounts it from
  ``fleet.clusters``): the core serves only the clusters it lists, dead-letters and counts
  (``podcost_unregistered_records_total``) records of any other, and creates costs topics only
  for those; read again within a second of a change, without a restart [unset: every cluster
  that publishes is served, as embedded mode needs; a core over Kafka warns at start]
- ``PODCOST_FLEET_KEYS_FILE``: each cluster's signing keys, ``<cluster> <key> [<key>]`` a line
  (``podcost_contracts.signing``; the chart mounts it from a Secret): the core takes a snapshot
  of a cluster only if its watcher signed it with one of that cluster's keys, and dead-letters
  any other (``podcost_messages_consumed{outcome="forged"}``); two keys per cluster rotate
  without downtime; read again when it changes [unset: snapshots are not asked to be signed]
- ``PODCOST_ADOPT_FIELD_MANAGERS``: comma-separated field managers whose deletion costs podcost
  takes over as its own (rewrites into its order, also when outside its band), besides its own
  ``podcost``; costs any other manager set (``kubectl-annotate``, a person, an unknown tool)
  are kept. Empty adopts nothing more [``manager``: the lablabs pod-deletion-cost-controller]
- ``PODCOST_CLOCK_SKEW_SECONDS``: seconds a record's time stamp (``emitted_at``, ``changed_at``) may
  lie ahead of this service's clock; a record stamped later is dead-lettered and counted
  (``podcost_messages_consumed{outcome="future"}``), never ordered before genuine ones [300]
- ``PODCOST_EVENTS``: write Kubernetes Events about what podcost did (``podcost_kube.events``);
  never in a dry run [true]. ``PODCOST_EVENTS_BURST`` / ``PODCOST_EVENTS_REFILL_SECONDS``: the
  events one object may get at once, and the seconds until it may get one more [25 / 300]
- ``PODCOST_RETRY_INITIAL_SECONDS`` / ``PODCOST_RETRY_MAX_SECONDS``: the one retry policy of the
  process (``podcost_core.backoff``): the n-th wait after a failure is drawn at random up to
  ``initial × 2^(n-1)``, at most the maximum; a longer ``Retry-After`` from the server wins. Bus
  publishes and polls, informer relists and the annotator's writes all retry by it [0.2 / 10]

Renamed settings: a time is in seconds and its name says so (``*_SECONDS``). The old names are
still read, with a warning naming the new one, until the next minor version (:func:`renamed`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from podcost_contracts.stamps import DEFAULT_CLOCK_SKEW
from podcost_contracts.topics import ClusterName
from podcost_core.backoff import Backoff
from podcost_core.model import DEFAULT_ADOPTED_MANAGERS, FIELD_MANAGER
from podcost_core.strategies.registry import Registry, default_registry

log = logging.getLogger("podcost.settings")

#: The version after which the old names of renamed settings are no longer read.
OLD_NAMES_UNTIL = "0.2"


class Renamed(AliasChoices):
    """The environment names of a renamed setting: the new one first, then the old ones, still
    read (with a warning, :func:`warn_renamed`) until :data:`OLD_NAMES_UNTIL`; last, the field's
    Python name, so code constructs the settings by it (the class needs ``populate_by_name``)."""

    __slots__ = ()

    @property
    def new(self) -> str:
        return str(self.choices[0])

    @property
    def old(self) -> list[str]:
        return [str(choice) for choice in self.choices[1:-1]]


def renamed(new: str, *old: str, field: str) -> Renamed:
    """The ``validation_alias`` of a setting renamed from ``old`` to ``new`` (``field``: its
    Python name)."""
    return Renamed(new, *old, field)


def renamed_settings(model: type[BaseSettings]) -> dict[str, str]:
    """Every old environment name of ``model``'s renamed settings → its new name."""
    found: dict[str, str] = {}
    for info in model.model_fields.values():
        alias = info.validation_alias
        if isinstance(alias, Renamed):
            found.update(dict.fromkeys(alias.old, alias.new))
    return found


def warn_renamed(model: type[BaseSettings], environ: Mapping[str, str] | None = None) -> list[str]:
    """Log a warning for each old name of a renamed setting set in ``environ`` (default: the
    process environment); the old names it found."""
    present = {name.upper() for name in (os.environ if environ is None else environ)}
    used = [old for old in renamed_settings(model) if old.upper() in present]
    for old in used:
        new = renamed_settings(model)[old]
        log.warning(
            "%s is deprecated: set %s instead (the old name is read until %s)",
            old, new, OLD_NAMES_UNTIL, extra={"deprecated": old, "use": new},
        )  # fmt: skip
    return used


#: The shortest ``PODCOST_EXPLAIN_TOKEN`` accepted: a guessable token protects nothing.
MIN_TOKEN_LENGTH = 16


class ServiceSettings(BaseSettings):
    """Settings shared by every service (see the module docstring for the variables)."""

    model_config = SettingsConfigDict(
        env_prefix="PODCOST_", frozen=True, extra="ignore", populate_by_name=True
    )

    cluster: ClusterName = Field(
        default="local",
        description="The cluster name in workload keys cluster/namespace/kind/name; it also names "
        "the cluster's costs topic <PODCOST_TOPIC_COSTS>.<cluster>, so a DNS-1123 label. The "
        "watcher and annotator over Kafka refuse to start without it.",
    )
    http_host: str = Field(
        default="0.0.0.0",
        description="The address /healthz, /readyz, /metrics and the annotator's /explain "
        "listen on.",
    )
    http_port: int = Field(
        default=8080, ge=0, le=65535, description="The HTTP port; 0 disables the server."
    )
    explain_token: SecretStr | None = Field(
        default=None,
        description="When set, /explain answers only requests with Authorization: Bearer "
        "<token> (401 otherwise); at least 16 characters. Health, readiness and metrics stay "
        "open.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="The lowest level logged."
    )
    log_format: Literal["json", "text"] = Field(
        default="json", description="json (one object per line) or text."
    )
    dry_run: bool = Field(
        default=False, description="Decide and log everything, write nothing to the cluster."
    )
    policy_file: Path | None = Field(
        default=None,
        description="A policy file (YAML or JSON) used as the cluster default; unset: the "
        "built-in default policy.",
    )
    remote_strategies: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Comma-separated strategies that run in rankers of their own image (a "
        "plugin this image lacks): policies may name and weigh them here, and only their "
        "ranker needs their code. A ranker started for one of them fails.",
    )
    fleet_file: Path | None = Field(
        default=None,
        description="The fleet registry, one cluster name a line: the core serves only these "
        "clusters; unset: every cluster that publishes.",
    )
    fleet_keys_file: Path | None = Field(
        default=None,
        description="Each cluster's signing keys, one cluster a line: the core takes a "
        "snapshot only if signed with one of its cluster's keys; unset: no signature asked.",
    )
    adopt_field_managers: Annotated[tuple[str, ...], NoDecode] = Field(
        default=DEFAULT_ADOPTED_MANAGERS,
        description="Comma-separated field managers whose deletion costs podcost takes over as "
        "its own, besides its own; costs any other manager set are kept. Empty adopts nothing "
        "more.",
    )
    clock_skew_seconds: float = Field(
        default=DEFAULT_CLOCK_SKEW,
        ge=0,
        le=86_400,
        description="Seconds a record's time stamp (emitted_at, changed_at) may lie ahead of "
        "this service's clock; a record stamped later is dead-lettered and counted, never "
        "ordered before genuine ones.",
    )
    retry_initial_seconds: float = Field(
        default=0.2,
        gt=0,
        le=60,
        description="The longest first wait after a failure, for every retry of the process "
        "(bus, API server, cost writes); each wait is drawn at random up to a ceiling that "
        "doubles per failure in a row.",
        validation_alias=renamed(
            "PODCOST_RETRY_INITIAL_SECONDS",
            "PODCOST_ANNOTATOR_BACKOFF_INITIAL",
            field="retry_initial_seconds",
        ),
    )
    retry_max_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="The ceiling the waits between retries grow to; a longer Retry-After from "
        "the server wins.",
        validation_alias=renamed(
            "PODCOST_RETRY_MAX_SECONDS", "PODCOST_ANNOTATOR_BACKOFF_MAX", field="retry_max_seconds"
        ),
    )

    events: bool = Field(
        default=True,
        description="Write Kubernetes Events (events.k8s.io/v1) about what podcost did on the "
        "objects operators describe: a workload opted in or refused, costs written or kept, a "
        "write refused. Never in a dry run.",
    )
    events_burst: int = Field(
        default=25,
        ge=1,
        le=1000,
        description="Events one object may get at once; a repeat of one already written only "
        "counts into its series.",
    )
    events_refill_seconds: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="Seconds until an object that spent its events burst may get one more.",
    )

    @model_validator(mode="before")
    @classmethod
    def _warn_renamed(cls, data: Any) -> Any:
        warn_renamed(cls)
        return data

    @model_validator(mode="after")
    def _coherent_retry(self) -> Self:
        if self.retry_max_seconds < self.retry_initial_seconds:
            raise ValueError(
                f"PODCOST_RETRY_MAX_SECONDS ({self.retry_max_seconds}) must be at least "
                f"PODCOST_RETRY_INITIAL_SECONDS ({self.retry_initial_seconds})"
            )
        return self

    def backoff(self) -> Backoff:
        """The retry policy every retry of the process follows (never gives up by itself)."""
        return Backoff(self.retry_initial_seconds, self.retry_max_seconds)

    @field_validator("adopt_field_managers", "remote_strategies", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    def strategy_registry(self) -> Registry:
        """The installed strategies, plus the remote ones by name (``remote_strategies``)."""
        return default_registry().with_remote(self.remote_strategies)

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
