"""Typed helpers over any ``Bus``: publish a contract message, decode a record or dead-letter it.

The services' consumer loops call these instead of ``encode``/``decode`` and ``Bus.publish``
directly, so that every record that cannot be decoded is handled the same way: published to the
dead-letter topic as a ``DeadLetter`` with its reason, after which the caller commits it and goes
on with the next record (retrying a malformed record cannot help, and a framework's "ack on
error" would drop it silently).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

from podcost_bus.protocol import Bus, Delivery, Record
from podcost_contracts.messages import (
    DeadLetter,
    DecodeError,
    Message,
    decode,
    encode,
    trace_context,
)
from podcost_contracts.topics import DEFAULT_TOPICS

log = logging.getLogger(__name__)

#: What a dead letter keeps of a bad record, so that the dead letter always fits in one Kafka
#: record, whatever the record held (the broker takes megabytes of key and headers inside a
#: compressed batch; a dead letter the producer refuses would stop the consumer for good). In
#: the JSON of a dead letter a byte of the value takes 4/3 (base64), and a byte or a character
#: of the key, a header or the reason at most 6 (a control character as ``\u00NN``), so the
#: whole JSON is at most 699,052 + 32 × 6 × (256 + 1,024) + 2 × 6 × 1,024, plus the topic,
#: group and framing: about 960,000 bytes, under ``MAX_MESSAGE_BYTES`` (gzip, above its
#: threshold, adds at most a few hundred bytes to what does not compress). Its record's
#: headers are its trace context, bounded by ``MAX_TRACE_HEADER_BYTES``.
DEAD_LETTER_VALUE_BYTES: Final = 512 * 1024
#: The most of the record's key, of each header's value, and of the reason a dead letter keeps.
DEAD_LETTER_TEXT_BYTES: Final = 1024
#: The most of each header's name a dead letter keeps (characters), and how many headers.
DEAD_LETTER_NAME_CHARS: Final = 256
DEAD_LETTER_HEADERS: Final = 32

M = TypeVar("M", bound=Message)


async def publish_message(
    bus: Bus, topic: str, message: Message, *, trace: Mapping[str, str] | None = None
) -> Delivery:
    """Encode ``message`` (with the W3C ``trace`` carrier, if any) and publish it under its key.

    Raises ``MessageTooLarge`` if it cannot fit in one record, ``BusError`` if the bus fails.
    """
    encoded = encode(message, trace=trace)
    return await bus.publish(topic, encoded.key, encoded.value, encoded.headers)


async def dead_letter(
    bus: Bus,
    record: Record,
    reason: str,
    error: BaseException | None = None,
    *,
    topic: str = DEFAULT_TOPICS.deadletter,
    group: str = "",
    clock: Callable[[], float] = time.time,
) -> Delivery:
    """Publish ``record`` to the dead-letter ``topic`` with ``reason`` and the ``error`` class.

    The caller then commits ``record`` and continues. The dead letter keeps the record's key and
    trace context, so it stays in order with the workload's other dead letters and shows up in
    the trace that carried the record. Raises ``BusError`` if the dead letter itself cannot be
    published; then do not commit, so the record is read again.
    """
    letter = dead_letter_of(record, reason, error, group=group, failed_at=clock())
    delivery = await publish_message(bus, topic, letter, trace=trace_context(record.headers))
    log.warning(
        "dead-lettered %s[%d]@%d (key %r) to %s: %s",
        record.topic,
        record.partition,
        record.offset,
        letter.key,
        topic,
        reason,
    )
    return delivery


def dead_letter_of(
    record: Record,
    reason: str,
    error: BaseException | None = None,
    *,
    group: str = "",
    failed_at: float,
) -> DeadLetter:
    """The dead letter of ``record`` (what :func:`dead_letter` publishes): its value (the first
    :data:`DEAD_LETTER_VALUE_BYTES` of it), key and headers, with ``reason`` and the ``error``
    class. Publish it under its ``record_key`` with the record's trace context."""
    kept = record.value[:DEAD_LETTER_VALUE_BYTES]
    headers = list(record.headers.items())[:DEAD_LETTER_HEADERS]
    return DeadLetter(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=None if record.key is None else _text(record.key),
        value=kept,
        value_size=len(record.value),
        truncated=len(kept) < len(record.value),
        headers={name[:DEAD_LETTER_NAME_CHARS]: _text(value) for name, value in headers},
        reason=reason[:DEAD_LETTER_TEXT_BYTES],
        error=type(error).__name__ if error is not None else "",
        group=group,
        failed_at=failed_at,
    )


def _text(raw: bytes) -> str:
    """``raw`` as text for a dead letter: UTF-8, other bytes as ``\\xNN``, cut short."""
    return raw[:DEAD_LETTER_TEXT_BYTES].decode("utf-8", "backslashreplace")


async def decode_or_dead_letter(
    bus: Bus,
    record: Record,
    kind: type[M] | Callable[..., M],
    *,
    topic: str = DEFAULT_TOPICS.deadletter,
    group: str = "",
) -> M | None:
    """The ``kind`` message in ``record`` (``kind`` a message class, or a decoder called as
    ``decode`` is, without the class: e.g. ``decode_costs_record``); or, if it cannot be decoded,
    ``None`` once the record is on the dead-letter ``topic`` (commit it and go on)."""
    try:
        if isinstance(kind, type):
            return decode(kind, record.value, record.headers, key=record.key)
        return kind(record.value, record.headers, key=record.key)
    except DecodeError as error:
        await dead_letter(bus, record, error.reason, error, topic=topic, group=group)
        return None
