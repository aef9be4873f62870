"""Retries inside a round: a transient provider failure is tried again on the same entry before the chain moves on.

A rate limit (429), an overloaded or failing server (5xx, Anthropic's 529), a
call past its deadline and a connection that could not be made or was dropped
are usually over within seconds, so a round retries the same provider entry
rather than handing the turn to the next one — and, with one provider, rather
than failing the turn. The bound is the entry's ``retry`` (:mod:`crewlet.company.provider_retry`):
``attempts`` more calls, no single wait longer than ``max_wait_s`` nor than the
entry's own whole-call deadline ``timeout_s`` (a provider is never waited for
longer than it is given to answer). Each wait honours the provider's
``Retry-After`` when it sent one — exactly that long, or not at all when it
asks for more than the bound: the chain moves on at once — and is otherwise an
exponential backoff from :data:`BACKOFF_BASE_S` with equal jitter, so seats
that were refused together do not come back together.

What cannot succeed on a second try — a refused credential, a request the
provider rejects, an answer it could not give (a refusal is an answer, never
an error) or a provider that broke in this process — is not retried: the
chain moves on at once.

Each call is its own whole call, under its own deadline; a wait is never
spent inside one. Before every retry the round asks ``proceed`` — the seat is
still this node's and nobody asked the turn to stop — and once it says no the
last failure stands. Every retry is recorded in the round's entry
(``rounds[].retries``: ``{attempt, kind, wait_s, retry_after_s?}``) and logged
as ``provider_retry``; ``/metrics`` counts them off the phase's record.

``scale`` multiplies every wait (``delivery.provider_retry_scale``, 1 in
production) and ``sleep`` is the clock's, so a test shrinks a ``Retry-After: 1``
to milliseconds through the same code — the recorded ``wait_s`` is the wait
taken, ``retry_after_s`` what the provider asked for.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, TypeVar

from crewlet.company.provider_retry import RetryPolicy
from seats.provider_base import ERR_RATE_LIMITED, ERR_SERVER, ERR_TIMEOUT, ERR_UNREACHABLE, ProviderError

log = logging.getLogger("crewlet.seats.turns")

T = TypeVar("T")

#: The provider kinds a retry can cure: the rest move the chain on at once.
RETRYABLE_KINDS = frozenset({ERR_RATE_LIMITED, ERR_SERVER, ERR_TIMEOUT, ERR_UNREACHABLE})
#: The first backoff wait when the provider named none; doubles per retry, up to the bound.
BACKOFF_BASE_S = 1.0
#: Equal jitter: a backoff wait is drawn between (1 - JITTER) and 1 of its doubling.
JITTER = 0.5
#: How precisely a recorded wait is kept (milliseconds).
WAIT_DIGITS = 3

Sleep = Callable[[float], Awaitable[None]]


@dataclass
class Retrier:
    """How a round waits between calls of one provider entry: the scale, the clock's sleep and the jitter's draw."""

    scale: float = 1.0
    sleep: Sleep = asyncio.sleep
    rng: Callable[[], float] = field(default=random.random)

    def wait_s(self, failed: ProviderError, attempt: int, policy: RetryPolicy, deadline_s: float) -> Optional[float]:
        """The wait (unscaled) before the next call after call number ``attempt`` failed; None when it is not retried."""
        if failed.kind not in RETRYABLE_KINDS or attempt > policy.attempts:
            return None
        ceiling = min(policy.max_wait_s, deadline_s)
        if failed.retry_after_s is not None:
            return failed.retry_after_s if failed.retry_after_s <= ceiling else None
        doubled = min(BACKOFF_BASE_S * 2 ** (attempt - 1), ceiling)
        return doubled * (1.0 - JITTER * self.rng())

    async def call(
        self,
        attempt: Callable[[], Awaitable[T]],
        policy: RetryPolicy,
        *,
        deadline_s: float,
        proceed: Callable[[], bool],
        retries: list[dict[str, Any]],
        where: dict[str, str],
    ) -> T:
        """``attempt()``, retried while its failures are transient and the bound allows; each retry appended to ``retries``.

        Raises the last :class:`ProviderError` once the entry is given up on;
        anything else ``attempt`` raises is not a provider's answer and is not
        retried.
        """
        number = 1
        while True:
            try:
                return await attempt()
            except ProviderError as exc:
                wait = self.wait_s(exc, number, policy, deadline_s)
                if wait is None:
                    if exc.kind in RETRYABLE_KINDS and number <= policy.attempts:
                        log.info(
                            "provider_retry_declined",
                            extra={
                                **where, "kind": exc.kind, "retry_after_s": exc.retry_after_s, "max_wait_s": policy.max_wait_s,
                            },
                        )
                    raise
                if not proceed():
                    raise
                taken = wait * self.scale
                record: dict[str, Any] = {"attempt": number, "kind": exc.kind, "wait_s": round(taken, WAIT_DIGITS)}
                if exc.retry_after_s is not None:
                    record["retry_after_s"] = exc.retry_after_s
                retries.append(record)
                log.info("provider_retry", extra={**where, **record})
                await self.sleep(taken)
                if not proceed():
                    raise
                number += 1


__all__ = ["BACKOFF_BASE_S", "JITTER", "RETRYABLE_KINDS", "Retrier", "Sleep"]
