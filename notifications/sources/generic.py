"""The generic source: ``POST /webhooks/generic/<seat>``, so a CI job, a monitor or a script can wake a seat.

Not a company surface: nothing in the company file configures it, and its
credential is a per-seat token in the coordination store, minted by
``manage.py source_token SEAT`` (:mod:`notifications.actions`). The request
carries it as ``Authorization: Bearer <token>``:

* none, or one that is no source token (unknown, or revoked): 401;
* a token minted for another seat: 403 — a token opens one seat's route;
* the route's seat is not in the company: 404.

The body is JSON ``{"text": ..., "key": ..., "sender": ...}`` (``text``
required; nothing else accepted, so a misspelt field is a 400 rather than a
silently dropped one). The idempotency key — the ``Idempotency-Key`` header,
or ``key`` — makes a retry one delivery: ``<seat>:<key>`` is its delivery id,
so a repeat is deduped like a vendor's retry. Without a key every POST is a
delivery of its own, even with the same bytes (a monitor saying the same
thing twice means it twice).

Keys: ``generic:<seat>:<sender>`` when a sender is named (a monitor's alerts
batch together), else none (never coalesced). The wake is addressed to the
seat by handle (``addressed``).
"""
from __future__ import annotations

import uuid
from typing import Any, Mapping, Optional

from django.db import DatabaseError

from crewlet.base.db import in_store
from crewlet.company.org import Organization
from notifications import actions
from notifications.parsers import WHY_ADDRESSED, DeliveryMeta, Parsed, Parser, Recipient, as_text, need
from notifications.sources.base import InboundRequest, Source

NAME = "generic"
IDEMPOTENCY_HEADER = "idempotency-key"
EVENT_NAME = "message"
#: The body's fields; only ``text`` is required.
FIELDS = ("text", "key", "sender")
#: The longest idempotency key or sender accepted.
KEY_MAX = 200
#: How the route names the seat (a Django path pattern after ``/webhooks/generic/``).
ROUTE_PATH = "<str:seat>"

acheck_source_token = in_store(actions.check_source_token)


def seat_of_route(route: str) -> str:
    """``/webhooks/generic/ada`` (or ``…/ada/``) -> ``ada``."""
    return route.rstrip("/").rsplit("/", 1)[-1]


def _never(secret: str, req: InboundRequest, now: float) -> Optional[str]:
    """The company-secret check this source does not use: it authenticates with :func:`authenticate`."""
    return "the generic source authenticates with a source token"


async def authenticate(req: InboundRequest, org: Organization) -> Optional[tuple[int, str]]:
    """None when the bearer token is this seat's source token and the seat is in the company; else (status, reason)."""
    seat = seat_of_route(req.route)
    scheme, _, token = req.header("authorization").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return 401, f"missing 'Authorization: Bearer <source token>' (mint one with manage.py source_token {seat})"
    try:
        verdict = await acheck_source_token(token, seat)
    except DatabaseError as exc:
        return 503, f"the coordination store is unavailable, retry later ({type(exc).__name__})"
    if verdict is actions.TokenVerdict.UNKNOWN:
        return 401, "the bearer token is no source token: unknown, or revoked"
    if verdict is actions.TokenVerdict.OTHER_SEAT:
        return 403, f"this token opens another seat's route, not {seat}'s: mint one with manage.py source_token {seat}"
    if org.seat_by_handle(seat) is None:
        return 404, f"the company has no seat {seat}"
    return None


def meta(req: InboundRequest) -> DeliveryMeta:
    """The seat's ``Idempotency-Key`` as the delivery id (scoped to the seat), and the route that names the seat."""
    key = req.header(IDEMPOTENCY_HEADER).strip()
    return DeliveryMeta(event_name=EVENT_NAME, delivery_id=f"{seat_of_route(req.route)}:{key}" if key else "", route=req.route)


def _text_field(payload: Mapping[str, Any], name: str, *, required: bool = False, limit: int = 0) -> Optional[str]:
    """Why field ``name`` is refused, or None."""
    if name not in payload:
        return f"{name} is required" if required else None
    value = payload[name]
    if not isinstance(value, str) or not value.strip():
        return f"{name} must be a non-empty string"
    if limit and len(value) > limit:
        return f"{name} is {len(value)} characters, over the {limit}-character limit"
    return None


def validate(payload: Mapping[str, Any], meta: DeliveryMeta) -> Optional[str]:
    """The body is ``{text, key?, sender?}``, and a key given twice says the same both times."""
    unknown = sorted(k for k in payload if k not in FIELDS)
    if unknown:
        return f"unknown field {', '.join(repr(k) for k in unknown)}: the body is {{\"text\", \"key\"?, \"sender\"?}}"
    problem = (
        _text_field(payload, "text", required=True)
        or _text_field(payload, "key", limit=KEY_MAX)
        or _text_field(payload, "sender", limit=KEY_MAX)
    )
    if problem:
        return problem
    header_key = meta.delivery_id.split(":", 1)[1] if meta.delivery_id else ""
    if len(header_key) > KEY_MAX:
        return f"the Idempotency-Key header is {len(header_key)} characters, over the {KEY_MAX}-character limit"
    body_key = as_text(payload.get("key"))
    if header_key and body_key and header_key != body_key:
        return "the Idempotency-Key header and the body's key differ: send one, or the same in both"
    return None


def fresh_id(body: bytes) -> str:
    """A delivery with no key is a delivery of its own, whatever its bytes."""
    return f"unkeyed:{uuid.uuid4()}"


class GenericParser(Parser):
    source = NAME

    def event_name(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        return EVENT_NAME

    def delivery_id(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> str:
        key = as_text(payload.get("key"))
        return meta.delivery_id or (f"{seat_of_route(meta.route)}:{key}" if key else "")

    def parse(self, payload: Mapping[str, Any], meta: DeliveryMeta = DeliveryMeta()) -> Parsed:
        seat = need(seat_of_route(meta.route), "the route's seat")
        text = need(payload.get("text"), "text")
        sender = as_text(payload.get("sender"))
        delivery = self.delivery_id(payload, meta)
        key = f"{NAME}:{seat}:{sender}" if sender else ""
        return Parsed(
            NAME, EVENT_NAME, delivery, delivery, sender=sender, sender_name=sender or "a script", partition_key=key,
            conversation_identity=key, title=f"Message for {seat}" + (f" from {sender}" if sender else ""), body=text,
            recipients=(Recipient(seat, WHY_ADDRESSED, by_handle=True),),
        )


SOURCE = Source(
    parser=GenericParser(),
    verify=_never,
    meta=meta,
    headers=(IDEMPOTENCY_HEADER,),
    validate=validate,
    authenticate=authenticate,
    path=ROUTE_PATH,
    anonymous_id=fresh_id,
)

__all__ = ["IDEMPOTENCY_HEADER", "NAME", "SOURCE", "GenericParser", "authenticate", "meta", "seat_of_route", "validate"]
