"""The webhook edge: verify a delivery, open its trace, hand it to the broker, answer.

Framework-neutral (``Edge.receive`` takes an :class:`InboundRequest`), so the
Django view (``notifications.views``) and a later Mattermost socket client
share one path. In order:

1. size — over the limit (``CREWLET_WEBHOOK_MAX_BODY_BYTES``, default 1 MiB)
   is 413, checked from ``Content-Length`` before the body is read and again
   on the bytes;
2. verification, by the source's own ``verify`` (``notifications/sources/<vendor>.py``:
   Slack's ``v0`` signing with a 5-minute timestamp window, GitHub's
   ``X-Hub-Signature-256``, Atlassian's ``X-Hub-Signature`` or ``?secret=``,
   Mattermost's token), constant-time (``hmac.compare_digest``). Nothing
   else of the body is decoded before this step (Mattermost's body token,
   and Slack's ``api_app_id`` naming the app whose signing secret verifies
   it when seats have apps of their own, are read with the depth-limited
   decoder). A surface whose secret variable is unset is refused (401, "not
   configured", naming the variable) unless the company says
   ``verify: false`` for it; so is a delivery for a seat's app whose secret
   variable is unset, or one naming an app the company does not have;
3. content type — JSON (``application/json`` or ``+json``), or
   ``application/x-www-form-urlencoded`` for a source that reads forms
   (GitHub's ``payload=`` field, Slack's slash commands and interactivity);
   anything else is 415 naming what the source accepts;
4. body — decoded (``notifications.parsers.decode_body``, the router reads
   it the same way) with a nesting limit (``MAX_JSON_DEPTH``); a malformed
   body or form, one nested deeper, or one that is not an object, is 400;
   so is one the source's ``validate`` refuses (a slash command with no
   ``trigger_id``);
5. storable — a NUL or a lone surrogate anywhere in the body (a key or a
   string, or a JSON document it carries as a string), the event name or the
   delivery id is 400 naming where: no store downstream can hold it;
6. a source's endpoint handshake (Slack's ``url_verification``) is answered
   at once (200, or 400 when malformed), never published;
7. under a span that honours an inbound W3C ``traceparent`` (without one, a
   root of the trace :func:`delivery_trace_id` derives from the delivery id,
   so a vendor's retry is answered with the first try's trace), the delivery is
   published as a ``raw_webhook`` to ``crewlet.notifications.inbound``, then
   its ``inbound_delivery`` record (the event name and delivery id the
   source's ``meta`` and parser read; label ``webhook:<event>`` /
   ``forge:<event>`` / ``socket:posted``, the provider's exact bytes) to
   ``crewlet.events.inbound_delivery`` — and only then 202. The record's id
   derives from the provider's delivery id, so a vendor's retry is one row.
   The broker unreachable (either publish) is 503, so the vendor retries;
   routing drops the retry of a delivery that did get through. A source
   whose vendor expects more than 202 answers through its ``acknowledge``
   (Slack: 200 with a slash command's ephemeral line, or empty for an
   interaction, since Slack shows the person an error after 3 s).

A source that is no company surface (the generic source) authenticates the
request itself, against the coordination store, at step 2.

Every refusal is JSON ``{"error": <reason>}`` with a reason a person can act on.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Callable, Coroutine, Mapping, Optional

from crewlet import events
from crewlet.events.types import InboundDelivery, RawWebhook
from crewlet.company.org import SURFACE_SECRET_KEYS, CompanyHolder, Surface
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.queue.errors import QueueError
from crewlet.events.tracing import (
    OPERATION_SEND, TRACEPARENT_HEADER, messaging_attributes, messaging_span_name, parse_traceparent, start_span, trace_of,
)
from crewlet.http.limits import webhook_max_body_bytes
from notifications.parsers import (
    JSON_MEDIA,
    MAX_JSON_DEPTH,
    DeliveryMeta,
    JSONTooDeep,
    MalformedForm,
    UnsupportedMedia,
    decode_body,
    is_json_media,
    may_hold_unstorable,
    media_type,
    unstorable,
)
from notifications.service import NOTIFY_GROUP
from notifications.sources import NAMES, VENDOR_HEADERS, Source, source_for
from notifications.sources.base import Credential, InboundRequest
from opentelemetry.trace import SpanKind

log = logging.getLogger("crewlet.notifications.edge")

#: inbound_delivery ids derive from (source, delivery id): a retry is one row.
DELIVERY_ID_NAMESPACE = uuid.UUID("9a7d1c2e-4f36-5b0a-8e21-7765626864c5")
#: What a delivery to a verified surface whose secret variable is unset is told.
SECRET_NOT_CONFIGURED = "webhook secret is not configured on this server"
#: Headers kept on the raw_webhook: never a signature, a token or a cookie.
KEPT_HEADERS = ("user-agent", *VENDOR_HEADERS, TRACEPARENT_HEADER)


def delivery_trace_id(source: str, delivery_id: str) -> str:
    """The trace a delivery opens when its request carries no ``traceparent``: derived from its id.

    A vendor's retry of a delivery is answered with the trace id of the first
    try, which holds the delivery's record and the turns it started (the
    retry is dropped by routing, its own record is the first one's row).
    """
    return uuid.uuid5(DELIVERY_ID_NAMESPACE, f"trace:{source}:{delivery_id}").hex


@dataclass(frozen=True)
class EdgeResponse:
    """The answer: ``body`` as JSON, or an empty body when None (Slack's acknowledgement of an interaction)."""

    status: int
    body: Optional[dict[str, Any]]
    headers: dict[str, str] = field(default_factory=dict)


def refuse(status: int, reason: str, **headers: str) -> EdgeResponse:
    """A refusal: JSON ``{"error": <reason>}``, the one shape every refusal of a delivery has."""
    return EdgeResponse(status, {"error": reason}, dict(headers))


def is_json_content_type(content_type: str) -> bool:
    return is_json_media(media_type(content_type))


def verify(source: Source, surface: Surface, req: InboundRequest, now: float, environ: Mapping[str, str]) -> Optional[tuple[int, str]]:
    """(status, reason) when the request must be refused; None when it may pass."""
    if not surface.verify:
        return None
    secret = environ.get(surface.secret_env, "") if surface.secret_env else ""
    if not secret:
        name = source.name
        key = SURFACE_SECRET_KEYS.get(name, "secret_env")
        what = f"set {surface.secret_env}" if surface.secret_env else f"name its secret with surfaces.{name}.{key}"
        return 401, f"the {name} surface is not configured: {what} (its {SECRET_NOT_CONFIGURED}), or say verify: false for it"
    why = source.verify(secret, req, now)
    return (401, why) if why else None


def verify_with(
    source: Source, credentials: tuple[Credential, ...] | str, req: InboundRequest, now: float, environ: Mapping[str, str]
) -> Optional[tuple[int, str]]:
    """(401, reason) unless one of ``credentials`` (a source's pick of the company's secrets) verifies the request.

    Every secret set is tried, whichever passes: each check is the source's
    constant-time one, and trying them all keeps how many were tried from
    saying which one matched. A pick that is a reason is refused with it.
    """
    if isinstance(credentials, str):
        return 401, credentials
    usable = [(credential, secret) for credential in credentials if (secret := environ.get(credential.env, ""))]
    names = ", ".join(f"{c.env} (named by {c.key})" for c in credentials)
    if not usable and len(credentials) == 1:
        return 401, f"{credentials[0].owner} is not configured: set {names} (its {SECRET_NOT_CONFIGURED})"
    if not usable:
        return 401, f"none of the secrets this delivery may be verified with is set: set one of {names} ({SECRET_NOT_CONFIGURED})"
    reasons = [source.verify(secret, req, now) for _, secret in usable]
    if any(why is None for why in reasons):
        return None
    whose = usable[0][0].owner if len(usable) == 1 else f"each of {', '.join(c.owner for c, _ in usable)}"
    return 401, f"{reasons[0]} (checked with the signing secret of {whose})"


# -- the edge ---------------------------------------------------------------------


@dataclass(eq=False, repr=False)
class Edge:
    """Accepts webhook deliveries into the broker on behalf of one node.

    ``loop`` is the event loop it was made on (None outside one): a request
    arriving on another thread's loop is run there, where the queue lives.
    """

    queue: EventQueue
    holder: CompanyHolder
    _: KW_ONLY
    clock: Callable[[], float] = time.time
    environ: Optional[Mapping[str, str]] = None
    max_body: Optional[int] = None
    loop: Optional[asyncio.AbstractEventLoop] = field(init=False, default=None)
    _inbound_ready: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    def limit(self) -> int:
        return self.max_body if self.max_body else webhook_max_body_bytes()

    async def receive(self, req: InboundRequest) -> EdgeResponse:
        """The whole edge for one request; runs on the queue's own loop when called from another."""
        return await self._on_loop(self._receive(req, authenticated=False))

    async def deliver(self, source: str, body: bytes, *, route: str) -> EdgeResponse:
        """A delivery that came over a socket this node opened: the edge without step 2.

        The socket authenticated itself with the surface's token when it
        connected, so there is no signature to check; everything else (the
        size, the decoding, the storable check, the trace root, the publish,
        the ``inbound_delivery`` record, the acknowledgement) is the webhook
        route's. ``body`` is the frame's JSON exactly as the vendor sent it.
        """
        req = InboundRequest(source=source, body=body, headers={"content-type": JSON_MEDIA}, route=route)
        return await self._on_loop(self._receive(req, authenticated=True))

    async def _on_loop(self, work: Coroutine[Any, Any, EdgeResponse]) -> EdgeResponse:
        loop = self.loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - always awaited
            current = None
        if loop is not None and current is not loop and loop.is_running() and not loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(work, loop)
            return await asyncio.wrap_future(future)
        return await work

    async def _receive(self, req: InboundRequest, *, authenticated: bool) -> EdgeResponse:
        source = source_for(req.source)
        org = self.holder.current()
        surface = org.surfaces.get(req.source) if source is not None and source.company_surface else None
        if source is None or (source.company_surface and surface is None):
            return refuse(404, f"no webhook route for {req.source!r}; the sources are {', '.join(NAMES)}")
        limit = self.limit()
        if len(req.body) > limit:
            return refuse(413, f"the body is {len(req.body)} bytes, over the {limit}-byte limit")
        refused = None if authenticated else await self._authenticate(source, surface, req)
        if refused is not None:
            log.warning("webhook_refused", extra={"source": source.name, "status": refused[0], "reason": refused[1]})
            return refuse(*refused)
        try:
            payload = decode_body(req.body, req.content_type, source.form)
        except UnsupportedMedia as exc:
            return refuse(415, str(exc))
        except JSONTooDeep as exc:
            return refuse(400, f"{exc}: the limit is {MAX_JSON_DEPTH}")
        except MalformedForm as exc:
            return refuse(400, f"malformed form body: {exc}")
        except ValueError as exc:
            return refuse(400, f"malformed JSON: {exc}")
        if not isinstance(payload, dict):
            return refuse(400, f"the body must be a JSON object, not a {type(payload).__name__}")
        meta = source.meta(req)
        invalid = source.validate(payload, meta) if source.validate is not None else None
        problem = invalid or self._unstorable(req, source, payload, meta)
        if problem is not None:
            log.warning("webhook_refused", extra={"source": source.name, "status": 400, "reason": problem})
            return refuse(400, problem if invalid else f"{problem}; nothing downstream can store it, so the delivery is refused")
        handshake = source.handshake(payload)
        if handshake is not None:
            if handshake.refusal:
                return refuse(400, handshake.refusal)
            return EdgeResponse(200, dict(handshake.answer))
        return await self._accept(req, source, payload, meta)

    async def _authenticate(self, source: Source, surface: Optional[Surface], req: InboundRequest) -> Optional[tuple[int, str]]:
        """The company secret's check for a company surface (or the secret its source picks); the source's own (a store-held token) otherwise."""
        org = self.holder.current()
        if source.authenticate is not None:
            return await source.authenticate(req, org)
        assert surface is not None
        environ = self.environ if self.environ is not None else os.environ
        picked = source.credentials(req, org) if source.credentials is not None and surface.verify else None
        if picked is not None:
            return verify_with(source, picked, req, self.clock(), environ)
        return verify(source, surface, req, self.clock(), environ)

    def _unstorable(self, req: InboundRequest, source: Source, payload: dict[str, Any], meta: DeliveryMeta) -> Optional[str]:
        """What in the delivery no store downstream can hold (NUL, a lone surrogate), or None.

        Checked once here, over everything the delivery carries onward: the
        body, the JSON documents it embeds as strings, and the event name and
        delivery id the headers or the query give it. Accepting such a delivery
        would be a 202 whose routing fails on every redelivery.
        """
        parser = source.parser
        problem = None
        # A form body percent-encodes what JSON escapes: only its decoded fields tell.
        if may_hold_unstorable(req.body) or not is_json_media(media_type(req.content_type)):
            problem = unstorable(payload)
            for where, document in parser.embedded(payload):
                problem = problem or unstorable(document, where)
        problem = problem or unstorable(
            {"event name": parser.event_name(payload, meta), "delivery id": parser.delivery_id(payload, meta)}
        )
        return problem or unstorable({k: req.header(k) for k in KEPT_HEADERS if req.header(k)}, "header")

    async def _accept(self, req: InboundRequest, source: Source, payload: dict[str, Any], meta: DeliveryMeta) -> EdgeResponse:
        parser = source.parser
        event_name = parser.event_name(payload, meta)
        delivery_id = parser.delivery_id(payload, meta) or source.anonymous_id(req.body)
        inbound_parent = parse_traceparent(req.header(TRACEPARENT_HEADER)) if req.header(TRACEPARENT_HEADER) else None
        headers = {k: req.header(k) for k in KEPT_HEADERS if req.header(k)}
        with start_span(
            messaging_span_name(OPERATION_SEND, topics.NOTIFICATIONS_INBOUND),
            parent=inbound_parent,
            root_trace_id=delivery_trace_id(req.source, delivery_id),
            kind=SpanKind.PRODUCER,  # the request's server span is the HTTP instrumentation's
            attributes={
                "crewlet.source": req.source,
                "crewlet.delivery_id": delivery_id,
                "crewlet.event_name": event_name,
                **messaging_attributes(OPERATION_SEND, topics.NOTIFICATIONS_INBOUND),
            },
        ):
            trace = trace_of()
            # The raw_webhook (what routing reads) and the inbound_delivery (the record) name the delivery alike.
            named = dict(
                surface=parser.surface,
                event_name=event_name,
                provider=req.source,
                delivery_id=delivery_id,
                route=req.route,
                content_type=req.content_type,
            )
            raw = RawWebhook(**named, headers=headers)
            raw.set_raw_bytes(req.body)
            record_body = InboundDelivery(**named)
            record_body.set_raw_bytes(req.body)
            raw_event = events.new(raw, trace, source=req.source)
            record = events.new(
                record_body,
                trace,
                source=req.source,
                event_id=str(uuid.uuid5(DELIVERY_ID_NAMESPACE, f"{req.source}:{delivery_id}")),
            )
            try:
                await self._ensure_inbound()
                await self.queue.publish(topics.NOTIFICATIONS_INBOUND, raw_event)
                await self.queue.publish(topics.event(record.type), record)
            except QueueError as exc:
                log.error(
                    "webhook_broker_unavailable",
                    extra={"source": req.source, "delivery_id": delivery_id, "error": f"{type(exc).__name__}: {exc}"},
                )
                return refuse(503, f"the broker is unavailable, retry later ({type(exc).__name__})", **{"Retry-After": "5"})
        log.info(
            "webhook_accepted",
            extra={"source": req.source, "event_name": event_name, "delivery_id": delivery_id, "trace_id": trace.trace_id, "bytes": len(req.body)},
        )
        trace_header = {"X-Crewlet-Trace-Id": trace.trace_id}
        ack = source.acknowledge(payload, self.holder.current()) if source.acknowledge is not None else None
        if ack is not None:
            return EdgeResponse(200, dict(ack.body) if ack.body is not None else None, trace_header)
        return EdgeResponse(
            202,
            {"accepted": True, "source": req.source, "event": event_name, "delivery_id": delivery_id, "trace_id": trace.trace_id},
            trace_header,
        )

    async def _ensure_inbound(self) -> None:
        """The inbound stream keeps a publish only while its group exists: make sure it does, once."""
        if not self._inbound_ready:
            await self.queue.ensure_subscription(topics.NOTIFICATIONS_INBOUND, NOTIFY_GROUP)
            self._inbound_ready = True


__all__ = [
    "Edge",
    "EdgeResponse",
    "InboundRequest",
    "KEPT_HEADERS",
    "is_json_content_type",
    "refuse",
    "verify",
    "verify_with",
]
