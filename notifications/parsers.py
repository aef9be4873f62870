"""What every source's parser shares: the parse contract, its result, and the decoding no store trips on.

Each vendor's parser (``notifications/sources/<vendor>.py``) subclasses
:class:`Parser` and reads one decoded delivery (the provider's JSON object,
plus the few facts only headers or the route carry — :class:`DeliveryMeta`)
into a :class:`Parsed` that says:

* ``partition_key`` — the batch a wake joins (design: Inbox Batching);
* ``conversation_identity`` — the durable thread it belongs to, which the
  partition key always equals or cuts finer;
* ``recipients`` — the surface identities it is addressed to, and why
  (mention, direct message, assignee, requested reviewer);
* ``salient_body`` — what the message says, and ``digest_body`` — what an
  EARLIER constituent of a digest collapses to ("" = keep the salient body:
  comments and messages always keep their text; lifecycle events such as
  Jira ``issue_updated`` or a code host's ``labeled`` collapse to their lead);
* ``filtered`` — a chat parser's own filtering (a system post, a deleted
  post, an edit that adds no mention, an event type nobody routes): the
  delivery concerns nobody and is logged at debug, never recorded.

A payload a parser recognises and cannot read raises :class:`ParseError`,
which routing records as ``notification_skipped`` / ``parse failed`` with the
error as ``detail``. Parsers are pure: no store, no organization, no clock.
Which recipient is a seat, who follows a thread, and whether a recipient
caused the event itself are routing's questions (``notifications.service``).
Each vendor module's docstring gives its key rules (design: Inbox Batching &
Coalescing; ../shared/fixtures/README.md).

Every decode of a delivery goes through :func:`load_json` (a nesting limit),
and :func:`unstorable` names what in a delivery no store downstream can hold.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, fields, is_dataclass
from itertools import accumulate, count
from operator import sub
from typing import Any, ClassVar, Iterable, Mapping, Optional

from crewlet.events.categories import SURFACE_WEBHOOK

# Why a recipient was addressed.
WHY_MENTION = "mention"
WHY_DM = "dm"
WHY_ASSIGNEE = "assignee"
WHY_REVIEWER = "reviewer"
WHY_FOLLOWER = "follower"
#: Reasons that are a direct ask of the recipient (the delivery obligation):
#: a follower's wake is a broadcast it may read and leave.
DIRECT_REASONS = frozenset({WHY_MENTION, WHY_DM, WHY_ASSIGNEE, WHY_REVIEWER})

# A chat parser's filtering reasons (debug-logged, never recorded).
FILTER_SYSTEM_POST = "system post"
FILTER_DELETED_POST = "deleted post"
FILTER_EDIT = "edited post without a new mention"
FILTER_HANDSHAKE = "handshake"
FILTER_UNHANDLED = "unhandled event"


class ParseError(ValueError):
    """The parser recognises this delivery and cannot read it; the message is the skip's ``detail``."""


@dataclass(frozen=True)
class DeliveryMeta:
    """What the route and the headers say that the body does not.

    ``event_name``: GitHub's ``X-GitHub-Event``, Confluence's ``?event=``.
    ``delivery_id``: ``X-GitHub-Delivery`` / ``X-Atlassian-Webhook-Identifier``.
    """

    event_name: str = ""
    delivery_id: str = ""
    query: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Recipient:
    """One surface identity a delivery is addressed to; ``aliases`` are other spellings of the same person."""

    identity: str
    why: str
    aliases: tuple[str, ...] = ()

    @property
    def direct(self) -> bool:
        return self.why in DIRECT_REASONS


@dataclass(frozen=True)
class Parsed:
    """Everything routing needs from one delivery, source-neutral."""

    source: str
    event_name: str
    delivery_id: str = ""
    #: The message's identity on its backend (a chat post), else the delivery's.
    message_id: str = ""
    sender: str = ""
    sender_aliases: tuple[str, ...] = ()
    sender_name: str = ""
    partition_key: str = ""
    conversation_identity: str = ""
    title: str = ""
    url: str = ""
    body: str = ""
    digest_body: str = ""
    recipients: tuple[Recipient, ...] = ()
    chat: bool = False
    dm: bool = False
    #: A chat reply inside a thread: only a mention or a follow reaches a seat.
    thread_reply: bool = False
    #: Non-empty: the parser's own filtering — the delivery concerns nobody.
    filtered: str = ""


# ---------------------------------------------------------------------------
# small readers (a vendor's payload is untrusted: a missing or mistyped field reads as empty)


def as_text(value: Any) -> str:
    """A scalar as stripped text; anything else (an object, a list, null, a boolean) as ""."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        return str(value)
    return value.strip() if isinstance(value, str) else ""


def as_dict(value: Any) -> dict[str, Any]:
    """An object as itself, anything else as an empty one."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """An array as itself, anything else as an empty one."""
    return value if isinstance(value, list) else []


def need(value: Any, what: str) -> str:
    """A field the parse cannot go on without: its text, or :class:`ParseError` naming ``what``."""
    text = as_text(value)
    if not text:
        raise ParseError(f"{what} is missing")
    return text


def unique(recipients: Iterable[Recipient]) -> tuple[Recipient, ...]:
    """First mention of each identity wins, a direct reason over a weaker one."""
    out: dict[str, Recipient] = {}
    for r in recipients:
        if not r.identity:
            continue
        key = r.identity
        if key not in out:
            out[key] = r
    return tuple(out.values())


def body_digest_id(raw: bytes) -> str:
    """A delivery id for a provider that sends none: the same bytes (a retry) give the same id."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:32]


# ---------------------------------------------------------------------------
# reading a delivery's JSON, and what no store downstream can hold

#: How deep a webhook body may nest. Real deliveries nest a few dozen levels
#: at most (an ADF comment with lists in lists); the JSON decoder recurses once
#: per level, so a body past this is refused before it is decoded.
MAX_JSON_DEPTH = 512
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|\\.', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEPS = str.maketrans({"[": "\x02", "{": "\x02", "]": "\x00", "}": "\x00"})
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_UNSTORABLE_HINT = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})|\x00|\xed[\xa0-\xbf]")
#: How much of a path or a message a refusal quotes.
_QUOTE_LIMIT = 200


class JSONTooDeep(ValueError):
    """A JSON document nests deeper than :data:`MAX_JSON_DEPTH`."""


def json_depth_exceeds(text: str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """True when ``text`` opens more than ``max_depth`` arrays or objects inside each other.

    Linear and without recursion: strings (and any stray escape) are cut out
    first, so a bracket inside a string never counts; what is left is folded
    into running depths by C-level iterators. A string that never ends leaves
    its brackets counted, which can only call a malformed body too deep: both
    are refused.
    """
    if text.count("[") + text.count("{") <= max_depth:
        return False
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    steps = brackets.translate(_BRACKET_STEPS).encode("latin-1")
    # Each opener adds 2 and each bracket costs 1: the running total minus the
    # brackets seen is the depth after each one.
    return max(map(sub, accumulate(steps), count(1)), default=0) > max_depth


def load_json(raw: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for a webhook body, refusing one nested past ``max_depth`` (:class:`JSONTooDeep`).

    Every decode of a delivery goes through here: the standard decoder
    recurses per level, and a body nested a thousand levels would otherwise
    overflow the interpreter's stack (a 500) instead of being refused.
    """
    text = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, (bytes, bytearray)) else raw
    if json_depth_exceeds(text, max_depth):
        raise JSONTooDeep(f"the JSON nests deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except RecursionError as exc:  # a caller already deep in its own stack
        raise JSONTooDeep(f"the JSON nests too deep to decode here: {exc}") from exc


def may_hold_unstorable(raw: bytes) -> bool:
    """False when a UTF-8 JSON body cannot decode to a NUL or a lone surrogate, so :func:`unstorable` need not walk it.

    In UTF-8 JSON those characters arrive only as a ``\\u0000`` or
    ``\\uD800``-``\\uDFFF`` escape (also inside a JSON document carried as a
    string, where the escape is itself escaped) or as raw bytes the decoder
    lets through. Conservative: a surrogate pair (an emoji escaped) also says
    True, and the walk then finds nothing.
    """
    if json.detect_encoding(raw) not in ("utf-8", "utf-8-sig"):
        return True
    return _UNSTORABLE_HINT.search(raw) is not None


def storable_text(text: str, limit: int = _QUOTE_LIMIT) -> str:
    """``text`` with NUL and lone surrogates spelled as ``\\uXXXX`` escapes, clipped to ``limit`` characters.

    For quoting a delivery's own words (a key, a parser's error) in a reason,
    a log line or a recorded event, none of which may carry those characters.
    """
    clipped = text if len(text) <= limit else text[: limit - 1] + "…"
    return _UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", clipped)


def _unstorable_problem(char: str) -> str:
    if char == "\x00":
        return "a NUL character (\\u0000), which the database cannot store"
    return f"a lone surrogate (\\u{ord(char):04x}), which has no UTF-8 encoding"


def unstorable(value: Any, where: str = "") -> Optional[str]:
    """Why ``value`` cannot be stored downstream, naming the first offending key or string; None when it can.

    Walks every key and string of a decoded JSON value (and the fields of a
    :class:`Parsed`) with an explicit stack, so depth costs no call stack.
    """
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            bad = _UNSTORABLE.search(item)
            if bad is not None:
                return f"{path or 'the body'} contains {_unstorable_problem(bad.group())}"
        elif isinstance(item, Mapping):
            for key, child in reversed(list(item.items())):
                name = key if isinstance(key, str) else str(key)
                inner = f"{path}.{storable_text(name, 40)}" if path else storable_text(name, 40)
                bad = _UNSTORABLE.search(name)
                if bad is not None:
                    return f"the key {inner!s} contains {_unstorable_problem(bad.group())}"[:_QUOTE_LIMIT * 2]
                stack.append((child, inner[:_QUOTE_LIMIT]))
        elif isinstance(item, (list, tuple)):
            for index in range(len(item) - 1, -1, -1):
                stack.append((item[index], f"{path}[{index}]"[:_QUOTE_LIMIT]))
        elif is_dataclass(item) and not isinstance(item, type):
            stack.append(({f.name: getattr(item, f.name) for f in fields(item)}, path))
    return None


# ---------------------------------------------------------------------------
# the base class


class Parser:
    """One source's rules. Subclasses implement :meth:`parse`; the named accessors read from it."""

    source: ClassVar[str] = ""
    chat: ClassVar[bool] = False
    #: The inbound_delivery label's surface (``webhook``, ``forge``, ``socket``).
    surface: ClassVar[str] = SURFACE_WEBHOOK

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        raise NotImplementedError

    def __call__(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        """``parse``, with a malformed shape turned into :class:`ParseError` rather than a crash."""
        if not isinstance(payload, Mapping):
            raise ParseError(f"the delivery is a JSON {type(payload).__name__}, not an object")
        try:
            parsed = self.parse(payload, meta)
        except ParseError:
            raise
        except Exception as exc:
            # A parser is a pure function of the payload: whatever it raises,
            # it raises on every attempt, so it is the payload's fault.
            raise ParseError(storable_text(f"{type(exc).__name__}: {exc}")) from exc
        problem = unstorable(parsed)
        if problem is not None:
            raise ParseError(problem)
        return parsed

    def embedded(self, payload: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """JSON documents the delivery carries as strings, decoded: (where, value).

        The edge checks them with the body, since what the parser reads from
        them travels downstream just the same. One that does not decode is
        left out: parsing reports it.
        """
        return []

    # The issue names these as what a parser owns; each reads the one parse.
    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        """The delivery's event name, readable even from a payload :meth:`parse` refuses."""
        return meta.event_name

    def delivery_id(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        """The provider's id for this delivery (a retry repeats it), readable before a full parse."""
        return meta.delivery_id

    def partition_key(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return self(payload, meta).partition_key

    def conversation_identity(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return self(payload, meta).conversation_identity

    def recipients(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> tuple[Recipient, ...]:
        return self(payload, meta).recipients

    def salient_body(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return self(payload, meta).body

    def digest_body(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        """What an earlier constituent of a digest collapses to; "" keeps the salient body."""
        return self(payload, meta).digest_body

    def normalize(self, identity: str) -> str:
        """How this surface compares identities (GitHub logins and Mattermost usernames ignore case)."""
        return identity


__all__ = [
    "DIRECT_REASONS",
    "FILTER_DELETED_POST",
    "FILTER_EDIT",
    "FILTER_HANDSHAKE",
    "FILTER_SYSTEM_POST",
    "FILTER_UNHANDLED",
    "JSONTooDeep",
    "MAX_JSON_DEPTH",
    "DeliveryMeta",
    "ParseError",
    "Parsed",
    "Parser",
    "Recipient",
    "WHY_ASSIGNEE",
    "WHY_DM",
    "WHY_FOLLOWER",
    "WHY_MENTION",
    "WHY_REVIEWER",
    "as_dict",
    "as_list",
    "as_text",
    "body_digest_id",
    "json_depth_exceeds",
    "load_json",
    "may_hold_unstorable",
    "need",
    "storable_text",
    "unique",
    "unstorable",
]
