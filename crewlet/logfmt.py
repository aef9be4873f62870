"""Structured log formatters: the message is an event name, ``extra`` fields are data.

Callers log ``log.info("engine_started", extra={"node": "n1"})`` and never
interpolate values into the message, so a line can be grepped by event name
and parsed by key. Two renderings of the same record: key=value for people
(default) and JSON for collectors (``CREWLET_LOG_FORMAT=json``).
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ordered fields of one record: time, level, logger, event, then extras, then the error."""
    fields: dict[str, Any] = {
        "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "event": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD_ATTRS and not key.startswith("_"):
            fields[key] = value
    if record.exc_info:
        fields["error"] = logging.Formatter().formatException(record.exc_info)
    elif record.exc_text:
        fields["error"] = record.exc_text
    return fields


def _kv_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or any(c in text for c in ' "=\n\t\\'):
        return json.dumps(text)
    return text


class KeyValueFormatter(logging.Formatter):
    """``ts=… level=info logger=crewlet.engine event=engine_started node=n1`` on one line (a traceback follows it)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        error = fields.pop("error", None)
        line = " ".join(f"{key}={_kv_value(value)}" for key, value in fields.items())
        # A traceback is for a person reading it: below the line, not escaped inside it.
        return f"{line}\n{error}" if error else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line with the same fields as :class:`KeyValueFormatter`."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_fields(record), default=str)
