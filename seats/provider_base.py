"""What every model provider speaks: the vendor-neutral conversation, one round's answer, and how a call fails.

A round is one provider call: the system prompt, the conversation so far
(the trigger, then each earlier round's answer and its tools' results) and the
tools the seat is granted go in; text, tool calls, tokens and a ``stop_reason``
(``crewlet.events.types.STOP_REASONS``) come out. The conversation is held in
a vendor-neutral form (:class:`Message`) and rendered per call by each vendor's
client, so the fallback chain can hand a turn from one vendor to the other
between rounds. A failed call is a :class:`ProviderError`, filed under the
kind ``provider_fallback`` reports.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol, Sequence

from crewlet.events.types import STOP_END
from crewlet.base.jsontext import holds_unstorable, storable, storable_value
from crewlet.base.redact import REDACTED, redact
from seats.tools.base import ToolCall, ToolResult, ToolSpec

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

ROLE_USER = "user"
ROLE_ASSISTANT = "assistant"
ROLE_TOOL = "tool"


class ProviderError(Exception):
    """One provider call that failed; ``kind`` is what the fallback event files it under.

    ``retry_after_s`` is how long the provider asked to be left alone
    (its ``Retry-After``), when it said.
    """

    def __init__(self, kind: str, message: str, *, retry_after_s: Optional[float] = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = retry_after_s


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

    ``input_tokens`` is the call's input as the vendor bills it, in input
    tokens (:func:`billed_input`): the uncached input, plus what the prompt
    cache served or stored at its billed weight. ``cache_read_tokens`` and
    ``cache_write_tokens`` are those cached tokens as the vendor counted them.
    """

    text: str
    calls: tuple[ToolCall, ...] = ()
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
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


def billed_input(uncached: int, cache_read: int = 0, cache_write: int = 0, *, read_rate: float, write_rate: float = 1.0) -> int:
    """Input tokens as billed: ``uncached`` at full price, cache reads and writes at the vendor's fraction of it (rounded up).

    The one place a cached token is weighed, so every total built from
    ``input_tokens`` — a round's, a turn's, a budget's — counts the money the
    vendor charges rather than the prompt's size.
    """
    return uncached + math.ceil(cache_read * read_rate) + math.ceil(cache_write * write_rate)


def approx_tokens(text: str) -> int:
    """A word count: the rough measure of tokens the echo model and ``prompt.size`` report, needing no vendor's tokenizer."""
    return len(text.split())


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


__all__ = [
    "Completion",
    "ERROR_MESSAGE_MAX",
    "ERR_AUTH",
    "ERR_BAD_REQUEST",
    "ERR_BAD_RESPONSE",
    "ERR_RATE_LIMITED",
    "ERR_SERVER",
    "ERR_TIMEOUT",
    "ERR_UNAVAILABLE",
    "ERR_UNREACHABLE",
    "KEYLESS",
    "Message",
    "ModelProvider",
    "ModelRequest",
    "ProviderError",
    "ROLE_ASSISTANT",
    "ROLE_TOOL",
    "ROLE_USER",
    "admitted",
    "approx_tokens",
    "billed_input",
    "error_text",
    "tool_text",
]
