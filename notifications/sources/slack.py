"""Slack (Events API): ``v0`` request signing, the ``url_verification`` handshake, the message parser.

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
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from notifications.parsers import (
    FILTER_DELETED_POST, FILTER_EDIT, FILTER_HANDSHAKE, FILTER_SYSTEM_POST, FILTER_UNHANDLED, WHY_DM, WHY_MENTION,
    DeliveryMeta, Parsed, ParseError, Parser, Recipient, as_dict, as_list, as_text, chat_keys, need, unique,
)
from notifications.sources.base import Handshake, InboundRequest, Source, hmac_sha256_hex, query_meta, same

NAME = "slack"
SIGNATURE_HEADER = "x-slack-signature"
TIMESTAMP_HEADER = "x-slack-request-timestamp"
#: Slack's own retry markers, kept on the raw_webhook for an operator.
KEPT_HEADERS = ("x-slack-retry-num", "x-slack-retry-reason")
#: The outer ``type`` of the endpoint check Slack sends when the URL is registered.
URL_VERIFICATION = "url_verification"
SLACK_TOLERANCE_S = 300.0
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


def handshake(payload: Mapping[str, Any]) -> Optional[Handshake]:
    """``url_verification`` is answered with its challenge: Slack's check that the URL is ours."""
    if payload.get("type") != URL_VERIFICATION:
        return None
    challenge = payload.get("challenge")
    if not isinstance(challenge, str):
        return Handshake(refusal="url_verification without a challenge string")
    return Handshake(answer={"challenge": challenge})


_SLACK_MENTION = re.compile(r"<@([UWB][A-Z0-9]+)(?:\|[^>]*)?>")
#: Message subtypes that are somebody saying something; every other subtype
#: (joins, topic changes, pins, ...) is a system post.
_SLACK_SPOKEN_SUBTYPES = frozenset({"", "thread_broadcast", "bot_message", "file_share", "me_message"})


class SlackParser(Parser):
    source = NAME
    chat = True

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        event = as_dict(payload.get("event"))
        return as_text(event.get("type")) or as_text(payload.get("type")) or meta.event_name

    def delivery_id(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return as_text(payload.get("event_id")) or meta.delivery_id

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
            display = ""
            mentions = []
            filtered = FILTER_DELETED_POST
        else:
            ts = as_text(event.get("ts"))
            root = as_text(event.get("thread_ts")) or ts
            text = as_text(event.get("text"))
            user = as_text(event.get("user"))
            bot = as_text(event.get("bot_id"))
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
        partition, identity = chat_keys(NAME, channel, root, dm=dm, thread_reply=thread_reply)
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
            recipients=unique(recipients),
            chat=True,
            dm=dm,
            thread_reply=thread_reply,
            filtered=filtered,
        )

    @staticmethod
    def authorized_users(payload: Mapping[str, Any]) -> list[str]:
        """The installation's user the event is delivered for (``authorizations``; legacy ``authed_users``)."""
        users = [as_text(as_dict(a).get("user_id")) for a in as_list(payload.get("authorizations"))]
        users += [as_text(u) for u in as_list(payload.get("authed_users"))]
        return [u for u in dict.fromkeys(users) if u]


SOURCE = Source(
    parser=SlackParser(),
    verify=verify,
    meta=meta,
    headers=KEPT_HEADERS,
    handshake=handshake,
)

__all__ = ["NAME", "SLACK_TOLERANCE_S", "SOURCE", "SlackParser", "handshake", "meta", "verify"]
