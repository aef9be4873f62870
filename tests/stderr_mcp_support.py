"""Stdio MCP servers that misbehave on stderr, for the tests of how a node logs a tool server's stderr.

``noisy`` writes :data:`NOISE` to its stderr — a vendor key, a bearer token, a
NUL and an escape sequence, a blank line, a line far past any sane length, and
a last line with no newline — then serves ``mcp_support``'s real tools.
``broken`` writes the same, then answers each of the client's requests with a
JSON-RPC error whose message holds :data:`FORGED` lines, a NUL and a key, as a
vendor's error might; it never starts. The secrets are put together when the
script runs, so no company file or command line quotes one.
"""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
MCP_SUPPORT = HERE.parent / "mcp_support.py"

#: A vendor key and a bearer token, as a server's own log might quote them (assembled, never written down whole).
VENDOR_KEY = "sk" + "-proj-" + "Qm4Zt8Lw2Rx6Ny0Pv3Ks"
BEARER = "opaque" + "-stderr-bearer-" + "9c1d77e0"
#: A long line: far past the node's per-line bound.
LONG_LINE_CHARS = 100_000
#: The last thing written, with no newline after it.
LAST_WORDS = "last words before stdin closes, no newline"
NOISE = (
    f"noisy server starting with OPENAI_API_KEY={VENDOR_KEY}\n"
    f"calling upstream with Authorization: Bearer {BEARER}\n"
    "a line with a NUL \x00 and an escape \x1b[31m in it\n"
    "\n"
    + "x" * LONG_LINE_CHARS + "\n"
)
#: A line a log reader would take for a record of its own, were it written raw.
FORGED = "ts=2026-01-01T00:00:00.000+00:00 level=critical logger=crewlet.engine.core event=engine_compromised node=forged"
REFUSAL = f"refused to start:\n{FORGED}\n{FORGED}\x00 with key {VENDOR_KEY}"


def command(mode: str) -> list[str]:
    """The company file's ``command`` for this server in ``mode`` (``noisy`` or ``broken``)."""
    return [sys.executable, str(HERE), mode]


def _broken() -> None:
    """Answer every request (``server/discover``, then the ``initialize`` a client falls back to) with the refusal."""
    for line in sys.stdin:  # until the client closes stdin, as a server does
        request = json.loads(line) if line.strip() else {}
        if "id" in request:
            error = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32603, "message": REFUSAL}}
            sys.stdout.write(json.dumps(error) + "\n")
            sys.stdout.flush()


def main() -> None:
    mode = sys.argv[1]
    sys.stderr.write(NOISE)
    sys.stderr.flush()
    try:
        if mode == "broken":
            _broken()
        else:
            sys.argv = [str(MCP_SUPPORT)]
            runpy.run_path(str(MCP_SUPPORT), run_name="__main__")
    finally:
        sys.stderr.write(LAST_WORDS)
        sys.stderr.flush()


if __name__ == "__main__":
    main()
