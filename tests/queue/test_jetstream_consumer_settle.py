"""A clustered member starting asks again about a consumer the cluster cannot answer about yet, as it does for streams.

The broker is real (an embedded nats-server); what is injected is the one
thing a single server never does on its own: a consumer ask that times out
while a cluster elects a stream leader or its meta layer is busy.
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import pytest

from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.errors import Unavailable
from crewlet.queue.jetstream import JetStreamTransport
from crewlet.queue.jetstream.wire import ERR_STREAM_NOT_FOUND, _ApiError

pytestmark = pytest.mark.integration  # every test here runs real nats-servers

TOPIC, GROUP = topics.agent_inbox("ada"), "agent-ada"


@pytest.fixture
async def broker() -> AsyncIterator[EmbeddedBroker]:
    async with EmbeddedBroker(store_dir=None) as b:
        yield b


@asynccontextmanager
async def member(broker: EmbeddedBroker, provision_wait_s: float) -> AsyncIterator[JetStreamTransport]:
    transport = await JetStreamTransport.connect(broker.url, memory_storage=True, provision_wait_s=provision_wait_s)
    try:
        yield transport
    finally:
        await transport.close()


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
    async with member(broker, provision_wait_s=10.0) as transport:
        asks = failing_first(transport, Unavailable("consumer info: TimeoutError()"), times=2)
        assert await transport.ensure_consumer(TOPIC, GROUP) is True
        assert asks[0] == 3


@pytest.mark.parametrize(
    "provision_wait_s, error",
    [
        (0.0, Unavailable("consumer info: TimeoutError()")),
        (10.0, _ApiError("consumer info", 400, ERR_STREAM_NOT_FOUND + 1, "refused")),
    ],
    ids=["a timeout with no settling window", "a refusal the broker answered"],
)
async def test_the_first_failure_stands_without_a_settling_window_or_when_the_broker_answered(
    broker: EmbeddedBroker, provision_wait_s: float, error: Exception
) -> None:
    async with member(broker, provision_wait_s) as transport:
        asks = failing_first(transport, error)
        with pytest.raises(type(error)):
            await transport.ensure_consumer(TOPIC, GROUP)
        assert asks[0] == 1
