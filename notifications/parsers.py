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

Every decode of a delivery goes through :func:`decode_body` — JSON through
:func:`load_json` (a nesting limit); a form-encoded body (GitHub's default
content type, Slack's slash commands and interactivity) through
:func:`read_form` and its source's form reader — and :func:`unstorable` names
what in a delivery no store downstream can hold.
"""
from __future__ import annotations

import hashlib
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping, Optional, Sequence

from crewlet.base import jsontext
from crewlet.events.labels import SURFACE_WEBHOOK
from crewlet.base.jsontext import QUOTE_LIMIT, JSONTooDeep, dotted, may_hold_unstorable, storable_text

# Why a recipient was addressed.
WHY_MENTION = "mention"
WHY_DM = "dm"
WHY_ASSIGNEE = "assignee"
WHY_REVIEWER = "reviewer"
WHY_FOLLOWER = "follower"
#: Named by the route or the command that carried it (a slash command's seat,
#: the generic source's ``/webhooks/generic/<seat>``, a click on the seat's own message).
WHY_ADDRESSED = "addressed"
#: Reasons that are a direct ask of the recipient (the delivery obligation):
#: a follower's wake is a broadcast it may read and leave.
DIRECT_REASONS = frozenset({WHY_MENTION, WHY_DM, WHY_ASSIGNEE, WHY_REVIEWER, WHY_ADDRESSED})

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
    ``route``: the path it was posted to (the generic source's names the seat).
    """

    event_name: str = ""
    delivery_id: str = ""
    query: Mapping[str, str] = field(default_factory=dict)
    route: str = ""


@dataclass(frozen=True)
class Recipient:
    """One surface identity a delivery is addressed to; ``aliases`` are other spellings of the same person.

    ``by_handle``: ``identity`` is a seat handle (what a person types after a
    slash command, or the generic source's route), not an identity on the surface.
    """

    identity: str
    why: str
    aliases: tuple[str, ...] = ()
    by_handle: bool = False

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

    @classmethod
    def chat_message(
        cls,
        source: str,
        event_name: str,
        delivery_id: str,
        message_id: str,
        *,
        channel: str,
        root: str,
        dm: bool,
        thread_reply: bool,
        kind: str,
        place: str,
        sender: str,
        sender_name: str,
        recipients: Iterable[Recipient],
        **fields: Any,
    ) -> Parsed:
        """A message posted in a chat channel: what every chat source's message shares.

        Its batch and thread come from :func:`chat_keys`; its title names the
        ``kind`` of post and where it was said (``place``, or "a direct
        message"); an earlier message of a digest keeps its whole text (no
        ``digest_body``); a recipient named twice counts once. ``fields`` are
        the rest of the record as the source read it (``body``, ``filtered``).
        """
        partition, identity = chat_keys(source, channel, root, dm=dm, thread_reply=thread_reply)
        title = f"{kind} in {'a direct message' if dm else place}"
        return cls(
            source, event_name, delivery_id, message_id, sender=sender, sender_name=sender_name or sender,
            partition_key=partition, conversation_identity=identity, title=title, recipients=unique(recipients),
            chat=True, dm=dm, thread_reply=thread_reply, **fields,
        )

    @classmethod
    def item(cls, source: str, event_name: str, delivery_id: str, message_id: str, *, key: str, **fields: Any) -> Parsed:
        """A delivery about one tracked item (an issue, a pull request, a page): the item is its conversation.

        Every delivery about the item joins one batch, ``key``, which is also
        the thread it belongs to: a tracker has no finer thread than its item.
        """
        return cls(source, event_name, delivery_id, message_id, partition_key=key, conversation_identity=key, **fields)


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


def chat_keys(source: str, channel: str, root: str, *, dm: bool, thread_reply: bool) -> tuple[str, str]:
    """A chat message's (partition key, conversation identity): the one rule Slack and Mattermost share.

    A thread is ``<source>:<channel>:<root>`` (a top-level message is its own
    root). A DM is one conversation, ``<source>:<channel>``, whose top-level
    messages batch together while a reply inside a thread keeps that thread's key.
    """
    thread = f"{source}:{channel}:{root}"
    conversation = f"{source}:{channel}" if dm else thread
    return (thread if (not dm or thread_reply) else conversation), conversation


def body_digest_id(raw: bytes) -> str:
    """A delivery id for a provider that sends none: the same bytes (a retry) give the same id."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:32]


# ---------------------------------------------------------------------------
# reading a delivery's JSON, and what no store downstream can hold

#: How deep a webhook body may nest. Real deliveries nest a few dozen levels
#: at most (an ADF comment with lists in lists); the JSON decoder recurses once
#: per level, so a body past this is refused before it is decoded.
MAX_JSON_DEPTH = 512
#: How much of a key a refusal's path quotes.
_KEY_QUOTE_LIMIT = 40


def load_json(raw: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for a webhook body, refusing one nested past ``max_depth`` (:class:`JSONTooDeep`).

    Every decode of a delivery goes through here: the standard decoder
    recurses per level, and a body nested a thousand levels would otherwise
    overflow the interpreter's stack (a 500) instead of being refused.
    """
    return jsontext.load_json(raw, max_depth=max_depth)


JSON_MEDIA = "application/json"
FORM_MEDIA = "application/x-www-form-urlencoded"
#: The form field GitHub's form content type and Slack's interactivity put the JSON in.
FORM_PAYLOAD_FIELD = "payload"
#: How many fields a form body may carry: Slack's slash command sends about fifteen.
MAX_FORM_FIELDS = 200

#: ``form(fields)``: the JSON object a form-encoded delivery carries, for its parser; :class:`MalformedForm` says why not.
FormReader = Callable[[Sequence[tuple[str, str]]], dict[str, Any]]


class BodyError(ValueError):
    """A delivery's body cannot be read as what its content type says; the message is the reason."""


class UnsupportedMedia(BodyError):
    """The content type is none the source accepts; the message names what it does accept."""


class MalformedForm(BodyError):
    """A form-encoded body that is not one, or lacks the field its source reads."""


def media_type(content_type: str) -> str:
    """``application/json; charset=utf-8`` -> ``application/json``."""
    return content_type.split(";", 1)[0].strip().lower()


def is_json_media(media: str) -> bool:
    return media == JSON_MEDIA or (media.startswith("application/") and media.endswith("+json"))


def read_form(body: bytes) -> list[tuple[str, str]]:
    """The (name, value) pairs of an ``application/x-www-form-urlencoded`` body, strictly.

    Percent-escapes must decode to UTF-8 (an invalid sequence is refused,
    never replaced: what the vendor signed is what is read), and every field
    must be ``name=value``.
    """
    try:
        text = body.decode("utf-8")
        return urllib.parse.parse_qsl(
            text, keep_blank_values=True, strict_parsing=True, encoding="utf-8", errors="strict", max_num_fields=MAX_FORM_FIELDS
        )
    except UnicodeDecodeError as exc:
        raise MalformedForm(f"a form field is not UTF-8 ({exc.reason})") from None
    except ValueError as exc:
        raise MalformedForm(storable_text(str(exc), QUOTE_LIMIT)) from None


def form_field(fields: Sequence[tuple[str, str]], name: str) -> str:
    """The one value of field ``name``; :class:`MalformedForm` when it is missing or repeated."""
    values = [value for key, value in fields if key == name]
    if len(values) != 1:
        raise MalformedForm(f"the form must carry exactly one {name}= field, not {len(values)}")
    return values[0]


def form_json(fields: Sequence[tuple[str, str]], name: str = FORM_PAYLOAD_FIELD) -> dict[str, Any]:
    """The JSON object in form field ``name`` (GitHub's form content type, Slack's interactivity)."""
    value = load_json(form_field(fields, name))
    if not isinstance(value, dict):
        raise MalformedForm(f"the {name}= field must hold a JSON object, not a {type(value).__name__}")
    return value


def decode_body(body: bytes, content_type: str, form: Optional[FormReader] = None) -> Any:
    """A delivery's body as its parser reads it: JSON, or (when the source reads forms) a form's object.

    Raises :class:`UnsupportedMedia` for any other content type,
    :class:`MalformedForm` for a broken form, and :func:`load_json`'s errors
    (:class:`JSONTooDeep`, ``ValueError``) for broken JSON. The edge and the
    router both decode through here, so what the edge accepted the router reads.
    """
    media = media_type(content_type)
    if is_json_media(media):
        return load_json(body)
    if media == FORM_MEDIA and form is not None:
        return form(read_form(body))
    accepted = JSON_MEDIA + (f" or {FORM_MEDIA}" if form is not None else "")
    raise UnsupportedMedia(f"content type {content_type or '(none)'!r} is not accepted: send {accepted}")


def _unstorable_problem(char: str) -> str:
    if char == "\x00":
        return "a NUL character (\\u0000), which the database cannot store"
    return f"a lone surrogate ({jsontext.escape(char)}), which has no UTF-8 encoding"


def _key(name: str) -> str:
    return storable_text(name, _KEY_QUOTE_LIMIT)


def unstorable(value: Any, where: str = "") -> Optional[str]:
    """Why ``value`` cannot be stored downstream, naming the first offending key or string; None when it can.

    Every key and string of a decoded JSON value (and the fields of a
    :class:`Parsed`) is looked at (:func:`crewlet.base.jsontext.find_unstorable`);
    the path it names starts at ``where``.
    """
    found = jsontext.find_unstorable(value)
    if found is None:
        return None
    problem = _unstorable_problem(found.char)
    if found.in_key:
        parent = dotted(found.parts[:-1], where, _key)[:QUOTE_LIMIT]
        name = _key(str(found.parts[-1]))
        return f"the key {f'{parent}.{name}' if parent else name} contains {problem}"[: QUOTE_LIMIT * 2]
    return f"{dotted(found.parts, where, _key)[:QUOTE_LIMIT] or 'the body'} contains {problem}"


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
    "BodyError",
    "DIRECT_REASONS",
    "FORM_MEDIA",
    "FORM_PAYLOAD_FIELD",
    "FormReader",
    "JSON_MEDIA",
    "MalformedForm",
    "UnsupportedMedia",
    "WHY_ADDRESSED",
    "decode_body",
    "form_field",
    "form_json",
    "is_json_media",
    "media_type",
    "read_form",
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
    "chat_keys",
    "load_json",
    "may_hold_unstorable",
    "need",
    "storable_text",
    "unique",
    "unstorable",
]
