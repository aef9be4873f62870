"""Waiting for a condition, the one way the tests do it: poll it until it holds, fail naming it at a deadline.

A test that waits for something another task, thread or process brings about
asks :func:`eventually` (on an event loop) or :func:`wait_until` (on a plain
thread, for a process under test) rather than sleeping a guessed time: the
wait ends as soon as the condition holds, and a condition that never holds
fails with what was awaited and the last value seen.

It lives in the conformance package because that package must import without
the repository's ``tests/`` directory; the project's tests reach it through
``tests/waiting_support.py``.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: How often a condition is asked again.
ASYNC_INTERVAL_S = 0.01
THREAD_INTERVAL_S = 0.05


def _failure(what: str, timeout_s: float, last: Any) -> AssertionError:
    return AssertionError(f"{what or 'condition'} not met within {timeout_s:g} s; last value {last!r}")


async def eventually(
    cond: Callable[[], Any],
    timeout_s: float = 10.0,
    what: str = "",
    interval_s: float = ASYNC_INTERVAL_S,
) -> Any:
    """Ask ``cond`` (sync, or returning an awaitable) until its answer is truthy; that answer.

    Measured on the running loop's clock, so a loop under load gets the time
    it was given. Typed ``Any``: a condition may be a plain function or an
    async one, and no signature states "the awaited value of either" in a
    way the type checker can infer at each call.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = cond()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise _failure(what, timeout_s, result)
        await asyncio.sleep(interval_s)


def wait_until(
    cond: Callable[[], T],
    timeout_s: float = 10.0,
    what: str = "",
    interval_s: float = THREAD_INTERVAL_S,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    """Ask ``cond`` on this thread until its answer is truthy; that answer (a process under test brings it about).

    An exception of a type in ``ignoring`` counts as "not yet" (a process
    restarting refuses connections for a while) and is the last value seen.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result: Any
        try:
            result = cond()
        except ignoring as exc:
            result = exc
        else:
            if result:
                return result
        if time.monotonic() > deadline:
            raise _failure(what, timeout_s, result)
        time.sleep(interval_s)


__all__ = ["eventually", "wait_until"]
