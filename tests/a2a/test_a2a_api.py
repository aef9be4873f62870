"""/api/a2a/: an operator opens a channel, and reads the channel records."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from a2a.models import Channel
from crewlet.engine.runtime import NO_ENGINE
from crewlet.base.tokens import OperatorToken
from engine_support import engine_here
from seats_support import bearer, eventually, in_thread


@pytest.mark.django_db(databases=["default", "events"])
def test_an_ask_with_no_runtime_in_the_process_is_503_and_opens_nothing() -> None:
    _, token = OperatorToken.mint("tests")
    response = bearer(token).post("/api/a2a/ask", {"from": "ada", "to": "linus", "brief": "hi"}, format="json")
    assert response.status_code == 503
    assert response.json() == {"error": "unavailable", "param": "", "reason": NO_ENGINE}
    assert not Channel.objects.exists()


@pytest.mark.django_db(databases=["default", "events"])
def test_an_ask_naming_an_unknown_seat_is_404_a_human_target_409_and_a_missing_field_400() -> None:
    _, token = OperatorToken.mint("tests")
    c = bearer(token)
    with engine_here():  # the example company
        assert c.post("/api/a2a/ask", {"from": "ada", "to": "nobody", "brief": "hi"}, format="json").status_code == 404
        human = c.post("/api/a2a/ask", {"from": "ada", "to": "grace", "brief": "hi"}, format="json")
        assert human.status_code == 409 and "human" in human.json()["reason"] and human.json()["param"] == "to"
        assert c.post("/api/a2a/ask", {"to": "linus", "brief": "hi"}, format="json").status_code == 400
    assert not Channel.objects.exists()


@pytest.mark.django_db(databases=["default", "events"])
def test_an_unknown_channel_id_is_404_saying_it_is_unknown() -> None:
    _, token = OperatorToken.mint("tests")
    for bogus in ("0b7f6c2e-0000-4000-8000-000000000000", "nope"):
        response = bearer(token).get(f"/api/a2a/channels/{bogus}")
        assert response.status_code == 404 and "unknown" in response.json()["reason"] and response.json()["error"] == "not_found"


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_an_operators_ask_is_201_and_the_list_and_detail_show_the_channel_answered(runtime_on_memory: Any) -> None:
    rt, q, rec = runtime_on_memory
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)

    asked = await asyncio.to_thread(
        in_thread, c.post, "/api/a2a/ask", {"from": "ada", "to": "linus", "brief": "status of POC-7?"}, "json"
    )
    assert asked.status_code == 201, asked.content
    body = asked.json()
    cid = body["id"]
    assert (body["asker"], body["target"], body["participants"]) == ("ada", "linus", ["ada", "linus"])
    assert (body["state"], body["message_count"], body["brief"]) == ("open", 0, "status of POC-7?")
    assert body["opened_at"] and body["closed_at"] is None and body["closed_by"] == ""

    async def answered() -> bool:
        return await sync_to_async(Channel.objects.filter(pk=cid, state=Channel.CLOSED).exists)()

    await eventually(answered, what="linus's turn answered the operator's ask")

    listed = await asyncio.to_thread(in_thread, c.get, "/api/a2a/channels")
    assert listed.status_code == 200
    [row] = listed.json()["channels"]
    assert (row["id"], row["state"], row["message_count"], row["closed_by"]) == (cid, "closed", 1, "linus")

    detail = await asyncio.to_thread(in_thread, c.get, f"/api/a2a/channels/{cid}")
    assert detail.status_code == 200
    one = detail.json()
    [close] = rec.of("a2a_channel_closed")
    assert (one["closed_by"], one["turn_id"], one["work_key"]) == ("linus", close.data.turn_id, f"a2a:{cid}")
    assert one["closed_at"] and one["open_seconds"] == close.data.open_seconds
    [opened] = rec.of("a2a_channel_opened")
    assert (opened.data.opened_by, opened.data.role) == ("ada", "engineer")
