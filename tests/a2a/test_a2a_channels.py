"""Ephemeral A2A channels on the shipped stack: a real nats-server (the embedded broker) and the test database."""
from __future__ import annotations

import contextlib
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator, Optional

import pytest
from asgiref.sync import sync_to_async

from a2a import services
from a2a.api import render
from a2a.hooks import answer_after_turn, ask_from_turn
from a2a.models import Channel
from crewlet.events.types import SYSTEM_CLOSED_A2A
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from seats.mailboxes import ensure_mailboxes
from seats.ownership import SeatOwnership
from seats.turn_types import OUTCOME_COMPLETED, Trigger, TurnResult
from seats_support import Recorder, company, eventually, jetstream_queues, running, send

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

T0 = datetime(2025, 6, 2, 9, 0, tzinfo=timezone.utc)
BRIEF = "which port does the staging db listen on?"


@sync_to_async
def record(channel_id: Any) -> Optional[Channel]:
    return Channel.objects.filter(pk=channel_id).first()


async def closed(channel_id: Any) -> bool:
    row = await record(channel_id)
    return row is not None and row.state == Channel.CLOSED


def on_topic(rec: Recorder, topic: str, etype: str) -> list[Any]:
    return [ev for t, ev in rec.seen if t == topic and ev.type == etype]


def seat(handle: str) -> Any:
    return company().seat_by_handle(handle)


# -- ask → answer → close -----------------------------------------------------------------------


async def test_ada_asks_linus_and_linus_turns_response_wakes_ada_and_closes_the_channel_by_linus() -> None:
    async with jetstream_queues() as [q]:
        rec = Recorder().attach(q)
        async with running(q) as rt:
            row = await services.ask(q, "ada", "linus", BRIEF, parent_turn_id="turn-ada-0")
            cid = str(row.id)
            await eventually(lambda: closed(cid), what="the answering turn closed the channel")
            await eventually(
                lambda: rec.of("agent_turn_completed", seat="ada", conversation_key=f"a2a:{cid}"),
                what="the answer woke ada for an ordinary turn",
            )

        [opened] = rec.of("a2a_channel_opened")
        assert (opened.data.channel_id, opened.data.participants, opened.data.opened_by) == (cid, ["ada", "linus"], "ada")
        assert (opened.data.target, opened.data.brief, opened.data.turn_id) == ("linus", BRIEF, "turn-ada-0")
        assert (opened.delegation_depth, opened.parent_turn_id, opened.delegation_chain) == (1, "turn-ada-0", ["ada"])

        [request] = on_topic(rec, topics.agent_inbox("linus"), "a2a_request")
        assert (request.data.channel_id, request.data.from_seat, request.data.to_seat) == (cid, "ada", "linus")
        assert (request.data.brief, request.data.conversation_key) == (BRIEF, f"a2a:{cid}")
        assert (request.delegation_depth, request.parent_turn_id, request.delegation_chain) == (1, "turn-ada-0", ["ada"])
        assert "partition_key" not in request.payload  # keyed on its own id: never coalesced

        [linus_turn] = rec.of("agent_turn_started", seat="linus")
        assert (linus_turn.data.trigger_type, linus_turn.data.trigger_event_id) == ("a2a_request", request.id)
        [linus_phase] = rec.of("agent_phase_completed", seat="linus")
        response = linus_phase.data.response
        assert response == f"ada: {BRIEF}"  # the echo model answers with what it was asked

        [wake] = on_topic(rec, topics.agent_inbox("ada"), "a2a_message")
        assert (wake.data.channel_id, wake.data.from_seat, wake.data.to_seat) == (cid, "linus", "ada")
        assert (wake.data.message, wake.data.turn_id) == (response, linus_turn.data.turn_id)
        assert (wake.delegation_depth, wake.parent_turn_id) == (0, linus_turn.data.turn_id)
        assert wake.id == services.answer_event_id(cid)

        [sent] = rec.of("a2a_message_sent")
        assert (sent.data.channel_id, sent.data.from_seat, sent.data.to_seat) == (cid, "linus", "ada")
        assert (sent.data.message, sent.data.message_count, sent.data.turn_id) == (response, 1, linus_turn.data.turn_id)
        assert (sent.data.role, sent.data.agent_id) == ("reviewer", seat("linus").agent_id)

        stored = await record(cid)
        assert stored is not None
        [close] = rec.of("a2a_channel_closed")
        assert close.data.channel_id == cid and close.data.participants == ["ada", "linus"]
        assert (close.data.closed_by, close.data.turn_id, close.data.work_key) == ("linus", linus_turn.data.turn_id, f"a2a:{cid}")
        assert close.data.message_count == 1
        assert close.data.open_seconds == (stored.closed_at - stored.opened_at).total_seconds()
        assert close.summary().startswith(f"linus closed A2A channel {cid}")
        assert (stored.closed_by, stored.turn_id, stored.message_count) == ("linus", linus_turn.data.turn_id, 1)

        [ada_turn] = rec.of("agent_turn_started", seat="ada")
        assert ada_turn.data.trigger_type == "a2a_message"  # an ordinary turn: it answers nothing
        assert len(rec.of("a2a_message_sent")) == 1 and len(rec.of("a2a_channel_closed")) == 1


async def test_the_ask_and_the_answer_cross_between_two_nodes_each_running_one_seat() -> None:
    async with jetstream_queues("n1", "n2") as [q1, q2]:
        rec = Recorder().attach(q1, q2)
        async with running(q1, ownership=SeatOwnership("n1", claimable=["ada"])) as rt1, running(
            q2, ownership=SeatOwnership("n2", claimable=["linus"])
        ) as rt2:
            assert (set(rt1.loops), set(rt2.loops)) == ({"ada"}, {"linus"})
            row = await services.ask(q1, "ada", "linus", BRIEF)
            cid = str(row.id)
            await eventually(lambda: closed(cid), what="linus's node answered and closed")
            await eventually(lambda: rt1.loops["ada"].stats.turns == 1, what="ada's node ran the answer's turn")
            assert rt2.loops["linus"].stats.turns == 1
        [close] = rec.of("a2a_channel_closed")
        assert close.data.closed_by == "linus"
        [sent] = rec.of("a2a_message_sent")
        assert sent.node == "n2"  # the answering seat's node published the answer
        [opened] = rec.of("a2a_channel_opened")
        assert opened.node == "n1"


async def test_a_redelivered_request_and_a_redelivered_answer_run_no_second_turn() -> None:
    async with jetstream_queues() as [q]:
        rec = Recorder().attach(q)
        async with running(q) as rt:
            row = await services.ask(q, "ada", "linus", BRIEF)
            cid = str(row.id)
            await eventually(lambda: closed(cid))
            await eventually(lambda: rt.loops["ada"].stats.turns == 1, what="ada's turn on the answer")
            [request] = on_topic(rec, topics.agent_inbox("linus"), "a2a_request")
            [wake] = on_topic(rec, topics.agent_inbox("ada"), "a2a_message")
            await send(q, "linus", request)
            await send(q, "ada", wake)
            await eventually(lambda: len(rec.of("turn_trigger_skipped")) == 2, what="both repeats skipped")
        skipped = {ev.data.trigger_event_id for ev in rec.of("turn_trigger_skipped")}
        assert skipped == {request.id, wake.id}
        assert len(rec.of("agent_turn_started", seat="linus")) == 1
        assert len(rec.of("agent_turn_started", seat="ada")) == 1
        assert len(rec.of("a2a_message_sent")) == 1 and len(rec.of("a2a_channel_closed")) == 1


# -- refusals ------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def mailboxed() -> AsyncIterator[tuple[EventQueue, Recorder]]:
    """The broker with every seat's mailbox and no loop: the service verbs alone."""
    async with jetstream_queues() as [q]:
        await ensure_mailboxes(q, company())
        yield q, Recorder().attach(q)


async def test_a_reply_to_a_closed_channel_bounces_with_a_reason_that_says_it_is_closed() -> None:
    async with mailboxed() as (q, rec):
        row = await services.ask(q, "ada", "linus", BRIEF)
        await services.answer(q, str(row.id), "linus", "5432", "turn-1", "a2a:x")
        with pytest.raises(services.ChannelClosed) as bounced:
            await services.answer(q, str(row.id), "linus", "5432 again", "turn-2", "a2a:x")
        assert "is closed" in bounced.value.reason and "by linus" in bounced.value.reason
        assert len(rec.of("a2a_message_sent")) == 1 and len(rec.of("a2a_channel_closed")) == 1


async def test_an_unknown_channel_id_says_it_is_unknown() -> None:
    async with mailboxed() as (q, rec):
        for bogus in ("0b7f6c2e-0000-4000-8000-000000000000", "not-a-uuid"):
            with pytest.raises(services.UnknownChannel) as refused:
                await services.answer(q, bogus, "linus", "hi", "turn-1", "")
            assert "unknown" in refused.value.reason
        assert rec.seen == []


async def test_only_the_seat_asked_may_answer_and_a_refused_answer_leaves_the_channel_open() -> None:
    async with mailboxed() as (q, rec):
        row = await services.ask(q, "ada", "linus", BRIEF)
        for wrong in ("ada", "grace"):
            with pytest.raises(services.NotTheAnswerer) as refused:
                await services.answer(q, str(row.id), wrong, "me instead", "turn-1", "")
            assert "only linus" in refused.value.reason
        stored = await record(row.id)
        assert stored is not None and stored.state == Channel.OPEN and stored.message_count == 0
        assert rec.of("a2a_message_sent") == [] and rec.of("a2a_channel_closed") == []


# -- the sweep ----------------------------------------------------------------------------------------------


async def test_the_sweep_closes_an_idle_channel_naming_no_closer_and_deletes_it_seven_days_later() -> None:
    async with mailboxed() as (q, rec):
        row = await services.ask(q, "ada", "linus", BRIEF, now=T0)
        cid = str(row.id)

        inside = await services.sweep(q, now=T0 + timedelta(minutes=59))
        assert (inside.closed, inside.deleted) == ([], 0)
        assert (await record(cid)).state == Channel.OPEN  # type: ignore[union-attr]

        swept = await services.sweep(q, now=T0 + timedelta(minutes=61))
        assert swept.closed == [cid]
        [close] = rec.of("a2a_channel_closed")
        assert close.data.channel_id == cid and close.data.participants == ["ada", "linus"]
        assert (close.data.closed_by, close.data.turn_id, close.data.work_key) == ("", "", "")
        assert (close.data.message_count, close.data.open_seconds) == (0, 61 * 60.0)
        assert close.summary().startswith(f"{SYSTEM_CLOSED_A2A} {cid}")

        with pytest.raises(services.ChannelClosed) as late:  # the late answer bounces: the record says why
            await services.answer(q, cid, "linus", "sorry, late", "turn-late", "")
        assert "is closed" in late.value.reason and "sweep" in late.value.reason

        closed_at = T0 + timedelta(minutes=61)
        kept = await services.sweep(q, now=closed_at + timedelta(days=7) - timedelta(seconds=1))
        assert (kept.closed, kept.deleted) == ([], 0)
        gone = await services.sweep(q, now=closed_at + timedelta(days=7, seconds=1))
        assert gone.deleted == 1 and await record(cid) is None
        assert len(rec.of("a2a_channel_closed")) == 1


async def test_the_sweep_on_the_stores_own_clock_leaves_a_fresh_open_channel_alone() -> None:
    async with mailboxed() as (q, rec):
        row = await services.ask(q, "ada", "linus", BRIEF)
        report = await services.sweep(q)
        assert (report.closed, report.deleted) == ([], 0)
        assert (await record(row.id)).state == Channel.OPEN  # type: ignore[union-attr]
        short = await services.sweep(q, idle_close_s=0.0)  # an injected idle of zero closes it on the same clock
        assert short.closed == [str(row.id)]


async def test_a_second_sweep_of_the_same_channel_publishes_no_second_close() -> None:
    async with mailboxed() as (q, rec):
        row = await services.ask(q, "ada", "linus", BRIEF, now=T0)
        later = T0 + timedelta(hours=2)
        assert (await services.sweep(q, now=later)).closed == [str(row.id)]
        assert (await services.sweep(q, now=later)).closed == []
        assert len(rec.of("a2a_channel_closed")) == 1


# -- delegation depth ----------------------------------------------------------------------------------------------


async def test_an_ask_from_a_turn_at_the_depth_cap_publishes_a_guard_breach_and_opens_nothing() -> None:
    async with mailboxed() as (q, rec):
        with pytest.raises(services.DepthCapExceeded):
            await services.ask(
                q, "ada", "linus", BRIEF, parent_turn_id="turn-9", delegation_depth=services.A2A_MAX_DEPTH,
                delegation_chain=["linus", "ada", "linus"],
            )
        with pytest.raises(services.DepthCapExceeded):
            await services.ask(q, "ada", "linus", BRIEF, delegation_depth=1, max_depth=1)
        [breach, _] = rec.of("turn.guard_breach")
        assert (breach.data.seat, breach.data.turn_id, breach.data.guard) == ("ada", "turn-9", "depth_cap")
        assert f"depth {services.A2A_MAX_DEPTH}" in breach.data.detail
        assert rec.of("a2a_channel_opened") == [] and await sync_to_async(Channel.objects.count)() == 0


async def test_a_turn_woken_by_an_ask_asks_onward_one_level_deeper_with_the_chain() -> None:
    async with mailboxed() as (q, rec):
        first = await services.ask(q, "ada", "linus", BRIEF, parent_turn_id="turn-ada")
        [request] = on_topic(rec, topics.agent_inbox("linus"), "a2a_request")
        trigger = Trigger(events=[request])
        onward = await ask_from_turn(q, seat("linus"), trigger, "ada", "ada, what did grace say?")
        stored = await record(onward.id)  # type: ignore[attr-defined]
        assert stored is not None and (stored.asker_turn_id, stored.delegation_depth) == (trigger.turn_id, 1)
        [second] = on_topic(rec, topics.agent_inbox("ada"), "a2a_request")
        assert second.data.channel_id == str(onward.id) != str(first.id)  # type: ignore[attr-defined]
        assert (second.delegation_depth, second.parent_turn_id, second.delegation_chain) == (
            2,
            trigger.turn_id,
            ["ada", "linus"],
        )
        assert second.trace_id == request.trace_id  # the onward ask continues the first one's trace


# -- a chain of asks -----------------------------------------------------------------------------------------------

CHAIN = company(seats=[{"handle": h, "kind": "agent"} for h in ("ada", "linus", "hopper")])


def ended(turn_id: str, response: str = "") -> TurnResult:
    return TurnResult(turn_id=turn_id, outcome=OUTCOME_COMPLETED, response=response)


@contextlib.asynccontextmanager
async def linus_asks_onward(now: Optional[datetime] = None) -> AsyncIterator[tuple[EventQueue, Recorder, str, str]]:
    """ada asks linus; linus's turn on that ask asks hopper and ends; the hook has run for it. Yields both channels."""
    async with jetstream_queues() as [q]:
        await ensure_mailboxes(q, CHAIN)
        rec = Recorder().attach(q)
        linus = CHAIN.seat_by_handle("linus")
        assert linus is not None
        first = await services.ask(q, "ada", "linus", BRIEF, parent_turn_id="turn-ada", now=now)
        [request] = on_topic(rec, topics.agent_inbox("linus"), "a2a_request")
        asking = Trigger(events=[request])
        onward = await ask_from_turn(q, linus, asking, "hopper", "hopper, which port is staging's?", now=now)
        await answer_after_turn(q, linus, [request], ended(asking.turn_id))
        yield q, rec, str(first.id), str(onward.id)


async def test_a_turn_that_ends_by_asking_onward_is_not_the_answer_and_the_onward_answers_turn_answers_the_first_ask() -> None:
    async with linus_asks_onward() as (q, rec, first, onward):
        stored = await record(onward)
        assert stored is not None and render(stored)["on_behalf_of"] == first  # what GET /api/a2a/channels shows
        still = await record(first)
        assert still is not None and still.state == Channel.OPEN
        assert on_topic(rec, topics.agent_inbox("ada"), "a2a_message") == []  # no empty answer went to ada

        await services.answer(q, onward, "hopper", "5432", "turn-hopper", services.conversation_key(onward))
        [wake] = on_topic(rec, topics.agent_inbox("linus"), "a2a_message")
        owed = wake.data.owed()  # the wake carries the ask linus still owes, so its turn's prompt can show it
        assert owed is not None and (owed.channel_id, owed.from_seat, owed.to_seat, owed.brief) == (first, "ada", "linus", BRIEF)
        prompt = Trigger(events=[wake]).prompt()
        assert prompt.startswith(f"ada asked you: {BRIEF}\n") and prompt.endswith("\nhopper: 5432")
        # linus's turn on hopper's answer: any node, any process — the rows and the wake are all it has
        linus = CHAIN.seat_by_handle("linus")
        assert linus is not None
        await answer_after_turn(q, linus, [wake], ended("turn-linus-2", "staging's db listens on 5432"))

        answered = await record(first)
        assert answered is not None
        assert (answered.state, answered.closed_by, answered.turn_id, answered.work_key) == (
            Channel.CLOSED, "linus", "turn-linus-2", f"a2a:{first}"
        )
        [to_ada] = on_topic(rec, topics.agent_inbox("ada"), "a2a_message")
        assert (to_ada.data.channel_id, to_ada.data.from_seat, to_ada.data.message) == (
            first, "linus", "staging's db listens on 5432"
        )
        assert to_ada.data.owed() is None  # ada asked on behalf of nothing: it owes no one
        assert [(c.data.channel_id, c.data.closed_by) for c in rec.of("a2a_channel_closed")] == [
            (onward, "hopper"), (first, "linus")
        ]


async def test_a_turn_on_the_onward_answer_that_asks_again_keeps_the_first_ask_owed_through_the_new_channel() -> None:
    async with linus_asks_onward() as (q, rec, first, onward):
        linus = CHAIN.seat_by_handle("linus")
        assert linus is not None
        await services.answer(q, onward, "hopper", "ask ada", "turn-hopper", services.conversation_key(onward))
        [wake] = on_topic(rec, topics.agent_inbox("linus"), "a2a_message")
        again = Trigger(events=[wake])
        third = await ask_from_turn(q, linus, again, "hopper", "hopper, and the replica?")
        await answer_after_turn(q, linus, [wake], ended(again.turn_id))
        stored = await record(third.id)
        assert stored is not None and str(stored.on_behalf_of) == first
        owed = await record(first)
        assert owed is not None and owed.state == Channel.OPEN


async def test_the_sweep_closes_an_abandoned_chain_of_asks_naming_no_closer() -> None:
    async with linus_asks_onward(now=T0) as (q, rec, first, onward):
        swept = await services.sweep(q, now=T0 + timedelta(minutes=61))
        assert set(swept.closed) == {first, onward}
        for close in rec.of("a2a_channel_closed"):
            assert (close.data.closed_by, close.data.turn_id, close.data.work_key) == ("", "", "")
        assert on_topic(rec, topics.agent_inbox("ada"), "a2a_message") == []
