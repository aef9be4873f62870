"""What Jira and Confluence share: Atlassian's two ways to authenticate a webhook, its labels, ADF.

Verification accepts BOTH forms: the ``X-Hub-Signature:
sha256=<HMAC-SHA256(secret, body)>`` header a Jira Cloud webhook with a
secret sends (WebSub style), or, for senders that cannot sign (a Confluence
webhook, Jira automation's "Send web request"), the shared secret as a
``?secret=<token>`` query parameter on the registered URL. A request that
carries the header is judged by the header alone.

The delivery id is ``X-Atlassian-Webhook-Identifier``; the event name may be
given on the registered URL as ``?event=<name>``. Comment bodies in API v3
are Atlassian Document Format (ADF), read here without recursion.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from notifications.parsers import DeliveryMeta, ParseError, as_dict, as_text
from notifications.sources.base import InboundRequest, hmac_sha256_hex, same

SIGNATURE_HEADER = "x-hub-signature"
DELIVERY_HEADER = "x-atlassian-webhook-identifier"
#: Kept on the raw_webhook for an operator (never the signature).
KEPT_HEADERS = (DELIVERY_HEADER, "x-atlassian-webhook-retry", "x-atlassian-webhook-flow")
#: The query parameters a registered URL may carry: the shared secret, the event's name.
SECRET_QUERY = "secret"
EVENT_QUERY = "event"


def verify(secret: str, req: InboundRequest, now: float) -> Optional[str]:
    """None when the ``X-Hub-Signature`` header, or without one the ``?secret=`` token, proves the delivery."""
    signature = req.header(SIGNATURE_HEADER)
    if signature:
        if not same(signature, "sha256=" + hmac_sha256_hex(secret, req.body)):
            return "X-Hub-Signature does not match the body"
        return None
    token = req.query.get(SECRET_QUERY, "")
    if not token:
        return "missing X-Hub-Signature (sha256=...) or ?secret= token"
    if not same(token, secret):
        return "the ?secret= token does not match"
    return None


def meta(req: InboundRequest) -> DeliveryMeta:
    """The event named on the registered URL and the delivery id Atlassian's header carries."""
    return DeliveryMeta(event_name=req.query.get(EVENT_QUERY, ""), delivery_id=req.header(DELIVERY_HEADER), query=dict(req.query))


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


#: What each reading of a document does not descend into: a text run, a mention or a line break is read whole.
_ADF_TEXT_LEAVES = frozenset({"text", "mention", "hardBreak"})
_ADF_MENTION_LEAVES = frozenset({"mention"})


def _adf_nodes(node: Any, leaves: frozenset[str]) -> Iterator[Any]:
    """Every node of an ADF document in document order, descending into each object whose type is not in ``leaves``;
    after a block's children, an :class:`_Emit` of its line end.

    Iterative, with an explicit stack, so a document nested thousands of
    levels deep reads like a flat one instead of overflowing the call stack;
    past :data:`ADF_MAX_NODES` nodes it is refused.
    """
    stack: list[Any] = [node]
    visited = 0
    while stack:
        item = stack.pop()
        if isinstance(item, _Emit):
            yield item
            continue
        visited += 1
        if visited > ADF_MAX_NODES:
            raise _adf_budget_exceeded()
        if isinstance(item, list):
            stack.extend(reversed(item))
            continue
        yield item
        if isinstance(item, dict) and item.get("type") not in leaves:
            if item.get("type") in _ADF_BLOCKS:
                stack.append(_Emit("\n"))
            stack.append(item.get("content"))


def adf_text(node: Any) -> str:
    """Plain text of an Atlassian Document Format node (a comment body in API v3)."""
    out: list[str] = []
    for item in _adf_nodes(node, _ADF_TEXT_LEAVES):
        if isinstance(item, _Emit):
            out.append(item.text)
        elif isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            kind = item.get("type")
            if kind == "text":
                text = item.get("text")
                out.append(text if isinstance(text, str) else "")
            elif kind == "mention":
                attrs = as_dict(item.get("attrs"))
                out.append(as_text(attrs.get("text")) or f"[~accountid:{as_text(attrs.get('id'))}]")
            elif kind == "hardBreak":
                out.append("\n")
    return "".join(out)


def _adf_mentions(node: Any) -> list[str]:
    """The account ids an ADF document mentions, in document order."""
    found: list[str] = []
    for item in _adf_nodes(node, _ADF_MENTION_LEAVES):
        if isinstance(item, dict) and item.get("type") == "mention":
            ident = as_text(as_dict(item.get("attrs")).get("id"))
            if ident:
                found.append(ident)
    return found


def mentions(body: Any) -> list[str]:
    if isinstance(body, (dict, list)):
        return _adf_mentions(body)
    text = body if isinstance(body, str) else ""
    found = _ATLASSIAN_ACCOUNT_MENTION.findall(text) + _ATLASSIAN_LEGACY_MENTION.findall(text)
    found += _CONFLUENCE_STORAGE_MENTION.findall(text)
    return found


__all__ = ["ADF_MAX_NODES", "KEPT_HEADERS", "adf_text", "mentions", "meta", "verify"]
