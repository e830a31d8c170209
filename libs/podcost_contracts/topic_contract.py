"""Every topic podcost uses, declared once with the settings it must have: the topic contract.

Pure data and pure checks. The bus adapter (``podcost_bus.kafka``) creates a missing topic with
the settings :func:`topic_plan` gives it and compares an existing one with them
(:func:`drift`); ``podcost topics plan`` prints the plan for a platform team that creates the
topics itself; the reference docs render it as the topic table.

Why each setting:

- **Partitions** are those of the bus settings (``PODCOST_KAFKA_PARTITIONS``) for every topic a
  key is routed on, and must be equal on the workloads and ranks topics and on the aggregator's
  changelogs: a workload's snapshot, its answers and its stored state are found by the same
  partition of its key. A topic with other partitions routes keys elsewhere, so it is drift.
- **Cleanup and retention.** The workloads, ranks and costs topics delete after
  :data:`PIPELINE_RETENTION_MS` (7 days): longer than any outage podcost rides out (a core or an
  agent that comes back reads on from its committed offset; the watcher resyncs on start anyway).
  Dead letters are kept twice as long, to be read by a person. The aggregator's changelogs hold
  each workload's latest state under its key: they are **compacted** and never expire by time,
  or a restarted aggregator would lose the states of quiet workloads. The broker compacts only
  a log's closed segments, so the changelogs close theirs at :data:`CHANGELOG_SEGMENT_BYTES` or
  after :data:`CHANGELOG_SEGMENT_MS`: at the broker's defaults (1 GiB, 7 days) every decision's
  rewrite of a state piled up uncompacted, about 235 MiB an hour for five busy clusters
  (``tests/bench/bench_soak.py``), all of it read again by every recovery.
- **Replication.** Production: :data:`PRODUCTION_REPLICATION_FACTOR` replicas and
  ``min.insync.replicas`` of :data:`PRODUCTION_MIN_INSYNC_REPLICAS` (every producer of podcost
  writes with ``acks=all``, so one broker can be lost without losing or refusing a record). The
  topics are created with ``PODCOST_KAFKA_REPLICATION_FACTOR`` replicas (1 on a one-broker
  development setup) and ``min.insync.replicas`` one less, at most 2, at least 1
  (:func:`min_insync_for`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from podcost_contracts.topics import Topics

DAY_MS: Final = 24 * 3600 * 1000
#: Retention of the workloads, ranks and costs topics: longer than any outage podcost rides out.
PIPELINE_RETENTION_MS: Final = 7 * DAY_MS
#: Retention of the dead-letter topic: read by people, kept longer.
DEADLETTER_RETENTION_MS: Final = 14 * DAY_MS
#: The replication a production broker cluster should give every topic.
PRODUCTION_REPLICATION_FACTOR: Final = 3
#: ``min.insync.replicas`` with :data:`PRODUCTION_REPLICATION_FACTOR` replicas.
PRODUCTION_MIN_INSYNC_REPLICAS: Final = 2
#: A changelog segment's size and age at which the broker closes it, so that it can be compacted.
CHANGELOG_SEGMENT_BYTES: Final = 64 * 1024 * 1024
CHANGELOG_SEGMENT_MS: Final = 3600 * 1000
#: The aggregator's default app id: its consumer group and its internal topics' prefix.
DEFAULT_AGGREGATOR_APP_ID: Final = "podcost-aggregator"
#: The parts of an aggregator state, each a table with its changelog (``podcost_core.aggregate``).
DEFAULT_STATE_PARTS: Final = ("snapshot", "progress")
#: Stands for a registered cluster's name in the costs topics' pattern.
CLUSTER_PLACEHOLDER: Final = "<cluster>"

Role = Literal["workloads", "ranks", "costs", "deadletter", "changelog", "assignor"]
Cleanup = Literal["delete", "compact"]


def min_insync_for(replication_factor: int) -> int:
    """``min.insync.replicas`` for ``replication_factor`` replicas: one less, between 1 and 2."""
    return max(1, min(PRODUCTION_MIN_INSYNC_REPLICAS, replication_factor - 1))


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic (or, for the costs topics, one per registered cluster) and its settings."""

    role: Role
    name: str
    """Its name; the costs topics' is a pattern with :data:`CLUSTER_PLACEHOLDER`."""
    partitions: int
    cleanup_policy: Cleanup
    retention_ms: int | None
    """``retention.ms``; ``None``: not set (a compacted topic keeps each key's latest record)."""
    replication_factor: int
    min_insync_replicas: int
    writer: str
    """The component that writes it (and, on a broker with ACLs, may create it)."""
    readers: tuple[str, ...]
    purpose: str
    segment_bytes: int | None = None
    """``segment.bytes``; ``None``: the broker's."""
    segment_ms: int | None = None
    """``segment.ms``; ``None``: the broker's."""

    def configs(self) -> dict[str, str]:
        """The topic-level configs it is created with and checked against."""
        configs = {
            "cleanup.policy": self.cleanup_policy,
            "min.insync.replicas": str(self.min_insync_replicas),
        }
        if self.retention_ms is not None:
            configs["retention.ms"] = str(self.retention_ms)
        if self.segment_bytes is not None:
            configs["segment.bytes"] = str(self.segment_bytes)
        if self.segment_ms is not None:
            configs["segment.ms"] = str(self.segment_ms)
        return configs

    def for_cluster(self, cluster: str, topic: str) -> TopicSpec:
        """This pattern's spec for one cluster's ``topic``."""
        return TopicSpec(
            self.role, topic, self.partitions, self.cleanup_policy, self.retention_ms,
            self.replication_factor, self.min_insync_replicas, self.writer, self.readers,
            f"{self.purpose} ({cluster})", self.segment_bytes, self.segment_ms,
        )  # fmt: skip

    def to_json(self) -> dict[str, object]:
        return {
            "role": self.role,
            "name": self.name,
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
            "configs": self.configs(),
            "writer": self.writer,
            "readers": list(self.readers),
            "purpose": self.purpose,
        }


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """Every topic of one deployment, from :func:`topic_plan`."""

    specs: tuple[TopicSpec, ...]
    topics: Topics
    clusters: tuple[str, ...] = field(default=())
    """The registered clusters whose costs topics :attr:`expanded` lists one by one."""

    def spec_for(self, name: str) -> TopicSpec | None:
        """The spec of topic ``name``: one of the plan's, a cluster's costs topic (any name
        ``<costs>.<suffix>``), or an aggregator's changelog or assignor topic under another app
        id (``*-changelog``, ``*-__assignor-__leader``); ``None`` for a topic podcost does not
        declare."""
        for spec in self.specs:
            if spec.name == name:
                return spec
        prefix = f"{self.topics.costs}."
        if name.startswith(prefix):
            return self._of("costs").for_cluster(name[len(prefix) :], name)
        if name.endswith("-changelog"):
            return replace(self._of("changelog"), name=name)
        if name.endswith("-__assignor-__leader"):
            return replace(self._of("assignor"), name=name)
        return None

    def _of(self, role: Role) -> TopicSpec:
        return next(spec for spec in self.specs if spec.role == role)

    def expanded(self) -> list[TopicSpec]:
        """The specs with the costs pattern replaced by each registered cluster's topic (kept as
        the pattern when no cluster is given)."""
        out: list[TopicSpec] = []
        for spec in self.specs:
            if spec.role == "costs" and self.clusters:
                out += [spec.for_cluster(c, self.topics.costs_for(c)) for c in self.clusters]
            else:
                out.append(spec)
        return out


def topic_plan(
    topics: Topics,
    *,
    partitions: int,
    replication_factor: int = PRODUCTION_REPLICATION_FACTOR,
    aggregator_app_id: str = DEFAULT_AGGREGATOR_APP_ID,
    state_parts: Sequence[str] = DEFAULT_STATE_PARTS,
    clusters: Sequence[str] = (),
) -> TopicPlan:
    """The topics of a deployment with ``topics`` as names, ``partitions`` per keyed topic and
    ``replication_factor`` replicas (``min.insync.replicas`` from :func:`min_insync_for`)."""
    rf, isr = replication_factor, min_insync_for(replication_factor)

    def spec(
        role: Role, name: str, cleanup: Cleanup, retention: int | None, writer: str,
        readers: tuple[str, ...], purpose: str, parts: int = partitions,
    ) -> TopicSpec:  # fmt: skip
        return TopicSpec(role, name, parts, cleanup, retention, rf, isr, writer, readers, purpose)

    app = aggregator_app_id
    specs = [
        spec("workloads", topics.workloads, "delete", PIPELINE_RETENTION_MS, "watcher",
             ("ranker", "aggregator"), "every opted-in workload's snapshots"),
        spec("ranks", topics.ranks, "delete", PIPELINE_RETENTION_MS, "ranker", ("aggregator",),
             "each strategy's scores of each snapshot version"),
        spec("costs", topics.costs_for("cluster").removesuffix("cluster") + CLUSTER_PLACEHOLDER,
             "delete", PIPELINE_RETENTION_MS, "aggregator", ("annotator",),
             "the desired costs of one registered cluster"),
        spec("deadletter", topics.deadletter, "delete", DEADLETTER_RETENTION_MS, "every component",
             ("people",), "records that could not be processed, with the reason"),
        *(
            replace(
                spec("changelog", f"{app}-{part}-changelog", "compact", None, "aggregator",
                     ("aggregator",), f"the {part} part of each workload's aggregation state"),
                segment_bytes=CHANGELOG_SEGMENT_BYTES, segment_ms=CHANGELOG_SEGMENT_MS,
            )
            for part in state_parts
        ),
        spec("assignor", f"{app}-__assignor-__leader", "delete", None, "aggregator",
             ("aggregator",), "faust's partition assignor leader topic (holds nothing)", 1),
    ]  # fmt: skip
    return TopicPlan(tuple(specs), topics, tuple(clusters))


@dataclass(frozen=True, slots=True)
class TopicDrift:
    """One setting of an existing topic that differs from the contract."""

    topic: str
    setting: str
    """``partitions``, ``replication.factor`` or a topic config name."""
    expected: str
    actual: str

    def __str__(self) -> str:
        return f"{self.topic}: {self.setting} is {self.actual}, the contract says {self.expected}"


def drift(
    spec: TopicSpec, *, partitions: int, replication_factor: int, configs: Mapping[str, str]
) -> list[TopicDrift]:
    """How the existing topic of ``spec``, with ``partitions``, ``replication_factor`` and its
    topic ``configs`` as the broker describes them, differs from ``spec``. The replication
    factor is drift only below the spec's (more replicas are never less safe)."""
    found: list[TopicDrift] = []
    if partitions != spec.partitions:
        found.append(TopicDrift(spec.name, "partitions", str(spec.partitions), str(partitions)))
    if replication_factor < spec.replication_factor:
        found.append(TopicDrift(spec.name, "replication.factor", str(spec.replication_factor),
                                str(replication_factor)))  # fmt: skip
    for name, expected in spec.configs().items():
        actual = configs.get(name)
        if actual is not None and _normal(name, actual) != _normal(name, expected):
            found.append(TopicDrift(spec.name, name, expected, actual))
    return found


def _normal(name: str, value: str) -> str:
    if name == "cleanup.policy":
        return ",".join(sorted(part.strip() for part in value.split(",")))
    return value.strip()
