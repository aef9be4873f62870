"""A real MCP server that says which credentials it was given: over stdio by default, ``--http PORT`` for streamable HTTP.

``variable`` answers the value of one of its environment variables (what a
stdio child was started with), ``header`` the value of one header of the
HTTP request that called it (what a streamable-HTTP session sends), and
``pid`` names the process, so a test sees which seat's session reached
which process with which token.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mcp_support import _serve_http, script_over_http  # noqa: E402  (the tests folder, also when run as a script)

HERE = Path(__file__).resolve()


def build() -> MCPServer:
    server = MCPServer("granttools", log_level="WARNING")

    @server.tool()
    def variable(name: str) -> str:
        """The value of this server's environment variable ``name`` ("" when unset)."""
        return os.environ.get(name, "")

    @server.tool()
    def header(name: str, ctx: Context) -> str:
        """The value of header ``name`` of the HTTP request this call came in ("" over stdio or when absent)."""
        request = ctx.request_context.request
        headers = getattr(request, "headers", None)
        return str(headers.get(name, "")) if headers is not None else ""

    @server.tool()
    def pid() -> int:
        """This server's process id."""
        return os.getpid()

    return server


def stdio_command() -> list[str]:
    """The company file's ``command`` for this server over stdio."""
    return [sys.executable, str(HERE)]


def http_server() -> "contextlib.AbstractContextManager[str]":
    """This server over streamable HTTP in a child process, accepting any caller; yields its URL once it accepts connections."""
    return script_over_http(HERE)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    args = parser.parse_args()
    server = build()
    if args.http:
        _serve_http(server, args.http, None)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
