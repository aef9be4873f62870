"""The working indicator: while a seat's turn for a chat message runs, that chat shows the seat at work.

A person who mentions a seat should see at once that it heard them, for the
whole length of the turn. The node running the turn does it, with the seat's
own bot token, as an around-turn hook (:mod:`seats.hooks`):

* Slack: the ``eyes`` reaction on the message that woke the seat, added as
  the turn starts (``reactions.add``) and removed as it ends
  (``reactions.remove``). Slack's assistant thread status
  (``assistant.threads.setStatus``) exists only in an AI app's assistant
  threads, which a mention in a channel is not, so a reaction it is.
* Mattermost: the typing event in the thread
  (``POST /api/v4/users/me/typing`` with ``channel_id`` and ``parent_id``),
  sent as the turn starts and again every ``tools.typing_every_s`` while it
  runs. Mattermost has no "stopped typing": clients drop the indicator a
  few seconds after the last one, or when the seat's reply arrives.

Best-effort by construction: the hook only starts a task and returns, so a
slow or failing vendor never delays the turn; each call gives up after
``tools.indicator_timeout_s``; a failure is logged once per turn
(``working_indicator_failed``, later ones of that turn at DEBUG) and never
reaches the turn, its events or its result.

Which chat and message: the trigger's partition key (``slack:<channel>:<root>``,
``mattermost:<channel>[:<root>]``) and its latest wake's ``message_id``
(Slack's ``<channel>:<ts>``, Mattermost's post id). A trigger that is not a
chat message (a schedule, an A2A ask, a slash command) shows nothing.

Whose token: the seat's grant of the shipped chat server of that surface
(``mcp_servers: {<name>: {builtin: slack}}``), read from the node variable
that grant feeds the server's token from (:func:`token_variable`); a seat
granted none shows nothing, since any other token would show somebody else at
work.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from slack_sdk.errors import SlackApiError

from crewlet.base.logfmt import short_reason
from crewlet.base.redact import redact
from crewlet.company.builtin_servers import BUILTIN_SERVERS, MATTERMOST, SLACK, builtin_grant
from crewlet.company.conf import ToolSettings
from crewlet.company.org import Organization, Seat, grant_env
from crewlet.engine.interfaces import ServiceKey
from crewlet.engine.runtime import find_service
from crewlet.engine.services import Service
from seats.hooks import TurnEnd
from seats.tools.servers.mattermost import DRIVER_ERRORS, driver, refusal as mattermost_refusal
from seats.tools.servers.slack import refusal as slack_refusal, web_client
from seats.turn_types import Trigger
from seats.wake import Wake

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.seats.indicator")

#: The engine service that runs this node's working indicators.
WORKING_INDICATOR = "working_indicator"
#: The reaction a Slack message gets while a turn on it runs.
SLACK_WORKING_REACTION = "eyes"
#: How long a stopping node waits for the indicators still clearing (each call is bounded by its own timeout too).
STOP_WAIT_S = 5.0
_SLACK_TS = re.compile(r"\d{1,12}\.\d{1,9}")


@dataclass(frozen=True)
class ChatTarget:
    """Where a turn's indicator shows: the surface, the channel, the triggering message and the thread's root."""

    surface: str
    channel: str
    #: Slack: the triggering message's ``ts``; Mattermost: its post id.
    message: str
    #: The thread's root (Slack ``thread_ts``, Mattermost root post id); empty for a direct message's top level.
    root: str = ""


def target_of(trigger: Trigger) -> Optional[ChatTarget]:
    """The chat message ``trigger`` is about, or None when it is none (or its keys do not read as one)."""
    if not trigger.events:
        return None
    latest = trigger.events[-1]
    wake = Wake(latest)
    surface = latest.source
    key = trigger.partition_key or wake.partition_key
    parts = key.split(":")
    if surface not in (SLACK.surface, MATTERMOST.surface) or parts[0] != surface or len(parts) not in (2, 3):
        return None
    channel, root = parts[1], (parts[2] if len(parts) == 3 else "")
    message = wake.message_id
    if surface == SLACK.surface:
        where, _, ts = message.partition(":")
        if where != channel or not _SLACK_TS.fullmatch(ts):
            return None  # a slash command or a click: no message of its own to react to
        message = ts
    if not channel or not message:
        return None
    return ChatTarget(surface=surface, channel=channel, message=message, root=root)


def token_variable(org: Organization, seat: Seat, surface: str) -> str:
    """The node variable holding the seat's own bot token on ``surface``; '' when it is granted no shipped server there.

    The one its grant of the shipped server feeds that server's token from
    (``seats[].tools: [{server: slack, env: {SLACK_BOT_TOKEN: ADA_SLACK_BOT_TOKEN}}]``,
    else the server's own ``SLACK_BOT_TOKEN``): the indicator shows the seat
    with the very token its replies are posted with.
    """
    server = builtin_grant(org, seat, surface)
    if server is None:
        return ""
    name = BUILTIN_SERVERS[surface].token_env
    return grant_env(seat, server).get(name, name)


def api_url_of(org: Organization, seat: Seat, surface: str) -> str:
    """The vendor URL the seat's granted chat server calls (so the indicator calls the same one)."""
    server = builtin_grant(org, seat, surface)
    return server.env.get(BUILTIN_SERVERS[surface].url_env, "") if server is not None else ""


class TurnIndicator:
    """One turn's indicator: a task that shows it, waits for the turn's end, then clears it."""

    def __init__(
        self, seat: str, turn_id: str, target: ChatTarget, token: str, url: str, settings: ToolSettings
    ) -> None:
        self.seat = seat
        self.turn_id = turn_id
        self.target = target
        self.token = token
        self.url = url
        self.settings = settings
        self.failures = 0
        #: The vendor calls made so far (shown, re-sent, cleared), failed ones included.
        self.calls = 0
        self._ended = asyncio.Event()

    def end(self) -> None:
        """The turn ended: clear the indicator (in the indicator's own task, never here)."""
        self._ended.set()

    async def run(self) -> None:
        """Show, wait for the turn's end, clear; then say so (``working_indicator_cleared``, with the calls made)."""
        if self.target.surface == SLACK.surface:
            await self._slack()
        else:
            await self._mattermost()
        log.info(
            "working_indicator_cleared",
            extra={"seat": self.seat, "turn_id": self.turn_id, "surface": self.target.surface, "calls": self.calls,
                   "failures": self.failures},
        )

    async def _slack(self) -> None:
        client = web_client(self.token, self.url, timeout_s=self.settings.indicator_timeout_s, retries=False)
        options = {"channel": self.target.channel, "timestamp": self.target.message, "name": SLACK_WORKING_REACTION}
        shown = await self._call("reactions.add", lambda: client.reactions_add(**options), fine=("already_reacted",))
        await self._ended.wait()
        if shown:
            await self._call("reactions.remove", lambda: client.reactions_remove(**options), fine=("no_reaction",))

    async def _mattermost(self) -> None:
        try:
            made = driver(self.url, self.token, timeout_s=self.settings.indicator_timeout_s, retries=False)
        except ValueError as exc:
            self._failed("typing", exc)
            return
        target = self.target
        try:
            while not self._ended.is_set():
                await self._call(
                    "typing",
                    lambda: made.users.publish_user_typing("me", target.channel, target.root or None),
                )
                try:
                    await asyncio.wait_for(self._ended.wait(), timeout=self.settings.typing_every_s)
                except TimeoutError:
                    continue
        finally:
            made.close()

    async def _call(self, what: str, call: Callable[[], Any], fine: tuple[str, ...] = ()) -> bool:
        """Run one blocking vendor call off the loop, bounded; whether it did what it was for (a failure is logged).

        ``fine`` are Slack error codes that mean it did (the reaction was
        already there, or already gone).
        """
        self.calls += 1
        try:
            await asyncio.wait_for(asyncio.to_thread(call), timeout=self.settings.indicator_timeout_s)
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, SlackApiError) and exc.response.get("error") in fine:
                return True
            self._failed(what, exc)
            return False

    def _why(self, what: str, exc: BaseException) -> str:
        """The failure in the vendor's words, as the chat tools put it (one line, no token)."""
        if not isinstance(exc, Exception) or isinstance(exc, TimeoutError):
            return f"{what} did not answer within {self.settings.indicator_timeout_s:g}s"
        if self.target.surface == SLACK.surface:
            return slack_refusal(what, exc, self.url)
        if isinstance(exc, DRIVER_ERRORS):
            return mattermost_refusal(what, exc)
        return short_reason(exc, 300)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        fields = {
            "seat": self.seat, "turn_id": self.turn_id, "surface": self.target.surface, "call": what,
            "error": redact(self._why(what, exc))[:500],
        }
        if self.failures == 1:
            log.warning("working_indicator_failed", extra=fields)
        else:
            log.debug("working_indicator_failed_again", extra=fields)


class WorkingIndicators:
    """This node's running indicators: started by the around-turn hook, cleared at each turn's end, drained at stop."""

    def __init__(self, settings: Optional[ToolSettings] = None, environ: Optional[dict[str, str]] = None) -> None:
        self.settings = settings or ToolSettings()
        self.environ = environ
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    async def start(self) -> None:
        """Nothing to open: an indicator starts with its turn."""

    async def stop(self) -> None:
        """Let the indicators still clearing finish (bounded), then cancel what is left."""
        self._stopping = True
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=STOP_WAIT_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def begin(self, org: Organization, seat: Seat, trigger: Trigger) -> Optional[TurnEnd]:
        """Show ``seat`` at work where ``trigger`` came from; the callable that clears it, or None when nothing shows."""
        if self._stopping:
            return None
        target = target_of(trigger)
        if target is None:
            return None
        variable = token_variable(org, seat, target.surface)
        environ = os.environ if self.environ is None else self.environ
        token = environ.get(variable, "").strip() if variable else ""
        url = api_url_of(org, seat, target.surface)
        if not token or not url:
            log.debug(
                "working_indicator_skipped",
                extra={"seat": seat.handle, "surface": target.surface, "why": "no token" if not token else "no server URL"},
            )
            return None
        indicator = TurnIndicator(seat.handle, trigger.turn_id, target, token, url, self.settings)
        task = asyncio.get_running_loop().create_task(
            indicator.run(), name=f"working-indicator:{seat.handle}:{trigger.turn_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return indicator.end

    def running(self) -> int:
        """How many indicators are showing or clearing now (tests, health)."""
        return len(self._tasks)


#: How the hook finds this node's indicators.
INDICATORS: ServiceKey[WorkingIndicators] = ServiceKey(WORKING_INDICATOR, WorkingIndicators)


def working_indicator(org: Organization, seat: Seat, trigger: Trigger) -> Optional[TurnEnd]:
    """The around-turn hook the seats app declares: the running engine's indicators, or nothing where none runs."""
    indicators = find_service(INDICATORS)
    return indicators.begin(org, seat, trigger) if indicators is not None else None


def services(engine: "Engine") -> list[Service]:
    """The :data:`WORKING_INDICATOR` service; the seat runtime starts after it, so stops before it."""

    def make(engine: "Engine") -> WorkingIndicators:
        return WorkingIndicators(engine.settings.tools)

    return [Service(WORKING_INDICATOR, make)]


__all__ = [
    "ChatTarget",
    "INDICATORS",
    "SLACK_WORKING_REACTION",
    "TurnIndicator",
    "WORKING_INDICATOR",
    "WorkingIndicators",
    "services",
    "target_of",
    "token_variable",
    "working_indicator",
]
