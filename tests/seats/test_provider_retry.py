"""Retries inside a round: a transient provider failure is retried on the same entry, within its bound, before the chain moves on.

The provider is the OpenAI SDK against a local server scripted per request
(``Reply.status``/``headers``); the backoff's sleep is injected, so a
``Retry-After: 1`` is recorded and honoured without a second going by.
"""
from __future__ import annotations

import socket
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import pytest

from crewlet import events
from crewlet.company.fields import CompanyError
from crewlet.company.org import CompanyHolder, Organization
from crewlet.company.provider_retry import RetryPolicy
from crewlet.engine.metrics import EngineMetrics
from crewlet.events.tracing import Trace
from crewlet.events.types import AgentPhaseCompleted
from seats.provider_base import ProviderError
from seats.provider_sdk import retry_after_s
from seats.retry import Retrier
from seats.turn_types import Trigger, TurnResult
from seats.turns import TurnRunner
from seats_support import Recorder, Reply, company, memory_queues, model_server, wake

RATE_LIMITED = Reply(status=429, headers=(("Retry-After", "1"),))


def openai(base_url: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "openai", "base_url": base_url, "model": "local-7b", **extra}


class Clock:
    """The backoff's injected sleep: every wait it was asked for, none of them spent; ``during`` runs in each."""

    def __init__(self, during: Optional[Any] = None) -> None:
        self.waits: list[float] = []
        self.during = during

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.during is not None:
            self.during()


async def one_turn(
    org: Organization, clock: Clock, *, scale: float = 1.0, owns: Any = lambda handle: True
) -> tuple[TurnResult, Recorder]:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        runner = TurnRunner(q, CompanyHolder(org), owns=owns, retrier=Retrier(scale=scale, sleep=clock.sleep, rng=lambda: 0.0))
        seat = org.seat_by_handle("ada")
        assert seat is not None
        result = await runner.run(seat, Trigger(events=[wake("ada", "status?")]))
    return result, rec


# -- Retry-After, and the wait each failure earns ------------------------------------------------


def test_retry_after_is_read_as_delay_seconds_as_an_http_date_and_as_openais_milliseconds() -> None:
    now = 1_800_000_000.0
    in_90_s = format_datetime(datetime.fromtimestamp(now, timezone.utc) + timedelta(seconds=90), usegmt=True)
    assert retry_after_s({"retry-after": "1"}, now) == 1.0
    assert retry_after_s({"retry-after": in_90_s}, now) == 90.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now) == 0.0  # past: no wait at all
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}, now) == 0.25
    for nonsense in ("soon", "-1", "nan", "inf", ""):
        assert retry_after_s({"retry-after": nonsense}, now) is None, nonsense
    assert retry_after_s(None, now) is None


def test_only_a_transient_failure_earns_a_wait_and_a_retry_after_past_the_bound_earns_none() -> None:
    retrier = Retrier(rng=lambda: 0.0)
    policy = RetryPolicy(attempts=3, max_wait_s=5.0)
    for kind in ("rate_limited", "server_error", "timeout", "unreachable"):
        assert retrier.wait_s(ProviderError(kind, "x"), 1, policy, 60.0) == 1.0, kind
    for kind in ("auth", "bad_request", "bad_response", "unavailable"):
        assert retrier.wait_s(ProviderError(kind, "x"), 1, policy, 60.0) is None, kind
    assert [retrier.wait_s(ProviderError("server_error", "x"), n, policy, 60.0) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, None]
    assert retrier.wait_s(ProviderError("rate_limited", "x", retry_after_s=4.5), 1, policy, 60.0) == 4.5
    assert retrier.wait_s(ProviderError("rate_limited", "x", retry_after_s=6.0), 1, policy, 60.0) is None
    assert retrier.wait_s(ProviderError("rate_limited", "x", retry_after_s=4.5), 1, policy, 3.0) is None  # past timeout_s
    assert Retrier(rng=lambda: 1.0).wait_s(ProviderError("timeout", "x"), 3, policy, 60.0) == 2.0  # jitter: half of 4


# -- a round against a real SDK ---------------------------------------------------------------------


async def test_a_429_with_retry_after_is_retried_on_the_same_provider_after_that_wait_and_the_round_records_it() -> None:
    clock = Clock()
    with model_server(replies=[RATE_LIMITED, Reply(text="all green")]) as server:
        org = company(providers=[openai(server.base_url), {"kind": "echo"}])
        result, rec = await one_turn(org, clock, scale=0.01)
    assert result.ok and result.response == "all green" and result.provider_key == "openai:local-7b"
    assert clock.waits == [0.01] and len(server.requests) == 2
    assert rec.of("provider_fallback") == [] and rec.of("llm_unavailable") == []
    [phase] = rec.of("agent_phase_completed")
    [entry] = phase.data.rounds
    assert entry["retries"] == [{"attempt": 1, "kind": "rate_limited", "wait_s": 0.01, "retry_after_s": 1.0}]
    assert entry["stop_reason"] == "end"


async def test_a_provider_that_stays_down_is_given_its_attempts_then_the_chain_falls_back() -> None:
    clock = Clock()
    with model_server(status=503) as server:
        org = company(providers=[openai(server.base_url, retry={"attempts": 2, "max_wait_s": 5}), {"kind": "echo"}])
        result, rec = await one_turn(org, clock)
    assert result.ok and result.provider_key == "echo" and len(server.requests) == 3
    assert clock.waits == [1.0, 2.0]  # exponential, from one second
    [phase] = rec.of("agent_phase_completed")
    failed, answered = phase.data.rounds
    assert failed["error_kind"] == "server_error" and "retries" not in answered
    assert [(r["attempt"], r["kind"], r["wait_s"]) for r in failed["retries"]] == [(1, "server_error", 1.0), (2, "server_error", 2.0)]
    [fallback] = rec.of("provider_fallback")
    assert (fallback.data.from_provider_key, fallback.data.to_provider_key) == ("openai:local-7b", "echo")


async def test_a_connection_nobody_answers_is_retried_as_unreachable_before_the_hand_off() -> None:
    clock = Clock()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # bound, never listening: every connect is refused
        org = company(providers=[openai(nobody, timeout_s=5, retry={"attempts": 1}), {"kind": "echo"}])
        result, rec = await one_turn(org, clock)
    assert result.ok and result.provider_key == "echo" and clock.waits == [1.0]
    [phase] = rec.of("agent_phase_completed")
    assert [r["kind"] for r in phase.data.rounds[0]["retries"]] == ["unreachable"]


@pytest.mark.parametrize("status", [401, 400])
async def test_a_failure_no_retry_can_cure_moves_the_chain_on_at_once(status: int) -> None:
    clock = Clock()
    with model_server(status=status) as server:
        result, rec = await one_turn(company(providers=[openai(server.base_url), {"kind": "echo"}]), clock)
    assert result.ok and result.provider_key == "echo" and len(server.requests) == 1 and clock.waits == []
    [phase] = rec.of("agent_phase_completed")
    assert "retries" not in phase.data.rounds[0]


async def test_a_retry_after_longer_than_max_wait_s_is_not_waited_for() -> None:
    clock = Clock()
    replies = [Reply(status=429, headers=(("Retry-After", "120"),)), Reply(text="late")]
    with model_server(replies=replies) as server:
        org = company(providers=[openai(server.base_url, retry={"max_wait_s": 30}), {"kind": "echo"}])
        result, _ = await one_turn(org, clock)
    assert result.provider_key == "echo" and clock.waits == [] and len(server.requests) == 1


async def test_a_seat_that_is_no_longer_this_nodes_after_the_wait_makes_no_further_call_to_any_provider() -> None:
    owned = {"ada": True}
    clock = Clock(during=lambda: owned.update(ada=False))
    with model_server(replies=[RATE_LIMITED, Reply(text="too late")]) as server:
        org = company(providers=[openai(server.base_url), {"kind": "echo"}])
        result, rec = await one_turn(org, clock, owns=lambda handle: owned[handle])
    assert result.fenced and result.outcome == "stopped" and len(server.requests) == 1
    assert rec.of("provider_fallback") == [] and rec.of("llm_unavailable") == []
    [phase] = rec.of("agent_phase_completed")
    assert phase.data.rounds[0]["retries"][0]["kind"] == "rate_limited"  # the wait it took is still on record


# -- the company key, and /metrics -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry", "refusal"),
    [
        ({"attempts": 11}, "providers.llm[0].retry.attempts=11: must be between 0 and 10"),
        ({"attempts": 1.5}, "providers.llm[0].retry.attempts=1.5: must be a whole number between 0 and 10"),
        ({"max_wait_s": 0}, "providers.llm[0].retry.max_wait_s=0: must be between 0.1 and 300"),
        ({"max_wait_s": float("nan")}, "providers.llm[0].retry.max_wait_s=nan: must be a number between 0.1 and 300"),
        ({"tries": 3}, "providers.llm[0].retry.tries=3: unknown key; allowed: attempts, max_wait_s"),
        ([3], "providers.llm[0].retry=[3]: must be a mapping"),
    ],
)
def test_a_bad_retry_is_refused_at_load_in_one_line_naming_the_field(retry: Any, refusal: str) -> None:
    with pytest.raises(CompanyError) as refused:
        company(providers=[openai("http://127.0.0.1:1/v1", retry=retry)])
    assert str(refused.value).startswith(refusal) and "\n" not in str(refused.value)


def test_retry_defaults_to_two_attempts_of_at_most_thirty_seconds_and_the_echo_model_takes_none() -> None:
    [entry] = company(providers=[openai("http://127.0.0.1:1/v1", retry={"attempts": 0})]).providers
    assert entry.options["retry"] == {"attempts": 0, "max_wait_s": 30.0}
    assert RetryPolicy() == RetryPolicy(attempts=2, max_wait_s=30.0)
    with pytest.raises(CompanyError, match=r"providers\.llm\[0\]\.retry=.*unknown key"):
        company(providers=[{"kind": "echo", "retry": {"attempts": 1}}])


def test_metrics_count_each_recorded_retry_by_its_kind() -> None:
    metrics = EngineMetrics()
    rounds = [
        {"round": 1, "duration_ms": 5, "retries": [{"attempt": 1, "kind": "rate_limited", "wait_s": 1.0}]},
        {"round": 2, "duration_ms": 5, "retries": [{"attempt": 1, "kind": "server_error"}, {"attempt": 2, "kind": "server_error"}]},
        {"round": 3, "duration_ms": 5},
    ]
    phase = events.new(AgentPhaseCompleted(seat="ada", turn_id="t", rounds=rounds), Trace.root())
    metrics.published("crewlet.events.agent_phase_completed", phase, "ok")
    text = metrics.render().decode()
    assert 'crewlet_llm_retries_total{kind="rate_limited"} 1.0' in text
    assert 'crewlet_llm_retries_total{kind="server_error"} 2.0' in text
