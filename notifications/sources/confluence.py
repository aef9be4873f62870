"""Confluence: Atlassian's verification and labels (:mod:`notifications.sources.atlassian`), the page and comment parser.

Keys: ``confluence:<page id>`` (a comment: its parent page) for both the
partition and the conversation. Confluence does not name the event in the
body: register the URL as ``/webhooks/confluence?event=<name>``, or the name
is inferred from the payload's shape.
"""
from __future__ import annotations

from typing import Any, Mapping

from crewlet.events.backend_ids import comment_message_id
from notifications.parsers import (
    FILTER_UNHANDLED, WHY_MENTION,
    DeliveryMeta, Parsed, ParseError, Parser, Recipient, as_dict, as_text, need, unique,
)
from notifications.sources import atlassian
from notifications.sources.atlassian import EVENT_QUERY, KEPT_HEADERS, meta, verify
from notifications.sources.base import Source

NAME = "confluence"


class ConfluenceParser(Parser):
    source = NAME

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        """Confluence does not name the event in the body; the registration does.

        Register the webhook as ``/webhooks/confluence?event=<name>`` to say it;
        without that it is inferred: a comment is ``comment_created``, a page
        with an ``updateTrigger`` is ``page_updated``, any other page
        ``page_created``.
        """
        named = meta.event_name or as_text(meta.query.get(EVENT_QUERY, "")) or as_text(payload.get("webhookEvent"))
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
        return as_text(content.get("idAsString")) or need(content.get("id"), f"{what}.id")

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        name = self.event_name(payload, meta)
        delivery = self.delivery_id(payload, meta)
        comment = payload.get("comment")
        page = payload.get("page") if payload.get("page") is not None else payload.get("blog")
        actor = (
            as_text(payload.get("userAccountId"))
            or as_text(payload.get("userKey"))
            or as_text(payload.get("user"))
            or as_text(payload.get("username"))
        )
        who = as_text(payload.get("username")) or as_text(payload.get("user")) or actor or "someone"
        if isinstance(comment, dict):
            parent = comment.get("parent")
            if not isinstance(parent, dict):
                raise ParseError("comment.parent (the page the comment is on) is missing")
            page_id = self._content_id(parent, "comment.parent")
            page_title = as_text(parent.get("title"))
            raw = as_dict(as_dict(comment.get("body")).get("storage")).get("value", comment.get("body"))
            text = as_text(raw) if isinstance(raw, str) else ""
            body = f'{who} commented on page "{page_title or page_id}"' + (f":\n{text}" if text else "")
            digest = ""
            mentions = atlassian.mentions(raw)
            url = as_text(comment.get("self")) or as_text(parent.get("self"))
            title = page_title
            actor = actor or as_text(comment.get("creatorAccountId")) or as_text(comment.get("creatorKey"))
            message_id = comment_message_id(as_text(comment.get("id"))) if as_text(comment.get("id")) else delivery
        elif isinstance(page, dict):
            page_id = self._content_id(page, "page")
            title = as_text(page.get("title"))
            version = as_text(page.get("version"))
            space = as_text(page.get("spaceKey"))
            verb = {"page_created": "created", "blog_created": "created", "page_removed": "removed"}.get(name, "updated")
            lead = f'{who} {verb} page "{title or page_id}"' + (f" (version {version})" if version else "") + (
                f" in space {space}" if space else ""
            )
            raw = as_dict(as_dict(page.get("body")).get("storage")).get("value")
            text = as_text(raw) if isinstance(raw, str) else ""
            body = lead + (f"\n\n{text}" if text else "")
            digest = "" if verb == "created" else lead
            mentions = atlassian.mentions(raw)
            url = as_text(page.get("self"))
            actor = actor or as_text(page.get("lastModifierAccountId")) or as_text(page.get("lastModifierKey"))
            message_id = f"{page_id}:v{version}" if version else delivery
        else:
            return Parsed(self.source, name, delivery, filtered=f"{FILTER_UNHANDLED} {name or '(unnamed)'}")
        aliases = tuple(a for a in (as_text(payload.get("username")), as_text(payload.get("user"))) if a and a != actor)
        return Parsed.item(
            self.source, name, delivery, message_id, key=f"{NAME}:{page_id}", sender=actor, sender_aliases=aliases,
            sender_name=who, title=title, url=url, body=body, digest_body=digest,
            recipients=unique(Recipient(m, WHY_MENTION) for m in mentions),
        )


SOURCE = Source(parser=ConfluenceParser(), verify=verify, meta=meta, headers=KEPT_HEADERS)

__all__ = ["NAME", "SOURCE", "ConfluenceParser", "meta", "verify"]
