"""Billed input tokens of a 6-round Anthropic turn with prompt caching, against the same turn without it, in one run.

    .venv/bin/python bench/prompt_cache_bench.py --rounds 6 --tools 12

Needs nothing but the venv: the model is ``tests/prompt_cache_support.py``'s
local server speaking Anthropic's Messages API, whose usage reads the cache
when a request marks a prefix cacheable and it saw that prefix before (and
writes it when that prefix is new and at least 1024 tokens long), as
Anthropic's does. One turn of :class:`seats.turns.TurnRunner` with the
shipped :class:`~seats.provider_anthropic.AnthropicProvider` asks for one
tool call a round, ``--rounds`` rounds in all (the last one answers), with
``--tools`` tool definitions and a seat whose instructions run to a page:

1. baseline: the provider with ``prompt_cache`` off — no ``cache_control``;
   every round's whole prompt is billed as input;
2. cached: the same turn, on a fresh server, as shipped — the system prompt
   and the last tool definition marked ``cache_control: {type: ephemeral}``.

Each side prints the usage the server reported (uncached input, cache
reads, cache writes), summed over the rounds, and the billed input the turn
recorded (``agent_phase_completed.input_tokens``: cache reads at 0.1 of an
input token, writes at 1.25); the ratio cached / baseline is what caching
saves on this turn. Token counts are the server's word counts, not a
tokenizer's, so the ratio, not the absolute figure, is the point.
Nothing here asserts.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from prompt_cache_support import caching_anthropic  # type: ignore[import-not-found]  # noqa: E402 - tests/, on the path above

#: The seat's instructions: about a page, as a real seat's job description runs.
INSTRUCTIONS = " ".join(
    f"Rule {i}: when a teammate asks about the release train, check the tracker, the runbook and the on-call notes "
    f"before answering, and say which of them the answer came from." for i in range(1, 31)
)


class _Toolbox:
    """``count`` tool definitions with a paragraph of description each; every call answers at once."""

    def __init__(self, count: int) -> None:
        self.count = count

    async def specs(self, handle: str) -> list[Any]:
        from seats.tools import ToolSpec

        schema = {"type": "object", "properties": {"query": {"type": "string", "description": "what to look up"}}}
        return [
            ToolSpec(
                name=f"docs__lookup_{i}",
                description=f"Look up section {i} of the team's documentation: the runbooks, the release checklists, "
                "the on-call rota and the architecture notes, returning the matching paragraphs with their headings.",
                input_schema=schema,
                read_only=True,
            )
            for i in range(self.count)
        ]

    async def call(self, handle: str, call: Any) -> Any:
        from seats.tools import ToolResult

        text = f"section {call.name}: the release train leaves on Fridays at 10:00 UTC"
        return ToolResult(ok=True, content=text, bytes=len(text), server="docs", tool=call.name, duration_s=0.0)


async def one_turn(rounds: int, tools: int, cached: bool) -> dict[str, int]:
    """One turn against a fresh server: its usage summed over the rounds, and the billed input the turn recorded."""
    from crewlet import events
    from crewlet.company.org import CompanyHolder
    from crewlet.company.parse import parse_company
    from crewlet.events.tracing import Trace
    from crewlet.events.types import ExternalNotification
    from crewlet.queue.memory import MemoryBroker
    from seats.provider_anthropic import AnthropicProvider
    from seats.providers import build_provider
    from seats.turn_types import Trigger
    from seats.turns import TurnRunner

    step = {"calls": [["docs__lookup_0", {"query": "release train"}]]}
    with caching_anthropic(scripts={"ada": [step] * (rounds - 1) + [{"text": "Fridays, 10:00 UTC."}]}) as server:
        org = parse_company(
            {
                "org": "bench",
                "providers": {"llm": [{"kind": "anthropic", "model": "claude-sonnet-4-5", "base_url": server.base_url}]},
                "seats": [{"handle": "ada", "kind": "agent", "role": "engineer", "instructions": INSTRUCTIONS, "max_rounds": 100}],
            }
        )

        def provider(config: Any) -> Any:
            built = build_provider(config)
            if isinstance(built, AnthropicProvider):
                built.prompt_cache = cached
            return built

        queue = MemoryBroker().client(node="bench")
        runner = TurnRunner(queue, CompanyHolder(org), toolbox=_Toolbox(tools), provider_factory=provider)
        seat = org.seat_by_handle("ada")
        assert seat is not None
        body = "when does the release train leave?"
        wake = events.new(ExternalNotification(seat="ada", sender="sam", body=body), Trace.root(), extras={"body": body})
        try:
            result = await runner.run(seat, Trigger(events=[wake], partition_key="slack:D0SAM"))
        finally:
            await runner.emitter.close()
            await queue.close()
        assert result.ok and len(result.rounds) == rounds, result
        return {
            "uncached": sum(u["input_tokens"] for u in server.usages),
            "read": sum(u["cache_read_input_tokens"] for u in server.usages),
            "written": sum(u["cache_creation_input_tokens"] for u in server.usages),
            "billed": result.input_tokens,
        }


async def main(rounds: int, tools: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crewlet.settings")
    os.environ.setdefault("CREWLET_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    base = await one_turn(rounds, tools, cached=False)
    ours = await one_turn(rounds, tools, cached=True)
    print(f"prompt cache bench: one {rounds}-round Anthropic-shaped turn, {tools} tools, a page of instructions")
    for name, figures in (("baseline (no cache_control)", base), ("cached (system + last tool)", ours)):
        print(
            f"{name:<30} input {figures['uncached']:>7}  cache read {figures['read']:>7}  "
            f"cache write {figures['written']:>7}  billed input {figures['billed']:>7} tokens"
        )
    print(f"{'ratio cached / baseline':<30} {ours['billed'] / base['billed']:>7.3f}x billed input tokens")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the turn (the last one answers)")
    parser.add_argument("--tools", type=int, default=12, help="tool definitions offered on every round")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.tools))
