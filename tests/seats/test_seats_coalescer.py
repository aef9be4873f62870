"""The digest coalescer: order, supersede, same-sender dedupe, merges, the first trace, the degrade path."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import pytest

from crewlet import events
from crewlet.events import Event
from crewlet.events.types import ExternalNotification, TaskAssigned
from crewlet.queue import topics
from crewlet.queue.contract import BatchOptions, Partition
from crewlet.events.tracing import Trace
from seats.coalescer import coalesce, coalesced_record, dispatch, publish_coalesced
from seats.digest import COLLAPSED_DUPLICATE, COLLAPSED_SUPERSEDED, MalformedConstituent
from seats_support import Recorder, eventually, jetstream_queues, memory_queues

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
KEY = "slack:C1:1718.001"


def wake(
    body: str,
    *,
    sender: str = "sam",
    at: int = 0,
    key: str = KEY,
    conversation: Optional[str] = None,
    digest: str = "",
    depth: int = 0,
    chain: Optional[list[str]] = None,
    direct: bool = True,
    recon: bool = False,
    event_name: str = "message",
    position: str = "",
    trace: Optional[Trace] = None,
    event_id: Optional[str] = None,
) -> Event:
    """A wake as the notify router publishes it, at T0 + ``at`` seconds."""
    extras: dict[str, Any] = {
        "partition_key": key,
        "conversation_identity": key if conversation is None else conversation,
        "sender": sender,
        "sender_id": f"id-{sender}",
        "body": body,
        "digest_body": digest,
        "direct": direct,
        "recon": recon,
        "delivery_id": f"Ev-{body[:12]}-{at}",
    }
    if position:
        extras["trigger_position"] = position
    return events.new(
        ExternalNotification(seat="ada", sender=sender, body=body, event_name=event_name, title="in #general"),
        trace or Trace.root(),
        source="slack",
        extras=extras,
        delegation_depth=depth,
        delegation_chain=chain or [],
        event_id=event_id,
        timestamp=T0 + timedelta(seconds=at),
    )


def test_one_event_is_returned_as_it_is() -> None:
    only = wake("hello")
    assert coalesce([only]) is only
    assert coalesce([only, only]) is only  # a same-id duplicate is dropped first


def test_the_digest_lists_earlier_messages_oldest_first_then_the_latest_full_body() -> None:
    a, b, c = wake("first ask", at=1), wake("second thought", at=2, sender="kim"), wake("the latest, in full", at=3)
    merged = coalesce([c, a, b])  # drained out of order: timestamps decide
    body = merged.payload["body"]
    assert body.index("first ask") < body.index("second thought") < body.index("the latest, in full")
    assert body.startswith("[2 earlier messages in this conversation, oldest first]")
    assert body.endswith("[Latest message, from sam]\nthe latest, in full")
    assert merged.data.body == body and merged.data.sender == "sam"
    assert [m["body"] for m in merged.data.messages] == ["first ask", "second thought", "the latest, in full"]
    assert merged.payload["coalesced_event_ids"] == [a.id, b.id, c.id]
    assert merged.payload["partition_key"] == KEY and merged.payload["conversation_identity"] == KEY


def test_an_earlier_update_collapses_to_its_lead_line_while_comments_keep_their_text() -> None:
    lead = 'James updated TEST-1 "Fix That": status: To Do → In Progress'
    update = wake(lead + "\n\nDescription:\nA very long stale description", at=1, sender="james", digest=lead, key="jira:TEST-1")
    comment = wake("Please also update the docs", at=2, sender="eeshan", key="jira:TEST-1")
    latest = wake("Any news?", at=3, sender="eeshan", key="jira:TEST-1")
    merged = coalesce([update, comment, latest])
    body = merged.payload["body"]
    assert lead in body and "stale description" not in body
    assert "Please also update the docs" in body
    collapsed = [m["collapsed"] for m in merged.data.messages]
    assert collapsed == [COLLAPSED_SUPERSEDED, "", ""]
    assert "stale description" in merged.data.messages[0]["body"]  # full fidelity in messages


def test_the_latest_update_keeps_its_full_body_even_when_it_has_a_lead_line() -> None:
    lead = "James updated TEST-1: status"
    merged = coalesce([wake("a comment", at=1, key="jira:TEST-1"), wake(lead + "\n\nfull state", at=2, digest=lead, key="jira:TEST-1")])
    assert merged.payload["body"].endswith(lead + "\n\nfull state")


def test_a_same_sender_repeat_collapses_to_a_marker_but_two_peoples_plus_ones_both_survive() -> None:
    same = coalesce([wake("+1", at=1, sender="sam"), wake("+1", at=2, sender="sam"), wake("ship it", at=3, sender="kim")])
    assert same.payload["body"].count("+1") == 1  # the earlier of sam's two collapsed; the later one stays
    assert "(same as a later message from sam; collapsed)" in same.payload["body"]
    assert [m["collapsed"] for m in same.data.messages] == [COLLAPSED_DUPLICATE, "", ""]
    assert same.payload["duplicates_collapsed"] == 1

    two = coalesce([wake("+1", at=1, sender="sam"), wake("+1", at=2, sender="kim"), wake("ship it", at=3, sender="lee")])
    assert two.payload["body"].count("+1") == 2 and two.payload["duplicates_collapsed"] == 0


def test_the_merged_trigger_carries_the_first_constituents_trace() -> None:
    first_trace = Trace.root()
    first = wake("first", at=1, trace=first_trace)
    merged = coalesce([wake("second", at=2), first, wake("third", at=3)])
    assert (merged.trace_id, merged.span_id, merged.parent_span_id) == (
        first_trace.trace_id,
        first_trace.span_id,
        first_trace.parent_span_id,
    )


def test_the_merged_trigger_carries_the_deepest_delegation() -> None:
    merged = coalesce(
        [wake("a", at=1, depth=1, chain=["x"]), wake("b", at=2, depth=3, chain=["x", "y", "z"]), wake("c", at=3, depth=2)]
    )
    assert merged.delegation_depth == 3 and merged.delegation_chain == ["x", "y", "z"]


def test_recon_merges_only_when_every_message_was_recon_and_one_direct_ask_makes_it_direct() -> None:
    assert coalesce([wake("a", at=1, recon=True), wake("b", at=2, recon=True)]).payload["recon"] is True
    assert coalesce([wake("a", at=1, recon=True), wake("b", at=2, recon=False)]).payload["recon"] is False
    broadcasts = [wake("fyi", at=i, direct=False) for i in range(1, 4)]
    assert coalesce(broadcasts).payload["direct"] is False
    assert coalesce(broadcasts + [wake("@ada can you?", at=5)]).payload["direct"] is True


def test_the_trigger_position_is_the_furthest_on_one_stream() -> None:
    merged = coalesce(
        [wake("a", at=1, position="TRACKER@2:40"), wake("b", at=2, position="TRACKER@2:45"), wake("c", at=3, position="TRACKER@2:41")]
    )
    assert merged.payload["trigger_position"] == "TRACKER@2:45"


def test_the_merged_id_derives_from_the_constituents_so_a_redelivered_partition_is_the_same_trigger() -> None:
    evs = [wake("a", at=1), wake("b", at=2)]
    assert coalesce(evs).id == coalesce(list(reversed(evs))).id


@pytest.mark.parametrize(
    "bad, reason",
    [
        (lambda: events.new(TaskAssigned(seat="ada"), Trace.root(), extras={"partition_key": KEY, "body": "x"}), "not a notification"),
        (lambda: wake("x", at=2, key="slack:C1:other"), "partition_key"),
        (lambda: wake("x", at=2, conversation="slack:C9"), "conversation_identity"),
        (lambda: _with_body(wake("x", at=2), 42), "body is a int"),
    ],
)
def test_a_constituent_that_cannot_be_merged_raises_malformed_constituent(bad: Any, reason: str) -> None:
    good, broken = wake("ok", at=1), bad()
    with pytest.raises(MalformedConstituent, match=reason) as caught:
        coalesce([good, broken])
    assert caught.value.event_id == broken.id


def _with_body(ev: Event, body: Any) -> Event:
    ev.data = None
    ev.type = "external_notification"
    ev.payload["body"] = body
    return ev


def test_the_coalesced_record_names_the_partition_and_never_a_conversation_key() -> None:
    evs = [wake("+1", at=1), wake("+1", at=2), wake("go", at=3, sender="kim")]
    merged = coalesce(evs)
    record = coalesced_record(merged, seat="ada")
    assert record.type == "notifications_coalesced"
    assert record.data.partition_key == KEY and record.data.count == 3
    assert record.data.event_ids == [e.id for e in evs] and record.data.duplicates_collapsed == 1
    assert "conversation_key" not in record.to_dict() and "conversation_key" not in record.payload
    assert record.trace_id == evs[0].trace_id and record.parent_span_id == evs[0].span_id


async def test_publish_coalesced_puts_the_record_on_the_event_stream() -> None:
    async with memory_queues("n1") as (_, (q,)):
        rec = Recorder().attach(q)
        record = await publish_coalesced(q, coalesce([wake("a", at=1), wake("b", at=2)]), seat="ada")
        assert rec.seen == [(topics.event("notifications_coalesced"), rec.seen[0][1])]
        assert rec.seen[0][1].id == record.id


async def test_publish_coalesced_is_telemetry_and_never_raises_when_the_broker_is_down() -> None:
    async with memory_queues("n1") as (broker, (q,)):
        broker.go_away()
        record = await publish_coalesced(q, coalesce([wake("a", at=1), wake("b", at=2)]), seat="ada")
        assert record.data.count == 2


async def test_dispatch_runs_one_merged_trigger_and_records_the_merge() -> None:
    async with memory_queues("n1") as (_, (q,)):
        rec = Recorder().attach(q)
        ran: list[Event] = []

        async def run(ev: Event) -> str:
            ran.append(ev)
            return "done"

        evs = [wake("a", at=1), wake("b", at=2), wake("c", at=3)]
        assert await dispatch(q, "ada", evs + [evs[0]], run) == "done"
        assert len(ran) == 1 and ran[0].payload["coalesced_count"] == 3
        assert [e.type for _, e in rec.seen] == ["notifications_coalesced"]


async def test_a_failed_requeue_aborts_before_any_turn_ran() -> None:
    async with memory_queues("n1") as (broker, (q,)):
        ran: list[Event] = []

        async def run(ev: Event) -> None:
            ran.append(ev)

        broker.go_away()
        from crewlet.queue.errors import Unavailable

        with pytest.raises(Unavailable):
            await dispatch(q, "ada", [wake("ok", at=1), wake("x", at=2, key="other")], run)
        assert ran == []


def partition_key_of(event: Event) -> str:
    key = event.payload.get("partition_key") if isinstance(event.payload, dict) else None
    return key if isinstance(key, str) and key else f"event:{event.id}"


@pytest.mark.integration
async def test_on_the_real_broker_a_partition_coalesces_into_one_run_and_a_malformed_one_degrades_per_event() -> None:
    """The degrade path end to end: the tail is requeued first, the first runs, every event runs exactly once."""
    async with jetstream_queues("n1") as (q,):
        inbox, group = topics.agent_inbox("ada"), topics.agent_inbox_group("ada")
        await q.ensure_subscription(inbox, group)
        good = [wake(f"good {i}", at=i, key="slack:C1:good") for i in range(1, 4)]
        bad = [wake("bad 1", at=11, key="slack:C1:bad"), wake("bad 2", at=12, key="slack:C1:bad"), wake("bad 3", at=13, key="slack:C1:bad")]
        bad[1].payload["body"] = ["not", "a", "string"]
        bad[1].data = None
        for ev in good + bad:
            await q.publish(inbox, ev)

        runs: list[Event] = []
        partitions: list[int] = []

        async def run(ev: Event) -> None:
            runs.append(ev)

        async def handler(partition: Partition) -> None:
            partitions.append(len(partition.deliveries))
            await dispatch(q, "ada", partition.events, run)

        sub = await q.subscribe_batch(inbox, group, BatchOptions(partition_key=partition_key_of, max_batch=20), handler)
        try:
            await eventually(lambda: len(runs) == 4, what="one merged run plus three degraded ones")

            async def empty() -> bool:
                return await q.backlog(inbox, group) == 0

            await eventually(empty, what="ada's inbox drained")
        finally:
            await sub.detach()
        merged = [r for r in runs if r.payload.get("coalesced_count")]
        singles = [r for r in runs if not r.payload.get("coalesced_count")]
        assert len(merged) == 1 and merged[0].payload["coalesced_event_ids"] == [e.id for e in good]
        assert sorted(e.id for e in singles) == sorted(e.id for e in bad)
        assert [e.id for e in singles][0] == bad[0].id  # the first ran first; the tail came back after
        assert max(partitions) == 3
