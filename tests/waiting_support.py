"""Time in the project's tests: :func:`eventually` on an event loop, :func:`wait_until` on a thread, a :class:`ManualClock`.

The one implementation of waiting is the queue conformance package's (it must
import without ``tests/``); every test waits through these two names. A test
that checks a deadline, a TTL or a window injects a :class:`ManualClock` and
moves it instead of sleeping.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar

from crewlet.queue.queuetest.waiting import eventually, wait_until

T = TypeVar("T")


class ManualClock:
    """A monotonic clock the test moves by hand (``clock.now += ttl_s``); call it for the time."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def wait_for_answer(
    fetch: Callable[[], T], check: Callable[[T], Any], what: str, timeout_s: float = 90.0, interval_s: float = 0.1
) -> T:
    """Ask ``fetch()`` on this thread until ``check(answer)`` holds; that answer, even a falsy one (an empty list)."""

    def answered() -> Optional[tuple[T]]:
        answer = fetch()
        return (answer,) if check(answer) else None

    found = wait_until(answered, timeout_s, what, interval_s)
    assert found is not None
    return found[0]


__all__ = ["ManualClock", "eventually", "wait_for_answer", "wait_until"]
