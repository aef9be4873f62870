"""Trace context: W3C ``traceparent``, ``trace_of()``, restoring an event's trace, OTLP setup.

Design (docs/design.md § Distributed tracing):

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

The value type (``Trace``) and the ``traceparent`` codec live in
``crewlet.events.trace``, which needs no OpenTelemetry, so the envelope can
build and decode events without this module; they are re-exported here for
the callers that also open spans.

OpenTelemetry's SDK is wired in by ``configure_tracing()`` as the SDK documents
it, reading the standard variables and overriding none: the resource is the
SDK's own (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``; ``crewlet`` is
only the fallback service name when neither names one), the sampler is
``OTEL_TRACES_SAMPLER``'s, the batch processor reads ``OTEL_BSP_*``. OTLP export
is on only when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the
traces-specific ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and
``OTEL_TRACES_EXPORTER`` does not say ``none``, so a laptop exports nothing and
needs no collector. The exporter is the HTTP/protobuf one (no grpc), and it
reads the rest of the standard ``OTEL_EXPORTER_OTLP_*`` variables itself.
:func:`flush_spans` exports what is batched (the engine calls it as it stops).

:func:`messaging_attributes` are the semantic conventions' attributes of a
span that publishes to or processes from the broker.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Union

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags

from crewlet.events.trace import (
    FLAG_RANDOM,
    FLAG_SAMPLED,
    TRACEPARENT_HEADER,
    TRACEPARENT_VERSION,
    Trace,
    TraceParent,
    format_traceparent,
    is_span_id,
    is_trace_id,
    parse_traceparent,
    traceparent_from_headers,
)

if TYPE_CHECKING:  # pragma: no cover - hints only
    from crewlet.events.envelope import Event

log = logging.getLogger("crewlet.events.tracing")

OTLP_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
#: The standard variable naming the traces exporter; "none" turns export off.
TRACES_EXPORTER_VAR = "OTEL_TRACES_EXPORTER"
#: The service name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES gives one.
DEFAULT_SERVICE_NAME = "crewlet"
#: How long a stop waits for the batched spans to reach the collector.
FLUSH_TIMEOUT_S = 5.0
_TRACER_NAME = "crewlet"
_SERVICE_NAME = "service.name"
#: What the SDK names a service nobody named (``unknown_service`` or ``unknown_service:<executable>``).
_UNKNOWN_SERVICE = "unknown_service"

# Messaging semantic conventions (the OpenTelemetry names, spelled once here).
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_CONSUMER_GROUP_NAME = "messaging.consumer.group.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_SYSTEM_NATS = "nats"
#: ``messaging.operation.type`` of a span that publishes, and of one that processes a delivered message.
OPERATION_SEND = "send"
OPERATION_PROCESS = "process"


# --- OpenTelemetry wiring -------------------------------------------------

_configure_lock = threading.Lock()
# The exporter each provider this module built was given, so a caller (and a
# test) can ask whether export is on without reaching into SDK internals.
_exporters: "weakref.WeakKeyDictionary[TracerProvider, Any]" = weakref.WeakKeyDictionary()


def otlp_endpoint_configured(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the standard OTLP endpoint variable asks for export (off by default) and OTEL_TRACES_EXPORTER allows it."""
    env = os.environ if environ is None else environ
    exporters = {part.strip().lower() for part in (env.get(TRACES_EXPORTER_VAR) or "").split(",") if part.strip()}
    if exporters and "otlp" not in exporters:
        return False
    return any((env.get(name) or "").strip() for name in OTLP_ENDPOINT_VARS)


def service_resource(service_name: str = DEFAULT_SERVICE_NAME) -> Resource:
    """The SDK's resource from the standard variables, named ``service_name`` only when they name no service.

    ``Resource.create`` reads ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``
    (the latter winning); attributes passed to it would override both, so the
    fallback name is merged in only when the SDK found none.
    """
    resource = Resource.create()
    named = str(resource.attributes.get(_SERVICE_NAME, ""))
    if named and not named.startswith(_UNKNOWN_SERVICE):
        return resource
    return resource.merge(Resource({_SERVICE_NAME: service_name}))


#: The trace id the next root span started in this context takes (``start_span(root_trace_id=...)``).
_ROOT_TRACE_ID: ContextVar[Optional[int]] = ContextVar("crewlet_root_trace_id", default=None)


class KeyedIdGenerator(RandomIdGenerator):
    """Random ids, except a root span's trace id when ``start_span`` names one.

    A trace keyed by what it is about (a vendor's delivery id) is the same
    trace however many times the vendor sends the delivery, so a retry's
    answer names a trace that holds the delivery's events.
    """

    def generate_trace_id(self) -> int:
        keyed = _ROOT_TRACE_ID.get()
        return keyed if keyed is not None else super().generate_trace_id()


def build_provider(service_name: str = DEFAULT_SERVICE_NAME) -> TracerProvider:
    """A fresh SDK provider for this process, exporting over OTLP only when asked to.

    Separate from ``configure_tracing`` so the decision can be checked without
    touching the process-wide provider, which OpenTelemetry lets be set once.
    """
    provider = TracerProvider(resource=service_resource(service_name), id_generator=KeyedIdGenerator())
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


def configure_tracing(service_name: str = DEFAULT_SERVICE_NAME) -> TracerProvider:
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


def flush_spans(timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
    """Export every span batched so far (blocking, at most ``timeout_s``); True when all went.

    A clean stop calls it so the last requests' and turns' spans reach the
    collector rather than dying in the batch queue with the process.
    """
    provider = otel_trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return True
    done = provider.force_flush(int(max(timeout_s, 0.0) * 1000))
    if not done:
        log.warning("tracing_flush_incomplete", extra={"timeout_s": timeout_s})
    return bool(done)


def messaging_span_name(operation: str, destination: str) -> str:
    """A messaging span's name by OpenTelemetry's messaging conventions: ``{operation name} {destination}``.

    ``publish crewlet.notifications.inbound``, ``process crewlet.agent.ada.inbox``:
    a collector groups the spans of one destination whatever the code that
    made them calls its step (the step is the span's ``crewlet.*`` attributes).
    """
    return f"{_operation_name(operation)} {destination}"


def _operation_name(operation: str) -> str:
    return "publish" if operation == OPERATION_SEND else OPERATION_PROCESS


def messaging_attributes(operation: str, destination: str, *, group: str = "", message_id: str = "") -> dict[str, str]:
    """The messaging semantic conventions' attributes of a span that sends to or processes from ``destination``.

    ``operation`` is :data:`OPERATION_SEND` or :data:`OPERATION_PROCESS`;
    ``group`` the consumer group (a durable subscription's name) of a process span.
    """
    attributes = {
        MESSAGING_SYSTEM: MESSAGING_SYSTEM_NATS,
        MESSAGING_DESTINATION_NAME: destination,
        MESSAGING_OPERATION_TYPE: operation,
        MESSAGING_OPERATION_NAME: _operation_name(operation),
    }
    if group:
        attributes[MESSAGING_CONSUMER_GROUP_NAME] = group
    if message_id:
        attributes[MESSAGING_MESSAGE_ID] = message_id
    return attributes


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
    root_trace_id: str = "",
) -> Iterator[Span]:
    """Open a span and make it current for the block.

    With ``parent`` (a ``Trace`` or an inbound ``TraceParent``) the span is
    that span's child; without one it nests under the current span as usual,
    or starts a root when there is none. ``root_trace_id`` (32 hex digits),
    without a parent, makes the span a root of that trace (a provider
    :func:`build_provider` made honours it). ``trace_of()`` inside the block
    reports this span, with the span above as its parent.
    """
    if parent is None and root_trace_id:
        with contextlib.ExitStack() as stack:
            token = _ROOT_TRACE_ID.set(int(root_trace_id, 16))
            try:  # only this root takes the id: a root opened inside the block gets a random one
                span = stack.enter_context(_open_span(name, otel_context.Context(), kind, attributes))
            finally:
                _ROOT_TRACE_ID.reset(token)
            yield span
        return
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
    "DEFAULT_SERVICE_NAME",
    "FLAG_RANDOM",
    "FLAG_SAMPLED",
    "KeyedIdGenerator",
    "OTLP_ENDPOINT_VARS",
    "TRACEPARENT_HEADER",
    "TRACEPARENT_VERSION",
    "Trace",
    "TraceParent",
    "OPERATION_PROCESS",
    "OPERATION_SEND",
    "build_provider",
    "child_span",
    "configure_tracing",
    "flush_spans",
    "format_traceparent",
    "is_span_id",
    "is_trace_id",
    "messaging_attributes",
    "messaging_span_name",
    "otlp_endpoint_configured",
    "otlp_exporter",
    "parse_traceparent",
    "restore",
    "service_resource",
    "span_exporters",
    "start_span",
    "trace_of",
    "traceparent_from_headers",
    "tracer",
]
