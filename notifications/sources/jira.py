"""Jira: Atlassian's verification and labels (:mod:`notifications.sources.atlassian`), the issue parser.

Keys: ``jira:<issue key>`` for both the partition and the conversation.
Recipients: the accounts a comment (or a created issue's description)
mentions, and the assignee.
"""
from __future__ import annotations

from typing import Any, Mapping

from crewlet.events.backend_ids import comment_message_id
from notifications.parsers import (
    FILTER_UNHANDLED, WHY_ASSIGNEE, WHY_MENTION,
    DeliveryMeta, Parsed, ParseError, Parser, Recipient, as_dict, as_list, as_text, need, unique,
)
from notifications.sources import atlassian
from notifications.sources.atlassian import KEPT_HEADERS, meta, verify
from notifications.sources.base import Source

NAME = "jira"
ISSUE_CREATED = "jira:issue_created"
ISSUE_DELETED = "jira:issue_deleted"


def _person_id(person: Any) -> str:
    p = as_dict(person)
    return as_text(p.get("accountId")) or as_text(p.get("key")) or as_text(p.get("name"))


def _person_name(person: Any) -> str:
    p = as_dict(person)
    return as_text(p.get("displayName")) or as_text(p.get("name")) or as_text(p.get("accountId"))


class JiraParser(Parser):
    source = NAME

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return as_text(payload.get("webhookEvent")) or meta.event_name

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        name = self.event_name(payload, meta)
        delivery = self.delivery_id(payload, meta)
        issue = payload.get("issue")
        if issue is None:
            return Parsed(self.source, name, delivery, filtered=f"{FILTER_UNHANDLED} {name or '(unnamed)'}")
        if not isinstance(issue, dict):
            raise ParseError("issue is not an object")
        key = need(issue.get("key"), "issue.key")
        fields = as_dict(issue.get("fields"))
        summary = as_text(fields.get("summary"))
        comment = as_dict(payload.get("comment"))
        actor = payload.get("user") or comment.get("author") or comment.get("updateAuthor")
        sender = _person_id(actor)
        who = _person_name(actor) or "someone"
        partition = f"{NAME}:{key}"
        changes = []
        recipients: list[Recipient] = []
        for item in as_list(as_dict(payload.get("changelog")).get("items")):
            item = as_dict(item)
            field_name = as_text(item.get("field"))
            changes.append(f"{field_name}: {as_text(item.get('fromString')) or '(none)'} → {as_text(item.get('toString')) or '(none)'}")
            if field_name == "assignee":
                to = as_text(item.get("to")) or as_text(item.get("tmpToAccountId"))
                if to:
                    recipients.append(Recipient(to, WHY_ASSIGNEE))
        assignee = _person_id(fields.get("assignee"))
        if assignee:
            recipients.append(Recipient(assignee, WHY_ASSIGNEE))
        quoted = f'{key} "{summary}"' if summary else key
        if comment:
            raw = comment.get("body")
            text = atlassian.adf_text(raw).strip() if isinstance(raw, (dict, list)) else as_text(raw)
            verb = "edited a comment on" if name == "comment_updated" else "commented on"
            body = f"{who} {verb} {quoted}:\n{text}"
            digest = ""
            recipients = [Recipient(m, WHY_MENTION) for m in atlassian.mentions(raw)] + recipients
            message_id = comment_message_id(as_text(comment.get("id"))) if as_text(comment.get("id")) else delivery
        else:
            description = fields.get("description")
            desc = atlassian.adf_text(description).strip() if isinstance(description, (dict, list)) else as_text(description)
            verb = {ISSUE_CREATED: "created", ISSUE_DELETED: "deleted"}.get(name, "updated")
            lead = f"{who} {verb} {quoted}" + (f": {'; '.join(changes)}" if changes else "")
            body = lead + (f"\n\nDescription:\n{desc}" if desc else "")
            # Supersede rule: an update's full description is stale state the
            # latest body shows anyway, so an earlier one collapses to its lead.
            digest = lead if name != ISSUE_CREATED else ""
            if name == ISSUE_CREATED:
                recipients = [Recipient(m, WHY_MENTION) for m in atlassian.mentions(description)] + recipients
            message_id = delivery
        base = as_text(issue.get("self")).split("/rest/")[0]
        return Parsed.item(
            self.source, name, delivery, message_id, key=partition, sender=sender, sender_name=who,
            title=f"{key}: {summary}" if summary else key, url=f"{base}/browse/{key}" if base else "", body=body,
            digest_body=digest, recipients=unique(recipients),
        )


SOURCE = Source(parser=JiraParser(), verify=verify, meta=meta, headers=KEPT_HEADERS)

__all__ = ["NAME", "SOURCE", "JiraParser", "meta", "verify"]
