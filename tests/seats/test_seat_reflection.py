"""Post-turn reflection on the node holding the seat: on, limited and off; its rows, its events, its spend and its retries."""
from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from crewlet.company.fields import CompanyError
from crewlet.company.org import Organization
from crewlet.company.parse import parse_company
from crewlet.queue import topics
from seats.memory import store
from seats.memory.reflection import learned
from seats_support import Recorder, eventually, memory_queues, running, send, wake

DB = pytest.mark.django_db(transaction=True, databases=["default", "events"])
pytestmark = pytest.mark.usefixtures("close_store_connections")
LEARNED = {"counterparties": {"sam": "wants short answers", "nobody": "not in the turn"}, "facts": {"deploy_day": "Thursday"}}


def reflecting_company(reflection: list[dict[str, Any]], **modes: str) -> Organization:
    return parse_company(
        {
            "org": "acme",
            "providers": {"llm": [{"kind": "echo"}], "reflection": reflection},
            "seats": [
                {"handle": "ada", "kind": "agent", "reflection": modes.get("ada", "on")},
                {"handle": "linus", "kind": "agent", "reflection": modes.get("linus", "off")},
                {"handle": "grace", "kind": "human"},
            ],
        }
    )


def answers(text: str) -> list[dict[str, Any]]:
    return [{"kind": "echo", "match": "Reflect on", "script": [{"answer": text}]}]


def test_a_reflection_mode_outside_the_set_or_a_chain_that_is_no_list_is_refused_naming_the_field() -> None:
    with pytest.raises(CompanyError, match=r"seats\[0\]\.reflection.*'sometimes'.*must be one of off, on, limited"):
        reflecting_company([], ada="sometimes")
    with pytest.raises(CompanyError, match=r"providers\.reflection.*must be a list"):
        parse_company({"org": "acme", "providers": {"reflection": "echo"}, "seats": []})
    assert reflecting_company([]).seat_by_handle("ada").reflection == "on"


def test_an_answer_becomes_rows_about_the_people_of_the_turn_and_limited_keeps_only_those() -> None:
    text = "Here you go: " + json.dumps(LEARNED)
    assert learned(text, ["sam"], limited=False) == [("counterparty", "sam", "wants short answers"), ("facts", "deploy_day", "Thursday")]
    assert learned(text, ["sam"], limited=True) == [("counterparty", "sam", "wants short answers")]
    with pytest.raises(ValueError, match="not the JSON object"):
        learned("I learned nothing", ["sam"], limited=False)


@DB
async def test_a_completed_turn_is_reflected_on_the_holding_node_and_a_seat_with_reflection_off_publishes_nothing() -> None:
    org = reflecting_company(answers(json.dumps(LEARNED)))
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        async with running(q, org):
            await send(q, "ada", wake("ada", "deploy on thursday please", sender="sam"))
            await send(q, "linus", wake("linus", "hello", sender="sam"))
            [done] = await eventually(lambda: rec.of("reflection_completed"), what="ada's turn reflected on")
            await eventually(lambda: len(rec.of("agent_turn_completed")) == 2, what="both turns ended")
            rows = {(r.table, r.key): r.value for r in await sync_to_async(store.listing)("ada")}
    assert done.data.rows == [{"table": "counterparty", "key": "sam"}, {"table": "facts", "key": "deploy_day"}]
    assert done.data.insights == 2 and done.node == q.node
    assert rows == {("counterparty", "sam"): "wants short answers", ("facts", "deploy_day"): "Thursday"}
    assert [e.data.counterparty for e in rec.of("counterparty_profile_updated")] == ["sam"]
    [spend] = rec.of("auxiliary_spend")
    assert (spend.data.stage, spend.data.seat, spend.data.calls, spend.data.failed_calls) == ("reflection", "ada", 1, 0)
    assert spend.data.turn_id == done.data.turn_id and spend.data.input_tokens > 0
    reflected = [topic for topic, _ in rec.seen if topic.endswith(".reflect")]
    assert reflected == [topics.agent_reflect("ada")]  # linus's reflection is off: nothing on its subject


@DB
async def test_a_reflection_whose_model_fails_is_retried_through_the_queue_and_never_holds_the_inbox() -> None:
    org = reflecting_company([{"kind": "echo", "fail": True}])
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        async with running(q, org):
            await send(q, "ada", wake("ada", "first", sender="sam"))
            await eventually(lambda: len(rec.of("auxiliary_spend")) >= 3, what="the reflection tried again")
            await send(q, "ada", wake("ada", "second", sender="sam"))
            await eventually(lambda: len(rec.of("agent_turn_completed")) == 2, what="the inbox went on meanwhile")
    assert not rec.of("reflection_completed")
    assert all(s.data.failed_calls == 1 and s.data.calls == 1 for s in rec.of("auxiliary_spend"))


@DB
async def test_reflection_turned_on_by_an_applied_company_reflects_the_next_turn_of_a_seat_already_held() -> None:
    answer = answers(json.dumps({"counterparties": {"sam": "asked twice"}}))
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        async with running(q, reflecting_company(answer, ada="off")) as runtime:
            await send(q, "ada", wake("ada", "first", sender="sam"))
            await eventually(lambda: len(rec.of("agent_turn_completed")) == 1, what="the first turn ended")
            await runtime.apply(reflecting_company(answer, ada="limited"))
            await send(q, "ada", wake("ada", "second", sender="sam"))
            [done] = await eventually(lambda: rec.of("reflection_completed"), what="the second turn reflected on")
    assert done.data.rows == [{"table": "counterparty", "key": "sam"}]
    assert len([topic for topic, _ in rec.seen if topic == topics.agent_reflect("ada")]) == 1  # the first turn: off
