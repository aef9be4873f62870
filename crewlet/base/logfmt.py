"""Structured log formatters: the message is an event name, ``extra`` fields are data.

Callers log ``log.info("engine_started", extra={"node": "n1"})`` and never
interpolate values into the message, so a line can be grepped by event name
and parsed by key. Two renderings of the same record: key=value for people
(default) and JSON for collectors (``CREWLET_LOG_FORMAT=json``).

One record is one line in either rendering, whatever its fields hold: the
key=value line escapes every value that is not plain printable ASCII as a
JSON string (newlines, NUL and every other control character, quotes,
separators; :func:`kv_value`), its traceback included, and the JSON line is
ASCII-only JSON. A provider's error quoting ``\nlevel=critical …`` is data
inside one field, never a forged record.

No credential reaches a line in either rendering. Libraries log what they
were given — Django's ``django.request`` puts the whole request (its query
string included) on every 4xx/5xx record, an exception message may quote a
URL, a header or a vendor's key — so redaction is done on the record, not
left to callers: :class:`RedactSecrets` (a filter on every handler) and both
formatters blank the value of any field named like a credential, and run
every text (message, field values, traceback) through the one redaction of
the code base, :func:`crewlet.base.redact.redact` (credential query parameters and
``name=value`` pairs, credential headers, bearer tokens, ``sk-…``/``xoxb-…``-shaped
keys, session/CSRF cookies, the password of a URL).

A record emitted inside an OpenTelemetry span carries that span's ``trace_id``
and ``span_id`` (:class:`TraceContext`, a filter on every handler, read where
the record is emitted), so a log line leads to its trace and back.
"""
from __future__ import annotations

import json
import logging
import re
import unicodedata
from datetime import datetime, timezone
from typing import Any

from opentelemetry import trace as otel_trace

from crewlet.base.jsontext import storable_text
from crewlet.base.redact import REDACTED, is_secret_name, redact

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)

#: Set on a record once it has been redacted (redaction is idempotent; this saves the second pass).
_REDACTED_FLAG = "_crewlet_redacted"

#: The one redaction of text (:func:`crewlet.base.redact.redact`), under the name this module's callers know.
redact_text = redact


def redact_value(value: Any) -> Any:
    """A log field's value made safe: text redacted, containers walked, other objects rendered then redacted.

    A value with nothing to redact is returned as it is (the same object), so
    records keep their types for whoever else reads them.
    """
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", "backslashreplace")
        redacted = redact_text(text)
        return value if redacted == text else redacted
    if isinstance(value, dict):
        walked = {
            key: REDACTED if isinstance(key, (str, bytes)) and is_secret_name(_as_text(key)) else redact_value(item)
            for key, item in value.items()
        }
        return value if _same(walked.values(), value.values()) else walked
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        if len(items) == 2 and isinstance(items[0], (str, bytes)) and is_secret_name(_as_text(items[0])):
            return [_as_text(items[0]), REDACTED]  # a (header, value) pair
        walked_items = [redact_value(item) for item in items]
        return value if _same(walked_items, items) else walked_items
    text = str(value)
    redacted = redact_text(text)
    return value if redacted == text else redacted


def _same(walked: Any, original: Any) -> bool:
    return all(a is b for a, b in zip(walked, original))


def _as_text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Redact ``record`` in place (message, extras, traceback, stack); idempotent."""
    if getattr(record, _REDACTED_FLAG, False):
        return record
    try:
        message = record.getMessage()
    except Exception:  # a caller's bad %-format: keep what was given
        message = f"{record.msg} {record.args!r}"
    record.msg = redact_text(str(message))
    record.args = None
    for key, value in list(vars(record).items()):
        if key not in _STANDARD_ATTRS and not key.startswith("_"):
            setattr(record, key, REDACTED if is_secret_name(key) else redact_value(value))
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redact_text(record.exc_text)
    if record.stack_info:
        record.stack_info = redact_text(record.stack_info)
    setattr(record, _REDACTED_FLAG, True)
    return record


class RedactSecrets(logging.Filter):
    """A handler filter: every record leaves with its credentials redacted (see :func:`redact_record`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


#: The fields a record emitted inside a span carries (W3C hex, as the envelope and /traces/ spell them).
TRACE_ID_FIELD = "trace_id"
SPAN_ID_FIELD = "span_id"


class TraceContext(logging.Filter):
    """A handler filter: a record emitted inside a valid span gets its ``trace_id`` and ``span_id``.

    A record that names a trace itself (``extra={"trace_id": ...}``) keeps its
    own; the span id is added beside it only when the trace is the span's.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        context = otel_trace.get_current_span().get_span_context()
        if not context.is_valid:
            return True
        trace_id = format(context.trace_id, "032x")
        own = getattr(record, TRACE_ID_FIELD, None)
        if own is None:
            setattr(record, TRACE_ID_FIELD, trace_id)
        if getattr(record, TRACE_ID_FIELD, None) == trace_id and getattr(record, SPAN_ID_FIELD, None) is None:
            setattr(record, SPAN_ID_FIELD, format(context.span_id, "016x"))
        return True


#: How much of an exception's text a failure's one log line quotes by default.
REASON_CHARS = 200


def short_reason(exc: BaseException, limit: int = REASON_CHARS) -> str:
    """``Type: message``, clipped to ``limit`` characters and safe to store: what one log line says about a failure.

    A failure that repeats on every delivery of a message logs this line each
    time; its traceback (a hundred kilobytes for a deep recursion) belongs on
    the first delivery only, so a poison message cannot flood the log.
    """
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return storable_text(text, limit)


#: The field a record's traceback is written under, and the one it takes when the record has its own ``error``.
ERROR_FIELD = "error"
TRACEBACK_FIELD = "traceback"
#: The field of a record's ``stack_info``.
STACK_FIELD = "stack"


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ordered fields of one record: time, level, logger, event, then extras, then the traceback — redacted.

    The traceback is :data:`ERROR_FIELD`, or :data:`TRACEBACK_FIELD` when the
    record carries an ``error`` of its own (a failure's short reason), so
    neither hides the other.
    """
    redact_record(record)
    fields: dict[str, Any] = {
        "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "event": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD_ATTRS and not key.startswith("_"):
            fields[key] = value
    if record.exc_text:
        fields[TRACEBACK_FIELD if ERROR_FIELD in fields else ERROR_FIELD] = record.exc_text
    if record.stack_info:
        fields[STACK_FIELD] = record.stack_info
    return fields


#: A value written bare: printable ASCII other than space, ``"``, ``=`` and ``\\`` (anything else is quoted).
_KV_BARE = re.compile(r'[!#-<>-\[\]-~]+')
#: A key written as it is; any other character of a key becomes ``_`` (a key is never quoted, so it cannot hold one).
_KV_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/:@]")
#: After ``json.dumps(..., ensure_ascii=False)``: the characters it leaves raw that may still be unprintable.
_NON_ASCII = re.compile(r"[^\x00-\x7e]")
#: Unicode categories never written raw: controls, format characters (bidi overrides, zero-width), surrogates,
#: private-use and unassigned code points, and the line and paragraph separators a reader splits lines on.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escape_char(char: str) -> str:
    """``char`` as the JSON escape that spells it (a surrogate pair above the BMP)."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _printable(match: re.Match[str]) -> str:
    char = match.group()
    return _escape_char(char) if unicodedata.category(char) in _UNPRINTABLE else char


def kv_value(value: Any) -> str:
    """One key=value field's value, always on one line: bare when it is plain, else a JSON string.

    Quoted values are JSON strings (``"two words"``, ``"a\\nb"``), with every
    control character, NUL, quote, backslash, line or paragraph separator,
    format character and lone surrogate escaped; other non-ASCII text (``café``)
    is kept readable. So whatever a field holds — a provider's error with
    ``\\nlevel=critical`` in it, a NUL — it cannot end the line or forge another.
    """
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if _KV_BARE.fullmatch(text):
        return text
    return _NON_ASCII.sub(_printable, json.dumps(text, ensure_ascii=False))


def kv_key(key: str) -> str:
    """A field's name as key=value writes it: unsafe characters as ``_``, never empty."""
    return _KV_KEY_UNSAFE.sub("_", key) or "_"


class KeyValueFormatter(logging.Formatter):
    """``ts=… level=info logger=crewlet.engine.core event=engine_started node=n1``: one record, one line, always.

    Every field is escaped by :func:`kv_value`, the traceback included (as
    ``error="Traceback …\\n…"``), so a record can never spill onto a second line
    that a reader or a collector would take for a record of its own.
    """

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{kv_key(key)}={kv_value(value)}" for key, value in record_fields(record).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line with the same fields as :class:`KeyValueFormatter`.

    ASCII-only JSON: every control character, separator and non-ASCII character
    is a ``\\u`` escape, so a record is one line whatever its fields hold.
    """

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_fields(record), default=str, ensure_ascii=True)
