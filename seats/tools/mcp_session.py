"""One seat's session with one MCP server: a task that owns its client from open to close, restarting it when it ends.

The SDK's anyio scopes must be entered and left by one task, so each session
is a supervising task:

* it starts the server, lists its tools and publishes them under
  ``<server>__<tool>`` — within the vendors' tool-name rule
  (``^[a-zA-Z0-9_-]{1,64}$``), sanitised and de-duplicated
  (:func:`exposed_name`), the mapping kept so a call reaches the server's own
  name;
* a server that cannot start within ``tools.start_timeout_s`` is reported
  ONCE (``tool_server_unavailable``) and the seat's turns run without it,
  while starts are retried with a backoff doubling from
  ``tools.restart_backoff_s`` to a minute;
* a session that ends on its own — the stdio server's output closed (it
  died), or a failed call after which the server no longer answers a listing
  (an HTTP server gone) — is started again after that backoff and
  ``tool_server_restarted`` says so.
"""
from __future__ import annotations

import asyncio
import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import anyio
from mcp import Client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import context as otel_context
from mcp.shared.exceptions import MCPError

from crewlet.base.logfmt import short_reason
from crewlet.base.redact import redact
from crewlet.company.conf import ToolSettings
from crewlet.company.org import GrantedServer, Seat
from crewlet.events.types import ToolServerRestarted, ToolServerUnavailable
from seats.tools.base import ToolSpec
from seats.tools.mcp_transport import open_transport

log = logging.getLogger("crewlet.seats.tools")

#: Between a server's name and its tool's in the name the model sees.
NAME_SEPARATOR = "__"
#: The vendors' tool-name rule (OpenAI and Anthropic both): what every exposed name matches.
TOOL_NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NOT_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_MAX_NAME = 64
#: The longest wait between restarts of a server (or ``tools.restart_backoff_s`` when that is longer).
RESTART_BACKOFF_CAP_S = 60.0
#: How long the liveness check after a failed call may take before the session counts as gone.
PING_TIMEOUT_S = 5.0

# Why a session ended, as its restart event says.
ENDED_OUTPUT_CLOSED = "the server's output closed (it exited)"
ENDED_NOT_ANSWERING = "the server stopped answering"


class ToolServerError(Exception):
    """An MCP server could not be reached, started or listed; what the SDK raised, translated at this boundary."""


def exposed_name(server: str, tool: str, taken: set[str]) -> str:
    """``<server>__<tool>`` within the vendors' rule, distinct from every name in ``taken``.

    Characters outside ``[a-zA-Z0-9_-]`` become ``_`` and the result is cut to
    64 characters; a name that then collides with another gets ``_2``,
    ``_3``… (cut to fit), so two tools never share an exposed name.
    """
    base = _NOT_NAME_CHARS.sub("_", f"{server}{NAME_SEPARATOR}{tool}")[:_MAX_NAME]
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f"_{n}"
        name = base[: _MAX_NAME - len(suffix)] + suffix
    return name


def failure_text(exc: BaseException) -> str:
    """A failure in one storable line with no credential in it (an SDK error may quote a URL or a header)."""
    if isinstance(exc, MCPError):
        return redact(exc.error.message or short_reason(exc))
    if isinstance(exc, ExceptionGroup) and exc.exceptions:
        return failure_text(exc.exceptions[0])
    return redact(short_reason(exc))


class SessionOwner(Protocol):
    """What a session asks of the toolbox that opened it: the tool settings, and where its events are published."""

    settings: ToolSettings

    async def emit(self, body: Any) -> None: ...


@dataclass(frozen=True)
class ServerTool:
    """One tool a session listed: the server's name, the tool's own name there, and the spec the model is shown."""

    server: str
    name: str
    spec: ToolSpec


class McpSession:
    """One seat's session with one MCP server, owned from open to close by its supervising task."""

    def __init__(self, box: SessionOwner, seat: Seat, server: GrantedServer) -> None:
        self.box = box
        self.seat = seat
        self.server = server
        self.client: Optional[Client] = None
        self.tools: dict[str, ServerTool] = {}
        #: Set once the first start attempt has an outcome (up or not), so a turn waits for it once.
        self.settled = asyncio.Event()
        self._ended = asyncio.Event()
        self._task: Optional[asyncio.Task[None]] = None
        self._checking: Optional[asyncio.Task[None]] = None
        self._end_reason = ""
        #: How the client negotiates: "auto" probes ``server/discover`` first; a server that answered the
        #: handshake-era way once is opened that way after (its probe fails, an error span each time).
        self._mode = "auto"

    @property
    def up(self) -> bool:
        """Whether the server is running and its tools listed: a call can reach it now."""
        return self.client is not None

    def start(self) -> None:
        """Start the supervising task; the session opens in it (a turn waits on ``settled``, not on this)."""
        self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.seat.handle}:{self.server.name}")

    async def close(self) -> None:
        """End the supervising task and its liveness check, which closes the client (and stops a stdio server)."""
        for task in (self._checking, self._task):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self.client = None
        self.tools = {}

    # -- the supervising task ------------------------------------------------------------

    async def _supervise(self) -> None:
        # The task was started from whichever turn first needed the server: its spans, events and log lines
        # (a restart years later) are the session's own, never filed under that turn's trace.
        otel_context.attach(otel_context.Context())
        settings = self.box.settings
        attempt = 0
        waited_s = 0.0
        died = ""  # why the last session ended ("" before the first one)
        reported = False
        while True:
            attempt += 1
            try:
                await self._run_once(attempt=attempt, died=died, reported=reported, waited_s=waited_s)
                died, reported, attempt = self._end_reason or ENDED_OUTPUT_CLOSED, False, 0
                log.warning(
                    "tool_server_ended",
                    extra={"seat": self.seat.handle, "server": self.server.name, "reason": died},
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = failure_text(exc)
                if not reported:
                    reported = True
                    await self.box.emit(self._body(ToolServerUnavailable, error, attempt, waited_s))
                    log.warning(
                        "tool_server_unavailable",
                        extra={"seat": self.seat.handle, "server": self.server.name, "error": error},
                    )
                else:
                    log.info(
                        "tool_server_start_failed",
                        extra={"seat": self.seat.handle, "server": self.server.name, "error": error, "attempt": attempt},
                    )
            finally:
                self.client = None
                self.tools = {}
                self.settled.set()
            base_s = settings.restart_backoff_s
            waited_s = min(max(RESTART_BACKOFF_CAP_S, base_s), base_s * 2 ** max(0, attempt - 1))
            await asyncio.sleep(waited_s)

    async def _run_once(self, *, attempt: int, died: str, reported: bool, waited_s: float) -> None:
        """Open the session, publish its tools, hold it until it ends on its own; raise when it cannot start."""
        self._ended = asyncio.Event()
        self._end_reason = ""
        deadline = anyio.current_time() + self.box.settings.start_timeout_s
        with anyio.CancelScope(deadline=deadline) as scope:
            async with Client(open_transport(self.server, self._ended, seat=self.seat.handle), mode=self._mode) as client:
                if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                    self._mode = "legacy"
                listed = await self._list(client)
                scope.deadline = math.inf
                self.tools = listed
                self.client = client
                self.settled.set()
                log.info(
                    "tool_server_started",
                    extra={"seat": self.seat.handle, "server": self.server.name, "tools": len(listed), "attempt": attempt},
                )
                if died or reported:
                    await self.box.emit(self._body(ToolServerRestarted, died or "could not start", attempt, waited_s))
                await self._ended.wait()
        if scope.cancelled_caught:
            raise ToolServerError(f"did not start within {self.box.settings.start_timeout_s:g}s")

    async def _list(self, client: Client) -> dict[str, ServerTool]:
        tools: dict[str, ServerTool] = {}
        cursor: Optional[str] = None
        while True:
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                name = exposed_name(self.server.name, tool.name, set(tools))
                hints = tool.annotations
                spec = ToolSpec(
                    name=name, description=tool.description or "", input_schema=dict(tool.input_schema),
                    read_only=hints is not None and hints.read_only_hint is True,
                    annotations=hints.model_dump(by_alias=True, exclude_none=True) if hints is not None else {},
                )
                tools[name] = ServerTool(server=self.server.name, name=tool.name, spec=spec)
            cursor = page.next_cursor
            if not cursor:
                return tools

    def _body(self, cls: Any, error: str, attempt: int, waited_s: float) -> Any:
        return cls(
            **self.seat.labels(),
            server=self.server.name,
            transport=self.server.transport,
            error=error,
            attempt=attempt,
            retry_in_s=waited_s,
        )

    # -- liveness after a failed call -------------------------------------------------------

    def suspect(self, client: Client) -> None:
        """A call failed below the tool: ask the server for its tools again, and end the session if it no longer answers.

        A fresh listing rather than ``ping``: ping is gone from the 2026
        protocol, and a listing is a request every server answers.
        """
        if self._checking is None or self._checking.done():
            self._checking = asyncio.create_task(self._check(client))

    async def _check(self, client: Client) -> None:
        try:
            with anyio.fail_after(PING_TIMEOUT_S):
                await client.list_tools(cache_mode="refresh")
        except Exception:
            if self.client is client:
                self._end_reason = ENDED_NOT_ANSWERING
                self._ended.set()


__all__ = [
    "ENDED_NOT_ANSWERING",
    "ENDED_OUTPUT_CLOSED",
    "McpSession",
    "NAME_SEPARATOR",
    "PING_TIMEOUT_S",
    "RESTART_BACKOFF_CAP_S",
    "ServerTool",
    "SessionOwner",
    "TOOL_NAME_RULE",
    "ToolServerError",
    "exposed_name",
    "failure_text",
]
