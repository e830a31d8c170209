"""Structured logs: one JSON object per line (or plain text), stamped in UTC to the millisecond,
with the active trace and span ids.

``configure_logging`` is called once by the CLI before a service starts; its first line names
the service and the build that runs (version, revision, Python, instance id), so a log read on
its own says which code wrote it.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

from podcost.runtime.version import build

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

log = logging.getLogger("podcost")


def utc_timestamp(created: float) -> str:
    """``created`` (seconds since the epoch) as RFC 3339 in UTC to the millisecond, e.g.
    ``2026-11-28T23:15:22.123Z``."""
    moment = datetime.fromtimestamp(created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def trace_ids() -> dict[str, str]:
    """The current span's ``trace_id`` and ``span_id`` (hex, as W3C trace context writes them),
    or nothing outside a span."""
    span = trace.get_current_span().get_span_context()
    if not span.is_valid:
        return {}
    return {"trace_id": format(span.trace_id, "032x"), "span_id": format(span.span_id, "016x")}


class JsonFormatter(logging.Formatter):
    """Formats a record as JSON, with ``extra=`` fields and the current trace and span ids."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **trace_ids(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``<UTC time to the ms> LEVEL logger message [trace_id=… span_id=…]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_timestamp(record.created)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = trace_ids()
        return f"{text} trace_id={ids['trace_id']} span_id={ids['span_id']}" if ids else text


def configure_logging(
    level: str = "INFO", fmt: str = "json", *, service: str | None = None
) -> None:
    """Log to stderr at ``level`` in ``fmt`` (json or text); with ``service``, the first line
    says which service starts and which build it is."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiokafka reports retried, harmless conditions at ERROR on new topics and groups.
    logging.getLogger("aiokafka").setLevel(max(logging.getLevelName(level), logging.WARNING))
    if service is not None:
        identity = build()
        # At the configured level when that is above INFO: the line is never filtered out.
        log.log(
            max(logging.INFO, root.level),
            "%s starting: podcost %s (revision %s, Python %s)",
            service, identity.version, identity.revision, identity.python,
            extra={"service": service, **identity.labels(), "instance": identity.instance},
        )  # fmt: skip
