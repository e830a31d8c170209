"""The annotator's own settings, declared once with their environment variable and meaning.

``podcost annotator`` reads them from the environment and hands them to
``podcost.annotator.bootstrap`` (tests construct them directly); they are validated at start, so
a bad value stops the service with the variable named. The shared settings (cluster, HTTP,
logs, ``PODCOST_DRY_RUN``) are ``podcost.runtime.settings.ServiceSettings``; the bus and topics
are ``podcost_bus.BusSettings``.

Variables (defaults in brackets), all prefixed ``PODCOST_ANNOTATOR_``:

- ``QPS`` / ``BURST``: API requests per second on average, and at once after a quiet spell
  [20 / 40]. Every request counts: the read before a write as well as the write.
- ``MAX_IN_FLIGHT``: API requests in flight at once [8]
- ``HIGH_WATER`` / ``LOW_WATER``: pause consuming when this many pod writes are pending; resume
  when they are down to the low mark [1000 / 500]
- ``MAX_ATTEMPTS``: tries of one write whose pod keeps changing between the read and the write
  (409, a refused compare-and-swap) before it is counted as an error and the annotator moves
  on [5]. 429, 5xx, timeouts and refused connections are retried for as long as they last: a
  write is never given up because the API server is down.
- ``UNREADY_AFTER_SECONDS``: seconds the API server may fail every request (5xx, timeouts, no
  answer) before ``/readyz`` reports the annotator not ready; ready again at the first answer [10]
- ``REQUEST_TIMEOUT_SECONDS``: seconds one API request may take before it counts as failed [10]
- ``OVERWRITE_FOREIGN``: also overwrite costs another field manager set (a person, another
  tool) [false: leave them alone]
- ``VIEW_GRACE_SECONDS``: seconds, counted from when a decision was published (or consumed, if
  earlier), that its write may wait for the annotator's own view of the cluster to show what
  the watcher saw: the owners (ReplicaSet, Deployment) of the pod it names, or the workload's
  opt-in (the view may not have seen a brand-new ReplicaSet or a fresh opt-in yet); then the
  write is refused [5]. A decision whose pod or workload the view contradicts is refused at
  once.
- ``UNKNOWN_POD_BUDGET``: pods of one record the annotator's view does not show (too new for
  it, or invented) that it reads from the API server to verify; the rest of that record's
  unknown pods are refused without a request (``podcost_refusals{reason="unknown_pod"}``), so
  a forged record cannot spend the QPS budget on pods that do not exist [100]
- ``POLL_RECORDS``: most records taken from the bus at once; the queue can pass the high-water
  mark by at most one such batch [100]
- ``GROUP``: the prefix of the consumer group; a cluster's annotators join
  ``<GROUP>.<PODCOST_CLUSTER>`` and share its costs topic's partitions [podcost-annotator]

How long a retried write waits is the process's one retry policy, ``PODCOST_RETRY_*``
(``podcost.runtime.settings``). Renamed, still read with a warning: ``BACKOFF_INITIAL`` and
``BACKOFF_MAX`` (now ``PODCOST_RETRY_INITIAL_SECONDS`` / ``PODCOST_RETRY_MAX_SECONDS``),
``UNREADY_AFTER``, ``REQUEST_TIMEOUT``, ``VIEW_GRACE`` (now ``*_SECONDS``).
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from podcost.runtime.settings import renamed, warn_renamed

ENV_PREFIX = "PODCOST_ANNOTATOR_"
DEFAULT_GROUP = "podcost-annotator"


class AnnotatorSettings(BaseSettings):
    """How hard the annotator may push the API server (see the module docstring)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="ignore", populate_by_name=True
    )

    qps: float = Field(
        default=20.0, gt=0, le=10_000, description="API requests per second, on average."
    )
    burst: int = Field(
        default=40, ge=1, le=100_000, description="API requests at once after a quiet spell."
    )
    max_in_flight: int = Field(
        default=8, ge=1, le=1024, description="API requests in flight at once."
    )
    high_water: int = Field(
        default=1000, ge=1, description="Pending pod writes at which consumption pauses."
    )
    low_water: int = Field(
        default=500, ge=0, description="Pending pod writes at which paused consumption resumes."
    )
    max_attempts: int = Field(
        default=5, ge=1, le=100, description="Tries of one write that keeps conflicting."
    )
    unready_after_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds the API server may fail every request (5xx, timeouts, no answer) "
        "before /readyz reports the annotator not ready; ready again at the first answer.",
        validation_alias=renamed(
            f"{ENV_PREFIX}UNREADY_AFTER_SECONDS",
            f"{ENV_PREFIX}UNREADY_AFTER",
            field="unready_after_seconds",
        ),
    )
    request_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Seconds one API request may take before it counts as failed.",
        validation_alias=renamed(
            f"{ENV_PREFIX}REQUEST_TIMEOUT_SECONDS",
            f"{ENV_PREFIX}REQUEST_TIMEOUT",
            field="request_timeout_seconds",
        ),
    )
    overwrite_foreign: bool = Field(
        default=False, description="Also overwrite deletion costs another field manager set."
    )
    view_grace_seconds: float = Field(
        default=5.0,
        ge=0,
        le=600,
        description="Seconds, counted from when a decision was published, that its write may "
        "wait for the annotator's own view of the cluster to show the owners of the pod it "
        "names; then the write is refused.",
        validation_alias=renamed(
            f"{ENV_PREFIX}VIEW_GRACE_SECONDS", f"{ENV_PREFIX}VIEW_GRACE", field="view_grace_seconds"
        ),
    )
    unknown_pod_budget: int = Field(
        default=100,
        ge=0,
        le=100_000,
        description="Pods unknown to the view that one record may have read before the rest "
        "of them are refused.",
    )
    poll_records: int = Field(
        default=100, ge=1, le=10_000, description="Most records taken from the bus at once."
    )
    group: str = Field(
        default=DEFAULT_GROUP,
        min_length=1,
        max_length=180,
        pattern=r"^[a-zA-Z0-9._-]+$",
        description="The consumer group prefix: a cluster's annotators join <group>.<cluster>.",
    )

    def group_for(self, cluster: str) -> str:
        """The consumer group of ``cluster``'s annotators: one per cluster, so that a rebalance
        in one cluster's agents never stops another's."""
        return f"{self.group}.{cluster}"

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.low_water >= self.high_water:
            raise ValueError(
                f"{ENV_PREFIX}LOW_WATER ({self.low_water}) must be below "
                f"{ENV_PREFIX}HIGH_WATER ({self.high_water})"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _warn_renamed(cls, data: Any) -> Any:
        warn_renamed(cls)
        return data
