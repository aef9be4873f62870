"""Failed sign-ins are throttled per client address and per username: a password cannot be guessed at speed.

Both sign-in forms — the dashboard's ``/login/`` and the admin's
``/admin/login/`` — post to views that answer a failure by showing the form
again (200) and a success by redirecting (302). :class:`SignInThrottleMiddleware`
counts the failures of each client address and of each username over a fixed
window (``LOGIN_FAILURE_WINDOW_S``, from the first failure); once either has
``LOGIN_FAILURE_LIMIT`` failures, every sign-in from that address or for that
username — a right password included — is answered ``429`` with
``Retry-After`` until the window ends, without checking the password.

Counts live in Django's default cache: per process for the default local-memory
cache (``manage.py up`` is one process); a fleet that serves the web from several
processes configures a shared ``CACHES["default"]``.
"""
from __future__ import annotations

import hashlib
import logging
import math
import time
from typing import Any, Awaitable, Callable, Optional, Union

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

log = logging.getLogger("crewlet.throttle")

#: The URL names of the sign-in views.
SIGN_IN_VIEWS = ("dash-login", "admin:login")
DEFAULT_LIMIT = 5
DEFAULT_WINDOW_S = 60.0
KEY_PREFIX = "crewlet:signin"
TEMPLATE = "dashboard/login.html"


class SignInThrottle:
    """Failure counts per key over a fixed window, in a Django cache; ``clock`` is injectable."""

    def __init__(
        self, cache: Any, limit: int, window_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.cache = cache
        self.limit = limit
        self.window_s = window_s
        self.clock = clock

    @staticmethod
    def keys(address: str, username: str) -> list[str]:
        """The cache keys of one attempt: its client address and, when it names one, its username (hashed)."""
        keys = [f"{KEY_PREFIX}:addr:{hashlib.sha256(address.encode()).hexdigest()[:32]}"]
        name = username.strip().lower()
        if name:
            keys.append(f"{KEY_PREFIX}:user:{hashlib.sha256(name.encode()).hexdigest()[:32]}")
        return keys

    def retry_after_s(self, keys: list[str]) -> float:
        """Seconds until none of ``keys`` is locked; 0 when none is."""
        now = self.clock()
        wait = 0.0
        for count, until in filter(None, (self.cache.get(key) for key in keys)):
            if count >= self.limit and until > now:
                wait = max(wait, until - now)
        return wait

    def failed(self, keys: list[str]) -> bool:
        """Count one failure on each key; True when that locked one of them."""
        now = self.clock()
        locked = False
        for key in keys:
            entry = self.cache.get(key)
            count, until = entry if entry and entry[1] > now else (0, now + self.window_s)
            count += 1
            self.cache.set(key, (count, until), timeout=max(1, math.ceil(until - now)))
            locked = locked or count == self.limit
        return locked


def _throttle() -> SignInThrottle:
    return SignInThrottle(
        caches["default"],
        int(getattr(settings, "LOGIN_FAILURE_LIMIT", DEFAULT_LIMIT)),
        float(getattr(settings, "LOGIN_FAILURE_WINDOW_S", DEFAULT_WINDOW_S)),
    )


class SignInThrottleMiddleware:
    """Refuses a throttled sign-in with 429 before its view runs; counts a failed one after. Sync and async."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        self._paths: Optional[frozenset[str]] = None

    def _sign_in_post(self, request: HttpRequest) -> bool:
        if request.method != "POST":
            return False
        if self._paths is None:
            self._paths = frozenset(reverse(name) for name in SIGN_IN_VIEWS)
        return request.path_info in self._paths

    def __call__(self, request: HttpRequest) -> Union[HttpResponse, Awaitable[HttpResponse]]:
        if self.is_async:
            return self.__acall__(request)
        if not self._sign_in_post(request):
            return self.get_response(request)
        refused = _before(request)
        if refused is not None:
            return refused
        response = self.get_response(request)
        _after(request, response)
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        if not self._sign_in_post(request):
            return await self.get_response(request)
        refused = await sync_to_async(_before)(request)
        if refused is not None:
            return refused
        response = await self.get_response(request)
        await sync_to_async(_after)(request, response)
        return response


def _attempt(request: HttpRequest) -> tuple[str, str, list[str]]:
    address = request.META.get("REMOTE_ADDR") or ""
    username = str(request.POST.get("username", ""))[:150]
    return address, username, SignInThrottle.keys(address, username)


def _before(request: HttpRequest) -> Optional[HttpResponse]:
    address, username, keys = _attempt(request)
    wait_s = _throttle().retry_after_s(keys)
    if wait_s <= 0:
        return None
    retry_after = max(1, math.ceil(wait_s))
    log.warning("sign_in_throttled", extra={"client": address, "username": username, "retry_after_s": retry_after})
    response = render(request, TEMPLATE, {"throttled_s": retry_after}, status=429)
    response["Retry-After"] = str(retry_after)
    return response


def _after(request: HttpRequest, response: HttpResponse) -> None:
    if response.status_code != 200:  # 302: signed in; 403: refused before any password was checked
        return
    address, username, keys = _attempt(request)
    throttle = _throttle()
    if throttle.failed(keys):
        log.warning(
            "sign_in_locked",
            extra={"client": address, "username": username, "failures": throttle.limit, "window_s": throttle.window_s},
        )


__all__ = ["SIGN_IN_VIEWS", "SignInThrottle", "SignInThrottleMiddleware"]
