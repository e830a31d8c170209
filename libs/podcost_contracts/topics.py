"""The four topic names of the pipeline, with their defaults, defined once.

Pure data: the bus settings (``podcost_bus.settings``) read the names from the environment and
hand a :class:`Topics` to every service's composition root; tests build one directly. Names are
checked here, at start-up, so a typo fails with the offending setting named instead of a broker
error later.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

# Kafka's own rule for topic names (``org.apache.kafka.common.internals.Topic``).
_LEGAL = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def check_topic_name(name: str) -> str:
    """``name`` if Kafka accepts it as a topic name, else a ``ValueError`` saying why."""
    if not _LEGAL.fullmatch(name) or name in (".", ".."):
        raise ValueError(
            f"{name!r} is not a legal Kafka topic name "
            "(1 to 249 of the characters a-z A-Z 0-9 . _ -, and not '.' or '..')"
        )
    return name


TopicName = Annotated[str, AfterValidator(check_topic_name)]


class Topics(BaseModel):
    """Where each message kind travels. Every service of one deployment must agree."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workloads: TopicName = "podcost.workloads"
    """Workload snapshots from the watcher (``WorkloadSnapshotMessage``); read by every ranker."""
    ranks: TopicName = "podcost.ranks"
    """One strategy's raw scores for one snapshot version (``StrategyRanksMessage``)."""
    costs: TopicName = "podcost.costs"
    """The aggregator's desired costs (``DesiredCostsMessage``); read by the annotator."""
    deadletter: TopicName = "podcost.deadletter"
    """Messages a consumer could not decode, with the reason (``DeadLetter``)."""

    @model_validator(mode="after")
    def _distinct(self) -> Topics:
        names = self.all()
        if len(set(names)) != len(names):
            raise ValueError(f"the four topics must be distinct, got {names}")
        return self

    def all(self) -> tuple[str, str, str, str]:
        """The four names, in pipeline order (what the topic creation at start-up creates)."""
        return (self.workloads, self.ranks, self.costs, self.deadletter)


#: The names every service uses unless configured otherwise.
DEFAULT_TOPICS = Topics()
