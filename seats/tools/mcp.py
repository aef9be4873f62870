"""Each seat's MCP tools: one session per (seat, server), kept open across turns on the node holding the seat.

The company names its MCP servers once (``mcp_servers``) and grants them per
seat (``seats[].tools``). :class:`McpToolbox` is the :class:`~seats.tools.base.Toolbox`
a turn calls: the first time a seat's turn asks for its tools, a supervised
session is opened to each server the seat is granted — a child process over
stdio, or streamable HTTP — with the official ``mcp`` SDK's :class:`mcp.Client`,
and it stays open for the seat's later turns. A seat's sessions are its own
(a server's state — a login, a cursor — is never shared between seats) and
live only on the node that runs the seat's turns. A session is opened for
the seat's grant (:class:`~crewlet.company.org.GrantedServer`): the server
and the node variables this seat's credentials for it are read from, so two
seats granted one server run two children, each with its own token.

Each session is a task that owns its client from open to close
(:class:`~seats.tools.mcp_session.McpSession`): it starts the server, lists
its tools under ``<server>__<tool>``, reports a server that cannot start
ONCE (``tool_server_unavailable``) and starts one that ended again after a
backoff (``tool_server_restarted``). A session is closed when the seat is
released (:meth:`McpToolbox.release`), when an applied company no longer
grants the server or changed it, and when the node stops. The transport —
a child process over stdio, its stderr read into ``tool_server_stderr``
records, or streamable HTTP — is :mod:`seats.tools.mcp_transport`.

A call never raises for a tool's failure: an error the tool reports, a
protocol error, a server that is down, or a call past ``tools.call_timeout_s``
is a :class:`~seats.tools.base.ToolResult` with ``ok=False`` and the reason,
which the model sees.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import anyio
import mcp_types
from mcp.shared.exceptions import MCPError

from crewlet.company.conf import ToolSettings
from crewlet.engine.services import Service
from crewlet.queue.emit import Emitter
from crewlet.engine.interfaces import EVENT_STORE
from crewlet.company.org import CompanyHolder, Seat
from crewlet.base.redact import redact
from crewlet.events.tracing import trace_of
from seats.tools.base import SEAT_TOOLS, ToolCall, ToolImage, ToolResult, ToolSpec
from seats.tools.mcp_session import NAME_SEPARATOR, McpSession, failure_text
from seats.tools.mcp_transport import unset_variables

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine

log = logging.getLogger("crewlet.seats.tools")

#: A tool result longer than this (UTF-8 bytes) is cut before the model sees it: one answer must not fill its context.
RESULT_MAX_BYTES = 100_000


#: The image types both model vendors take in a tool's answer; another is described in words instead.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: An image larger than this (base64 characters, about 3.75 MB of image) is described in words instead: the
#: vendors refuse one over 5 MB.
IMAGE_MAX_CHARS = 5_000_000


def _image(mime_type: str, data: str, images: list[ToolImage]) -> str:
    """Keep an image the vendors take (returns ""), or the words that stand for one they would refuse."""
    if mime_type in IMAGE_TYPES and len(data) <= IMAGE_MAX_CHARS:
        images.append(ToolImage(mime_type=mime_type, data=data))
        return ""
    if mime_type not in IMAGE_TYPES:
        return f"[an image of type {mime_type} not shown: the model takes {', '.join(sorted(IMAGE_TYPES))}]"
    return f"[a {mime_type} image of {len(data)} base64 characters not shown: over {IMAGE_MAX_CHARS}]"


def _resource(resource: Any, images: list[ToolImage]) -> str:
    """An embedded resource's contents: its text under its URI, an image kept as one, other bytes named."""
    mime = resource.mime_type or "application/octet-stream"
    if isinstance(resource, mcp_types.TextResourceContents):
        return f"[resource {resource.uri} ({mime})]\n{resource.text}"
    if mime.startswith("image/"):
        return _image(mime, resource.blob, images)
    return f"[resource {resource.uri}: {mime}, {len(resource.blob)} base64 characters not shown]"


def result_content(result: mcp_types.CallToolResult) -> tuple[str, tuple[ToolImage, ...]]:
    """What a tool returned as a model takes it: the text, and the images to hand over as image content.

    Text blocks as they are; an image as image content (the vendors read
    pictures, not their base64); an embedded resource's text under its URI, a
    link to one as its URI and name (a seat reads it with the server's tools);
    anything else (audio) as its JSON. Structured content only when there is
    no block.
    """
    parts: list[str] = []
    images: list[ToolImage] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent):
            parts.append(_image(block.mime_type, block.data, images))
        elif isinstance(block, mcp_types.EmbeddedResource):
            parts.append(_resource(block.resource, images))
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link {block.uri}: {block.title or block.name}" + (f", {block.mime_type}]" if block.mime_type else "]"))
        else:
            parts.append(block.model_dump_json(by_alias=True, exclude_none=True))
    if not result.content and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(p for p in parts if p), tuple(images)


def clip(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes (on a character boundary), saying how much was cut."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    note = f"\n[cut: {len(raw) - max_bytes} more bytes]"
    return raw[: max(0, max_bytes - len(note))].decode("utf-8", errors="ignore") + note


class McpToolbox:
    """This node's seats' MCP sessions, as the :class:`~seats.tools.base.Toolbox` a turn calls.

    Reads the company current per call (``holder.current()``), so an applied
    revision that grants, revokes or changes a server takes effect at the
    seat's next turn: a revoked or changed server's session is closed, a new
    grant opened.
    """

    def __init__(
        self,
        holder: CompanyHolder,
        *,
        settings: Optional[ToolSettings] = None,
        emitter: Optional[Emitter] = None,
        placed: Callable[[Seat], bool] = lambda seat: True,
    ) -> None:
        self.holder = holder
        self.settings = settings or ToolSettings()
        self.emitter = emitter
        #: Whether a seat may run on this node (its placement), so only its own seats' variables are checked here.
        self.placed = placed
        self._sessions: dict[str, dict[str, McpSession]] = {}
        self._lock = asyncio.Lock()
        self._stopped = False
        self._checked_epoch = 0
        self._warned: set[tuple[str, str, str]] = set()

    # -- Lifecycle (an engine service) -----------------------------------------------------

    async def start(self) -> None:
        """Name the variables the seats' grants read that this node lacks; sessions open at a seat's first turn."""
        self.check_variables()

    def check_variables(self) -> None:
        """One ``tool_server_variable_unset`` per seat and server whose grant reads a node variable this node does not set.

        Run at start and again when the company changes (at the next turn
        after a revision applies), never per turn: a variable already named
        is not named again while this node runs. Names only, never values.
        """
        org = self.holder.current()
        self._checked_epoch = self.holder.epoch
        for seat in org.agent_seats():
            if not self.placed(seat):
                continue
            for granted in org.granted_servers(seat):
                unset = [
                    v for v in unset_variables(granted) if (seat.handle, granted.name, v) not in self._warned
                ]
                if unset:
                    self._warned.update((seat.handle, granted.name, v) for v in unset)
                    log.warning(
                        "tool_server_variable_unset",
                        extra={"seat": seat.handle, "server": granted.name, "variables": unset},
                    )

    async def stop(self) -> None:
        """Close every session (stdio children are stopped the MCP way: stdin closed, then terminated)."""
        self._stopped = True
        async with self._lock:
            for handle in list(self._sessions):
                await self._close_seat(handle)

    async def release(self, handle: str) -> None:
        """The seat left this node: close its sessions."""
        async with self._lock:
            await self._close_seat(handle)

    async def _close_seat(self, handle: str) -> None:
        sessions = self._sessions.pop(handle, {})
        for session in sessions.values():
            await session.close()
        if sessions:
            log.info("tool_sessions_closed", extra={"seat": handle, "servers": sorted(sessions)})

    # -- Toolbox -----------------------------------------------------------------------------

    async def specs(self, handle: str) -> list[ToolSpec]:
        sessions = await self._sessions_of(handle)
        for session in sessions:
            await session.settled.wait()
        return [tool.spec for session in sessions for tool in session.tools.values()]

    async def call(self, handle: str, call: ToolCall) -> ToolResult:
        started = time.monotonic()
        sessions = await self._sessions_of(handle)
        found = next(((s, s.tools[call.name]) for s in sessions if call.name in s.tools), None)
        if found is None:
            server = call.name.split(NAME_SEPARATOR, 1)[0] if NAME_SEPARATOR in call.name else ""
            down = next((s for s in sessions if s.server.name == server), None)
            why = (
                f"tool server {server} is not running; try again later"
                if down is not None and not down.up
                else f"no tool named {call.name} is available to this seat"
            )
            return self._failed(call, server, call.name, started, why)
        session, tool = found
        client = session.client
        if client is None:
            return self._failed(call, tool.server, tool.name, started, f"tool server {tool.server} is not running")
        timeout_s = self.settings.call_timeout_s
        try:
            with anyio.fail_after(timeout_s):
                result = await client.call_tool(tool.name, call.arguments)
        except TimeoutError:
            return self._failed(call, tool.server, tool.name, started, f"the tool did not answer within {timeout_s:g}s")
        except MCPError as exc:
            if exc.error.code == mcp_types.CONNECTION_CLOSED:
                session.suspect(client)
            return self._failed(call, tool.server, tool.name, started, failure_text(exc))
        except (Exception, ExceptionGroup) as exc:
            session.suspect(client)
            return self._failed(call, tool.server, tool.name, started, failure_text(exc))
        text, images = result_content(result)
        content = clip(text, RESULT_MAX_BYTES)
        error = (content or "the tool reported an error") if result.is_error else None
        return ToolResult(
            ok=not result.is_error,
            content=content,
            images=images,
            bytes=len(content.encode("utf-8")) + sum(len(image.data) for image in images),
            server=tool.server,
            tool=tool.name,
            duration_s=time.monotonic() - started,
            error=redact(error)[:2000] if error else None,
        )

    def _failed(self, call: ToolCall, server: str, tool: str, started: float, error: str) -> ToolResult:
        log.info("tool_call_failed", extra={"server": server, "tool": tool, "call_id": call.id, "error": error})
        return ToolResult(
            ok=False, content=error, bytes=len(error.encode("utf-8")), server=server, tool=tool,
            duration_s=time.monotonic() - started, error=error,
        )

    async def _sessions_of(self, handle: str) -> list[McpSession]:
        """The seat's sessions for the servers the current company grants it, opening and closing to match."""
        if self.holder.epoch != self._checked_epoch:
            self.check_variables()
        org = self.holder.current()
        seat = org.seat_by_handle(handle)
        granted = {s.name: s for s in org.granted_servers(seat)} if seat is not None and seat.is_agent else {}
        async with self._lock:
            if self._stopped:
                return []
            current = self._sessions.setdefault(handle, {})
            for name in [n for n, s in current.items() if granted.get(n) != s.server]:
                await current.pop(name).close()
            for name, server in granted.items():
                if name not in current and seat is not None:
                    session = McpSession(self, seat, server)
                    current[name] = session
                    session.start()
            if not current:
                self._sessions.pop(handle, None)
            return [current[name] for name in granted if name in current]

    async def emit(self, body: Any) -> None:
        if self.emitter is not None:
            await self.emitter.emit(body, trace_of(), log_event="tool_server_publish_failed")

    def running(self) -> dict[str, list[str]]:
        """Each seat with the servers its sessions are up with right now (health, tests)."""
        return {h: sorted(n for n, s in ss.items() if s.up) for h, ss in self._sessions.items()}


def services(engine: "Engine") -> list[Service]:
    """The :data:`SEAT_TOOLS` service: this node's :class:`McpToolbox`.

    After the event store's writer, so what it publishes is stored; the seat
    runtime starts after it (and so stops before it), so no turn holds a
    session that is being closed.
    """

    def make(engine: "Engine") -> McpToolbox:
        node = engine.settings.node
        return McpToolbox(
            engine.company, settings=engine.settings.tools, emitter=engine.emitter,
            placed=lambda seat: seat.placement.allows(node.id, node.labels),
        )

    return [Service(SEAT_TOOLS, make, after=(EVENT_STORE,))]


__all__ = ["McpToolbox", "RESULT_MAX_BYTES", "SEAT_TOOLS", "clip", "result_content", "services"]
