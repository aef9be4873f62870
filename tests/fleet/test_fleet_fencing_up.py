"""A node frozen in the middle of a tool call wakes after its seat moved and makes no further call.

Two real `manage.py up` nodes share a nats-server and the PostgreSQL
coordination store (the fleet of ``tests/fleet/test_fleet_up.py``). Seat ada's
model (a local OpenAI-compatible server) answers a DM's first round with a
call to an MCP tool that says it started and waits to be opened. While that
call runs on n1, n1 is frozen with SIGSTOP; the tool is opened, so its answer
waits in n1's pipe; n1's lease runs out and n2 takes the seat and settles the
redelivered trigger. Then n1 is woken: it reads the tool's answer, finds the
seat no longer its own, and ends the turn — fenced before its next call
(``lease_lost``), or stopped and handed back when the lease's own deadline
is noticed first — without asking the model or any tool again.
"""
from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from seats_support import json_vendor
from tests.mcp_support import stdio_command
from tests.process_support import is_stopped
from tests.fleet.test_fleet_up import MOVE_S, Fleet, Node, fleet, seen, watcher  # noqa: F401  (fixtures)
from tests.up.test_up_inflight import Watcher, broker, loop  # noqa: F401  (fixtures)
from waiting_support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.timeout(400)]

API_KEY_ENV = "FENCING_OPENAI_KEY"
FENCED = "event=agent_turn_fenced"
GIVEN_UP = "event=seat_leases_given_up"


class Vendor:
    """The model: round 1 calls ``tt__gate`` on a path of its own per request, round 2 answers."""

    def __init__(self, gates: Path) -> None:
        self.gates = gates
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            number = len(self.requests)
        if any(m.get("role") == "tool" for m in body.get("messages", [])):
            message: dict[str, Any] = {"role": "assistant", "content": "done"}
            finish = "stop"
        else:
            args = json.dumps({"path": str(self.gates / f"gate-{number}")})
            message = {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "tt__gate", "arguments": args}}],
            }
            finish = "tool_calls"
        return 200, {
            "id": f"cmpl-{number}", "object": "chat.completion", "created": 0, "model": "gpt-test",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        }

    def count(self) -> int:
        with self._lock:
            return len(self.requests)


@pytest.fixture
def vendor(tmp_path: Path) -> Iterator[tuple[Vendor, str]]:
    gates = tmp_path / "gates"
    gates.mkdir()
    model = Vendor(gates)
    with json_vendor(model.answer) as base_url:
        yield model, base_url


def company(base_url: str) -> str:
    command = json.dumps(stdio_command())
    return (
        "org: acme\n"
        f"providers: {{llm: [{{kind: openai, base_url: \"{base_url}\", model: gpt-test, api_key_env: {API_KEY_ENV}, timeout_s: 60}}]}}\n"
        f"mcp_servers:\n  tt: {{command: {command}}}\n"
        "surfaces: {slack: {signing_secret_env: SLACK_SIGNING_SECRET, verify: false}}\n"
        "seats:\n"
        "  - {handle: ada, kind: agent, identities: {slack: U0ADA}, tools: [tt], max_rounds: 4, placement: {}}\n"
    )


def start(fleet: Fleet, name: str) -> Node:  # noqa: F811
    node = Node(fleet, name)
    node.env[API_KEY_ENV] = "sk-fencing-test-key"
    fleet.nodes[name] = node
    node.start()
    return node


def test_a_node_frozen_mid_tool_call_wakes_after_its_seat_moved_and_asks_neither_the_model_nor_a_tool_again(
    fleet: Fleet, watcher: Watcher, vendor: tuple[Vendor, str]  # noqa: F811
) -> None:
    model, base_url = vendor
    (fleet.tmp / "company.yaml").write_text(company(base_url))
    n1 = start(fleet, "n1")
    wait_until(lambda: fleet.seat_holders() == {"ada": "n1"}, MOVE_S, "n1 holding ada")
    start(fleet, "n2")
    wait_until(lambda: "n2" in fleet.leases_named("n2"), MOVE_S, "n2 on the roster")
    assert fleet.seat_holders() == {"ada": "n1"}

    n1.post_slack("U0ADA", "D0FENCE", "run the gated tool")
    first_gate = model.gates / "gate-1"
    wait_until(lambda: Path(str(first_gate) + ".started").exists(), MOVE_S, "n1's tool call under way")
    assert n1.proc is not None
    os.kill(n1.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: is_stopped(n1.proc.pid), 10, "n1 frozen")  # type: ignore[union-attr]
        first_gate.write_text("open")  # the tool answers into the frozen node's pipe
        wait_until(lambda: fleet.seat_holders() == {"ada": "n2"}, MOVE_S, "n2 holding ada")

        def settled_on_n2() -> list[Any]:
            return [
                e for e in seen(watcher, "turn_trigger_skipped", "ada") + seen(watcher, "agent_turn_completed", "ada")
                if e.node == "n2"
            ]

        def open_n2_gates() -> list[Any]:
            for started in model.gates.glob("gate-*.started"):
                Path(str(started)[: -len(".started")]).write_text("open")
            return settled_on_n2()

        on_n2 = wait_until(open_n2_gates, MOVE_S, "n2 settling the redelivered trigger")
        asked_before_wake = model.count()
        gates_before_wake = sorted(p.name for p in model.gates.glob("*.started"))
    finally:
        os.kill(n1.proc.pid, signal.SIGCONT)

    fenced = wait_until(
        lambda: [e for e in seen(watcher, "agent_turn_completed", "ada") if e.node == "n1"], MOVE_S, "n1's turn ending"
    )
    assert [(e.data.stopped, e.data.failed) for e in fenced] == [(True, False)], fenced
    # Whichever the woken node noticed first ends the turn: the lease's own deadline (the turn is stopped
    # and handed back) or the fence before the turn's next call.
    wait_until(lambda: [line for line in n1.output_so_far().splitlines() if FENCED in line or GIVEN_UP in line],
               10, "n1 naming why its turn ended")
    assert model.count() == asked_before_wake, "the woken node asked the model again"
    assert sorted(p.name for p in model.gates.glob("*.started")) == gates_before_wake, "the woken node called a tool again"
    # n1's one model call was round 1; whatever n2 did with the trigger, it did as the seat's only holder.
    assert on_n2 and fleet.seat_holders() == {"ada": "n2"}
    print(f"\nfrozen mid-tool-call: n2 settled the trigger as {[e.type for e in on_n2]}; "
          f"model calls {asked_before_wake}, gates {gates_before_wake}")
