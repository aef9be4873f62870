"""Where a model's words enter a turn: a whole-call deadline, odd bytes made storable, a key never kept, a record that fits.

Each case drives the real provider against a server on loopback that speaks the
vendor's HTTP API, or the real turn code on a value a model could send.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, Iterator

import pytest

from crewlet.events.types import AgentPhaseCompleted
from crewlet.queue.contract import MAX_PAYLOAD_BYTES
from seats.provider_base import ERR_AUTH, ERR_TIMEOUT, Completion, Message, ModelRequest, ProviderError
from seats.provider_openai import OpenAIProvider
from seats.provider_sdk import translate
from seats.tools.base import ToolCall, ToolResult
from seats.turn_record import CUT_ARGUMENTS, PHASE_RECORD_MAX_BYTES, fit_phase
from seats.turn_tools import admitted_result
from seats_support import loopback_http
from tests.process_support import REPO_ROOT

ANSWER = {
    "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class Trickle:
    """Sends a whole answer's headers at once, then its body a byte at a time, ``gap_s`` apart; counts what it sent."""

    def __init__(self, gap_s: float) -> None:
        self.gap_s = gap_s
        self.sent = 0
        self.total = 0
        self.cut = threading.Event()


@pytest.fixture
def trickle() -> Iterator[tuple[Trickle, str]]:
    state = Trickle(gap_s=0.05)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = json.dumps(ANSWER).encode()
            state.total = len(data)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                for byte in data:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    state.sent += 1
                    if state.cut.wait(state.gap_s):
                        return
            except OSError:
                state.cut.set()  # the client hung up on it

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_http(Handler) as port:
        try:
            yield state, f"http://127.0.0.1:{port}/v1"
        finally:
            state.cut.set()  # before the server stops: the handler is still trickling


async def test_a_server_trickling_its_answer_is_a_timeout_at_the_whole_calls_deadline(trickle: tuple[Trickle, str]) -> None:
    state, base_url = trickle
    # Each byte arrives well inside the per-read timeout; the whole answer would take ~15 s.
    provider = OpenAIProvider(base_url=base_url, model="m", timeout_s=0.5)
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(ModelRequest(system="s", messages=[Message(role="user", text="hi")]))
    finally:
        await provider.aclose()
    assert caught.value.kind == ERR_TIMEOUT and "no whole answer within 0.5 s" in str(caught.value)
    assert 0 < state.sent < state.total, "the call ended while the server was still sending"


def test_a_providers_error_is_bounded_storable_and_never_holds_the_key_it_was_called_with() -> None:
    key = "sk-live-0123456789abcdefABCDEF0123456789"
    said = ProviderError(ERR_AUTH, f"Incorrect API key provided: {key}\x00\ud800 " + "x" * 5000)
    error = translate(said, "https://api.example", key)
    text = str(error)
    assert error.kind == ERR_AUTH and key not in text and "Incorrect API key provided" in text
    assert "\x00" not in text and "\ud800" not in text and len(text) <= 1000
    text.encode("utf-8")  # storable: no lone surrogate left


def test_a_tools_result_with_odd_bytes_is_made_storable_where_it_enters_the_turn() -> None:
    odd = ToolResult(ok=False, content="a\x00b\udc80", bytes=4, server="s", tool="t", duration_s=0.1, error="e\x00")
    made = admitted_result(odd)
    assert (made.content, made.error) == ("a\\u0000b\\udc80", "e\\u0000")
    fine = ToolResult(ok=True, content="plain", bytes=5, server="s", tool="t", duration_s=0.1)
    assert admitted_result(fine) is fine


def test_a_phase_record_larger_than_the_wire_takes_is_cut_and_says_what_was_cut() -> None:
    huge = "y" * (12 * 1024 * 1024)
    phase = AgentPhaseCompleted(
        seat="ada", turn_id="t1", system_prompt="you are ada", user_prompt="hi", response=huge,
        tool_calls=[{"id": "c1", "name": "notes__write", "arguments": {"text": "z" * (5 * 1024 * 1024)}}],
    )
    fitted = fit_phase(phase)
    weight = len(json.dumps(fitted.__dict__, default=str))
    assert weight <= PHASE_RECORD_MAX_BYTES < MAX_PAYLOAD_BYTES
    assert fitted.truncated == ["response", CUT_ARGUMENTS]
    assert fitted.response.startswith("yyyy") and fitted.tool_calls == [{"id": "c1", "name": "notes__write"}]
    small = AgentPhaseCompleted(seat="ada", turn_id="t2", response="short")
    assert fit_phase(small) is small and small.truncated == []


def test_an_answer_holding_nul_and_a_lone_surrogate_is_storable_in_every_part_a_turn_records() -> None:
    from seats.provider_base import admitted

    raw = Completion(
        text="ok \x00 \ud800", calls=(ToolCall(id="c\x00", name="a2a_ask", arguments={"brief": "b\ud800", "k\x00": 1}),),
        refusal={"category": "", "explanation": "no\x00"},
    )
    made = admitted(raw)
    json.dumps([made.text, made.calls[0].id, made.calls[0].arguments, made.refusal], ensure_ascii=False).encode("utf-8")
    assert "\x00" not in made.text and made.calls[0].arguments == {"brief": "b\\ud800", "k\\u0000": 1}


RACE = """
import asyncio, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crewlet.settings")
import django
django.setup()
from seats.provider_sdk import load_sdk

async def main() -> None:
    first = asyncio.ensure_future(load_sdk("openai"))
    # Wait for the import in flight to be seen half-built: in sys.modules, not yet whole.
    while not (sys.modules.get("openai") is not None and not hasattr(sys.modules["openai"], "completions")):
        if first.done():
            raise SystemExit("the import finished before it was seen in flight")
        await asyncio.sleep(0)
    second = await load_sdk("openai")
    print("whole" if all(hasattr(second, a) for a in ("OpenAIError", "AsyncOpenAI", "completions")) else "half-built")
    await first

asyncio.run(main())
"""


@pytest.mark.integration  # starts a child process
def test_a_second_first_turn_while_the_sdk_is_still_importing_waits_for_it_instead_of_taking_it_half_built() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWLET_")}
    done = subprocess.run([sys.executable, "-c", RACE], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "whole", done.stdout + done.stderr


async def test_a_turn_whose_seat_stops_being_this_nodes_mid_tool_call_makes_no_further_call() -> None:
    import asyncio

    from crewlet.company.org import CompanyHolder
    from seats.turn_types import STOP_LEASE_LOST, Trigger
    from seats.turns import TurnRunner
    from seats_support import Recorder, Reply, company, memory_queues, model_server, wake
    from turn_support import NotesToolbox

    replies = [Reply(calls=(("notes__write", {"text": "one"}), ("notes__write", {"text": "two"}))), Reply(text="done")]
    tools = NotesToolbox(hold=asyncio.Event())
    owned = {"ada": True}
    with model_server(replies=replies) as server:
        org = company(
            providers=[{"kind": "openai", "model": "m1", "base_url": server.base_url}],
            seats=[{"handle": "ada", "kind": "agent", "role": "engineer", "tools": ["a2a_ask"]}],
        )
        async with memory_queues() as (_, [q]):
            rec = Recorder().attach(q)
            runner = TurnRunner(q, CompanyHolder(org), toolbox=tools, owns=lambda handle: owned[handle])
            seat = org.seat_by_handle("ada")
            assert seat is not None
            turn = asyncio.ensure_future(runner.run(seat, Trigger(events=[wake("ada", "note two things")])))
            await asyncio.wait_for(tools.entered.wait(), 10)
            owned["ada"] = False  # the lease moved while the first call was in flight (a frozen node, waking)
            tools.hold.set()
            result = await asyncio.wait_for(turn, 10)
        asked = len(server.requests)
    assert tools.notes == ["one"] and asked == 1, "no second tool call and no second model call"
    assert (result.outcome, result.stop_reason, result.fenced) == ("stopped", STOP_LEASE_LOST, True)
    [stopped] = rec.of("agent_turn_stopped")
    assert stopped.data.reason.startswith(STOP_LEASE_LOST)
