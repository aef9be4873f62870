"""Conformance: replaying a dead letter (docs/design.md § Dead letters), on every backend.

Design: docs/design.md § Delivery semantics (the dead letter) and the
dashboard's operator action. A replay takes the entry off CREWLET_DLQ, then
publishes its bytes onto the topic it came from as fresh mail; of two
concurrent replays exactly one wins, and a ref that is not there is Gone.
"""
from __future__ import annotations

import asyncio

import pytest

from crewlet.events import Event, Trace
from crewlet.events.types import DEAD_LETTER_MAX_DELIVERIES, DEAD_LETTER_UNDECODABLE, MessageDeadLettered, MessageRetryScheduled
from crewlet.queue import topics
from crewlet.queue.contract import MAX_DEAD_LETTER_REF, MAX_DELIVERIES, DeadLetter, Outcome
from crewlet.queue.errors import Gone, InvalidArgument, NotLive, Unavailable
from crewlet.queue.queuetest.harness import FIRST, Collector, ev, eventually, inbox, needs


def seen(letters: list[DeadLetter]) -> list[tuple[str, str, str, int, bytes]]:
    return [(d.ref, d.topic, d.group, d.deliveries, d.data) for d in letters]


async def dead_letter(harness, queue, label: str = "poison", event=None):
    """Spend a real message's whole delivery budget on a failing handler; return (topic, group, letter)."""
    topic, group = inbox(label)
    before = {d.ref for d in await queue.dead_letters()}
    failing = Collector(harness, lambda d: Outcome.NAK)
    sub = await queue.subscribe(topic, group, failing)
    await queue.publish(topic, event if event is not None else ev(label))

    async def buried():
        return [d for d in await queue.dead_letters() if d.ref not in before and d.topic == topic]

    (letter,) = await eventually(buried, harness.wait_s, f"{label} to be dead-lettered")
    await sub.detach()

    async def empty():
        return await queue.backlog(topic, group) == 0

    await eventually(empty, harness.wait_s, f"{topic} to be empty after the dead letter")
    return topic, group, letter


async def test_a_replayed_dead_letter_reaches_its_topic_again_as_fresh_mail_with_the_same_event(harness, queue):
    topic, group, letter = await dead_letter(harness, queue)
    assert letter.deliveries == MAX_DELIVERIES
    replayed = await queue.replay_dead_letter(letter.ref)
    assert seen([replayed]) == seen([letter]), "the replay returns the entry as it was"
    col = Collector(harness)
    await queue.subscribe(topic, group, col)
    (got,) = await col.wait_for(1)
    assert got.event.id == letter.event.id and got.event.payload == letter.event.payload
    assert got.event.node == letter.event.node, "a replay relays the origin node"
    assert got.event.to_json() == letter.data, "the event goes out byte for byte as it was"
    assert got.remaining == FIRST, "a replay is fresh mail: its delivery count starts over"
    await col.quiet(1)
    assert await queue.dead_letters() == []


async def test_a_replayed_dead_letter_is_gone_from_the_list_and_a_second_replay_raises_gone(harness, queue):
    topic, group, letter = await dead_letter(harness, queue)
    await queue.replay_dead_letter(letter.ref)
    assert letter.ref not in {d.ref for d in await queue.dead_letters()}
    with pytest.raises(Gone):
        await queue.replay_dead_letter(letter.ref)

    async def one_copy():
        return await queue.backlog(topic, group) == 1

    await eventually(one_copy, harness.wait_s, "the one replayed copy in the mailbox")
    assert await queue.dead_letters() == [], "a refused replay writes nothing"


async def test_an_unknown_ref_raises_gone_and_changes_nothing(harness, queue):
    _, _, letter = await dead_letter(harness, queue)
    before = seen(await queue.dead_letters())
    for ref in ("999999", str(int(letter.ref) + 1000), "0", "-1", "not-a-ref", ""):
        with pytest.raises(Gone):
            await queue.replay_dead_letter(ref)
    assert seen(await queue.dead_letters()) == before


async def test_replaying_one_dead_letter_leaves_the_other_dead_letters_where_they_are(harness, queue):
    first_topic, first_group, first = await dead_letter(harness, queue, "first")
    _, _, second = await dead_letter(harness, queue, "second")
    _, _, third = await dead_letter(harness, queue, "third")
    await queue.replay_dead_letter(second.ref)
    assert seen(await queue.dead_letters()) == seen([first, third]), "the others keep their refs, oldest first"
    col = Collector(harness)
    await queue.subscribe(first_topic, first_group, col)
    await col.quiet(0)  # the first one's topic got nothing: only the replayed entry moved


async def test_of_two_concurrent_replays_of_one_dead_letter_exactly_one_wins(harness, queue):
    other = await harness.client("n2")
    topic, group, letter = await dead_letter(harness, queue)
    results = await asyncio.gather(
        queue.replay_dead_letter(letter.ref), other.replay_dead_letter(letter.ref), return_exceptions=True
    )
    assert sorted(type(r).__name__ for r in results) == ["DeadLetter", "Gone"], results
    col = Collector(harness)
    await queue.subscribe(topic, group, col)
    (got,) = await col.wait_for(1)
    assert got.event.id == letter.event.id
    await col.quiet(1)
    assert await queue.dead_letters() == []


async def test_a_dead_letter_whose_mailbox_was_deleted_is_refused_and_stays(harness, queue):
    topic, group, letter = await dead_letter(harness, queue)
    assert await queue.delete_subscription(topic, group) is True
    with pytest.raises(InvalidArgument) as refused:
        await queue.replay_dead_letter(letter.ref)
    assert not isinstance(refused.value, Gone)
    assert seen(await queue.dead_letters()) == seen([letter]), "a refused replay keeps the entry"


async def test_a_replay_reaches_every_group_of_the_original_topic(harness, queue):
    topic, group, letter = await dead_letter(harness, queue)
    await queue.ensure_subscription(topic, "bystander")
    await queue.replay_dead_letter(letter.ref)
    col, other = Collector(harness), Collector(harness)
    await queue.subscribe(topic, group, col)
    await queue.subscribe(topic, "bystander", other)
    (mine,) = await col.wait_for(1)
    (theirs,) = await other.wait_for(1)
    assert mine.event.id == theirs.event.id == letter.event.id, "a replay is a publish onto the topic"


async def test_a_replay_that_cannot_reach_the_broker_says_unavailable(harness, queue):
    needs(harness, "outage")
    await harness.go_away()
    try:
        with pytest.raises(Unavailable) as info:
            await queue.replay_dead_letter("1")
        assert not isinstance(info.value, (NotLive, Gone))
    finally:
        await harness.come_back()


async def test_a_replay_that_read_the_entry_before_another_replay_took_it_raises_gone(harness, queue):
    """The loser of a race, made deterministic: it has read the entry, the winner then replays it whole.

    The raced entry is the newest of two: JetStream words a second delete of
    a stream's last sequence differently from one of an inner sequence.
    """
    other = await harness.client("n2")
    await dead_letter(harness, queue, "older")
    topic, group, letter = await dead_letter(harness, queue)
    transport = queue.transport
    read = transport.dead_letter

    async def read_then_lose(ref: str) -> DeadLetter:
        entry = await read(ref)
        await other.replay_dead_letter(ref)  # the winner publishes and takes it meanwhile
        return entry

    transport.dead_letter = read_then_lose
    try:
        with pytest.raises(Gone):
            await queue.replay_dead_letter(letter.ref)
    finally:
        del transport.dead_letter
    col = Collector(harness)
    await queue.subscribe(topic, group, col)
    (got,) = await col.wait_for(1)
    assert got.event.id == letter.event.id, "the winner's replay arrived, once"
    await col.quiet(1)
    assert [d.ref for d in await queue.dead_letters()] != [letter.ref] and len(await queue.dead_letters()) == 1


async def test_a_ref_that_cannot_name_an_entry_is_gone_without_asking_the_broker_in_its_words(harness, queue):
    for ref in ("18446744073709551616", "99999999999999999999999", "+1", " 1", "1_0", "١"):
        with pytest.raises(Gone) as info:
            await queue.replay_dead_letter(ref)
        assert "nats" not in str(info.value).lower() and "json" not in str(info.value).lower()
    with pytest.raises(Gone):
        await queue.replay_dead_letter(str(MAX_DEAD_LETTER_REF))  # well-formed, and nothing is there


async def test_a_dead_letter_is_recorded_as_a_message_dead_lettered_event_in_the_buried_events_trace(harness, queue):
    recorded = Collector(harness)
    queue.add_publish_listener(recorded.stream_handler)
    traced = Trace.root()
    poison = Event(type="conformance_probe", payload={"i": "traced"}, trace_id=traced.trace_id, span_id=traced.span_id)
    topic, group, letter = await dead_letter(harness, queue, event=poison)
    burials = [(t, e) for t, e in recorded.items if e.type == MessageDeadLettered.event_type]
    assert len(burials) == 1, burials
    subject, event = burials[0]
    assert subject == topics.event(MessageDeadLettered.event_type)
    body = event.data
    assert isinstance(body, MessageDeadLettered)
    assert (body.topic, body.group, body.ref, body.deliveries) == (topic, group, letter.ref, MAX_DELIVERIES)
    assert (body.original_id, body.original_type, body.reason) == (poison.id, poison.type, DEAD_LETTER_MAX_DELIVERIES)
    assert event.trace_id == poison.trace_id and event.parent_span_id == poison.span_id
    assert event.node == "n1", "the node whose consume loop buried it"
    assert letter.data not in event.to_json(), "never the buried bytes"
    assert letter.reason == DEAD_LETTER_MAX_DELIVERIES and letter.buried_at_s > 0, "the entry keeps why and when"


async def test_an_undecodable_message_is_buried_at_once_and_recorded_with_a_trace_of_its_own(harness, queue):
    recorded = Collector(harness)
    queue.add_publish_listener(recorded.stream_handler)
    topic, group = inbox("garbage")
    await queue.ensure_subscription(topic, group)
    await queue.transport.publish(topic, b"\xffnot an event")
    sub = await queue.subscribe(topic, group, Collector(harness))

    async def recorded_burial():
        return [e for _, e in recorded.items if e.type == MessageDeadLettered.event_type]

    (event,) = await eventually(recorded_burial, harness.wait_s, "the undecodable message recorded")
    await sub.detach()
    assert (event.data.topic, event.data.reason, event.data.deliveries) == (topic, DEAD_LETTER_UNDECODABLE, 1)
    assert event.data.original_id == "" and event.trace_id and not event.parent_span_id
    (letter,) = [d for d in await queue.dead_letters() if d.topic == topic]
    assert event.data.ref == letter.ref
    assert letter.reason == DEAD_LETTER_UNDECODABLE and letter.buried_at_s > 0


async def test_each_failure_with_deliveries_left_is_recorded_as_a_retry_naming_the_delivery_it_spent(harness, queue):
    recorded = Collector(harness)
    queue.add_publish_listener(recorded.stream_handler)
    traced = Trace.root()
    poison = Event(type="conformance_probe", payload={"i": "retried"}, trace_id=traced.trace_id, span_id=traced.span_id)
    topic, group, letter = await dead_letter(harness, queue, label="retried", event=poison)
    retries = [e for t, e in recorded.items if e.type == MessageRetryScheduled.event_type]
    assert [e.data.delivery for e in retries] == list(range(1, MAX_DELIVERIES)), "every failure but the last, which is buried"
    assert all(t == topics.event(MessageRetryScheduled.event_type) for t, e in recorded.items if e in retries)
    first = retries[0].data
    assert (first.topic, first.group, first.seat, first.max_deliveries) == (topic, group, topic.split(".")[2], MAX_DELIVERIES)
    assert (first.original_id, first.original_type) == (poison.id, poison.type) and first.retry_at.endswith("Z")
    assert all(e.trace_id == poison.trace_id and e.parent_span_id == poison.span_id for e in retries)
    assert letter.data not in retries[0].to_json(), "never the failed bytes"
