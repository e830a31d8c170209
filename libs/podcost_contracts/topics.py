"""The topic names of the pipeline, with their defaults, and the cluster names that route
decisions, defined once.

Pure data: the bus settings (``podcost_bus.settings``) read the names from the environment and
hand a :class:`Topics` to every service's composition root; tests build one directly. Names are
checked here, at start-up, so a typo fails with the offending setting named instead of a broker
error later.

Routing in a fleet: snapshots, ranks and dead letters of every cluster share one topic each
(the core reads them all), but decisions travel on **one costs topic per cluster**,
``<costs>.<cluster>`` (:meth:`Topics.costs_for`). The aggregator publishes each decision to its
workload's cluster's topic; each cluster's annotators read only that topic, in a consumer group
of that cluster (``podcost-annotator.<cluster>``), so an agent never sees, skips or commits past
another cluster's decisions, and what it reads does not grow with the fleet. Replicas of one
cluster's annotator share its partitions. A shared costs topic with a consumer group per cluster
would make every agent read every cluster's decisions (N times the volume); partitions assigned
by cluster would be shared by clusters once there are more clusters than partitions, and a
cluster's replicas could not split its work.
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

# A DNS-1123 label, Kubernetes' rule for namespace names: safe in a workload key and as the
# suffix of a topic name. Kafka refuses a topic whose name equals an existing one's once '.' is
# read as '_' (their metric names would collide), so '.' and '_' are left out altogether.
_CLUSTER = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
CLUSTER_NAME_RULE = "1 to 63 of a-z 0-9 -, starting and ending with a letter or digit"


def cluster_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a cluster name (``None`` if it can)."""
    if _CLUSTER.fullmatch(name):
        return None
    return f"{name!r} is not a valid cluster name ({CLUSTER_NAME_RULE})"


def check_cluster_name(name: str) -> str:
    """``name`` if it is a valid cluster name, else a ``ValueError`` saying why."""
    problem = cluster_name_problem(name)
    if problem:
        raise ValueError(problem)
    return name


ClusterName = Annotated[str, AfterValidator(check_cluster_name)]


class Topics(BaseModel):
    """Where each message kind travels. Every service of one deployment must agree."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workloads: TopicName = "podcost.workloads"
    """Workload snapshots from the watcher (``WorkloadSnapshotMessage``); read by every ranker."""
    ranks: TopicName = "podcost.ranks"
    """One strategy's raw scores for one snapshot version (``StrategyRanksMessage``)."""
    costs: TopicName = "podcost.costs"
    """The prefix of the per-cluster costs topics (:meth:`costs_for`): the aggregator's desired
    costs (``DesiredCostsMessage``), read by each cluster's annotator."""
    deadletter: TopicName = "podcost.deadletter"
    """Messages a consumer could not decode, with the reason (``DeadLetter``)."""

    @model_validator(mode="after")
    def _distinct(self) -> Topics:
        names = (self.workloads, self.ranks, self.costs, self.deadletter)
        if len(set(names)) != len(names):
            raise ValueError(f"the four topics must be distinct, got {names}")
        for name in self.shared():
            if name.startswith(f"{self.costs}."):
                # A shared topic would be mistaken for a cluster's costs topic.
                raise ValueError(
                    f"topic {name!r} must not start with the costs prefix {self.costs!r}."
                )
        return self

    def shared(self) -> tuple[str, str, str]:
        """The topics every cluster shares, in pipeline order (what the core and the watcher
        create at start-up): workloads, ranks, dead letters."""
        return (self.workloads, self.ranks, self.deadletter)

    def costs_for(self, cluster: str) -> str:
        """The costs topic of ``cluster``: ``<costs>.<cluster>`` (``ValueError`` if ``cluster``
        is not a valid cluster name, or the name would be too long for Kafka)."""
        return check_topic_name(f"{self.costs}.{check_cluster_name(cluster)}")


#: The names every service uses unless configured otherwise.
DEFAULT_TOPICS = Topics()
