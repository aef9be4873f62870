"""The event envelope (design: Event Schema) and its wire encoding.

The JSON keys are wire contracts. A registered type's typed fields are
marshalled flat beside the envelope's; keys this build does not know are kept
verbatim, in order, and written back, so an event from a newer build
round-trips losslessly.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, ClassVar, Optional, Sequence

from crewlet.events.registry import registered_type
from crewlet.events.trace import Trace

# Envelope keys, in wire order.
K_ID = "id"
K_TYPE = "type"
K_TIMESTAMP = "timestamp"
K_SOURCE = "source"
K_PAYLOAD = "payload"
K_TRACE_ID = "trace_id"
K_SPAN_ID = "span_id"
K_PARENT_SPAN_ID = "parent_span_id"
K_DELEGATION_DEPTH = "delegation_depth"
K_PARENT_TURN_ID = "parent_turn_id"
K_DELEGATION_CHAIN = "delegation_chain"
K_NODE = "node"

ENVELOPE_KEYS: tuple[str, ...] = (
    K_ID,
    K_TYPE,
    K_TIMESTAMP,
    K_SOURCE,
    K_PAYLOAD,
    K_TRACE_ID,
    K_SPAN_ID,
    K_PARENT_SPAN_ID,
    K_DELEGATION_DEPTH,
    K_PARENT_TURN_ID,
    K_DELEGATION_CHAIN,
    K_NODE,
)

def format_timestamp(ts: datetime) -> str:
    """RFC 3339, UTC, microseconds: the store's own resolution."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    ts = ts.astimezone(timezone.utc)
    # strftime's %Y does not zero-pad years below 1000 (Go's zero time is year 1).
    return f"{ts.year:04d}-{ts.month:02d}-{ts.day:02d}T{ts.hour:02d}:{ts.minute:02d}:{ts.second:02d}.{ts.microsecond:06d}Z"


def parse_timestamp(text: str) -> datetime:
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    # Go writes nanoseconds; Python keeps microseconds.
    if "." in value:
        head, _, rest = value.partition(".")
        digits = ""
        i = 0
        while i < len(rest) and rest[i].isdigit():
            digits += rest[i]
            i += 1
        value = f"{head}.{(digits + '000000')[:6]}{rest[i:]}"
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


SYSTEM_ACTOR = "system"


def default_actor(role: Any, source: Any, agent_id: Any) -> str:
    """Who did it, by the design's precedence: role, then source, then agent id, then "system".

    One function so a typed body and an event of a type this build does not
    know name their actor by the same rule.
    """
    for candidate in (role, source, agent_id):
        if isinstance(candidate, str) and candidate.strip():
            return candidate.strip()
    return SYSTEM_ACTOR


def _unset(value: Any) -> bool:
    """None, "", or an empty list or map: what a body field nobody set holds."""
    return value is None or (isinstance(value, (str, list, dict)) and not value)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _new_id() -> str:
    return str(uuid.uuid4())


@dataclass
class Event:
    """One thing that happened, or one piece of work, as it crosses the broker.

    ``data`` is the typed body when ``type`` is registered in this build
    (encoded flat beside the envelope); ``extra`` holds every key this build
    does not know, verbatim and in order.
    """

    type: str
    payload: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=_new_id)
    timestamp: datetime = field(default_factory=_now)
    source: str = ""
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str = ""
    delegation_depth: int = 0
    parent_turn_id: str = ""
    delegation_chain: list[str] = field(default_factory=list)
    node: str = ""
    data: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The timestamp text as decoded, so a finer-than-microsecond stamp from
    # another build is written back exactly while the timestamp is unchanged.
    _timestamp_text: Optional[tuple[datetime, str]] = field(default=None, repr=False, compare=False)

    ENVELOPE_KEYS: ClassVar[tuple[str, ...]] = ENVELOPE_KEYS

    def to_dict(self) -> dict[str, Any]:
        if self._timestamp_text is not None and self._timestamp_text[0] == self.timestamp:
            ts_text = self._timestamp_text[1]
        else:
            ts_text = format_timestamp(self.timestamp)
        out: dict[str, Any] = {
            K_ID: self.id,
            K_TYPE: self.type,
            K_TIMESTAMP: ts_text,
            K_SOURCE: self.source,
            K_PAYLOAD: self.payload if self.payload is not None else {},
            K_TRACE_ID: self.trace_id,
            K_SPAN_ID: self.span_id,
            K_PARENT_SPAN_ID: self.parent_span_id,
            K_DELEGATION_DEPTH: self.delegation_depth,
            K_PARENT_TURN_ID: self.parent_turn_id,
            K_DELEGATION_CHAIN: list(self.delegation_chain),
        }
        if self.node:
            out[K_NODE] = self.node
        if self.data is not None:
            for f in dataclasses.fields(self.data):
                if f.name in out or f.name == K_NODE:
                    continue  # the envelope owns its keys; a colliding field is dropped
                out[f.name] = getattr(self.data, f.name)
        for key, value in self.extra.items():
            if key not in out and key != K_NODE:
                out[key] = value
        return out

    def to_json(self) -> bytes:
        """The event as UTF-8 JSON; never fails on what a string holds.

        A lone surrogate (a model's or a vendor's broken text) has no UTF-8
        form: it is written as its ``\\uXXXX`` escape, which is valid JSON
        and decodes back to the same string, where the plain encode would
        raise and cost the publish.
        """
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Event":
        if not isinstance(raw, dict):
            raise ValueError("an event is a JSON object")
        rest = dict(raw)
        etype = rest.pop(K_TYPE, None)
        if not isinstance(etype, str) or not etype:
            raise ValueError("an event needs a non-empty string 'type'")
        ts_text = rest.pop(K_TIMESTAMP, None)
        timestamp = parse_timestamp(ts_text) if isinstance(ts_text, str) and ts_text else _now()
        payload = rest.pop(K_PAYLOAD, None)
        event = cls(
            type=etype,
            payload=payload if isinstance(payload, dict) else {},
            id=str(rest.pop(K_ID, "") or _new_id()),
            timestamp=timestamp,
            source=str(rest.pop(K_SOURCE, "") or ""),
            trace_id=str(rest.pop(K_TRACE_ID, "") or ""),
            span_id=str(rest.pop(K_SPAN_ID, "") or ""),
            parent_span_id=str(rest.pop(K_PARENT_SPAN_ID, "") or ""),
            delegation_depth=int(rest.pop(K_DELEGATION_DEPTH, 0) or 0),
            parent_turn_id=str(rest.pop(K_PARENT_TURN_ID, "") or ""),
            delegation_chain=list(rest.pop(K_DELEGATION_CHAIN, None) or []),
            node=str(rest.pop(K_NODE, "") or ""),
        )
        if isinstance(ts_text, str) and ts_text:
            event._timestamp_text = (timestamp, ts_text)
        body_cls = registered_type(etype)
        if body_cls is not None:
            kwargs = {}
            for f in dataclasses.fields(body_cls):
                if f.name in rest:
                    kwargs[f.name] = rest.pop(f.name)
            event.data = body_cls(**kwargs)
        event.extra = rest
        return event

    @classmethod
    def from_json(cls, raw: bytes | str) -> "Event":
        if isinstance(raw, (bytes, bytearray, memoryview)):
            raw = bytes(raw).decode("utf-8")
        return cls.from_dict(json.loads(raw))

    def copy(self) -> "Event":
        """A deep copy the caller may mutate freely."""
        return copy.deepcopy(self)

    def field(self, name: str) -> Any:
        """A body field by name, wherever this event keeps it; None when no layer names it.

        The ONE precedence every reader uses (design: Event Schema), first
        layer that holds the name wins:

        1. the typed body (``data``), when the field is set: the field as this
           build declares it;
        2. the kept unknown keys (``extra``): the flat fields of a type, or of
           a newer version of a type, this build does not know — the same
           typed layer as ``data``, only undecoded;
        3. the free-form ``payload`` map: extras a publisher rides beside the
           typed fields (an ``external_notification``'s ``partition_key`` and
           ``conversation_identity``, an ``a2a_request``'s ``body``);
        4. the typed body's unset value, when ``data`` declares the field and
           no layer above holds it.

        "Set" means anything but what a field nobody filled holds by default —
        None, "", an empty list or map; False and 0 are values. An unset typed
        field yields to a payload that carries the name, because a wake's
        publisher may ride a value in the payload beside a typed field it left
        empty, and a reader must see that value. Typed before untyped, because
        a field a newer build promotes from the payload to the body must win
        over a stale payload copy of it. A key present in ``extra`` or
        ``payload`` is a value even when empty, so "named and empty" and "not
        named at all" (None) stay distinct for a reader that requires a field.
        """
        data = self.data
        declared = data is not None and hasattr(data, name)
        value = getattr(data, name) if declared else None
        if declared and not _unset(value):
            return value
        if name in self.extra:
            return self.extra[name]
        if isinstance(self.payload, dict) and name in self.payload:
            return self.payload[name]
        return value

    def actor(self) -> str:
        """Who did this: the typed body's answer, else role, source, agent id, "system"."""
        if self.data is not None and callable(getattr(self.data, "actor", None)):
            who: str = self.data.actor(self)
            return who
        return default_actor(self.field("role"), self.source, self.field("agent_id"))

    def summary(self) -> str:
        """One line in a person's words; an unknown type still says who and what happened."""
        if self.data is not None and callable(getattr(self.data, "summary", None)):
            line: str = self.data.summary(self)
            return line
        what = self.type.replace("_", " ").replace(".", " ").strip()
        return f"{self.actor()}: {what}"


def new(
    payload: Any,
    trace: Trace,
    *,
    source: str = "",
    extras: Optional[dict[str, Any]] = None,
    delegation_depth: int = 0,
    parent_turn_id: str = "",
    delegation_chain: Optional[Sequence[str]] = None,
    event_id: Optional[str] = None,
    timestamp: Optional[datetime] = None,
) -> Event:
    """Build an event from a typed body and the trace it belongs to (``events.New``).

    ``payload`` is an instance of a registered event class; its wire type is
    the one it was registered under. ``trace`` is a ``crewlet.events.trace.Trace``
    the caller derived (normally ``crewlet.events.tracing.trace_of()``) and is copied onto the
    envelope as given: nothing here reads an ambient span, because an event
    whose trace depended on the frame that built it would hang off the wrong
    work. ``extras`` fills the envelope's free-form ``payload`` map.
    ``event_id`` and ``timestamp`` exist for an event that must be repeated
    exactly (a run's ending recorded on its row is re-published under the same
    id and instant); ``node`` is never set here — the queue stamps it.
    """
    if not isinstance(trace, Trace):
        raise TypeError(
            "new() needs a crewlet.events.trace.Trace (derive one with crewlet.events.tracing.trace_of()), "
            f"not {type(trace).__name__}"
        )
    etype = getattr(type(payload), "event_type", None)
    if not isinstance(etype, str) or registered_type(etype) is not type(payload):
        raise TypeError(f"new() needs an instance of a registered event class, not {type(payload).__name__}")
    event = Event(
        type=etype,
        payload=dict(extras or {}),
        source=source,
        trace_id=trace.trace_id,
        span_id=trace.span_id,
        parent_span_id=trace.parent_span_id,
        delegation_depth=delegation_depth,
        parent_turn_id=parent_turn_id,
        delegation_chain=list(delegation_chain or []),
        data=payload,
    )
    if event_id is not None:
        event.id = event_id
    if timestamp is not None:
        event.timestamp = timestamp
    return event
