"""A clustered member starting asks again about a consumer the cluster cannot answer about yet, as it does for streams.

The broker is real (an embedded nats-server); what is injected is the one
thing a single server never does on its own: a consumer ask that times out
while a cluster elects a stream leader or its meta layer is busy.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import pytest

from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.errors import Unavailable
from crewlet.queue.jetstream import JetStreamTransport
from crewlet.queue.jetstream.wire import ERR_STREAM_NOT_FOUND, _ApiError

TOPIC, GROUP = topics.agent_inbox("ada"), "agent-ada"


@pytest.fixture
async def broker() -> AsyncIterator[EmbeddedBroker]:
    async with EmbeddedBroker(store_dir=None) as b:
        yield b


async def connect(broker: EmbeddedBroker, provision_wait_s: float) -> JetStreamTransport:
    return await JetStreamTransport.connect(broker.url, memory_storage=True, provision_wait_s=provision_wait_s)


def failing_first(transport: JetStreamTransport, error: Exception, times: int = 1) -> list[int]:
    """Make the transport's first ``times`` consumer asks fail with ``error``; returns the ask count."""
    asks = [0]
    real = transport._consumer_info

    async def consumer_info(stream: str, consumer: str) -> dict[str, Any]:
        asks[0] += 1
        if asks[0] <= times:
            raise error
        return await real(stream, consumer)

    transport._consumer_info = consumer_info  # type: ignore[method-assign]
    return asks


async def test_a_starting_member_asks_again_about_a_consumer_the_cluster_did_not_answer_about_and_creates_it(
    broker: EmbeddedBroker,
) -> None:
    transport = await connect(broker, provision_wait_s=10.0)
    try:
        asks = failing_first(transport, Unavailable("consumer info: TimeoutError()"), times=2)
        assert await transport.ensure_consumer(TOPIC, GROUP) is True
        assert asks[0] == 3
    finally:
        await transport.close()


async def test_without_a_settling_window_the_first_timeout_stands(broker: EmbeddedBroker) -> None:
    transport = await connect(broker, provision_wait_s=0.0)
    try:
        asks = failing_first(transport, Unavailable("consumer info: TimeoutError()"))
        with pytest.raises(Unavailable, match="TimeoutError"):
            await transport.ensure_consumer(TOPIC, GROUP)
        assert asks[0] == 1
    finally:
        await transport.close()


async def test_a_refusal_the_broker_answered_is_not_asked_again(broker: EmbeddedBroker) -> None:
    transport = await connect(broker, provision_wait_s=10.0)
    try:
        refusal = _ApiError("consumer info", 400, ERR_STREAM_NOT_FOUND + 1, "refused")
        asks = failing_first(transport, refusal)
        with pytest.raises(_ApiError):
            await transport.ensure_consumer(TOPIC, GROUP)
        assert asks[0] == 1
    finally:
        await transport.close()
