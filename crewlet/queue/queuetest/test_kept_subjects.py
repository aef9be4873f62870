"""A stream that keeps one message per subject: replayed in one pass, purged by pattern (CREWLET_MEMORY)."""
from __future__ import annotations

import pytest

from crewlet.queue import topics
from crewlet.queue.errors import InvalidArgument
from crewlet.queue.queuetest.harness import ev, uniq


async def test_a_replay_reads_the_last_message_of_each_subject_and_a_purge_takes_only_its_pattern(harness, queue):
    seat, other = uniq("ada"), uniq("bob")
    first, second = topics.memory(seat, "facts", "k1"), topics.memory(seat, "facts", "k2")
    await queue.publish(first, ev(1))
    await queue.publish(second, ev(2))
    await queue.publish(first, ev(3))  # replaces the first value of k1
    await queue.publish(topics.memory(other, "facts", "k1"), ev(9))

    replayed = await queue.read_last(topics.memory_pattern(seat))
    assert [(subject, event.payload["i"]) for subject, event in replayed] == [(second, 2), (first, 3)]

    assert await queue.purge(topics.memory_pattern(seat)) == 2
    assert await queue.read_last(topics.memory_pattern(seat)) == []
    assert [e.payload["i"] for _, e in await queue.read_last(topics.memory_pattern(other))] == [9]


async def test_a_replay_of_a_stream_that_keeps_every_message_is_refused(harness, queue):
    with pytest.raises(InvalidArgument, match="one message per subject"):
        await queue.read_last("crewlet.events.>")
