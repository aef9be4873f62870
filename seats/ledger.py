"""The completion ledger: which triggers a seat's finished turns already worked.

A drain whose turn outlasts the ack window, a node that stopped between a
turn's end and its ack, an edge that re-sent a webhook: each comes back as a
redelivery, and the ledger is what makes it a skip rather than a second turn
(design: Inbox Batching § The ack budget). It lives in the coordination store
because the redelivery may reach another node.

A trigger's identity is the provider's own id for the message where the wake
carries one (``message_id`` — the message on its chat backend, however many
deliveries brought it — then ``delivery_id``), namespaced by the wake's
source, else the event id: a provider's retry is a new event with the same
delivery, and only the provider's id says it is the same message.

Values the stores cannot hold never reach them from here. PostgreSQL refuses
a NUL in text and in jsonb, and no driver can encode a lone surrogate as
UTF-8, so a wake carrying either (the edge refuses them, but other producers
publish to inboxes too) would fail every store call its delivery makes, on
every delivery. :func:`crewlet.base.jsontext.storable` writes each such code
point as its ``\\uXXXX`` escape instead — readable in a prompt or a ledger row, and the
same escape for the same value, so an identity stays stable across
redeliveries — and :func:`storable_event` applies it to a whole wake before
the seat reads anything out of it.

A message a turn was shown waiting in its thread block and answered there
(:mod:`seats.thread_block`) is recorded beside the turn's own triggers under
the identity its own wake carries, with no ``event_id`` (no delivery of its
own reached that turn): that empty ``event_id`` is how :func:`screen` tells
its delivery, coming round afterwards, that a later turn answered it in its
thread rather than that a turn was woken by it.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Iterable, Mapping, Optional, Sequence, TypeVar

from django.db import DataError, IntegrityError, InterfaceError, OperationalError

from django.utils import timezone

from crewlet.base.db import in_store
from crewlet.events import Event
from crewlet.events.backend_ids import MESSAGE_KIND, message_identity
from crewlet.events.types.phrases import TRIGGER_ALREADY_WORKED as SKIP_ALREADY_WORKED
from crewlet.events.types.phrases import TRIGGER_ANSWERED_IN_THREAD as SKIP_ANSWERED_IN_THREAD
from crewlet.base.jsontext import holds_unstorable, storable, storable_value
from seats.delivery_models import LedgerEntry, SeatPause

log = logging.getLogger("crewlet.seats.ledger")

#: The payload keys that carry a provider's identity for the message, in precedence order.
IDENTITY_KEYS: tuple[str, ...] = ("message_id", "delivery_id")
#: How long a ledger row is kept. Far past any redelivery: 25 deliveries of
#: a 30-minute ack window is half a day, and held mail waits on the broker.
LEDGER_KEEP_S = 30 * 86400.0

T = TypeVar("T")


#: How a store failure is filed (``seat_store_failed`` ``fault=``).
FAULT_DOWN = "store_down"
FAULT_VALUE = "value_refused"
FAULT_OTHER = "store_error"


def storable_event(event: Event) -> Event:
    """``event`` itself when every string in it is storable, else a copy with each one escaped."""
    wire = event.to_dict()
    if not holds_unstorable(wire):
        return event
    return Event.from_dict(storable_value(wire))


def store_fault(exc: BaseException) -> str:
    """Which store failure this is: the database is away, or it refused this value.

    ``FAULT_DOWN`` (a connection error: the server is restarting, the network
    dropped) is the node's problem and any delivery would fail the same way;
    ``FAULT_VALUE`` (a value the column or the driver cannot take, a
    constraint) follows the event, and retrying it can only fail again.
    Anything else (a missing table, a driver bug) is ``FAULT_OTHER``.
    """
    if isinstance(exc, (OperationalError, InterfaceError)):
        return FAULT_DOWN
    if isinstance(exc, (DataError, IntegrityError, ValueError)):
        return FAULT_VALUE
    return FAULT_OTHER


def trigger_identity(event: Event) -> str:
    """``message:<source>:<id>`` / ``delivery:<source>:<id>`` when the provider named it, else ``event:<uuid>``."""
    for key in IDENTITY_KEYS:
        value = event.field(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            kind = key.split("_", 1)[0]
            if kind == MESSAGE_KIND:
                return storable(message_identity(event.source, str(value).strip()))[:255]
            scope = f"{event.source}:" if event.source else ""
            return storable(f"{kind}:{scope}{str(value).strip()}")[:255]
    return event_identity(event)


def event_identity(event: Event) -> str:
    """``event:<uuid>``: the event itself, whatever provider values it copies (a coding run's wake copies its launch's)."""
    return storable(f"event:{event.id}")[:255]


class Worked(dict[str, str]):
    """Worked triggers, each to the turn that worked it; ``in_thread`` are those a turn answered in its thread block."""

    def __init__(self, turns: Iterable[tuple[str, str]] = (), in_thread: Iterable[str] = ()) -> None:
        super().__init__(turns)
        self.in_thread = frozenset(in_thread)


def worked(seat: str, identities: Iterable[str]) -> Worked:
    """The identities among ``identities`` the seat's turns already worked, each to the turn that did.

    A row with no ``event_id`` is a message a turn answered in its thread
    block rather than one that woke a turn: it is in ``Worked.in_thread``.
    """
    wanted = list(dict.fromkeys(storable(i) for i in identities))
    if not wanted:
        return Worked()
    rows = list(LedgerEntry.objects.filter(seat=seat, trigger__in=wanted).values_list("trigger", "turn_id", "event_id"))
    return Worked(((t, turn) for t, turn, _ in rows), (t for t, _, ev in rows if not ev))


def skip_words(done: Mapping[str, str], identity: str) -> tuple[str, str]:
    """``turn_trigger_skipped``'s reason and detail for a redelivery of ``identity``, which ``done`` holds."""
    by = done[identity]
    if identity in getattr(done, "in_thread", ()):
        return SKIP_ANSWERED_IN_THREAD, f"{identity} was shown waiting in the thread of turn {by}, which answered it"
    return SKIP_ALREADY_WORKED, f"{identity} was worked by turn {by}"


def screen(seat: str, identities: Iterable[str]) -> tuple[Worked, Optional[SeatPause]]:
    """What dispatch asks the store before a turn, in one hop: worked triggers and the seat's pause.

    The pause row is authoritative; the inbox hold is only this node's cheap
    gate, so a pause taken on another node is still honoured here.
    """
    done = worked(seat, identities)
    pause = SeatPause.objects.filter(handle=seat, paused=True).first()
    return done, pause


def turn_pairs(identities: Mapping[str, str], covered: Sequence[Event], in_thread: Iterable[str] = ()) -> list[tuple[str, str]]:
    """What a finished turn records: ``(identity, event id)`` of each trigger it covered, then each message it answered in its thread.

    A message shown in the thread block has no event of its own in the turn
    (``event_id`` empty); one that is also a trigger keeps its trigger's row.
    """
    pairs = [(identities[ev.id], ev.id) for ev in covered if ev.id in identities]
    mine = {identity for identity, _ in pairs}
    return pairs + [(identity, "") for identity in dict.fromkeys(in_thread) if identity not in mine]


def record(
    seat: str,
    turn_id: str,
    identities: Iterable[tuple[str, str]],
    *,
    now: Optional[datetime] = None,
) -> int:
    """Record ``(identity, event_id)`` pairs as worked by ``turn_id``; returns rows written.

    An identity already recorded keeps its first turn (``ignore_conflicts``):
    the ledger answers "was this worked", and the first turn is the answer.
    """
    at = now or timezone.now()
    rows = [
        LedgerEntry(
            seat=seat, trigger=storable(identity)[:255], turn_id=turn_id, event_id=storable(event_id)[:64], worked_at=at
        )
        for identity, event_id in dict(identities).items()
    ]
    if not rows:
        return 0
    LedgerEntry.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def prune(*, older_than_s: float = LEDGER_KEEP_S, now: Optional[datetime] = None) -> int:
    """Delete ledger rows older than ``older_than_s``; returns how many went."""
    floor = (now or timezone.now()) - timedelta(seconds=older_than_s)
    deleted, _ = LedgerEntry.objects.filter(worked_at__lt=floor).delete()
    return deleted


ascreen = in_store(screen)
arecord = in_store(record)
aprune = in_store(prune)

__all__ = [
    "event_identity",
    "FAULT_DOWN",
    "FAULT_OTHER",
    "FAULT_VALUE",
    "IDENTITY_KEYS",
    "LEDGER_KEEP_S",
    "SKIP_ALREADY_WORKED",
    "SKIP_ANSWERED_IN_THREAD",
    "Worked",
    "aprune",
    "arecord",
    "ascreen",
    "prune",
    "record",
    "screen",
    "skip_words",
    "storable",
    "storable_event",
    "storable_value",
    "store_fault",
    "trigger_identity",
    "turn_pairs",
    "worked",
]
