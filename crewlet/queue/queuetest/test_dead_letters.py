"""Conformance: replaying a dead letter (conformance.md § Dead letters), on every backend.

Design: event-system.md § Delivery Semantics (the dead letter) and the
dashboard's operator action. A replay takes the entry off CREWLET_DLQ, then
publishes its bytes onto the topic it came from as fresh mail; of two
concurrent replays exactly one wins, and a ref that is not there is Gone.
"""
from __future__ import annotations

import asyncio

import pytest

from crewlet.queue.contract import MAX_DELIVERIES, DeadLetter, Outcome
from crewlet.queue.errors import Gone, InvalidArgument, NotLive, Unavailable
from crewlet.queue.queuetest.harness import Collector, ev, eventually, inbox, needs

FIRST = MAX_DELIVERIES - 1  # what a first delivery says is left


def seen(letters: list[DeadLetter]) -> list[tuple[str, str, str, int, bytes]]:
    return [(d.ref, d.topic, d.group, d.deliveries, d.data) for d in letters]


async def dead_letter(harness, queue, label: str = "poison"):
    """Spend a real message's whole delivery budget on a failing handler; return (topic, group, letter)."""
    topic, group = inbox(label)
    before = {d.ref for d in await queue.dead_letters()}
    failing = Collector(harness, lambda d: Outcome.NAK)
    sub = await queue.subscribe(topic, group, failing)
    await queue.publish(topic, ev(label))

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
