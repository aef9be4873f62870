"""The model providers a turn calls, one round at a time, through the vendors' own SDKs.

A round is one provider call: the system prompt, the conversation so far
(the trigger, then each earlier round's answer and its tools' results) and the
tools the seat is granted go in; text, tool calls, tokens and a ``stop_reason``
(``crewlet.events.types.STOP_REASONS``) come out. The conversation is held in
a vendor-neutral form (:class:`Message`) and rendered per call, so the
fallback chain can hand a turn from one vendor to the other between rounds.

Three kinds, as the company file names them:

* ``echo`` — the demo model: deterministic, free, offline. It answers with the
  trigger; with a ``script`` it first asks for the scripted tool calls, one
  step per round, so the whole loop runs with no network.
* ``openai`` — the official ``openai`` SDK against any OpenAI-compatible
  chat-completions server (the hosted API, vLLM, llama.cpp, Ollama) at
  ``base_url``.
* ``anthropic`` — the official ``anthropic`` SDK's Messages API.

The SDKs retry nothing here (``max_retries=0``): the fallback chain is the
retry, and a vendor's own back-off would hold the round past the chain's next
member. Every SDK exception is translated at this boundary into
:class:`ProviderError`, filed under the kind ``provider_fallback`` reports.
Keys are read from the named environment variable at call time, so rotating
one needs no restart, and a key never appears in an error or a log line.
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import os
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Awaitable, Mapping, Optional, Protocol, Sequence, TypeVar

from crewlet.events.types import (
    STOP_CONTEXT_EXCEEDED,
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_PAUSED,
    STOP_REFUSAL,
    STOP_TOOL_USE,
)
from crewlet.base.jsontext import holds_unstorable, storable, storable_value
from crewlet.company.org import Provider as ProviderConfig
from crewlet.base.redact import REDACTED, redact
from seats.tools.base import ToolCall, ToolResult, ToolSpec

if TYPE_CHECKING:
    import anthropic
    import openai

# error_kind values a provider failure is filed under (a provider kind, per the design).
ERR_UNREACHABLE = "unreachable"
ERR_TIMEOUT = "timeout"
ERR_RATE_LIMITED = "rate_limited"
ERR_AUTH = "auth"
ERR_SERVER = "server_error"
ERR_BAD_REQUEST = "bad_request"
ERR_BAD_RESPONSE = "bad_response"
ERR_UNAVAILABLE = "unavailable"

#: What the OpenAI SDK's client is given when the company names no key variable:
#: the SDK insists on a key, and a keyless local server ignores whatever is sent.
KEYLESS = "unused"
#: The Messages API requires ``max_tokens``; this is it when the company names none.
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096

T = TypeVar("T")

ROLE_USER = "user"
ROLE_ASSISTANT = "assistant"
ROLE_TOOL = "tool"


class ProviderError(Exception):
    """One provider call that failed; ``kind`` is what the fallback event files it under."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Message:
    """One entry of a turn's conversation, in no vendor's shape.

    ``user``: the trigger's text. ``assistant``: a round's answer — its text
    and the tool calls it asked for. ``tool``: the results of those calls,
    each with the id of the call it answers.
    """

    role: str
    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    results: tuple[tuple[str, ToolResult], ...] = ()


@dataclass(frozen=True)
class ModelRequest:
    """One round's input. ``seat`` is the end user the vendors' abuse monitoring is told about."""

    system: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    seat: str = ""


@dataclass(frozen=True)
class Completion:
    """What one provider call answered.

    ``invalid`` names calls whose arguments the model sent as something other
    than a JSON object: the loop answers each with a tool error rather than
    running it on arguments nobody wrote.
    """

    text: str
    calls: tuple[ToolCall, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    stop_reason: str = STOP_END
    model: str = ""
    refusal: Optional[dict[str, Any]] = None
    invalid: Mapping[str, str] = field(default_factory=dict)


class ModelProvider(Protocol):
    """One member of the fallback chain, built for one turn and closed at its end."""

    key: str

    async def complete(self, request: ModelRequest) -> Completion: ...

    async def aclose(self) -> None: ...


def tool_text(result: ToolResult) -> str:
    """A result as the model reads it: the content, or the error and whatever content came with it."""
    if result.ok:
        return result.content
    error = result.error or "the tool failed"
    return f"error: {error}\n{result.content}".rstrip() if result.content else f"error: {error}"


def approx_tokens(text: str) -> int:
    return len(text.split())


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


# -- the vendors' SDKs ---------------------------------------------------------------------------


def _status_kind(status: int) -> str:
    if status == 429:
        return ERR_RATE_LIMITED
    if status in (401, 403):
        return ERR_AUTH
    if status >= 500:
        return ERR_SERVER
    return ERR_BAD_REQUEST


#: The vendors' SDKs, imported when a provider of theirs first answers (see :func:`load_sdk`).
SDKS = ("openai", "anthropic")


async def load_sdk(name: str) -> ModuleType:
    """The SDK ``name``, imported on first use in a worker thread.

    Each SDK takes seconds to import (their generated type modules), which
    every process would pay at start — ``manage.py`` commands included —
    though most companies use one vendor or none. The import runs off the
    engine's loop so the first model call does not stall every other seat.
    A module in ``sys.modules`` may still be executing in another thread
    (concurrent first turns): only a finished one is taken as it is;
    otherwise the import is asked for too, which waits for the import in
    flight (the interpreter's lock per module) instead of handing out a
    half-built module.
    """
    module = sys.modules.get(name)
    if module is None or not _imported(module):
        module = await asyncio.to_thread(importlib.import_module, name)
    return module


def _imported(module: ModuleType) -> bool:
    """Whether ``module`` finished executing (the import system marks a spec while its module runs)."""
    return not getattr(getattr(module, "__spec__", None), "_initializing", False)


def _loaded_errors(attribute: str) -> tuple[type[BaseException], ...]:
    """The SDK error class ``attribute`` of each SDK imported so far (one never imported, or still importing, raised nothing)."""
    loaded = (sys.modules.get(name) for name in SDKS)
    return tuple(getattr(m, attribute) for m in loaded if m is not None and _imported(m) and hasattr(m, attribute))


#: How much of a provider's error message is kept (it is stored, shown and logged).
ERROR_MESSAGE_MAX = 1000


def error_text(text: str, *secrets: str) -> str:
    """A provider's words about a failure, fit to store, show and log.

    They come from outside: bounded, with NUL and lone surrogates escaped,
    every ``secrets`` value (the key the call was made with) and anything
    that looks like a credential redacted — a vendor that quotes the key it
    refused (``Incorrect API key provided: sk-…``) must not put it in the
    record.
    """
    for secret in secrets:
        if secret and secret != KEYLESS:
            text = text.replace(secret, REDACTED)
    text = storable(redact(text))
    return text if len(text) <= ERROR_MESSAGE_MAX else text[: ERROR_MESSAGE_MAX - 1] + "…"


def translate(exc: Exception, where: str, *secrets: str) -> ProviderError:
    """An SDK's exception as the seats' :class:`ProviderError`, filed under its kind, its words made :func:`error_text`."""
    if isinstance(exc, ProviderError):
        return ProviderError(exc.kind, error_text(str(exc), *secrets))
    if isinstance(exc, _loaded_errors("APITimeoutError")):
        return ProviderError(ERR_TIMEOUT, error_text(f"{where}: no answer before the timeout"))
    if isinstance(exc, _loaded_errors("APIConnectionError")):
        return ProviderError(ERR_UNREACHABLE, error_text(f"{where}: {exc}", *secrets))
    if isinstance(exc, _loaded_errors("APIStatusError")):
        status = getattr(exc, "status_code", 0)
        return ProviderError(_status_kind(status), error_text(f"HTTP {status} from {where}: {getattr(exc, 'message', exc)}", *secrets))
    return ProviderError(ERR_BAD_RESPONSE, error_text(f"{where}: {exc}", *secrets))


def admitted(completion: Completion) -> Completion:
    """A model's answer made storable where it enters: NUL and lone surrogates in its text, calls and refusal escaped.

    Everything a turn records and publishes is built from this, so neither
    the event store (PostgreSQL refuses NUL) nor the wire (a lone surrogate
    has no UTF-8) nor a tool such as ``a2a_ask`` is handed what it refuses.
    """
    if not holds_unstorable([completion.text, completion.model, completion.refusal, [
        [c.id, c.name, c.arguments] for c in completion.calls
    ], dict(completion.invalid)]):
        return completion
    return dataclasses.replace(
        completion,
        text=storable(completion.text),
        model=storable(completion.model),
        calls=tuple(
            ToolCall(id=storable(c.id), name=storable(c.name), arguments=storable_value(c.arguments)) for c in completion.calls
        ),
        refusal=storable_value(completion.refusal),
        invalid={storable(k): storable(v) for k, v in completion.invalid.items()},
    )


async def within(timeout_s: float, call: Awaitable[T], where: str) -> T:
    """``call`` with a whole-call deadline: the SDKs' own timeout is per read, so a server trickling its answer never hits it."""
    try:
        async with asyncio.timeout(timeout_s):
            return await call
    except TimeoutError:
        raise ProviderError(ERR_TIMEOUT, f"{where}: no whole answer within {timeout_s:g} s") from None


def _secret(api_key_env: str) -> str:
    """The key from its variable, read now; an unset variable is an ``auth`` failure (the chain moves on)."""
    if not api_key_env:
        return KEYLESS
    secret = os.environ.get(api_key_env, "")
    if not secret:
        raise ProviderError(ERR_AUTH, f"environment variable {api_key_env} is not set")
    return secret


def _arguments(raw: str) -> tuple[dict[str, Any], str]:
    """A call's JSON arguments as an object, or ``({}, why)`` when they are not one."""
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {}, "the tool call's arguments are not valid JSON"
    if not isinstance(value, dict):
        return {}, f"the tool call's arguments are a JSON {type(value).__name__}, not an object"
    return value, ""


_OPENAI_STOP = {
    "stop": STOP_END,
    "length": STOP_MAX_TOKENS,
    "tool_calls": STOP_TOOL_USE,
    "function_call": STOP_TOOL_USE,
    "content_filter": STOP_REFUSAL,
}


class _VendorProvider:
    """What both SDK providers hold: the model, where it is served, the key's variable, the limits, one client."""

    vendor = ""
    default_max_tokens: Optional[int] = None

    def __init__(
        self,
        *,
        model: str,
        base_url: str = "",
        api_key_env: str = "",
        timeout_s: float = 60.0,
        max_tokens: Optional[int] = None,
        key: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_tokens = max_tokens or self.default_max_tokens
        self.key = key or f"{self.vendor}:{model}"
        self._client: Any = None
        #: The API key the client was made with: redacted from every error it causes.
        self._key = ""

    def _open(self, api_key: str) -> Any:
        raise NotImplementedError

    async def complete(self, request: ModelRequest) -> Completion:
        raise NotImplementedError

    def _connect(self) -> Any:
        """The SDK client, made on first use with the key read then; no retries of its own."""
        if self._client is None:
            self._key = _secret(self.api_key_env)
            self._client = self._open(self._key)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


class OpenAIProvider(_VendorProvider):
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
        return admitted(Completion(
            text=str(message.content or ""),
            calls=tuple(calls),
            input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            stop_reason=stop,
            model=str(answer.model or self.model),
            refusal=refusal,
            invalid=invalid,
        ))



_ANTHROPIC_STOP = {
    "end_turn": STOP_END,
    "stop_sequence": STOP_END,
    "tool_use": STOP_TOOL_USE,
    "max_tokens": STOP_MAX_TOKENS,
    "refusal": STOP_REFUSAL,
    "pause_turn": STOP_PAUSED,
    "model_context_window_exceeded": STOP_CONTEXT_EXCEEDED,
}


class AnthropicProvider(_VendorProvider):
    """The Messages API through the ``anthropic`` SDK (``base_url`` for a gateway or a compatible server)."""

    vendor = "anthropic"
    default_max_tokens = ANTHROPIC_DEFAULT_MAX_TOKENS

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
                            {"type": "tool_result", "tool_use_id": cid, "content": tool_text(r), "is_error": not r.ok}
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
        return admitted(Completion(
            text=text,
            calls=tuple(calls),
            input_tokens=int(getattr(usage, "input_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
            stop_reason=stop,
            model=str(answer.model or self.model),
            refusal={"category": "", "explanation": text} if stop == STOP_REFUSAL else None,
            invalid=invalid,
        ))



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
    vendors: dict[str, type[_VendorProvider]] = {
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
        timeout_s=float(opts.get("timeout_s", 60.0)),
        max_tokens=opts.get("max_tokens"),
        key=config.key,
    )


__all__ = [
    "AnthropicProvider",
    "Completion",
    "EchoProvider",
    "Message",
    "ModelProvider",
    "ModelRequest",
    "OpenAIProvider",
    "ProviderError",
    "build_provider",
    "tool_text",
    "translate",
]
