"""Ask / serve: request-reply scatter, as fleet reads use it.

``ask`` scatters one request to every server of a subject and gathers up to
``want`` answers by its deadline. Missing answers are not errors: a deadline, an
answerer that raised, or nobody serving all just mean fewer answers.
"""
from __future__ import annotations

import asyncio
import logging

import pytest

from crewlet.queue.contract import MAX_PAYLOAD_BYTES
from crewlet.queue.errors import NoAnswer, TooLarge
from crewlet.queue.queuetest.harness import Collector, eventually, state, uniq

#: An ask deadline a case expects to run out.
SHORT_S = 0.3
#: An ask deadline a case expects never to reach.
LONG_S = 60.0


def fleet() -> str:
    return f"crewlet.fleet.{uniq('read')}"


class Answerer:
    """An answerer that echoes the request behind its own tag, recording what it saw.

    With ``gated`` it holds each request until ``gate`` is set.
    """

    def __init__(self, tag: bytes, *, gated: bool = False) -> None:
        self.tag = tag
        self.gated = gated
        self.gate = asyncio.Event()
        self.seen: list[bytes] = []

    async def __call__(self, request: bytes) -> bytes:
        self.seen.append(request)
        if self.gated:
            await self.gate.wait()
        return self.tag + b":" + request


def tagged(tag: bytes) -> Answerer:
    """An answerer that echoes the request behind its own tag, recording what it saw."""
    return Answerer(tag)


def blocked(tag: bytes) -> Answerer:
    """An answerer that holds each request until its gate opens."""
    return Answerer(tag, gated=True)


async def within(harness, coro):
    """The case's deadline, far inside the ask's own: an ask that waited it out fails here."""
    return await asyncio.wait_for(coro, harness.wait_s)


async def test_every_server_sees_every_request(harness, queue):
    subject = fleet()
    a, b = tagged(b"a"), tagged(b"b")
    servers = [await queue.serve(subject, a), await queue.serve(subject, b)]
    first = await within(harness, queue.ask(subject, b"q1", 2, LONG_S))
    second = await within(harness, queue.ask(subject, b"q2", 2, LONG_S))
    assert sorted(first) == [b"a:q1", b"b:q1"]
    assert sorted(second) == [b"a:q2", b"b:q2"]
    assert a.seen == [b"q1", b"q2"] and b.seen == [b"q1", b"q2"]
    for srv in servers:
        await srv.close()


async def test_reaching_want_answers_returns_at_once(harness, queue):
    subject = fleet()
    fast = [tagged(b"a"), tagged(b"b")]
    slow = blocked(b"slow")  # would hold an ask that waited for everyone
    servers = [await queue.serve(subject, fn) for fn in (*fast, slow)]
    got = await within(harness, queue.ask(subject, b"q", 2, LONG_S))
    assert sorted(got) == [b"a:q", b"b:q"]
    got = await within(harness, queue.ask(subject, b"r", 1, LONG_S))
    assert len(got) == 1 and got[0] in (b"a:r", b"b:r")
    slow.gate.set()
    for srv in servers:
        await srv.close()


async def test_a_deadline_returns_what_arrived_and_is_not_an_error(harness, queue):
    subject = fleet()
    fast, slow = tagged(b"fast"), blocked(b"slow")
    servers = [await queue.serve(subject, fast), await queue.serve(subject, slow)]
    got = await within(harness, queue.ask(subject, b"q", 2, SHORT_S))
    assert got == [b"fast:q"]
    assert slow.seen == [b"q"]
    slow.gate.set()
    for srv in servers:
        await srv.close()


async def test_an_answerer_that_overruns_does_not_hold_the_asker(harness, queue):
    subject = fleet()
    slow = blocked(b"slow")
    srv = await queue.serve(subject, slow)
    got = await within(harness, queue.ask(subject, b"q1", 1, SHORT_S))
    assert got == []
    # The overrun answer lands after its ask gave up; it must not leak into the next ask.
    slow.gate.set()
    got = await within(harness, queue.ask(subject, b"q2", 1, LONG_S))
    assert got == [b"slow:q2"]
    got = await within(harness, queue.ask(subject, b"q3", 2, SHORT_S))
    assert got == [b"slow:q3"]
    await srv.close()


async def test_an_answerers_error_is_a_missing_answer(harness, queue):
    subject = fleet()
    calls = []

    async def failing(request: bytes) -> bytes:
        calls.append(request)
        raise RuntimeError("this node's store is down")

    good = tagged(b"good")
    servers = [await queue.serve(subject, failing), await queue.serve(subject, good)]
    before = await state(queue)
    got = await within(harness, queue.ask(subject, b"q", 2, SHORT_S))
    assert got == [b"good:q"]
    # The failing server is still serving: it saw the next request too.
    got = await within(harness, queue.ask(subject, b"r", 2, SHORT_S))
    assert got == [b"good:r"]
    assert calls == [b"q", b"r"]
    assert await state(queue) == before
    for srv in servers:
        await srv.close()


async def test_an_answer_declined_with_no_answer_is_missing_and_logged_as_no_failure(harness, queue, caplog):
    subject = fleet()

    async def declining(request: bytes) -> bytes:
        raise NoAnswer("not asked")

    servers = [await queue.serve(subject, declining), await queue.serve(subject, tagged(b"good"))]
    with caplog.at_level(logging.DEBUG):
        got = await within(harness, queue.ask(subject, b"q", 2, SHORT_S))
    assert got == [b"good:q"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    for srv in servers:
        await srv.close()


async def test_nobody_serving_means_zero_answers(harness, queue):
    subject = fleet()
    before = await state(queue)
    got = await within(harness, queue.ask(subject, b"anyone?", 3, SHORT_S))
    assert got == []
    assert await state(queue) == before


async def test_nothing_is_retained_for_a_later_server(harness, queue):
    subject = fleet()
    before = await state(queue)
    assert await within(harness, queue.ask(subject, b"early", 1, SHORT_S)) == []
    late = Collector(harness)

    async def answer(request: bytes) -> bytes:
        await late(request)
        return b"late:" + request

    srv = await queue.serve(subject, answer)
    await late.quiet(expect=0)  # the early request is gone
    assert await within(harness, queue.ask(subject, b"now", 1, LONG_S)) == [b"late:now"]
    assert late.items == [b"now"]
    assert await state(queue) == before
    await srv.close()


async def test_a_closed_server_stops_answering(harness, queue):
    subject = fleet()
    closing, staying = tagged(b"closing"), tagged(b"staying")
    srv = await queue.serve(subject, closing)
    keeper = await queue.serve(subject, staying)
    before = await state(queue)
    assert sorted(await within(harness, queue.ask(subject, b"q1", 2, LONG_S))) == [b"closing:q1", b"staying:q1"]
    await srv.close()
    await srv.close()  # closing twice is fine
    assert await within(harness, queue.ask(subject, b"q2", 2, SHORT_S)) == [b"staying:q2"]
    await keeper.close()
    assert await within(harness, queue.ask(subject, b"q3", 1, SHORT_S)) == []
    assert closing.seen == [b"q1"] and staying.seen == [b"q1", b"q2"]
    assert await state(queue) == before


async def test_request_and_reply_bytes_survive_exactly(harness, queue):
    subject = fleet()
    request = b"\x00\xff\xfe\x80 not utf-8 \xc3\x28 \x00\r\n" + bytes(range(256))
    reply_tail = b"\xff\x00\xed\xa0\x80"  # NUL and an encoded surrogate: invalid UTF-8
    seen = []

    async def answer(data: bytes) -> bytes:
        seen.append(data)
        return data[::-1] + reply_tail

    srv = await queue.serve(subject, answer)
    got = await within(harness, queue.ask(subject, request, 1, LONG_S))
    assert seen == [request]
    assert got == [request[::-1] + reply_tail]
    empty = await within(harness, queue.ask(subject, b"", 1, LONG_S))
    assert empty == [reply_tail]
    await srv.close()


async def test_an_oversized_request_is_refused_as_too_large(harness, queue):
    subject = fleet()
    col = Collector(harness)

    async def answer(request: bytes) -> bytes:
        await col(len(request))
        return b"ok"

    srv = await queue.serve(subject, answer)
    before = await state(queue)
    with pytest.raises(TooLarge):
        await queue.ask(subject, b"x" * (MAX_PAYLOAD_BYTES + 1), 1, SHORT_S)
    await col.quiet(expect=0)  # it reached nobody
    assert await state(queue) == before
    assert await within(harness, queue.ask(subject, b"small", 1, LONG_S)) == [b"ok"]
    await srv.close()


async def test_one_slow_answer_does_not_hold_the_next_request(harness, queue):
    subject = fleet()
    gate = asyncio.Event()

    async def answer(request: bytes) -> bytes:
        if request == b"slow":
            await gate.wait()
        return b"re:" + request

    srv = await queue.serve(subject, answer)
    slow_ask = asyncio.ensure_future(queue.ask(subject, b"slow", 1, LONG_S))
    try:
        got = await within(harness, queue.ask(subject, b"fast", 1, LONG_S))
        assert got == [b"re:fast"]
        assert not slow_ask.done()
        gate.set()
        assert await within(harness, slow_ask) == [b"re:slow"]
    finally:
        gate.set()
        await asyncio.gather(slow_ask, return_exceptions=True)
    await srv.close()


async def test_closing_a_server_waits_for_answers_in_flight(harness, queue):
    subject = fleet()
    slow = blocked(b"slow")
    srv = await queue.serve(subject, slow)
    asking = asyncio.ensure_future(queue.ask(subject, b"q", 1, LONG_S))
    await eventually(lambda: slow.seen == [b"q"], harness.wait_s, "the server to take the request")
    closed = Collector(harness)

    async def close() -> None:
        await srv.close()
        await closed("closed")

    closing = asyncio.ensure_future(close())
    try:
        await closed.quiet(expect=0)  # close is waiting for the answer in flight
        slow.gate.set()
        await closed.wait_for(1)
        # The answer in flight was still delivered.
        assert await within(harness, asking) == [b"slow:q"]
    finally:
        slow.gate.set()
        await asyncio.gather(closing, asking, return_exceptions=True)
    assert await within(harness, queue.ask(subject, b"after", 1, SHORT_S)) == []


async def test_a_second_client_on_the_same_broker_is_reached(harness, queue):
    subject = fleet()
    other = await harness.client("n2")
    here, there = tagged(b"n1"), tagged(b"n2")
    servers = [await queue.serve(subject, here), await other.serve(subject, there)]
    assert sorted(await within(harness, queue.ask(subject, b"q", 2, LONG_S))) == [b"n1:q", b"n2:q"]
    assert sorted(await within(harness, other.ask(subject, b"r", 2, LONG_S))) == [b"n1:r", b"n2:r"]
    for srv in servers:
        await srv.close()
