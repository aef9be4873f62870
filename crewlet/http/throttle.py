"""Failed sign-ins are throttled per account and client address, and per address: a password cannot be guessed at speed.

Both sign-in forms — the dashboard's ``/login/`` and the admin's
``/admin/login/`` — post to views that answer a failure by showing the form
again (200) and a success by redirecting (302). :class:`SignInThrottleMiddleware`
counts failures over a fixed window (``LOGIN_FAILURE_WINDOW_S``, from the first
failure) on two counters:

* **the account from this address** — a (username, client address) pair —
  locked after ``LOGIN_FAILURE_LIMIT`` failures: guessing one account's
  password from one address is held to that many tries a window;
* **the address** — every username it tries — locked after
  ``LOGIN_ADDRESS_FAILURE_LIMIT`` failures (by default
  :data:`ADDRESS_LIMIT_FACTOR` times the first limit, so a person who forgot
  which username they have is not locked out by the second one they try):
  spraying guesses across accounts from one address is held too.

Once either counter of an attempt is locked, the attempt — a right password
included — is answered ``429`` with ``Retry-After`` until its window ends,
without checking the password. There is deliberately no counter of a username
alone: with one, anybody who knows the admin's username could keep the admin
locked out from everywhere with a few wrong passwords a minute. A stranger's
failures lock only the stranger's address; the owner signing in from their own
address is let through. A right password clears its account-from-this-address
count (never the address's, so signing in to one's own account does not reset
a spray).

Counts live in Django's default cache: per process for the default local-memory
cache (``manage.py up`` is one process); a fleet that serves the web from several
processes configures a shared ``CACHES["default"]``.
"""
from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

log = logging.getLogger("crewlet.http.throttle")

#: The URL names of the sign-in views.
SIGN_IN_VIEWS = ("dash-login", "admin:login")
DEFAULT_LIMIT = 5
DEFAULT_WINDOW_S = 60.0
#: By default an address may fail this many times ``LOGIN_FAILURE_LIMIT`` (across usernames) before it is refused.
ADDRESS_LIMIT_FACTOR = 4
KEY_PREFIX = "crewlet:signin"
TEMPLATE = "dashboard/login.html"
#: Which counter locked, as ``sign_in_locked`` and ``sign_in_throttled`` name it.
SCOPE_ACCOUNT = "account_from_address"
SCOPE_ADDRESS = "address"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Counter:
    """One failure count an attempt moves: its cache key, how many failures lock it, and which counter it is."""

    key: str
    limit: int
    scope: str


class SignInThrottle:
    """Failure counts per (username, address) and per address over a fixed window, in a Django cache; ``clock`` is injectable."""

    def __init__(
        self,
        cache: Any,
        limit: int,
        window_s: float,
        clock: Callable[[], float] = time.time,
        address_limit: Optional[int] = None,
    ) -> None:
        self.cache = cache
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self.address_limit = address_limit if address_limit is not None else limit * ADDRESS_LIMIT_FACTOR

    def counters(self, address: str, username: str) -> list[Counter]:
        """The counters of one attempt: its client address's and, when it names a username, that account's from that address.

        Usernames are compared case-insensitively and stripped, as a person
        types them; both are hashed, so the cache holds neither.
        """
        found = [Counter(f"{KEY_PREFIX}:addr:{_digest(address)}", self.address_limit, SCOPE_ADDRESS)]
        name = username.strip().lower()
        if name:
            found.append(Counter(f"{KEY_PREFIX}:acct:{_digest(address, name)}", self.limit, SCOPE_ACCOUNT))
        return found

    def retry_after_s(self, address: str, username: str) -> float:
        """Seconds until no counter of this attempt is locked; 0 when none is."""
        now = self.clock()
        wait = 0.0
        for counter in self.counters(address, username):
            entry = self.cache.get(counter.key)
            if entry and entry[0] >= counter.limit and entry[1] > now:
                wait = max(wait, entry[1] - now)
        return wait

    def failed(self, address: str, username: str) -> list[Counter]:
        """Count one failure on each counter of this attempt; the counters that this failure locked."""
        now = self.clock()
        locked = []
        for counter in self.counters(address, username):
            entry = self.cache.get(counter.key)
            count, until = entry if entry and entry[1] > now else (0, now + self.window_s)
            count += 1
            self.cache.set(counter.key, (count, until), timeout=max(1, math.ceil(until - now)))
            if count == counter.limit:
                locked.append(counter)
        return locked

    def succeeded(self, address: str, username: str) -> None:
        """A right password: forget this account's failures from this address (the address's own count stays)."""
        for counter in self.counters(address, username):
            if counter.scope == SCOPE_ACCOUNT:
                self.cache.delete(counter.key)


def _throttle() -> SignInThrottle:
    limit = int(getattr(settings, "LOGIN_FAILURE_LIMIT", DEFAULT_LIMIT))
    address_limit = getattr(settings, "LOGIN_ADDRESS_FAILURE_LIMIT", None)
    return SignInThrottle(
        caches["default"],
        limit,
        float(getattr(settings, "LOGIN_FAILURE_WINDOW_S", DEFAULT_WINDOW_S)),
        address_limit=int(address_limit) if address_limit is not None else None,
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


def _attempt(request: HttpRequest) -> tuple[str, str]:
    address = request.META.get("REMOTE_ADDR") or ""
    username = str(request.POST.get("username", ""))[:150]
    return address, username


def _before(request: HttpRequest) -> Optional[HttpResponse]:
    address, username = _attempt(request)
    wait_s = _throttle().retry_after_s(address, username)
    if wait_s <= 0:
        return None
    retry_after = max(1, math.ceil(wait_s))
    log.warning("sign_in_throttled", extra={"client": address, "username": username, "retry_after_s": retry_after})
    response = render(request, TEMPLATE, {"throttled_s": retry_after}, status=429)
    response["Retry-After"] = str(retry_after)
    return response


def _after(request: HttpRequest, response: HttpResponse) -> None:
    address, username = _attempt(request)
    throttle = _throttle()
    if response.status_code == 302:  # signed in
        throttle.succeeded(address, username)
        return
    if response.status_code != 200:  # 403: refused before any password was checked
        return
    for counter in throttle.failed(address, username):
        log.warning(
            "sign_in_locked",
            extra={
                "client": address,
                "username": username,
                "scope": counter.scope,
                "failures": counter.limit,
                "window_s": throttle.window_s,
            },
        )


__all__ = [
    "ADDRESS_LIMIT_FACTOR",
    "SCOPE_ACCOUNT",
    "SCOPE_ADDRESS",
    "SIGN_IN_VIEWS",
    "Counter",
    "SignInThrottle",
    "SignInThrottleMiddleware",
]
