"""A real MCP server the tool tests run, written with the ``mcp`` SDK: over stdio by default, ``--http PORT`` for streamable HTTP.

Its tools are what the tests need of a server: ``write`` really writes a file,
``fail`` reports a tool error, ``sleep`` outlives a call timeout, ``gate``
says it started and answers once a test opens it, ``pid`` names the
process so a test can kill it, and ``read.file`` has a name the
model vendors would refuse until it is sanitised (and is the one tool
annotated ``readOnlyHint: true`` besides ``picture``, which returns a caption, a PNG and an
embedded text resource). Over HTTP it refuses every
request whose ``Authorization`` header is not ``--require-auth``'s value, so
a session that starts proves the header went through. ``--handshake-only``
makes it a server of the handshake-era protocol (no ``server/discover``).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional
import contextlib

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import EmbeddedResource, ImageContent, TextContent, TextResourceContents, ToolAnnotations

HERE = Path(__file__).resolve()
#: A 1x1 PNG in base64: what the ``picture`` tool returns as image content.
PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def build() -> MCPServer:
    server = MCPServer("testtools", log_level="WARNING")

    @server.tool()
    def write(path: str, text: str) -> str:
        """Write ``text`` to the file at ``path``."""
        Path(path).write_text(text, encoding="utf-8")
        return f"wrote {path}"

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails with ``reason``."""
        raise ToolError(reason)

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Answers after ``seconds``."""
        await asyncio.sleep(seconds)
        return "awake"

    @server.tool()
    async def gate(path: str) -> str:
        """Writes ``path``.started, then answers once a file at ``path`` exists (at most 120 s)."""
        Path(path + ".started").write_text(str(os.getpid()), encoding="utf-8")
        for _ in range(2400):
            if Path(path).exists():
                return "opened"
            await asyncio.sleep(0.05)
        raise ToolError(f"{path} was not opened within 120 s")

    @server.tool()
    def pid() -> int:
        """This server's process id."""
        return os.getpid()

    @server.tool(name="read.file", annotations=ToolAnnotations(read_only_hint=True))
    def read_file(path: str) -> str:
        """The text of the file at ``path``."""
        return Path(path).read_text(encoding="utf-8")

    @server.tool(annotations=ToolAnnotations(title="A picture", read_only_hint=True, open_world_hint=False))
    def picture() -> list[Any]:
        """A one-pixel PNG, with a caption and the text resource it came from."""
        resource = TextResourceContents(uri="file:///pixel.txt", mime_type="text/plain", text="one red pixel")
        return [
            TextContent(type="text", text="here it is"),
            ImageContent(type="image", data=PIXEL_PNG, mime_type="image/png"),
            EmbeddedResource(type="resource", resource=resource),
        ]

    return server


def stdio_command() -> list[str]:
    """The company file's ``command`` for this server over stdio."""
    return [sys.executable, str(HERE)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http(port: int, require_auth: str) -> "subprocess.Popen[bytes]":
    """This server over streamable HTTP on ``port`` in a child process, returned once it accepts connections."""
    return start_script_http(HERE, port, "--require-auth", require_auth)


def start_script_http(script: Path, port: int, *args: str) -> "subprocess.Popen[bytes]":
    """The MCP test server ``script`` run with ``--http port`` and ``args`` in a child process, returned once it accepts connections."""
    from waiting_support import wait_until

    proc = subprocess.Popen([sys.executable, str(script), "--http", str(port), *args])

    def accepting() -> bool:
        assert proc.poll() is None, "the MCP test server exited"
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    try:
        wait_until(accepting, timeout_s=30, what="the MCP HTTP server accepting", ignoring=(OSError,))
    except BaseException:
        proc.kill()
        raise
    return proc


@contextlib.contextmanager
def script_over_http(script: Path, *args: str) -> Iterator[str]:
    """:func:`start_script_http` on a free port; yields the server's URL, and stops it after."""
    port = free_port()
    proc = start_script_http(script, port, *args)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def http_server(require_auth: str) -> "contextlib.AbstractContextManager[str]":
    """This server over streamable HTTP in a child process; yields its URL once it accepts connections."""
    return script_over_http(HERE, "--require-auth", require_auth)


def _serve_http(server: MCPServer, port: int, require_auth: Optional[str]) -> None:
    import uvicorn
    from starlette.responses import PlainTextResponse

    app = server.streamable_http_app()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and require_auth is not None:
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != require_auth:
                await PlainTextResponse("unauthorized", status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


def _serve_handshake_only() -> None:
    """A pre-2026 server over stdio, by hand: ``initialize``, ``tools/list`` (``pid``), ``tools/call``; nothing else.

    What the official TypeScript servers are to a client of the 2026 protocol:
    its ``server/discover`` probe is answered "method not found".
    """
    import json

    tool = {"name": "pid", "description": "This server's process id.", "inputSchema": {"type": "object"}}
    results = {
        "initialize": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "old", "version": "1"}},
        "tools/list": {"tools": [tool]},
        "tools/call": {"content": [{"type": "text", "text": str(os.getpid())}], "isError": False},
        "ping": {},
    }
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        method = request.get("method")
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        if method in results:
            answer["result"] = results[method]
        else:
            answer["error"] = {"code": -32601, "message": f"Method not found: {method}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    parser.add_argument("--require-auth")
    parser.add_argument("--handshake-only", action="store_true", help="answer no server/discover, as a pre-2026 server")
    args = parser.parse_args()
    if args.handshake_only:
        _serve_handshake_only()
        return
    server = build()
    if args.http:
        _serve_http(server, args.http, args.require_auth)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
