"""A publish whose acknowledgement is lost: sent again under its own id, stored once, or named unconfirmed.

A small TCP relay sits between the client and a real embedded nats-server and
can swallow bytes in either direction or cut every connection through it, so
the moment between "the broker stored it" and "the client heard so" is
reproduced exactly rather than by killing a broker at a lucky instant.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import nats
import pytest

from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.errors import Unconfirmed
from crewlet.queue.jetstream import JetStreamTransport
from tests.queue.test_jetstream_backend import TIMINGS, event, stream_info
from waiting_support import eventually

pytestmark = pytest.mark.integration  # every test here runs a real nats-server

API_TIMEOUT_S = 1.0


class Relay:
    """Forwards TCP between clients and one upstream; each direction can be made to swallow what it reads."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.swallow_to_client = False
        self.swallow_to_server = False
        #: Bytes read from the client while swallowing toward the server.
        self.swallowed_to_server = 0
        self.connections = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self._upstream)
        self.connections += 1
        self._writers |= {client_w, server_w}
        await asyncio.gather(
            self._pump(client_r, server_w, to_server=True),
            self._pump(server_r, client_w, to_server=False),
            return_exceptions=True,
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_server: bool) -> None:
        try:
            while chunk := await reader.read(65536):
                if to_server and self.swallow_to_server:
                    self.swallowed_to_server += len(chunk)
                    continue
                if not to_server and self.swallow_to_client:
                    continue
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()

    def cut(self) -> None:
        """Close every connection through the relay; new ones are forwarded normally."""
        self.swallow_to_client = self.swallow_to_server = False
        for w in self._writers:
            w.close()
        self._writers.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@asynccontextmanager
async def relayed() -> AsyncIterator[tuple[Relay, JetStreamTransport, nats.NATS]]:
    """A broker, a relay in front of it, a transport dialled through the relay, and a direct raw connection."""
    async with EmbeddedBroker(store_dir=None) as broker:
        parts = urlsplit(broker.url)
        relay = Relay(parts.hostname or "127.0.0.1", int(parts.port or 4222))
        port = await relay.start()
        netloc = f"{parts.username}:{parts.password}@127.0.0.1:{port}"
        via_relay = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
        transport = await JetStreamTransport.connect(
            via_relay, memory_storage=True, timings=TIMINGS, api_timeout_s=API_TIMEOUT_S, reconnect_wait_s=0.05
        )
        raw = await nats.connect(broker.url)
        try:
            yield relay, transport, raw
        finally:
            await raw.close()
            await transport.close()
            await relay.close()


async def stored(raw: nats.NATS, stream: str) -> int:
    return int((await stream_info(raw, stream))["state"]["messages"])


TOPIC = topics.agent_inbox("ada")
GROUP = "agent-ada"


async def inbox_ready(transport: JetStreamTransport, raw: nats.NATS) -> tuple[str, int]:
    """Ada's inbox with its durable made: the stream that stores it, and how many messages it holds now."""
    await transport.ensure_consumer(TOPIC, GROUP)
    stream = transport._stream_of(TOPIC).name
    return stream, await stored(raw, stream)


async def test_a_publish_stored_whose_answer_is_lost_with_its_connection_returns_once_reconnected_and_is_stored_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with relayed() as (relay, transport, raw):
        stream, before = await inbox_ready(transport, raw)
        relay.swallow_to_client = True
        publishing = asyncio.create_task(transport.publish(TOPIC, event(n=1)))

        async def the_broker_stored_it() -> bool:
            return await stored(raw, stream) == before + 1

        await eventually(the_broker_stored_it)
        assert not publishing.done()
        relay.cut()
        with caplog.at_level(logging.INFO, logger="crewlet.queue.jetstream.streams"):
            seq = await publishing
        assert seq > 0
        assert await stored(raw, stream) == before + 1
        assert await transport.backlog(TOPIC, GROUP) == 1
        assert any(r.getMessage() == "jetstream_publish_resent" for r in caplog.records)


async def test_a_publish_that_never_reached_the_broker_before_its_connection_dropped_is_stored_by_the_resend() -> None:
    async with relayed() as (relay, transport, raw):
        stream, before = await inbox_ready(transport, raw)
        relay.swallow_to_server = True
        publishing = asyncio.create_task(transport.publish(TOPIC, event(n=1)))

        async def the_publish_left_the_client() -> bool:
            return relay.swallowed_to_server > 0

        await eventually(the_publish_left_the_client)
        assert await stored(raw, stream) == before
        relay.cut()
        assert await publishing > 0
        assert await stored(raw, stream) == before + 1
        assert await transport.backlog(TOPIC, GROUP) == 1


async def test_a_broker_that_stays_connected_and_silent_gets_one_send_and_the_caller_hears_unconfirmed() -> None:
    async with relayed() as (relay, transport, raw):
        stream, before = await inbox_ready(transport, raw)
        relay.swallow_to_client = True
        connections = relay.connections
        with pytest.raises(Unconfirmed):
            await transport.publish(TOPIC, event(n=1))
        assert relay.connections == connections
        assert await stored(raw, stream) == before + 1


async def test_two_publishes_of_the_same_bytes_are_two_events_since_each_send_has_its_own_id() -> None:
    async with relayed() as (_, transport, raw):
        stream, before = await inbox_ready(transport, raw)
        data = event(n=1)
        first, second = await transport.publish(TOPIC, data), await transport.publish(TOPIC, data)
        assert second == first + 1
        assert await stored(raw, stream) == before + 2


async def test_the_client_names_an_unconfirmed_event_by_its_id_in_the_log_and_runs_no_publish_listener(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from crewlet.events import Event
    from crewlet.queue.client import QueueClient

    async with relayed() as (relay, transport, _):
        client = QueueClient(transport, node="n1", timings=transport.timings)
        heard: list[str] = []

        async def listener(topic: str, ev: Event) -> None:
            heard.append(ev.id)

        client.add_publish_listener(listener)
        await transport.ensure_consumer(TOPIC, GROUP)
        relay.swallow_to_client = True
        ev = Event(type="test_event", payload={"n": 1})
        with caplog.at_level(logging.WARNING, logger="crewlet.queue.client"), pytest.raises(Unconfirmed):
            await client.publish(TOPIC, ev)
        unconfirmed = [r for r in caplog.records if r.getMessage() == "queue_publish_unconfirmed"]
        assert [getattr(r, "event_id", None) for r in unconfirmed] == [ev.id]
        assert heard == []
