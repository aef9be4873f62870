"""The admin: pause/resume actions go through the compare-and-set; operator tokens are shown only once."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from seats import actions
from seats.delivery_models import SeatPause, SeatRecord
from crewlet.base.tokens import OperatorToken, hash_token
from seats_support import eventually, in_thread



def staff_client(username: str = "grace-admin") -> Client:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser(username, password="pw")
    c = Client()
    c.force_login(user)
    return c


def run_action(c: Client, model: str, action: str, handles: list[str]) -> Any:
    rows = SeatRecord if model == "seatrecord" else SeatPause
    pks = [str(pk) for pk in rows.objects.filter(handle__in=handles).values_list("pk", flat=True)]
    assert len(pks) == len(handles), f"no {model} rows for some of {handles}"
    return c.post(f"/admin/seats/{model}/", {"action": action, "_selected_action": pks}, follow=True)


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_the_pause_action_pauses_the_selected_seat_once_and_announces_it_once(runtime_on_memory: Any) -> None:
    rt, _, rec = runtime_on_memory

    def pause_twice() -> tuple[list[str], list[str]]:
        c = staff_client()
        first = run_action(c, "seatrecord", "pause_selected", ["ada"])
        assert first.status_code == 200
        second = run_action(c, "seatrecord", "pause_selected", ["ada"])
        return messages_of(first), messages_of(second)

    first, second = await asyncio.to_thread(in_thread, pause_twice)
    assert any("1 seat(s) paused" in m for m in first), first
    assert any("0 seat(s) paused; 1 already paused" in m for m in second), second

    row = await sync_to_async(SeatPause.objects.get)(handle="ada")
    assert (row.paused, row.paused_by, row.paused_by_seat, row.version) == (True, "grace-admin", "", 1)
    [event] = rec.of("seat_paused", seat="ada")
    assert event.data.paused_by == "grace-admin"
    assert rt.loops["ada"].paused and not rt.loops["linus"].paused


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_the_resume_action_on_pause_rows_resumes_and_announces_once(runtime_on_memory: Any) -> None:
    rt, q, rec = runtime_on_memory
    assert await actions.apause_seat("ada", by="ops", queue=q) is True
    assert await actions.apause_seat("linus", by="ops", queue=q) is True

    def resume() -> list[str]:
        c = staff_client()
        listing = c.get("/admin/seats/seatpause/")
        assert listing.status_code == 200 and b"Resume selected seats" in listing.content
        return messages_of(run_action(c, "seatpause", "resume_selected", ["ada", "linus"]))

    msgs = await asyncio.to_thread(in_thread, resume)
    assert any("2 seat(s) resumed" in m for m in msgs), msgs
    rows = await sync_to_async(lambda: {r.handle: r for r in SeatPause.objects.all()})()
    assert not rows["ada"].paused and rows["ada"].resumed_by == "grace-admin"
    assert {e.data.seat for e in rec.of("seat_resumed")} == {"ada", "linus"} and len(rec.of("seat_resumed")) == 2
    await eventually(lambda: not rt.loops["ada"].paused and not rt.loops["linus"].paused, what="holds released")


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_a_human_seat_selected_for_pausing_is_reported_and_left_alone(runtime_on_memory: Any) -> None:
    _, _, rec = runtime_on_memory

    def pause_grace() -> list[str]:
        return messages_of(run_action(staff_client(), "seatrecord", "pause_selected", ["grace"]))

    msgs = await asyncio.to_thread(in_thread, pause_grace)
    assert any("no inbox to hold" in m and "grace" in m for m in msgs), msgs
    assert not await sync_to_async(SeatPause.objects.filter(handle="grace").exists)()
    assert rec.of("seat_paused") == []


@pytest.mark.django_db(databases=["default", "events"])
def test_the_pause_action_with_no_runtime_in_the_process_reports_that_nothing_changed() -> None:
    SeatRecord.objects.create(handle="ada")
    msgs = messages_of(run_action(staff_client(), "seatrecord", "pause_selected", ["ada"]))
    assert any(m.startswith("Nothing changed") for m in msgs), msgs
    assert not SeatPause.objects.exists()


@pytest.mark.django_db(databases=["default", "events"])
def test_adding_an_operator_token_asks_only_a_name_and_shows_the_token_once() -> None:
    c = staff_client()
    form = c.get("/admin/crewlet/operatortoken/add/")
    assert form.status_code == 200 and b'name="name"' in form.content and b"token_hash" not in form.content

    done = c.post("/admin/crewlet/operatortoken/add/", {"name": "ci"}, follow=True)
    assert done.status_code == 200
    [shown] = [m for m in messages_of(done) if "Operator token for 'ci'" in m]
    token = shown.split(": ", 1)[1].split(" ")[0]
    row = OperatorToken.objects.get(name="ci")
    assert row.token_hash == hash_token(token) and OperatorToken.lookup(token) is not None

    page = c.get(f"/admin/crewlet/operatortoken/{row.pk}/change/")
    assert page.status_code == 200
    assert token.encode() not in page.content and b'name="token_hash"' not in page.content
    assert row.token_hash.encode() in page.content  # shown, read-only


@pytest.mark.django_db(databases=["default", "events"])
def test_the_ledger_and_seat_records_are_read_only_in_the_admin() -> None:
    c = staff_client()
    for model in ("ledgerentry", "seatrecord", "seatpause"):
        assert c.get(f"/admin/seats/{model}/").status_code == 200
        assert c.get(f"/admin/seats/{model}/add/").status_code == 403
