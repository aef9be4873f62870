"""Steering inside one turn: what a note waiting in a turn that a person stops becomes, against a local model server.

The delivered path, the refusals and the fleet's scatter are shown through a
real ``up`` (``tests/seats/test_steer_up.py``, ``tests/fleet/test_fleet_steer_up.py``);
this is the stop path, which those do not reach: a turn ended at its next
round by a person's pause never reads the note, so it is ``expired``, and the
turn's box refuses any note offered after that.
"""
from __future__ import annotations

import asyncio

import pytest

from crewlet.company.org import CompanyHolder
from seats.turn_types import Steer, Trigger, TurnStop
from seats.turns import TurnRunner
from seats_support import Recorder, Reply, company, eventually, held_model, memory_queues, wake

DB = pytest.mark.django_db(transaction=True, databases=["default", "events"])


@DB
async def test_a_note_waiting_when_a_person_stops_the_turn_is_expired_and_the_ended_turn_refuses_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "sk-local")
    with held_model([Reply(calls=(("look_around", {}),)), Reply(text="never asked")]) as model:
        org = company(
            providers=[{"kind": "openai", "model": "m1", "base_url": model.base_url, "api_key_env": "TEST_LLM_KEY"}],
            seats=[{"handle": "ada", "kind": "agent", "role": "engineer"}],
        )
        seat = org.seat_by_handle("ada")
        assert seat is not None
        async with memory_queues() as (_, [q]):
            rec = Recorder().attach(q)
            trigger = Trigger(events=[wake("ada", "ship it")])
            turn = asyncio.ensure_future(TurnRunner(q, CompanyHolder(org)).run(seat, trigger))
            await eventually(lambda: len(model.requests) == 1)
            assert trigger.notes.offer(Steer(note="use staging", note_id="n-1", steered_by="grace", sent_at="t"))
            trigger.stop = TurnStop(by="grace", reason="wrong branch")
            model.gates[0].set()
            result = await turn
            late = trigger.notes.offer(Steer(note="too late", note_id="n-2"))

    assert result.outcome == "stopped" and len(model.requests) == 1
    [expired] = rec.of("agent_turn_steered")
    assert (expired.data.status, expired.data.note_id, expired.data.note, expired.data.round) == ("expired", "n-1", "use staging", 0)
    assert expired.data.turn_id == result.turn_id and expired.data.steered_by == "grace"
    assert late is False
