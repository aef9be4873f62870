from __future__ import annotations

import pytest

from crewlet.queue.errors import NotLive
from crewlet.queue.queuetest.harness import attached, ev


async def test_a_published_event_reaches_its_subscriber(harness, queue):
    topic, group, col, _ = await attached(harness, queue)
    await queue.publish(topic, ev(1))
    items = await col.wait_for(1)
    assert items[0].event.payload == {"i": 1}
    assert items[0].topic == topic
    await col.quiet()


async def test_a_round_trip_returns_while_the_broker_answers_and_a_closed_queue_is_not_live(harness, queue):
    await queue.round_trip(harness.wait_s)
    await queue.close()
    with pytest.raises(NotLive):
        await queue.round_trip(harness.wait_s)
