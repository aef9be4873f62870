"""Time in the project's tests: :func:`eventually` on an event loop, :func:`wait_until` on a thread, a :class:`ManualClock`.

The one implementation of waiting is the queue conformance package's (it must
import without ``tests/``); every test waits through these two names. A test
that checks a deadline, a TTL or a window injects a :class:`ManualClock` and
moves it instead of sleeping.
"""
from __future__ import annotations

from crewlet.queue.queuetest.waiting import eventually, wait_until


class ManualClock:
    """A monotonic clock the test moves by hand (``clock.now += ttl_s``); call it for the time."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


__all__ = ["ManualClock", "eventually", "wait_until"]
