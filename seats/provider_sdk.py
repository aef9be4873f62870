"""What the vendors' SDK clients share: the SDK loaded on first use, its errors translated, a whole-call deadline, the key.

The SDKs retry nothing here (``max_retries=0``): the round retries a
transient failure itself (:mod:`seats.retry`), so each retry is recorded, is
bounded by the company's ``retry`` and never runs inside a call's deadline.
Every SDK exception is translated at this boundary into
:class:`~seats.provider_base.ProviderError`, filed under the kind
``provider_fallback`` reports, with the provider's ``Retry-After`` (seconds
or an HTTP date) when it sent one. Keys are read from the named environment
variable at call time, so rotating one needs no restart, and a key never
appears in an error or a log line.
"""
from __future__ import annotations

import asyncio
import email.utils
import importlib
import math
import os
import sys
import time
from types import ModuleType
from typing import Any, Awaitable, Optional, TypeVar

from seats.provider_base import (
    ERR_AUTH,
    ERR_BAD_REQUEST,
    ERR_BAD_RESPONSE,
    ERR_RATE_LIMITED,
    ERR_SERVER,
    ERR_TIMEOUT,
    ERR_UNREACHABLE,
    KEYLESS,
    Completion,
    ModelRequest,
    ProviderError,
    error_text,
)

T = TypeVar("T")


def _status_kind(status: int) -> str:
    if status == 429:
        return ERR_RATE_LIMITED
    if status in (401, 403):
        return ERR_AUTH
    if status >= 500:
        return ERR_SERVER
    return ERR_BAD_REQUEST


#: The vendors' SDKs, imported when a provider of theirs first answers (see :func:`load_sdk`).
SDKS = ("openai", "anthropic")


async def load_sdk(name: str) -> ModuleType:
    """The SDK ``name``, imported on first use in a worker thread.

    Each SDK takes seconds to import (their generated type modules), which
    every process would pay at start — ``manage.py`` commands included —
    though most companies use one vendor or none. The import runs off the
    engine's loop so the first model call does not stall every other seat.
    A module in ``sys.modules`` may still be executing in another thread
    (concurrent first turns): only a finished one is taken as it is;
    otherwise the import is asked for too, which waits for the import in
    flight (the interpreter's lock per module) instead of handing out a
    half-built module.
    """
    module = sys.modules.get(name)
    if module is None or not _imported(module):
        module = await asyncio.to_thread(importlib.import_module, name)
    return module


def _imported(module: ModuleType) -> bool:
    """Whether ``module`` finished executing (the import system marks a spec while its module runs)."""
    return not getattr(getattr(module, "__spec__", None), "_initializing", False)


def _loaded_errors(attribute: str) -> tuple[type[BaseException], ...]:
    """The SDK error class ``attribute`` of each SDK imported so far (one never imported, or still importing, raised nothing)."""
    loaded = (sys.modules.get(name) for name in SDKS)
    return tuple(getattr(m, attribute) for m in loaded if m is not None and _imported(m) and hasattr(m, attribute))


#: A provider's own word on when to come back: milliseconds (OpenAI's) first, then the standard header.
RETRY_AFTER_MS_HEADER = "retry-after-ms"
RETRY_AFTER_HEADER = "retry-after"
#: A whole-call deadline, when the company names none.
DEFAULT_TIMEOUT_S = 60.0


def _seconds(text: str, scale: float = 1.0) -> Optional[float]:
    """``text`` as a finite, non-negative number of seconds (``scale`` per unit), else None."""
    try:
        value = float(text) * scale
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def retry_after_s(headers: Any, now: Optional[float] = None) -> Optional[float]:
    """The wait a response's ``Retry-After`` asks for (delay seconds or an HTTP date), or None when it asks none.

    A date in the past is no wait at all; a value that is neither form is
    ignored (the backoff decides), never trusted as a number.
    """
    if headers is None:
        return None
    millis = headers.get(RETRY_AFTER_MS_HEADER)
    if millis is not None and _seconds(str(millis), 0.001) is not None:
        return _seconds(str(millis), 0.001)
    text = str(headers.get(RETRY_AFTER_HEADER) or "").strip()
    if not text:
        return None
    seconds = _seconds(text)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def translate(exc: Exception, where: str, *secrets: str) -> ProviderError:
    """An SDK's exception as the seats' :class:`ProviderError`, filed under its kind, its words made :func:`error_text`."""
    if isinstance(exc, ProviderError):
        return ProviderError(exc.kind, error_text(str(exc), *secrets), retry_after_s=exc.retry_after_s)
    if isinstance(exc, _loaded_errors("APITimeoutError")):
        return ProviderError(ERR_TIMEOUT, error_text(f"{where}: no answer before the timeout"))
    if isinstance(exc, _loaded_errors("APIConnectionError")):
        return ProviderError(ERR_UNREACHABLE, error_text(f"{where}: {exc}", *secrets))
    if isinstance(exc, _loaded_errors("APIStatusError")):
        status = getattr(exc, "status_code", 0)
        return ProviderError(
            _status_kind(status),
            error_text(f"HTTP {status} from {where}: {getattr(exc, 'message', exc)}", *secrets),
            retry_after_s=retry_after_s(getattr(getattr(exc, "response", None), "headers", None)),
        )
    return ProviderError(ERR_BAD_RESPONSE, error_text(f"{where}: {exc}", *secrets))


async def within(timeout_s: float, call: Awaitable[T], where: str) -> T:
    """``call`` with a whole-call deadline: the SDKs' own timeout is per read, so a server trickling its answer never hits it."""
    try:
        async with asyncio.timeout(timeout_s):
            return await call
    except TimeoutError:
        raise ProviderError(ERR_TIMEOUT, f"{where}: no whole answer within {timeout_s:g} s") from None


def _secret(api_key_env: str) -> str:
    """The key from its variable, read now; an unset variable is an ``auth`` failure (the chain moves on)."""
    if not api_key_env:
        return KEYLESS
    secret = os.environ.get(api_key_env, "")
    if not secret:
        raise ProviderError(ERR_AUTH, f"environment variable {api_key_env} is not set")
    return secret


class VendorProvider:
    """What both SDK providers hold: the model, where it is served, the key's variable, the limits, one client."""

    vendor = ""
    default_max_tokens: Optional[int] = None

    def __init__(
        self,
        *,
        model: str,
        base_url: str = "",
        api_key_env: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_tokens: Optional[int] = None,
        key: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_tokens = max_tokens or self.default_max_tokens
        self.key = key or f"{self.vendor}:{model}"
        self._client: Any = None
        #: The API key the client was made with: redacted from every error it causes.
        self._key = ""

    def _open(self, api_key: str) -> Any:
        raise NotImplementedError

    async def complete(self, request: ModelRequest) -> Completion:
        raise NotImplementedError

    def _connect(self) -> Any:
        """The SDK client, made on first use with the key read then; no retries of its own."""
        if self._client is None:
            self._key = _secret(self.api_key_env)
            self._client = self._open(self._key)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


__all__ = ["DEFAULT_TIMEOUT_S", "SDKS", "VendorProvider", "load_sdk", "retry_after_s", "translate", "within"]
