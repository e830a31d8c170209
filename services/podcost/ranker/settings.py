"""The ranker's own settings, declared once with their environment variable and meaning.

``podcost ranker`` reads them from the environment and hands them to
``podcost.ranker.bootstrap`` (tests construct them directly); they are validated at start, so a
bad value stops the service with the variable named. The shared settings (cluster, HTTP, logs,
``PODCOST_POLICY_FILE``) are ``podcost.runtime.settings.ServiceSettings``; the bus and topics
are ``podcost_bus.BusSettings``.

Variables (defaults in brackets), all prefixed ``PODCOST_RANKER_``:

- ``GROUP``: the prefix of the consumer groups; the rankers of strategy NAME join
  ``<GROUP>-NAME`` and share the workloads topic's partitions [podcost-ranker]. Two
  deployments (or two tests) reading the same broker keep apart by giving each its own.
- ``COMBINE_STRATEGIES``: in a process of several strategies' rankers, publish their answers to
  the same records together, one ``ranks-batch`` record per partition, instead of a
  ``strategy-ranks-batch`` record per strategy [false]. An aggregator older than the
  ``ranks-batch`` kind cannot read those: turn it on once none may read the ranks topic (a new
  kind is written a release after the one that reads it, ``docs/guides/compatibility.md``).
- ``LINGER_MS``: how long those answers wait for the other strategies' answers to the same
  records before they go out without them [50].
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from podcost.ranker.outbox import LINGER_S

ENV_PREFIX = "PODCOST_RANKER_"
DEFAULT_GROUP = "podcost-ranker"


class RankerSettings(BaseSettings):
    """How the rankers join the bus (see the module docstring)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    group: str = Field(
        default=DEFAULT_GROUP,
        min_length=1,
        max_length=180,
        pattern=r"^[a-zA-Z0-9._-]+$",
        description="The consumer group prefix: the rankers of NAME join <group>-NAME.",
    )

    combine_strategies: bool = Field(
        default=False,
        description="In a process of several strategies' rankers, publish their answers to the "
        "same records in one ranks-batch record per partition rather than a "
        "strategy-ranks-batch record per strategy. Turn it on once no aggregator of a release "
        "without the ranks-batch kind reads the ranks topic.",
    )

    linger_ms: int = Field(
        default=round(LINGER_S * 1000),
        ge=0,
        le=10_000,
        description="In a process of several strategies' rankers, the most milliseconds a "
        "strategy's answers wait for the others' answers to the same records (they go out as "
        "soon as every strategy has answered). At a trickle some strategy's consumer often "
        "waits for its next fetch, so this sets how many snapshots a poll and its records "
        "gather: a longer wait, fewer records and polls, at the price of that much latency.",
    )

    def group_for(self, strategy: str) -> str:
        """The consumer group of the rankers of ``strategy``: one per strategy, so that every
        strategy reads every snapshot."""
        return f"{self.group}-{strategy}"
