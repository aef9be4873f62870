"""Stream snapshots and restores over JetStream's own API, between two real embedded nats-servers.

A stream with a durable consumer that has taken one of its messages is
snapshotted through the transport, restored into a second broker by
``restore_streams``: the messages and the consumer's delivery state arrive
with it, and a second restore of the same stream is refused, never merged.
"""
from __future__ import annotations

from pathlib import Path

import nats
import pytest

from crewlet.queue.broker import EmbeddedBroker
from crewlet.queue.errors import InvalidArgument
from crewlet.queue.jetstream import JetStreamTransport
from crewlet.queue.jetstream.snapshots import CHUNK_BYTES, restore_streams

pytestmark = pytest.mark.integration  # real nats-servers


async def test_a_snapshot_restored_into_an_empty_broker_brings_the_messages_and_the_consumers_state_and_a_second_restore_is_refused(
    tmp_path: Path,
) -> None:
    first, second = EmbeddedBroker(tmp_path / "a", supervise=False), EmbeddedBroker(tmp_path / "b", supervise=False)
    await first.start()
    await second.start()
    try:
        nc = await nats.connect(first.url)
        js = nc.jetstream()
        await js.add_stream(name="SNAP", subjects=["snap.>"])
        bodies = [bytes([i]) * (CHUNK_BYTES + 7) for i in range(4)]  # more than one chunk each way
        for body in bodies:
            await js.publish("snap.x", body)
        sub = await js.pull_subscribe("snap.>", durable="reader")
        [taken] = await sub.fetch(1)
        await taken.ack()
        await nc.close()

        transport = await JetStreamTransport.connect(first.url)
        try:
            names = await transport.stream_names()
            meta = await transport.snapshot_stream("SNAP", tmp_path / "SNAP.snapshot")
        finally:
            await transport.close()
        assert "SNAP" in names and meta["state"]["messages"] == 4

        assert await restore_streams(second.url, [("SNAP", meta, tmp_path / "SNAP.snapshot")]) == 1
        nc = await nats.connect(second.url)
        js = nc.jetstream()
        assert (await js.stream_info("SNAP")).state.messages == 4
        consumer = await js.consumer_info("SNAP", "reader")
        assert consumer.num_pending == 3 and consumer.delivered.stream_seq == 1
        got = await (await js.pull_subscribe("snap.>", durable="reader")).fetch(1)
        assert got[0].data == bodies[1]
        await nc.close()

        with pytest.raises(InvalidArgument, match="already has this stream"):
            await restore_streams(second.url, [("SNAP", meta, tmp_path / "SNAP.snapshot")])
    finally:
        await first.stop()
        await second.stop()
