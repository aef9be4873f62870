"""Each vendor's prompt cache as a provider sees it: what is marked, what is read back, and how it is billed."""
from __future__ import annotations

from typing import Any

from crewlet.company.org import Provider as ProviderConfig
from seats.provider_anthropic import AnthropicProvider
from seats.provider_base import Message, ModelRequest, billed_input
from seats.providers import build_provider
from seats.tools.base import ToolSpec
from prompt_cache_support import caching_anthropic
from seats_support import json_vendor

SYSTEM = "You are Ada. " + "Check the runbook before you answer. " * 200
TOOLS = [ToolSpec(name=f"docs__t{i}", description="Look it up.", input_schema={"type": "object"}) for i in range(3)]


def request(text: str) -> ModelRequest:
    return ModelRequest(system=SYSTEM, messages=[Message(role="user", text=text)], tools=TOOLS, seat="ada")


def test_cached_tokens_are_billed_at_the_vendors_fraction_rounded_up() -> None:
    assert billed_input(100, 1000, 0, read_rate=0.1, write_rate=1.25) == 200
    assert billed_input(100, 0, 1001, read_rate=0.1, write_rate=1.25) == 100 + 1252
    assert billed_input(7, 3, read_rate=0.5) == 9


async def test_anthropic_writes_the_marked_prefix_on_the_first_call_and_reads_it_on_the_next() -> None:
    with caching_anthropic() as server:
        provider = build_provider(ProviderConfig("anthropic", {"model": "claude-sonnet-4-5", "base_url": server.base_url}))
        try:
            first = await provider.complete(request("when is the deploy?"))
            second = await provider.complete(request("and the release?"))
        finally:
            await provider.aclose()
    written = server.usages[0]["cache_creation_input_tokens"]
    assert written > 1024 and (first.cache_read_tokens, first.cache_write_tokens) == (0, written)
    assert (second.cache_read_tokens, second.cache_write_tokens) == (written, 0)
    uncached = server.usages[1]["input_tokens"]
    assert second.input_tokens == uncached + -(-written // 10)  # reads at a tenth, rounded up


async def test_anthropic_without_prompt_cache_marks_nothing_and_every_token_is_billed_in_full() -> None:
    with caching_anthropic() as server:
        provider = build_provider(ProviderConfig("anthropic", {"model": "claude-sonnet-4-5", "base_url": server.base_url}))
        assert isinstance(provider, AnthropicProvider)
        provider.prompt_cache = False
        try:
            answers = [await provider.complete(request("when is the deploy?")) for _ in range(2)]
        finally:
            await provider.aclose()
    assert all(isinstance(body["system"], str) and "cache_control" not in body["tools"][-1] for body in server.requests)
    assert [(a.cache_read_tokens, a.cache_write_tokens) for a in answers] == [(0, 0), (0, 0)]
    assert [a.input_tokens for a in answers] == [u["input_tokens"] for u in server.usages]


async def test_openai_reports_its_automatic_cache_and_the_cached_part_of_the_prompt_is_billed_at_half() -> None:
    def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {
            "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4o",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Friday"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 5, "total_tokens": 1005,
                      "prompt_tokens_details": {"cached_tokens": 801}},
        }

    with json_vendor(answer) as url:
        provider = build_provider(ProviderConfig("openai", {"model": "gpt-4o", "base_url": url}))
        try:
            done = await provider.complete(request("when is the deploy?"))
        finally:
            await provider.aclose()
    assert (done.cache_read_tokens, done.cache_write_tokens, done.input_tokens) == (801, 0, 199 + 401)
