"""Who may call ``/api/``: an operator token (``Authorization: Bearer``) or a signed-in staff session.

Every app's routes use it (the REST framework's defaults name these classes),
so it lives in the core beside the tokens it checks (:mod:`crewlet.base.tokens`).

Anything else is a 401 with a ``WWW-Authenticate: Bearer`` challenge — a
session that is signed in but not staff included: to this API it is not a
credential at all, so it is answered the way no credential is.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from crewlet.base.tokens import OperatorToken

log = logging.getLogger("crewlet.http.auth")

#: The environment variable whose token ``manage.py up``/``runconsumers`` seeds at start.
OPERATOR_TOKEN_ENV = "CREWLET_OPERATOR_TOKEN"
#: The name the seeded token is stored under.
SEEDED_TOKEN_NAME = "env:CREWLET_OPERATOR_TOKEN"
#: A token shorter than this is refused as a seed: it would be guessable.
MIN_TOKEN_LENGTH = 16
REALM = "crewlet"


class OperatorPrincipal:
    """``request.user`` for a token-authenticated read: the token's name, nothing more."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False

    def __init__(self, name: str) -> None:
        self.username = name

    def __str__(self) -> str:
        return f"operator:{self.username}"


def operator_for(token: str) -> Any:
    """The live ``OperatorToken`` that ``token`` is (its last use recorded), else None: /api/ and /ws/stream alike.

    Remembered for a few seconds once verified (by hash): a revocation made in
    this process applies at once, one made by another process within
    crewlet.base.tokens.TOKEN_CACHE_TTL_S. touch() writes at most once a minute.
    """
    row = OperatorToken.verify(token)
    if row is not None:
        row.touch(timezone.now())
    return row


class OperatorTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>`` against the hashed tokens in the coordination store.

    A verified token is cached in process for ``TOKEN_CACHE_TTL_S`` (10 s), keyed
    by its hash: revoking it through this process refuses it at once, through
    another process within that TTL (:class:`crewlet.base.tokens.VerifiedTokens`).
    """

    keyword = "bearer"

    def authenticate(self, request: Request) -> Optional[tuple[OperatorPrincipal, Any]]:
        header = authentication.get_authorization_header(request)
        if not header:
            return None
        parts = header.split()
        if not parts or parts[0].lower() != self.keyword.encode():
            return None  # another scheme: not ours to judge (the permission still refuses it)
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>'")
        try:
            token = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("the token is not ASCII") from None
        row = operator_for(token)
        if row is None:
            raise exceptions.AuthenticationFailed("unknown operator token")
        return OperatorPrincipal(row.name), row

    def authenticate_header(self, request: Request) -> str:
        # Present, so DRF answers a refusal with 401 rather than 403.
        return f'Bearer realm="{REALM}"'


class StaffSessionAuthentication(authentication.SessionAuthentication):
    """A signed-in session counts only when its user is active staff; any other session is no credential."""

    def authenticate(self, request: Request) -> Optional[tuple[Any, None]]:
        result = super().authenticate(request)
        if result is None:
            return None
        user = result[0]
        if not (getattr(user, "is_active", False) and getattr(user, "is_staff", False)):
            return None
        return result


class IsOperator(permissions.BasePermission):
    """Authenticated by either class above; otherwise ``NotAuthenticated`` (401, with the Bearer challenge)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.successful_authenticator is None:
            raise exceptions.NotAuthenticated()
        return True


def seed_operator_token_from_env(env: Mapping[str, str] = os.environ) -> bool:
    """Store ``CREWLET_OPERATOR_TOKEN`` (hashed) when it is set; True when it was.

    Called as the engine starts. Idempotent, and a changed value replaces the
    previous seed, so rotating the variable and restarting revokes the old token.
    """
    token = env.get(OPERATOR_TOKEN_ENV, "").strip()
    if not token:
        return False
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise ValueError(f"{OPERATOR_TOKEN_ENV} must be at least {MIN_TOKEN_LENGTH} characters with no spaces")
    OperatorToken.seed(SEEDED_TOKEN_NAME, token)
    log.info("operator_token_seeded", extra={"token_name": SEEDED_TOKEN_NAME})
    return True


def actor_of(request: Request) -> str:
    """Who is acting: the operator token's own name, else the staff user's username."""
    if isinstance(request.auth, OperatorToken):
        return request.auth.name
    user = request.user
    return str(getattr(user, "get_username", lambda: getattr(user, "username", ""))() or "")
