"""The ``anthropic`` kind: the Messages API through the official ``anthropic`` SDK.

``base_url`` points it at a gateway or a compatible server. The conversation
is rendered into content blocks per call (a round's tool results as one user
message of ``tool_result`` blocks), and the answer's blocks, usage and stop
reason read back into a :class:`~seats.provider_base.Completion`.

Prompt caching: the system prompt (one text block) and the last tool
definition carry ``cache_control: {type: ephemeral}`` — the tools breakpoint
serves every turn of the seat (its system prompt names the conversation, so
it differs between conversations), the system one every round after a turn's
first. The usage's ``cache_read_input_tokens`` and
``cache_creation_input_tokens`` are recorded as the round's
``cache_read_tokens`` and ``cache_write_tokens``, and its ``input_tokens``
counts them as Anthropic bills them: reads at :data:`CACHE_READ_RATE`, writes
(the 5-minute cache) at :data:`CACHE_WRITE_RATE` of an input token.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from crewlet.events.types import (
    STOP_CONTEXT_EXCEEDED,
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_PAUSED,
    STOP_REFUSAL,
    STOP_TOOL_USE,
)
from seats.provider_base import (
    ROLE_ASSISTANT,
    ROLE_USER,
    Completion,
    ModelRequest,
    ProviderError,
    admitted,
    billed_input,
    tool_text,
)
from seats.provider_sdk import VendorProvider, load_sdk, translate, within
from seats.tools.base import ToolCall, ToolResult

if TYPE_CHECKING:
    import anthropic

#: The Messages API requires ``max_tokens``; this is it when the company names none.
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
#: What marks a prefix cacheable (the SDK's ``CacheControlEphemeralParam``: the 5-minute cache).
CACHE_CONTROL: dict[str, str] = {"type": "ephemeral"}
#: A cache read costs a tenth of an input token, a 5-minute cache write one and a quarter (Anthropic's pricing).
CACHE_READ_RATE = 0.1
CACHE_WRITE_RATE = 1.25


_ANTHROPIC_STOP = {
    "end_turn": STOP_END,
    "stop_sequence": STOP_END,
    "tool_use": STOP_TOOL_USE,
    "max_tokens": STOP_MAX_TOKENS,
    "refusal": STOP_REFUSAL,
    "pause_turn": STOP_PAUSED,
    "model_context_window_exceeded": STOP_CONTEXT_EXCEEDED,
}


def _result_content(result: ToolResult) -> str | list[dict[str, Any]]:
    """A ``tool_result``'s content: its text, or text and image blocks when the tool returned images."""
    if not result.images:
        return tool_text(result)
    text = tool_text(result)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks.extend(
        {"type": "image", "source": {"type": "base64", "media_type": image.mime_type, "data": image.data}}
        for image in result.images
    )
    return blocks


class AnthropicProvider(VendorProvider):
    """The Messages API through the ``anthropic`` SDK (``base_url`` for a gateway or a compatible server)."""

    vendor = "anthropic"
    default_max_tokens = ANTHROPIC_DEFAULT_MAX_TOKENS
    #: Whether the system prompt and the tool definitions are marked cacheable (a bench turns it off to compare).
    prompt_cache = True

    def _open(self, api_key: str) -> anthropic.AsyncAnthropic:
        anthropic = sys.modules["anthropic"]
        return anthropic.AsyncAnthropic(
            api_key=api_key, base_url=self.base_url or None, timeout=self.timeout_s, max_retries=0
        )

    @staticmethod
    def render(request: ModelRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in request.messages:
            if m.role == ROLE_USER:
                out.append({"role": "user", "content": m.text})
            elif m.role == ROLE_ASSISTANT:
                blocks: list[dict[str, Any]] = [{"type": "text", "text": m.text}] if m.text else []
                blocks.extend({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.calls)
                out.append({"role": "assistant", "content": blocks})
            else:
                out.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": cid, "content": _result_content(r), "is_error": not r.ok}
                            for cid, r in m.results
                        ],
                    }
                )
        return out

    async def complete(self, request: ModelRequest) -> Completion:
        where = self.base_url or "the Anthropic API"
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": int(self.max_tokens or ANTHROPIC_DEFAULT_MAX_TOKENS),
            "system": request.system,
            "messages": self.render(request),
        }
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in request.tools
            ]
        if self.prompt_cache:
            if request.system:
                body["system"] = [{"type": "text", "text": request.system, "cache_control": dict(CACHE_CONTROL)}]
            if request.tools:
                body["tools"][-1]["cache_control"] = dict(CACHE_CONTROL)
        if request.seat:
            body["metadata"] = {"user_id": request.seat}
        anthropic = await load_sdk("anthropic")
        try:
            answer = await within(self.timeout_s, self._connect().messages.create(**body), where)
        except (anthropic.AnthropicError, ProviderError, TypeError) as exc:
            raise translate(exc, where, self._key) from None
        texts: list[str] = []
        calls: list[ToolCall] = []
        invalid: dict[str, str] = {}
        for block in answer.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                arguments = block.input if isinstance(block.input, dict) else {}
                calls.append(ToolCall(id=block.id, name=block.name, arguments=arguments))
                if not isinstance(block.input, dict):
                    invalid[block.id] = "the tool call's input is not a JSON object"
        text = "".join(texts)
        stop = _ANTHROPIC_STOP.get(str(answer.stop_reason or "end_turn"), STOP_END)
        usage = answer.usage
        read = int(getattr(usage, "cache_read_input_tokens", 0) or 0)
        written = int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
        uncached = int(getattr(usage, "input_tokens", 0) or 0)
        return admitted(Completion(
            text=text,
            calls=tuple(calls),
            input_tokens=billed_input(uncached, read, written, read_rate=CACHE_READ_RATE, write_rate=CACHE_WRITE_RATE),
            cache_read_tokens=read,
            cache_write_tokens=written,
            output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
            stop_reason=stop,
            model=str(answer.model or self.model),
            refusal={"category": "", "explanation": text} if stop == STOP_REFUSAL else None,
            invalid=invalid,
        ))


__all__ = ["ANTHROPIC_DEFAULT_MAX_TOKENS", "AnthropicProvider", "CACHE_CONTROL", "CACHE_READ_RATE", "CACHE_WRITE_RATE"]
