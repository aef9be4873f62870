"""Waiting for a condition in the project's tests: :func:`eventually` on an event loop, :func:`wait_until` on a thread.

The one implementation is the queue conformance package's (it must import
without ``tests/``); every test waits through these two names.
"""
from __future__ import annotations

from crewlet.queue.queuetest.waiting import eventually, wait_until

__all__ = ["eventually", "wait_until"]
