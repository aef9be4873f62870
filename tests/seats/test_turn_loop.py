"""The tool loop: rounds against local OpenAI- and Anthropic-compatible servers and the scripted echo model.

The seat's MCP tools come from an in-test toolbox (``turn_support``): what is
under test here is the loop — the rounds it records, what the model is sent
back, where it stops — and the built-in ``a2a_ask``, not the MCP sessions.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import pytest
from asgiref.sync import sync_to_async

from a2a.models import Channel
from crewlet.company.fields import CompanyError
from crewlet.company.org import CompanyHolder, Organization
from crewlet.queue.contract import EventQueue
from crewlet.queue.memory import MemoryBroker
from seats.actions import apause_seat
from seats.delivery_models import LedgerEntry
from seats.provider_base import Completion, ModelRequest
from seats.providers import EchoProvider
from seats.turn_types import Trigger, TurnResult
from seats.turns import TurnRunner
from seats_support import FAST, Recorder, Reply, company, eventually, memory_queues, model_server, running, send, wake
from turn_support import NotesToolbox

DB = pytest.mark.django_db(transaction=True, databases=["default", "events"])
SEATS = [
    {"handle": "ada", "kind": "agent", "role": "engineer", "tools": ["a2a_ask"]},
    {"handle": "linus", "kind": "agent", "role": "reviewer"},
    {"handle": "grace", "kind": "human", "role": "lead"},
]


def echo(*script: dict[str, Any], **options: Any) -> dict[str, Any]:
    return {"kind": "echo", "script": list(script), **options}


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"tool": tool, "arguments": arguments}


def org_with(provider: dict[str, Any], **ada: Any) -> Organization:
    seats = [dict(SEATS[0], **ada), *SEATS[1:]]
    return company(providers=[provider], seats=seats)


async def one_turn(org: Organization, body: str, tools: Optional[NotesToolbox] = None) -> tuple[TurnResult, Recorder]:
    """One turn of ada woken by ``body``, run on a memory queue; what it returned and what it published."""
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        seat = org.seat_by_handle("ada")
        assert seat is not None
        result = await TurnRunner(q, CompanyHolder(org), toolbox=tools).run(seat, Trigger(events=[wake("ada", body)]))
    return result, rec


# -- the vendors' SDKs against local servers --------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_vendor_model_calls_a_tool_then_answers_and_the_phase_records_a_tool_use_round_then_an_end_round(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "sk-local")
    replies = [Reply(calls=(("notes__write", {"text": "deploy at 5"}),)), Reply(text="noted: deploy at 5")]
    tools = NotesToolbox()
    with model_server(replies=replies) as server:
        url = server.base_url if kind == "openai" else server.root_url
        org = org_with({"kind": kind, "model": "m1", "base_url": url, "api_key_env": "TEST_LLM_KEY"})
        result, rec = await one_turn(org, "remember: deploy at 5", tools)

    assert result.ok and result.response == "noted: deploy at 5" and tools.notes == ["deploy at 5"]
    [phase] = rec.of("agent_phase_completed")
    first, second = phase.data.rounds
    assert (first["round"], first["stop_reason"], second["round"], second["stop_reason"]) == (1, "tool_use", 2, "end")
    assert 0 <= first["started_ms"] <= second["started_ms"] and first["duration_ms"] >= 0
    assert (first["tool_count"], first["tool_bytes"], second["tool_count"]) == (1, len("saved note 1"), 0)
    [made] = first["tool_calls"]
    assert (made["server"], made["tool"], made["ok"], made["bytes"]) == ("notes", "write", True, len("saved note 1"))
    assert "arguments" not in made  # the rounds carry no arguments; the phase's tool_calls do
    assert phase.data.tool_calls[0]["arguments"] == {"text": "deploy at 5"}
    assert (phase.data.input_tokens, phase.data.output_tokens) == (22, 10)
    [done] = rec.of("agent_turn_completed")
    assert (done.data.tool_calls, done.data.tools, done.payload["outcome"]) == (1, ["notes__write"], "completed")
    [size] = rec.of("prompt.size")
    assert size.data.tool_count == 4 and size.data.tool_bytes > 0  # three MCP tools and a2a_ask

    asked, fed_back = server.requests
    if kind == "openai":
        assert [t["function"]["name"] for t in asked["tools"]] == ["notes__write", "notes__broken", "notes__read", "a2a_ask"]
        assert fed_back["messages"][-2]["tool_calls"][0]["id"] == "call_1_0"
        assert fed_back["messages"][-1] == {"role": "tool", "tool_call_id": "call_1_0", "content": "saved note 1"}
    else:
        assert [t["name"] for t in asked["tools"]] == ["notes__write", "notes__broken", "notes__read", "a2a_ask"]
        assert fed_back["messages"][-1] == {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1_0", "content": "saved note 1", "is_error": False}],
        }
        # The prompt cache's two breakpoints: the system prompt (one text block) and the last tool definition.
        [system] = asked["system"]
        assert system["text"].startswith("You are Ada") and system["cache_control"] == {"type": "ephemeral"}
        assert [t.get("cache_control") for t in asked["tools"]] == [None, None, None, {"type": "ephemeral"}]
    sent = server.headers[0]
    assert "sk-local" in (sent.get("x-api-key"), sent.get("authorization", "").removeprefix("Bearer "))


async def test_a_failing_tool_is_a_result_the_model_reads_and_the_turn_completes() -> None:
    replies = [Reply(calls=(("notes__broken", {"text": "x"}),)), Reply(text="the notes server is down")]
    with model_server(replies=replies) as server:
        org = org_with({"kind": "openai", "model": "m1", "base_url": server.base_url})
        result, rec = await one_turn(org, "note x", NotesToolbox())
        fed_back = server.requests[1]["messages"][-1]
    assert fed_back == {"role": "tool", "tool_call_id": "call_1_0", "content": "error: the notes server did not answer within 5 s"}
    assert result.ok and result.response == "the notes server is down"
    [phase] = rec.of("agent_phase_completed")
    [failed] = phase.data.rounds[0]["tool_calls"]
    assert (failed["ok"], failed["error"], failed["server"]) == (False, "the notes server did not answer within 5 s", "notes")
    assert not phase.data.failed


async def test_a_refusal_ends_the_turn_and_the_phase_carries_it() -> None:
    with model_server(replies=[Reply(text="I will not do that", stop="refusal")]) as server:
        result, rec = await one_turn(org_with({"kind": "anthropic", "model": "m1", "base_url": server.root_url}), "do it")
    assert result.ok and result.stop_reason == "refusal"
    [phase] = rec.of("agent_phase_completed")
    assert (phase.data.error_kind, phase.data.refusal) == ("refusal", {"category": "", "explanation": "I will not do that"})
    assert [r["stop_reason"] for r in phase.data.rounds] == ["refusal"]


# -- the scripted echo model -------------------------------------------------------------------


async def test_max_rounds_fails_a_model_that_never_stops_calling_tools_with_a_max_iter_guard_breach() -> None:
    tools = NotesToolbox()
    org = org_with(echo(call("notes__write", text="{trigger}"), repeat=True), max_rounds=3)
    result, rec = await one_turn(org, "loop forever", tools)
    assert result.outcome == "failed" and len(tools.calls) == 3 and tools.notes == ["sam: loop forever"] * 3
    assert (result.guard, result.wrote) == ("max_iter", True)
    assert rec.of("agent_turn_stopped") == []  # a guard breach is a failed turn, never a stop
    [breach] = rec.of("turn.guard_breach")
    assert (breach.data.guard, breach.data.turn_id) == ("max_iter", result.turn_id)
    assert breach.data.detail == "no answer after 3 rounds (the seat's max_rounds)"
    [phase] = rec.of("agent_phase_completed")
    assert [r["stop_reason"] for r in phase.data.rounds] == ["tool_use"] * 3
    assert (phase.data.failed, phase.data.error_kind) == (True, "max_iter")
    [done] = rec.of("agent_turn_completed")
    assert (done.data.stopped, done.data.failed, done.payload["outcome"]) == (False, True, "failed")
    assert done.data.error.startswith("max_iter: no answer after 3 rounds")
    assert rec.types().index("turn.guard_breach") < rec.types().index("agent_turn_completed")


async def test_the_turn_token_budget_stops_the_turn_before_the_round_that_would_pass_it() -> None:
    org = org_with(echo(call("notes__write", text="{trigger}"), repeat=True), turn_token_budget=20)
    result, rec = await one_turn(org, "spend", NotesToolbox())
    assert result.outcome == "stopped" and result.stop_reason == "budget_exhausted"
    assert result.input_tokens + result.output_tokens >= 20 and len(result.rounds) >= 1
    [stop] = rec.of("agent_turn_stopped")
    assert stop.data.reason.startswith("budget_exhausted")


async def test_asking_itself_a_human_or_nobody_is_a_tool_error_the_model_reads_and_no_channel_opens() -> None:
    asks = {
        "calls": [
            call("a2a_ask", to="ada", brief="me?"),
            call("a2a_ask", to="grace", brief="you?"),
            call("a2a_ask", to="nobody", brief="anyone?"),
        ]
    }
    result, rec = await one_turn(org_with(echo(asks, {"answer": "no one to ask"})), "ask around")
    assert result.ok and result.response == "no one to ask"
    [phase] = rec.of("agent_phase_completed")
    errors = [c["error"] for c in phase.data.rounds[0]["tool_calls"]]
    assert errors[0].startswith("ada cannot ask itself") and "linus" in errors[0]
    assert errors[1].startswith("grace is a human seat")
    assert errors[2].startswith("no seat 'nobody' in acme")
    assert [r["stop_reason"] for r in phase.data.rounds] == ["tool_use", "end"]
    assert rec.of("a2a_channel_opened") == []


async def test_a_tool_the_seat_was_not_offered_is_refused_to_the_model_and_never_called() -> None:
    tools = NotesToolbox()
    org = org_with(echo({"calls": [call("a2a_ask", to="linus", brief="?")]}), tools=[])
    result, rec = await one_turn(org, "ask linus", tools)
    [phase] = rec.of("agent_phase_completed")
    [refused] = phase.data.rounds[0]["tool_calls"]
    assert refused["ok"] is False and refused["error"].startswith("no tool named 'a2a_ask' was offered")
    assert result.ok and rec.of("a2a_channel_opened") == []


def test_a_secret_written_inline_is_refused_at_load_naming_the_field_and_never_the_value() -> None:
    with pytest.raises(CompanyError) as refused:
        company(providers=[{"kind": "anthropic", "model": "m", "api_key": "sk-ant-very-secret"}])
    assert refused.value.field == "providers.llm[0].api_key" and "api_key_env" in str(refused.value)
    assert "sk-ant-very-secret" not in str(refused.value)
    with pytest.raises(CompanyError, match=r"seats\[0\]\.max_rounds=0: must be between 1 and 100"):
        org_with(echo(), max_rounds=0)
    with pytest.raises(CompanyError, match=r"seats\[0\]\.tools\[0\]='shell': must be an mcp_servers name or a built-in tool"):
        org_with(echo(), tools=["shell"])


# -- on running seats (the ledger and the channels in the test database) ----------------------


@sync_to_async
def channel_rows() -> list[Channel]:
    return list(Channel.objects.all())


@sync_to_async
def ledger(seat: str) -> dict[str, str]:
    """The seat's completion ledger: each trigger identity with the turn that worked it."""
    return dict(LedgerEntry.objects.filter(seat=seat).values_list("trigger", "turn_id"))


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_ada_asks_linus_with_a2a_ask_linus_answers_and_ada_is_woken_with_the_answer() -> None:
    org = org_with(echo(call("a2a_ask", to="linus", brief="is the deploy green?"), match="ask linus"))
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        async with running(q, org):
            await send(q, "ada", wake("ada", "ask linus about the deploy", conversation="slack:D0ADA"))
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada", conversation_key=next(
                (f"a2a:{e.data.channel_id}" for e in rec.of("a2a_channel_closed")), "-")), what="ada woken by the answer")

    [asking, woken] = rec.of("agent_phase_completed", seat="ada")
    [ask] = asking.data.rounds[0]["tool_calls"]
    assert (ask["name"], ask["ok"]) == ("a2a_ask", True) and len(asking.data.rounds) == 1  # the turn ended after it
    [opened] = rec.of("a2a_channel_opened")
    assert (opened.data.opened_by, opened.data.target, opened.data.brief) == ("ada", "linus", "is the deploy green?")
    assert opened.data.turn_id == asking.data.turn_id and opened.delegation_chain == ["ada"]
    [answering] = rec.of("agent_phase_completed", seat="linus")
    assert answering.data.user_prompt == "ada: is the deploy green?"
    assert woken.data.user_prompt == f"linus: {answering.data.response}"
    [closed] = rec.of("a2a_channel_closed")
    cid = opened.data.channel_id
    assert (closed.data.channel_id, closed.data.closed_by, closed.data.turn_id, closed.data.work_key) == (
        cid, "linus", answering.data.turn_id, f"a2a:{cid}"
    )
    [row] = await channel_rows()
    assert (row.state, row.closed_by, row.message_count) == (Channel.CLOSED, "linus", 1)


class BySeat:
    """The company's one model entry, scripted per seat: each seat's turns get that seat's echo script."""

    key = "echo"

    def __init__(self, **scripts: EchoProvider) -> None:
        self.scripts = scripts
        self.plain = EchoProvider()

    async def complete(self, request: ModelRequest) -> Completion:
        return await self.scripts.get(request.seat, self.plain).complete(request)

    async def aclose(self) -> None:
        return None


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_linus_answers_adas_ask_by_asking_hopper_and_the_turn_on_hoppers_answer_is_what_answers_ada() -> None:
    org = company(seats=[
        {"handle": "ada", "kind": "agent", "tools": ["a2a_ask"]},
        {"handle": "linus", "kind": "agent", "tools": ["a2a_ask"]},
        {"handle": "hopper", "kind": "agent"},
    ])
    model = BySeat(
        ada=EchoProvider(script=[{"calls": [call("a2a_ask", to="linus", brief="is the deploy green?")]}], match="ask linus"),
        linus=EchoProvider(script=[{"calls": [call("a2a_ask", to="hopper", brief="is staging green?")]}], match="ada:"),
    )
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        runner = TurnRunner(q, CompanyHolder(org), provider_factory=lambda _config: model)
        async with running(q, org, runner=runner):
            await send(q, "ada", wake("ada", "ask linus about the deploy", conversation="slack:D0ADA"))
            await eventually(lambda: len(rec.of("agent_turn_completed", seat="ada")) == 2, what="ada woken by the answer")

    by_target = {e.data.target: e.data.channel_id for e in rec.of("a2a_channel_opened")}
    to_linus, to_hopper = by_target["linus"], by_target["hopper"]
    [asked, answering] = rec.of("agent_phase_completed", seat="linus")
    assert asked.data.rounds[0]["tool_calls"][0]["name"] == "a2a_ask" and asked.data.response == ""
    [hoppers] = rec.of("agent_phase_completed", seat="hopper")
    # woken by hopper's answer, and shown the ask it answers: who asked, and what
    assert answering.data.user_prompt.startswith("ada asked you: is the deploy green?\n")
    assert answering.data.user_prompt.endswith(f"\nhopper: {hoppers.data.response}") and hoppers.data.response
    closes = {e.data.channel_id: e.data for e in rec.of("a2a_channel_closed")}
    assert (closes[to_hopper].closed_by, closes[to_linus].closed_by) == ("hopper", "linus")
    assert (closes[to_linus].turn_id, closes[to_linus].work_key) == (answering.data.turn_id, f"a2a:{to_linus}")
    [_, woken] = rec.of("agent_phase_completed", seat="ada")
    assert woken.data.user_prompt == f"linus: {answering.data.response}" and "is staging green?" in woken.data.user_prompt
    assert [m.data.message for m in rec.of("a2a_message_sent") if m.data.to_seat == "ada"] == [answering.data.response]


class Gated:
    """A model whose every call waits until the test lets it answer (``entered`` says one is in flight)."""

    key = "echo"

    def __init__(self, model: EchoProvider) -> None:
        self.model = model
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, request: ModelRequest) -> Completion:
        self.entered.set()
        await self.release.wait()
        return await self.model.complete(request)

    async def aclose(self) -> None:
        return None


async def stopped_while(
    org: Organization, tools: NotesToolbox, in_flight: asyncio.Event, let_go: asyncio.Event, model: Optional[Gated] = None
) -> tuple[Recorder, str]:
    """Wake ada, pause it with stop_running while ``in_flight`` work waits on ``let_go``, then let it finish.

    Returns what was published and the trigger's id, once the turn has ended.
    """
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        options: dict[str, Any] = {"toolbox": tools}
        if model is not None:
            options["runner"] = TurnRunner(q, CompanyHolder(org), provider_factory=lambda _config: model, toolbox=tools)
        async with running(q, org, **options) as rt:
            sent = await send(q, "ada", wake("ada", "keep writing"))
            await asyncio.wait_for(in_flight.wait(), timeout=60)
            assert await apause_seat("ada", by="grace", reason="wrong repo", stop_running=True) is True
            await eventually(lambda: rt.loops["ada"].stopping, what="the stop reached the running turn")
            assert rec.of("agent_turn_completed", seat="ada") == []  # what is in flight is not cut
            let_go.set()
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"), what="the turn ended")
    return rec, sent.id


def assert_stopped_at_round_two(rec: Recorder, trigger_id: str, ledger_now: dict[str, str]) -> dict[str, Any]:
    """The turn ended before its second round: stopped by grace, recorded as worked; its first round returned."""
    [stopped] = rec.of("agent_turn_stopped", seat="ada")
    assert (stopped.data.stopped_by, stopped.data.reason) == ("grace", "wrong repo")
    [done] = rec.of("agent_turn_completed", seat="ada")
    assert done.data.stopped is True and done.data.failed is False
    [phase] = rec.of("agent_phase_completed", seat="ada")
    assert [(r["round"], r["stop_reason"]) for r in phase.data.rounds] == [(1, "tool_use"), (2, "paused")]
    assert "provider_key" not in phase.data.rounds[1]  # the paused round called no model
    assert ledger_now == {f"event:{trigger_id}": stopped.data.turn_id}
    return phase.data.rounds[0]


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_a_pause_with_stop_running_lets_the_tool_call_in_flight_finish_and_ends_the_turn_at_its_next_round() -> None:
    org = org_with(echo({"calls": [call("notes__write", text="{trigger}")]}, repeat=True))
    tools = NotesToolbox(hold=asyncio.Event())
    assert tools.hold is not None
    rec, trigger_id = await stopped_while(org, tools, tools.entered, tools.hold)
    first = assert_stopped_at_round_two(rec, trigger_id, await ledger("ada"))
    assert [(c["name"], c["ok"]) for c in first["tool_calls"]] == [("notes__write", True)]
    assert len(tools.notes) == 1 and len(tools.calls) == 1  # the write finished; the looping model was not called again


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_a_pause_with_stop_running_during_a_model_call_runs_none_of_the_tools_that_call_asks_for() -> None:
    org = org_with(echo())
    model = Gated(EchoProvider(script=[{"calls": [call("notes__write", text="{trigger}")]}], repeat=True))
    tools = NotesToolbox()
    rec, trigger_id = await stopped_while(org, tools, model.entered, model.release, model)
    first = assert_stopped_at_round_two(rec, trigger_id, await ledger("ada"))
    assert (first["tool_count"], first["tool_calls"]) == (0, [])
    assert tools.calls == [] and tools.notes == []


async def _crash_mid_tool(q: EventQueue, org: Organization, tools: NotesToolbox) -> None:
    """Run ada until a tool call is in flight, then end its turn there and the node's connection, as a crash does."""
    async with running(q, org, toolbox=tools):
        await send(q, "ada", wake("ada", "write it down", delivery_id="D-7"))
        await asyncio.wait_for(tools.entered.wait(), timeout=60)
        assert tools.running is not None
        tools.running.cancel()
    await q.close()  # nothing of this node settles the delivery: it goes back for the next one


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_a_trigger_redelivered_after_its_turn_died_mid_tool_runs_no_second_turn() -> None:
    org = org_with(echo(call("notes__write", text="{trigger}")))
    stuck = NotesToolbox(hold=asyncio.Event())
    broker = MemoryBroker(FAST)
    first, second = broker.client(node="n1"), broker.client(node="n2")
    try:
        rec = Recorder().attach(first, second)
        await _crash_mid_tool(first, org, stuck)
        [started] = rec.of("agent_turn_started", seat="ada")
        assert await ledger("ada") == {"delivery:slack:D-7": started.data.turn_id}  # recorded before the tool ran

        again = NotesToolbox()
        async with running(second, org, toolbox=again):
            await eventually(lambda: rec.of("turn_trigger_skipped", seat="ada"), what="the redelivery skipped")
    finally:
        await first.close()
        await second.close()
    [skip] = rec.of("turn_trigger_skipped", seat="ada")
    assert (skip.data.turn_id, skip.data.reason) == (started.data.turn_id, "already worked")
    assert len(stuck.calls) == 1 and again.calls == [] and len(rec.of("agent_turn_started", seat="ada")) == 1


@DB
@pytest.mark.usefixtures("close_store_connections")
async def test_a_digest_turn_records_every_wake_it_merged_before_its_first_tool_call_runs() -> None:
    from seats.coalescer import coalesce
    from seats.mailboxes import ensure_mailboxes

    org = org_with(echo(call("notes__write", text="{trigger}")))
    held = NotesToolbox(hold=asyncio.Event())
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        await ensure_mailboxes(q, org)
        for i in range(2):
            await send(q, "ada", wake("ada", f"part {i}", partition_key="slack:D1:1.1", delivery_id=f"M-{i}"))
        async with running(q, org, toolbox=held, merge=coalesce):
            await asyncio.wait_for(held.entered.wait(), timeout=60)
            recorded_mid_tool = set(await ledger("ada"))
            assert held.hold is not None
            held.hold.set()
            await eventually(lambda: rec.of("agent_turn_completed", seat="ada"), what="the digest turn finished")
    assert recorded_mid_tool == {"delivery:slack:M-0", "delivery:slack:M-1"}
    [(_, made)] = held.calls
    assert "part 0" in made.arguments["text"] and "part 1" in made.arguments["text"]  # the digest was the trigger
