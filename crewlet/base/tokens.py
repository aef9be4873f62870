"""Operator tokens: the credential every app's ``/api/`` routes, and ``/ws/stream``, accept.

They live in the coordination store (``default``) because a fleet shares them
— a token minted on one node has to open every node's API. They belong to the
core, below the apps, because every app's routes authenticate with them
(:mod:`crewlet.http.auth`). Their table is still ``seats_operator_token``, the name
it had when the seats app owned them, so a database migrated before keeps its
tokens (the move is state only: ``crewlet`` 0002, ``seats`` 0003).
"""
from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections import OrderedDict
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any, Callable, Optional

from django.db import connections, models, router, transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

log = logging.getLogger("crewlet.base.tokens")

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


class HashedToken(models.Model):
    """A credential stored only as its hash (:func:`hash_token`): the operator's, and the apps' own kinds.

    The token itself is shown once, when it is minted; ``last_used_at`` says
    whether a token is still in use before somebody revokes it.
    """

    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class OperatorToken(HashedToken):
    """One named operator credential (see :class:`HashedToken`)."""

    name = models.CharField(max_length=100, unique=True)

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
        """The token's row, or None, from the database. One indexed statement, no ORM compile."""
        return cls._lookup_hash(hash_token(token))

    @classmethod
    def verify(cls, token: str, cache: Optional["VerifiedTokens"] = None) -> Optional["OperatorToken"]:
        """The token's row, or None: what every /api/ request asks, so a verified token is remembered.

        Remembered by its hash for :data:`TOKEN_CACHE_TTL_S` in this process
        (see :class:`VerifiedTokens`); an unknown token always asks the database.
        """
        tokens = cache if cache is not None else VERIFIED_TOKENS
        digest = hash_token(token)
        row = tokens.get(digest)
        if row is not None:
            return row
        generation = tokens.generation
        row = cls._lookup_hash(digest)
        if row is not None:
            tokens.put(digest, row, generation)
        return row

    @classmethod
    def _lookup_hash(cls, digest: str) -> Optional["OperatorToken"]:
        using = router.db_for_read(cls)
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"SELECT id, name, created_at, last_used_at FROM {cls._meta.db_table} WHERE token_hash = %s",
                [digest],
            )
            found = cursor.fetchone()
        if found is None:
            return None
        pk, name, created_at, last_used_at = (_aware(v) for v in found)
        row = cls(id=pk, name=name, token_hash=digest, created_at=created_at, last_used_at=last_used_at)
        row._state.adding = False
        row._state.db = using
        return row

    def touch(self, now: datetime, every_s: float = 60.0) -> None:
        """Record a use, at most once per ``every_s``: a read must not be a write every time."""
        last = self.last_used_at
        if last is not None and (now - last).total_seconds() < every_s:
            return
        # update(), not save(): no post_save, so a touch never empties the verified-token cache.
        type(self).objects.filter(pk=self.pk).update(last_used_at=now)
        self.last_used_at = now


#: How long a verified token is believed without asking the database again; also the
#: longest another process keeps accepting a token revoked or rotated elsewhere.
TOKEN_CACHE_TTL_S = 10.0
#: The most verified tokens one process remembers: a fleet has a handful, not thousands.
TOKEN_CACHE_SIZE = 256


class VerifiedTokens:
    """Operator tokens this process verified in the last ``ttl_s``, keyed by hash, never by the token.

    Saves an ``/api/`` request the token's database round trip. A revocation,
    rotation or deletion made through the app in this process (the admin, the
    ``operator_token`` command, :meth:`OperatorToken.mint`/``seed``: anything
    that saves or deletes a row through the ORM) empties it at once, via
    ``post_save``/``post_delete``; other processes, and a raw SQL change, are
    seen within ``ttl_s``. Bounded at ``max_size`` entries, oldest dropped first.
    ``clock`` is injectable so tests move time instead of sleeping.
    """

    def __init__(
        self,
        ttl_s: float = TOKEN_CACHE_TTL_S,
        max_size: int = TOKEN_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_size = max_size
        self.clock = clock
        #: Bumped by every clear, so a lookup that raced a revocation cannot re-add what it read.
        self.generation = 0
        self._entries: OrderedDict[str, tuple[float, OperatorToken]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, digest: object) -> bool:
        return digest in self._entries

    def get(self, digest: str) -> Optional[OperatorToken]:
        now = self.clock()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if now >= entry[0]:
                del self._entries[digest]
                return None
            return entry[1]

    def put(self, digest: str, row: OperatorToken, generation: Optional[int] = None) -> None:
        """Remember ``row`` under ``digest``, unless the cache was cleared since ``generation`` was read."""
        expires = self.clock() + self.ttl_s
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            self._entries[digest] = (expires, row)
            self._entries.move_to_end(digest)
            while len(self._entries) > self.max_size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._entries.clear()


#: The process's verified tokens (module-level so tests can swap in one with their own clock).
VERIFIED_TOKENS = VerifiedTokens()


def forget_verified_tokens(sender: Any = None, using: Optional[str] = None, **kwargs: Any) -> None:
    """A token row changed or went: forget every verified token now, and again once the change commits.

    Again at commit because until then another thread still reads the old row
    and could remember it afresh. Forgetting all is fine: tokens change rarely.
    """
    VERIFIED_TOKENS.clear()
    log.info("operator_tokens_forgotten", extra={"token_name": getattr(kwargs.get("instance"), "name", "")})
    if using is not None:
        transaction.on_commit(lambda: VERIFIED_TOKENS.clear(), using=using)


post_save.connect(forget_verified_tokens, sender=OperatorToken, dispatch_uid="crewlet.forget_verified_tokens.save")
post_delete.connect(forget_verified_tokens, sender=OperatorToken, dispatch_uid="crewlet.forget_verified_tokens.delete")
