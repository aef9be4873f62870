"""How many mailboxes a stream lets exist: the engine's own bound (``stream.max_consumers``), not the broker's default.

nats-server holds a stream created without a limit of its own to
``jetstream.limits.default_max_consumers`` (1,000), which refused the mailbox of
a company's 500th agent seat; every engine stream now states its limit.
"""
from __future__ import annotations

import pytest

from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.jetstream.configs import stream_config
from crewlet.queue.errors import ConsumerLimit
from crewlet.queue.jetstream import JetStreamQueue

pytestmark = pytest.mark.integration  # a real nats-server

def inbox(i: int) -> tuple[str, str]:
    return topics.agent_inbox(f"s{i}"), topics.agent_inbox_group(f"s{i}")


async def test_a_mailbox_past_stream_max_consumers_is_refused_naming_the_setting_and_a_raised_setting_aligns_the_stream() -> None:
    async with EmbeddedBroker(store_dir=None) as broker:
        small = await JetStreamQueue.connect(broker.url, max_consumers=2)
        try:
            assert await small.ensure_subscription(*inbox(1)) and await small.ensure_subscription(*inbox(2))
            with pytest.raises(ConsumerLimit, match=r"stream\.max_consumers=2: the broker refused consumer .* on CREWLET_AGENT"):
                await small.ensure_subscription(*inbox(3))
            assert len(await small.list_subscriptions("crewlet.agent.*.inbox")) == 2  # nothing half-made
        finally:
            await small.close()
        raised = await JetStreamQueue.connect(broker.url, max_consumers=3)  # the existing stream takes the new bound
        try:
            assert await raised.ensure_subscription(*inbox(3))
        finally:
            await raised.close()


def test_every_engine_stream_states_its_consumer_limit_rather_than_taking_the_brokers_default() -> None:
    for spec in topics.ENGINE_STREAMS:
        assert stream_config(spec, event_retention_hours=1.0, memory_storage=True)["max_consumers"] == topics.DEFAULT_MAX_CONSUMERS
        assert stream_config(spec, event_retention_hours=1.0, memory_storage=True, max_consumers=7)["max_consumers"] == 7
