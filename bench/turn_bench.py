"""A tool call through a seat's MCP session, against a bare ``mcp`` client calling the same tool in the same run.

    .venv/bin/python bench/turn_bench.py --calls 300

Needs nothing but the venv: the tool is the offline example's notes server
(``seats/tools/examples/notes_server.py``) over stdio, writing under a
temporary directory, and every figure comes from the same run:

1. baseline: a bare ``mcp.Client`` over ``StdioServerParameters`` calling
   ``write_note`` ``--calls`` times, one after another.
2. toolbox: the same calls through :class:`seats.tools.mcp.McpToolbox` (what a
   turn calls) to its own session with the same server: the exposed-name
   lookup, the call timeout, the result's text, clipping and bytes.

3. turn loop: one turn of :class:`seats.turns.TurnRunner` whose scripted echo
   model asks for one ``notes__write_note`` call per round, ``--rounds``
   rounds, then answers — the same tool through the same kind of session —
   timed per round; and the same turn against a toolbox that answers at once,
   so the loop's own cost (building each round's request from the growing
   conversation, the model call, recording the round, the events it
   publishes on the in-memory queue) is shown apart from the tool's: the
   seconds inside the toolbox's calls are counted during the same turn.

The ratio toolbox / bare shows what the session manager adds per call; a
round minus its tool call is what the turn loop adds around the tool. Server
starts and ``WARMUP`` calls are not counted, and each side is measured
``ROUNDS`` times, alternating, keeping its best.
Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NOTES_COMMAND = [sys.executable, "-m", "seats.tools.examples.notes_server"]
#: Calls made before each clock starts: the server's first calls build its validators, the client's its caches.
WARMUP = 30
#: Each side is measured this many times, alternating, and its best run is kept: a loaded machine's noise only slows.
ROUNDS = 5


def arguments(i: int) -> dict[str, Any]:
    """One call's arguments: a distinct note each time, so every call really writes."""
    return {"title": f"bench-{i % 50}", "text": f"note number {i}"}


async def bare_rate(calls: int, notes_dir: str) -> float:
    """Calls per second of a bare ``mcp`` client to the notes server."""
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(
        command=NOTES_COMMAND[0], args=NOTES_COMMAND[1:], env={"NOTES_DIR": notes_dir}, cwd=ROOT
    )
    async with Client(params) as client:
        await client.list_tools()
        for i in range(WARMUP):
            await client.call_tool("write_note", arguments(i))
        started = time.perf_counter()
        for i in range(calls):
            result = await client.call_tool("write_note", arguments(i))
            assert not result.is_error, result
        return calls / (time.perf_counter() - started)


async def toolbox_rate(calls: int, notes_dir: str) -> float:
    """Calls per second of :class:`McpToolbox` for one seat granted the notes server."""
    from crewlet.company.org import CompanyHolder
    from crewlet.company.parse import parse_company
    from seats.tools import ToolCall
    from seats.tools.mcp import McpToolbox

    org = parse_company(
        {
            "org": "bench",
            "mcp_servers": {"notes": {"command": NOTES_COMMAND, "env": {"NOTES_DIR": notes_dir}}},
            "seats": [{"handle": "ada", "kind": "agent", "role": "engineer", "tools": ["notes"]}],
        }
    )
    box = McpToolbox(CompanyHolder(org))
    try:
        await box.specs("ada")
        for i in range(WARMUP):
            await box.call("ada", ToolCall(id=f"w{i}", name="notes__write_note", arguments=arguments(i)))
        started = time.perf_counter()
        for i in range(calls):
            result = await box.call("ada", ToolCall(id=f"c{i}", name="notes__write_note", arguments=arguments(i)))
            assert result.ok, result
        return calls / (time.perf_counter() - started)
    finally:
        await box.stop()


class _Instant:
    """A toolbox whose one tool answers at once: the loop's cost with no tool behind it."""

    async def specs(self, handle: str) -> list[Any]:
        from seats.tools import ToolSpec

        return [ToolSpec(name="notes__write_note", description="", input_schema={"type": "object"})]

    async def call(self, handle: str, call: Any) -> Any:
        from seats.tools import ToolResult

        return ToolResult(ok=True, content="ok", bytes=2, server="notes", tool="write_note", duration_s=0.0)


class _Timed:
    """A toolbox wrapped so the seconds spent inside its calls are counted apart from the loop around them."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.in_calls_s = 0.0

    async def specs(self, handle: str) -> Any:
        return await self.inner.specs(handle)

    async def call(self, handle: str, call: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self.inner.call(handle, call)
        finally:
            self.in_calls_s += time.perf_counter() - started


async def loop_round_s(rounds: int, notes_dir: str, *, instant: bool = False) -> tuple[float, float]:
    """One turn whose scripted model makes one notes call a round: (seconds per round, of which in the tool call)."""
    import django

    django.setup()
    from crewlet import events
    from crewlet.events.types import ExternalNotification
    from crewlet.company.org import CompanyHolder
    from crewlet.company.parse import parse_company
    from crewlet.queue.memory import MemoryBroker
    from crewlet.events.tracing import Trace
    from seats.tools.mcp import McpToolbox
    from seats.turn_types import Trigger
    from seats.turns import TurnRunner

    step = {"tool": "notes__write_note", "arguments": {"title": "bench", "text": "{trigger}"}}
    org = parse_company(
        {
            "org": "bench",
            "providers": {"llm": [{"kind": "echo", "script": [step] * rounds + [{"answer": "done"}]}]},
            "mcp_servers": {"notes": {"command": NOTES_COMMAND, "env": {"NOTES_DIR": notes_dir}}},
            "seats": [{"handle": "ada", "kind": "agent", "role": "engineer", "tools": ["notes"], "max_rounds": 100}],
        }
    )
    holder = CompanyHolder(org)
    inner: Any = _Instant() if instant else McpToolbox(holder)
    box = _Timed(inner)
    queue = MemoryBroker().client(node="bench")
    runner = TurnRunner(queue, holder, toolbox=box)
    seat = org.seat_by_handle("ada")
    assert seat is not None
    wake = events.new(ExternalNotification(seat="ada", sender="sam", body="note this"), Trace.root(), extras={"body": "note this"})
    try:
        await runner.run(seat, Trigger(events=[wake]))  # opens the session and warms both sides
        box.in_calls_s = 0.0
        started = time.perf_counter()
        result = await runner.run(seat, Trigger(events=[wake]))
        elapsed = time.perf_counter() - started
        assert result.ok and len(result.tool_calls) == rounds and all(c["ok"] for c in result.tool_calls), result
        return elapsed / (rounds + 1), box.in_calls_s / (rounds + 1)  # the answering round is a round too
    finally:
        if not instant:
            await inner.stop()
        await runner.emitter.close()
        await queue.close()


async def main(calls: int, rounds: int = 50) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crewlet.settings")
    os.environ.setdefault("CREWLET_LOG_LEVEL", "WARNING")
    with tempfile.TemporaryDirectory() as bare_dir, tempfile.TemporaryDirectory() as box_dir:
        print(f"turn bench: {calls} notes__write_note calls over stdio, {os.cpu_count()} cores")
        bare, ours = 0.0, 0.0
        for _ in range(ROUNDS):
            bare = max(bare, await bare_rate(calls, bare_dir))
            ours = max(ours, await toolbox_rate(calls, box_dir))
    print(f"{'bare mcp.Client call_tool':<40} {bare:>10.1f} calls/s  ({1e3 / bare:.2f} ms per call)")
    print(f"{'McpToolbox.call (a seat session)':<40} {ours:>10.1f} calls/s  ({1e3 / ours:.2f} ms per call)")
    print(f"{'ratio toolbox / bare':<40} {ours / bare:>10.3f}x  (each call costs {1e3 / ours - 1e3 / bare:.3f} ms more)")
    with tempfile.TemporaryDirectory() as loop_dir:
        mcp_round, mcp_tool = min([await loop_round_s(rounds, loop_dir) for _ in range(ROUNDS)])
        instant_round, _ = min([await loop_round_s(rounds, loop_dir, instant=True) for _ in range(ROUNDS)])
    print(f"{f'turn, {rounds} rounds + answer (MCP tool)':<40} {mcp_round * 1e3:>10.2f} ms per round, "
          f"{mcp_tool * 1e3:.2f} ms of it in the tool call")
    print(f"{'the loop around the tool, per round':<40} {(mcp_round - mcp_tool) * 1e3:>10.2f} ms "
          f"({(mcp_round - mcp_tool) / mcp_round:.0%} of a round)")
    print(f"{'turn, instant tool (the loop alone)':<40} {instant_round * 1e3:>10.2f} ms per round")

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=50, help="rounds of the measured turn (tool calls before its answer)")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))
