"""The transport to one MCP server: a child process over stdio, or streamable HTTP, its read side watched for its end.

A stdio server's stderr is not the node's: it goes to a pipe read line by
line into ``tool_server_stderr`` records (the seat, the server, the line), each
line redacted (:func:`crewlet.base.redact.redact`) and cut to
:data:`STDERR_LINE_MAX_CHARS`, so what a server prints — its own config with a
key in it, half a line, binary — reaches the log as one structured, safe
record per line, in whichever format the node logs, never as raw text in it.

A server's ``env_from`` and ``headers_from`` are read from this node's
environment as the transport opens, so a credential is never in the company
file and a rotated one is used at the next start. Each is read from the node
variable the seat's grant names for it (:class:`~crewlet.company.org.GrantedServer`),
so the child of seat A gets A's value under the server's variable name and
seat B's child B's; an unset one is left out, never filled from another's.
"""
from __future__ import annotations

import asyncio
import logging
import os
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping, Optional, TextIO

import anyio
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from crewlet.company.org import GrantedServer
from crewlet.base.redact import redact

if TYPE_CHECKING:  # pragma: no cover
    from mcp.client._transport import TransportStreams

log = logging.getLogger("crewlet.seats.tools")

#: A stdio server's stderr line longer than this (characters, after redaction) is cut in its log record.
STDERR_LINE_MAX_CHARS = 2000
#: How much of one stderr line is held (bytes) while waiting for its newline; past it the line is logged cut
#: and the rest of it, up to its newline, is read and dropped, so a server writing no newline cannot fill memory.
STDERR_LINE_MAX_BYTES = 64 * 1024
#: How much is read from a stderr pipe at once.
_STDERR_CHUNK_BYTES = 64 * 1024
#: How long a closed session waits for the last of its server's stderr once the server is stopped.
STDERR_DRAIN_S = 2.0


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


def _env_of(granted: GrantedServer, environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The child's extra environment: the plain ``env`` settings, and each ``env_from`` variable from the seat's node variable."""
    source = os.environ if environ is None else environ
    env = dict(granted.server.env)
    for name, var in granted.env_from.items():
        if var in source:
            env[name] = source[var]
    return env


def _headers_of(granted: GrantedServer) -> dict[str, str]:
    """Each ``headers_from`` header with the seat's value from this node's environment (an unset variable sends no header)."""
    return {header: os.environ[var] for header, var in granted.headers_from.items() if var in os.environ}


def unset_variables(granted: GrantedServer, environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The node variables the grant reads for its server that this node's environment does not set (names, never values)."""
    source = os.environ if environ is None else environ
    return [name for name in granted.variables() if name not in source]


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
async def open_transport(
    granted: GrantedServer, ended: asyncio.Event, *, seat: str = ""
) -> AsyncIterator["TransportStreams"]:
    """The SDK transport to the granted server (stdio child or streamable HTTP), its read side watched for its end.

    A stdio child's stderr is read into ``tool_server_stderr`` records under
    ``seat`` and the server's name (:func:`server_stderr`), never inherited.
    """
    server = granted.server
    if server.command:
        params = StdioServerParameters(command=server.command[0], args=list(server.command[1:]), env=_env_of(granted))
        async with server_stderr(seat, server.name) as errlog:
            async with _watched(stdio_client(params, errlog=errlog), ended) as streams:
                yield streams
        return
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(create_mcp_http_client(headers=_headers_of(granted)))
        streams = await stack.enter_async_context(_watched(streamable_http_client(server.url, http_client=http), ended))
        yield streams


__all__ = [
    "STDERR_DRAIN_S",
    "STDERR_LINE_MAX_BYTES",
    "STDERR_LINE_MAX_CHARS",
    "open_transport",
    "server_stderr",
    "unset_variables",
]
