"""The turn runner seam: ``TurnRunner.run(seat, trigger) -> TurnResult``, and its model providers.

A turn here is one phase of one round per provider attempt: it publishes
``agent_turn_started``, ``agent_phase_started`` / ``agent_phase_completed``
(the prompts, the response, tokens and ``rounds[]``) and
``agent_turn_completed``, every one tagged with the seat, the turn id and the
conversation identity. Providers come from the company's ``providers.llm``,
read per turn from the holder (never a snapshot), and are tried in order: each
hand-off publishes ``provider_fallback`` (``to_provider_key`` empty on the last
member) and an exhausted chain ``llm_unavailable``. A failed turn is the
caller's to NAK.

Two providers: ``echo`` — a deterministic demo model that answers with what it
received, ``delay_s`` to simulate a long turn, ``fail`` to simulate an outage —
and ``openai``, any OpenAI-compatible chat-completions endpoint (llama.cpp,
vLLM, Ollama, the hosted API) spoken with the standard library in a worker
thread, so the engine takes no HTTP client dependency for one POST.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence, TypedDict

from crewlet.events import Event
from crewlet.events.emit import Emitter
from crewlet.logfmt import short_reason
from crewlet.events.types import (
    AgentPhaseCompleted,
    AgentPhaseStarted,
    AgentTurnCompleted,
    AgentTurnStarted,
    AgentTurnStopped,
    LLMUnavailable,
    ProviderFallback,
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_REFUSAL,
    STOP_TOOL_USE,
    TaskAssigned,
)
from crewlet.org import CompanyHolder, Organization, Provider as ProviderConfig, Seat
from crewlet.queue.contract import EventQueue
from crewlet.tracing import trace_of
from seats.ledger import storable

log = logging.getLogger("crewlet.seats.turns")

PHASE_RESPOND = "respond"
OUTCOME_COMPLETED = "completed"
OUTCOME_FAILED = "failed"
OUTCOME_STOPPED = "stopped"

# error_kind values a provider failure is filed under (a provider kind, per the design).
ERR_UNREACHABLE = "unreachable"
ERR_TIMEOUT = "timeout"
ERR_RATE_LIMITED = "rate_limited"
ERR_AUTH = "auth"
ERR_SERVER = "server_error"
ERR_BAD_REQUEST = "bad_request"
ERR_BAD_RESPONSE = "bad_response"
ERR_UNAVAILABLE = "unavailable"
ERR_LLM_UNAVAILABLE = "llm_unavailable"
ERR_NO_PROVIDER = "no_provider"
#: The turn itself raised (a bug, or content nothing downstream could handle): not a provider kind.
ERR_CRASHED = "crashed"
class ProviderError(Exception):
    """One provider call that failed; ``kind`` is what the fallback event files it under."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Completion:
    """What one provider call answered."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    stop_reason: str = STOP_END
    model: str = ""


class ModelProvider(Protocol):
    """One member of the fallback chain."""

    key: str

    async def complete(self, system: str, user: str) -> Completion: ...


def _approx_tokens(text: str) -> int:
    return len(text.split())


class EchoProvider:
    """The demo model: answers with exactly what it received; deterministic, free, offline.

    ``delay_s`` makes a turn take that long (a long turn without a model);
    ``fail`` makes every call fail, to exercise the fallback chain.
    """

    def __init__(self, *, delay_s: float = 0.0, fail: bool = False, key: str = "echo") -> None:
        self.key = key
        self.delay_s = float(delay_s)
        self.fail = bool(fail)

    async def complete(self, system: str, user: str) -> Completion:
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)  # the simulated model's own think time, not a test wait
        if self.fail:
            raise ProviderError(ERR_UNAVAILABLE, "echo provider configured to fail")
        return Completion(
            text=user,
            input_tokens=_approx_tokens(system) + _approx_tokens(user),
            output_tokens=_approx_tokens(user),
            stop_reason=STOP_END,
            model="echo",
        )


_FINISH_TO_STOP = {
    "stop": STOP_END,
    "length": STOP_MAX_TOKENS,
    "tool_calls": STOP_TOOL_USE,
    "function_call": STOP_TOOL_USE,
    "content_filter": STOP_REFUSAL,
}


class OpenAIProvider:
    """An OpenAI-compatible ``POST {base_url}/chat/completions``.

    ``base_url`` includes the API version path, as every OpenAI-compatible
    server documents it (``http://127.0.0.1:8080/v1``). The key is read from
    ``api_key_env`` at call time, so rotating it needs no restart; a named
    variable that is unset is an ``auth`` failure and the chain moves on.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str = "",
        timeout_s: float = 60.0,
        max_tokens: Optional[int] = None,
        key: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_tokens = max_tokens
        self.key = key or f"openai:{model}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _request(self, system: str, user: str) -> urllib.request.Request:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        }
        if self.max_tokens:
            body["max_tokens"] = int(self.max_tokens)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key_env:
            secret = os.environ.get(self.api_key_env, "")
            if not secret:
                raise ProviderError(ERR_AUTH, f"environment variable {self.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {secret}"
        return urllib.request.Request(self.url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")

    def _call(self, request: urllib.request.Request) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:  # noqa: S310 - configured URL
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read(500).decode("utf-8", "replace") if exc.fp is not None else ""
            status = exc.code
            if status == 429:
                kind = ERR_RATE_LIMITED
            elif status in (401, 403):
                kind = ERR_AUTH
            elif status >= 500:
                kind = ERR_SERVER
            else:
                kind = ERR_BAD_REQUEST
            raise ProviderError(kind, f"HTTP {status} from {self.url}: {detail}".strip()) from None
        except (TimeoutError, OSError) as exc:  # URLError is an OSError; socket.timeout is TimeoutError
            reason = getattr(exc, "reason", exc)
            kind = ERR_TIMEOUT if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError) else ERR_UNREACHABLE
            raise ProviderError(kind, f"{self.url}: {reason}") from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise ProviderError(ERR_BAD_RESPONSE, f"{self.url} answered something that is not JSON") from None
        if not isinstance(data, dict):
            raise ProviderError(ERR_BAD_RESPONSE, f"{self.url} answered a JSON {type(data).__name__}, not an object")
        return data

    async def complete(self, system: str, user: str) -> Completion:
        request = self._request(system, user)
        data = await asyncio.to_thread(self._call, request)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ProviderError(ERR_BAD_RESPONSE, f"{self.url} answered no choices[0].message") from None
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        return Completion(
            text=str(text),
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            stop_reason=_FINISH_TO_STOP.get(str(choice.get("finish_reason") or "stop"), STOP_END),
            model=str(data.get("model") or self.model),
        )


def build_provider(config: ProviderConfig) -> ModelProvider:
    """One company ``providers.llm`` entry as a callable provider."""
    opts = dict(config.options)
    if config.kind == "echo":
        return EchoProvider(delay_s=float(opts.get("delay_s", 0.0)), fail=bool(opts.get("fail", False)), key=config.key)
    if config.kind == "openai":
        return OpenAIProvider(
            base_url=str(opts["base_url"]),
            model=str(opts["model"]),
            api_key_env=str(opts.get("api_key_env", "") or ""),
            timeout_s=float(opts.get("timeout_s", 60.0)),
            max_tokens=opts.get("max_tokens"),
            key=config.key,
        )
    raise ValueError(f"providers.llm kind={config.kind!r}: no provider of that kind in this build")


# -- the trigger and the result -----------------------------------------------


class _TurnTags(TypedDict):
    """The fields every event of one turn carries, spread into each body."""

    seat: str
    role: str
    agent_id: str
    turn_id: str
    conversation_key: str


@dataclass
class Trigger:
    """What woke the seat: one partition's fresh events, oldest first.

    ``first_delivery`` says every event is on its first delivery: a failure
    then logs its traceback, and the same failure on a redelivery logs one line.
    """

    events: list[Event]
    turn_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    partition_key: str = ""
    conversation_key: str = ""
    first_delivery: bool = True

    @property
    def first(self) -> Event:
        return self.events[0]

    def prompt(self) -> str:
        """The user prompt: each wake as its sender and body, a task as its title and instructions."""
        lines = []
        for ev in self.events:
            if isinstance(ev.data, TaskAssigned):
                text = f"Task: {ev.data.title}".strip()
                if ev.data.instructions and ev.data.instructions != ev.data.title:
                    text += f"\n{ev.data.instructions}"
                lines.append(text)
                continue
            body = ev.field("body")
            sender = ev.field("sender")
            if body:
                lines.append(f"{sender}: {body}" if sender else str(body))
            else:
                lines.append(ev.summary())
        return storable("\n".join(lines))


@dataclass
class TurnResult:
    """How a turn ended. ``outcome`` is completed | failed | stopped."""

    turn_id: str
    outcome: str
    response: str = ""
    provider_key: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    rounds: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    error_kind: str = ""
    duration_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome == OUTCOME_COMPLETED


def system_prompt(org: Organization, seat: Seat) -> str:
    role = f", the {seat.role}" if seat.role else ""
    return f"You are {seat.display_name}{role} at {org.org}. Answer the message below."


class TurnRunner:
    """Runs one turn for one seat and publishes what it did.

    ``provider_factory`` builds a provider from a company entry (tests swap
    it); the chain is read from the holder at the start of every turn, so an
    applied company's providers serve the very next turn.
    """

    def __init__(
        self,
        queue: EventQueue,
        holder: CompanyHolder,
        *,
        provider_factory: Callable[[ProviderConfig], ModelProvider] = build_provider,
        emitter: Optional[Emitter] = None,
    ) -> None:
        self.queue = queue
        self.holder = holder
        self.provider_factory = provider_factory
        #: The seat runtime's telemetry publisher, shared by its inbox loops.
        self.emitter = emitter or Emitter(queue)

    async def _emit(self, body: Any, extras: Optional[dict[str, Any]] = None) -> None:
        """Telemetry never fails a turn: a publish that fails is logged (and retried while the broker is away)."""
        await self.emitter.emit(body, trace_of(), extras=extras, log_event="turn_event_publish_failed")

    def _tags(self, seat: Seat, trigger: Trigger) -> _TurnTags:
        return {
            "seat": seat.handle,
            "role": seat.role,
            "agent_id": seat.agent_id,
            "turn_id": trigger.turn_id,
            "conversation_key": trigger.conversation_key,
        }

    async def run(self, seat: Seat, trigger: Trigger) -> TurnResult:
        org = self.holder.current()
        tags = self._tags(seat, trigger)
        started = time.monotonic()
        await self._emit(
            AgentTurnStarted(**tags, trigger_type=trigger.first.type, trigger_event_id=trigger.first.id)
        )
        await self._emit(AgentPhaseStarted(**tags, phase=PHASE_RESPOND, iteration=1))
        system, user = system_prompt(org, seat), trigger.prompt()
        chain: Sequence[ProviderConfig] = org.providers
        result = TurnResult(turn_id=trigger.turn_id, outcome=OUTCOME_FAILED)
        if not chain:
            result.error_kind, result.error = ERR_NO_PROVIDER, "the company configures no model provider"
        for i, config in enumerate(chain):
            call_started = time.monotonic()
            try:
                provider = self.provider_factory(config)
                answer = await provider.complete(system, user)
            except ProviderError as exc:
                kind, message = exc.kind, str(exc)
            except (ValueError, TypeError) as exc:  # a provider that cannot even be built is a hand-off too
                kind, message = ERR_BAD_REQUEST, str(exc)
            except Exception as exc:  # a provider's own bug still hands off; its traceback once per message
                log.warning(
                    "provider_call_crashed",
                    extra={"seat": seat.handle, "provider": config.key, "error": short_reason(exc)},
                    exc_info=trigger.first_delivery,
                )
                if not trigger.first_delivery:
                    log.debug("provider_call_crashed_traceback", extra={"seat": seat.handle}, exc_info=True)
                kind, message = ERR_UNAVAILABLE, short_reason(exc, 1000)
            else:
                result.rounds.append(
                    {
                        "provider_key": config.key,
                        "model": answer.model,
                        "duration_ms": int((time.monotonic() - call_started) * 1000),
                        "input_tokens": answer.input_tokens,
                        "output_tokens": answer.output_tokens,
                        "stop_reason": answer.stop_reason,
                    }
                )
                result.outcome = OUTCOME_COMPLETED
                result.response = answer.text
                result.provider_key = config.key
                result.input_tokens += answer.input_tokens
                result.output_tokens += answer.output_tokens
                result.error = result.error_kind = ""
                break
            result.rounds.append(
                {
                    "provider_key": config.key,
                    "duration_ms": int((time.monotonic() - call_started) * 1000),
                    "error_kind": kind,
                }
            )
            result.error_kind, result.error = kind, message
            to_key = chain[i + 1].key if i + 1 < len(chain) else ""
            log.warning(
                "provider_fallback",
                extra={"seat": seat.handle, "turn_id": trigger.turn_id, "from": config.key, "to": to_key, "kind": kind},
            )
            await self._emit(
                ProviderFallback(
                    **tags,
                    phase=PHASE_RESPOND,
                    iteration=1,
                    from_provider_key=config.key,
                    to_provider_key=to_key,
                    error_kind=kind,
                    error=message[:1000],
                )
            )
        if not result.ok and chain:
            await self._emit(
                LLMUnavailable(
                    **tags, phase=PHASE_RESPOND, providers=[c.key for c in chain], error=result.error[:1000]
                )
            )
            result.error_kind = ERR_LLM_UNAVAILABLE
        result.duration_ms = int((time.monotonic() - started) * 1000)
        await self._emit(
            AgentPhaseCompleted(
                **tags,
                phase=PHASE_RESPOND,
                iteration=1,
                system_prompt=system,
                user_prompt=user,
                response=result.response,
                rounds=result.rounds,
                input_tokens=result.input_tokens,
                output_tokens=result.output_tokens,
                duration_ms=result.duration_ms,
                failed=not result.ok,
                error_kind=result.error_kind,
                error=result.error[:1000],
            )
        )
        await self._emit(
            AgentTurnCompleted(
                **tags,
                input_tokens=result.input_tokens,
                output_tokens=result.output_tokens,
                iterations=1,
                duration_ms=result.duration_ms,
                failed=not result.ok,
                error=result.error[:1000],
            ),
            extras={"outcome": result.outcome},
        )
        log.info(
            "agent_turn_finished",
            extra={
                "seat": seat.handle,
                "turn_id": trigger.turn_id,
                "outcome": result.outcome,
                "provider": result.provider_key,
                "duration_ms": result.duration_ms,
            },
        )
        return result

    async def stopped(self, seat: Seat, trigger: Trigger, *, by: str, by_seat: str = "", reason: str = "") -> TurnResult:
        """A person's pause with ``stop_running`` ended this turn: say so, and close it as stopped."""
        tags = self._tags(seat, trigger)
        await self._emit(AgentTurnStopped(**tags, stopped_by=by, stopped_by_seat=by_seat, reason=reason))
        await self._emit(AgentTurnCompleted(**tags, iterations=1, stopped=True), extras={"outcome": OUTCOME_STOPPED})
        log.info("agent_turn_stopped", extra={"seat": seat.handle, "turn_id": trigger.turn_id, "by": by})
        return TurnResult(turn_id=trigger.turn_id, outcome=OUTCOME_STOPPED)


__all__ = [
    "Completion",
    "EchoProvider",
    "ModelProvider",
    "OpenAIProvider",
    "ProviderError",
    "Trigger",
    "TurnResult",
    "TurnRunner",
    "build_provider",
    "ERR_CRASHED",
    "OUTCOME_COMPLETED",
    "OUTCOME_FAILED",
    "OUTCOME_STOPPED",
]
