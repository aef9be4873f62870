"""Trace context: W3C ``traceparent``, ``trace_of()``, restoring an event's trace, OTLP setup.

Design (event-system.md, Distributed Tracing):

* The envelope's ``trace_id`` / ``span_id`` / ``parent_span_id`` are the ONLY
  carrier of trace context: the queue moves an event's bytes and nothing else.
* The trace is passed, never captured. ``crewlet.events.new(payload, trace)``
  takes it as an argument; a caller derives that argument with ``trace_of()``.
  An event that read an ambient span at construction would have a trace that
  depends on which frame happened to build it.
* ``trace_of()`` never returns empty: inside a span it reports that span's
  ids, outside one it mints a fresh root. An event with an empty ``trace_id``
  is unreachable from the work it belongs to, which is the bug this prevents.
* Each event's ``span_id`` is the span that emitted it and ``parent_span_id``
  the span above, so a turn's events do not all collapse onto its trigger.
* When an event wakes a seat, ``child_span(event, ...)`` restores its trace so
  the turn's span is a child of the span that caused it, not a new root.
* The webhook edge honours an inbound ``traceparent`` (``parse_traceparent``),
  strictly per W3C Trace Context: a malformed one starts a fresh trace rather
  than joining a bogus one.

OpenTelemetry's SDK is wired in by ``configure_tracing()``; OTLP export is on
only when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces-specific
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, so a laptop exports nothing
and needs no collector. The exporter is the HTTP/protobuf one (no grpc), and it
reads the rest of the standard ``OTEL_EXPORTER_OTLP_*`` variables itself.
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Optional, Union

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags

if TYPE_CHECKING:  # pragma: no cover - hints only; events imports tracing lazily, not the reverse
    from crewlet.events.envelope import Event

log = logging.getLogger("crewlet.tracing")

TRACEPARENT_HEADER = "traceparent"
# The only version this build writes; parsing accepts later versions per the spec.
TRACEPARENT_VERSION = "00"
FLAG_SAMPLED = 0x01
FLAG_RANDOM = 0x02  # Trace Context level 2: the trace-id's right 7 bytes are random

# A version-00 traceparent is exactly this long: 2 + 1 + 32 + 1 + 16 + 1 + 2.
_TRACEPARENT_LEN = 55
_LOWER_HEX = frozenset("0123456789abcdef")
_OWS = " \t"  # optional whitespace the spec allows around a header value

OTLP_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_TRACER_NAME = "crewlet"


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


def _random_id(nbytes: int) -> str:
    while True:  # all-zero ids are invalid; a retry is astronomically rare
        value = secrets.token_hex(nbytes)
        if value != "0" * (2 * nbytes):
            return value


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
        return cls(_random_id(16), _random_id(8), "")

    def child(self) -> "Trace":
        """A new span id under this one, for a publisher that has no OTel span of its own."""
        return Trace(self.trace_id, _random_id(8), self.span_id)

    @classmethod
    def of(cls, event: "Event") -> Optional["Trace"]:
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

    def as_trace(self) -> Trace:
        """The remote span as a ``Trace``: what the edge's own span becomes a child of."""
        return Trace(self.trace_id, self.parent_id, "")

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


# --- OpenTelemetry wiring -------------------------------------------------

_configure_lock = threading.Lock()
# The exporter each provider this module built was given, so a caller (and a
# test) can ask whether export is on without reaching into SDK internals.
_exporters: "weakref.WeakKeyDictionary[TracerProvider, Any]" = weakref.WeakKeyDictionary()


def otlp_endpoint_configured(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the standard OTLP endpoint variable asks for export (off by default)."""
    env = os.environ if environ is None else environ
    return any((env.get(name) or "").strip() for name in OTLP_ENDPOINT_VARS)


def build_provider(service_name: str = "crewlet") -> TracerProvider:
    """A fresh SDK provider for this process, exporting over OTLP only when asked to.

    Separate from ``configure_tracing`` so the decision can be checked without
    touching the process-wide provider, which OpenTelemetry lets be set once.
    """
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = None
    if otlp_endpoint_configured():
        try:
            # Imported lazily: a node that exports nothing never loads protobuf.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:  # pragma: no cover - the package is a pinned requirement
            log.warning("otlp_exporter_unavailable", extra={"package": "opentelemetry-exporter-otlp-proto-http"})
        else:
            # No arguments: the exporter reads OTEL_EXPORTER_OTLP_* itself, so
            # every standard variable (headers, timeout, compression) applies.
            exporter = OTLPSpanExporter()
            provider.add_span_processor(BatchSpanProcessor(exporter))
    _exporters[provider] = exporter
    return provider


def otlp_exporter(provider: Any) -> Any:
    """The OTLP exporter a provider built here was given, or None when export is off."""
    try:
        return _exporters.get(provider)
    except TypeError:
        return None


def span_exporters(provider: Any) -> list[Any]:
    """Every exporter behind a provider's span processors (SDK providers only).

    Reads the SDK's processor list, which has no public accessor; kept in one
    place so an SDK change breaks one function, not every caller.
    """
    multi = getattr(provider, "_active_span_processor", None)
    processors = getattr(multi, "_span_processors", ()) or ()
    return [p.span_exporter for p in processors if getattr(p, "span_exporter", None) is not None]


def configure_tracing(service_name: str = "crewlet") -> TracerProvider:
    """Install the SDK provider once per process and return the one in force.

    Idempotent: a provider already set (by an earlier call or by a host that
    wired its own SDK provider) is kept, because OpenTelemetry refuses a
    second ``set_tracer_provider`` and spans must not split across two.
    """
    with _configure_lock:
        current = otel_trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            return current
        provider = build_provider(service_name)
        otel_trace.set_tracer_provider(provider)
        installed = otel_trace.get_tracer_provider()
        if isinstance(installed, TracerProvider):
            return installed
        return provider  # pragma: no cover - only if a non-SDK provider was set first


def tracer() -> otel_trace.Tracer:
    """Crewlet's tracer, wiring the SDK in first if nobody has.

    Without an SDK provider OpenTelemetry's no-op tracer hands back the
    PARENT's span context as the "child", so every event published under it
    would repeat its parent's span id — exactly the collapse the design rules
    out. So a span is never started without one.
    """
    if not isinstance(otel_trace.get_tracer_provider(), TracerProvider):
        configure_tracing()
    return otel_trace.get_tracer(_TRACER_NAME)


# --- reading and restoring trace context ----------------------------------


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


# The parent of a span this module opened, kept in the context beside it: an
# SDK span knows its parent, but a span the sampler dropped is a bare
# NonRecordingSpan that does not, and the envelope's parent_span_id must not
# depend on whether a span happened to be sampled. Stored with the span's own
# id so a span somebody else opened inside ours never inherits our parent.
_PARENT_KEY = otel_context.create_key("crewlet.parent_span_id")


def trace_of(context: Optional[otel_context.Context] = None) -> Trace:
    """The trace an event published here should carry; never empty.

    Inside a valid span: that span's ids, with the span above it as parent
    (known for an SDK span and for any span opened by ``start_span`` /
    ``child_span``; empty for a bare restored remote span, whose own parent
    this process never saw). Outside any span: a fresh root, so an event is
    always reachable from the work it starts.
    """
    span = otel_trace.get_current_span(context)
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return Trace.root()
    parent_id = ""
    parent = getattr(span, "parent", None)
    if isinstance(parent, SpanContext) and parent.is_valid:
        parent_id = _hex(parent.span_id, 16)
    else:
        recorded = otel_context.get_value(_PARENT_KEY, context)
        if isinstance(recorded, tuple) and recorded[0] == ctx.span_id:
            parent_id = recorded[1]
    return Trace(_hex(ctx.trace_id, 32), _hex(ctx.span_id, 16), parent_id)


ParentLike = Union[Trace, TraceParent, "Event"]


def _remote_span_context(parent: Optional[ParentLike]) -> Optional[SpanContext]:
    if parent is None:
        return None
    flags = FLAG_SAMPLED
    if isinstance(parent, TraceParent):
        trace_id, span_id, flags = parent.trace_id, parent.parent_id, parent.flags
    elif isinstance(parent, Trace):
        trace_id, span_id = parent.trace_id, parent.span_id
    else:
        carried = Trace.of(parent)
        if carried is None:
            return None
        trace_id, span_id = carried.trace_id, carried.span_id
    # An envelope carries no flags: its trace is recorded (sampled) because a
    # dashboard tree with holes in it is worse than one more span.
    return SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(flags),
    )


def restore(parent: Optional[ParentLike]) -> otel_context.Context:
    """A context whose current span is ``parent``'s, so a span started in it is its child.

    ``parent`` is an event (its envelope trace), a ``Trace`` or a parsed
    ``TraceParent``. One that carries no usable trace gives an EMPTY context,
    so the work it causes is a fresh root rather than a child of whatever span
    the calling frame happens to be in.
    """
    span_context = _remote_span_context(parent)
    if span_context is None:
        return otel_context.Context()
    return otel_trace.set_span_in_context(NonRecordingSpan(span_context), otel_context.Context())


@contextlib.contextmanager
def _open_span(
    name: str,
    context: Optional[otel_context.Context],
    kind: SpanKind,
    attributes: Optional[Mapping[str, Any]],
) -> Iterator[Span]:
    """Start a span under ``context`` (None: the current one), make it current, end it after."""
    base = otel_context.get_current() if context is None else context
    above = otel_trace.get_current_span(base).get_span_context()
    span = tracer().start_span(name, context=base, kind=kind, attributes=dict(attributes or {}))
    scoped = otel_trace.set_span_in_context(span, base)
    if above.is_valid:
        scoped = otel_context.set_value(_PARENT_KEY, (span.get_span_context().span_id, _hex(above.span_id, 16)), scoped)
    token = otel_context.attach(scoped)
    try:
        # use_span records an exception on the span and ends it, as start_as_current_span would.
        with otel_trace.use_span(span, end_on_exit=True):
            yield span
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def start_span(
    name: str,
    parent: Optional[Union[Trace, TraceParent]] = None,
    *,
    attributes: Optional[Mapping[str, Any]] = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """Open a span and make it current for the block.

    With ``parent`` (a ``Trace`` or an inbound ``TraceParent``) the span is
    that span's child; without one it nests under the current span as usual,
    or starts a root when there is none. ``trace_of()`` inside the block
    reports this span, with the span above as its parent.
    """
    with _open_span(name, restore(parent) if parent is not None else None, kind, attributes) as span:
        yield span


@contextlib.contextmanager
def child_span(
    event: "Event",
    name: str,
    *,
    attributes: Optional[Mapping[str, Any]] = None,
    kind: SpanKind = SpanKind.CONSUMER,
) -> Iterator[Span]:
    """Run the work an event causes as a child of the span that emitted it.

    What the dispatcher wraps a turn in: the event's trace is restored onto
    the context, the new span is current for the block, and every event the
    block publishes with ``trace_of()`` hangs under the event that caused it.
    An event with no usable trace starts a fresh root, never a child of the
    dispatcher's own frame.
    """
    with _open_span(name, restore(event), kind, attributes) as span:
        yield span


__all__ = [
    "FLAG_RANDOM",
    "FLAG_SAMPLED",
    "OTLP_ENDPOINT_VARS",
    "TRACEPARENT_HEADER",
    "TRACEPARENT_VERSION",
    "Trace",
    "TraceParent",
    "build_provider",
    "child_span",
    "configure_tracing",
    "format_traceparent",
    "is_span_id",
    "is_trace_id",
    "otlp_endpoint_configured",
    "otlp_exporter",
    "parse_traceparent",
    "restore",
    "span_exporters",
    "start_span",
    "trace_of",
    "traceparent_from_headers",
    "tracer",
]
