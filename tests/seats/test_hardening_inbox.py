"""One poison event is isolated from its batch-mates, values no store can hold are escaped, failures log one line.

The wakes here are what a Slack DM becomes (``slack:<channel>`` partitions and
identities, ``<channel>:<ts>`` message ids). The poison cases are the ones a
fuzzer found: a NUL in a DM's channel id (PostgreSQL refuses it in text), a
lone surrogate (no driver encodes it), a store that refuses one event's value,
a turn that crashes on one event, a merge that raises on one.
"""
from __future__ import annotations

import contextlib
import json
import logging
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator, Optional

import pytest
from asgiref.sync import sync_to_async
from django.db import DataError, OperationalError, connection, connections

from crewlet import events
from crewlet.events import Event
from crewlet.events.types import ExternalNotification
from crewlet.company.org import CompanyHolder, Organization, Seat
from crewlet.queue import topics
from crewlet.queue.contract import MAX_DELIVERIES, EventQueue
from crewlet.events.tracing import Trace
from seats.coalescer import coalesce, dispatch
from seats import inbox as inbox_module
from seats.delivery_models import LedgerEntry
from seats.ledger import (
    FAULT_DOWN,
    FAULT_VALUE,
    in_store,
    record,
    screen,
    storable,
    storable_event,
    storable_value,
    store_fault,
    trigger_identity,
)
from seats.mailboxes import ensure_mailboxes
from seats.turn_types import Trigger, TurnResult
from seats.turns import TurnRunner
from seats_support import (
    Recorder,
    company,
    drained,
    eventually,
    holder,
    memory_queues,
    recording_with_mailboxes,
    running,
    store_away_for,
)
from waiting_support import wait_until

pytestmark = pytest.mark.usefixtures("close_store_connections")

DB = pytest.mark.django_db(transaction=True, databases=["default", "events"])
T0 = datetime(2024, 6, 10, 9, 0, tzinfo=timezone.utc)


def dm(body: str, *, channel: str, n: int, seat: str = "ada", sender: str = "sam") -> Event:
    """A Slack DM wake as the notification service publishes one; ``n`` orders it (older first)."""
    ts = f"1718000000.{n:06d}"
    return events.new(
        ExternalNotification(seat=seat, sender=sender, body=body, event_name="message"),
        Trace.root(),
        source="slack",
        extras={
            "sender": sender,
            "body": body,
            "partition_key": f"slack:{channel}",
            "conversation_identity": f"slack:{channel}",
            "message_id": f"{channel}:{ts}",
        },
        timestamp=T0 + timedelta(seconds=n),
    )


async def put(q: EventQueue, *evs: Event) -> None:
    for ev in evs:
        await q.publish(topics.agent_inbox("ada"), ev)


def started_for(rec: Recorder, ev: Event) -> list[Event]:
    return [s for s in rec.of("agent_turn_started", seat="ada") if s.data.trigger_event_id == ev.id]


def completed_turns(rec: Recorder) -> set[str]:
    return {c.data.turn_id for c in rec.of("agent_turn_completed", seat="ada") if c.data.failed is False}


def ran(rec: Recorder, ev: Event) -> bool:
    """A turn triggered by ``ev`` completed."""
    done = completed_turns(rec)
    return any(s.data.turn_id in done for s in started_for(rec, ev))


@sync_to_async
def ledger_triggers(seat: str) -> set[str]:
    return set(LedgerEntry.objects.filter(seat=seat).values_list("trigger", flat=True))


async def dead_letter_ids(q: EventQueue) -> list[str]:
    return [d.event.id for d in await q.dead_letters()]


# -- values no store can hold ---------------------------------------------------------


def test_a_nul_or_a_lone_surrogate_is_written_as_its_escape_and_every_other_text_is_left_as_it_is() -> None:
    assert storable("D0\x00X") == "D0\\u0000X"
    assert storable("a\ud800b \U0001f600") == "a\\ud800b \U0001f600"  # a proper pair is text, kept
    plain = "héllo, wörld"
    assert storable(plain) is plain

    nested: Any = "\x00"
    for _ in range(5000):  # deeper than the interpreter's stack: the walk is iterative
        nested = [nested]
    flat = storable_value(nested)
    for _ in range(5000):
        flat = flat[0]
    assert flat == "\\u0000"
    assert storable_value({"k\x00": {"v": ["\ud800"]}}) == {"k\\u0000": {"v": ["\\ud800"]}}

    clean = dm("hi", channel="D0GOOD", n=1)
    assert storable_event(clean) is clean
    poison = dm("hi \ud800", channel="D0\x00X", n=2)
    escaped = storable_event(poison)
    assert escaped.id == poison.id and escaped.payload["partition_key"] == "slack:D0\\u0000X"
    assert escaped.data.body == "hi \\ud800"
    escaped.to_json().decode("utf-8")
    # The original publishes too: its lone surrogate travels as its JSON escape and decodes back to itself.
    assert json.loads(poison.to_json())["body"] == "hi \ud800"


def test_a_triggers_identity_never_carries_a_value_a_store_cannot_hold() -> None:
    ev = dm("hi", channel="D0\x00X", n=1)
    assert trigger_identity(ev) == "message:slack:D0\\u0000X:1718000000.000001"
    assert trigger_identity(ev) == trigger_identity(storable_event(ev))  # the same key on every redelivery


@pytest.mark.postgres
@DB
def test_on_postgresql_the_ledger_screens_and_records_an_identity_carrying_a_nul() -> None:
    raw = "message:slack:D0\x00X:1718000000.000001"
    with pytest.raises(DataError):  # the store itself refuses the raw value
        LedgerEntry.objects.filter(trigger=raw).exists()
    assert screen("ada", [raw]) == ({}, None)
    assert record("ada", "turn-1", [(raw, "ev\x001")]) == 1
    assert screen("ada", [raw])[0] == {"message:slack:D0\\u0000X:1718000000.000001": "turn-1"}


@pytest.mark.postgres
@DB
def test_the_store_refusing_a_value_is_told_apart_from_the_store_being_down() -> None:
    with pytest.raises(DataError) as refused:
        LedgerEntry.objects.filter(trigger="\x00").exists()
    assert store_fault(refused.value) == FAULT_VALUE

    settings = {**connections["default"].settings_dict, "NAME": "crewlet_no_such_database_h2"}
    absent = type(connections["default"])(settings, alias="absent")
    with pytest.raises(OperationalError) as down:
        absent.ensure_connection()
    assert store_fault(down.value) == FAULT_DOWN
    assert store_fault(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")) == FAULT_VALUE


# -- the NUL in a batch, on PostgreSQL ---------------------------------------------------


@pytest.mark.postgres
@DB
async def test_a_nul_in_a_dm_channel_runs_its_turn_and_the_good_dm_drained_with_it_runs_too() -> None:
    async with memory_queues() as (_, [q]):
        rec, org = await recording_with_mailboxes(q)
        poison = dm("hello from a broken client", channel="D0\x00X", n=1)
        good = dm("are you there?", channel="D0GOOD", n=2)
        await put(q, poison, good)  # waiting together: one drain, the poison's partition first

        async with running(q, org, merge=coalesce, store_retry_s=0.01):
            await eventually(lambda: ran(rec, good), what="the good DM's turn")
            await eventually(lambda: ran(rec, poison), what="the escaped DM's turn")
            await drained(q, "ada")
        assert await dead_letter_ids(q) == []
        assert await ledger_triggers("ada") == {
            "message:slack:D0\\u0000X:1718000000.000001",
            "message:slack:D0GOOD:1718000000.000002",
        }
        [turn] = started_for(rec, poison)
        assert turn.data.conversation_key == "slack:D0\\u0000X"


@DB
async def test_a_lone_surrogate_in_a_wake_from_another_producer_runs_its_turn_and_its_telemetry_publishes() -> None:
    async with memory_queues() as (broker, [q]):
        rec, org = await recording_with_mailboxes(q)
        poison = dm("caf\ud800 menu?", channel="D0SUR", n=1)
        # Another build's encoder escapes the surrogate as JSON allows; this one's decoder gives it back raw.
        broker.publish(topics.agent_inbox("ada"), json.dumps(poison.to_dict()).encode("ascii"))
        async with running(q, org, merge=coalesce):
            await eventually(lambda: ran(rec, poison), what="the surrogate DM's turn")
            await drained(q, "ada")
        [phase] = rec.of("agent_phase_completed", seat="ada")
        assert phase.data.user_prompt == "sam: caf\\ud800 menu?"
        assert await dead_letter_ids(q) == []


# -- a store that refuses one event's value -----------------------------------------------


@contextlib.asynccontextmanager
async def screened_by(
    monkeypatch: pytest.MonkeyPatch, ascreen: Any
) -> AsyncIterator[tuple[EventQueue, Recorder, Organization]]:
    """A twin client whose inbox screens identities with ``ascreen``; a recorder on it, and the company's mailboxes."""
    monkeypatch.setattr(inbox_module, "ascreen", ascreen)
    async with memory_queues() as (_, [q]):
        rec, org = await recording_with_mailboxes(q)
        yield q, rec, org


def _refusing_screen(marker: str) -> Any:
    """The real screen, except that an identity containing ``marker`` meets a value the store refuses.

    The refusal is the database's own (a NUL on PostgreSQL, a lone surrogate
    on SQLite): what the ledger did for every such wake before it escaped them.
    """

    def refusing(seat: str, identities: Any) -> Any:
        wanted = list(identities)
        if any(marker in i for i in wanted):
            bad = "\x00" if connection.vendor == "postgresql" else "\ud800"
            LedgerEntry.objects.filter(trigger=bad).exists()
        return screen(seat, wanted)

    return in_store(refusing)


@pytest.mark.postgres
@DB
async def test_a_value_the_store_refuses_is_naked_alone_and_never_parks_the_good_dm_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with screened_by(monkeypatch, _refusing_screen("D0POISON")) as (q, rec, org):
        poison = dm("poison", channel="D0POISON", n=1)
        good = dm("good", channel="D0GOOD", n=2)
        await put(q, poison, good)
        async with running(q, org, merge=coalesce, store_retry_s=0.01) as rt:
            await eventually(lambda: ran(rec, good), what="the good DM's turn")
            await eventually(lambda: dead_letter_ids(q), what="the poison's dead letter")
            await drained(q, "ada")
            loop = rt.loops["ada"]
            assert [r for i, r in loop.stats.deliveries if i == poison.id] == list(range(MAX_DELIVERIES - 1, -1, -1))
        assert await dead_letter_ids(q) == [poison.id]
        assert started_for(rec, poison) == []
        assert len(started_for(rec, good)) == 1


@pytest.mark.postgres
@DB
async def test_a_refused_value_inside_a_conversations_batch_degrades_it_and_only_the_poison_is_dead_lettered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with screened_by(monkeypatch, _refusing_screen("1718000000.000001")) as (q, rec, org):
        poison, second, third = (dm(f"message {n}", channel="D0ONE", n=n) for n in (1, 2, 3))
        await put(q, poison, second, third)  # one partition: the same DM channel
        async with running(q, org, merge=coalesce, store_retry_s=0.01):
            await eventually(lambda: ran(rec, second) and ran(rec, third), what="the good messages' turns")
            await eventually(lambda: dead_letter_ids(q), what="the poison's dead letter")
            await drained(q, "ada")
        assert await dead_letter_ids(q) == [poison.id]
        assert len(started_for(rec, second)) == 1 and len(started_for(rec, third)) == 1
        assert await ledger_triggers("ada") == {
            "message:slack:D0ONE:1718000000.000002",
            "message:slack:D0ONE:1718000000.000003",
        }


@pytest.mark.postgres
@DB
async def test_a_store_that_is_down_still_defers_the_drain_and_retries_rather_than_failing_the_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with screened_by(monkeypatch, store_away_for([3])) as (q, rec, org):
        first, second = dm("one", channel="D0A", n=1), dm("two", channel="D0B", n=2)
        await put(q, first, second)
        async with running(q, org, merge=coalesce, store_retry_s=0.01) as rt:
            await eventually(lambda: ran(rec, first) and ran(rec, second), what="both turns after the outage")
            await drained(q, "ada")
            stats = rt.loops["ada"].stats
            assert stats.deferred == 3 and stats.failed == 0
        assert await dead_letter_ids(q) == []


# -- a turn that crashes on one event; logging ----------------------------------------------------


class CrashingOn(TurnRunner):
    """The real runner, except that a trigger containing ``marker`` crashes it (a bug only that content hits)."""

    def __init__(self, queue: EventQueue, company_holder: CompanyHolder, marker: str) -> None:
        super().__init__(queue, company_holder)
        self.marker = marker

    async def run(self, seat: Seat, trigger: Trigger) -> TurnResult:
        if self.marker in trigger.prompt():
            raise RecursionError(f"maximum recursion depth exceeded while walking {self.marker} " + "x" * 500)
        return await super().run(seat, trigger)


@pytest.mark.postgres
@DB
async def test_a_merged_turn_that_crashes_on_one_event_degrades_and_the_others_run_their_turns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="crewlet.seats")
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        org = company()
        h = holder(org)
        await ensure_mailboxes(q, org)
        first, poison, last = dm("hi", channel="D0ONE", n=1), dm("BOOM", channel="D0ONE", n=2), dm("bye", channel="D0ONE", n=3)
        await put(q, first, poison, last)
        async with running(q, org, merge=coalesce, runner=CrashingOn(q, h, "BOOM")):
            await eventually(lambda: ran(rec, first) and ran(rec, last), what="the good messages' turns")
            await eventually(lambda: dead_letter_ids(q), what="the poison's dead letter")
            await drained(q, "ada")
        assert await dead_letter_ids(q) == [poison.id]
        assert len(started_for(rec, first)) == 1 and len(started_for(rec, last)) == 1

    crashes = [r for r in caplog.records if r.getMessage() == "seat_turn_crashed"]
    # The merged turn crashed once, then the poison alone once per delivery it had left.
    assert len(crashes) == MAX_DELIVERIES + 1
    with_traceback = [r for r in crashes if r.exc_info]
    assert len(with_traceback) == 2  # first deliveries only: the merged turn's, and the poison's first alone
    assert all(len(r.error) <= 200 and r.error.startswith("RecursionError: ") for r in crashes)  # type: ignore[attr-defined]
    failed = [r for r in caplog.records if r.getMessage() == "seat_turn_failed"]
    assert len(failed) == len(crashes) and all(r.error_kind == "crashed" for r in failed)  # type: ignore[attr-defined]
    debug_tracebacks = [r for r in caplog.records if r.getMessage() == "seat_turn_crashed_traceback"]
    assert len(debug_tracebacks) == len(crashes) - len(with_traceback)
    assert all(r.levelno == logging.DEBUG for r in debug_tracebacks)


# -- the merge seam ---------------------------------------------------------------------------------


async def test_a_merge_that_raises_on_one_constituent_of_any_kind_degrades_to_per_event_dispatch() -> None:
    async with memory_queues() as (_, [q]):
        await q.ensure_subscription(topics.agent_inbox("ada"), topics.agent_inbox_group("ada"))
        first, second = dm("one", channel="D0ONE", n=1), dm("two", channel="D0ONE", n=2)
        second.delegation_depth = "deep"  # type: ignore[assignment]  # a field the merge cannot even compare
        ran_with: list[Event] = []

        async def run(ev: Event) -> Optional[str]:
            ran_with.append(ev)
            return "ran"

        assert await dispatch(q, "ada", [first, second], run) == "ran"
        assert [e.id for e in ran_with] == [first.id]
        await eventually(lambda: _backlog_is(q, 1), what="the tail requeued as its own inbox message")


async def _backlog_is(q: EventQueue, n: int) -> bool:
    return await q.backlog(topics.agent_inbox("ada"), topics.agent_inbox_group("ada")) == n


# -- through a real `manage.py up` on PostgreSQL ------------------------------------------------------

UP_TOKEN = "hardening-inbox-operator-token-0123456789"


def _api_post(url: str, path: str, token: str) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url + path, data=b"{}", headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.postgres
@pytest.mark.integration
@pytest.mark.timeout(300)
@DB
def test_in_manage_py_up_a_nul_wake_drained_with_a_posted_dm_neither_fails_nor_holds_the_dm_back(tmp_path: Any) -> None:
    import os
    import uuid

    from crewlet.queue.broker import EmbeddedBroker
    from crewlet.queue.jetstream import JetStreamQueue
    from seats_support import FAST
    from tests.browser_support import Company, LoopThread, slack_message

    loop = LoopThread()
    broker = EmbeddedBroker(store_dir=tmp_path / "jetstream")
    loop.run(broker.start())
    running_company = Company(tmp_path, broker.url)
    running_company.env.update({k: v for k, v in os.environ.items() if k.startswith("CREWLET_PG_")})
    running_company.env.update(
        CREWLET_DATABASE="postgres",
        CREWLET_PG_DBNAME=connections["default"].settings_dict["NAME"],
        CREWLET_PG_EVENTS_DBNAME=connections["events"].settings_dict["NAME"],
        CREWLET_OPERATOR_TOKEN=UP_TOKEN,
    )
    client: Any = None
    seen: list[Event] = []
    try:
        running_company.start()
        client = loop.run(JetStreamQueue.connect(broker.url, node="tester", timings=FAST, memory_storage=broker.memory_storage))

        async def watch(topic: str, ev: Event) -> None:
            seen.append(ev)

        loop.run(client.subscribe_stream(topics.EVENTS_ALL, watch))
        url = running_company.url

        # Held, so the two wait together and are drained together when the hold lifts.
        assert _api_post(url, "/api/seats/ada/pause", UP_TOKEN) == 200
        poison = dm("hello from a client that sends NULs", channel="D0\x00X", n=1)  # older: its partition goes first
        loop.run(client.publish(topics.agent_inbox("ada"), poison))
        status, _ = running_company.post_json("/webhooks/slack", slack_message(f"Ev{uuid.uuid4().hex[:10]}", "good DM"))
        assert status == 202

        def waiting() -> bool:
            depth = loop.run(client.backlog(topics.agent_inbox("ada"), topics.agent_inbox_group("ada")))
            return depth >= 2

        wait_until(waiting, 30, "both wakes waiting in ada's held inbox")
        assert _api_post(url, "/api/seats/ada/resume", UP_TOKEN) == 200

        def prompts() -> list[str]:
            return [
                e.data.user_prompt for e in list(seen) if e.type == "agent_phase_completed" and e.data.seat == "ada"
            ]

        wait_until(lambda: any("good DM" in p for p in prompts()), 60, "the posted DM's turn")
        wait_until(lambda: any("client that sends NULs" in p for p in prompts()), 60, "the NUL wake's turn")
        started = [e for e in list(seen) if e.type == "agent_turn_started" and e.data.trigger_event_id == poison.id]
        assert [s.data.conversation_key for s in started] == ["slack:D0\\u0000X"]
        assert loop.run(client.dead_letters()) == []
    finally:
        output = running_company.stop()
        if client is not None:
            loop.run(client.close())
        loop.run(broker.stop())
        loop.close()
    assert "Traceback" not in output, output[-4000:]
