"""A model provider's retry bound: ``retry: {attempts, max_wait_s}`` on a vendor entry of ``providers.llm``.

A rate limit, an overloaded provider, a timeout or a dropped connection is
usually over within seconds, so a round retries the same provider before its
fallback chain moves on (:mod:`seats.retry` does the retrying). How far it
goes is the entry's: ``attempts`` retries after the first call, each wait at
most ``max_wait_s`` (a ``Retry-After`` asking for longer is not waited for: the
chain moves on at once). The defaults here are the documented ones
(docs/company-file.md); the file's value is checked like every other key, with
a one-line refusal naming the field.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pydantic import Field

from crewlet.company.shape import FileModel, read_section

#: The entry's key, and the keys it takes.
RETRY_KEY = "retry"
RETRY_KEYS = ("attempts", "max_wait_s")
#: Retries after the first call of one round on one provider entry (0 = none: the chain moves on at once).
DEFAULT_RETRY_ATTEMPTS = 2
RETRY_ATTEMPTS_RANGE = (0, 10)
#: The longest single wait between two calls, a provider's ``Retry-After`` included.
DEFAULT_RETRY_MAX_WAIT_S = 30.0
RETRY_MAX_WAIT_RANGE_S = (0.1, 300.0)


@dataclass(frozen=True)
class RetryPolicy:
    """How one provider entry is retried within a round: ``attempts`` more calls, no wait longer than ``max_wait_s``."""

    attempts: int = DEFAULT_RETRY_ATTEMPTS
    max_wait_s: float = DEFAULT_RETRY_MAX_WAIT_S


class RetryFile(FileModel):
    """A provider entry's ``retry`` section's shape."""

    attempts: int = Field(default=DEFAULT_RETRY_ATTEMPTS, ge=RETRY_ATTEMPTS_RANGE[0], le=RETRY_ATTEMPTS_RANGE[1])
    max_wait_s: float = Field(default=DEFAULT_RETRY_MAX_WAIT_S, ge=RETRY_MAX_WAIT_RANGE_S[0], le=RETRY_MAX_WAIT_RANGE_S[1])


def parse_retry(value: Any, name: str, source: Optional[str]) -> dict[str, Any]:
    """``<entry>.retry`` checked: a mapping of ``attempts`` (whole, 0-10) and ``max_wait_s`` (0.1-300), defaults filled in."""
    return read_section(RetryFile, value, name, source).model_dump()


def retry_policy(options: Mapping[str, Any]) -> RetryPolicy:
    """The policy a provider entry's (already checked) options name; the defaults when they name none."""
    body = options.get(RETRY_KEY)
    if not isinstance(body, Mapping):
        return RetryPolicy()
    return RetryPolicy(
        attempts=int(body.get("attempts", DEFAULT_RETRY_ATTEMPTS)),
        max_wait_s=float(body.get("max_wait_s", DEFAULT_RETRY_MAX_WAIT_S)),
    )


__all__ = [
    "DEFAULT_RETRY_ATTEMPTS",
    "DEFAULT_RETRY_MAX_WAIT_S",
    "RETRY_ATTEMPTS_RANGE",
    "RETRY_KEY",
    "RETRY_KEYS",
    "RETRY_MAX_WAIT_RANGE_S",
    "RetryPolicy",
    "parse_retry",
    "retry_policy",
]
