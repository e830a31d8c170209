"""Bus settings, declared once: which bus, how to reach Kafka, and the topic names.

Every service's settings embed :class:`BusSettings`; ``podcost_bus.open_bus`` turns them into a
``KafkaBus`` or, when no bootstrap servers are set, the in-process ``MemoryBus``. Values come
from the environment (or the constructor, in tests) and are validated at start-up, so a bad
value stops the service with the variable named.

Environment variables (defaults in brackets):

- ``PODCOST_KAFKA``: bootstrap servers, ``host:port[,host:port...]`` [unset: in-memory bus,
  i.e. embedded mode]
- ``PODCOST_KAFKA_CLIENT_ID``: client id shown in broker logs and quotas [podcost]
- ``PODCOST_KAFKA_SECURITY_PROTOCOL``: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL [PLAINTEXT]
- ``PODCOST_KAFKA_SSL_CAFILE``: CA bundle that verifies the brokers [the system CAs]
- ``PODCOST_KAFKA_SSL_CERTFILE``, ``PODCOST_KAFKA_SSL_KEYFILE``, ``PODCOST_KAFKA_SSL_PASSWORD``:
  client certificate and key (PEM) for mutual TLS, and the key's password [none]
- ``PODCOST_KAFKA_SASL_MECHANISM``: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 [none]
- ``PODCOST_KAFKA_SASL_USERNAME``, ``PODCOST_KAFKA_SASL_PASSWORD``: SASL credentials [none]
- ``PODCOST_KAFKA_COMPRESSION``: producer batch compression, zstd, gzip or none [zstd]
- ``PODCOST_KAFKA_LINGER_MS``: how long the producer waits to fill a batch [1]; records queued
  while a request is in flight are batched anyway, and every awaited acknowledgement pays it
- ``PODCOST_KAFKA_MAX_BATCH_BYTES``: producer batch size per partition [262144]
- ``PODCOST_KAFKA_MAX_POLL_RECORDS``: most records one consumer poll returns [500]
- ``PODCOST_KAFKA_FETCH_MIN_BYTES``, ``PODCOST_KAFKA_FETCH_MAX_WAIT_MS``: a consumer's fetch
  returns once this many bytes are there, or after this wait [1, and aiokafka's 500 ms; the
  aggregator's faust consumer 100 ms]. Raising both (say 65536 and 100) makes records that
  trickle in come several to a fetch instead of one, and a fetch, a produce request and an
  offset commit per record is most of what a core serving many quiet clusters spends; each
  hop then delays a record by up to the wait, and an idle consumer fetches once per wait
- ``PODCOST_KAFKA_SESSION_TIMEOUT_MS``: consumer group session timeout [10000]
- ``PODCOST_KAFKA_REQUEST_TIMEOUT_MS``: how long one broker request may take [40000]
- ``PODCOST_KAFKA_PARTITIONS``: partitions of the topics podcost creates; also the in-memory
  bus's partitions [3]
- ``PODCOST_KAFKA_REPLICATION_FACTOR``: replicas of the topics podcost creates [1; 3 in
  production, see ``podcost_contracts.topic_contract``]; their ``min.insync.replicas`` is one
  less, between 1 and 2
- ``PODCOST_TOPIC_WORKLOADS``, ``PODCOST_TOPIC_RANKS``, ``PODCOST_TOPIC_COSTS``,
  ``PODCOST_TOPIC_DEADLETTER``: the topic names [podcost.workloads, podcost.ranks,
  podcost.costs, podcost.deadletter]

Batch compression is zstd by default, at aiokafka's level (3, the broker's default), with
contexts kept between batches (``podcost_bus.codec``; aiokafka's own codec sets one up for every
batch, which is most of the cost of a small one). Over the records podcost sends it takes from a
tenth to a thirtieth of the CPU of aiokafka's gzip (level 9, which aiokafka does not let a
producer change) for the same bytes, and consumers decode it in a few microseconds a batch
(``tests/bench/bench_compression.py``). Most large values are gzipped one by one already
(``podcost_contracts.messages.encode``), so a batch codec gains little on them and its cost is
what matters; small records (a few pods' snapshot, a single answer) it compresses as well as
gzip. The aggregator's costs records are left to it up to 256 KB of JSON rather than gzipped one
by one: several decisions in one zstd frame took a quarter of the CPU of gzipping each, to half
the bytes. gzip stays available for a broker or a tool that cannot read zstd (Kafka before 2.1).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import AliasChoices, Field, FilePath, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from podcost_contracts.topic_contract import TopicPlan, topic_plan
from podcost_contracts.topics import DEFAULT_TOPICS, TopicName, Topics


def _env(name: str, field_name: str) -> AliasChoices:
    # The environment variable, and the field name for constructing settings in code.
    return AliasChoices(name, field_name)


class BusSettings(BaseSettings):
    """How the services reach the bus (see the module docstring for the variables)."""

    model_config = SettingsConfigDict(
        env_prefix="PODCOST_KAFKA_", frozen=True, extra="ignore", populate_by_name=True
    )

    bootstrap_servers: str | None = Field(
        default=None,
        validation_alias=_env("PODCOST_KAFKA", "bootstrap_servers"),
        description="Kafka bootstrap servers; unset means the in-process bus.",
    )
    client_id: str = Field(
        default="podcost",
        min_length=1,
        description="The client id shown in broker logs and quotas.",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="How to reach the brokers."
    )
    ssl_cafile: FilePath | None = Field(
        default=None, description="The CA bundle that verifies the brokers; unset: the system's."
    )
    ssl_certfile: FilePath | None = Field(
        default=None, description="The client certificate (PEM) for mutual TLS."
    )
    ssl_keyfile: FilePath | None = Field(
        default=None, description="The client certificate's key (PEM) for mutual TLS."
    )
    ssl_password: SecretStr | None = Field(
        default=None, description="The password of the client key."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="The SASL mechanism, with a SASL_* security protocol."
    )
    sasl_username: str | None = Field(default=None, description="The SASL user name.")
    sasl_password: SecretStr | None = Field(default=None, description="The SASL password.")
    compression: Literal["zstd", "gzip", "none"] = Field(
        default="zstd",
        description="Producer batch compression.",
    )
    # Milliseconds, as Kafka's own client settings (linger.ms, session.timeout.ms, ...) are.
    linger_ms: int = Field(
        default=1,
        ge=0,
        description="Milliseconds the producer waits to fill a batch; every awaited "
        "acknowledgement pays it.",
    )
    max_batch_bytes: int = Field(
        default=256 * 1024, ge=1024, description="Producer batch size per partition, in bytes."
    )
    max_poll_records: int = Field(
        default=500, ge=1, description="The most records one consumer poll returns."
    )
    fetch_min_bytes: int = Field(
        default=1,
        ge=1,
        description="A consumer's fetch returns once this many bytes are there (or after "
        "the fetch wait).",
    )
    fetch_max_wait_ms: int | None = Field(
        default=None,
        ge=0,
        description="Milliseconds a consumer's fetch waits for its minimum bytes; unset: "
        "aiokafka's 500 (the aggregator's faust consumer 100).",
    )
    session_timeout_ms: int = Field(
        default=10_000, ge=1000, description="Consumer group session timeout, in milliseconds."
    )
    request_timeout_ms: int = Field(
        default=40_000, ge=1000, description="Milliseconds one broker request may take."
    )
    partitions: int = Field(
        default=3,
        ge=1,
        description="Partitions of the topics podcost creates; also the in-memory bus's.",
    )
    replication_factor: int = Field(
        default=1, ge=1, description="Replicas of the topics podcost creates."
    )

    topic_workloads: TopicName = Field(
        default=DEFAULT_TOPICS.workloads,
        validation_alias=_env("PODCOST_TOPIC_WORKLOADS", "topic_workloads"),
        description="The topic of the watchers' workload snapshots.",
    )
    topic_ranks: TopicName = Field(
        default=DEFAULT_TOPICS.ranks,
        validation_alias=_env("PODCOST_TOPIC_RANKS", "topic_ranks"),
        description="The topic of the rankers' answers.",
    )
    topic_costs: TopicName = Field(
        default=DEFAULT_TOPICS.costs,
        validation_alias=_env("PODCOST_TOPIC_COSTS", "topic_costs"),
        description="The prefix of each cluster's costs topic, <topic>.<cluster>.",
    )
    topic_deadletter: TopicName = Field(
        default=DEFAULT_TOPICS.deadletter,
        validation_alias=_env("PODCOST_TOPIC_DEADLETTER", "topic_deadletter"),
        description="The topic of records that cannot be decoded, with their reason.",
    )

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(
                f"PODCOST_KAFKA_SECURITY_PROTOCOL={self.security_protocol} needs "
                "PODCOST_KAFKA_SASL_MECHANISM"
            )
        if self.sasl_mechanism is not None:
            if not sasl:
                raise ValueError(
                    "PODCOST_KAFKA_SASL_MECHANISM is set but PODCOST_KAFKA_SECURITY_PROTOCOL is "
                    f"{self.security_protocol} (use SASL_SSL or SASL_PLAINTEXT)"
                )
            if not self.sasl_username or self.sasl_password is None:
                raise ValueError(
                    "PODCOST_KAFKA_SASL_MECHANISM needs PODCOST_KAFKA_SASL_USERNAME and "
                    "PODCOST_KAFKA_SASL_PASSWORD"
                )
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("PODCOST_KAFKA_SSL_KEYFILE is set without PODCOST_KAFKA_SSL_CERTFILE")
        names = (self.topic_workloads, self.topic_ranks, self.topic_costs, self.topic_deadletter)
        if len(set(names)) != len(names):
            raise ValueError(f"PODCOST_TOPIC_* must name four distinct topics, got {names}")
        return self

    @property
    def topics(self) -> Topics:
        """The topic names as the message contracts define them."""
        return Topics(
            workloads=self.topic_workloads,
            ranks=self.topic_ranks,
            costs=self.topic_costs,
            deadletter=self.topic_deadletter,
        )

    def topic_plan(self) -> TopicPlan:
        """The topic contract of these settings: their names, partitions and replication."""
        return topic_plan(
            self.topics, partitions=self.partitions, replication_factor=self.replication_factor
        )

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")
