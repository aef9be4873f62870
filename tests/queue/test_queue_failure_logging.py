"""A handler that fails on every delivery logs one short line each time and its traceback once.

A poison message is delivered 25 times before it is dead-lettered; a traceback
on each of those (a deep recursion's is a hundred kilobytes) floods the log
with the same story. The queue client logs ``queue_handler_failed`` with the
error's type and clipped message on every failed delivery, and attaches the
traceback only while every message in the call is on its first delivery.
"""
from __future__ import annotations

import logging

import pytest

from crewlet import events
from crewlet.events import Trace
from crewlet.events.types import SeatPaused
from crewlet.base.logfmt import REASON_CHARS
from crewlet.queue.contract import MAX_DELIVERIES, Delivery, Timings
from crewlet.queue.memory import MemoryBroker
from crewlet.queue.queuetest.waiting import eventually

TOPIC = "crewlet.agent.ada.inbox"
GROUP = "agent-ada"


async def test_a_handler_failing_every_delivery_logs_a_short_line_each_time_and_its_traceback_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = MemoryBroker(Timings(backoff_base_s=0.0, backoff_cap_s=0.0))
    queue = broker.client("n1")
    seen: list[int] = []

    async def fail(delivery: Delivery) -> None:
        seen.append(delivery.remaining)
        raise RecursionError("maximum recursion depth exceeded " + "x" * 5000)

    caplog.set_level(logging.DEBUG, logger="crewlet.queue")
    try:
        await queue.ensure_subscription(TOPIC, GROUP)
        await queue.subscribe(TOPIC, GROUP, fail)
        await queue.publish(TOPIC, events.new(SeatPaused(seat="ada"), Trace.root()))
        await eventually(lambda: seen[-1:] == [0], timeout_s=10, what="the last delivery")
    finally:
        await queue.close()

    assert seen == list(range(MAX_DELIVERIES - 1, -1, -1)), "the whole budget was spent"
    failures = [r for r in caplog.records if r.getMessage() == "queue_handler_failed"]
    assert len(failures) == MAX_DELIVERIES, "one line for every failed delivery"
    with_traceback = [r for r in failures if r.exc_info]
    assert with_traceback == failures[:1], "only the first delivery's line carries the traceback"
    for record in failures:
        error = getattr(record, "error")
        assert error.startswith("RecursionError: maximum recursion depth exceeded")
        assert len(error) <= REASON_CHARS, "the message is clipped"
