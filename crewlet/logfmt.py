"""Structured log formatters: the message is an event name, ``extra`` fields are data.

Callers log ``log.info("engine_started", extra={"node": "n1"})`` and never
interpolate values into the message, so a line can be grepped by event name
and parsed by key. Two renderings of the same record: key=value for people
(default) and JSON for collectors (``CREWLET_LOG_FORMAT=json``).

No credential reaches a line in either rendering. Libraries log what they
were given — Django's ``django.request`` puts the whole request (its query
string included) on every 4xx/5xx record, an exception message may quote a
URL or a header — so redaction is done on the record, not left to callers:
:class:`RedactSecrets` (a filter on every handler) and both formatters blank
the value of any field named like a credential, and in every text (message,
field values, traceback) the values of credential query parameters
(``?secret=``, ``token``, ``signature``, …), credential headers
(``Authorization``, ``Cookie``, ``X-…-Signature``, ``X-…-Token``), bearer
tokens, session/CSRF cookies and the password of a URL.

A record emitted inside an OpenTelemetry span carries that span's ``trace_id``
and ``span_id`` (:class:`TraceContext`, a filter on every handler, read where
the record is emitted), so a log line leads to its trace and back.
"""
from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timezone
from typing import Any

from opentelemetry import trace as otel_trace

from crewlet.jsontext import storable_text

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)

#: What a credential's value is replaced with.
REDACTED = "[redacted]"
#: Set on a record once it has been redacted (redaction is idempotent; this saves the second pass).
_REDACTED_FLAG = "_crewlet_redacted"

_CREDENTIAL_WORDS = r"(?:secret|token|signature|sig|password|passwd|pwd|api[_-]?key|authorization|cookie|sessionid|csrftoken|credentials?)"
#: A field (or dict key) named like a credential: the word ends the name (``access_token``, ``x-hub-signature-256``).
_SECRET_NAME = re.compile(rf"(?i)(?:^|[_.\-]){_CREDENTIAL_WORDS}(?:[_-]?256)?$|^{_CREDENTIAL_WORDS}$")
_TEXT_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # A header rendered as text, a dict item or an ASGI (name, value) pair: Authorization: …, (b'cookie', b'…').
    (
        re.compile(
            r"(?i)\b((?:proxy-)?authorization|(?:set-)?cookie|x-[\w-]*?(?:signature|token|secret)(?:-256)?)"
            r"(\s*['\"]?\s*[:=,]\s*(?:b?['\"])?)(?!\[redacted\])[^'\"\r\n]+"
        ),
        rf"\1\2{REDACTED}",
    ),
    # A credential query parameter or form field: ?secret=…, &access_token=…, &signature=….
    (
        re.compile(rf"(?i)([?&;][\w.\-]*{_CREDENTIAL_WORDS}=)(?!\[redacted\])[^&#\s'\"<>]+"),
        rf"\1{REDACTED}",
    ),
    # Session and CSRF cookies wherever they appear, and a bearer token in free text.
    (re.compile(r"(?i)\b(sessionid|csrftoken|csrfmiddlewaretoken)=(?!\[redacted\])[^;&\s'\"]+"), rf"\1={REDACTED}"),
    (re.compile(r"\b((?i:bearer)|Token)(\s+)(?!\[redacted\])[A-Za-z0-9._~+/=\-]{12,}"), rf"\1\2{REDACTED}"),
    # The password of a URL: scheme://user:password@host (one already masked as *** stays so).
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@'\"]*:)(?!\[redacted\]@|\*+@)[^@\s/'\"]+@"), rf"\1{REDACTED}@"),
)


def is_secret_name(name: str) -> bool:
    """Whether a field, parameter or header called ``name`` holds a credential."""
    return bool(_SECRET_NAME.search(name))


def redact_text(text: str) -> str:
    """``text`` with every credential value it quotes replaced by :data:`REDACTED`."""
    for pattern, replacement in _TEXT_RULES:
        text = pattern.sub(replacement, text)
    return text


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


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ordered fields of one record: time, level, logger, event, then extras, then the error — redacted."""
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
