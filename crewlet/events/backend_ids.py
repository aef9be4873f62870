"""A message's identity on its chat or tracker backend, spelled once for the parsers that file it and the seats that read it back.

A wake carries the id of the message that caused it (``message_id``): Slack's
``<channel>:<ts>``, Mattermost's post id, and ``comment:<id>`` for a comment
on a GitHub issue or pull request, a Jira issue or a Confluence page. The
completion ledger keys a worked message on ``message:<source>:<message_id>``
(:func:`message_identity`). A turn's thread block reads the same messages
back from the vendor (design: "And the failed one is not answered twice") and
must name each one exactly as its own wake would, or the ledger could not
tell a message the block showed from the delivery that comes round for it.
"""
from __future__ import annotations

#: The prefix of a tracker comment's message id (GitHub, Jira, Confluence).
COMMENT_PREFIX = "comment:"
#: The ledger's kind for a message named by its backend id.
MESSAGE_KIND = "message"


def slack_message_id(channel: str, ts: str) -> str:
    """A Slack message: its channel and its ``ts`` (a ``ts`` alone is unique only within its channel)."""
    return f"{channel}:{ts}"


def comment_message_id(comment_id: object) -> str:
    """A tracker comment (GitHub issue comment, Jira comment, Confluence comment) by the vendor's id."""
    return f"{COMMENT_PREFIX}{comment_id}"


def message_identity(source: str, message_id: str) -> str:
    """The completion ledger's key of a message: ``message:<source>:<message_id>`` (unbounded: the ledger cuts it)."""
    scope = f"{source}:" if source else ""
    return f"{MESSAGE_KIND}:{scope}{message_id}"


__all__ = ["COMMENT_PREFIX", "MESSAGE_KIND", "comment_message_id", "message_identity", "slack_message_id"]
