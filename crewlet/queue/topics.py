"""Every subject the engine uses, built here and nowhere else (design: Topic Structure).

Also the one implementation of NATS subject matching (``*`` one token, ``>``
one or more trailing tokens), used by the in-memory twin and checked against a
real nats-server by the tests, and the stream topology both backends share.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Optional

from crewlet.queue.errors import InvalidArgument

PREFIX = "crewlet"
NOTIFICATIONS_INBOUND = "crewlet.notifications.inbound"
CONFIG_REVISION_ACTIVATED = "crewlet.config.revision_activated"
CONFIG_REVISION_APPLIED = "crewlet.config.revision_applied"
EVENTS_ALL = "crewlet.events.>"
AGENT_ALL = "crewlet.agent.>"
DLQ_PREFIX = "dlq"
DLQ_ALL = "dlq.>"
#: The fleet's history reads: every engine serves it from its own store (core request/reply, no stream).
HISTORY_READS = "crewlet.history.read"
#: A stateless node's custody batches: each data node serves ``<this>.<its node id>`` (core request/reply, no stream).
HISTORY_CUSTODY = "crewlet.history.custody"
#: A person's note to a seat's running turn: every engine serves it, the node running the seat answers (core, no stream).
TURN_STEER = "crewlet.steer.turn"

#: The lanes of a seat's subjects (``crewlet.agent.{handle}.{lane}``): its mail, its runs' control, its reflection.
LANE_INBOX = "inbox"
LANE_CONTROL = "control"
LANE_REFLECT = "reflect"

_TOKEN_BAD = re.compile(r"[\s.*>]")


def _token(value: str, what: str) -> str:
    if not isinstance(value, str) or not value or _TOKEN_BAD.search(value):
        raise InvalidArgument(f"{what}={value!r}: must be one non-empty subject token (no spaces, '.', '*', '>')")
    return value


def digest(*parts: str, length: int = 16) -> str:
    """A short stable digest: the identity where a readable join would alias."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:length]


def _agent_subject(handle: str, lane: str) -> str:
    """``crewlet.agent.{handle}.{lane}``: one lane of one seat's subjects."""
    return f"crewlet.agent.{_token(handle, 'handle')}.{lane}"


def _agent_group(handle: str, lane: str = "") -> str:
    """The consumer group of one lane of a seat: ``agent-{handle}`` for the inbox, else ``agent-{handle}-{lane}``."""
    group = f"agent-{_token(handle, 'handle')}"
    return f"{group}-{lane}" if lane else group


def agent_inbox(handle: str) -> str:
    return _agent_subject(handle, LANE_INBOX)


def agent_of(subject: str) -> tuple[str, str]:
    """(handle, lane) of one seat's subject (``crewlet.agent.{handle}.{lane}``), or ("", "") for any other subject."""
    parts = subject.split(".") if isinstance(subject, str) else []
    if len(parts) != 4 or parts[:2] != [PREFIX, "agent"] or _TOKEN_BAD.search(parts[2]) or not parts[2] or not parts[3]:
        return "", ""
    return parts[2], parts[3]


def inbox_seat(subject: str) -> str:
    """The seat whose inbox ``subject`` is, or "" when it is no seat's inbox."""
    handle, lane = agent_of(subject)
    return handle if lane == LANE_INBOX else ""


def agent_inbox_group(handle: str) -> str:
    return _agent_group(handle)


def agent_control(handle: str) -> str:
    return _agent_subject(handle, LANE_CONTROL)


def agent_control_group(handle: str) -> str:
    return _agent_group(handle, LANE_CONTROL)


def agent_reflect(handle: str) -> str:
    return _agent_subject(handle, LANE_REFLECT)


def agent_reflect_group(handle: str) -> str:
    return _agent_group(handle, LANE_REFLECT)


def custody(node: str) -> str:
    """The subject data node ``node`` keeps custody batches on."""
    return f"{HISTORY_CUSTODY}.{_token(node, 'node id')}"


def agent_pattern(handle: str = "*") -> str:
    """Every subject of one seat (or of every seat)."""
    if handle == "*":
        return AGENT_ALL
    return _agent_subject(handle, ">")


def event(event_type: str) -> str:
    """``crewlet.events.{type}``; a dotted type (``turn.guard_breach``) spans tokens."""
    if not isinstance(event_type, str) or not event_type or re.search(r"[\s*>]", event_type):
        raise InvalidArgument(f"event type={event_type!r}: not a subject-safe type name")
    if any(not part for part in event_type.split(".")):
        raise InvalidArgument(f"event type={event_type!r}: empty subject token")
    return f"crewlet.events.{event_type}"


def memory(handle: str, table: str, key: str) -> str:
    """One subject per memory row, on a stream that keeps the last message per subject."""
    return f"crewlet.memory.{_token(handle, 'handle')}.{_token(table, 'table')}.{digest(key, length=32)}"


def memory_pattern(handle: str) -> str:
    """Every memory row of one seat."""
    return f"crewlet.memory.{_token(handle, 'handle')}.>"


def _safe_head(subject: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-.]", "_", subject)


def dlq(topic: str, group: str) -> str:
    """``dlq.{topic}.{group}.{digest}``: the head is for grepping, the digest is the identity."""
    return f"{DLQ_PREFIX}.{_safe_head(topic)}.{_safe_head(group).replace('.', '_')}.{digest(topic, group)}"


# ---------------------------------------------------------------------------
# Subject grammar


def split(subject: str) -> list[str]:
    return subject.split(".")


def validate_subject(subject: str) -> str:
    """A literal subject: non-empty tokens, no wildcards, no whitespace."""
    if not isinstance(subject, str) or not subject:
        raise InvalidArgument(f"subject={subject!r}: must be a non-empty string")
    for tok in split(subject):
        if not tok or tok in ("*", ">") or re.search(r"\s", tok):
            raise InvalidArgument(f"subject={subject!r}: must be literal tokens separated by '.'")
    return subject


def validate_pattern(pattern: str) -> str:
    """A subject pattern: ``*`` a whole token, ``>`` only as the last token."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidArgument(f"pattern={pattern!r}: must be a non-empty subject pattern")
    toks = split(pattern)
    for i, tok in enumerate(toks):
        if not tok or re.search(r"\s", tok):
            raise InvalidArgument(f"pattern={pattern!r}: empty or blank token")
        if tok == ">" and i != len(toks) - 1:
            raise InvalidArgument(f"pattern={pattern!r}: '>' must be the last token")
        if tok != "*" and tok != ">" and ("*" in tok or ">" in tok):
            raise InvalidArgument(f"pattern={pattern!r}: wildcards must be whole tokens")
    return pattern


def matches(pattern: str, subject: str) -> bool:
    """NATS semantics: ``*`` matches exactly one token, ``>`` one or more trailing tokens."""
    ptoks = split(pattern)
    stoks = split(subject)
    for i, p in enumerate(ptoks):
        if p == ">":
            return len(stoks) > i
        if i >= len(stoks):
            return False
        if p != "*" and p != stoks[i]:
            return False
    return len(ptoks) == len(stoks)


def overlaps(a: str, b: str) -> bool:
    """Whether some literal subject matches both patterns."""
    at, bt = split(a), split(b)
    i = 0
    while i < len(at) and i < len(bt):
        x, y = at[i], bt[i]
        if x == ">" or y == ">":
            return True
        if x != "*" and y != "*" and x != y:
            return False
        i += 1
    return len(at) == len(bt)


# ---------------------------------------------------------------------------
# Stream topology (both backends model it; JetStream provisions it)


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: str  # the one pattern the stream carries
    retention: str  # "interest" | "limits"
    max_age: str = ""  # "" none | "events" (stream.event_retention_hours) | "config" (one hour)
    per_subject_last: bool = False  # keeps one message per subject


AGENT_STREAM = StreamSpec("CREWLET_AGENT", "crewlet.agent.>", "interest")
NOTIFICATIONS_STREAM = StreamSpec("CREWLET_NOTIFICATIONS", "crewlet.notifications.>", "interest")
EVENTS_STREAM = StreamSpec("CREWLET_EVENTS", "crewlet.events.>", "limits", max_age="events")
CONFIG_STREAM = StreamSpec("CREWLET_CONFIG", "crewlet.config.>", "limits", max_age="config")
MEMORY_STREAM = StreamSpec("CREWLET_MEMORY", "crewlet.memory.>", "limits", per_subject_last=True)
DLQ_STREAM = StreamSpec("CREWLET_DLQ", "dlq.>", "limits", max_age="events")

ENGINE_STREAMS: tuple[StreamSpec, ...] = (
    AGENT_STREAM,
    NOTIFICATIONS_STREAM,
    EVENTS_STREAM,
    CONFIG_STREAM,
    MEMORY_STREAM,
    DLQ_STREAM,
)
STREAM_PREFIX = "CREWLET_"
#: The most durable consumers each engine stream lets exist unless ``stream.max_consumers`` says otherwise.
#: Set on every stream explicitly: nats-server holds a stream created without a limit of its own to the
#: broker's ``jetstream.limits.default_max_consumers`` (1,000 in 2.15), which refused the mailbox of a
#: company's 500th agent seat. This leaves room for 25,000 agent seats (two mailboxes each) and still
#: bounds a consumer leak.
DEFAULT_MAX_CONSUMERS = 50_000
#: How long the events stream keeps an event unless ``stream.event_retention_hours`` says otherwise (30 days).
DEFAULT_EVENT_RETENTION_HOURS = 720.0
CONFIG_MAX_AGE_S = 3600.0


def _namespace_stream(subject_or_pattern: str) -> Optional[StreamSpec]:
    toks = split(subject_or_pattern)
    head = toks[0]
    if head in ("*", ">"):
        return None
    if head == PREFIX:
        if len(toks) < 2 or toks[1] in ("*", ">"):
            return None
        ns = f"{PREFIX}_{toks[1]}"
        pattern = f"{PREFIX}.{toks[1]}.>"
    else:
        ns = head
        pattern = f"{head}.>"
    name = STREAM_PREFIX + "NS_" + re.sub(r"[^A-Za-z0-9]", "_", ns).upper() + "_" + digest(pattern, length=8).upper()
    return StreamSpec(name, pattern, "interest")


def stream_for(subject: str) -> StreamSpec:
    """The stream a literal subject is stored on.

    A namespace the engine does not define gets ``CREWLET_NS_<NS>_<digest>``
    with the mailbox (interest) semantic: the subject space is the engine's.
    """
    validate_subject(subject)
    for spec in ENGINE_STREAMS:
        if matches(spec.subjects, subject):
            return spec
    namespaced = _namespace_stream(subject)
    if namespaced is None or len(split(subject)) < 2:
        raise InvalidArgument(f"subject={subject!r}: needs at least two tokens to name a namespace")
    return namespaced


def streams_for_pattern(pattern: str) -> list[StreamSpec]:
    """The streams a pattern can touch; a pattern spanning every namespace is refused."""
    validate_pattern(pattern)
    toks = split(pattern)
    if toks[0] in ("*", ">") or (toks[0] == PREFIX and (len(toks) == 1 or toks[1] in ("*", ">"))):
        raise InvalidArgument(
            f"pattern={pattern!r}: spans every namespace; name one namespace (e.g. crewlet.events.>)"
        )
    found = [spec for spec in ENGINE_STREAMS if overlaps(spec.subjects, pattern)]
    if found:
        return found
    spec = _namespace_stream(pattern)
    if spec is None:
        raise InvalidArgument(f"pattern={pattern!r}: does not name a namespace")
    return [spec]
