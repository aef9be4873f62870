"""Where a turn's answer belongs: the trigger's reply target, told to the model in the form its tools take.

A seat answers with its own tools, so the model has to pass the place it was
asked — the Slack channel and thread, the GitHub repository and issue, the
Jira issue, the Confluence page — as those tools' arguments. Read back from a
key like ``github:octo/repo#7`` it would be a guess; here it is read once,
from the trigger's partition key and its latest wake's message id (the
values :mod:`notifications.sources` files every delivery under), and handed
over as one JSON object whose keys are the shipped tools' own parameter
names, with the exposed name of the seat's reply tool:

.. code-block:: text

    Reply target (where the message above was asked; pass these values to your tools as they are):
    {"surface": "github", "reply_tool": "github__add_comment", "repo": "octo-org/octo-repo", "issue_number": 7, "comment_id": 1201}

Per surface (each key is the parameter of the tools of :mod:`seats.tools.servers.<surface>`):

* slack — ``channel``, ``thread_ts`` (the thread's root; a message that is no
  thread's reply roots its own), ``timestamp`` (the message, for ``add_reaction``);
* mattermost — ``channel_id``, ``root_id``, ``post_id``;
* github — ``repo`` (``owner/name``), ``issue_number`` (an issue's or a pull
  request's), ``comment_id`` (an issue comment's, for ``add_reaction``);
* jira — ``issue_key``;
* confluence — ``page_id``, ``parent_comment_id`` (the comment that was
  made, so the answer is a reply in its thread).

``reply_tool`` is there when the seat is granted the shipped server of that
surface (``mcp_servers: {<name>: {builtin: <surface>}}``): ``<name>__<tool>``.
A trigger that came from no surface (a schedule, an A2A ask, a task) has no
target, and a seat with no tools is told none.
"""
from __future__ import annotations

import json
import re
from typing import Any, Optional, Sequence

from crewlet.company.builtin_servers import builtin_grant
from crewlet.company.org import Organization, Seat
from seats.tools.base import ToolSpec
from seats.tools.mcp_session import NAME_SEPARATOR
from seats.turn_types import Trigger
from seats.wake import Wake

#: The block's lead line: what the object after it is and how it is used.
REPLY_TARGET_LEAD = "Reply target (where the message above was asked; pass these values to your tools as they are):"
#: The target's own keys beside the tools' parameters.
SURFACE = "surface"
REPLY_TOOL = "reply_tool"
#: Each surface's reply tool (the shipped server's): a thread's reply, else a message at the top of the channel.
REPLY_TOOLS = {"slack": "reply_in_thread", "mattermost": "reply_in_thread", "github": "add_comment", "jira": "add_comment",
               "confluence": "add_comment"}
#: The tool a chat message with no thread to answer in is answered with (a channel's top).
POST_TOOL = "post_message"
#: The prefix every tracker wake's message id has when it is a comment (``comment:<id>``).
_COMMENT = "comment:"
_SLACK_TS = re.compile(r"\d{1,12}\.\d{1,9}")
_GITHUB_KEY = re.compile(r"(?P<repo>[^/#\s]+/[^/#\s]+)#(?P<number>[0-9]{1,18})")
#: The GitHub event whose comment id is an issue comment's (a review comment's is another kind of id).
_GITHUB_ISSUE_COMMENT = "issue_comment"


def _comment_id(message_id: str) -> str:
    return message_id[len(_COMMENT):] if message_id.startswith(_COMMENT) else ""


def _chat(parts: list[str], message: str, channel_key: str, thread_key: str, message_key: str) -> dict[str, Any]:
    """A chat conversation's target in its surface's keys: the channel, the thread (its root, else the message) and the message."""
    channel, root = parts[0], (parts[1] if len(parts) > 1 else "")
    target: dict[str, Any] = {channel_key: channel}
    if root or message:
        target[thread_key] = root or message
    if message:
        target[message_key] = message
    return target


def _slack(parts: list[str], message_id: str) -> Optional[dict[str, Any]]:
    where, _, ts = message_id.partition(":")
    ts = ts if where == parts[0] and _SLACK_TS.fullmatch(ts) else ""
    return _chat(parts, ts, "channel", "thread_ts", "timestamp")


def _mattermost(parts: list[str], message_id: str) -> Optional[dict[str, Any]]:
    return _chat(parts, message_id, "channel_id", "root_id", "post_id")


def _github(rest: str, message_id: str, event_name: str) -> Optional[dict[str, Any]]:
    found = _GITHUB_KEY.fullmatch(rest)
    if found is None:
        return None
    target: dict[str, Any] = {"repo": found["repo"], "issue_number": int(found["number"])}
    comment = _comment_id(message_id)
    if event_name == _GITHUB_ISSUE_COMMENT and comment.isdigit():
        target["comment_id"] = int(comment)
    return target


def target_of(trigger: Trigger) -> Optional[dict[str, Any]]:
    """The trigger's reply target without the tool's name (``surface`` and the tools' arguments), or None."""
    if not trigger.events:
        return None
    latest = trigger.events[-1]
    wake = Wake(latest)
    surface, _, rest = (trigger.partition_key or wake.partition_key).partition(":")
    if surface != latest.source or not rest:
        return None
    message_id = wake.message_id
    target: Optional[dict[str, Any]]
    if surface in ("slack", "mattermost"):
        parts = rest.split(":")
        if len(parts) > 2 or not all(parts):
            return None
        target = _slack(parts, message_id) if surface == "slack" else _mattermost(parts, message_id)
    elif surface == "github":
        target = _github(rest, message_id, wake.event_name)
    elif surface == "jira":
        target = {"issue_key": rest}
    elif surface == "confluence":
        comment = _comment_id(message_id)
        target = {"page_id": rest, **({"parent_comment_id": comment} if comment.isdigit() else {})}
    else:
        return None
    return None if target is None else {SURFACE: surface, **target}


def reply_target(trigger: Trigger, org: Organization, seat: Seat) -> Optional[dict[str, Any]]:
    """The trigger's reply target with ``reply_tool`` when the seat is granted the surface's shipped server."""
    target = target_of(trigger)
    if target is None:
        return None
    surface = target[SURFACE]
    server = builtin_grant(org, seat, surface)
    if server is not None:
        threaded = surface not in ("slack", "mattermost") or "thread_ts" in target or "root_id" in target
        tool = REPLY_TOOLS[surface] if threaded else POST_TOOL
        target = {SURFACE: surface, REPLY_TOOL: f"{server.name}{NAME_SEPARATOR}{tool}",
                  **{k: v for k, v in target.items() if k != SURFACE}}
    return target


def with_reply_target(user: str, trigger: Trigger, org: Organization, seat: Seat, tools: Sequence[ToolSpec]) -> str:
    """The turn's user message with its reply target after it; as it was for a seat with no tools or a trigger with no target."""
    if not tools:
        return user
    target = reply_target(trigger, org, seat)
    if target is None:
        return user
    return f"{user}\n\n{REPLY_TARGET_LEAD}\n{json.dumps(target, ensure_ascii=False, separators=(', ', ': '))}"


__all__ = ["POST_TOOL", "REPLY_TARGET_LEAD", "REPLY_TOOL", "REPLY_TOOLS", "SURFACE", "reply_target", "target_of", "with_reply_target"]
