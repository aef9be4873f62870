"""Per-source parsers: one class per source owns everything source-specific.

Each parser reads one decoded delivery (the provider's JSON object, plus the
few facts only headers or the route carry — :class:`DeliveryMeta`) and says:

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

Key rules (design: Inbox Batching & Coalescing; ../shared/fixtures/README.md):

==========  ===========================================  =====================================
source      partition_key                                conversation_identity
==========  ===========================================  =====================================
github      ``github:<repo full_name>#<number>``          same
jira        ``jira:<issue key>``                          same
confluence  ``confluence:<page id>`` (a comment: parent)  same
slack       ``slack:<channel>:<thread root>``; a DM        a DM: ``slack:<channel>``;
            (``im``/``mpim``, or a ``D…`` channel when     elsewhere the partition key
            ``channel_type`` is missing) top-level
            message: ``slack:<channel>``; a DM thread
            reply keeps ``slack:<channel>:<root>``
mattermost  the Slack rule with ``post.root_id or          the Slack rule (DM: ``D`` or ``G``)
            post.id`` as the root (``data.post`` is a
            JSON string on the wire, decoded here)
==========  ===========================================  =====================================
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, fields, is_dataclass
from itertools import accumulate, count
from operator import sub
from typing import Any, ClassVar, Iterable, Mapping, Optional

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

SURFACE_WEBHOOK = "webhook"
SURFACE_FORGE = "forge"
SURFACE_SOCKET = "socket"


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
# small readers


def _s(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        return str(value)
    return value.strip() if isinstance(value, str) else ""


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _need(value: Any, what: str) -> str:
    text = _s(value)
    if not text:
        raise ParseError(f"{what} is missing")
    return text


def _uniq(recipients: Iterable[Recipient]) -> tuple[Recipient, ...]:
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


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


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


# ---------------------------------------------------------------------------
# Slack (Events API)

_SLACK_MENTION = re.compile(r"<@([UWB][A-Z0-9]+)(?:\|[^>]*)?>")
#: Message subtypes that are somebody saying something; every other subtype
#: (joins, topic changes, pins, ...) is a system post.
_SLACK_SPOKEN_SUBTYPES = frozenset({"", "thread_broadcast", "bot_message", "file_share", "me_message"})


class SlackParser(Parser):
    source = "slack"
    chat = True

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        event = _d(payload.get("event"))
        return _s(event.get("type")) or _s(payload.get("type")) or meta.event_name

    def delivery_id(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return _s(payload.get("event_id")) or meta.delivery_id

    @staticmethod
    def is_dm(event: Mapping[str, Any]) -> bool:
        """``im``/``mpim``; with no ``channel_type`` at all, a ``D…`` channel. A ``G…`` id alone says nothing."""
        channel_type = _s(event.get("channel_type"))
        if channel_type:
            return channel_type in ("im", "mpim")
        return _s(event.get("channel")).startswith("D")

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        outer = _s(payload.get("type"))
        name = self.event_name(payload, meta)
        delivery = self.delivery_id(payload, meta)
        if outer == "url_verification":
            return Parsed(self.source, name, delivery, chat=True, filtered=FILTER_HANDSHAKE)
        if outer and outer != "event_callback":
            return Parsed(self.source, name, delivery, chat=True, filtered=f"{FILTER_UNHANDLED} {outer}")
        event = payload.get("event")
        if not isinstance(event, dict):
            raise ParseError("event_callback carries no event object")
        etype = _s(event.get("type"))
        if etype not in ("message", "app_mention"):
            return Parsed(self.source, name, delivery, chat=True, filtered=f"{FILTER_UNHANDLED} {etype or '(none)'}")
        channel = _need(event.get("channel"), "event.channel")
        subtype = _s(event.get("subtype"))
        previous = _d(event.get("previous_message"))
        filtered = ""
        if subtype == "message_changed":
            message = _d(event.get("message"))
            ts = _s(message.get("ts")) or _s(previous.get("ts"))
            root = _s(message.get("thread_ts")) or ts
            text = _s(message.get("text"))
            user = _s(message.get("user")) or _s(previous.get("user"))
            bot = _s(message.get("bot_id"))
            display = _s(message.get("username"))
            before = set(_SLACK_MENTION.findall(_s(previous.get("text"))))
            mentions = [m for m in _SLACK_MENTION.findall(text) if m not in before]
            if not mentions:
                filtered = FILTER_EDIT
        elif subtype == "message_deleted":
            ts = _s(event.get("deleted_ts")) or _s(previous.get("ts"))
            root = _s(previous.get("thread_ts")) or ts
            text = _s(previous.get("text"))
            user = _s(previous.get("user"))
            bot = _s(previous.get("bot_id"))
            display = ""
            mentions = []
            filtered = FILTER_DELETED_POST
        else:
            ts = _s(event.get("ts"))
            root = _s(event.get("thread_ts")) or ts
            text = _s(event.get("text"))
            user = _s(event.get("user"))
            bot = _s(event.get("bot_id"))
            profile = _d(event.get("user_profile"))
            display = (
                _s(profile.get("display_name"))
                or _s(profile.get("real_name"))
                or _s(event.get("username"))
                or _s(_d(event.get("bot_profile")).get("name"))
            )
            mentions = _SLACK_MENTION.findall(text)
            if subtype not in _SLACK_SPOKEN_SUBTYPES:
                filtered = f"{FILTER_SYSTEM_POST} ({subtype})"
        if not ts:
            raise ParseError("the message has no ts")
        dm = self.is_dm(event)
        thread_reply = bool(root) and root != ts
        identity = f"slack:{channel}" if dm else f"slack:{channel}:{root}"
        partition = f"slack:{channel}:{root}" if (not dm or thread_reply) else f"slack:{channel}"
        sender = user or bot
        recipients = [Recipient(m, WHY_MENTION) for m in mentions]
        if dm and not filtered:
            for auth in self.authorized_users(payload):
                if auth != sender:
                    recipients.append(Recipient(auth, WHY_DM))
        where = "a direct message" if dm else f"<#{channel}>"
        return Parsed(
            source=self.source,
            event_name=name,
            delivery_id=delivery,
            message_id=f"{channel}:{ts}",
            sender=sender,
            sender_aliases=tuple(a for a in (bot,) if a and a != sender),
            sender_name=display or sender,
            partition_key=partition,
            conversation_identity=identity,
            title=f"Slack message in {where}",
            body=text,
            digest_body="",
            recipients=_uniq(recipients),
            chat=True,
            dm=dm,
            thread_reply=thread_reply,
            filtered=filtered,
        )

    @staticmethod
    def authorized_users(payload: Mapping[str, Any]) -> list[str]:
        """The installation's user the event is delivered for (``authorizations``; legacy ``authed_users``)."""
        users = [_s(_d(a).get("user_id")) for a in _l(payload.get("authorizations"))]
        users += [_s(u) for u in _l(payload.get("authed_users"))]
        return [u for u in dict.fromkeys(users) if u]


# ---------------------------------------------------------------------------
# GitHub

_GITHUB_MENTION = re.compile(r"(?<![\w/`@.-])@([A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38})(?![\w/-])")
#: Actions whose text is the ask itself (kept in a digest); every other action
#: on an issue or pull request is lifecycle and collapses to its lead line.
_GITHUB_SPOKEN_ACTIONS = frozenset({"opened", "created", "submitted"})
_GITHUB_EVENTS = frozenset(
    {"issues", "issue_comment", "pull_request", "pull_request_review", "pull_request_review_comment"}
)


class GitHubParser(Parser):
    source = "github"
    surface = SURFACE_FORGE

    def normalize(self, identity: str) -> str:
        return identity.lower()

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        if meta.event_name:
            return meta.event_name
        if "pull_request" in payload and "comment" in payload:
            return "pull_request_review_comment"
        if "review" in payload and "pull_request" in payload:
            return "pull_request_review"
        if "issue" in payload and "comment" in payload:
            return "issue_comment"
        if "pull_request" in payload:
            return "pull_request"
        if "issue" in payload:
            return "issues"
        return ""

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        name = self.event_name(payload, meta)
        delivery = self.delivery_id(payload, meta)
        if name not in _GITHUB_EVENTS:
            return Parsed(self.source, name, delivery, filtered=f"{FILTER_UNHANDLED} {name or '(unnamed)'}")
        action = _s(payload.get("action"))
        repo = _need(_d(payload.get("repository")).get("full_name"), "repository.full_name")
        issue = _d(payload.get("issue"))
        pr = _d(payload.get("pull_request"))
        item = issue or pr
        number = _s(issue.get("number")) or _s(pr.get("number")) or _s(payload.get("number"))
        if not number:
            raise ParseError("no issue or pull request number (issue.number, pull_request.number, number)")
        key = f"github:{repo}#{number}"
        is_pr = bool(pr) or bool(issue.get("pull_request"))
        kind = "pull request" if is_pr else "issue"
        sender = _d(payload.get("sender"))
        login = _s(sender.get("login"))
        comment = _d(payload.get("comment"))
        review = _d(payload.get("review"))
        title = _s(item.get("title"))
        lead = f"{login or 'someone'} {action or name} {kind} #{number} in {repo}" + (f": {title}" if title else "")
        if comment:
            text = _s(comment.get("body"))
            where = f" on {_s(comment.get('path'))}" if _s(comment.get("path")) else ""
            body = f"{login or 'someone'} commented on {kind} #{number}{where}:\n{text}"
            digest = ""
            url = _s(comment.get("html_url")) or _s(item.get("html_url"))
            message_id = f"comment:{_s(comment.get('id'))}" if _s(comment.get("id")) else delivery
        elif review:
            text = _s(review.get("body"))
            state = _s(review.get("state"))
            body = f"{login or 'someone'} reviewed {kind} #{number}" + (f" ({state})" if state else "") + (
                f":\n{text}" if text else ""
            )
            digest = "" if text else lead
            url = _s(review.get("html_url")) or _s(item.get("html_url"))
            message_id = f"review:{_s(review.get('id'))}" if _s(review.get("id")) else delivery
        else:
            text = _s(item.get("body")) if action in ("opened", "edited", "reopened") else ""
            body = lead + (f"\n\n{text}" if text else "")
            digest = "" if action in _GITHUB_SPOKEN_ACTIONS else lead
            url = _s(item.get("html_url"))
            message_id = delivery
        recipients = [Recipient(m, WHY_MENTION) for m in _GITHUB_MENTION.findall(text)]
        for person in _l(item.get("assignees")) + [item.get("assignee")]:
            recipients.append(Recipient(_s(_d(person).get("login")), WHY_ASSIGNEE))
        if action == "assigned":
            recipients.append(Recipient(_s(_d(payload.get("assignee")).get("login")), WHY_ASSIGNEE))
        for person in _l(pr.get("requested_reviewers")):
            recipients.append(Recipient(_s(_d(person).get("login")), WHY_REVIEWER))
        if action == "review_requested":
            recipients.append(Recipient(_s(_d(payload.get("requested_reviewer")).get("login")), WHY_REVIEWER))
        return Parsed(
            source=self.source,
            event_name=name,
            delivery_id=delivery,
            message_id=message_id,
            sender=login,
            sender_name=login,
            partition_key=key,
            conversation_identity=key,
            title=f"{repo}#{number}" + (f": {title}" if title else ""),
            url=url,
            body=body,
            digest_body=digest,
            recipients=_uniq_ci(recipients),
        )


def _uniq_ci(recipients: Iterable[Recipient]) -> tuple[Recipient, ...]:
    out: dict[str, Recipient] = {}
    for r in recipients:
        if r.identity and r.identity.lower() not in out:
            out[r.identity.lower()] = r
    return tuple(out.values())


# ---------------------------------------------------------------------------
# Atlassian (Jira, Confluence)

_ATLASSIAN_ACCOUNT_MENTION = re.compile(r"\[~accountid:([^\]\s]+)\]")
_ATLASSIAN_LEGACY_MENTION = re.compile(r"\[~(?!accountid:)([^\]\s]+)\]")
_CONFLUENCE_STORAGE_MENTION = re.compile(r'ri:(?:account-id|userkey)="([^"]+)"')


#: A cap on the nodes one ADF walk visits: the body limit already bounds a
#: document, this makes the walk's cost explicit (a real comment is hundreds).
ADF_MAX_NODES = 200_000
#: Nodes whose text ends a line.
_ADF_BLOCKS = frozenset({"paragraph", "heading", "listItem", "codeBlock"})


@dataclass(frozen=True)
class _Emit:
    """A piece of text an ADF walk writes after a node's children (a block's line end)."""

    text: str


def _adf_budget_exceeded() -> ParseError:
    return ParseError(f"the ADF document has more than {ADF_MAX_NODES} nodes")


def _adf_text(node: Any) -> str:
    """Plain text of an Atlassian Document Format node (a comment body in API v3).

    Iterative, with an explicit stack, so a document nested thousands of
    levels deep reads like a flat one instead of overflowing the call stack.
    """
    out: list[str] = []
    stack: list[Any] = [node]
    visited = 0
    while stack:
        item = stack.pop()
        if isinstance(item, _Emit):
            out.append(item.text)
            continue
        visited += 1
        if visited > ADF_MAX_NODES:
            raise _adf_budget_exceeded()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            kind = item.get("type")
            if kind == "text":
                text = item.get("text")
                out.append(text if isinstance(text, str) else "")
            elif kind == "mention":
                attrs = _d(item.get("attrs"))
                out.append(_s(attrs.get("text")) or f"[~accountid:{_s(attrs.get('id'))}]")
            elif kind == "hardBreak":
                out.append("\n")
            else:
                if kind in _ADF_BLOCKS:
                    stack.append(_Emit("\n"))
                stack.append(item.get("content"))
    return "".join(out)


def _adf_mentions(node: Any) -> list[str]:
    """The account ids an ADF document mentions, in document order (iterative, like :func:`_adf_text`)."""
    found: list[str] = []
    stack: list[Any] = [node]
    visited = 0
    while stack:
        item = stack.pop()
        visited += 1
        if visited > ADF_MAX_NODES:
            raise _adf_budget_exceeded()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            if item.get("type") == "mention":
                ident = _s(_d(item.get("attrs")).get("id"))
                if ident:
                    found.append(ident)
            else:
                stack.append(item.get("content"))
    return found


def _atlassian_mentions(body: Any) -> list[str]:
    if isinstance(body, (dict, list)):
        return _adf_mentions(body)
    text = body if isinstance(body, str) else ""
    found = _ATLASSIAN_ACCOUNT_MENTION.findall(text) + _ATLASSIAN_LEGACY_MENTION.findall(text)
    found += _CONFLUENCE_STORAGE_MENTION.findall(text)
    return found


def _person_id(person: Any) -> str:
    p = _d(person)
    return _s(p.get("accountId")) or _s(p.get("key")) or _s(p.get("name"))


def _person_name(person: Any) -> str:
    p = _d(person)
    return _s(p.get("displayName")) or _s(p.get("name")) or _s(p.get("accountId"))


class JiraParser(Parser):
    source = "jira"

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return _s(payload.get("webhookEvent")) or meta.event_name

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        name = self.event_name(payload, meta)
        delivery = self.delivery_id(payload, meta)
        issue = payload.get("issue")
        if issue is None:
            return Parsed(self.source, name, delivery, filtered=f"{FILTER_UNHANDLED} {name or '(unnamed)'}")
        if not isinstance(issue, dict):
            raise ParseError("issue is not an object")
        key = _need(issue.get("key"), "issue.key")
        fields = _d(issue.get("fields"))
        summary = _s(fields.get("summary"))
        comment = _d(payload.get("comment"))
        actor = payload.get("user") or comment.get("author") or comment.get("updateAuthor")
        sender = _person_id(actor)
        who = _person_name(actor) or "someone"
        partition = f"jira:{key}"
        changes = []
        recipients: list[Recipient] = []
        for item in _l(_d(payload.get("changelog")).get("items")):
            item = _d(item)
            field_name = _s(item.get("field"))
            changes.append(f"{field_name}: {_s(item.get('fromString')) or '(none)'} → {_s(item.get('toString')) or '(none)'}")
            if field_name == "assignee":
                to = _s(item.get("to")) or _s(item.get("tmpToAccountId"))
                if to:
                    recipients.append(Recipient(to, WHY_ASSIGNEE))
        assignee = _person_id(fields.get("assignee"))
        if assignee:
            recipients.append(Recipient(assignee, WHY_ASSIGNEE))
        quoted = f'{key} "{summary}"' if summary else key
        if comment:
            raw = comment.get("body")
            text = _adf_text(raw).strip() if isinstance(raw, (dict, list)) else _s(raw)
            verb = "edited a comment on" if name == "comment_updated" else "commented on"
            body = f"{who} {verb} {quoted}:\n{text}"
            digest = ""
            recipients = [Recipient(m, WHY_MENTION) for m in _atlassian_mentions(raw)] + recipients
            message_id = f"comment:{_s(comment.get('id'))}" if _s(comment.get("id")) else delivery
        else:
            description = fields.get("description")
            desc = _adf_text(description).strip() if isinstance(description, (dict, list)) else _s(description)
            verb = {"jira:issue_created": "created", "jira:issue_deleted": "deleted"}.get(name, "updated")
            lead = f"{who} {verb} {quoted}" + (f": {'; '.join(changes)}" if changes else "")
            body = lead + (f"\n\nDescription:\n{desc}" if desc else "")
            # Supersede rule: an update's full description is stale state the
            # latest body shows anyway, so an earlier one collapses to its lead.
            digest = lead if name != "jira:issue_created" else ""
            if name == "jira:issue_created":
                recipients = [Recipient(m, WHY_MENTION) for m in _atlassian_mentions(description)] + recipients
            message_id = delivery
        base = _s(issue.get("self")).split("/rest/")[0]
        return Parsed(
            source=self.source,
            event_name=name,
            delivery_id=delivery,
            message_id=message_id,
            sender=sender,
            sender_name=who,
            partition_key=partition,
            conversation_identity=partition,
            title=f"{key}: {summary}" if summary else key,
            url=f"{base}/browse/{key}" if base else "",
            body=body,
            digest_body=digest,
            recipients=_uniq(recipients),
        )


class ConfluenceParser(Parser):
    source = "confluence"

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        """Confluence does not name the event in the body; the registration does.

        Register the webhook as ``/webhooks/confluence?event=<name>`` to say it;
        without that it is inferred: a comment is ``comment_created``, a page
        with an ``updateTrigger`` is ``page_updated``, any other page
        ``page_created``.
        """
        named = meta.event_name or _s(meta.query.get("event", "")) or _s(payload.get("webhookEvent"))
        if named:
            return named
        if isinstance(payload.get("comment"), dict):
            return "comment_created"
        if isinstance(payload.get("page"), dict):
            return "page_updated" if payload.get("updateTrigger") else "page_created"
        if isinstance(payload.get("blog"), dict):
            return "blog_created"
        return ""

    @staticmethod
    def _content_id(content: Mapping[str, Any], what: str) -> str:
        return _s(content.get("idAsString")) or _need(content.get("id"), f"{what}.id")

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        name = self.event_name(payload, meta)
        delivery = self.delivery_id(payload, meta)
        comment = payload.get("comment")
        page = payload.get("page") if payload.get("page") is not None else payload.get("blog")
        actor = (
            _s(payload.get("userAccountId"))
            or _s(payload.get("userKey"))
            or _s(payload.get("user"))
            or _s(payload.get("username"))
        )
        who = _s(payload.get("username")) or _s(payload.get("user")) or actor or "someone"
        if isinstance(comment, dict):
            parent = comment.get("parent")
            if not isinstance(parent, dict):
                raise ParseError("comment.parent (the page the comment is on) is missing")
            page_id = self._content_id(parent, "comment.parent")
            page_title = _s(parent.get("title"))
            raw = _d(_d(comment.get("body")).get("storage")).get("value", comment.get("body"))
            text = _s(raw) if isinstance(raw, str) else ""
            body = f'{who} commented on page "{page_title or page_id}"' + (f":\n{text}" if text else "")
            digest = ""
            mentions = _atlassian_mentions(raw)
            url = _s(comment.get("self")) or _s(parent.get("self"))
            title = page_title
            actor = actor or _s(comment.get("creatorAccountId")) or _s(comment.get("creatorKey"))
            message_id = f"comment:{_s(comment.get('id'))}" if _s(comment.get("id")) else delivery
        elif isinstance(page, dict):
            page_id = self._content_id(page, "page")
            title = _s(page.get("title"))
            version = _s(page.get("version"))
            space = _s(page.get("spaceKey"))
            verb = {"page_created": "created", "blog_created": "created", "page_removed": "removed"}.get(name, "updated")
            lead = f'{who} {verb} page "{title or page_id}"' + (f" (version {version})" if version else "") + (
                f" in space {space}" if space else ""
            )
            raw = _d(_d(page.get("body")).get("storage")).get("value")
            text = _s(raw) if isinstance(raw, str) else ""
            body = lead + (f"\n\n{text}" if text else "")
            digest = "" if verb == "created" else lead
            mentions = _atlassian_mentions(raw)
            url = _s(page.get("self"))
            actor = actor or _s(page.get("lastModifierAccountId")) or _s(page.get("lastModifierKey"))
            message_id = f"{page_id}:v{version}" if version else delivery
        else:
            return Parsed(self.source, name, delivery, filtered=f"{FILTER_UNHANDLED} {name or '(unnamed)'}")
        key = f"confluence:{page_id}"
        return Parsed(
            source=self.source,
            event_name=name,
            delivery_id=delivery,
            message_id=message_id,
            sender=actor,
            sender_aliases=tuple(a for a in (_s(payload.get("username")), _s(payload.get("user"))) if a and a != actor),
            sender_name=who,
            partition_key=key,
            conversation_identity=key,
            title=title,
            url=url,
            body=body,
            digest_body=digest,
            recipients=_uniq(Recipient(m, WHY_MENTION) for m in mentions),
        )


# ---------------------------------------------------------------------------
# Mattermost (the websocket ``posted`` frame, POSTed as JSON)

_MM_MENTION = re.compile(r"(?<![\w@])@([a-z0-9][a-z0-9._-]*[a-z0-9_]|[a-z0-9])", re.IGNORECASE)
_MM_BROADCAST_MENTIONS = frozenset({"channel", "all", "here"})


class MattermostParser(Parser):
    source = "mattermost"
    chat = True
    surface = SURFACE_SOCKET

    def normalize(self, identity: str) -> str:
        return identity.lower()

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return _s(payload.get("event")) or meta.event_name or "posted"

    @staticmethod
    def post_of(payload: Mapping[str, Any]) -> dict[str, Any]:
        """``data.post``: a JSON string on the wire (an object in some decoded dumps)."""
        data = payload.get("data")
        if not isinstance(data, dict):
            raise ParseError("data is missing or not an object")
        post = data.get("post")
        if isinstance(post, str):
            try:
                post = load_json(post)
            except ValueError as exc:
                raise ParseError(f"data.post is not valid JSON: {exc}") from exc
        if not isinstance(post, dict):
            raise ParseError("data.post is missing or not an object")
        return post

    def embedded(self, payload: Mapping[str, Any]) -> list[tuple[str, Any]]:
        data = _d(payload.get("data"))
        out: list[tuple[str, Any]] = []
        for key in ("post", "mentions"):
            value = data.get(key)
            if isinstance(value, str):
                try:
                    out.append((f"data.{key}", load_json(value)))
                except ValueError:
                    continue
        return out

    def delivery_id(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        try:
            return _s(self.post_of(payload).get("id")) or meta.delivery_id
        except ParseError:
            return meta.delivery_id

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        name = self.event_name(payload, meta)
        if name != "posted":
            return Parsed(self.source, name, meta.delivery_id, chat=True, filtered=f"{FILTER_UNHANDLED} {name}")
        data = _d(payload.get("data"))
        post = self.post_of(payload)
        post_id = _need(post.get("id"), "data.post.id")
        channel = _s(post.get("channel_id")) or _need(_d(payload.get("broadcast")).get("channel_id"), "channel_id")
        root = _s(post.get("root_id"))
        channel_type = _s(data.get("channel_type"))
        dm = channel_type in ("D", "G")
        thread_reply = bool(root) and root != post_id
        identity = f"mattermost:{channel}" if dm else f"mattermost:{channel}:{root or post_id}"
        partition = f"mattermost:{channel}:{root or post_id}" if (not dm or thread_reply) else f"mattermost:{channel}"
        sender = _s(post.get("user_id"))
        sender_name = _s(data.get("sender_name")).lstrip("@")
        text = _s(post.get("message"))
        filtered = ""
        post_type = _s(post.get("type"))
        if post_type.startswith("system_"):
            filtered = f"{FILTER_SYSTEM_POST} ({post_type})"
        elif _int(post.get("delete_at")) > 0:
            filtered = FILTER_DELETED_POST
        mentioned_ids = data.get("mentions")
        if isinstance(mentioned_ids, str):
            try:
                mentioned_ids = load_json(mentioned_ids)
            except ValueError:
                mentioned_ids = []
        recipients: list[Recipient] = []
        why_listed = WHY_DM if dm else WHY_MENTION
        for uid in _l(mentioned_ids):
            if _s(uid) and _s(uid) != sender:
                recipients.append(Recipient(_s(uid), why_listed))
        for username in _MM_MENTION.findall(text):
            if username.lower() not in _MM_BROADCAST_MENTIONS:
                recipients.append(Recipient(username, WHY_MENTION))
        if channel_type == "D":
            for member in _s(data.get("channel_name")).split("__"):
                if member and member != sender:
                    recipients.append(Recipient(member, WHY_DM))
        where = "a direct message" if dm else (_s(data.get("channel_display_name")) or channel)
        return Parsed(
            source=self.source,
            event_name=name,
            delivery_id=post_id,
            message_id=post_id,
            sender=sender,
            sender_aliases=(sender_name,) if sender_name else (),
            sender_name=sender_name or sender,
            partition_key=partition,
            conversation_identity=identity,
            title=f"Mattermost message in {where}",
            body=text,
            digest_body="",
            recipients=_uniq(recipients),
            chat=True,
            dm=dm,
            thread_reply=thread_reply,
            filtered=filtered,
        )


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


PARSERS: dict[str, Parser] = {
    p.source: p for p in (SlackParser(), GitHubParser(), JiraParser(), ConfluenceParser(), MattermostParser())
}


def parser_for(source: str) -> Optional[Parser]:
    return PARSERS.get(source)


__all__ = [
    "ADF_MAX_NODES",
    "DIRECT_REASONS",
    "JSONTooDeep",
    "MAX_JSON_DEPTH",
    "ConfluenceParser",
    "DeliveryMeta",
    "GitHubParser",
    "JiraParser",
    "MattermostParser",
    "PARSERS",
    "ParseError",
    "Parsed",
    "Parser",
    "Recipient",
    "SlackParser",
    "WHY_ASSIGNEE",
    "WHY_DM",
    "WHY_FOLLOWER",
    "WHY_MENTION",
    "WHY_REVIEWER",
    "body_digest_id",
    "json_depth_exceeds",
    "load_json",
    "may_hold_unstorable",
    "parser_for",
    "storable_text",
    "unstorable",
]
