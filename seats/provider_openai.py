"""The ``openai`` kind: chat completions through the official ``openai`` SDK, at any OpenAI-compatible server.

The hosted API, vLLM, llama.cpp or Ollama at ``base_url``. The conversation
is rendered into chat messages per call, and the answer's tool calls, usage
and finish reason read back into a :class:`~seats.provider_base.Completion`.

OpenAI caches a repeated prompt prefix by itself (nothing to mark): the
usage's ``prompt_tokens_details.cached_tokens`` — part of ``prompt_tokens`` —
is recorded as the round's ``cache_read_tokens``, and its ``input_tokens``
counts those at :data:`CACHED_INPUT_RATE` of an input token (the discount on
the gpt-4o family; newer models discount more, so the count never runs short
of what was billed).
"""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, Optional, Sequence

from crewlet.events.types import STOP_END, STOP_MAX_TOKENS, STOP_REFUSAL, STOP_TOOL_USE
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
    import openai


def _arguments(raw: str) -> tuple[dict[str, Any], str]:
    """A call's JSON arguments as an object, or ``({}, why)`` when they are not one."""
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {}, "the tool call's arguments are not valid JSON"
    if not isinstance(value, dict):
        return {}, f"the tool call's arguments are a JSON {type(value).__name__}, not an object"
    return value, ""


#: A cached prompt token costs half an input token (OpenAI's automatic prompt caching).
CACHED_INPUT_RATE = 0.5

_OPENAI_STOP = {
    "stop": STOP_END,
    "length": STOP_MAX_TOKENS,
    "tool_calls": STOP_TOOL_USE,
    "function_call": STOP_TOOL_USE,
    "content_filter": STOP_REFUSAL,
}


def _images_shown(results: Sequence[tuple[str, ToolResult]]) -> Optional[dict[str, Any]]:
    """The images a round's tools returned, as one user message after its tool messages (None without any).

    Chat completions' tool messages take text only; a user message's content
    takes ``image_url`` parts, a data URL each, so the model sees the picture
    under the call that returned it.
    """
    parts: list[dict[str, Any]] = []
    for cid, result in results:
        if result.images:
            parts.append({"type": "text", "text": f"The image{'s' if len(result.images) > 1 else ''} tool call {cid} returned:"})
            parts.extend(
                {"type": "image_url", "image_url": {"url": f"data:{image.mime_type};base64,{image.data}"}} for image in result.images
            )
    return {"role": "user", "content": parts} if parts else None


class OpenAIProvider(VendorProvider):
    """Chat completions through the ``openai`` SDK, at ``base_url`` (which includes ``/v1``)."""

    vendor = "openai"

    def _open(self, api_key: str) -> openai.AsyncOpenAI:
        openai = sys.modules["openai"]
        return openai.AsyncOpenAI(api_key=api_key, base_url=self.base_url or None, timeout=self.timeout_s, max_retries=0)

    @staticmethod
    def render(request: ModelRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": request.system}]
        for m in request.messages:
            if m.role == ROLE_USER:
                out.append({"role": "user", "content": m.text})
            elif m.role == ROLE_ASSISTANT:
                said: dict[str, Any] = {"role": "assistant", "content": m.text or None}
                if m.calls:
                    said["tool_calls"] = [
                        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                        for c in m.calls
                    ]
                out.append(said)
            else:
                out.extend({"role": "tool", "tool_call_id": cid, "content": tool_text(r)} for cid, r in m.results)
                shown = _images_shown(m.results)
                if shown:
                    out.append(shown)
        return out

    async def complete(self, request: ModelRequest) -> Completion:
        where = self.base_url or "the OpenAI API"
        body: dict[str, Any] = {"model": self.model, "messages": self.render(request)}
        if request.tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}
                for t in request.tools
            ]
        if self.max_tokens:
            body["max_tokens"] = int(self.max_tokens)
        if request.seat:
            body["user"] = request.seat
        openai = await load_sdk("openai")
        try:
            answer = await within(self.timeout_s, self._connect().chat.completions.create(**body), where)
            choice = answer.choices[0]
        except (openai.OpenAIError, ProviderError, IndexError, TypeError) as exc:
            raise translate(exc, where, self._key) from None
        message = choice.message
        calls: list[ToolCall] = []
        invalid: dict[str, str] = {}
        for call in message.tool_calls or ():
            function = getattr(call, "function", None)
            if function is None:
                continue
            arguments, why = _arguments(function.arguments)
            calls.append(ToolCall(id=call.id, name=function.name, arguments=arguments))
            if why:
                invalid[call.id] = why
        stop = _OPENAI_STOP.get(str(choice.finish_reason or "stop"), STOP_END)
        refusal = None
        if message.refusal:
            stop, refusal = STOP_REFUSAL, {"category": "", "explanation": str(message.refusal)}
        elif stop == STOP_REFUSAL:
            refusal = {"category": "content_filter", "explanation": ""}
        usage = answer.usage
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        cached = min(int(getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", 0) or 0), prompt)
        return admitted(Completion(
            text=str(message.content or ""),
            calls=tuple(calls),
            input_tokens=billed_input(prompt - cached, cached, read_rate=CACHED_INPUT_RATE),
            cache_read_tokens=cached,
            output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            stop_reason=stop,
            model=str(answer.model or self.model),
            refusal=refusal,
            invalid=invalid,
        ))


__all__ = ["CACHED_INPUT_RATE", "OpenAIProvider"]
