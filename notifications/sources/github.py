"""GitHub: ``X-Hub-Signature-256`` verification, the event and delivery headers, the issue and pull request parser.

Verification: ``X-Hub-Signature-256: sha256=HMAC-SHA256(secret, body)``. The
body does not name its event: ``X-GitHub-Event`` does, and
``X-GitHub-Delivery`` is the delivery id a retry repeats.

Content types: ``application/json``, and GitHub's default
``application/x-www-form-urlencoded`` (the same JSON in a ``payload=``
field). GitHub signs the body it sends, so a form delivery's signature is
checked over the raw form bytes, before anything of it is decoded.

Keys: ``github:<repo full_name>#<number>`` for both the partition and the
conversation. Logins compare without case.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional

from crewlet.events.backend_ids import comment_message_id
from crewlet.events.labels import SURFACE_FORGE
from notifications.parsers import (
    FILTER_UNHANDLED, WHY_ASSIGNEE, WHY_MENTION, WHY_REVIEWER,
    DeliveryMeta, Parsed, ParseError, Parser, Recipient, as_dict, as_list, as_text, form_json, need,
)
from notifications.sources.base import InboundRequest, Source, hmac_sha256_hex, same

NAME = "github"
SIGNATURE_HEADER = "x-hub-signature-256"
EVENT_HEADER = "x-github-event"
DELIVERY_HEADER = "x-github-delivery"
#: Kept on the raw_webhook for an operator (never the signature).
KEPT_HEADERS = (EVENT_HEADER, DELIVERY_HEADER, "x-github-hook-id")


def verify(secret: str, req: InboundRequest, now: float) -> Optional[str]:
    """None when ``X-Hub-Signature-256`` signs the body with the secret, else why not."""
    signature = req.header(SIGNATURE_HEADER)
    if not signature:
        return "missing X-Hub-Signature-256"
    if not same(signature, "sha256=" + hmac_sha256_hex(secret, req.body)):
        return "X-Hub-Signature-256 does not match the body"
    return None


def meta(req: InboundRequest) -> DeliveryMeta:
    """The event and the delivery id come from headers: the body names neither."""
    return DeliveryMeta(event_name=req.header(EVENT_HEADER), delivery_id=req.header(DELIVERY_HEADER), query=dict(req.query))


_GITHUB_MENTION = re.compile(r"(?<![\w/`@.-])@([A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38})(?![\w/-])")
#: Actions whose text is the ask itself (kept in a digest); every other action
#: on an issue or pull request is lifecycle and collapses to its lead line.
_GITHUB_SPOKEN_ACTIONS = frozenset({"opened", "created", "submitted"})
_GITHUB_EVENTS = frozenset(
    {"issues", "issue_comment", "pull_request", "pull_request_review", "pull_request_review_comment"}
)


class GitHubParser(Parser):
    source = NAME
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
        action = as_text(payload.get("action"))
        repo = need(as_dict(payload.get("repository")).get("full_name"), "repository.full_name")
        issue = as_dict(payload.get("issue"))
        pr = as_dict(payload.get("pull_request"))
        item = issue or pr
        number = as_text(issue.get("number")) or as_text(pr.get("number")) or as_text(payload.get("number"))
        if not number:
            raise ParseError("no issue or pull request number (issue.number, pull_request.number, number)")
        key = f"{NAME}:{repo}#{number}"
        is_pr = bool(pr) or bool(issue.get("pull_request"))
        kind = "pull request" if is_pr else "issue"
        sender = as_dict(payload.get("sender"))
        login = as_text(sender.get("login"))
        comment = as_dict(payload.get("comment"))
        review = as_dict(payload.get("review"))
        title = as_text(item.get("title"))
        lead = f"{login or 'someone'} {action or name} {kind} #{number} in {repo}" + (f": {title}" if title else "")
        if comment:
            text = as_text(comment.get("body"))
            where = f" on {as_text(comment.get('path'))}" if as_text(comment.get("path")) else ""
            body = f"{login or 'someone'} commented on {kind} #{number}{where}:\n{text}"
            digest = ""
            url = as_text(comment.get("html_url")) or as_text(item.get("html_url"))
            message_id = comment_message_id(as_text(comment.get("id"))) if as_text(comment.get("id")) else delivery
        elif review:
            text = as_text(review.get("body"))
            state = as_text(review.get("state"))
            body = f"{login or 'someone'} reviewed {kind} #{number}" + (f" ({state})" if state else "") + (
                f":\n{text}" if text else ""
            )
            digest = "" if text else lead
            url = as_text(review.get("html_url")) or as_text(item.get("html_url"))
            message_id = f"review:{as_text(review.get('id'))}" if as_text(review.get("id")) else delivery
        else:
            text = as_text(item.get("body")) if action in ("opened", "edited", "reopened") else ""
            body = lead + (f"\n\n{text}" if text else "")
            digest = "" if action in _GITHUB_SPOKEN_ACTIONS else lead
            url = as_text(item.get("html_url"))
            message_id = delivery
        recipients = [Recipient(m, WHY_MENTION) for m in _GITHUB_MENTION.findall(text)]
        for person in as_list(item.get("assignees")) + [item.get("assignee")]:
            recipients.append(Recipient(as_text(as_dict(person).get("login")), WHY_ASSIGNEE))
        if action == "assigned":
            recipients.append(Recipient(as_text(as_dict(payload.get("assignee")).get("login")), WHY_ASSIGNEE))
        for person in as_list(pr.get("requested_reviewers")):
            recipients.append(Recipient(as_text(as_dict(person).get("login")), WHY_REVIEWER))
        if action == "review_requested":
            recipients.append(Recipient(as_text(as_dict(payload.get("requested_reviewer")).get("login")), WHY_REVIEWER))
        return Parsed.item(
            self.source, name, delivery, message_id, key=key, sender=login, sender_name=login,
            title=f"{repo}#{number}" + (f": {title}" if title else ""), url=url, body=body, digest_body=digest,
            recipients=_uniq_ci(recipients),
        )


def _uniq_ci(recipients: Iterable[Recipient]) -> tuple[Recipient, ...]:
    out: dict[str, Recipient] = {}
    for r in recipients:
        if r.identity and r.identity.lower() not in out:
            out[r.identity.lower()] = r
    return tuple(out.values())


SOURCE = Source(parser=GitHubParser(), verify=verify, meta=meta, headers=KEPT_HEADERS, form=form_json)

__all__ = ["NAME", "SOURCE", "GitHubParser", "meta", "verify"]
