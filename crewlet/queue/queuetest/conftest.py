"""The ``harness`` and ``queue`` fixtures, parametrised over every backend."""
from __future__ import annotations

import pytest

from crewlet.queue.queuetest.harness import HARNESSES, Harness


@pytest.fixture(params=sorted(HARNESSES))
async def harness(request: pytest.FixtureRequest):
    h: Harness = HARNESSES[request.param]()
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


@pytest.fixture
async def queue(harness: Harness):
    return await harness.client("n1")

