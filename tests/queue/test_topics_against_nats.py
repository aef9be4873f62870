"""The one subject matcher, checked against what a real nats-server delivers."""
from __future__ import annotations

import nats  # a backend-specific fact: the real server is the oracle here
import pytest

from crewlet.queue import topics
from crewlet.queue.broker import EmbeddedBroker
from waiting_support import eventually

pytestmark = pytest.mark.integration  # the matcher is checked against a real nats-server

PATTERNS = ["a.>", "a.*", "a.*.c", "*.b.*", ">", "a.b", "*", "a.*.>", "*.*.c"]
SUBJECTS = ["a", "a.b", "a.b.c", "a.x.c", "b.b.b", "a.b.c.d", "x.y.c", "a_b", "a.bc"]


async def test_the_matcher_agrees_with_nats_server_on_every_pattern_and_subject():
    async with EmbeddedBroker(store_dir=None) as broker:
        nc = await nats.connect(broker.url)
        try:
            received: dict[str, set[str]] = {p: set() for p in PATTERNS}
            for pattern in PATTERNS:

                async def cb(msg, pattern=pattern):
                    received[pattern].add(msg.subject)

                await nc.subscribe(pattern, cb=cb)
            await nc.flush()
            for subject in SUBJECTS:
                await nc.publish(subject, b"x")
            await nc.flush()
            expected = {p: {s for s in SUBJECTS if topics.matches(p, s)} for p in PATTERNS}
            await eventually(lambda: received == expected, 5, "every subscription's subjects")
            assert received == expected
        finally:
            await nc.close()
