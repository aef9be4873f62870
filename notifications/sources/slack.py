"""Slack (Events API, slash commands, interactivity): ``v0`` request signing, the ``url_verification`` handshake, the parser.

Verification: ``X-Slack-Signature`` is
``v0=HMAC-SHA256(secret, "v0:<X-Slack-Request-Timestamp>:<body>")``, and the
timestamp (whole Unix seconds, nothing else) must be within
:data:`SLACK_TOLERANCE_S` of now. The body names the event and the delivery
(``event.type``, ``event_id``), so the headers add nothing but the retry
markers kept on the ``raw_webhook``.

Keys: ``slack:<channel>:<thread root>``; a DM (``im``/``mpim``, or a ``D…``
channel when ``channel_type`` is missing) top-level message:
``slack:<channel>``; a DM thread reply keeps ``slack:<channel>:<root>``. The
conversation of a DM is ``slack:<channel>``, elsewhere the partition key.

Slash commands and interactivity come to the same ``/webhooks/slack``,
form-encoded and signed the same way. They are answered ``200`` at once
(Slack shows the person an error after 3 s): a slash command with an
ephemeral line saying which seat it went to, an interaction with an empty
body. Their retry key is the ``trigger_id`` (a new one per invocation).

* A slash command is addressed to the seat its text opens with — a Slack
  mention (``/ask <@U0ADA> …``, when the command escapes users) or a handle
  (``/ask @ada …``) — else to the seat the command is named after
  (``/ada …``). The rest of the text is the ask. A DM's command joins the
  DM's conversation (``slack:<channel>``); a channel's is a conversation of
  its own (no keys: never coalesced, nobody follows it).
* ``block_actions`` (a button, a menu) and ``message_action`` (a message
  shortcut) on a message are addressed to that message's author — the seat
  whose message carries the component — and belong to its thread. Any other
  interaction (a modal's submission, a global shortcut) concerns no seat:
  filtered as an unhandled event.

One app per seat (``seats[].slack``). Every delivery names the app it is
for in ``api_app_id`` — at the top of an event's JSON, a field of a slash
command's form, at the top of an interaction's ``payload=`` JSON — and
:func:`credentials` verifies it with THAT app's signing secret: the body is
read for it (with the depth-limited decoder) before the signature is
checked, and nothing else of it is. A delivery naming none of the seats'
apps is the company-level app's (``surfaces.slack``), refused when there is
none; one naming no app at all (``url_verification``, sent when a Request
URL is set) passes with any of the company's secrets. The app is the seat
for routing too: a DM's recipient is the receiving app's bot user, a
mention of the receiving app's bot user is that app, a post by a bot names
its app (``app_id``, ``bot_profile.app_id``), an interaction is for the
app whose message carries it, and a slash command naming no seat is for
the app it was registered on — each matched to the seat whose
``seats[].slack.app_id`` it is (:func:`notifications.sources.base.seat_for`).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

from crewlet.events.backend_ids import slack_message_id
from crewlet.company.org import Organization
from notifications.parsers import (
    FILTER_DELETED_POST, FILTER_EDIT, FILTER_HANDSHAKE, FILTER_SYSTEM_POST, FILTER_UNHANDLED, FORM_PAYLOAD_FIELD,
    WHY_ADDRESSED, WHY_DM, WHY_MENTION, DeliveryMeta, MalformedForm, Parsed, ParseError, Parser, Recipient, as_dict,
    as_list, as_text, decode_body, form_json, need,
)
from notifications.sources.base import (
    Acknowledgement, Credential, Handshake, InboundRequest, Source, hmac_sha256_hex, query_meta, same, seat_of_recipient,
)

NAME = "slack"
SIGNATURE_HEADER = "x-slack-signature"
TIMESTAMP_HEADER = "x-slack-request-timestamp"
#: Slack's own retry markers, kept on the raw_webhook for an operator.
KEPT_HEADERS = ("x-slack-retry-num", "x-slack-retry-reason")
#: The outer ``type`` of the endpoint check Slack sends when the URL is registered.
URL_VERIFICATION = "url_verification"
SLACK_TOLERANCE_S = 300.0
#: Where every delivery (event, slash command, interaction) names the app it is for.
APP_ID_FIELD = "api_app_id"
#: The event name of a slash command (its form names the command, not an event).
SLASH_COMMAND = "slash_command"
#: The form fields a slash command cannot be routed without.
SLASH_REQUIRED = ("command", "trigger_id", "user_id")
#: The interaction types (``payload=``'s ``type``); each is acknowledged with an empty 200.
INTERACTION_TYPES = frozenset(
    {
        "block_actions", "block_suggestion", "message_action", "shortcut", "view_submission", "view_closed",
        "interactive_message", "dialog_submission", "dialog_cancellation", "dialog_suggestion", "workflow_step_edit",
    }
)
#: The interactions that address a seat: a component or a shortcut on the seat's own message.
_ROUTED_INTERACTIONS = frozenset({"block_actions", "message_action"})
#: Slack's timestamp is Unix seconds as decimal digits; anything else (``NaN``,
#: ``inf``, ``1e400``, a fraction) is refused, since a float NaN or infinity
#: compares as "within the window" or defeats it.
_SLACK_STAMP = re.compile(r"[0-9]{1,12}")


def verify(secret: str, req: InboundRequest, now: float) -> Optional[str]:
    """None when the ``v0`` signature matches and its timestamp is fresh, else why not."""
    signature = req.header(SIGNATURE_HEADER)
    stamp = req.header(TIMESTAMP_HEADER)
    if not signature or not stamp:
        return "missing X-Slack-Signature or X-Slack-Request-Timestamp"
    if not _SLACK_STAMP.fullmatch(stamp):
        return "X-Slack-Request-Timestamp is not a whole number of seconds"
    sent = int(stamp)
    if abs(now - sent) > SLACK_TOLERANCE_S:
        return f"stale request: X-Slack-Request-Timestamp is more than {SLACK_TOLERANCE_S:g}s from now"
    expected = "v0=" + hmac_sha256_hex(secret, b"v0:" + stamp.encode("ascii", "replace") + b":" + req.body)
    if not same(signature, expected):
        return "X-Slack-Signature does not match the body"
    return None


meta = query_meta


def app_named(req: InboundRequest) -> str:
    """The ``api_app_id`` a delivery names, read with the depth-limited decoder; "" when it names none or cannot be read."""
    try:
        payload = decode_body(req.body, req.content_type, form)
    except ValueError:
        return ""
    return as_text(payload.get(APP_ID_FIELD)) if isinstance(payload, dict) else ""


def credentials(req: InboundRequest, org: Organization) -> tuple[Credential, ...] | str | None:
    """The signing secret(s) a delivery is verified with when seats have apps of their own; None: ``surfaces.slack``'s alone.

    The app the delivery names, when it is a seat's; the company-level
    app's, when it names another; every app's when it names none. A
    delivery naming an app that is nobody's, in a company with no
    company-level app, is refused with the reason.
    """
    seats = [seat for seat in org.seats if seat.slack is not None]
    if not seats:
        return None
    app_id = app_named(req)
    owner = org.seat_by_slack_app(app_id)
    if owner is not None and owner.slack is not None:
        return (_credential(owner.handle, owner.slack.app_id, owner.slack.signing_secret_env),)
    company = org.surfaces.get(NAME)
    company_app = (
        (Credential(company.secret_env, "the company-level Slack app", f"surfaces.{NAME}.signing_secret_env"),)
        if company is not None and company.secret_env else ()
    )
    if app_id and company_app:
        return company_app
    if app_id:
        apps = ", ".join(s.slack.app_id for s in seats if s.slack is not None)
        return (
            f"the Slack app {_quoted_app(app_id)} is none of this company's (seats[].slack.app_id: {apps}) "
            f"and no company-level app is configured (surfaces.{NAME}.signing_secret_env)"
        )
    return company_app + tuple(_credential(s.handle, s.slack.app_id, s.slack.signing_secret_env) for s in seats if s.slack is not None)


def _credential(handle: str, app_id: str, env: str) -> Credential:
    return Credential(env, f"the Slack app {app_id} of seat {handle}", f"seats.{handle}.slack.signing_secret_env")


def _quoted_app(app_id: str) -> str:
    """A sender's ``api_app_id`` as a refusal quotes it: bounded, printable (a log line and a JSON answer carry it)."""
    return repr(app_id[:40]) if not app_id.isalnum() or len(app_id) > 40 else app_id


def handshake(payload: Mapping[str, Any]) -> Optional[Handshake]:
    """``url_verification`` is answered with its challenge: Slack's check that the URL is ours."""
    if payload.get("type") != URL_VERIFICATION:
        return None
    challenge = payload.get("challenge")
    if not isinstance(challenge, str):
        return Handshake(refusal="url_verification without a challenge string")
    return Handshake(answer={"challenge": challenge})


def is_slash_command(payload: Mapping[str, Any]) -> bool:
    """A slash command's fields (form-decoded): a ``command`` and no ``type``."""
    return "command" in payload and "type" not in payload


def form(fields: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """A form delivery: an interaction's ``payload=`` JSON, or a slash command's fields as one object."""
    names = {name for name, _ in fields}
    if FORM_PAYLOAD_FIELD in names:
        return form_json(fields)
    if "command" not in names:
        raise MalformedForm("a Slack form is a slash command (command=...) or an interaction (payload=...), and this is neither")
    command: dict[str, Any] = {}
    for name, value in fields:
        if name in command:
            raise MalformedForm(f"the field {name}= is repeated")
        command[name] = value
    return command


def validate(payload: Mapping[str, Any], meta: DeliveryMeta) -> Optional[str]:
    """A slash command missing what routing needs is refused at once, naming the field."""
    if not is_slash_command(payload):
        return None
    missing = [name for name in SLASH_REQUIRED if not as_text(payload.get(name))]
    return f"the slash command has no {', '.join(missing)}" if missing else None


def acknowledge(payload: Mapping[str, Any], org: Organization) -> Optional[Acknowledgement]:
    """A slash command: an ephemeral line naming the seat it went to (or why none); an interaction: an empty 200.

    An Events API delivery returns None and is answered ``202`` like every
    other source's. The line reads the same parse and the same seat lookup
    routing does, on the company current now; routing records the skip.
    """
    if not is_slash_command(payload):
        return Acknowledgement() if as_text(payload.get("type")) in INTERACTION_TYPES else None
    command = as_text(payload.get("command"))
    try:
        recipient = PARSER(payload).recipients[0]
    except (ParseError, IndexError):
        return Acknowledgement({"response_type": "ephemeral", "text": f"{command} was received."})
    seat = seat_of_recipient(org, PARSER, recipient)
    if seat is None:
        text = f"No seat is {recipient.identity}: name one first, as in `{command} @<seat> <what you need>`."
    elif not seat.is_agent:
        text = f"{seat.handle} is a person, not an agent seat: nothing was sent."
    else:
        text = f"Sent to {seat.handle}."
    return Acknowledgement({"response_type": "ephemeral", "text": text})


_SLACK_MENTION = re.compile(r"<@([UWB][A-Z0-9]+)(?:\|[^>]*)?>")
#: A slash command's text opening with a Slack mention, or with ``@<seat handle>``.
_LEADING_MENTION = re.compile(r"\s*<@([UWB][A-Z0-9]+)(?:\|[^>]*)?>")
_LEADING_HANDLE = re.compile(r"\s*@([A-Za-z0-9][A-Za-z0-9_-]{0,62})(?![\w-])")


def addressee(command: str, text: str, app: str = "") -> tuple[Recipient, str]:
    """The seat a slash command addresses, and the ask that follows (see the module's docstring).

    Named by neither its text nor its name, it is for the seat whose app
    ``app`` (the command's ``api_app_id``) is.
    """
    mention = _LEADING_MENTION.match(text)
    if mention:
        return Recipient(mention.group(1), WHY_MENTION), text[mention.end():].strip()
    handle = _LEADING_HANDLE.match(text)
    if handle:
        return Recipient(handle.group(1).lower(), WHY_ADDRESSED, by_handle=True), text[handle.end():].strip()
    return Recipient(command.lstrip("/").lower(), WHY_ADDRESSED, aliases=_ids(app), by_handle=True), text.strip()


def _ids(*ids: str) -> tuple[str, ...]:
    """The non-empty ids among ``ids``, each once."""
    return tuple(dict.fromkeys(i for i in ids if i))


def _poster_apps(message: Mapping[str, Any]) -> tuple[str, ...]:
    """The app a bot's post was made by (``app_id``, ``bot_profile.app_id``): the seat's own app for its own bot."""
    return _ids(as_text(message.get("app_id")), as_text(as_dict(message.get("bot_profile")).get("app_id")))

#: Message subtypes that are somebody saying something; every other subtype
#: (joins, topic changes, pins, ...) is a system post.
_SLACK_SPOKEN_SUBTYPES = frozenset({"", "thread_broadcast", "bot_message", "file_share", "me_message"})


class SlackParser(Parser):
    source = NAME
    chat = True

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        if is_slash_command(payload):
            return SLASH_COMMAND
        event = as_dict(payload.get("event"))
        return as_text(event.get("type")) or as_text(payload.get("type")) or meta.event_name

    def delivery_id(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        """``event_id`` for an event; ``trigger_id`` (one per invocation) for a slash command or an interaction."""
        return as_text(payload.get("event_id")) or as_text(payload.get("trigger_id")) or meta.delivery_id

    @staticmethod
    def is_dm(event: Mapping[str, Any]) -> bool:
        """``im``/``mpim``; with no ``channel_type`` at all, a ``D…`` channel. A ``G…`` id alone says nothing."""
        channel_type = as_text(event.get("channel_type"))
        if channel_type:
            return channel_type in ("im", "mpim")
        return as_text(event.get("channel")).startswith("D")

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        outer = as_text(payload.get("type"))
        name = self.event_name(payload, meta)
        delivery = self.delivery_id(payload, meta)
        if is_slash_command(payload):
            return self._slash_command(payload, delivery)
        if outer in _ROUTED_INTERACTIONS:
            return self._interaction(payload, outer, delivery)
        if outer == URL_VERIFICATION:
            return Parsed(self.source, name, delivery, chat=True, filtered=FILTER_HANDSHAKE)
        if outer and outer != "event_callback":
            return Parsed(self.source, name, delivery, chat=True, filtered=f"{FILTER_UNHANDLED} {outer}")
        event = payload.get("event")
        if not isinstance(event, dict):
            raise ParseError("event_callback carries no event object")
        etype = as_text(event.get("type"))
        if etype not in ("message", "app_mention"):
            return Parsed(self.source, name, delivery, chat=True, filtered=f"{FILTER_UNHANDLED} {etype or '(none)'}")
        channel = need(event.get("channel"), "event.channel")
        subtype = as_text(event.get("subtype"))
        previous = as_dict(event.get("previous_message"))
        filtered = ""
        if subtype == "message_changed":
            message = as_dict(event.get("message"))
            ts = as_text(message.get("ts")) or as_text(previous.get("ts"))
            root = as_text(message.get("thread_ts")) or ts
            text = as_text(message.get("text"))
            user = as_text(message.get("user")) or as_text(previous.get("user"))
            bot = as_text(message.get("bot_id"))
            apps = _poster_apps(message) or _poster_apps(previous)
            display = as_text(message.get("username"))
            before = set(_SLACK_MENTION.findall(as_text(previous.get("text"))))
            mentions = [m for m in _SLACK_MENTION.findall(text) if m not in before]
            if not mentions:
                filtered = FILTER_EDIT
        elif subtype == "message_deleted":
            ts = as_text(event.get("deleted_ts")) or as_text(previous.get("ts"))
            root = as_text(previous.get("thread_ts")) or ts
            text = as_text(previous.get("text"))
            user = as_text(previous.get("user"))
            bot = as_text(previous.get("bot_id"))
            apps = _poster_apps(previous)
            display = ""
            mentions = []
            filtered = FILTER_DELETED_POST
        else:
            ts = as_text(event.get("ts"))
            root = as_text(event.get("thread_ts")) or ts
            text = as_text(event.get("text"))
            user = as_text(event.get("user"))
            bot = as_text(event.get("bot_id"))
            apps = _poster_apps(event)
            profile = as_dict(event.get("user_profile"))
            display = (
                as_text(profile.get("display_name"))
                or as_text(profile.get("real_name"))
                or as_text(event.get("username"))
                or as_text(as_dict(event.get("bot_profile")).get("name"))
            )
            mentions = _SLACK_MENTION.findall(text)
            if subtype not in _SLACK_SPOKEN_SUBTYPES:
                filtered = f"{FILTER_SYSTEM_POST} ({subtype})"
        if not ts:
            raise ParseError("the message has no ts")
        dm = self.is_dm(event)
        thread_reply = bool(root) and root != ts
        sender = user or bot
        # The receiving app's bot user is that app: a mention of it, or the DM it is in, is for the app's seat.
        app = as_text(payload.get(APP_ID_FIELD))
        authorized = self.authorized_users(payload)
        recipients = [Recipient(m, WHY_MENTION, aliases=_ids(app) if m in authorized else ()) for m in mentions]
        if dm and not filtered:
            for auth in authorized:
                if auth != sender:
                    recipients.append(Recipient(auth, WHY_DM, aliases=_ids(app)))
        return Parsed.chat_message(
            self.source, name, delivery, slack_message_id(channel, ts), channel=channel, root=root, dm=dm, thread_reply=thread_reply,
            kind="Slack message", place=f"<#{channel}>", sender=sender,
            sender_aliases=tuple(a for a in _ids(bot, *apps) if a != sender), sender_name=display, body=text,
            recipients=recipients, filtered=filtered,
        )

    def _slash_command(self, payload: Mapping[str, Any], delivery: str) -> Parsed:
        command = need(payload.get("command"), "command")
        trigger = need(payload.get("trigger_id"), "trigger_id")
        user = need(payload.get("user_id"), "user_id")
        channel = as_text(payload.get("channel_id"))
        recipient, ask = addressee(command, as_text(payload.get("text")), as_text(payload.get(APP_ID_FIELD)))
        dm = channel.startswith("D") or as_text(payload.get("channel_name")) == "directmessage"
        # A DM's command joins the DM's conversation; a channel's stands alone.
        key = f"{NAME}:{channel}" if dm and channel else ""
        where = "a direct message" if dm else (f"<#{channel}>" if channel else "Slack")
        sender_name = as_text(payload.get("user_name")) or user
        return Parsed(
            self.source, SLASH_COMMAND, delivery, f"command:{trigger}", sender=user, sender_name=sender_name,
            partition_key=key, conversation_identity=key, title=f"Slack {command} in {where}", body=ask,
            recipients=(recipient,), chat=True, dm=dm,
        )

    def _interaction(self, payload: Mapping[str, Any], kind: str, delivery: str) -> Parsed:
        """A click or a message shortcut on a message: addressed to that message's author, in its thread."""
        message = as_dict(payload.get("message"))
        if not message:
            return Parsed(self.source, kind, delivery, chat=True, filtered=f"{FILTER_UNHANDLED} {kind} outside a message")
        container = as_dict(payload.get("container"))
        user = as_dict(payload.get("user"))
        sender = need(user.get("id"), "user.id")
        channel = as_text(as_dict(payload.get("channel")).get("id")) or need(container.get("channel_id"), "channel.id")
        ts = as_text(message.get("ts")) or need(container.get("message_ts"), "message.ts")
        root = as_text(message.get("thread_ts")) or ts
        dm = channel.startswith("D")
        who = as_text(user.get("name")) or as_text(user.get("username")) or sender
        if kind == "block_actions":
            labels = [_action_label(as_dict(a)) for a in as_list(payload.get("actions"))]
            did = f"chose {', '.join(label for label in labels if label) or 'an action'}"
        else:
            did = f"used the shortcut {as_text(payload.get('callback_id')) or '(unnamed)'}"
        quoted = as_text(message.get("text"))
        author, bot = as_text(message.get("user")), as_text(message.get("bot_id"))
        aliases = tuple(a for a in _ids(bot, *_poster_apps(message)) if a != (author or bot))
        recipients = [Recipient(author or bot, WHY_ADDRESSED, aliases=aliases)]
        body = f"{who} {did} on your message" + (f":\n> {quoted}" if quoted else "")
        return Parsed.chat_message(
            self.source, kind, delivery, f"action:{delivery}", channel=channel, root=root, dm=dm, thread_reply=root != ts,
            kind=f"Slack {kind}", place=f"<#{channel}>", sender=sender, sender_name=who, body=body, recipients=recipients,
        )

    @staticmethod
    def authorized_users(payload: Mapping[str, Any]) -> list[str]:
        """The installation's user the event is delivered for (``authorizations``; legacy ``authed_users``)."""
        users = [as_text(as_dict(a).get("user_id")) for a in as_list(payload.get("authorizations"))]
        users += [as_text(u) for u in as_list(payload.get("authed_users"))]
        return [u for u in dict.fromkeys(users) if u]


def _action_label(action: Mapping[str, Any]) -> str:
    """What a person picked: the button's text and value, or the menu option; else the action's id."""
    text = as_text(as_dict(action.get("text")).get("text"))
    option = as_dict(action.get("selected_option"))
    picked = as_text(as_dict(option.get("text")).get("text")) or as_text(option.get("value"))
    value = as_text(action.get("value"))
    label = text or picked or as_text(action.get("action_id"))
    return f"{label} ({value})" if value and value != label else label


PARSER = SlackParser()

SOURCE = Source(
    parser=PARSER,
    verify=verify,
    credentials=credentials,
    meta=meta,
    headers=KEPT_HEADERS,
    handshake=handshake,
    form=form,
    acknowledge=acknowledge,
    validate=validate,
)

__all__ = [
    "APP_ID_FIELD",
    "INTERACTION_TYPES",
    "NAME",
    "PARSER",
    "SLACK_TOLERANCE_S",
    "SLASH_COMMAND",
    "SOURCE",
    "SlackParser",
    "acknowledge",
    "addressee",
    "app_named",
    "credentials",
    "form",
    "handshake",
    "is_slash_command",
    "meta",
    "validate",
    "verify",
]
