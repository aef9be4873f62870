"""The turn runner and its providers: echo, an OpenAI-compatible endpoint on loopback, the fallback chain."""
from __future__ import annotations

import socket
from typing import Any, AsyncIterator

import pytest
from asgiref.sync import sync_to_async

from crewlet import events
from crewlet.events.types import TaskAssigned
from crewlet.company.org import CompanyHolder
from crewlet.queue.contract import MAX_DELIVERIES
from crewlet.events.tracing import Trace
from seats.provider_anthropic import AnthropicProvider
from seats.provider_base import Completion, Message, ModelProvider, ModelRequest, ProviderError
from seats.provider_openai import OpenAIProvider
from seats.providers import EchoProvider, build_provider
from seats.runtime import SeatRuntime
from seats.turn_types import Trigger
from seats.turns import TurnRunner
from seats_support import Recorder, company, eventually, memory_queues, model_server, send, wake

SEAT_EVENTS = ("agent_turn_started", "agent_phase_started", "agent_phase_completed", "agent_turn_completed")


def openai(base_url: str, **extra: Any) -> dict[str, Any]:
    """An entry with no retries of its own: these tests are about the chain (retries: test_provider_retry.py)."""
    return {"kind": "openai", "base_url": base_url, "model": "local-7b", "retry": {"attempts": 0}, **extra}


async def ask(provider: ModelProvider, system: str, user: str) -> Completion:
    """One round with nothing but the trigger; the provider's client closed after."""
    try:
        return await provider.complete(ModelRequest(system=system, messages=[Message(role="user", text=user)]))
    finally:
        await provider.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- providers ------------------------------------------------------------------------------


async def test_the_openai_provider_posts_a_chat_completion_and_reads_the_answer_and_usage(monkeypatch: Any) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "sk-local")
    with model_server(reply="the build is green") as server:
        provider = OpenAIProvider(base_url=server.base_url, model="local-7b", api_key_env="TEST_LLM_KEY", max_tokens=64)
        answer = await ask(provider, "you are ada", "is the build green?")
    assert (answer.text, answer.input_tokens, answer.output_tokens, answer.stop_reason) == (
        "the build is green",
        11,
        5,
        "end",
    )
    [request] = server.requests
    assert request["model"] == "local-7b" and request["max_tokens"] == 64
    assert request["messages"] == [
        {"role": "system", "content": "you are ada"},
        {"role": "user", "content": "is the build green?"},
    ]
    assert server.headers[0]["authorization"] == "Bearer sk-local"


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
@pytest.mark.parametrize(("status", "kind"), [(500, "server_error"), (429, "rate_limited"), (401, "auth"), (400, "bad_request")])
async def test_an_http_failure_is_filed_under_its_kind_by_either_sdk(vendor: str, status: int, kind: str) -> None:
    with model_server(status=status) as server:
        provider = (
            OpenAIProvider(base_url=server.base_url, model="m")
            if vendor == "openai"
            else AnthropicProvider(base_url=server.root_url, model="m")
        )
        with pytest.raises(ProviderError) as failed:
            await ask(provider, "s", "u")
    assert failed.value.kind == kind and f"HTTP {status}" in str(failed.value)


async def test_an_endpoint_nobody_listens_on_is_unreachable_and_an_unset_key_is_an_auth_failure(monkeypatch: Any) -> None:
    with pytest.raises(ProviderError) as unreachable:
        await ask(OpenAIProvider(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", timeout_s=2), "s", "u")
    assert unreachable.value.kind == "unreachable"
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ProviderError) as unset:
        await ask(OpenAIProvider(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="NO_SUCH_KEY_VAR"), "s", "u")
    assert unset.value.kind == "auth"


async def test_the_echo_model_answers_with_what_it_received_and_can_be_told_to_fail() -> None:
    answer = await ask(EchoProvider(), "system", "hello there")
    assert answer.text == "hello there" and answer.output_tokens == 2
    with pytest.raises(ProviderError):
        await ask(EchoProvider(fail=True), "system", "hello")
    org = company(providers=[{"kind": "echo", "delay_s": 0.5}, openai("http://127.0.0.1:1/v1")])
    built = [build_provider(p) for p in org.providers]
    assert isinstance(built[0], EchoProvider) and built[0].delay_s == 0.5
    assert isinstance(built[1], OpenAIProvider) and built[1].key == "openai:local-7b"


def test_a_scheduled_task_is_put_to_the_model_as_its_title_and_instructions() -> None:
    task = events.new(
        TaskAssigned(seat="ada", title="Stand-up", instructions="Post the stand-up summary"), Trace.root()
    )
    assert Trigger(events=[task]).prompt() == "Task: Stand-up\nPost the stand-up summary"


# -- the runner's chain ---------------------------------------------------------------------


async def test_a_failing_endpoint_hands_off_to_the_next_provider_and_the_turn_succeeds() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        with model_server(status=503) as server:
            org = company(providers=[openai(server.base_url), {"kind": "echo"}])
            runner = TurnRunner(q, CompanyHolder(org))
            seat = org.seat_by_handle("ada")
            assert seat is not None
            trigger = Trigger(events=[wake("ada", "status?")], conversation_key="slack:D1")
            result = await runner.run(seat, trigger)
        assert result.ok and result.provider_key == "echo" and result.response == "sam: status?"
        assert rec.types() == [
            "agent_turn_started",
            "agent_phase_started",
            "prompt.size",
            "agent_turn_progress",
            "provider_fallback",
            "agent_phase_completed",
            "agent_turn_completed",
        ]
        [progress] = rec.of("agent_turn_progress")  # the one round beginning, before either provider was called
        assert (progress.data.round, progress.data.phase, progress.data.input_tokens) == (1, "respond", 0)
        [fallback] = rec.of("provider_fallback")
        assert (fallback.data.from_provider_key, fallback.data.to_provider_key, fallback.data.error_kind) == (
            "openai:local-7b",
            "echo",
            "server_error",
        )
        for _, ev in rec.seen:
            assert (ev.data.seat, ev.data.turn_id, ev.data.conversation_key) == ("ada", trigger.turn_id, "slack:D1")
        [phase] = rec.of("agent_phase_completed")
        assert [r["provider_key"] for r in phase.data.rounds] == ["openai:local-7b", "echo"]
        assert phase.data.user_prompt == "sam: status?" and phase.data.response == "sam: status?"
        [done] = rec.of("agent_turn_completed")
        assert done.payload["outcome"] == "completed" and done.data.output_tokens == 2


async def test_when_every_provider_fails_the_chain_reports_llm_unavailable_and_the_turn_fails() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        with model_server(status=500) as server:
            org = company(providers=[openai(server.base_url), {"kind": "echo", "fail": True}])
            seat = org.seat_by_handle("ada")
            assert seat is not None
            result = await TurnRunner(q, CompanyHolder(org)).run(seat, Trigger(events=[wake("ada", "hi")]))
        assert not result.ok and result.error_kind == "llm_unavailable"
        assert [(f.data.from_provider_key, f.data.to_provider_key) for f in rec.of("provider_fallback")] == [
            ("openai:local-7b", "echo"),
            ("echo", ""),
        ]
        [unavailable] = rec.of("llm_unavailable")
        assert unavailable.data.providers == ["openai:local-7b", "echo"]
        [done] = rec.of("agent_turn_completed")
        assert done.data.failed is True and done.payload["outcome"] == "failed"


# -- on a running seat (PostgreSQL for the ledger) ---------------------------------------------


@pytest.fixture
async def _close_store_connections() -> AsyncIterator[None]:
    yield
    from django.db import connections

    await sync_to_async(connections.close_all)()


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_a_seat_whose_whole_chain_fails_naks_the_partition_and_works_it_when_a_provider_recovers(
    _close_store_connections: None,
) -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        with model_server(status=500) as server:
            runtime = SeatRuntime(
                q, CompanyHolder(company(providers=[openai(server.base_url), {"kind": "echo", "fail": True}])),
                run_scheduler=False,
            )

            async def recover(_topic: str, event: Any) -> None:
                if event.type == "llm_unavailable":
                    server.status = 200  # the endpoint comes back before the redelivery

            q.add_publish_listener(recover)
            await runtime.start()
            try:
                await send(q, "ada", wake("ada", "are you up?"))
                await eventually(lambda: any(not e.data.failed for e in rec.of("agent_turn_completed")))
                remaining = [r for _, r in runtime.loops["ada"].stats.deliveries]
            finally:
                await runtime.stop()
        assert remaining == [MAX_DELIVERIES - 1, MAX_DELIVERIES - 2]  # NAKed once, then delivered again
        assert len(rec.of("llm_unavailable")) == 1
        [ok] = [e for e in rec.of("agent_phase_completed") if not e.data.failed]
        assert ok.data.response == "hello from the model"
