"""crewlet.base.aio.keeping_cancel: a cancel that Python 3.11's wait_for swallows is still delivered."""
from __future__ import annotations

import asyncio
import sys
from typing import Any, Awaitable, Callable

import pytest

from crewlet.base.aio import keeping_cancel


async def cancelled_as_the_result_lands(wrap: Callable[[Awaitable[Any]], Awaitable[Any]]) -> asyncio.Task[Any]:
    """A task in wait_for whose inner future completes in the very iteration the task is cancelled."""
    inner: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(wrap(asyncio.wait_for(inner, 10)))
    await asyncio.sleep(0)  # the task now waits inside wait_for
    inner.set_result(1)
    task.cancel()
    await asyncio.wait([task])
    return task


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 fixed wait_for (gh-86296)")
async def test_plain_wait_for_on_python_3_11_swallows_that_cancel() -> None:
    async def plain(awaitable: Awaitable[Any]) -> Any:
        return await awaitable

    task = await cancelled_as_the_result_lands(plain)
    assert not task.cancelled() and task.result() == 1  # the bug keeping_cancel exists for


async def test_keeping_cancel_delivers_the_cancel_wait_for_swallowed() -> None:
    task = await cancelled_as_the_result_lands(keeping_cancel)
    assert task.cancelled()


async def test_keeping_cancel_returns_the_result_when_nobody_cancelled() -> None:
    assert await keeping_cancel(asyncio.wait_for(asyncio.sleep(0, result="done"), 1)) == "done"


async def test_a_cancel_caught_before_the_await_is_not_delivered_again() -> None:
    async def already_handled() -> str:
        me = asyncio.current_task()
        assert me is not None
        me.cancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass  # handled (and not uncancelled) before the guarded await begins
        return await keeping_cancel(asyncio.sleep(0, result="went on"))

    assert await asyncio.create_task(already_handled()) == "went on"
