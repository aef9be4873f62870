"""The model providers a turn calls, one round at a time: the company's ``providers.llm`` entries made callable.

Three kinds, as the company file names them:

* ``echo`` — the demo model (:class:`EchoProvider`): deterministic, free,
  offline. It answers with the trigger; with a ``script`` it first asks for
  the scripted tool calls, one step per round, so the whole loop runs with no
  network.
* ``openai`` — the official ``openai`` SDK against any OpenAI-compatible
  chat-completions server (the hosted API, vLLM, llama.cpp, Ollama) at
  ``base_url`` (:mod:`seats.provider_openai`).
* ``anthropic`` — the official ``anthropic`` SDK's Messages API
  (:mod:`seats.provider_anthropic`).

:func:`build_provider` makes one entry of the chain; the turn tries them in
order on every round. What every provider speaks — the conversation, the
answer, the failure kinds — is :mod:`seats.provider_base`; what the two SDK
clients share (no retries of their own, errors translated, keys read at call
time and never shown) is :mod:`seats.provider_sdk`; how a round retries one
entry before the chain moves on is :mod:`seats.retry`.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Mapping, Optional, Sequence

from crewlet.events.types import STOP_END, STOP_TOOL_USE
from crewlet.company.org import Provider as ProviderConfig
from seats.provider_anthropic import AnthropicProvider
from seats.provider_base import (
    ERR_UNAVAILABLE,
    ROLE_ASSISTANT,
    ROLE_USER,
    Completion,
    Message,
    ModelProvider,
    ModelRequest,
    ProviderError,
    approx_tokens,
)
from seats.provider_openai import OpenAIProvider
from seats.provider_sdk import DEFAULT_TIMEOUT_S, VendorProvider
from seats.tools.base import ToolCall


def _trigger_text(messages: Sequence[Message]) -> str:
    return next((m.text for m in messages if m.role == ROLE_USER), "")


def _substitute(value: Any, trigger: str) -> Any:
    """``{trigger}`` in a scripted argument's strings becomes the trigger's text."""
    if isinstance(value, str):
        return value.replace("{trigger}", trigger)
    if isinstance(value, list):
        return [_substitute(v, trigger) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, trigger) for k, v in value.items()}
    return value


class EchoProvider:
    """The demo model: answers with the trigger it received; deterministic, free, offline.

    ``delay_s`` makes every call take that long (a long turn without a
    model); ``fail`` makes every call fail, to exercise the fallback chain.

    ``script`` is a list of steps, one per round: ``{"calls": [{"tool",
    "arguments"}, ...]}`` asks for those tool calls (``{trigger}`` in an
    argument's text is the trigger), ``{"answer": text}`` ends the turn with
    that text. Past its last step the model answers with the trigger, unless
    ``repeat`` starts the script over (a model that never stops asking).
    ``match`` confines the script to triggers containing that text; any
    other turn gets the plain echo. The round is read from the conversation
    itself (how many answers it already holds), so the model keeps no state
    between calls and any node can serve any round.
    """

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        fail: bool = False,
        script: Sequence[Mapping[str, Any]] = (),
        repeat: bool = False,
        match: str = "",
        key: str = "echo",
    ) -> None:
        self.key = key
        self.delay_s = float(delay_s)
        self.fail = bool(fail)
        self.script = list(script)
        self.repeat = bool(repeat)
        self.match = match

    def _step(self, request: ModelRequest) -> Optional[Mapping[str, Any]]:
        trigger = _trigger_text(request.messages)
        if not self.script or (self.match and self.match not in trigger):
            return None
        done = sum(1 for m in request.messages if m.role == ROLE_ASSISTANT)
        if done < len(self.script):
            return self.script[done]
        return self.script[done % len(self.script)] if self.repeat else None

    async def complete(self, request: ModelRequest) -> Completion:
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)  # the simulated model's own think time, not a test wait
        if self.fail:
            raise ProviderError(ERR_UNAVAILABLE, "echo provider configured to fail")
        trigger = _trigger_text(request.messages)
        read = approx_tokens(request.system) + sum(
            approx_tokens(m.text) + sum(approx_tokens(r.content) for _, r in m.results) for m in request.messages
        )
        step = self._step(request)
        if step is not None and "calls" in step:
            done = sum(1 for m in request.messages if m.role == ROLE_ASSISTANT)
            calls = tuple(
                ToolCall(
                    id=f"echo-{done + 1}-{i + 1}",
                    name=str(c["tool"]),
                    arguments=_substitute(dict(c.get("arguments") or {}), trigger),
                )
                for i, c in enumerate(step["calls"])
            )
            written = sum(approx_tokens(json.dumps(c.arguments)) for c in calls)
            return Completion(
                text="", calls=calls, input_tokens=read, output_tokens=written, stop_reason=STOP_TOOL_USE, model="echo"
            )
        text = str(step["answer"]) if step is not None else trigger
        return Completion(text=text, input_tokens=read, output_tokens=approx_tokens(text), stop_reason=STOP_END, model="echo")

    async def aclose(self) -> None:
        return None


def build_provider(config: ProviderConfig) -> ModelProvider:
    """One company ``providers.llm`` entry as a callable provider."""
    opts = dict(config.options)
    if config.kind == "echo":
        return EchoProvider(
            delay_s=float(opts.get("delay_s", 0.0)),
            fail=bool(opts.get("fail", False)),
            script=list(opts.get("script") or ()),
            repeat=bool(opts.get("repeat", False)),
            match=str(opts.get("match", "") or ""),
            key=config.key,
        )
    vendors: dict[str, type[VendorProvider]] = {
        "openai": OpenAIProvider,
        "anthropic": AnthropicProvider,
    }
    vendor = vendors.get(config.kind)
    if vendor is None:
        raise ValueError(f"providers.llm kind={config.kind!r}: no provider of that kind in this build")
    return vendor(
        model=str(opts["model"]),
        base_url=str(opts.get("base_url", "") or ""),
        api_key_env=str(opts.get("api_key_env", "") or ""),
        timeout_s=float(opts.get("timeout_s", DEFAULT_TIMEOUT_S)),
        max_tokens=opts.get("max_tokens"),
        key=config.key,
    )


__all__ = ["EchoProvider", "build_provider"]
