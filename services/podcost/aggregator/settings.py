"""The aggregator's own settings, declared once with their environment variable and meaning.

``podcost aggregator`` reads them from the environment and hands them to
``podcost.aggregator.bootstrap`` (tests construct them directly); they are validated at start, so
a bad value stops the service with the variable named. The shared settings (cluster, HTTP, logs,
``PODCOST_POLICY_FILE``) are ``podcost.runtime.settings.ServiceSettings``; the bus and topics
are ``podcost_bus.BusSettings``.

Variables (defaults in brackets), all prefixed ``PODCOST_AGGREGATOR_``:

- ``DEADLINE_SECONDS``: seconds after a snapshot arrives when its costs are decided with the answers
  there are, flagged incomplete [5]
- ``TICK_SECONDS``: how often deadlines are checked [0.25]
- ``EARLY_ANSWER_SECONDS``: how long a ranker's answers for a snapshot not read yet wait for it;
  a state holding nothing else (answers that came after their workload was gone) is then
  forgotten [60]
- ``ENGINE``: over Kafka, ``faust`` (a faust-streaming app whose tables survive restarts) or
  ``consumer`` (a plain consumer-group loop that rebuilds its state by re-reading) [faust]; the
  in-memory bus always uses the consumer loop
- ``APP_ID``: the faust app id, which is also the consumer group and the prefix of the tables'
  changelog topics [podcost-aggregator]
- ``DATA_DIR``: faust's data directory [``<tmp>/podcost/<app id>``; tables are in memory]
- ``COMMIT_INTERVAL_SECONDS``: how often faust commits processed offsets [1]
- ``STANDBY_REPLICAS``: faust standby copies of each table partition on other aggregators: a
  replica that takes over a crashed one's partitions has them already, and reads none of their
  changelogs again, for each replica holding the other's states too [1]
- ``STALL_SECONDS``: faust engine: seconds with records to process and none processed after which
  the aggregator reports not ready (from half of it) and then exits for its supervisor to
  restart it [60]
- ``START_TIMEOUT_SECONDS``: faust engine: seconds a start may go on without progress (a table
  recovery's is progress) before the aggregator exits likewise [120]
- ``OVERWRITE_FOREIGN``: rank costs someone else set like podcost's own (they are rewritten)
  instead of fitting podcost's around them [false]

The times were named ``*_S`` before: ``DEADLINE_S``, ``TICK_S``, ``COMMIT_INTERVAL_S``,
``STALL_S`` and ``START_TIMEOUT_S`` are still read, with a warning
(``podcost.runtime.settings.renamed``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from podcost.runtime.settings import renamed, warn_renamed

ENV_PREFIX = "PODCOST_AGGREGATOR_"
DEFAULT_APP_ID = "podcost-aggregator"


class AggregatorSettings(BaseSettings):
    """How the aggregator decides and runs (see the module docstring)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="ignore", populate_by_name=True
    )

    deadline_seconds: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="Seconds after a snapshot arrives when its costs are decided with the "
        "answers there are, flagged incomplete.",
        validation_alias=renamed(
            f"{ENV_PREFIX}DEADLINE_SECONDS", f"{ENV_PREFIX}DEADLINE_S", field="deadline_seconds"
        ),
    )
    tick_seconds: float = Field(
        default=0.25,
        gt=0,
        le=60,
        description="Seconds between two checks of the deadlines.",
        validation_alias=renamed(
            f"{ENV_PREFIX}TICK_SECONDS", f"{ENV_PREFIX}TICK_S", field="tick_seconds"
        ),
    )
    early_answer_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Seconds a ranker's answers for a snapshot not read yet wait for it; a state "
        "holding nothing else (answers that came after their workload was gone) is then "
        "forgotten. An answer precedes its snapshot only as far as the aggregator's read of the "
        "workloads topic lags the rankers'.",
    )
    engine: Literal["faust", "consumer"] = Field(
        default="faust", description="The Kafka transport: faust-streaming or a consumer loop."
    )
    app_id: str = Field(
        default=DEFAULT_APP_ID,
        min_length=1,
        pattern=r"^[a-zA-Z0-9._-]+$",
        description="faust app id: consumer group and changelog topic prefix.",
    )
    data_dir: Path | None = Field(default=None, description="faust's data directory.")
    commit_interval_seconds: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="Seconds between two commits of processed offsets (faust engine).",
        validation_alias=renamed(
            f"{ENV_PREFIX}COMMIT_INTERVAL_SECONDS",
            f"{ENV_PREFIX}COMMIT_INTERVAL_S",
            field="commit_interval_seconds",
        ),
    )
    standby_replicas: int = Field(default=1, ge=0, le=10, description="faust standby replicas.")
    stall_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Faust engine: seconds with records to process and none processed after "
        "which the aggregator reports not ready (from half of it), then exits to be restarted.",
        validation_alias=renamed(
            f"{ENV_PREFIX}STALL_SECONDS", f"{ENV_PREFIX}STALL_S", field="stall_seconds"
        ),
    )
    start_timeout_seconds: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="Faust engine: seconds a start may go on without progress (a table "
        "recovery's is progress) before the aggregator exits to be restarted.",
        validation_alias=renamed(
            f"{ENV_PREFIX}START_TIMEOUT_SECONDS",
            f"{ENV_PREFIX}START_TIMEOUT_S",
            field="start_timeout_seconds",
        ),
    )
    overwrite_foreign: bool = Field(
        default=False, description="Rewrite costs someone else set instead of fitting around them."
    )

    @model_validator(mode="before")
    @classmethod
    def _warn_renamed(cls, data: Any) -> Any:
        warn_renamed(cls)
        return data

    def faust_data_dir(self) -> Path:
        """Where faust keeps its (small) files: ``DATA_DIR`` or a directory per app id."""
        return self.data_dir or Path(tempfile.gettempdir()) / "podcost" / self.app_id
