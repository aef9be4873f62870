"""The trace an event carries and the W3C ``traceparent`` codec: pure data, no OpenTelemetry.

An event's ``trace_id`` / ``span_id`` / ``parent_span_id`` are the only
carrier of trace context (docs/design.md § Distributed tracing), so the
envelope needs the value type and its validation to build and decode events;
it must not need the OpenTelemetry SDK to do that. This module is that value
type and the header codec. ``crewlet.events.tracing`` builds on it (spans,
``trace_of()``, restoring an event's trace, OTLP export); nothing here imports
``crewlet.events.tracing`` or the envelope, so the dependency runs one way:
envelope -> trace, tracing -> envelope and trace.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Protocol, Union

TRACEPARENT_HEADER = "traceparent"
# The only version this build writes; parsing accepts later versions per the spec.
TRACEPARENT_VERSION = "00"
FLAG_SAMPLED = 0x01
FLAG_RANDOM = 0x02  # Trace Context level 2: the trace-id's right 7 bytes are random

# A version-00 traceparent is exactly this long: 2 + 1 + 32 + 1 + 16 + 1 + 2.
_TRACEPARENT_LEN = 55
_LOWER_HEX = frozenset("0123456789abcdef")
_OWS = " \t"  # optional whitespace the spec allows around a header value


def _is_lower_hex(text: str, length: int) -> bool:
    """Exactly ``length`` lowercase hex digits: the spec's HEXDIGLC, nothing looser."""
    return len(text) == length and all(c in _LOWER_HEX for c in text)


def _is_id(text: str, length: int) -> bool:
    """A usable trace or span id: lowercase hex of the right length and not all zeros."""
    return _is_lower_hex(text, length) and text != "0" * length


def is_trace_id(text: Any) -> bool:
    return isinstance(text, str) and _is_id(text, 32)


def is_span_id(text: Any) -> bool:
    return isinstance(text, str) and _is_id(text, 16)


def random_id(nbytes: int) -> str:
    """``nbytes`` random bytes as lowercase hex, never all zeros (an all-zero id is invalid)."""
    while True:  # a retry is astronomically rare
        value = secrets.token_hex(nbytes)
        if value != "0" * (2 * nbytes):
            return value


class Carrier(Protocol):
    """Anything with an envelope's three trace fields (an ``Event``), read by ``Trace.of``."""

    trace_id: str
    span_id: str
    parent_span_id: str


@dataclass(frozen=True)
class Trace:
    """The trace fields an event carries: a valid value, never a half-empty one.

    Validated at construction so an event built from a ``Trace`` always has a
    trace a reader can follow; ``Trace.of(event)`` answers None for an event
    that carries none (an old one, or one built by hand) instead.
    """

    trace_id: str
    span_id: str
    parent_span_id: str = ""

    def __post_init__(self) -> None:
        if not is_trace_id(self.trace_id):
            raise ValueError(f"trace_id must be 32 lowercase hex digits, not all zero: {self.trace_id!r}")
        if not is_span_id(self.span_id):
            raise ValueError(f"span_id must be 16 lowercase hex digits, not all zero: {self.span_id!r}")
        if self.parent_span_id and not is_span_id(self.parent_span_id):
            raise ValueError(
                f"parent_span_id must be empty or 16 lowercase hex digits, not all zero: {self.parent_span_id!r}"
            )

    @classmethod
    def root(cls) -> "Trace":
        """A fresh trace with no parent: what work caused by nothing traced starts."""
        return cls(random_id(16), random_id(8), "")

    def child(self) -> "Trace":
        """A new span id under this one, for a publisher that has no OTel span of its own."""
        return Trace(self.trace_id, random_id(8), self.span_id)

    @classmethod
    def of(cls, event: Carrier) -> Optional["Trace"]:
        """The trace an event carries, or None when its fields are empty or malformed."""
        parent = event.parent_span_id if is_span_id(event.parent_span_id) else ""
        if is_trace_id(event.trace_id) and is_span_id(event.span_id):
            return cls(event.trace_id, event.span_id, parent)
        return None

    def traceparent(self, flags: int = FLAG_SAMPLED) -> str:
        """This span as a W3C ``traceparent`` value (for an outbound call it causes)."""
        return format_traceparent(self.trace_id, self.span_id, flags)


@dataclass(frozen=True)
class TraceParent:
    """A parsed W3C ``traceparent``: the remote caller's trace and its span."""

    version: str
    trace_id: str
    parent_id: str
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & FLAG_SAMPLED)

    def format(self) -> str:
        """Written back as version 00, the only version this build speaks."""
        return format_traceparent(self.trace_id, self.parent_id, self.flags)


def parse_traceparent(value: Any) -> Optional[TraceParent]:
    """Parse a ``traceparent`` header value strictly per W3C Trace Context, or None.

    Rules (level 1, with level 2's flags): surrounding spaces/tabs are trimmed;
    version is two lowercase hex digits and never ``ff``; trace-id 32 and
    parent-id 16 lowercase hex digits, neither all zeros; flags two lowercase
    hex digits. Version 00 is exactly 55 characters. A later version is parsed
    by version 00's first four fields and may carry more only after a ``-``.
    Anything else is None, and the caller starts a fresh trace: joining a
    malformed one would graft unrelated work together.
    """
    if not isinstance(value, str):
        return None
    text = value.strip(_OWS)
    if len(text) < _TRACEPARENT_LEN:
        return None
    version = text[0:2]
    if not _is_lower_hex(version, 2) or version == "ff":
        return None
    if text[2] != "-" or text[35] != "-" or text[52] != "-":
        return None
    trace_id, parent_id, flags = text[3:35], text[36:52], text[53:55]
    if not _is_id(trace_id, 32) or not _is_id(parent_id, 16) or not _is_lower_hex(flags, 2):
        return None
    if version == TRACEPARENT_VERSION:
        if len(text) != _TRACEPARENT_LEN:
            return None
    elif len(text) > _TRACEPARENT_LEN and text[_TRACEPARENT_LEN] != "-":
        return None
    return TraceParent(version=version, trace_id=trace_id, parent_id=parent_id, flags=int(flags, 16))


def format_traceparent(trace_id: str, parent_id: str, flags: int = FLAG_SAMPLED) -> str:
    """A version-00 ``traceparent``; refuses ids the spec would make a receiver ignore."""
    if not is_trace_id(trace_id):
        raise ValueError(f"trace_id must be 32 lowercase hex digits, not all zero: {trace_id!r}")
    if not is_span_id(parent_id):
        raise ValueError(f"parent_id must be 16 lowercase hex digits, not all zero: {parent_id!r}")
    if not isinstance(flags, int) or not 0 <= flags <= 0xFF:
        raise ValueError(f"flags must be one byte: {flags!r}")
    return f"{TRACEPARENT_VERSION}-{trace_id}-{parent_id}-{flags:02x}"


def traceparent_from_headers(headers: Union[Mapping[str, str], Iterable[tuple[str, str]]]) -> Optional[TraceParent]:
    """The request's ``traceparent``, matched case-insensitively by name, or None.

    Two ``traceparent`` headers make the request's trace ambiguous, so it is
    treated as having none (the W3C harness's duplicated-header case); a
    differently spelled name (``trace-parent``) is not the header at all.
    """
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found = [v for k, v in pairs if isinstance(k, str) and k.lower() == TRACEPARENT_HEADER]
    if len(found) != 1:
        return None
    return parse_traceparent(found[0])


__all__ = [
    "FLAG_RANDOM",
    "FLAG_SAMPLED",
    "TRACEPARENT_HEADER",
    "TRACEPARENT_VERSION",
    "Carrier",
    "Trace",
    "TraceParent",
    "format_traceparent",
    "is_span_id",
    "is_trace_id",
    "parse_traceparent",
    "random_id",
    "traceparent_from_headers",
]
