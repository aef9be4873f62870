"""Each seat's MCP tools: one session per (seat, server), kept open across turns on the node holding the seat.

The company names its MCP servers once (``mcp_servers``) and grants them per
seat (``seats[].tools``). :class:`McpToolbox` is the :class:`~seats.tools.base.Toolbox`
a turn calls: the first time a seat's turn asks for its tools, a supervised
session is opened to each server the seat is granted — a child process over
stdio, or streamable HTTP — with the official ``mcp`` SDK's :class:`mcp.Client`,
and it stays open for the seat's later turns. A seat's sessions are its own
(a server's state — a login, a cursor — is never shared between seats) and
live only on the node that runs the seat's turns.

Each session is a task that owns its client from open to close (the SDK's
anyio scopes must be entered and left by one task):

* it starts the server, lists its tools and publishes them under
  ``<server>__<tool>`` — within the vendors' tool-name rule
  (``^[a-zA-Z0-9_-]{1,64}$``), sanitised and de-duplicated, the mapping kept so
  a call reaches the server's own name;
* a server that cannot start within ``tools.start_timeout_s`` is reported
  ONCE (``tool_server_unavailable``) and the seat's turns run without it,
  while starts are retried with a backoff doubling from
  ``tools.restart_backoff_s`` to a minute;
* a session that ends on its own — the stdio server's output closed (it
  died), or a failed call after which the server no longer answers a ping
  (an HTTP server gone) — is started again after that backoff and
  ``tool_server_restarted`` says so;
* it is closed when the seat is released (:meth:`McpToolbox.release`), when
  an applied company no longer grants the server or changed it, and when the
  node stops.

A stdio server's stderr is not the node's: it goes to a pipe read line by
line into ``tool_server_stderr`` records (the seat, the server, the line), each
line redacted (:func:`crewlet.base.redact.redact`) and cut to
:data:`STDERR_LINE_MAX_CHARS`, so what a server prints — its own config with a
key in it, half a line, binary — reaches the log as one structured, safe
record per line, in whichever format the node logs, never as raw text in it.

A call never raises for a tool's failure: an error the tool reports, a
protocol error, a server that is down, or a call past ``tools.call_timeout_s``
is a :class:`~seats.tools.base.ToolResult` with ``ok=False`` and the reason,
which the model sees.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import time
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional, TextIO

import anyio
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from crewlet.company.conf import ToolSettings
from crewlet.engine.core import Service
from crewlet.queue.emit import Emitter
from crewlet.events.types import ToolServerRestarted, ToolServerUnavailable
from crewlet.engine.interfaces import EVENT_STORE
from crewlet.base.logfmt import short_reason
from crewlet.company.org import CompanyHolder, McpServer, Seat
from crewlet.base.redact import redact
from crewlet.events.tracing import trace_of
from seats.tools.base import SEAT_TOOLS, ToolCall, ToolResult, ToolSpec

if TYPE_CHECKING:  # pragma: no cover
    from crewlet.engine.core import Engine
    from mcp.client._transport import TransportStreams

log = logging.getLogger("crewlet.seats.tools")

#: Between a server's name and its tool's in the name the model sees.
NAME_SEPARATOR = "__"
#: The vendors' tool-name rule (OpenAI and Anthropic both): what every exposed name matches.
TOOL_NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NOT_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_MAX_NAME = 64
#: The longest wait between restarts of a server (or ``tools.restart_backoff_s`` when that is longer).
RESTART_BACKOFF_CAP_S = 60.0
#: A tool result longer than this (UTF-8 bytes) is cut before the model sees it: one answer must not fill its context.
RESULT_MAX_BYTES = 100_000
#: How long the liveness check after a failed call may take before the session counts as gone.
PING_TIMEOUT_S = 5.0

#: A stdio server's stderr line longer than this (characters, after redaction) is cut in its log record.
STDERR_LINE_MAX_CHARS = 2000
#: How much of one stderr line is held (bytes) while waiting for its newline; past it the line is logged cut
#: and the rest of it, up to its newline, is read and dropped, so a server writing no newline cannot fill memory.
STDERR_LINE_MAX_BYTES = 64 * 1024
#: How much is read from a stderr pipe at once.
_STDERR_CHUNK_BYTES = 64 * 1024
#: How long a closed session waits for the last of its server's stderr once the server is stopped.
STDERR_DRAIN_S = 2.0

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


def result_text(result: mcp_types.CallToolResult) -> str:
    """What a tool returned, as the text a model reads: text blocks as they are, other blocks as their JSON."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        else:
            parts.append(block.model_dump_json(by_alias=True, exclude_none=True))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


def clip(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes (on a character boundary), saying how much was cut."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    note = f"\n[cut: {len(raw) - max_bytes} more bytes]"
    return raw[: max(0, max_bytes - len(note))].decode("utf-8", errors="ignore") + note


def _reason(exc: BaseException) -> str:
    """A failure in one storable line with no credential in it (an SDK error may quote a URL or a header)."""
    if isinstance(exc, MCPError):
        return redact(exc.error.message or short_reason(exc))
    if isinstance(exc, ExceptionGroup) and exc.exceptions:
        return _reason(exc.exceptions[0])
    return redact(short_reason(exc))


class _WatchedRead:
    """A transport's read stream that says when it ends: for stdio, the server's output closing, which is its death."""

    def __init__(self, inner: Any, ended: asyncio.Event) -> None:
        self._inner = inner
        self._ended = ended

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended.set()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> "_WatchedRead":
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError):
            self._ended.set()
            raise

    async def __aenter__(self) -> "_WatchedRead":
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Optional[bool]:
        self._ended.set()
        result: Optional[bool] = await self._inner.__aexit__(*exc)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@asynccontextmanager
async def _watched(
    transport: AbstractAsyncContextManager["TransportStreams"], ended: asyncio.Event
) -> AsyncIterator["TransportStreams"]:
    async with transport as (read, write):
        yield _WatchedRead(read, ended), write


def _env_of(server: McpServer, environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The child's extra environment: the plain ``env`` settings, and each ``env_from`` variable as this node has it."""
    source = os.environ if environ is None else environ
    env = dict(server.env)
    for name in server.env_from:
        if name in source:
            env[name] = source[name]
    return env


def _headers_of(server: McpServer) -> dict[str, str]:
    """Each ``headers_from`` header with its value read from this node's environment (an unset variable sends no header)."""
    return {header: os.environ[var] for header, var in server.headers_from.items() if var in os.environ}


def unset_variables(server: McpServer) -> list[str]:
    """The variables ``env_from`` and ``headers_from`` name that this node's environment does not set (names, never values)."""
    named = [*server.env_from, *server.headers_from.values()]
    return sorted({name for name in named if name not in os.environ})


def _log_stderr_line(seat: str, server: str, raw: bytes, cut: bool) -> None:
    """One stderr line as a ``tool_server_stderr`` record: decoded, redacted, then cut; a blank line says nothing."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if not text.strip():
        return
    # Redacted before it is cut, so a credential the cut would halve is still recognised whole.
    text = redact(text)
    if len(text) > STDERR_LINE_MAX_CHARS:
        text, cut = text[:STDERR_LINE_MAX_CHARS], True
    fields: dict[str, Any] = {"seat": seat, "server": server, "line": text}
    if cut:
        fields["cut"] = True
    log.info("tool_server_stderr", extra=fields)


async def _read_stderr(stream: asyncio.StreamReader, seat: str, server: str) -> None:
    """Log each line the server writes to ``stream`` until it closes, holding at most :data:`STDERR_LINE_MAX_BYTES`."""
    pending = b""
    dropping = False  # inside a line already logged cut: the rest of it, up to its newline, is dropped
    while chunk := await stream.read(_STDERR_CHUNK_BYTES):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if not dropping:
                _log_stderr_line(seat, server, line, cut=False)
            dropping = False
        if len(pending) > STDERR_LINE_MAX_BYTES:
            if not dropping:
                _log_stderr_line(seat, server, pending[:STDERR_LINE_MAX_BYTES], cut=True)
            dropping, pending = True, b""
    if pending and not dropping:
        _log_stderr_line(seat, server, pending, cut=False)


@asynccontextmanager
async def server_stderr(seat: str, server: str) -> AsyncIterator[TextIO]:
    """A pipe for a stdio server's stderr (the file to hand the SDK as ``errlog``), read into ``tool_server_stderr`` records.

    Inherited, a server's stderr would be the node's own: raw bytes with no
    redaction, no length bound and no structure, in the middle of a JSON log
    stream. The write end is this process's until the block ends (the child
    holds its own copy); then it is closed, and what the stopped server wrote
    last is read for at most :data:`STDERR_DRAIN_S` — a descendant still
    holding the pipe open cannot keep the session from closing.
    """
    read_fd, write_fd = os.pipe()
    errlog = os.fdopen(write_fd, "w", encoding="utf-8")
    try:
        pipe = os.fdopen(read_fd, "rb", buffering=0)
    except BaseException:
        os.close(read_fd)
        errlog.close()
        raise
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader()
    try:
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), pipe)
    except BaseException:
        pipe.close()
        errlog.close()
        raise
    reader = asyncio.create_task(_read_stderr(stream, seat, server), name=f"mcp-stderr:{seat}:{server}")
    try:
        yield errlog
    finally:
        errlog.close()
        # Shielded and bounded: the session may be closing because it was cancelled.
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(STDERR_DRAIN_S):
                await asyncio.wait({reader})
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        transport.close()


@asynccontextmanager
async def open_transport(server: McpServer, ended: asyncio.Event, *, seat: str = "") -> AsyncIterator["TransportStreams"]:
    """The SDK transport to ``server`` (stdio child or streamable HTTP), its read side watched for its end.

    A stdio child's stderr is read into ``tool_server_stderr`` records under
    ``seat`` and the server's name (:func:`server_stderr`), never inherited.
    """
    if server.command:
        params = StdioServerParameters(command=server.command[0], args=list(server.command[1:]), env=_env_of(server))
        async with server_stderr(seat, server.name) as errlog:
            async with _watched(stdio_client(params, errlog=errlog), ended) as streams:
                yield streams
        return
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(create_mcp_http_client(headers=_headers_of(server)))
        streams = await stack.enter_async_context(_watched(streamable_http_client(server.url, http_client=http), ended))
        yield streams


@dataclass(frozen=True)
class _Tool:
    server: str
    name: str
    spec: ToolSpec


class _Session:
    """One seat's session with one MCP server, owned from open to close by its supervising task."""

    def __init__(self, box: "McpToolbox", seat: Seat, server: McpServer) -> None:
        self.box = box
        self.seat = seat
        self.server = server
        self.client: Optional[Client] = None
        self.tools: dict[str, _Tool] = {}
        #: Set once the first start attempt has an outcome (up or not), so a turn waits for it once.
        self.settled = asyncio.Event()
        self._ended = asyncio.Event()
        self._task: Optional[asyncio.Task[None]] = None
        self._checking: Optional[asyncio.Task[None]] = None
        self._end_reason = ""

    @property
    def up(self) -> bool:
        return self.client is not None

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.seat.handle}:{self.server.name}")

    async def close(self) -> None:
        for task in (self._checking, self._task):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self.client = None
        self.tools = {}

    # -- the supervising task ------------------------------------------------------------

    async def _supervise(self) -> None:
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
                error = _reason(exc)
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
        unset = unset_variables(self.server)
        if unset and attempt == 1:
            log.warning(
                "tool_server_variable_unset",
                extra={"seat": self.seat.handle, "server": self.server.name, "variables": unset},
            )
        deadline = anyio.current_time() + self.box.settings.start_timeout_s
        with anyio.CancelScope(deadline=deadline) as scope:
            async with Client(open_transport(self.server, self._ended, seat=self.seat.handle)) as client:
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

    async def _list(self, client: Client) -> dict[str, _Tool]:
        tools: dict[str, _Tool] = {}
        cursor: Optional[str] = None
        while True:
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                name = exposed_name(self.server.name, tool.name, set(tools))
                spec = ToolSpec(name=name, description=tool.description or "", input_schema=dict(tool.input_schema))
                tools[name] = _Tool(server=self.server.name, name=tool.name, spec=spec)
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


class McpToolbox:
    """This node's seats' MCP sessions, as the :class:`~seats.tools.base.Toolbox` a turn calls.

    Reads the company current per call (``holder.current()``), so an applied
    revision that grants, revokes or changes a server takes effect at the
    seat's next turn: a revoked or changed server's session is closed, a new
    grant opened.
    """

    def __init__(
        self, holder: CompanyHolder, *, settings: Optional[ToolSettings] = None, emitter: Optional[Emitter] = None
    ) -> None:
        self.holder = holder
        self.settings = settings or ToolSettings()
        self.emitter = emitter
        self._sessions: dict[str, dict[str, _Session]] = {}
        self._lock = asyncio.Lock()
        self._stopped = False

    # -- Lifecycle (an engine service) -----------------------------------------------------

    async def start(self) -> None:
        """Nothing to open yet: a seat's sessions open at its first turn on this node."""

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
            return self._failed(call, tool.server, tool.name, started, _reason(exc))
        except (Exception, ExceptionGroup) as exc:
            session.suspect(client)
            return self._failed(call, tool.server, tool.name, started, _reason(exc))
        content = clip(result_text(result), RESULT_MAX_BYTES)
        error = (content or "the tool reported an error") if result.is_error else None
        return ToolResult(
            ok=not result.is_error,
            content=content,
            bytes=len(content.encode("utf-8")),
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

    async def _sessions_of(self, handle: str) -> list[_Session]:
        """The seat's sessions for the servers the current company grants it, opening and closing to match."""
        org = self.holder.current()
        seat = org.seat_by_handle(handle)
        granted = {s.name: s for s in org.mcp_servers_of(seat)} if seat is not None and seat.is_agent else {}
        async with self._lock:
            if self._stopped:
                return []
            current = self._sessions.setdefault(handle, {})
            for name in [n for n, s in current.items() if granted.get(n) != s.server]:
                await current.pop(name).close()
            for name, server in granted.items():
                if name not in current and seat is not None:
                    session = _Session(self, seat, server)
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
        return McpToolbox(engine.company, settings=engine.settings.tools, emitter=engine.emitter)

    return [Service(SEAT_TOOLS, make, after=(EVENT_STORE,))]


__all__ = [
    "McpToolbox",
    "NAME_SEPARATOR",
    "SEAT_TOOLS",
    "STDERR_LINE_MAX_BYTES",
    "STDERR_LINE_MAX_CHARS",
    "TOOL_NAME_RULE",
    "ToolServerError",
    "clip",
    "exposed_name",
    "open_transport",
    "result_text",
    "server_stderr",
    "services",
    "unset_variables",
]
