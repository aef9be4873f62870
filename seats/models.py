"""Coordination-store models of the seats app.

Today: operator tokens, the credential every ``/api/`` read accepts. They live
in the coordination store (``default``) because a fleet shares them — a token
minted on one node has to open every node's API.
"""
from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Optional

from django.db import connections, models, router, transaction
from django.utils import timezone

#: Every minted token starts with this, so one pasted into a chat or a log is recognisable.
TOKEN_PREFIX = "crw_"


def hash_token(token: str) -> str:
    """The stored form of a token: SHA-256 hex. A leaked table opens nothing."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _aware(value: object) -> object:
    """A raw cursor's datetime as the ORM would give it: SQLite hands back naive UTC."""
    if isinstance(value, datetime) and timezone.is_naive(value):
        return value.replace(tzinfo=dt_timezone.utc)
    return value


class OperatorToken(models.Model):
    """One named operator credential, stored only as its hash.

    The token itself is shown once, when it is minted; ``last_used_at`` says
    whether a token is still in use before somebody revokes it.
    """

    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "seats_operator_token"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def mint(cls, name: str, *, replace: bool = False) -> tuple["OperatorToken", str]:
        """A new token under ``name``; returns the row and the token (the only time it is seen).

        ``replace`` rotates an existing name's token (the old one stops working);
        without it an existing name is an IntegrityError.
        """
        token = new_token()
        if replace:
            row, _ = cls.objects.update_or_create(
                name=name, defaults={"token_hash": hash_token(token), "created_at": timezone.now(), "last_used_at": None}
            )
        else:
            with transaction.atomic(using=router.db_for_write(cls)):  # a taken name rolls back only this
                row = cls.objects.create(name=name, token_hash=hash_token(token))
        return row, token

    @classmethod
    def seed(cls, name: str, token: str) -> "OperatorToken":
        """Make ``token`` the one named ``name`` (idempotent; a changed token replaces the old)."""
        digest = hash_token(token)
        row, _ = cls.objects.update_or_create(name=name, defaults={"token_hash": digest})
        return row

    @classmethod
    def lookup(cls, token: str) -> Optional["OperatorToken"]:
        """The token's row, or None. One indexed statement, no ORM compile: every /api/ request runs it."""
        using = router.db_for_read(cls)
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"SELECT id, name, created_at, last_used_at FROM {cls._meta.db_table} WHERE token_hash = %s",
                [hash_token(token)],
            )
            found = cursor.fetchone()
        if found is None:
            return None
        pk, name, created_at, last_used_at = (_aware(v) for v in found)
        row = cls(id=pk, name=name, token_hash=hash_token(token), created_at=created_at, last_used_at=last_used_at)
        row._state.adding = False
        row._state.db = using
        return row

    def touch(self, now: datetime, every_s: float = 60.0) -> None:
        """Record a use, at most once per ``every_s``: a read must not be a write every time."""
        last = self.last_used_at
        if last is not None and (now - last).total_seconds() < every_s:
            return
        type(self).objects.filter(pk=self.pk).update(last_used_at=now)
        self.last_used_at = now
from seats.delivery_models import *  # noqa: F401,F403
