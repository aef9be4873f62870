"""Coordination-store calls from the event loop."""
from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connections

log = logging.getLogger(__name__)
T = TypeVar("T")


def in_store(fn: Callable[..., T], *, alias: str = "default") -> Callable[..., Awaitable[T]]:
    """Run a store function off the event loop.

    A connection the database dropped (a restart, an idle timeout) is closed on
    the way out so the next call reconnects instead of failing forever: the
    engine is a long-running process with no request cycle to do it.
    """

    def guarded(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except (OperationalError, InterfaceError):
            try:
                connections[alias].close()
            except Exception:  # pragma: no cover - best effort
                log.debug("store_connection_close_failed", exc_info=True)
            raise

    functools.update_wrapper(guarded, fn)
    return sync_to_async(guarded, thread_sensitive=True)
