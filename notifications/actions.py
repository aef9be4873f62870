"""The generic source's tokens: mint, revoke, check. The ``source_token`` command and the edge call these.

A token opens ``POST /webhooks/generic/<seat>`` for ONE seat. It lives in the
coordination store (``default``) as its SHA-256 only, so a fleet shares it
and a leaked table opens nothing; the token itself is shown once, when it is
minted. Minting for a seat that has one is refused unless it rotates (the old
one stops working at once); revoking deletes it.
"""
from __future__ import annotations

import enum
import re
import secrets
from datetime import datetime, timedelta
from typing import Optional

from django.db import IntegrityError, router, transaction
from django.db.models import Q
from django.utils import timezone

from crewlet.company.org import HANDLE_PATTERN
from crewlet.base.tokens import hash_token
from notifications.models import SourceToken

#: Every source token starts with this, so one pasted into a chat or a log is recognisable (and told from an operator's ``crw_``).
SOURCE_TOKEN_PREFIX = "crws_"
#: A token's use is recorded at most this often: a delivery must not be a write every time.
TOUCH_EVERY_S = 60.0
_HANDLE = re.compile(HANDLE_PATTERN)


class SourceTokenError(ValueError):
    """A token cannot be minted or revoked as asked; the message says why and what to do instead."""


class TokenVerdict(enum.Enum):
    """What a presented token is for the seat its route names."""

    VALID = "valid"
    UNKNOWN = "unknown"
    OTHER_SEAT = "other seat"


def _seat(seat: str) -> str:
    handle = seat.strip()
    if not _HANDLE.fullmatch(handle):
        raise SourceTokenError(f"{seat!r} is not a seat handle (lower-case letters, digits, '-' and '_', at most 63)")
    return handle


def mint_source_token(seat: str, *, rotate: bool = False) -> str:
    """A new token for ``seat`` (the only time it is seen); ``rotate`` replaces the seat's existing one."""
    handle = _seat(seat)
    token = SOURCE_TOKEN_PREFIX + secrets.token_urlsafe(32)
    if rotate:
        SourceToken.objects.update_or_create(
            seat=handle, defaults={"token_hash": hash_token(token), "created_at": timezone.now(), "last_used_at": None}
        )
        return token
    try:
        with transaction.atomic(using=router.db_for_write(SourceToken)):
            SourceToken.objects.create(seat=handle, token_hash=hash_token(token))
    except IntegrityError:
        raise SourceTokenError(
            f"seat {handle} already has a source token: --rotate replaces it, --revoke deletes it"
        ) from None
    return token


def revoke_source_token(seat: str) -> None:
    """Delete ``seat``'s token; deliveries carrying it are refused from now on."""
    handle = _seat(seat)
    deleted, _ = SourceToken.objects.filter(seat=handle).delete()
    if not deleted:
        raise SourceTokenError(f"seat {handle} has no source token")


def check_source_token(token: str, seat: str, *, now: Optional[datetime] = None) -> TokenVerdict:
    """Whether ``token`` opens ``seat``'s route; a valid one's use is recorded (at most every :data:`TOUCH_EVERY_S`)."""
    found = SourceToken.objects.filter(token_hash=hash_token(token)).values_list("pk", "seat").first()
    if found is None:
        return TokenVerdict.UNKNOWN
    pk, owner = found
    if owner != seat:
        return TokenVerdict.OTHER_SEAT
    at = now or timezone.now()
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=at - timedelta(seconds=TOUCH_EVERY_S))
    SourceToken.objects.filter(stale, pk=pk).update(last_used_at=at)
    return TokenVerdict.VALID


__all__ = [
    "SOURCE_TOKEN_PREFIX",
    "SourceTokenError",
    "TokenVerdict",
    "check_source_token",
    "mint_source_token",
    "revoke_source_token",
]
