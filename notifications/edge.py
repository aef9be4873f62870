"""The webhook edge: verify a delivery, open its trace, hand it to the broker, answer.

Framework-neutral (``Edge.receive`` takes an :class:`InboundRequest`), so the
Django view (``notifications.views``) and a later Mattermost socket client
share one path. In order:

1. size — over the limit (``CREWLET_WEBHOOK_MAX_BODY_BYTES``, default 1 MiB)
   is 413, checked from ``Content-Length`` before the body is read and again
   on the bytes;
2. verification, per vendor, constant-time (``hmac.compare_digest``):

   * Slack — ``v0`` signing: ``X-Slack-Signature`` is
     ``v0=HMAC-SHA256(secret, "v0:<X-Slack-Request-Timestamp>:<body>")``,
     and the timestamp (whole Unix seconds, nothing else) must be within 5
     minutes of now;
   * GitHub — ``X-Hub-Signature-256: sha256=HMAC-SHA256(secret, body)``;
   * Jira / Confluence — BOTH forms are accepted: the ``X-Hub-Signature:
     sha256=<HMAC-SHA256(secret, body)>`` header a Jira Cloud webhook with a
     secret sends (WebSub style), or, for senders that cannot sign (a
     Confluence webhook, Jira automation's "Send web request"), the shared
     secret as a ``?secret=<token>`` query parameter on the registered URL.
     A request that carries the header is judged by the header alone;
   * Mattermost — a token: ``Authorization: Token <t>`` (or ``Bearer``), or
     a ``token`` field in the JSON body (what outgoing webhooks send; the
     only verification that reads the body, with the depth-limited decoder).

   Nothing else of the body is decoded before this step. A surface whose
   secret variable is unset is refused (401, "not configured", naming the
   variable) unless the company says ``verify: false`` for it;
3. content type — JSON only (``application/json`` or ``+json``), else 415;
4. JSON — decoded with a nesting limit (``MAX_JSON_DEPTH``); a malformed
   body, one nested deeper, or one that is not an object, is 400;
5. storable — a NUL or a lone surrogate anywhere in the body (a key or a
   string, or a JSON document it carries as a string), the event name or the
   delivery id is 400 naming where: no store downstream can hold it;
6. Slack's ``url_verification`` is answered with its challenge (200);
7. under a span that honours an inbound W3C ``traceparent``, the delivery is
   published as a ``raw_webhook`` to ``crewlet.notifications.inbound``, then
   its ``inbound_delivery`` record (label ``webhook:<event>`` /
   ``forge:<event>`` / ``socket:posted``, the provider's exact bytes) to
   ``crewlet.events.inbound_delivery`` — and only then 202. The record's id
   derives from the provider's delivery id, so a vendor's retry is one row.
   The broker unreachable (either publish) is 503, so the vendor retries;
   routing drops the retry of a delivery that did get through.

Every refusal is JSON ``{"error": <reason>}`` with a reason a person can act on.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from crewlet import events
from crewlet.events.types import InboundDelivery, RawWebhook
from crewlet.org import SURFACE_SECRET_KEYS, CompanyHolder, Surface
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from crewlet.queue.errors import QueueError
from crewlet.tracing import parse_traceparent, start_span, trace_of
from notifications.parsers import (
    MAX_JSON_DEPTH,
    DeliveryMeta,
    JSONTooDeep,
    Parser,
    body_digest_id,
    load_json,
    may_hold_unstorable,
    parser_for,
    unstorable,
)
from opentelemetry.trace import SpanKind

log = logging.getLogger("crewlet.notifications.edge")

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
MAX_BODY_SETTING = "CREWLET_WEBHOOK_MAX_BODY_BYTES"
SLACK_TOLERANCE_S = 300.0
#: Slack's timestamp is Unix seconds as decimal digits; anything else (``NaN``,
#: ``inf``, ``1e400``, a fraction) is refused, since a float NaN or infinity
#: compares as "within the window" or defeats it.
_SLACK_STAMP = re.compile(r"[0-9]{1,12}")
SOURCES = tuple(SURFACE_SECRET_KEYS)
INBOUND_GROUP = "notify"
#: inbound_delivery ids derive from (source, delivery id): a retry is one row.
DELIVERY_ID_NAMESPACE = uuid.UUID("9a7d1c2e-4f36-5b0a-8e21-7765626864c5")
#: What a delivery to a verified surface whose secret variable is unset is told.
SECRET_NOT_CONFIGURED = "webhook secret is not configured on this server"
#: Headers kept on the raw_webhook: never a signature, a token or a cookie.
KEPT_HEADERS = (
    "user-agent",
    "x-github-event",
    "x-github-delivery",
    "x-github-hook-id",
    "x-slack-retry-num",
    "x-slack-retry-reason",
    "x-atlassian-webhook-identifier",
    "x-atlassian-webhook-retry",
    "x-atlassian-webhook-flow",
    "traceparent",
)


@dataclass(frozen=True)
class InboundRequest:
    """One HTTP delivery as the edge needs it; header names lower-case."""

    source: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    route: str = ""

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "") or ""

    @property
    def content_type(self) -> str:
        return self.header("content-type")


@dataclass(frozen=True)
class EdgeResponse:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def _refuse(status: int, reason: str, **headers: str) -> EdgeResponse:
    return EdgeResponse(status, {"error": reason}, dict(headers))


def max_body_bytes() -> int:
    """The body limit: Django setting, else the environment variable, else 1 MiB."""
    value: Any = None
    try:
        from django.conf import settings

        value = getattr(settings, MAX_BODY_SETTING, None)
    except Exception:  # pragma: no cover - settings not configured (a bare script)
        value = None
    if value is None:
        value = os.environ.get(MAX_BODY_SETTING) or DEFAULT_MAX_BODY_BYTES
    try:
        limit = int(value)
    except (TypeError, ValueError):
        return DEFAULT_MAX_BODY_BYTES
    return limit if limit > 0 else DEFAULT_MAX_BODY_BYTES


def is_json_content_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _hmac_hex(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


# -- verification (each returns None when the request is authentic, else why not) ----


def verify_slack(secret: str, req: InboundRequest, now: float) -> Optional[str]:
    signature = req.header("x-slack-signature")
    stamp = req.header("x-slack-request-timestamp")
    if not signature or not stamp:
        return "missing X-Slack-Signature or X-Slack-Request-Timestamp"
    if not _SLACK_STAMP.fullmatch(stamp):
        return "X-Slack-Request-Timestamp is not a whole number of seconds"
    sent = int(stamp)
    if abs(now - sent) > SLACK_TOLERANCE_S:
        return f"stale request: X-Slack-Request-Timestamp is more than {SLACK_TOLERANCE_S:g}s from now"
    expected = "v0=" + _hmac_hex(secret, b"v0:" + stamp.encode("ascii", "replace") + b":" + req.body)
    if not _same(signature, expected):
        return "X-Slack-Signature does not match the body"
    return None


def verify_github(secret: str, req: InboundRequest) -> Optional[str]:
    signature = req.header("x-hub-signature-256")
    if not signature:
        return "missing X-Hub-Signature-256"
    if not _same(signature, "sha256=" + _hmac_hex(secret, req.body)):
        return "X-Hub-Signature-256 does not match the body"
    return None


def verify_atlassian(secret: str, req: InboundRequest) -> Optional[str]:
    signature = req.header("x-hub-signature")
    if signature:
        if not _same(signature, "sha256=" + _hmac_hex(secret, req.body)):
            return "X-Hub-Signature does not match the body"
        return None
    token = req.query.get("secret", "")
    if not token:
        return "missing X-Hub-Signature (sha256=...) or ?secret= token"
    if not _same(token, secret):
        return "the ?secret= token does not match"
    return None


def verify_mattermost(secret: str, req: InboundRequest) -> Optional[str]:
    auth = req.header("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() not in ("token", "bearer") or not token.strip():
            return "Authorization must be 'Token <token>'"
        return None if _same(token.strip(), secret) else "the Mattermost token does not match"
    try:
        body = load_json(req.body)
    except ValueError:
        return "missing 'Authorization: Token <token>' header, and the body is not JSON a token field can be read from"
    token = body.get("token") if isinstance(body, dict) else None
    if not isinstance(token, str) or not token:
        return "missing 'Authorization: Token <token>' header or a token field"
    return None if _same(token, secret) else "the Mattermost token does not match"


def verify(source: str, surface: Surface, req: InboundRequest, now: float, environ: Mapping[str, str]) -> Optional[tuple[int, str]]:
    """(status, reason) when the request must be refused; None when it may pass."""
    if not surface.verify:
        return None
    secret = environ.get(surface.secret_env, "") if surface.secret_env else ""
    if not secret:
        key = SURFACE_SECRET_KEYS.get(source, "secret_env")
        what = f"set {surface.secret_env}" if surface.secret_env else f"name its secret with surfaces.{source}.{key}"
        return 401, f"the {source} surface is not configured: {what} (its {SECRET_NOT_CONFIGURED}), or say verify: false for it"
    if source == "slack":
        why = verify_slack(secret, req, now)
    elif source == "github":
        why = verify_github(secret, req)
    elif source in ("jira", "confluence"):
        why = verify_atlassian(secret, req)
    elif source == "mattermost":
        why = verify_mattermost(secret, req)
    else:  # pragma: no cover - the route only admits known sources
        why = f"no verification is defined for {source}"
    return (401, why) if why else None


# -- the edge ---------------------------------------------------------------------


class Edge:
    """Accepts webhook deliveries into the broker on behalf of one node."""

    def __init__(
        self,
        queue: EventQueue,
        holder: CompanyHolder,
        *,
        clock: Callable[[], float] = time.time,
        environ: Optional[Mapping[str, str]] = None,
        max_body: Optional[int] = None,
    ) -> None:
        self.queue = queue
        self.holder = holder
        self.clock = clock
        self.environ = environ
        self.max_body = max_body
        self._inbound_ready = False
        try:
            self.loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    def limit(self) -> int:
        return self.max_body if self.max_body else max_body_bytes()

    async def receive(self, req: InboundRequest) -> EdgeResponse:
        """The whole edge for one request; runs on the queue's own loop when called from another."""
        loop = self.loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - always awaited
            current = None
        if loop is not None and current is not loop and loop.is_running() and not loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(self._receive(req), loop)
            return await asyncio.wrap_future(future)
        return await self._receive(req)

    async def _receive(self, req: InboundRequest) -> EdgeResponse:
        source = req.source
        parser = parser_for(source)
        org = self.holder.current()
        surface = org.surfaces.get(source)
        if parser is None or surface is None:
            return _refuse(404, f"no webhook route for {source!r}; the sources are {', '.join(SOURCES)}")
        limit = self.limit()
        if len(req.body) > limit:
            return _refuse(413, f"the body is {len(req.body)} bytes, over the {limit}-byte limit")
        refused = verify(source, surface, req, self.clock(), self.environ if self.environ is not None else os.environ)
        if refused is not None:
            log.warning("webhook_refused", extra={"source": source, "status": refused[0], "reason": refused[1]})
            return _refuse(*refused)
        if not is_json_content_type(req.content_type):
            return _refuse(415, f"content type {req.content_type or '(none)'!r} is not accepted: send application/json")
        try:
            payload = load_json(req.body)
        except JSONTooDeep as exc:
            return _refuse(400, f"{exc}: the limit is {MAX_JSON_DEPTH}")
        except ValueError as exc:
            return _refuse(400, f"malformed JSON: {exc}")
        if not isinstance(payload, dict):
            return _refuse(400, f"the body must be a JSON object, not a {type(payload).__name__}")
        problem = self._unstorable(req, parser, payload)
        if problem is not None:
            log.warning("webhook_refused", extra={"source": source, "status": 400, "reason": problem})
            return _refuse(400, f"{problem}; nothing downstream can store it, so the delivery is refused")
        if source == "slack" and payload.get("type") == "url_verification":
            challenge = payload.get("challenge")
            if not isinstance(challenge, str):
                return _refuse(400, "url_verification without a challenge string")
            return EdgeResponse(200, {"challenge": challenge})
        return await self._accept(req, parser, payload)

    def _unstorable(self, req: InboundRequest, parser: Parser, payload: dict[str, Any]) -> Optional[str]:
        """What in the delivery no store downstream can hold (NUL, a lone surrogate), or None.

        Checked once here, over everything the delivery carries onward: the
        body, the JSON documents it embeds as strings, and the event name and
        delivery id the headers or the query give it. Accepting such a delivery
        would be a 202 whose routing fails on every redelivery.
        """
        problem = None
        if may_hold_unstorable(req.body):
            problem = unstorable(payload)
            for where, document in parser.embedded(payload):
                problem = problem or unstorable(document, where)
        meta = self._meta(req)
        problem = problem or unstorable(
            {"event name": parser.event_name(payload, meta), "delivery id": parser.delivery_id(payload, meta)}
        )
        return problem or unstorable({k: req.header(k) for k in KEPT_HEADERS if req.header(k)}, "header")

    def _meta(self, req: InboundRequest) -> DeliveryMeta:
        source = req.source
        if source == "github":
            return DeliveryMeta(event_name=req.header("x-github-event"), delivery_id=req.header("x-github-delivery"), query=dict(req.query))
        if source in ("jira", "confluence"):
            return DeliveryMeta(
                event_name=req.query.get("event", ""),
                delivery_id=req.header("x-atlassian-webhook-identifier"),
                query=dict(req.query),
            )
        return DeliveryMeta(query=dict(req.query))

    async def _accept(self, req: InboundRequest, parser: Parser, payload: dict[str, Any]) -> EdgeResponse:
        meta = self._meta(req)
        event_name = parser.event_name(payload, meta)
        delivery_id = parser.delivery_id(payload, meta) or body_digest_id(req.body)
        inbound_parent = parse_traceparent(req.header("traceparent")) if req.header("traceparent") else None
        headers = {k: req.header(k) for k in KEPT_HEADERS if req.header(k)}
        with start_span(
            "webhook.receive",
            parent=inbound_parent,
            kind=SpanKind.SERVER,
            attributes={"crewlet.source": req.source, "crewlet.delivery_id": delivery_id, "crewlet.event_name": event_name},
        ):
            trace = trace_of()
            raw = RawWebhook(
                surface=parser.surface,
                event_name=event_name,
                provider=req.source,
                delivery_id=delivery_id,
                route=req.route,
                content_type=req.content_type,
                headers=headers,
            )
            raw.set_raw_bytes(req.body)
            record_body = InboundDelivery(
                surface=parser.surface,
                event_name=event_name,
                provider=req.source,
                delivery_id=delivery_id,
                route=req.route,
                content_type=req.content_type,
            )
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
                return _refuse(503, f"the broker is unavailable, retry later ({type(exc).__name__})", **{"Retry-After": "5"})
        log.info(
            "webhook_accepted",
            extra={"source": req.source, "event_name": event_name, "delivery_id": delivery_id, "trace_id": trace.trace_id, "bytes": len(req.body)},
        )
        return EdgeResponse(
            202,
            {"accepted": True, "source": req.source, "event": event_name, "delivery_id": delivery_id, "trace_id": trace.trace_id},
            {"X-Crewlet-Trace-Id": trace.trace_id},
        )

    async def _ensure_inbound(self) -> None:
        """The inbound stream keeps a publish only while its group exists: make sure it does, once."""
        if not self._inbound_ready:
            await self.queue.ensure_subscription(topics.NOTIFICATIONS_INBOUND, INBOUND_GROUP)
            self._inbound_ready = True


# -- the process's edge (the engine installs it; the view reads it) -----------------

_EDGE: Optional[Edge] = None


def install(queue: EventQueue, holder: CompanyHolder, **kwargs: Any) -> Edge:
    """Make this process's webhook routes publish through ``queue`` (call on the queue's loop)."""
    global _EDGE
    _EDGE = Edge(queue, holder, **kwargs)
    return _EDGE


def uninstall(edge: Optional[Edge] = None) -> None:
    """Remove the installed edge (only ``edge`` when given, so a stale stop cannot remove a newer one)."""
    global _EDGE
    if edge is None or _EDGE is edge:
        _EDGE = None


def current_edge() -> Optional[Edge]:
    return _EDGE


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "Edge",
    "EdgeResponse",
    "InboundRequest",
    "MAX_BODY_SETTING",
    "SLACK_TOLERANCE_S",
    "current_edge",
    "install",
    "is_json_content_type",
    "max_body_bytes",
    "uninstall",
    "verify",
    "verify_atlassian",
    "verify_github",
    "verify_mattermost",
    "verify_slack",
]
