"""Mattermost: the token scheme, the websocket ``posted`` frame (POSTed as JSON) and its parser.

Verification: ``Authorization: Token <t>`` (or ``Bearer``), or a ``token``
field in the JSON body (what outgoing webhooks send; the only verification
that reads the body, with the depth-limited decoder). The body names the
event and the post is the delivery, so the headers add nothing.

Keys: the Slack rule with ``post.root_id or post.id`` as the root (a DM is a
``D`` or ``G`` channel type); ``data.post`` is a JSON string on the wire,
decoded here. Usernames compare without case.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from crewlet.events.labels import SOCKET_EVENT_POSTED, SURFACE_SOCKET
from notifications.parsers import (
    FILTER_DELETED_POST, FILTER_SYSTEM_POST, FILTER_UNHANDLED, WHY_DM, WHY_MENTION,
    DeliveryMeta, Parsed, ParseError, Parser, Recipient, as_dict, as_list, as_text, load_json, need,
)
from notifications.sources.base import InboundRequest, Source, query_meta, same

NAME = "mattermost"
AUTHORIZATION_HEADER = "authorization"
#: The body field an outgoing webhook carries its token in.
TOKEN_FIELD = "token"
_TOKEN_SCHEMES = ("token", "bearer")


def verify(secret: str, req: InboundRequest, now: float) -> Optional[str]:
    """None when the ``Authorization`` header, or without one the body's token field, carries the secret."""
    auth = req.header(AUTHORIZATION_HEADER)
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() not in _TOKEN_SCHEMES or not token.strip():
            return "Authorization must be 'Token <token>'"
        return None if same(token.strip(), secret) else "the Mattermost token does not match"
    try:
        body = load_json(req.body)
    except ValueError:
        return "missing 'Authorization: Token <token>' header, and the body is not JSON a token field can be read from"
    field = body.get(TOKEN_FIELD) if isinstance(body, dict) else None
    if not isinstance(field, str) or not field:
        return "missing 'Authorization: Token <token>' header or a token field"
    return None if same(field, secret) else "the Mattermost token does not match"


meta = query_meta


_MM_MENTION = re.compile(r"(?<![\w@])@([a-z0-9][a-z0-9._-]*[a-z0-9_]|[a-z0-9])", re.IGNORECASE)
_MM_BROADCAST_MENTIONS = frozenset({"channel", "all", "here"})


class MattermostParser(Parser):
    source = NAME
    chat = True
    surface = SURFACE_SOCKET

    def normalize(self, identity: str) -> str:
        return identity.lower()

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return as_text(payload.get("event")) or meta.event_name or SOCKET_EVENT_POSTED

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
        data = as_dict(payload.get("data"))
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
            return as_text(self.post_of(payload).get("id")) or meta.delivery_id
        except ParseError:
            return meta.delivery_id

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        name = self.event_name(payload, meta)
        if name != SOCKET_EVENT_POSTED:
            return Parsed(self.source, name, meta.delivery_id, chat=True, filtered=f"{FILTER_UNHANDLED} {name}")
        data = as_dict(payload.get("data"))
        post = self.post_of(payload)
        post_id = need(post.get("id"), "data.post.id")
        channel = as_text(post.get("channel_id")) or need(as_dict(payload.get("broadcast")).get("channel_id"), "channel_id")
        root = as_text(post.get("root_id"))
        channel_type = as_text(data.get("channel_type"))
        dm = channel_type in ("D", "G")
        thread_reply = bool(root) and root != post_id
        sender = as_text(post.get("user_id"))
        sender_name = as_text(data.get("sender_name")).lstrip("@")
        text = as_text(post.get("message"))
        filtered = ""
        post_type = as_text(post.get("type"))
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
        for uid in as_list(mentioned_ids):
            if as_text(uid) and as_text(uid) != sender:
                recipients.append(Recipient(as_text(uid), why_listed))
        for username in _MM_MENTION.findall(text):
            if username.lower() not in _MM_BROADCAST_MENTIONS:
                recipients.append(Recipient(username, WHY_MENTION))
        if channel_type == "D":
            for member in as_text(data.get("channel_name")).split("__"):
                if member and member != sender:
                    recipients.append(Recipient(member, WHY_DM))
        return Parsed.chat_message(
            self.source, name, post_id, post_id, channel=channel, root=root or post_id, dm=dm, thread_reply=thread_reply,
            kind="Mattermost message", place=as_text(data.get("channel_display_name")) or channel, sender=sender,
            sender_aliases=(sender_name,) if sender_name else (), sender_name=sender_name, body=text,
            recipients=recipients, filtered=filtered,
        )


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


SOURCE = Source(parser=MattermostParser(), verify=verify, meta=meta, filtered_event="mattermost_post_skipped")

__all__ = ["NAME", "SOURCE", "MattermostParser", "meta", "verify"]
