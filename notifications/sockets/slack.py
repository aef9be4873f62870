"""Slack Socket Mode: ``surfaces.slack: {mode: socket, app_token_env: SLACK_APP_TOKEN}``, and each seat's own app's.

A seat whose app names ``app_token_env`` (``seats[].slack``) has a socket of
its own, dialling ``surfaces.slack.api_url`` like the company-level one.

``slack_sdk``'s built-in Socket Mode client (its asyncio clients need
``aiohttp``, which this service does not ship) asks ``apps.connections.open``
with the app-level token for a ``wss://`` URL, opens it, answers Slack's
pings and reconnects by itself when Slack closes the socket or asks it to
(``disconnect``) or the socket goes stale (no pong for four ping intervals).
This module adds what the SDK leaves to its user: the first connect retried
with backoff, and each envelope — ``events_api``, ``slash_commands``,
``interactive`` — handed to the webhook route's edge and acknowledged ONLY
once it is on the broker. An envelope the node could not take is left
unacknowledged, so Slack sends it again (``retry_attempt``), and routing's
dedupe on ``event_id`` / ``trigger_id`` keeps a second copy from waking a
seat twice. A slash command's acknowledgement carries the ephemeral line the
webhook route answers with (``Source.acknowledge``).

The SDK calls its listeners on its own worker threads; they reach the
engine's loop through :func:`crewlet.engine.runtime.call_on_loop`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any, Optional

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.socket_mode.builtin import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web import WebClient

from crewlet.company.org import SLACK_DEFAULT_API_URL
from crewlet.engine.runtime import EngineAway, call_on_loop
from notifications.sockets import FrameNotTaken, SocketClient

log = logging.getLogger("crewlet.notifications.sockets.slack")

#: Slack's Web API when the company names none (``surfaces.slack.api_url``).
DEFAULT_API_URL = SLACK_DEFAULT_API_URL
#: The envelope types that carry a delivery; each is handed to the edge the same way.
ENVELOPE_TYPES = frozenset({"events_api", "slash_commands", "interactive"})
HELLO = "hello"


class SlackSocket(SocketClient):
    """One Slack app's Socket Mode connection, feeding the edge."""

    transport = "slack socket mode"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client: Optional[SocketModeClient] = None

    def api_url(self) -> str:
        url = self.surface.server or DEFAULT_API_URL
        return url if url.endswith("/") else f"{url}/"

    def _make_client(self) -> SocketModeClient:
        client = SocketModeClient(
            app_token=self.token,
            web_client=WebClient(base_url=self.api_url()),
            logger=logging.getLogger("crewlet.notifications.sockets.slack.sdk"),
            ping_interval=self.timings.ping_s,
            on_message_listeners=[self._on_frame],
            on_error_listeners=[self._on_error],
        )
        client.socket_mode_request_listeners.append(self._on_request)
        client.message_listeners.append(self._on_message)
        return client

    async def serve(self) -> None:
        """Connect (retrying with backoff until Slack answers); from then on the SDK keeps the socket."""
        self.client = await asyncio.to_thread(self._make_client)
        while True:
            try:
                await asyncio.to_thread(self.client.connect_to_new_endpoint, True)
            except (SlackApiError, SlackClientError, OSError, ValueError) as exc:
                await self.pause(_why(exc))
                continue
            # From the first attempt on, the SDK's monitor reopens a socket that failed to open or closed.
            self.backoff.reset()
            log.info(
                "surface_socket_opened",
                extra={"surface": self.surface.name, "seat": self.seat, "transport": self.transport, "connected": self.connected()},
            )
            await asyncio.Event().wait()  # the SDK's threads carry the session until stop() cancels this

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await asyncio.to_thread(_close, client)

    def connected(self) -> bool:
        client = self.client
        return client is not None and client.is_connected()

    def status_report(self) -> dict[str, Any]:
        """The status with ``connected`` read off the SDK's socket now (it reconnects on its own threads)."""
        self.status.connected = self.connected()
        return super().status_report()

    # -- the SDK's listeners, on its threads -------------------------------------------------

    def _on_frame(self, message: str) -> None:
        self.status.frame()

    def _on_error(self, error: Exception) -> None:
        self.status.error(_why(error))

    def _on_message(self, client: Any, message: dict[str, Any], raw: Optional[str]) -> None:
        if message.get("type") == HELLO:
            self.status.connects += 1
            self.status.connected = True

    def _on_request(self, client: Any, request: SocketModeRequest) -> None:
        """Hand the envelope's payload to the edge; acknowledge it only when the edge put it on the broker."""
        if request.type not in ENVELOPE_TYPES:
            log.debug("slack_envelope_ignored", extra={"type": request.type, "envelope_id": request.envelope_id})
            return
        body = json.dumps(request.payload).encode("utf-8")
        try:
            response = call_on_loop(lambda: self.take(body), self.loop, self.timings.deliver_timeout_s)
        except (FrameNotTaken, EngineAway) as exc:
            if isinstance(exc, EngineAway):
                self.status.not_taken += 1
            log.warning(
                "slack_envelope_not_acknowledged",
                extra={
                    "envelope_id": request.envelope_id,
                    "type": request.type,
                    "retry_attempt": request.retry_attempt,
                    "error": str(exc),
                },
            )
            return
        payload = response.body if response.status == 200 and response.body else None
        try:
            client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id, payload=payload))
        except (SlackClientError, OSError) as exc:  # the socket went away: Slack sends it again, dedupe drops the copy
            self.status.error(_why(exc))
            log.warning("slack_envelope_ack_failed", extra={"envelope_id": request.envelope_id, "error": _why(exc)})


def _close(client: SocketModeClient) -> None:
    """Close the SDK's client, shutting its socket first: a close alone waits out the SDK's blocking read (3 s)."""
    session = client.current_session
    sock = session.sock if session is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
    client.close()


def _why(exc: BaseException) -> str:
    """An SDK error as one line; a Web API error names Slack's ``error`` code, never the token."""
    if isinstance(exc, SlackApiError):
        code = exc.response.get("error", "") if exc.response is not None else ""
        return f"apps.connections.open failed: {code or 'no error code'}"
    return f"{type(exc).__name__}: {exc}"


#: The client :func:`notifications.sockets.client_for` makes for this kind.
CLIENT = SlackSocket


__all__ = ["CLIENT", "DEFAULT_API_URL", "ENVELOPE_TYPES", "SlackSocket"]
