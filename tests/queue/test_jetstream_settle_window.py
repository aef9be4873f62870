"""Which answers a clustered member starting asks again within its provisioning window, and which stand at once.

A 3-node fleet of 5,000 seats at R3 lost a node before it was ready: one
mailbox's consumer info was answered "JetStream system temporarily
unavailable" (code 503, err_code 10008) while the meta layer was busy with
every node's mailboxes, and the answer stood as a refusal. The asks here are
scripted with the broker's own answers; the window and its clock are the
transport's.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, cast

import pytest

from crewlet.queue.jetstream.transport import JetStreamTransport
from crewlet.queue.jetstream.wire import ERR_JETSTREAM_UNAVAILABLE, ERR_MAX_CONSUMERS, _ApiError


def busy() -> _ApiError:
    return _ApiError("consumer info", 503, ERR_JETSTREAM_UNAVAILABLE, "JetStream system temporarily unavailable")


def scripted(*answers: Any) -> tuple[Callable[[], Awaitable[Any]], list[int]]:
    """An ask giving ``answers`` in turn (an exception is raised), and the count of asks made."""
    left, asked = list(answers), [0]

    async def ask() -> Any:
        asked[0] += 1
        answer = left.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return ask, asked


async def settled(part: JetStreamTransport, ask: Callable[[], Awaitable[Any]]) -> Any:
    return await part._asked_until_settled(ask, "jetstream_consumer_waiting", {}, since=0.0, answered_refusals_stand=True)


async def test_temporarily_unavailable_is_asked_again_inside_the_window_and_other_refusals_and_a_closed_window_stand() -> None:
    part = JetStreamTransport(cast(Any, None), provision_wait_s=60)  # never dialled: the asks are scripted
    part._settle_until = asyncio.get_running_loop().time() + 60

    ask, asked = scripted(busy(), busy(), "made")
    assert await settled(part, ask) == "made" and asked == [3]

    full = _ApiError("create consumer c", 400, ERR_MAX_CONSUMERS, "maximum consumers limit reached")
    ask, asked = scripted(full, "never asked")
    with pytest.raises(_ApiError, match="maximum consumers"):
        await settled(part, ask)
    assert asked == [1]

    part._settle_until = 0.0  # provisioning's window is over: the busy answer stands too
    ask, asked = scripted(busy(), "never asked")
    with pytest.raises(_ApiError, match="temporarily unavailable"):
        await settled(part, ask)
    assert asked == [1]
