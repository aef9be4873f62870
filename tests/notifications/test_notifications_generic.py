"""The generic source through the edge and the router: a per-seat bearer token, ``{text, key?, sender?}``, keys, refusals."""
from __future__ import annotations

import json
import logging
from typing import Any, Optional

import pytest
from asgiref.sync import sync_to_async

from django.db import OperationalError

from notifications import actions
from notifications.edge import InboundRequest
from notifications.sources import generic
from notifications_support import company
from notifications.models import SourceToken
from notifications.parsers import WHY_ADDRESSED
from test_notifications_edge import post
from test_notifications_forms import edge_and_router, inbound_count, route_last
from test_notifications_routing import STORE, only_wake

pytestmark = STORE

mint = sync_to_async(actions.mint_source_token)
revoke = sync_to_async(actions.revoke_source_token)


async def send(seat: str, body: Any, token: Optional[str], *, key: str = "", content_type: str = "application/json") -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if key:
        headers["Idempotency-Key"] = key
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await post(f"/webhooks/generic/{seat}", raw, content_type=content_type, headers=headers)


async def test_a_post_with_the_seats_token_is_accepted_and_wakes_that_seat_with_the_text() -> None:
    async with edge_and_router() as r:
        token = await mint("ada")
        assert token.startswith(actions.SOURCE_TOKEN_PREFIX)
        resp = await send("ada", {"text": "nightly build failed on main", "sender": "ci"}, token)
        assert resp.status_code == 202, resp.json()
        assert resp.json()["source"] == "generic" and resp.json()["event"] == "message"
        wake = only_wake(await route_last(r), "ada")
        assert wake.payload["body"] == "nightly build failed on main" and wake.payload["sender"] == "ci"
        assert wake.payload["why"] == WHY_ADDRESSED and wake.payload["direct"] is True
        assert wake.payload["partition_key"] == wake.payload["conversation_identity"] == "generic:ada:ci"
        assert wake.data.title == "Message for ada from ci" and wake.source == "generic"


async def test_a_token_for_one_seat_is_403_on_another_and_a_token_that_is_none_is_401() -> None:
    async with edge_and_router() as r:
        token = await mint("ada")
        other = await send("linus", {"text": "hi"}, token)
        assert other.status_code == 403
        assert other.json()["error"] == "this token opens another seat's route, not linus's: mint one with manage.py source_token linus"
        unknown = await send("ada", {"text": "hi"}, "crws_not-a-token")
        assert (unknown.status_code, unknown.json()["error"]) == (401, "the bearer token is no source token: unknown, or revoked")
        missing = await send("ada", {"text": "hi"}, None)
        assert missing.status_code == 401 and "missing 'Authorization: Bearer <source token>'" in missing.json()["error"]
        basic = await post("/webhooks/generic/ada", b'{"text": "hi"}', headers={"Authorization": f"Basic {token}"})
        assert basic.status_code == 401
        assert inbound_count(r) == 0


async def test_a_revoked_or_rotated_token_is_refused_and_the_new_one_works() -> None:
    async with edge_and_router():
        old = await mint("ada")
        with pytest.raises(actions.SourceTokenError, match="already has a source token"):
            await mint("ada")
        new = await sync_to_async(actions.mint_source_token)("ada", rotate=True)
        assert (await send("ada", {"text": "hi"}, old)).status_code == 401
        assert (await send("ada", {"text": "hi"}, new)).status_code == 202
        await revoke("ada")
        assert (await send("ada", {"text": "hi"}, new)).status_code == 401
        with pytest.raises(actions.SourceTokenError, match="has no source token"):
            await revoke("ada")


async def test_the_token_is_stored_only_as_its_hash_and_its_use_is_recorded() -> None:
    async with edge_and_router():
        token = await mint("ada")
        row = await SourceToken.objects.aget(seat="ada")
        assert token not in (row.token_hash, row.seat) and row.last_used_at is None
        assert (await send("ada", {"text": "hi"}, token)).status_code == 202
        assert (await SourceToken.objects.aget(seat="ada")).last_used_at is not None


@pytest.mark.parametrize("how", ["header", "body", "both"])
async def test_a_repeat_with_the_same_key_is_accepted_again_but_wakes_the_seat_once(how: str) -> None:
    async with edge_and_router() as r:
        token = await mint("ada")
        body: dict[str, Any] = {"text": "deploy 41 finished"}
        if how != "header":
            body["key"] = "deploy-41"
        header_key = "deploy-41" if how != "body" else ""
        first = await send("ada", body, token, key=header_key)
        assert first.status_code == 202 and first.json()["delivery_id"] == "ada:deploy-41"
        only_wake(await route_last(r), "ada")
        assert (await send("ada", body, token, key=header_key)).status_code == 202
        again = await route_last(r)
        assert again.duplicate and again.woken == []


async def test_the_same_key_for_two_seats_is_two_deliveries() -> None:
    async with edge_and_router() as r:
        ada, linus = await mint("ada"), await mint("linus")
        assert (await send("ada", {"text": "x", "key": "k1"}, ada)).status_code == 202
        only_wake(await route_last(r), "ada")
        assert (await send("linus", {"text": "x", "key": "k1"}, linus)).status_code == 202
        only_wake(await route_last(r), "linus")


async def test_without_a_key_the_same_text_twice_is_two_wakes() -> None:
    async with edge_and_router() as r:
        token = await mint("ada")
        ids = []
        for _ in range(2):
            resp = await send("ada", {"text": "disk 91% full", "sender": "monitor"}, token)
            assert resp.status_code == 202
            ids.append(resp.json()["delivery_id"])
            only_wake(await route_last(r), "ada")
        assert ids[0] != ids[1]


@pytest.mark.parametrize(
    "body, reason",
    [
        ({"sender": "ci"}, "text is required"),
        ({"text": "  "}, "text must be a non-empty string"),
        ({"text": 7}, "text must be a non-empty string"),
        ({"text": "hi", "channel": "ops", "Text": "x"}, "unknown field 'Text', 'channel': the body is {\"text\", \"key\"?, \"sender\"?}"),
        ({"text": "hi", "key": "k" * 201}, "key is 201 characters, over the 200-character limit"),
        ({"text": "hi", "key": "a"}, "the Idempotency-Key header and the body's key differ: send one, or the same in both"),
        ({"text": "hi\u0000"}, "text contains a NUL character (\\u0000), which the database cannot store;"
                                " nothing downstream can store it, so the delivery is refused"),
        ([{"text": "hi"}], "the body must be a JSON object, not a list"),
    ],
    ids=["no-text", "blank", "number", "unknown", "long-key", "two-keys", "nul", "list"],
)
async def test_a_body_that_is_not_text_key_sender_is_400_with_the_reason(body: Any, reason: str) -> None:
    async with edge_and_router() as r:
        token = await mint("ada")
        resp = await send("ada", body, token, key="b" if isinstance(body, dict) and body.get("key") == "a" else "")
        assert (resp.status_code, resp.json()["error"]) == (400, reason)
        assert inbound_count(r) == 0


async def test_a_form_or_a_text_body_is_415_naming_json() -> None:
    async with edge_and_router() as r:
        token = await mint("ada")
        resp = await send("ada", b"text=hi", token, content_type="application/x-www-form-urlencoded")
        assert resp.status_code == 415
        assert resp.json()["error"] == "content type 'application/x-www-form-urlencoded' is not accepted: send application/json"
        assert inbound_count(r) == 0


async def test_a_seat_the_company_does_not_have_is_404_and_a_human_seat_is_a_recorded_skip() -> None:
    async with edge_and_router() as r:
        zed = await mint("zed")
        resp = await send("zed", {"text": "hi"}, zed)
        assert (resp.status_code, resp.json()["error"]) == (404, "the company has no seat zed")
        grace = await mint("grace")
        assert (await send("grace", {"text": "fyi"}, grace)).status_code == 202
        result = await route_last(r)
        assert result.woken == [] and result.reasons == ["human seat"]


async def test_an_unreachable_broker_is_503_and_the_same_key_goes_through_once_it_is_back() -> None:
    async with edge_and_router() as r:
        token = await mint("ada")
        r.broker.go_away()
        down = await send("ada", {"text": "hi", "key": "k503"}, token)
        assert down.status_code == 503 and "broker is unavailable" in down.json()["error"]
        assert inbound_count(r) == 0
        r.broker.come_back()
        assert (await send("ada", {"text": "hi", "key": "k503"}, token)).status_code == 202
        only_wake(await route_last(r), "ada")


async def test_the_token_is_never_in_a_log_line(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    async with edge_and_router():
        token = await mint("ada")
        await send("ada", {"text": "hi"}, token)
        await send("linus", {"text": "hi"}, token)
        await send("ada", {"text": 1}, token)
    assert token not in caplog.text and token not in " ".join(str(rec.__dict__) for rec in caplog.records)


def test_a_seat_handle_that_is_no_handle_is_refused_at_mint() -> None:
    with pytest.raises(actions.SourceTokenError, match="is not a seat handle"):
        actions.mint_source_token("Ada Lovelace")


async def test_a_coordination_store_that_cannot_answer_is_503_so_the_caller_retries(monkeypatch) -> None:
    async def unreachable(token: str, seat: str) -> actions.TokenVerdict:
        raise OperationalError("connection refused")

    monkeypatch.setattr(generic, "acheck_source_token", unreachable)
    req = InboundRequest(source="generic", body=b"{}", headers={"authorization": "Bearer crws_x"}, route="/webhooks/generic/ada")
    assert await generic.authenticate(req, company()) == (503, "the coordination store is unavailable, retry later (OperationalError)")
