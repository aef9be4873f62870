"""A small real MCP server that keeps notes as files: the offline example of giving a seat tools.

Run by the engine as a child over stdio (``mcp_servers: {notes: {command:
[python, -m, seats.tools.examples.notes_server], env: {NOTES_DIR: var/notes}}}``)
it offers three tools — ``write_note``, ``read_note`` and ``list_notes`` —
that write and read UTF-8 files under ``NOTES_DIR`` (the two that only read
say so: ``readOnlyHint: true``, so a turn that only read them and failed is
worked again). It is written with the
official ``mcp`` SDK's :class:`~mcp.server.mcpserver.MCPServer`, exactly as a
company would write its own tool server, so the README's example, the tests
and the benchmark exercise a real server rather than a stand-in.

``--http PORT`` serves the same tools over streamable HTTP on 127.0.0.1 instead.
"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

#: What a tool that changes nothing says of itself (a turn's ledger row waits for a tool that can).
READ_ONLY = ToolAnnotations(read_only_hint=True)

#: Where the notes are written; relative paths are taken from the server's working directory.
NOTES_DIR_ENV = "NOTES_DIR"
_TITLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,99}")


def notes_dir() -> Path:
    """The notes directory named by ``NOTES_DIR`` (``notes`` when unset), created on first use."""
    path = Path(os.environ.get(NOTES_DIR_ENV) or "notes")
    path.mkdir(parents=True, exist_ok=True)
    return path


def note_path(title: str) -> Path:
    """The file of the note called ``title``; a title that could leave the directory is refused.

    Refusals are :class:`ToolError`: the SDK hands their message to the model
    (which can correct itself), where any other exception is a crash it hides.
    """
    if not _TITLE.fullmatch(title) or ".." in title:
        raise ToolError(f"a note title is 1-100 letters, digits, spaces, '_', '.' or '-' (got {title!r})")
    return notes_dir() / f"{title}.md"


def build() -> MCPServer:
    """The notes server with its three tools."""
    # WARNING: its stderr is the engine's log stream, which wants no line per call.
    server = MCPServer("notes", instructions="Write, read and list short notes kept as files.", log_level="WARNING")

    @server.tool()
    def write_note(title: str, text: str) -> str:
        """Write (or replace) the note called ``title`` with ``text``."""
        path = note_path(title)
        path.write_text(text, encoding="utf-8")
        return f"wrote {len(text.encode('utf-8'))} bytes to {path.name}"

    @server.tool(annotations=READ_ONLY)
    def read_note(title: str) -> str:
        """The text of the note called ``title``."""
        path = note_path(title)
        if not path.exists():
            raise ToolError(f"there is no note called {title!r}")
        return path.read_text(encoding="utf-8")

    @server.tool(annotations=READ_ONLY)
    def list_notes() -> list[str]:
        """The titles of every note, in order."""
        return sorted(p.stem for p in notes_dir().glob("*.md"))

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT")
    args = parser.parse_args()
    server = build()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
