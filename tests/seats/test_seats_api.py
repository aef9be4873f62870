"""/api/seats/: the company's seats, and pausing and resuming one through the compare-and-set."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml
from asgiref.sync import sync_to_async
from rest_framework.test import APIClient

from crewlet.queue import topics
from crewlet.engine.runtime import NO_ENGINE
from engine_support import engine_here
from seats import actions
from seats.delivery_models import SeatPause
from crewlet.base.tokens import OperatorToken
from seats_support import bearer, eventually, in_thread, send, wake


# -- no runtime in this process: sync tests ---------------------------------------------


@pytest.mark.django_db(databases=["default", "events"])
def test_a_signed_in_user_who_is_not_staff_is_refused_with_401() -> None:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("sam", password="pw")
    c = APIClient()
    c.force_login(user)
    assert c.get("/api/seats/").status_code == 401


@pytest.mark.django_db(databases=["default", "events"])
def test_a_process_with_no_engine_answers_the_seat_list_503_saying_so_rather_than_show_another_company() -> None:
    _, token = OperatorToken.mint("tests")
    response = bearer(token).get("/api/seats/")
    assert response.status_code == 503
    assert response.json() == {"error": "unavailable", "param": "", "reason": NO_ENGINE}


@pytest.mark.django_db(databases=["default", "events"])
def test_an_engine_whose_queue_cannot_be_asked_lists_its_company_with_unknown_depths() -> None:
    _, token = OperatorToken.mint("tests")
    with engine_here():  # the example company, and no queue to ask
        response = bearer(token).get("/api/seats/")
    assert response.status_code == 200
    body = response.json()
    assert body["org"] == "acme"
    by_handle = {s["handle"]: s for s in body["seats"]}
    assert set(by_handle) == {"ada", "linus", "grace"}
    ada = by_handle["ada"]
    assert (ada["kind"], ada["role"], ada["display_name"]) == ("agent", "engineer", "Ada")
    assert len(ada["agent_id"]) == 36 and ada["paused"] is False and ada["depth"] is None
    assert by_handle["grace"]["kind"] == "human" and by_handle["grace"]["depth"] is None


@pytest.mark.django_db(databases=["default", "events"])
def test_an_unknown_handle_is_404_and_a_human_seat_is_409_before_anything_changes() -> None:
    _, token = OperatorToken.mint("tests")
    c = bearer(token)
    with engine_here():
        for action in ("pause", "resume"):
            unknown = c.post(f"/api/seats/nobody/{action}", {}, format="json")
            assert unknown.status_code == 404 and unknown.json()["error"] == "not_found" and unknown.json()["param"] == "handle"
            human = c.post(f"/api/seats/grace/{action}", {}, format="json")
            assert human.status_code == 409 and "human" in human.json()["reason"] and human.json()["param"] == "handle"
    assert not SeatPause.objects.exists()


@pytest.mark.django_db(databases=["default", "events"])
def test_a_pause_with_no_runtime_in_the_process_is_503_and_changes_nothing() -> None:
    _, token = OperatorToken.mint("tests")
    response = bearer(token).post("/api/seats/ada/pause", {"reason": "x"}, format="json")
    assert response.status_code == 503
    assert not SeatPause.objects.exists()


@pytest.mark.django_db(databases=["default", "events"])
def test_a_malformed_pause_body_is_400() -> None:
    from unittest import mock

    _, token = OperatorToken.mint("tests")
    with mock.patch.object(actions, "pause_seat") as pause:
        response = bearer(token).post("/api/seats/ada/pause", {"stop_running": "sometimes"}, format="json")
        misspelt = bearer(token).post("/api/seats/ada/pause", {"stop_runing": True}, format="json")
    assert response.status_code == 400 and response.json()["param"] == "stop_running"
    assert misspelt.status_code == 400 and misspelt.json()["param"] == "stop_runing", "an unknown field is refused, never ignored"
    pause.assert_not_called()


@pytest.mark.django_db(databases=["default", "events"])
def test_the_openapi_schema_documents_the_seat_routes() -> None:
    _, token = OperatorToken.mint("tests")
    response = bearer(token).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    paths = schema["paths"]
    assert "get" in paths["/api/seats/"]
    assert "post" in paths["/api/seats/{handle}/pause"]
    assert "post" in paths["/api/seats/{handle}/resume"]
    ops = {paths["/api/seats/{handle}/pause"]["post"]["operationId"], paths["/api/seats/"]["get"]["operationId"]}
    assert ops == {"seats_pause", "seats_list"}


# -- a runtime running in this process: the views run in a worker thread, as under ASGI -----------


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_pause_then_resume_change_once_each_and_publish_once_per_change(runtime_on_memory: Any) -> None:
    rt, q, rec = runtime_on_memory
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)

    def post(path: str, body: Any = None) -> Any:
        return in_thread(c.post, path, body or {}, "json")

    first = await asyncio.to_thread(post, "/api/seats/ada/pause", {"reason": "maintenance", "stop_running": True})
    assert first.status_code == 200, first.content
    assert first.json()["changed"] is True
    state = first.json()["state"]
    assert (state["paused"], state["paused_by"], state["paused_by_seat"]) == (True, "ops-console", "")
    assert (state["reason"], state["stop_running"], state["version"]) == ("maintenance", True, 1)
    assert state["paused_at"]

    again = await asyncio.to_thread(post, "/api/seats/ada/pause", {"reason": "maintenance", "stop_running": True})
    assert again.status_code == 200 and again.json()["changed"] is False
    [paused] = rec.of("seat_paused", seat="ada")
    assert (paused.data.paused_by, paused.data.reason, paused.data.stop_running) == ("ops-console", "maintenance", True)
    assert rt.loops["ada"].paused

    resumed = await asyncio.to_thread(post, "/api/seats/ada/resume")
    assert resumed.status_code == 200 and resumed.json()["changed"] is True
    assert resumed.json()["state"]["paused"] is False
    again = await asyncio.to_thread(post, "/api/seats/ada/resume")
    assert again.json()["changed"] is False
    [event] = rec.of("seat_resumed", seat="ada")
    assert (event.data.resumed_by, event.data.paused_by) == ("ops-console", "ops-console")
    assert len(rec.of("seat_paused")) == 1
    await eventually(lambda: not rt.loops["ada"].paused, what="the hold released")


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_a_staff_session_pauses_under_its_username(runtime_on_memory: Any) -> None:
    _, _, rec = runtime_on_memory

    def as_staff() -> Any:
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.create_user("grace-admin", password="pw", is_staff=True)
        c = APIClient()
        c.force_login(user)
        return c.post("/api/seats/linus/pause", {}, format="json")

    response = await asyncio.to_thread(in_thread, as_staff)
    assert response.status_code == 200 and response.json()["changed"] is True
    [event] = rec.of("seat_paused", seat="linus")
    assert (event.data.paused_by, event.data.paused_by_seat) == ("grace-admin", "")


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_the_list_shows_the_running_companys_pauses_and_mailbox_depths(runtime_on_memory: Any) -> None:
    rt, q, _ = runtime_on_memory
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)
    assert await asyncio.to_thread(in_thread, c.post, "/api/seats/ada/pause", {"reason": "hold"}, "json")
    for i in range(2):
        await send(q, "ada", wake("ada", f"hello {i}", partition_key=f"p{i}"))

    def listing() -> dict[str, Any]:
        response = in_thread(c.get, "/api/seats/")
        assert response.status_code == 200
        return {s["handle"]: s for s in response.json()["seats"]}

    async def ada_has_two_waiting() -> bool:
        return (await asyncio.to_thread(listing))["ada"]["depth"] == 2

    await eventually(ada_has_two_waiting, what="ada's held inbox shows its two wakes")
    seats = await asyncio.to_thread(listing)
    assert (seats["ada"]["paused"], seats["ada"]["paused_by"], seats["ada"]["reason"]) == (True, "ops-console", "hold")
    assert seats["linus"]["paused"] is False and seats["linus"]["depth"] == 0
    assert seats["grace"]["depth"] is None
    assert await q.backlog(topics.agent_inbox("ada"), topics.agent_inbox_group("ada")) == 2
