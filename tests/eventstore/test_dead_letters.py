"""/api/dead-letters and /operator/act: a real dead letter on a real broker, listed, replayed and audited.

The dead letter is made the way production makes one: a subscriber whose
handler fails spends the message's whole delivery budget (the backoff shrunk
through the injected Timings), and the queue copies it to CREWLET_DLQ. The
views run in a worker thread, as under ASGI, and reach the queue on this
test's loop through the engine attached to the process (``crewlet.engine.runtime``);
the event store's writer is the queue's publish listener, as in ``up``.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest
import yaml
from asgiref.sync import sync_to_async
from django.utils.crypto import get_random_string
from rest_framework.test import APIClient

from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES, Delivery, Outcome
from eventstore import actions as ops
from eventstore.models import EventRow
from crewlet.base.tokens import OperatorToken
from crewlet.events.types import DEAD_LETTER_MAX_DELIVERIES, MessageDeadLettered
from eventstore_support import bound_as_engine
from seats_support import FAST, bearer, eventually, in_thread, jetstream_queues, publish_raw, subscribed_on, wake
from waiting_support import wait_for_answer

pytestmark = [
    pytest.mark.integration,  # every test here replays through a real nats-server
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

SEAT = "ada"
TOPIC, GROUP = topics.agent_inbox(SEAT), topics.agent_inbox_group(SEAT)


@pytest.fixture
async def engine() -> AsyncIterator[Any]:
    """A JetStream client bound as this process's engine queue."""
    async with jetstream_queues("n1") as [q], bound_as_engine(q):
        yield q


@pytest.fixture
async def file_engine(tmp_path: Any) -> AsyncIterator[Any]:
    """As ``engine``, on a broker whose streams are file-backed, as ``up`` keeps them."""
    from crewlet.queue.broker import EmbeddedBroker
    from crewlet.queue.jetstream import JetStreamQueue

    async with EmbeddedBroker(store_dir=tmp_path / "jetstream") as broker:
        q = await JetStreamQueue.connect(broker.url, node="n1", timings=FAST, event_retention_hours=2.0)
        try:
            async with bound_as_engine(q):
                yield q
        finally:
            await q.close()


async def make_dead_letter(q: Any, body: str) -> Any:
    """Publish an inbox wake that a failing subscriber NAKs until the queue dead-letters it."""
    deliveries: list[int] = []

    async def failing(delivery: Delivery) -> Outcome:
        deliveries.append(delivery.remaining)
        return Outcome.NAK

    sub = await q.subscribe(TOPIC, GROUP, failing)
    poison = wake(SEAT, body)
    await q.publish(TOPIC, poison)

    async def buried() -> bool:
        return any(d.event.id == poison.id for d in await q.dead_letters())

    await eventually(buried, what="the poison dead-lettered")
    await sub.detach()
    assert len(deliveries) == MAX_DELIVERIES
    return poison


def call(fn: Any, *args: Any) -> Any:
    return asyncio.to_thread(in_thread, fn, *args)


def replay(client: APIClient, ref: str, **extra: Any) -> Any:
    return call(client.post, "/operator/act", {"tool": ops.TOOL_DEAD_LETTER_REPLAY, "args": {"ref": ref}, **extra}, "json")


def audits() -> list[EventRow]:
    return list(EventRow.objects.using("events").filter(type="operator_acted").order_by("ts"))


async def test_the_list_shows_a_real_dead_letter_with_its_topic_group_deliveries_and_event(engine: Any) -> None:
    poison = await make_dead_letter(engine, "this one always fails")
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    response = await call(bearer(token).get, "/api/dead-letters")
    assert response.status_code == 200, response.content
    (row,) = response.json()["dead_letters"]
    assert (row["topic"], row["group"], row["deliveries"]) == (TOPIC, GROUP, MAX_DELIVERIES)
    assert (row["event_id"], row["type"], row["seat"]) == (poison.id, "external_notification", SEAT)
    assert row["trace_id"] == poison.trace_id and row["timestamp"] and row["summary"]
    assert row["ref"] == (await engine.dead_letters())[0].ref


async def test_a_replay_puts_the_event_back_on_its_topic_and_is_audited_with_the_actor(engine: Any) -> None:
    poison = await make_dead_letter(engine, "replay me")
    (letter,) = await engine.dead_letters()
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)

    response = await replay(c, letter.ref, request_id="req-1")
    assert response.status_code == 200, response.content
    assert response.json() == {"outcome": ops.OUTCOME_REPLAYED, "topic": TOPIC, "event_id": poison.id}

    got: list[Delivery] = []

    async def healthy(delivery: Delivery) -> None:
        got.append(delivery)

    await engine.subscribe(TOPIC, GROUP, healthy)
    await eventually(lambda: len(got) == 1, what="the replayed event delivered")
    assert got[0].event.id == poison.id and got[0].remaining == MAX_DELIVERIES - 1, "fresh mail, a whole budget"

    listed = await call(c.get, "/api/dead-letters")
    assert listed.json() == {"dead_letters": []}

    await eventually(lambda: sync_to_async(lambda: len(audits()) == 1)(), what="the operator_acted row")
    (row,) = await sync_to_async(audits)()
    assert (row.tool, row.actor, row.source, row.failed) == (ops.TOOL_DEAD_LETTER_REPLAY, "ops-console", "operator", False)
    assert '"outcome":"replayed"' in row.body and f'"position":"{TOPIC}"' in row.body
    assert '"request_id":"req-1"' in row.body
    assert '"ref"' not in row.body, "never the arguments"


async def test_a_second_replay_of_the_same_ref_is_404_and_audited_as_a_refusal(engine: Any) -> None:
    await make_dead_letter(engine, "only once")
    (letter,) = await engine.dead_letters()
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)
    assert (await replay(c, letter.ref)).status_code == 200
    again = await replay(c, letter.ref)
    assert again.status_code == 404, again.content
    assert again.json()["error"] == ops.REFUSAL_GONE and again.json()["reason"]

    await eventually(lambda: sync_to_async(lambda: len(audits()) == 2)(), what="two operator_acted rows")
    first, second = await sync_to_async(audits)()
    assert '"outcome":"replayed"' in first.body
    assert '"outcome":"refused"' in second.body and '"refusal":"gone"' in second.body
    assert second.actor == "ops-console" and second.tool == ops.TOOL_DEAD_LETTER_REPLAY


async def test_a_staff_session_replays_under_its_username_with_its_csrf_token(engine: Any) -> None:
    await make_dead_letter(engine, "staff replay")
    (letter,) = await engine.dead_letters()

    def as_staff() -> Any:
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.create_user("grace-admin", password="pw", is_staff=True)
        c = APIClient(enforce_csrf_checks=True)
        c.force_login(user)
        refused = c.post("/operator/act", {"tool": ops.TOOL_DEAD_LETTER_REPLAY, "args": {"ref": letter.ref}}, format="json")
        assert refused.status_code == 403, "a session without its CSRF token is refused"
        secret = get_random_string(32)  # the cookie a page carries, echoed in the header as its script does
        c.cookies["csrftoken"] = secret
        return c.post(
            "/operator/act",
            {"tool": ops.TOOL_DEAD_LETTER_REPLAY, "args": {"ref": letter.ref}},
            format="json",
            HTTP_X_CSRFTOKEN=secret,
        )

    response = await call(as_staff)
    assert response.status_code == 200, response.content
    await eventually(lambda: sync_to_async(lambda: len(audits()) == 1)(), what="the operator_acted row")
    (row,) = await sync_to_async(audits)()
    assert row.actor == "grace-admin"


async def test_anonymous_callers_are_refused_with_401_and_nothing_moves(engine: Any) -> None:
    await make_dead_letter(engine, "stay put")
    (letter,) = await engine.dead_letters()
    anonymous = APIClient()
    assert (await call(anonymous.get, "/api/dead-letters")).status_code == 401
    refused = await replay(anonymous, letter.ref)
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert [d.ref for d in await engine.dead_letters()] == [letter.ref]
    assert await sync_to_async(audits)() == []


async def test_an_unknown_tool_or_missing_args_is_400_and_still_audited_as_a_refusal(engine: Any) -> None:
    await make_dead_letter(engine, "untouched")
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)
    unknown = await call(c.post, "/operator/act", {"tool": "drop_tables", "args": {"ref": "1"}}, "json")
    assert unknown.status_code == 400 and unknown.json()["error"] == ops.REFUSAL_UNKNOWN_TOOL
    missing = await call(c.post, "/operator/act", {"tool": ops.TOOL_DEAD_LETTER_REPLAY, "args": {}}, "json")
    assert missing.status_code == 400 and missing.json()["error"] == ops.REFUSAL_BAD_ARGS
    assert len(await engine.dead_letters()) == 1
    await eventually(lambda: sync_to_async(lambda: len(audits()) == 2)(), what="two refusals audited")
    assert [r.tool for r in await sync_to_async(audits)()] == ["drop_tables", ops.TOOL_DEAD_LETTER_REPLAY]


async def test_an_unknown_ref_is_404(engine: Any) -> None:
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    response = await replay(bearer(token), "424242")
    assert response.status_code == 404 and response.json()["error"] == ops.REFUSAL_GONE


async def test_the_loser_of_two_racing_replays_on_a_file_store_is_404_gone_not_503(file_engine: Any) -> None:
    """The loser has read the entry when the winner takes it.

    The raced entry is the newest on the stream, as in a running company:
    JetStream words a second delete of a stream's last sequence as "sequence
    not found", not as the "no message found" of an inner one.
    """
    await make_dead_letter(file_engine, "older")
    poison = await make_dead_letter(file_engine, "raced")
    older, letter = await file_engine.dead_letters()
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)
    transport = file_engine.transport
    read = transport.dead_letter
    winner: list[Any] = []

    async def read_then_lose(ref: str) -> Any:
        entry = await read(ref)
        if not winner:  # the first read is the loser's; the winner's own read passes through
            winner.append(None)
            winner[0] = await replay(c, ref, request_id="winner")
        return entry

    transport.dead_letter = read_then_lose
    try:
        loser = await replay(c, letter.ref, request_id="loser")
    finally:
        del transport.dead_letter
    assert winner[0].status_code == 200, winner[0].content
    assert winner[0].json()["event_id"] == poison.id
    assert loser.status_code == 404, loser.content
    assert loser.json()["error"] == ops.REFUSAL_GONE
    assert [d.ref for d in await file_engine.dead_letters()] == [older.ref]


@pytest.mark.parametrize("ref", ["abc", "-1", "+7", "1.5", "١", "1 2"])
async def test_a_ref_that_is_not_digits_is_400_with_the_rule_and_no_broker_words(engine: Any, ref: str) -> None:
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    response = await replay(bearer(token), ref)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] == ops.REFUSAL_BAD_ARGS and body["param"] == "args.ref" and "18446744073709551615" in body["reason"]
    assert not any(word in body["reason"].lower() for word in ("nats", "json", "unmarshal", "err_code"))
    await eventually(lambda: sync_to_async(lambda: len(audits()) == 1)(), what="the refusal audited")
    assert '"refusal":"bad_args"' in (await sync_to_async(audits)())[0].body


@pytest.mark.parametrize("ref", ["18446744073709551615", "18446744073709551616", "99999999999999999999999", "0"])
async def test_digits_that_name_no_entry_are_404_gone_and_audited_as_a_refusal(engine: Any, ref: str) -> None:
    """Digits are the shape the schema states; whether they name an entry (0, past a uint64, taken) is a miss."""
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    response = await replay(bearer(token), ref)
    assert response.status_code == 404 and response.json()["error"] == ops.REFUSAL_GONE
    assert response.json()["param"] == "args.ref"
    await eventually(lambda: sync_to_async(lambda: len(audits()) == 1)(), what="the refusal audited")
    assert '"refusal":"gone"' in (await sync_to_async(audits)())[0].body


async def test_a_key_the_call_does_not_take_is_400_naming_it(engine: Any) -> None:
    """The schema closes the body (additionalProperties: false); a misspelt key is refused, not ignored."""
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)
    top = await replay(c, "1", reqest_id="typo")
    assert top.status_code == 400 and top.json()["param"] == "reqest_id", top.content
    inner = await call(c.post, "/operator/act", {"tool": ops.TOOL_DEAD_LETTER_REPLAY, "args": {"ref": "1", "x": 1}}, "json")
    assert inner.status_code == 400 and inner.json()["param"] == "args.x", inner.content


async def test_a_dead_letter_leaves_one_message_dead_lettered_row_in_the_poisons_trace(engine: Any) -> None:
    poison = await make_dead_letter(engine, "recorded")
    (letter,) = await engine.dead_letters()

    def burials() -> list[EventRow]:
        return list(EventRow.objects.using("events").filter(type=MessageDeadLettered.event_type))

    await eventually(lambda: sync_to_async(lambda: len(burials()) == 1)(), what="the message_dead_lettered row")
    (row,) = await sync_to_async(burials)()
    assert (row.category, row.seat, row.node, row.failed) == ("system", SEAT, "n1", True)
    assert row.trace_id == poison.trace_id and row.parent_span_id == poison.span_id
    assert f'"ref":"{letter.ref}"' in row.body and f'"original_id":"{poison.id}"' in row.body
    assert f'"reason":"{DEAD_LETTER_MAX_DELIVERIES}"' in row.body and f'"deliveries":{MAX_DELIVERIES}' in row.body
    assert "recorded" not in row.body, "never the buried bytes"


async def test_the_limit_is_checked_and_honoured(engine: Any) -> None:
    await make_dead_letter(engine, "first")
    await make_dead_letter(engine, "second")
    _, token = await sync_to_async(OperatorToken.mint)("ops-console")
    c = bearer(token)
    (only,) = (await call(c.get, "/api/dead-letters?limit=1")).json()["dead_letters"]
    both = (await call(c.get, "/api/dead-letters")).json()["dead_letters"]
    refs = [int(r["ref"]) for r in both]
    assert len(refs) == 2 and refs == sorted(refs) and str(refs[0]) == only["ref"], "oldest first"
    assert (await call(c.get, "/api/dead-letters?limit=0")).status_code == 400


def test_with_no_engine_in_the_process_the_routes_are_503() -> None:
    _, token = OperatorToken.mint("ops-console")
    c = bearer(token)
    assert c.get("/api/dead-letters").status_code == 503
    response = c.post("/operator/act", {"tool": ops.TOOL_DEAD_LETTER_REPLAY, "args": {"ref": "1"}}, format="json")
    assert response.status_code == 503 and response.json()["error"] == ops.REFUSAL_UNAVAILABLE


def test_the_openapi_schema_documents_both_routes() -> None:
    _, token = OperatorToken.mint("ops-console")
    response = bearer(token).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi")
    assert response.status_code == 200
    paths = yaml.safe_load(response.content)["paths"]
    assert paths["/api/dead-letters"]["get"]["operationId"] == "dead_letters_list"
    assert paths["/operator/act"]["post"]["operationId"] == "operator_act"


# -- inside a real `manage.py up` -----------------------------------------------------------------

UP_TOKEN = "dead-letter-up-test-token-0123456789abcdef"


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_inside_up_a_burial_is_a_row_in_api_events_and_of_racing_replays_one_wins_and_the_rest_are_404(
    tmp_path: Any,
) -> None:
    """`up` buries what its own consume loop cannot decode; the operator sees it and replays it once."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.browser_support import company_on_broker

    with company_on_broker(tmp_path, CREWLET_OPERATOR_TOKEN=UP_TOKEN) as (loop, broker, company):
        def burials() -> list[dict[str, Any]]:
            status, body = company.call(f"/api/events?type={MessageDeadLettered.event_type}")
            assert status == 200, body
            return body["events"]

        # Published only once up's seat loop reads ada's inbox: the mailbox keeps nothing nobody reads.
        wait_for_answer(lambda: loop.run(subscribed_on(broker.url, TOPIC)), bool, "up's durable subscription on ada's inbox")
        loop.run(publish_raw(broker.url, TOPIC, b"\xff this is no event"))
        (row,) = wait_for_answer(burials, lambda rows: len(rows) == 1, "the message_dead_lettered row in /api/events")
        assert (row["category"], row["seat"], row["node"], row["failed"]) == ("system", SEAT, "web1", True)
        assert row["trace_id"]

        status, listed = company.call("/api/dead-letters")
        assert status == 200, listed
        (letter,) = [d for d in listed["dead_letters"] if d["topic"] == TOPIC]
        assert letter["deliveries"] == 1 and letter["type"] == "unreadable"

        act = {"tool": ops.TOOL_DEAD_LETTER_REPLAY, "args": {"ref": letter["ref"]}}
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(lambda _: company.call("/operator/act", "POST", act), range(4)))
        codes = sorted(code for code, _ in answers)
        assert codes == [200, 404, 404, 404], answers
        for code, body in answers:
            if code == 404:
                assert body["error"] == ops.REFUSAL_GONE and "nats" not in body["reason"].lower()

        bad_code, bad = company.call("/operator/act", "POST", {**act, "args": {"ref": "1e3"}})
        assert bad_code == 400 and bad["error"] == ops.REFUSAL_BAD_ARGS and bad["param"] == "args.ref", bad
        assert "nats" not in bad["reason"].lower() and "json" not in bad["reason"].lower()

        # The replay put the same bytes back on ada's inbox, and up buried them again: a second row.
        wait_for_answer(burials, lambda rows: len(rows) == 2, "the replayed garbage buried and recorded again")
