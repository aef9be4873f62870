"""Seat mailboxes: recorded and created idempotently, retired with their mail 24 hours after the seat left."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from asgiref.sync import sync_to_async

from crewlet.queue import topics
from crewlet.queue.contract import SubscriptionRef
from seats.delivery_models import SeatRecord
from seats.mailboxes import ensure_control_mailbox, ensure_mailboxes, mailbox_refs, retire_absent
from seats.runtime import SeatRuntime
from seats_support import company, holder, memory_queues, send, wake

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

T0 = datetime(2025, 6, 2, 9, 0, tzinfo=timezone.utc)
DAY = timedelta(hours=24)
ADA_ONLY = [{"handle": "ada", "kind": "agent"}, {"handle": "grace", "kind": "human"}]  # linus removed


@sync_to_async
def record(handle: str) -> SeatRecord:
    return SeatRecord.objects.get(handle=handle)


async def seat_mailboxes(q: object, handle: str) -> set[SubscriptionRef]:
    return set(await q.list_subscriptions(topics.agent_pattern(handle)))  # type: ignore[attr-defined]


def inbox_only(handle: str) -> set[SubscriptionRef]:
    return {mailbox_refs(handle)[0]}


async def test_the_walk_records_every_seat_and_creates_each_agents_inbox_once_and_a_run_makes_its_control_mailbox() -> None:
    async with memory_queues() as (_, [q]):
        org = company()
        assert await ensure_mailboxes(q, org, now=T0) == ["ada", "linus"]
        assert await ensure_mailboxes(q, org, now=T0 + timedelta(minutes=1)) == []  # idempotent
        for handle in ("ada", "linus"):
            assert await seat_mailboxes(q, handle) == inbox_only(handle)
        assert await seat_mailboxes(q, "grace") == set()
        assert await ensure_control_mailbox(q, "ada") and not await ensure_control_mailbox(q, "ada")
        assert await seat_mailboxes(q, "ada") == set(mailbox_refs("ada"))
        ada, grace = await record("ada"), await record("grace")
        assert (ada.kind, ada.first_seen, ada.absent_since) == ("agent", T0, None)
        assert grace.kind == "human"


async def test_a_removed_seats_mailboxes_are_deleted_with_their_mail_24_hours_later_and_not_before() -> None:
    async with memory_queues() as (_, [q]):
        await ensure_mailboxes(q, company(), now=T0)
        await ensure_control_mailbox(q, "linus")  # a run of the seat made it
        await send(q, "linus", wake("linus", "a message nobody will read"))
        without_linus = company(seats=ADA_ONLY)

        first = await retire_absent(q, without_linus, now=T0 + timedelta(hours=1))
        assert first.retired == [] and (await record("linus")).absent_since == T0 + timedelta(hours=1)

        early = await retire_absent(q, without_linus, now=T0 + timedelta(hours=1) + DAY - timedelta(seconds=1))
        assert early.retired == []
        assert await seat_mailboxes(q, "linus") == set(mailbox_refs("linus"))

        due = await retire_absent(q, without_linus, now=T0 + timedelta(hours=1) + DAY)
        assert due.retired == ["linus"] and set(due.deleted) == set(mailbox_refs("linus"))
        assert await seat_mailboxes(q, "linus") == set()
        assert await q.backlog(topics.agent_inbox("linus"), topics.agent_inbox_group("linus")) == 0
        assert (await record("linus")).retired_at is not None
        assert await seat_mailboxes(q, "ada") == inbox_only("ada")  # a present seat is never touched

        # The seat comes back: its clock clears and the walk makes its mailboxes again.
        assert await ensure_mailboxes(q, company(), now=T0 + 2 * DAY) == ["linus"]
        back = await record("linus")
        assert (back.absent_since, back.retired_at) == (None, None)


async def test_a_seat_that_returns_within_24_hours_keeps_its_mailbox_and_its_mail() -> None:
    async with memory_queues() as (_, [q]):
        await ensure_mailboxes(q, company(), now=T0)
        await send(q, "linus", wake("linus", "still wanted"))
        await retire_absent(q, company(seats=ADA_ONLY), now=T0)
        await ensure_mailboxes(q, company(), now=T0 + timedelta(hours=23))
        report = await retire_absent(q, company(), now=T0 + 2 * DAY)
        assert report.retired == []
        assert await q.backlog(topics.agent_inbox("linus"), topics.agent_inbox_group("linus")) == 1


async def test_a_mailbox_that_escaped_the_record_is_found_by_listing_and_retired_a_day_after() -> None:
    async with memory_queues() as (_, [q]):
        ghost_inbox = SubscriptionRef(topics.agent_inbox("ghost"), topics.agent_inbox_group("ghost"))
        await q.ensure_subscription(ghost_inbox.topic, ghost_inbox.group)  # made by a node that kept no record
        found = await retire_absent(q, company(), now=T0)
        assert found.found_unrecorded == ["ghost"] and found.retired == []
        assert (await record("ghost")).kind == "unknown"
        gone = await retire_absent(q, company(), now=T0 + DAY)
        assert gone.retired == ["ghost"] and gone.deleted == [ghost_inbox]
        assert await seat_mailboxes(q, "ghost") == set()


async def test_the_runtimes_maintenance_duty_retires_a_seat_its_apply_removed() -> None:
    now = [T0.timestamp()]
    async with memory_queues() as (_, [q]):
        runtime = SeatRuntime(q, holder(), run_scheduler=False, clock=lambda: now[0], absent_after_s=86400)
        await runtime.start()
        try:
            await runtime.apply(company(seats=ADA_ONLY))
            assert sorted(runtime.loops) == ["ada"]
            assert await seat_mailboxes(q, "linus") == inbox_only("linus")  # detached, not deleted
            now[0] += 86400 - 1
            assert (await runtime.sweep()).retired == []
            now[0] += 1
            assert (await runtime.sweep()).retired == ["linus"]
            assert await seat_mailboxes(q, "linus") == set()
        finally:
            await runtime.stop()


async def test_an_agent_seat_flipped_to_human_loses_its_mailbox_a_day_later() -> None:
    async with memory_queues() as (_, [q]):
        await ensure_mailboxes(q, company(), now=T0)
        flipped = company(
            seats=[{"handle": "ada", "kind": "agent"}, {"handle": "linus", "kind": "human"}, {"handle": "grace", "kind": "human"}]
        )
        await ensure_mailboxes(q, flipped, now=T0)
        assert (await record("linus")).absent_since == T0 and (await record("grace")).absent_since is None
        assert (await retire_absent(q, flipped, now=T0 + DAY)).retired == ["linus"]
        assert await seat_mailboxes(q, "linus") == set()
        assert (await retire_absent(q, flipped, now=T0 + 2 * DAY)).retired == []  # once


async def test_retirement_holds_the_seats_lease_while_deleting_and_waits_while_another_node_holds_it() -> None:
    from crewlet.fleet.member import FleetMember
    from seats.ownership import LeasedOwnership

    member, other = FleetMember("n1", ttl_s=60), FleetMember("n2", ttl_s=60)
    await member.start()
    ownership = LeasedOwnership(member)
    during: list[str] = []

    async def claim(handle: str) -> bool:
        won = await ownership.claim(handle)
        during.extend([handle] if won and ownership.owns(handle) else [])
        return won

    try:
        async with memory_queues() as (_, [q]):
            await ensure_mailboxes(q, company(), now=T0)
            without_linus = company(seats=ADA_ONLY)
            await retire_absent(q, without_linus, now=T0)
            assert await other.acquire_seat("linus")  # a node still serving the old revision runs it
            held = await retire_absent(q, without_linus, now=T0 + DAY, claim=claim, release=ownership.release)
            assert held.retired == [] and await seat_mailboxes(q, "linus") == inbox_only("linus")
            await other.release_seat("linus")
            due = await retire_absent(q, without_linus, now=T0 + DAY, claim=claim, release=ownership.release)
            assert due.retired == ["linus"] and during == ["linus"]
            assert not ownership.owns("linus")  # given back once the mailboxes are gone
    finally:
        await member.stop()


async def test_retirement_marks_the_seat_first_and_a_deletion_that_failed_is_finished_by_the_next_sweep() -> None:
    async with memory_queues() as (_, [q]):
        await ensure_mailboxes(q, company(), now=T0)
        without_linus = company(seats=ADA_ONLY)
        await retire_absent(q, without_linus, now=T0)
        real_delete = q.delete_subscription
        deleted_while_marked: list[bool] = []

        async def failing_after_mark(topic: str, group: str) -> bool:
            deleted_while_marked.append((await record("linus")).retired_at is not None)
            raise RuntimeError("the broker went away mid-retirement")

        q.delete_subscription = failing_after_mark  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            await retire_absent(q, without_linus, now=T0 + DAY)
        assert deleted_while_marked == [True]  # the mark was there before the first deletion
        assert await seat_mailboxes(q, "linus") == inbox_only("linus")

        q.delete_subscription = real_delete  # type: ignore[method-assign]
        again = await retire_absent(q, without_linus, now=T0 + DAY + timedelta(minutes=5))
        assert again.retired == ["linus"] and await seat_mailboxes(q, "linus") == set()
