"""The sign-in throttle (crewlet.http.throttle): a stranger cannot lock a named account out, and guessing stays bounded.

The counters are checked with an injected clock over a local-memory cache (no
wall clock, no waiting), then the middleware through Django's test client, with
the client address each request comes from set as the web server would set it.
"""
from __future__ import annotations

import itertools
from typing import Iterator

import pytest
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from django.test import Client

from crewlet.http.throttle import ADDRESS_LIMIT_FACTOR, SCOPE_ACCOUNT, SCOPE_ADDRESS, SignInThrottle
from waiting_support import ManualClock

STRANGER = "203.0.113.66"
OWNER = "198.51.100.7"
ADMIN = "admin"
ADMIN_PASSWORD = "the-admins-own-password-4711"
LIMIT = 5
WINDOW_S = 60.0
_caches = itertools.count()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000.0)


@pytest.fixture
def throttle(clock: ManualClock) -> SignInThrottle:
    cache = LocMemCache(f"signin-throttle-{next(_caches)}", {})
    return SignInThrottle(cache, LIMIT, WINDOW_S, clock=clock)


def test_a_strangers_wrong_passwords_lock_the_account_only_from_the_strangers_address(throttle: SignInThrottle) -> None:
    for _ in range(LIMIT):
        throttle.failed(STRANGER, ADMIN)
    assert throttle.retry_after_s(STRANGER, ADMIN) == WINDOW_S
    assert throttle.retry_after_s(OWNER, ADMIN) == 0.0
    assert throttle.retry_after_s(OWNER, " Admin ") == 0.0  # however the owner types the name


def test_guessing_one_accounts_password_from_one_address_is_held_to_the_limit_each_window(
    throttle: SignInThrottle, clock: ManualClock
) -> None:
    locked = [throttle.failed(STRANGER, ADMIN) for _ in range(LIMIT)]
    assert [c.scope for c in locked[-1]] == [SCOPE_ACCOUNT] and not any(locked[:-1])
    assert throttle.retry_after_s(STRANGER, "ADMIN") == WINDOW_S
    clock.now += WINDOW_S / 2
    assert throttle.retry_after_s(STRANGER, ADMIN) == WINDOW_S / 2
    clock.now += WINDOW_S / 2
    assert throttle.retry_after_s(STRANGER, ADMIN) == 0.0  # the window is over: a fresh count


def test_spraying_usernames_from_one_address_locks_that_address_at_the_looser_limit(throttle: SignInThrottle) -> None:
    address_limit = LIMIT * ADDRESS_LIMIT_FACTOR
    assert throttle.address_limit == address_limit
    for n in range(address_limit - 1):
        assert throttle.failed(STRANGER, f"user{n}") == []
    assert throttle.retry_after_s(STRANGER, "someone-else") == 0.0
    assert [c.scope for c in throttle.failed(STRANGER, "last-guess")] == [SCOPE_ADDRESS]
    assert throttle.retry_after_s(STRANGER, "someone-else") == WINDOW_S
    assert throttle.retry_after_s(STRANGER, "") == WINDOW_S  # a form with no username is the address's too
    assert throttle.retry_after_s(OWNER, "someone-else") == 0.0


def test_a_right_password_clears_the_accounts_count_from_that_address_but_not_the_addresses(
    throttle: SignInThrottle,
) -> None:
    for _ in range(LIMIT - 1):
        throttle.failed(OWNER, ADMIN)
    throttle.succeeded(OWNER, ADMIN)
    for _ in range(LIMIT - 1):
        throttle.failed(OWNER, ADMIN)
    assert throttle.retry_after_s(OWNER, ADMIN) == 0.0  # eight typos, but never five since the last sign-in
    throttle = SignInThrottle(throttle.cache, LIMIT, WINDOW_S, clock=throttle.clock, address_limit=3)
    for name in ("a", "b"):
        throttle.failed(STRANGER, name)
    throttle.succeeded(STRANGER, "mine")
    throttle.failed(STRANGER, "c")
    assert throttle.retry_after_s(STRANGER, "mine") > 0  # signing in to one's own account resets no spray


# -- the middleware, through Django's test client ---------------------------------------------------


@pytest.fixture
def admin_user(db: None) -> Iterator[str]:
    from django.contrib.auth import get_user_model

    caches["default"].clear()
    get_user_model().objects.create_superuser(ADMIN, "admin@example.com", ADMIN_PASSWORD)
    yield ADMIN
    caches["default"].clear()


def _sign_in(address: str, password: str, path: str = "/login/") -> int:
    response = Client(REMOTE_ADDR=address).post(path, {"username": ADMIN, "password": password, "next": ""})
    return int(response.status_code)


def test_five_wrong_passwords_from_a_stranger_do_not_keep_the_admin_out_from_the_admins_own_address(admin_user: str) -> None:
    for _ in range(LIMIT):
        assert _sign_in(STRANGER, "guess") == 200
    assert _sign_in(STRANGER, ADMIN_PASSWORD) == 429  # the stranger's address is held, right password or not
    assert _sign_in(STRANGER, ADMIN_PASSWORD, "/admin/login/") == 429  # on the admin's form too
    assert _sign_in(OWNER, ADMIN_PASSWORD) == 302
    assert _sign_in(OWNER, ADMIN_PASSWORD, "/admin/login/") == 302
