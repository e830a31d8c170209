"""The messages podcost's services exchange, defined once: keys, headers, payloads and their codec.

Every producer (watcher, rankers, aggregator, the dead-letter helper) builds a payload model here
and turns it into bytes with :func:`encode`; every consumer turns bytes back into a model with
:func:`decode`, which validates and raises :class:`DecodeError` naming exactly what is wrong, so the
caller can dead-letter the record and move on. The bus adapter (``podcost_bus``) moves the bytes
and never looks inside. Pure: pydantic and ``podcost_core`` only, no I/O.

Wire format of a record:

- key: ``cluster/namespace/kind/name`` (:class:`WorkloadKey`), UTF-8. One workload's messages
  share a key, hence a partition, hence an order.
- value: the payload as compact JSON; gzip-compressed when larger than ``gzip_threshold`` bytes,
  and then marked with the header ``content-encoding: gzip``.
- headers: ``podcost-schema: <kind>/<version>`` (e.g. ``workload-snapshot/1``), the W3C trace
  context (``traceparent``, ``tracestate``) when the producer has one, ``content-encoding``.

Versioning. Each payload carries ``schema_version``; a consumer accepts only the versions its
model lists and reports any other as unsupported. Adding an optional field does not need a new
version (unknown fields are ignored, so an older consumer keeps working during a rolling
upgrade); renaming, removing or re-meaning a field does.
"""

from __future__ import annotations

import base64
import copy
import functools
import re
import zlib
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Final, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError, PydanticSerializationError, SchemaValidator

from podcost_contracts.topics import cluster_name_problem
from podcost_core.model import Node, Pod, PodUID, Snapshot, Unread, WorkloadRef
from podcost_core.victims import INT32_MAX, INT32_MIN

# --- keys -------------------------------------------------------------------------------------

_KEY_PARTS: Final = ("cluster", "namespace", "kind", "name")
_MAX_PART = 253  # a DNS subdomain, the longest name Kubernetes allows


class InvalidKey(ValueError):
    """A record key is not ``cluster/namespace/kind/name``. Permanent: dead-letter the record."""


@dataclass(frozen=True, slots=True)
class WorkloadKey:
    """The bus key of one workload: ``cluster/namespace/kind/name``, e.g.
    ``prod-eu-1/shop/Deployment/web``. Each part is non-empty, has no ``/`` and no whitespace;
    the cluster is a valid cluster name (``podcost_contracts.topics.cluster_name_problem``)."""

    cluster: str
    namespace: str
    kind: str
    name: str

    def __post_init__(self) -> None:
        for part_name in _KEY_PARTS:
            part = getattr(self, part_name)
            problem = _part_problem(part)
            if problem:
                raise InvalidKey(f"invalid workload key {self.text()!r}: {part_name} {problem}")
        # The cluster names the costs topic a decision is routed to (``Topics.costs_for``).
        cluster_problem = cluster_name_problem(self.cluster)
        if cluster_problem:
            raise InvalidKey(f"invalid workload key {self.text()!r}: {cluster_problem}")

    def text(self) -> str:
        """The key as it travels: ``cluster/namespace/kind/name``."""
        return f"{self.cluster}/{self.namespace}/{self.kind}/{self.name}"

    def __str__(self) -> str:
        return self.text()

    def encode(self) -> bytes:
        """The record key bytes (UTF-8)."""
        return self.text().encode()

    @classmethod
    def of(cls, ref: WorkloadRef) -> WorkloadKey:
        """The key of the workload a snapshot is of."""
        return cls(ref.cluster, ref.namespace, ref.kind, ref.name)

    @classmethod
    def parse(cls, key: str | bytes | None) -> WorkloadKey:
        """Read a record key; :class:`InvalidKey` says what is wrong with it."""
        if key is None:
            raise InvalidKey("the record has no key (expected cluster/namespace/kind/name)")
        if isinstance(key, bytes):
            try:
                key = key.decode()
            except UnicodeDecodeError:
                raise InvalidKey(f"the record key {key!r} is not UTF-8") from None
        parts = key.split("/")
        if len(parts) != len(_KEY_PARTS):
            raise InvalidKey(
                f"invalid workload key {key!r}: expected cluster/namespace/kind/name "
                f"(4 parts separated by '/'), got {len(parts)} part{'s' * (len(parts) != 1)}"
            )
        return cls(*parts)


#: ``WorkloadKey.parse`` of the keys seen last: a key is the same string for every pod of a
#: decision, and a ``WorkloadKey`` is immutable. An invalid key raises every time.
_parsed_key: Callable[[str], WorkloadKey] = functools.lru_cache(maxsize=4096)(WorkloadKey.parse)


def _part_problem(part: str) -> str | None:
    if not part:
        return "is empty"
    if "/" in part:
        return "contains '/'"
    # The same test as "any character is whitespace or not printable", in C: every whitespace
    # character but the ASCII space is a separator or a control character, not printable.
    if " " in part or not part.isprintable():
        return "contains whitespace or a control character"
    if len(part) > _MAX_PART:
        return f"is longer than {_MAX_PART} characters"
    return None


@functools.lru_cache(maxsize=4096)
def _valid_key(text: str) -> str:
    # Cached: every message of a workload carries its key (an invalid one raises, which the
    # cache does not keep).
    WorkloadKey.parse(text)
    return text


#: A ``str`` field that must be a valid workload key.
KeyText = Annotated[str, AfterValidator(_valid_key)]

# --- headers ----------------------------------------------------------------------------------

#: W3C trace context (https://www.w3.org/TR/trace-context/), carried as Kafka headers.
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
TRACE_HEADERS: Final = (TRACEPARENT, TRACESTATE)
#: ``<kind>/<schema version>`` of the payload, readable without parsing it.
SCHEMA_HEADER: Final = "podcost-schema"
#: ``gzip`` when the value is compressed; absent (or ``identity``) when it is plain JSON.
CONTENT_ENCODING: Final = "content-encoding"
GZIP: Final = "gzip"
IDENTITY: Final = "identity"


#: The longest trace header podcost reads, stores or writes. W3C Trace Context: a
#: ``traceparent`` is 55 characters (version 00), and a platform must propagate at least 512
#: characters of ``tracestate`` and may drop the rest. A longer header is left out whole: a
#: record may carry megabytes of it (the broker takes them inside a compressed batch), and
#: copied onto a dead letter, a costs record or a stored state it would make that record larger
#: than the producer may send, a refusal that no retry ends.
MAX_TRACE_HEADER_BYTES: Final = 512


def trace_context(headers: Mapping[str, bytes]) -> dict[str, str]:
    """The W3C trace context of a record as a text carrier, for an OpenTelemetry propagator.

    A header that is not ASCII is left out: it cannot be trace context (a propagator would drop
    it), and passed on it would make :func:`encode` fail on the message that carries it on (a
    dead letter of the very record, say). So is one longer than
    :data:`MAX_TRACE_HEADER_BYTES`."""
    carrier = {}
    for name in TRACE_HEADERS:
        raw = headers.get(name)
        if raw is not None and raw.isascii() and len(raw) <= MAX_TRACE_HEADER_BYTES:
            carrier[name] = raw.decode("ascii")
    return carrier


# --- size limits ------------------------------------------------------------------------------

#: Values larger than this are gzip-compressed. Below it the producer's batch compression does
#: as well and a consumer skips a decompression per record.
DEFAULT_GZIP_THRESHOLD: Final = 8 * 1024
#: The threshold of a producer whose batches are compressed (zstd by default): values are left
#: to the batch compression up to this many bytes of JSON. A 25-pod decision's 15 KB of JSON
#: took 58 us to gzip at the fastest level, and a batch of sixteen of them 15 us each with zstd,
#: to fewer bytes (1.0 KB a decision instead of 1.9 KB); the consumer then inflates nothing. A
#: larger record fills a batch of its own: gzipped, it stays below the producer's request size
#: limit (checked on the uncompressed record) up to workloads of thousands of pods.
BATCHED_GZIP_ABOVE: Final = 256 * 1024
#: The largest encoded value :func:`encode` lets out: Kafka's default limit on one record
#: (``message.max.bytes`` = 1 048 588, producer ``max.request.size`` = 1 048 576) less room for
#: the key, the headers and the batch framing.
MAX_MESSAGE_BYTES: Final = 1_000_000
#: The most a compressed value may inflate to on decode (a guard against gzip bombs); a
#: 10,000-pod snapshot is about 10 MB of JSON.
MAX_DECODED_BYTES: Final = 32 * 1024 * 1024
#: The most JSON values (objects, arrays, members and elements) a payload may hold, counted
#: before anything is built from it: the bytes alone do not bound what decoding costs, since a
#: million minimal pods are 117 MB of JSON that gzip to 0.4 MB, and about 1 GB once decoded. A
#: 10,000-pod snapshot as the watcher publishes it is 433,000 values (43 a pod and its share of
#: the nodes), so this lets through about 23,000 such pods, or 200,000 minimal ones (under
#: 100 MB decoded), and refuses the million.
MAX_DECODED_VALUES: Final = 1_000_000

# --- payloads ---------------------------------------------------------------------------------

Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
StrategyName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^\S+$")]


def _from_base64(value: object) -> object:
    if isinstance(value, str):
        return base64.b64decode(value, validate=True)
    return value


#: Bytes that travel as standard base64 text (no line breaks) in JSON.
Base64 = Annotated[
    bytes,
    BeforeValidator(_from_base64),
    PlainSerializer(lambda raw: base64.b64encode(raw).decode("ascii"), when_used="json"),
]


#: Validation context of :func:`decode`: the data comes from the bus.
_WIRE: Final[dict[str, bool]] = {"wire": True}


class Message(BaseModel):
    """What every payload shares: a kind, a schema version and the record key it travels under."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    KIND: ClassVar[str]
    """The name in the ``podcost-schema`` header."""
    SUPPORTED_VERSIONS: ClassVar[frozenset[int]] = frozenset({1})
    """The schema versions :func:`decode` accepts for this kind."""

    schema_version: int

    @model_validator(mode="after")
    def _versioned_on_the_wire(self, info: ValidationInfo) -> Self:
        # A model built in code gets the current version by default; a payload read from the
        # bus must say which version it is, or it could be silently read as the wrong one.
        # Checked after validation (the fields set are the ones the payload had): a "before"
        # validator would make pydantic turn the whole JSON into Python objects first, which
        # doubled the cost of decoding a snapshot.
        wire = isinstance(info.context, dict) and info.context.get("wire") is True
        if wire and "schema_version" not in self.model_fields_set:
            raise PydanticCustomError("schema_version_missing", "the payload has no schema_version")
        return self

    @abstractmethod
    def record_key(self) -> bytes | None:
        """The key the record travels under."""


class WorkloadMessage(Message):
    """A message about one workload: keyed by it and tied to one snapshot version."""

    key: KeyText
    """``cluster/namespace/kind/name`` of the workload; also the record key."""
    version: int = Field(ge=0)
    """The per-workload snapshot version (of the snapshot itself, or of the one answered)."""

    def record_key(self) -> bytes:
        return self.key.encode()

    @property
    def workload(self) -> WorkloadKey:
        """The key, parsed (once per distinct key: the annotator asks for every pod it writes)."""
        return _parsed_key(self.key)


class WorkloadSnapshotMessage(WorkloadMessage):
    """The watcher's whole current view of one workload (topic ``workloads``)."""

    KIND: ClassVar[str] = "workload-snapshot"

    schema_version: Literal[1] = 1
    snapshot: Snapshot
    """Pods, nodes, policy annotations; ``snapshot.version`` equals ``version``."""
    emitted_at: float
    """The order of the watcher's snapshots of this workload (POSIX seconds): when it first saw
    the change this snapshot answers, or when it became the leader; the aggregator keeps the
    latest."""
    changed_at: float | None = None
    """When the watcher saw the first event of the debounced burst that produced this snapshot
    (POSIX seconds, wall clock): what event-to-annotation latency is measured from. ``None``
    from a watcher older than this field."""

    @model_validator(mode="after")
    def _matches_snapshot(self) -> Self:
        if self.key != self.snapshot.workload.key:
            raise ValueError(
                f"key {self.key!r} is not the snapshot's workload {self.snapshot.workload.key!r}"
            )
        if self.version != self.snapshot.version:
            raise ValueError(
                f"version {self.version} is not the snapshot's version {self.snapshot.version}"
            )
        return self

    @classmethod
    def of(
        cls, snapshot: Snapshot, *, emitted_at: float, changed_at: float | None = None
    ) -> WorkloadSnapshotMessage:
        """The message for ``snapshot``: key and version taken from it."""
        return cls(
            key=snapshot.workload.key,
            version=snapshot.version,
            snapshot=snapshot,
            emitted_at=emitted_at,
            changed_at=changed_at,
        )


#: The ``reason`` of a :class:`WorkloadGoneMessage` for a deleted workload (its pods go with it).
GONE_DELETED: Final = "deleted"
#: The ``reason`` of a :class:`WorkloadGoneMessage` that carries a cluster's live set.
GONE_UNLISTED: Final = "not in the watcher's live set"

#: The ``reason`` of an empty live set that removes a cluster from the fleet: its states are
#: forgotten without asking its annotator (gone too) to remove their costs.
GONE_REMOVED: Final = "cluster removed"

#: The namespace and kind of the key a cluster's live set travels under
#: (:func:`live_set_key`): no workload has them, so no workload's state is ever under it.
LIVE_SET_NAMESPACE: Final = "podcost.dev"
LIVE_SET_KIND: Final = "LiveSet"
LIVE_SET_NAME: Final = "workloads"


def live_set_key(cluster: str) -> WorkloadKey:
    """The key of ``cluster``'s live set (a :class:`WorkloadGoneMessage` with ``live``)."""
    return WorkloadKey(cluster, LIVE_SET_NAMESPACE, LIVE_SET_KIND, LIVE_SET_NAME)


def is_live_set(key: str | bytes | None) -> bool:
    """Whether a workloads-topic record key is a live set's (:func:`live_set_key`), not a
    workload's: readers that want snapshots skip those records."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "replace")
    parts = (key or "").split("/")
    return len(parts) == 4 and parts[1:] == [LIVE_SET_NAMESPACE, LIVE_SET_KIND, LIVE_SET_NAME]


class WorkloadGoneMessage(WorkloadMessage):
    """The watcher no longer ranks a workload it published (topic ``workloads``, same key): it
    was deleted, opted out, or its policy became invalid. Rankers skip it; the aggregator drops
    what it kept for the key, unless it holds a later snapshot (the workload came back)."""

    KIND: ClassVar[str] = "workload-gone"

    schema_version: Literal[1] = 1
    reason: str = Field(min_length=1)
    """Why, for people: e.g. ``deleted``, ``opted out``, or the policy error."""
    emitted_at: float
    """Ordered with the snapshots' ``emitted_at``: it supersedes the snapshots before it."""
    changed_at: float | None = None
    """When the watcher saw the change that ended the workload (POSIX seconds)."""
    live: tuple[str, ...] | None = None
    """A cluster's live set: every workload of the cluster the watcher ranks (their keys), as
    its cache showed them at ``emitted_at``; every other workload of the cluster that was
    published before then is gone. Sent after each (re)sync to every partition of the
    workloads topic under :func:`live_set_key` (so a consumer older than this field drops a
    state that nothing has: it ignores it). Empty, with the reason :data:`GONE_REMOVED`, it
    removes the cluster (``podcost remove-cluster``). ``None``: a single workload is gone."""

    @model_validator(mode="after")
    def _live_set_of_its_cluster(self) -> Self:
        if self.live is None:
            return self
        cluster = self.workload.cluster
        if self.key != live_set_key(cluster).text():
            raise ValueError(f"a live set travels under {live_set_key(cluster).text()!r}")
        prefix = f"{cluster}/"
        for index, key in enumerate(self.live):
            if not key.startswith(prefix):
                raise ValueError(f"live.{index}: {key!r} is not a workload of {cluster!r}")
        return self


def decode_workload_record(
    value: bytes,
    headers: Mapping[str, bytes] | None = None,
    *,
    key: str | bytes | None = None,
    unread: Unread | None = None,
) -> WorkloadSnapshotMessage | WorkloadGoneMessage:
    """A record of the workloads topic: a :class:`WorkloadGoneMessage` when its
    ``podcost-schema`` header says so, else a :class:`WorkloadSnapshotMessage` (see
    :func:`decode`, whose :class:`DecodeError` it raises).

    ``unread`` names fields of the snapshot's pods and nodes the caller never reads: they are
    neither validated nor built, and hold their defaults (the aggregator's decisions read far
    less of a snapshot than the rankers, ``podcost_core.aggregate.DECISION_UNREAD``). Such a
    message is for that caller alone: encoded again, it would lose those fields."""
    raw = (headers or {}).get(SCHEMA_HEADER, b"")
    if raw.decode("ascii", "replace").partition("/")[0] == WorkloadGoneMessage.KIND:
        return decode(WorkloadGoneMessage, value, headers, key=key)
    encoding = (headers or {}).get(CONTENT_ENCODING)
    if unread is not None and not (unread.pod or unread.node):
        unread = None  # nothing left out: the whole message, shared with whole readers
    message = _SNAPSHOTS.decoded(value, raw or None, encoding, unread)
    _check_key(message, key)
    return message


class _DecodedSnapshots:
    """The snapshot messages decoded last, shared in a process: every consumer of the workloads
    topic (each ranker, the aggregator) decodes the same records, and in one process (embedded
    mode, or several services together) the first decode serves the others. A whole message
    serves any reader; one decoded with fields left unread serves only readers that leave the
    same ones unread. Messages are frozen; errors are not kept.

    Kept: the last ``size`` records (and at most ``value_bytes`` of their values); with
    ``readers`` set, a record's messages are also let go as soon as that many reads have taken
    them, so what is kept is what a reader has still to reach, however far apart the readers'
    positions drift within the bounds."""

    def __init__(self, size: int, value_bytes: int = 8 * 2**20) -> None:
        self._size = size
        self._value_bytes = value_bytes
        """At most this many bytes of record values kept (a few large snapshots, or many
        small ones)."""
        self._readers: int | None = None
        self._bytes = 0
        self._kept: OrderedDict[tuple[bytes, bytes | None, bytes | None], _Kept] = OrderedDict()

    def decoded(
        self, value: bytes, schema: bytes | None, encoding: bytes | None, unread: Unread | None
    ) -> WorkloadSnapshotMessage:
        record = (value, schema, encoding)
        kept = self._kept.get(record)
        message = None
        if kept is not None:
            self._kept.move_to_end(record)
            message = kept.messages.get(None)
            if message is None:
                message = kept.messages.get(unread)
        else:
            kept = self._kept[record] = _Kept()
            self._bytes += len(value)
            self._trim()
        if message is None:
            headers = {SCHEMA_HEADER: schema} if schema is not None else {}
            if encoding is not None:
                headers[CONTENT_ENCODING] = encoding
            validator = None if unread is None else snapshot_validator(unread)
            try:
                message = decode(WorkloadSnapshotMessage, value, headers, validator=validator)
            except DecodeError:
                if not kept.messages:  # errors are not kept
                    self._forget(record)
                raise
            kept.messages[unread] = message
        kept.reads += 1
        # Every reader has taken it: none asks again, unless it reads the record again after a
        # restart or a rebalance (and then decodes it again).
        if self._readers is not None and kept.reads >= self._readers:
            self._forget(record)
        return message

    def _forget(self, record: tuple[bytes, bytes | None, bytes | None]) -> None:
        if self._kept.pop(record, None) is not None:
            self._bytes -= len(record[0])

    def _trim(self) -> None:
        while len(self._kept) > 1 and (
            len(self._kept) > self._size or self._bytes > self._value_bytes
        ):
            (value, _, _), _ = self._kept.popitem(last=False)
            self._bytes -= len(value)

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0

    def keep(self, size: int, readers: int | None = None, value_bytes: int | None = None) -> None:
        """Keep the last ``size`` records' messages from now on (within the bytes bound), each
        until ``readers`` reads have taken it (``None``: until the bounds push it out). A new
        count of readers lets go of what is kept: its reads were counted for the former one."""
        self._size = size
        if readers != self._readers:
            self.clear()
        self._readers = readers
        if value_bytes is not None:
            self._value_bytes = value_bytes
        self._trim()


@dataclass(slots=True)
class _Kept:
    """A record's decoded messages (by what their readers leave unread) and the reads so far."""

    messages: dict[Unread | None, WorkloadSnapshotMessage] = field(default_factory=dict)
    reads: int = 0


_SNAPSHOTS: Final = _DecodedSnapshots(64)


def keep_decoded_snapshots(
    size: int, *, readers: int | None = None, value_bytes: int | None = None
) -> None:
    """Keep the last ``size`` snapshot records' decoded messages in this process (64 by default).

    For a process whose readers of the workloads topic each have a consumer of their own (the
    rankers of several strategies in one process): their positions drift apart (by what each
    consumer has fetched ahead, up to several polls of ``PODCOST_KAFKA_MAX_POLL_RECORDS``), and
    a record decoded by the first must still be kept when the last reaches it, or each decodes
    it again. ``readers``: how many reads each record gets in this process (one per consumer);
    a record's messages are let go once they all have taken them, so the bounds hold only what
    some reader has still to reach. Costs memory: a decoded 10-pod snapshot is some tens of KB;
    whatever ``size``, at most ``value_bytes`` of record values (8 MiB unless given) are kept
    (fewer large snapshots)."""
    _SNAPSHOTS.keep(size, readers, value_bytes)


@functools.lru_cache(maxsize=32)
def snapshot_validator(unread: Unread) -> SchemaValidator:
    """A validator of :class:`WorkloadSnapshotMessage` that neither reads nor builds the fields
    ``unread`` names: pydantic's own schema of the message, in which those fields of the pod
    and node dataclasses are marked ``init=False``, so that pydantic ignores them in the input
    and the dataclass gives them their defaults."""
    schema = copy.deepcopy(WorkloadSnapshotMessage.__pydantic_core_schema__)
    names: dict[type, frozenset[str]] = {Pod: unread.pod, Node: unread.node}
    marked: set[tuple[type, str]] = set()
    pending: list[Any] = [schema]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if item.get("type") == "dataclass" and item.get("cls") in names:
                for field in item["schema"]["fields"]:
                    if field["name"] in names[item["cls"]]:
                        field["init"] = False
                        marked.add((item["cls"], field["name"]))
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    wanted = {(cls, name) for cls, fields in names.items() for name in fields}
    if marked != wanted:  # pydantic's schema of the models is not what this expects
        raise RuntimeError(f"cannot leave {sorted(str(pair) for pair in wanted - marked)} unread")
    return SchemaValidator(schema)


class StrategyRanksMessage(WorkloadMessage):
    """One strategy's raw scores for one snapshot version (topic ``ranks``)."""

    KIND: ClassVar[str] = "strategy-ranks"

    schema_version: Literal[1] = 1
    strategy: StrategyName
    """The registered strategy name, e.g. ``capacity-type``."""
    scores: Mapping[PodUID, float]
    """Raw score per pod uid (higher = more costly to delete), finite; the aggregator
    normalizes them."""
    duration_seconds: float = Field(ge=0)
    """How long the strategy took on this snapshot."""
    emitted_at: float
    """When the ranker published it (POSIX seconds)."""
    changed_at: float | None = None
    """The snapshot's ``changed_at``, carried along."""


class RankedWorkload(BaseModel):
    """One workload's answer inside a :class:`StrategyRanksBatchMessage`: what a
    :class:`StrategyRanksMessage` says of it, less what the batch shares."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    key: KeyText
    """``cluster/namespace/kind/name`` of the workload answered."""
    version: int = Field(ge=0)
    """The snapshot version answered."""
    scores: Mapping[PodUID, float]
    """Raw score per pod uid, as in :class:`StrategyRanksMessage`."""
    duration_seconds: float = Field(ge=0)
    changed_at: float | None = None
    """The snapshot's ``changed_at``, carried along."""
    trace: Mapping[str, str] = Field(default_factory=dict)
    """The W3C trace context (``traceparent``, ``tracestate``) of the ranker's span for this
    answer, a child of the snapshot's trace: what a record's headers carry for one answer."""

    @classmethod
    def of(cls, answer: StrategyRanksMessage) -> RankedWorkload:
        """``answer`` as a batch holds it (the inverse of
        :meth:`StrategyRanksBatchMessage.messages`, less the trace context its headers carried)."""
        return cls(
            key=answer.key,
            version=answer.version,
            scores=answer.scores,
            duration_seconds=answer.duration_seconds,
            changed_at=answer.changed_at,
        )


class StrategyRanksBatchMessage(Message):
    """One strategy's answers for several workloads of one partition (topic ``ranks``).

    What a ranker publishes: per partition of the workloads it answered (the partition of the
    workloads topic their snapshots are on), one record holding its answers to them in the
    order it read them, instead of a record per answer. Keyed by its first answer's workload, so
    the record lands in the partition of the ranks topic of that number (both topics have as
    many partitions), where the aggregator that holds those workloads reads it. The aggregator
    dead-letters a batch any of whose answers is of a workload another partition holds.
    """

    KIND: ClassVar[str] = "strategy-ranks-batch"

    schema_version: Literal[1] = 1
    strategy: StrategyName
    answers: tuple[RankedWorkload, ...] = Field(min_length=1)
    """In the order the ranker read the snapshots (a workload may appear more than once, for
    successive versions)."""
    emitted_at: float
    """When the ranker published it (POSIX seconds)."""

    def record_key(self) -> bytes:
        return self.answers[0].key.encode()

    def messages(self) -> tuple[StrategyRanksMessage, ...]:
        """Each answer as the :class:`StrategyRanksMessage` it stands for."""
        return tuple(
            _answer_message(answer, self.strategy, self.emitted_at) for answer in self.answers
        )


def _answer_message(
    answer: RankedWorkload, strategy: str, emitted_at: float
) -> StrategyRanksMessage:
    """A batch's ``answer`` of ``strategy`` as the :class:`StrategyRanksMessage` it stands for
    (built without validation: the batch was validated)."""
    return StrategyRanksMessage.model_construct(
        schema_version=1,
        key=answer.key,
        version=answer.version,
        strategy=strategy,
        scores=answer.scores,
        duration_seconds=answer.duration_seconds,
        emitted_at=emitted_at,
        changed_at=answer.changed_at,
    )


class StrategyAnswer(RankedWorkload):
    """One answer inside a :class:`RanksBatchMessage`: a :class:`RankedWorkload` that names
    its strategy."""

    strategy: StrategyName
    """The registered strategy name of this answer, e.g. ``capacity-type``."""


class RanksBatchMessage(Message):
    """The answers of several strategies for workloads of one partition (topic ``ranks``).

    What a process running several strategies' rankers publishes (``podcost ranker --strategy A
    --strategy B``): per partition of the workloads answered, one record holding the answers
    every strategy of the process had pending, instead of one :class:`StrategyRanksBatchMessage`
    per strategy. The same rules as that batch: keyed by its first answer's workload, every
    answer of a workload of the record's partition (the aggregator dead-letters the record
    otherwise), in the order each strategy read the snapshots.
    """

    KIND: ClassVar[str] = "ranks-batch"

    schema_version: Literal[1] = 1
    answers: tuple[StrategyAnswer, ...] = Field(min_length=1)
    """Each strategy's answers in the order it read the snapshots (a workload may appear more
    than once: for several strategies, or for successive versions)."""
    emitted_at: float
    """When the process published it (POSIX seconds)."""

    def record_key(self) -> bytes:
        return self.answers[0].key.encode()

    def messages(self) -> tuple[StrategyRanksMessage, ...]:
        """Each answer as the :class:`StrategyRanksMessage` it stands for."""
        return tuple(
            _answer_message(answer, answer.strategy, self.emitted_at) for answer in self.answers
        )


#: What a record of the ranks topic may hold (:func:`decode_ranks_record`).
RanksRecord = StrategyRanksMessage | StrategyRanksBatchMessage | RanksBatchMessage


def decode_ranks_record(
    value: bytes, headers: Mapping[str, bytes] | None = None, *, key: str | bytes | None = None
) -> RanksRecord:
    """A record of the ranks topic, by its ``podcost-schema`` header: a
    :class:`RanksBatchMessage` (several strategies' answers, what a process of several rankers
    publishes), a :class:`StrategyRanksBatchMessage` (one strategy's answers, what a ranker
    alone in its process publishes), else a :class:`StrategyRanksMessage` (one answer, what
    rankers published before batches). See :func:`decode`, whose :class:`DecodeError` it
    raises."""
    raw = (headers or {}).get(SCHEMA_HEADER, b"")
    kind = raw.decode("ascii", "replace").partition("/")[0]
    if kind == StrategyRanksBatchMessage.KIND:
        return decode(StrategyRanksBatchMessage, value, headers, key=key)
    if kind == RanksBatchMessage.KIND:
        return decode(RanksBatchMessage, value, headers, key=key)
    return decode(StrategyRanksMessage, value, headers, key=key)


class StrategyTerm(BaseModel):
    """What one strategy contributed to one pod's cost."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    normalized: int = Field(ge=0, le=100)
    """The strategy's score for the pod after normalization, in [0, 100]."""
    weight: int = Field(ge=1)
    """The strategy's weight in the policy."""
    tier: int = Field(ge=0)
    """The strategy's tier in the policy (lower dominates)."""
    raw: float | None = None
    """The raw score the strategy gave, when known (−level for a spread strategy)."""


class PodCost(BaseModel):
    """The cost one pod should carry, and why."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    uid: PodUID
    """The pod's uid: a pod recreated under the same name is another pod."""
    cost: Int32
    """The desired ``controller.kubernetes.io/pod-deletion-cost``."""
    previous: Int32 | None
    """The cost the controller read on the pod when the snapshot was taken (0 if it had no
    annotation); ``None`` if it had an invalid one (or one of ours written otherwise)."""
    breakdown: Mapping[str, StrategyTerm] = Field(default_factory=dict)
    """Per strategy that took part: its term of this pod's cost."""


class DesiredCostsMessage(WorkloadMessage):
    """The aggregator's decision for one snapshot version (topic ``costs``)."""

    KIND: ClassVar[str] = "desired-costs"

    schema_version: Literal[1] = 1
    costs: tuple[PodCost, ...]
    """One entry per ranked pod, first deleted first (the annotator writes them in this order);
    uids are distinct."""
    complete: bool
    """Whether every enabled strategy answered; ``False`` when combined after the deadline."""
    missing: tuple[str, ...] = ()
    """The enabled strategies that had not answered (empty exactly when ``complete``)."""
    emitted_at: float
    """When the aggregator published it (POSIX seconds)."""
    changed_at: float | None = None
    """The decided snapshot's ``changed_at`` (when the watcher saw the change that caused this
    decision): the annotator measures event-to-annotation latency from it."""
    first_wrong: int | None = Field(default=None, ge=1)
    """The smallest scale-in that, with the costs on the pods before these writes, would delete
    a pod the decided order keeps (``podcost_core.urgency``); ``None``: none would. The
    annotator writes the decisions with the smallest first."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.complete == bool(self.missing):
            raise ValueError(
                "complete must be true exactly when no strategy is missing "
                f"(complete={self.complete}, missing={list(self.missing)})"
            )
        seen: set[str] = set()
        for index, pod in enumerate(self.costs):
            if pod.uid in seen:
                raise ValueError(f"costs.{index}: pod uid {pod.uid!r} appears twice")
            seen.add(pod.uid)
        return self


class PodRef(BaseModel):
    """One pod, as a release names it."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    uid: PodUID
    """A pod recreated under the same name is another pod: left alone."""


class ReleaseCostsMessage(WorkloadMessage):
    """The aggregator's word that a workload is no longer ranked (topic ``costs``, same key as its
    decisions): it opted out or its policy became invalid. The annotator removes the deletion
    costs podcost's own field manager wrote on these pods, where they are still podcost's; it
    never trusts the list further than that (it checks each pod's uid and managed fields)."""

    KIND: ClassVar[str] = "release-costs"

    schema_version: Literal[1] = 1
    pods: tuple[PodRef, ...]
    """The workload's pods as the aggregator last saw them."""
    reason: str = Field(min_length=1)
    """The watcher's reason, e.g. ``opted out``."""
    emitted_at: float
    changed_at: float | None = None
    """When the watcher saw the change that ended the workload (POSIX seconds)."""


def decode_costs_record(
    value: bytes, headers: Mapping[str, bytes] | None = None, *, key: str | bytes | None = None
) -> DesiredCostsMessage | ReleaseCostsMessage:
    """A record of a costs topic: a :class:`ReleaseCostsMessage` when its ``podcost-schema``
    header says so, else a :class:`DesiredCostsMessage` (see :func:`decode`, whose
    :class:`DecodeError` it raises)."""
    raw = (headers or {}).get(SCHEMA_HEADER, b"")
    if raw.decode("ascii", "replace").partition("/")[0] == ReleaseCostsMessage.KIND:
        return decode(ReleaseCostsMessage, value, headers, key=key)
    return decode(DesiredCostsMessage, value, headers, key=key)


class DeadLetter(Message):
    """A record a consumer could not process, kept with the reason (topic ``deadletter``).

    Published under the original record's key, so one workload's dead letters stay in order.
    """

    KIND: ClassVar[str] = "dead-letter"

    schema_version: Literal[1] = 1
    topic: str
    """Where the record was read."""
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)
    key: str | None
    """The record key as text (bytes that are not UTF-8 appear as ``\\xNN`` escapes)."""
    value: Base64
    """The record value exactly as read (base64 in JSON); only its first bytes if ``truncated``."""
    value_size: int = Field(ge=0)
    """The length of the original value, in bytes."""
    truncated: bool = False
    """Whether ``value`` holds only the first bytes of the original (it was too large to keep)."""
    headers: Mapping[str, str] = Field(default_factory=dict)
    """The record headers as text (the trace context links the dead letter to its trace)."""
    reason: str = Field(min_length=1)
    """What was wrong, e.g. the :class:`DecodeError` reason."""
    error: str
    """The class of the error that stopped processing, e.g. ``DecodeError``."""
    group: str = ""
    """The consumer group that gave up on the record."""
    failed_at: float
    """When (POSIX seconds)."""

    def record_key(self) -> bytes | None:
        return None if self.key is None else self.key.encode()


# --- codec ------------------------------------------------------------------------------------


class DecodeError(ValueError):
    """The bytes are not a valid message of the expected kind. Permanent: retrying cannot help,
    so dead-letter the record with ``reason`` and go on with the next."""

    retriable: ClassVar[bool] = False

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EncodeError(ValueError):
    """The message cannot be encoded (a string that is not Unicode text, e.g. a lone surrogate
    from hand-made JSON). Permanent: log it and skip the message."""

    retriable: ClassVar[bool] = False


class MessageTooLarge(EncodeError):
    """Even compressed, the message is larger than one Kafka record may be. Permanent."""

    retriable: ClassVar[bool] = False

    def __init__(self, kind: str, size: int, limit: int) -> None:
        super().__init__(
            f"the encoded {kind} message is {size} bytes, more than the limit of {limit}"
        )
        self.size = size
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Encoded:
    """A message ready for the bus: what ``Bus.publish`` takes."""

    key: bytes | None
    value: bytes
    headers: Mapping[str, bytes]
    json_size: int
    """The size of the JSON before compression (equal to ``len(value)`` when not compressed)."""

    @property
    def compressed(self) -> bool:
        return self.headers.get(CONTENT_ENCODING) == GZIP.encode()


def schema_header(kind: type[Message], version: int) -> bytes:
    """The ``podcost-schema`` header value, e.g. ``workload-snapshot/1``."""
    return f"{kind.KIND}/{version}".encode()


def encode(
    message: Message,
    *,
    trace: Mapping[str, str] | None = None,
    gzip_threshold: int = DEFAULT_GZIP_THRESHOLD,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> Encoded:
    """The record for ``message``: JSON, gzip-compressed above ``gzip_threshold`` bytes.

    ``trace`` is the W3C carrier a propagator filled (``traceparent``, ``tracestate``); other
    entries of it are ignored. Raises :class:`MessageTooLarge` when the value exceeds
    ``max_bytes`` even compressed, :class:`EncodeError` when it holds text that is not Unicode.
    """
    try:
        body = message.model_dump_json().encode()
    except PydanticSerializationError as error:
        raise EncodeError(f"the {type(message).KIND} message cannot be encoded: {error}") from error
    return encode_json(
        type(message),
        body,
        key=message.record_key(),
        schema_version=message.schema_version,
        trace=trace,
        gzip_threshold=gzip_threshold,
        max_bytes=max_bytes,
    )


def encode_json(
    kind: type[Message],
    body: bytes,
    *,
    key: bytes | None,
    schema_version: int,
    trace: Mapping[str, str] | None = None,
    gzip_threshold: int = DEFAULT_GZIP_THRESHOLD,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> Encoded:
    """:func:`encode` of a payload its producer serialised itself: ``body`` must be exactly the
    ``model_dump_json`` of a valid ``kind`` message with that ``key`` and ``schema_version`` (a
    fast path for a producer that builds the JSON without the model objects; its tests compare
    the two)."""
    headers = {SCHEMA_HEADER: schema_header(kind, schema_version)}
    for name in TRACE_HEADERS:
        if trace and name in trace:
            raw = trace[name].encode("ascii")
            if len(raw) <= MAX_TRACE_HEADER_BYTES:  # a longer one is not carried on (see there)
                headers[name] = raw
    value = body
    if len(body) > gzip_threshold:
        # mtime=0: the same message always encodes to the same bytes.
        value = _gzip(body)
        headers[CONTENT_ENCODING] = GZIP.encode()
    if len(value) > max_bytes:
        raise MessageTooLarge(kind.KIND, len(value), max_bytes)
    return Encoded(key=key, value=value, headers=headers, json_size=len(body))


#: Values up to this many bytes of JSON are gzipped at the fastest level, larger ones at zlib's
#: default. Measured on a 25-pod workload's costs (15 KB of JSON): level 1 takes half the time of
#: level 6 for a fifth more bytes (1.8 KB instead of 1.5 KB); a 10,000-pod snapshot (9 MB) keeps
#: level 6, which it needs to stay well under Kafka's record size.
FAST_GZIP_BELOW: Final = 1024 * 1024


def _gzip(body: bytes) -> bytes:
    level = 1 if len(body) < FAST_GZIP_BELOW else 6
    compressor = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(body) + compressor.flush()


M = TypeVar("M", bound=Message)


def decode(
    kind: type[M],
    value: bytes,
    headers: Mapping[str, bytes] | None = None,
    *,
    key: str | bytes | None = None,
    max_decoded_bytes: int = MAX_DECODED_BYTES,
    max_decoded_values: int = MAX_DECODED_VALUES,
    validator: SchemaValidator | None = None,
) -> M:
    """The ``kind`` message in a record, validated.

    ``key``, when given, must be the key the payload says it travels under. Raises
    :class:`DecodeError` whose ``reason`` names the problem: a ``podcost-schema`` header of
    another kind or an unsupported version, an unknown ``content-encoding``, bad gzip, bad JSON,
    an unsupported ``schema_version`` in the payload, or the validation errors with their field
    paths (``snapshot.pods.3.uid: Field required``). ``validator`` validates instead of the
    model's own (one built from its schema, see :func:`decode_workload_record`). A payload
    that inflates to more than ``max_decoded_bytes`` or holds more than ``max_decoded_values``
    JSON values is refused before it is parsed.
    """
    headers = headers or {}
    _check_schema_header(kind, headers)
    payload = _inflate(value, headers, max_decoded_bytes)
    _check_values(kind, payload, max_decoded_values)
    try:
        if validator is None:
            message = kind.model_validate_json(payload, context=_WIRE)
        else:
            message = validator.validate_json(payload, context=_WIRE)
    except ValidationError as error:
        raise DecodeError(_explain(kind, error)) from error
    _check_key(message, key)
    return message


def _check_key(message: Message, key: str | bytes | None) -> None:
    if key is not None:
        wanted = key.encode() if isinstance(key, str) else key
        if message.record_key() != wanted:
            raise DecodeError(
                f"the record key {wanted!r} is not the payload's key {message.record_key()!r}"
            )


def _supported(kind: type[Message]) -> str:
    return ", ".join(str(version) for version in sorted(kind.SUPPORTED_VERSIONS))


#: A schema version in the ``podcost-schema`` header: a few ASCII digits.
_VERSION: Final = re.compile(r"[0-9]{1,9}")


def _check_schema_header(kind: type[Message], headers: Mapping[str, bytes]) -> None:
    # Checked before inflating and parsing: a record of another kind or version is refused
    # without the cost of reading it (the payload's own schema_version is checked too).
    raw = headers.get(SCHEMA_HEADER)
    if raw is None:
        return
    text = raw.decode("ascii", "replace")
    name, _, version_text = text.partition("/")
    # A bounded ASCII pattern, not isdigit(): int() refuses more than 4300 digits with a
    # ValueError, which no consumer would catch (the record would crash every restart).
    if not _VERSION.fullmatch(version_text):
        raise DecodeError(f"the {SCHEMA_HEADER} header {text!r} is not <kind>/<version>")
    if name != kind.KIND:
        raise DecodeError(
            f"expected a {kind.KIND} message, the {SCHEMA_HEADER} header says {text!r}"
        )
    version = int(version_text)
    if version not in kind.SUPPORTED_VERSIONS:
        raise DecodeError(
            f"unsupported schema version {version} for {kind.KIND} (supported: {_supported(kind)})"
        )


def _inflate(value: bytes, headers: Mapping[str, bytes], limit: int) -> bytes:
    encoding = headers.get(CONTENT_ENCODING, IDENTITY.encode()).decode("ascii", "replace")
    if encoding == IDENTITY:
        return value
    if encoding != GZIP:
        raise DecodeError(
            f"unsupported {CONTENT_ENCODING} {encoding!r} (supported: {GZIP}, {IDENTITY})"
        )
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        payload = inflater.decompress(value, limit + 1)
    except zlib.error as error:
        raise DecodeError(f"bad gzip: {error}") from error
    if len(payload) > limit:
        raise DecodeError(f"bad gzip: the value inflates to more than {limit} bytes")
    if not inflater.eof:
        raise DecodeError("bad gzip: the stream is truncated")
    if inflater.unused_data:
        raise DecodeError(f"bad gzip: {len(inflater.unused_data)} stray bytes after the stream")
    return payload


def _check_values(kind: type[Message], payload: bytes, limit: int) -> None:
    """Refuse ``payload`` if it may hold more than ``limit`` JSON values, before it is parsed.

    Every value after the first of an array or object follows a comma, and every array or
    object opens with a bracket or brace, so their count bounds the values from above (those
    characters inside strings count too: an estimate that errs only towards refusing). Each
    value takes at least one byte, so a payload no longer than ``limit`` is not counted."""
    if len(payload) <= limit:
        return
    values = payload.count(b",") + payload.count(b"{") + payload.count(b"[") + 1
    if values > limit:
        raise DecodeError(
            f"the {kind.KIND} payload holds up to {values} JSON values, more than the limit "
            f"of {limit} (that many pods and nodes would take too much memory to decode)"
        )


_SHOWN_ERRORS = 5


def _explain(kind: type[Message], error: ValidationError) -> str:
    problems = error.errors(include_url=False, include_context=False)
    for problem in problems:
        if problem["type"] == "json_invalid":
            return f"bad JSON: {problem['msg']}"
        if problem["type"] == "model_type" and not problem["loc"]:
            return f"expected a JSON object for {kind.KIND}, got {_json_type(problem['input'])}"
        if problem["type"] == "schema_version_missing":
            return f"the {kind.KIND} payload has no schema_version"
        if problem["loc"] == ("schema_version",):
            return (
                f"unsupported schema version {problem['input']!r} for {kind.KIND} "
                f"(supported: {_supported(kind)})"
            )
    shown = "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or '(root)'}: {problem['msg']}"
        for problem in problems[:_SHOWN_ERRORS]
    )
    more = len(problems) - _SHOWN_ERRORS
    return f"invalid {kind.KIND}: {shown}" + (f" (and {more} more)" if more > 0 else "")


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null" if value is None else type(value).__name__
