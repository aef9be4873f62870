"""The notify router: routes inbound deliveries to agent seats' inboxes.

Design (Routing; Distributed Tracing § NotificationSkipped). It consumes
``crewlet.notifications.inbound`` in ONE fleet-wide group (``notify``), so
whichever node wins a delivery routes it — from the organization current at
that moment (``CompanyHolder.current()`` per delivery), never from which
seats this node runs.

For each delivery, under a span that is a child of the edge's:

1. read it as the edge did (its content type: JSON, or its source's form;
   the edge's nesting limit) — not a ``raw_webhook``, or a body that is not
   a JSON object: ``unreadable delivery payload``;
2. find its parser — ``no parser for this source`` — and its surface in the
   company — ``this source was disconnected``;
3. parse it — :class:`~notifications.parsers.ParseError` (anything a parser
   raises, or a NUL or lone surrogate in what it read): ``parse failed``
   with the parser's error as ``detail``, and the delivery is acked — a
   payload that cannot be parsed now never can be, so it is not retried;
4. the parser's own filtering (a system or deleted post, an edit) is logged
   at debug (``slack_event_skipped``, ``mattermost_post_skipped``), never
   recorded;
5. drop a vendor retry: the first delivery of an id claims it in the
   coordination store (``SeenDelivery``); a retry is logged and acked. A
   broker redelivery of the SAME inbound event passes (its routing may have
   died half way), and its wakes have derived ids, so the inbox's same-id
   dedupe and the completion ledger (keyed on ``delivery_id``) make a resend
   a no-op rather than a second turn;
6. resolve recipients — mentioned, addressed in a DM, assigned, asked for
   review, or following the thread — to seats (a chat thread reply nobody
   follows, and a chat seat's own post, are filtering too: debug, never
   recorded). Each drop publishes ``notification_skipped``: ``no seat
   matches this recipient``, ``human seat`` (info, not a warning),
   ``self-action: the recipient caused this event`` (the routing gate),
   ``rate limit exceeded`` (the valve);
7. publish the wake to each recipient agent seat's inbox, record it on
   ``crewlet.events.external_notification`` (same event id: one row), and
   record that the seat follows the conversation.

Loop guard: a FOLLOWER is not woken by another agent seat's post unless
that post mentions or addresses it — two agents following one thread would
otherwise wake each other forever. Agents reach each other with a mention.
"""
from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from django.db import DatabaseError

from crewlet import events
from crewlet.events import Event
from crewlet.queue.emit import Emitter
from crewlet.base.logfmt import short_reason
from crewlet.events.types import (
    SKIP_HUMAN_SEAT,
    SKIP_NO_PARSER,
    SKIP_NO_SEAT,
    SKIP_PARSER_REFUSED,
    SKIP_PAYLOAD_UNREADABLE,
    SKIP_RATE_LIMITED,
    SKIP_ROUTING_GATE_REFUSED,
    SKIP_SOURCE_DISCONNECTED,
    ExternalNotification,
    NotificationSkipped,
    RawWebhook,
)
from crewlet.company.org import CompanyHolder, Organization, Seat
from crewlet.queue import topics
from crewlet.queue.contract import Delivery, EventQueue, Outcome, Subscription
from crewlet.queue.errors import QueueError
from crewlet.events.tracing import OPERATION_PROCESS, child_span, messaging_attributes, messaging_span_name, trace_of
from notifications import store
from notifications.parsers import (
    JSON_MEDIA,
    WHY_FOLLOWER,
    DeliveryMeta,
    MalformedForm,
    ParseError,
    Parsed,
    Parser,
    Recipient,
    decode_body,
    storable_text,
)
from notifications.sources import source_for
from notifications.sources.base import default_filtered_event, seat_for, seat_of_recipient

log = logging.getLogger("crewlet.notifications")

#: The ONE fleet-wide consumer group on crewlet.notifications.inbound.
NOTIFY_GROUP = "notify"
#: Wake ids derive from the inbound event and the seat, so a redelivered
#: delivery re-publishes the SAME wake (collapsed by the inbox's same-id dedupe).
WAKE_ID_NAMESPACE = uuid.UUID("3c0e7a64-2b1f-5a8e-8f0d-6e6f74696679")

RateCounterFn = Callable[[str, int], Awaitable[int]]
#: How much of an error a log line or a skip's detail quotes.
REASON_LIMIT = 300
SKIP_DETAIL_LIMIT = 500


def chat_skip_log(source: str) -> str:
    """The debug event a chat parser's filtering is logged under (the source names it)."""
    found = source_for(source)
    return found.filtered_log if found is not None else default_filtered_event(source)


class RateValve:
    """``notification_rate_limit``: at most N wakes per seat per second, counted fleet-wide.

    The counters live in the coordination store (one row per seat and
    window, incremented atomically), so every node of a fleet counts into the
    same row. A rate below one per second widens the window (0.5/s: one wake
    per 2 s). The valve FAILS OPEN: a store it cannot reach lets the wake
    through and says so at warning — a safety valve must not become an outage.
    """

    def __init__(self, counter: Optional[RateCounterFn] = None, clock: Callable[[], float] = time.time) -> None:
        self._counter = counter or store.arate_hit
        self._clock = clock

    @staticmethod
    def window(limit_per_s: float) -> tuple[int, int]:
        """(window length in seconds, wakes allowed in it)."""
        window_s = max(1, math.ceil(1.0 / limit_per_s)) if limit_per_s < 1 else 1
        return window_s, max(1, math.floor(limit_per_s * window_s))

    async def admit(self, seat: str, limit_per_s: float) -> bool:
        if not limit_per_s or limit_per_s <= 0:
            return True
        window_s, allowed = self.window(limit_per_s)
        start = int(self._clock() // window_s * window_s)
        try:
            count = await self._counter(seat, start)
        except (DatabaseError, OSError, RuntimeError) as exc:
            log.warning(
                "notification_rate_store_unavailable",
                extra={"seat": seat, "error": f"{type(exc).__name__}: {exc}", "fail_open": True},
            )
            return True
        return count <= allowed


@dataclass
class RouteResult:
    """What routing one delivery did (for tests, benchmarks and the socket client)."""

    source: str = ""
    parsed: Optional[Parsed] = None
    wakes: list[tuple[str, Event]] = field(default_factory=list)
    skips: list[Event] = field(default_factory=list)
    filtered: list[str] = field(default_factory=list)
    duplicate: bool = False

    @property
    def woken(self) -> list[str]:
        return [h for h, _ in self.wakes]

    @property
    def reasons(self) -> list[str]:
        return [s.data.reason for s in self.skips]


@dataclass
class _Candidate:
    seat: Seat
    recipient: Recipient


class NotifyRouter:
    """Consumes ``crewlet.notifications.inbound`` in the ``notify`` group and routes each delivery."""

    def __init__(
        self,
        queue: EventQueue,
        holder: CompanyHolder,
        *,
        valve: Optional[RateValve] = None,
        group: str = NOTIFY_GROUP,
        emitter: Optional[Emitter] = None,
    ) -> None:
        self.queue = queue
        self.holder = holder
        self.valve = valve or RateValve()
        self.group = group
        #: Publishes the records (a wake's, a skip's); a broker away for a moment is retried.
        self.emitter = emitter or Emitter(queue)
        self._sub: Optional[Subscription] = None
        self.routed = 0

    async def start(self) -> None:
        """Create the fleet-wide subscription (the edge's publishes need it to exist) and attach."""
        if self._sub is not None:
            return
        await self.queue.ensure_subscription(topics.NOTIFICATIONS_INBOUND, self.group)
        self._sub = await self.queue.subscribe(topics.NOTIFICATIONS_INBOUND, self.group, self._handle)
        log.info("notify_service_started", extra={"group": self.group, "node": self.queue.node})

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.detach()
            except QueueError:
                log.warning("notify_service_detach_failed", exc_info=True)
            log.info("notify_service_stopped", extra={"group": self.group})

    async def _handle(self, delivery: Delivery) -> Outcome:
        """Route one delivery; a failure is one short log line and a NAK, so the delivery is tried again.

        A payload's own fault never gets here (routing records it as a skip
        and acks), so what does is a broker or store that failed this time:
        its redelivery re-publishes the same wake ids, so nothing is doubled.
        The line carries the exception's type and message, never its
        traceback: a failing delivery is tried up to 25 times.
        """
        try:
            await self.route(delivery.event)
        except Exception as exc:
            log.warning(
                "notify_route_failed",
                extra={"event_id": delivery.event.id, "remaining": delivery.remaining, "error": short_reason(exc, REASON_LIMIT)},
            )
            return Outcome.NAK
        return Outcome.ACK

    # -- routing --------------------------------------------------------------

    async def route(self, event: Event) -> RouteResult:
        """Route one inbound delivery (the handler's body; public for the socket client and tests)."""
        raw = event.data if isinstance(event.data, RawWebhook) else None
        source = (raw.provider if raw is not None else "") or event.source or ""
        result = RouteResult(source=source)
        attributes = {"crewlet.source": source, "crewlet.delivery_event": event.id}
        attributes.update(messaging_attributes(OPERATION_PROCESS, topics.NOTIFICATIONS_INBOUND, group=self.group, message_id=event.id))
        with child_span(event, messaging_span_name(OPERATION_PROCESS, topics.NOTIFICATIONS_INBOUND), attributes=attributes):
            await self._route(event, raw, source, result)
        self.routed += 1
        return result

    async def _route(self, event: Event, raw: Optional[RawWebhook], source: str, result: RouteResult) -> None:
        if raw is None:
            await self._skip(result, SKIP_PAYLOAD_UNREADABLE, detail=f"a {event.type} event is not a webhook delivery")
            return
        found = source_for(source)
        try:
            # What the edge accepted decodes the same way here; a delivery published without a content type is JSON.
            payload = decode_body(raw.raw_bytes(), raw.content_type or JSON_MEDIA, found.form if found is not None else None)
        except ValueError as exc:
            what = "a form" if isinstance(exc, MalformedForm) else "JSON"
            await self._skip(result, SKIP_PAYLOAD_UNREADABLE, detail=f"not {what}: {exc}", event_name=raw.event_name, delivery_id=raw.delivery_id)
            return
        if not isinstance(payload, dict):
            await self._skip(
                result, SKIP_PAYLOAD_UNREADABLE, detail=f"a JSON {type(payload).__name__}, not an object", delivery_id=raw.delivery_id
            )
            return
        if found is None:
            await self._skip(result, SKIP_NO_PARSER, detail=f"source {source or '(none)'!r}", delivery_id=raw.delivery_id)
            return
        parser = found.parser
        org = self.holder.current()
        if found.company_surface and source not in org.surfaces:
            await self._skip(result, SKIP_SOURCE_DISCONNECTED, detail=f"the company has no {source} surface", delivery_id=raw.delivery_id)
            return
        meta = DeliveryMeta(event_name=raw.event_name, delivery_id=raw.delivery_id, route=raw.route)
        try:
            parsed = parser(payload, meta)
        except ParseError as exc:
            await self._skip(result, SKIP_PARSER_REFUSED, detail=str(exc), event_name=raw.event_name, delivery_id=raw.delivery_id)
            return
        result.parsed = parsed

        if parsed.filtered:  # concerns nobody, retried or not: no store write for it
            self._filtered(result, parsed, parsed.filtered)
            return
        sender_seat = self._seat_of(org, parser, parsed.sender, parsed.sender_aliases)
        direct, unmatched = self._direct(org, parser, parsed)
        claims = store.DeliveryClaim(True, None, {})
        if parsed.delivery_id:
            upfront = [key for c in direct if (key := self._upfront_wake_key(org, parsed, c.seat, sender_seat))]
            claims = await self._claim_delivery(f"delivery:{source}:{parsed.delivery_id}", event.id, parsed, upfront)
            if not claims.claimed:
                result.duplicate = True
                log.info("notification_duplicate_delivery", extra={"source": source, "delivery_id": parsed.delivery_id})
                return

        candidates = await self._candidates(org, parsed, direct, claims.followers, sender_seat)
        for recipient in unmatched:
            await self._skip(result, SKIP_NO_SEAT, detail=f"{recipient.why} {recipient.identity}", parsed=parsed, recipient=recipient.identity)
        if not candidates:
            if not unmatched:
                self._filtered(result, parsed, "thread reply not followed" if parsed.thread_reply else "not addressed to a seat")
            return
        for cand in candidates:
            await self._deliver(org, parsed, event, cand, sender_seat, result, claims.wakes)

    @staticmethod
    def _wake_key(seat: Seat, parsed: Parsed) -> str:
        """The dedupe key of waking ``seat`` for this chat message or delivery ("" when it names neither)."""
        message = parsed.message_id or parsed.delivery_id
        return f"wake:{seat.handle}:{parsed.source}:{message}" if message else ""

    def _upfront_wake_key(self, org: Organization, parsed: Parsed, seat: Seat, sender_seat: Optional[Seat]) -> str:
        """The wake key of a direct recipient that :meth:`_deliver` would claim with nothing to ask first, else "".

        That is an agent seat that did not cause the event, while the rate
        valve is off: no check between here and its claim reads the store,
        so its claim may ride on the delivery's trip. With the valve on, the
        claim waits for the valve's answer, as a follower's waits for the
        followers.
        """
        if not seat.is_agent or (sender_seat is not None and sender_seat.handle == seat.handle):
            return ""
        if org.rate_limit_per_s and org.rate_limit_per_s > 0:
            return ""
        return self._wake_key(seat, parsed)

    def _direct(self, org: Organization, parser: Parser, parsed: Parsed) -> tuple[list[_Candidate], list[Recipient]]:
        """The recipients resolved to seats (first mention of each seat wins), and the identities no seat matches."""
        by_handle: dict[str, _Candidate] = {}
        unmatched: list[Recipient] = []
        for r in parsed.recipients:
            seat = seat_of_recipient(org, parser, r)
            if seat is None:
                unmatched.append(r)
            elif seat.handle not in by_handle:
                by_handle[seat.handle] = _Candidate(seat, r)
        return list(by_handle.values()), unmatched

    async def _candidates(
        self, org: Organization, parsed: Parsed, direct: list[_Candidate], following: Optional[list[str]], sender_seat: Optional[Seat]
    ) -> list[_Candidate]:
        """The direct recipients' seats first, then the conversation's followers not among them.

        ``following`` is the conversation's followers when the delivery's claim already read them; else they are read here.
        """
        by_handle = {c.seat.handle: c for c in direct}
        if parsed.conversation_identity:
            if following is None:
                try:
                    following = await store.afollowers(parsed.conversation_identity)
                except DatabaseError:
                    log.warning("notification_follow_lookup_failed", extra={"conversation": parsed.conversation_identity}, exc_info=True)
                    following = []
            for handle in following:
                seat = org.seat_by_handle(handle)
                if seat is None or handle in by_handle:
                    continue
                if sender_seat is not None and sender_seat.is_agent and sender_seat.handle != handle:
                    log.debug(
                        chat_skip_log(parsed.source) if parsed.chat else "notification_follower_not_woken",
                        extra={"seat": handle, "reason": "an agent's post reaches followers only by mention", "conversation": parsed.conversation_identity},
                    )
                    continue
                ident = seat.identities.get(parsed.source, "")
                by_handle[handle] = _Candidate(seat, Recipient(ident or handle, WHY_FOLLOWER))
        return list(by_handle.values())

    @staticmethod
    def _seat_of(org: Organization, parser: Parser, identity: str, aliases: tuple[str, ...] = ()) -> Optional[Seat]:
        return seat_for(org, parser, identity, aliases)

    async def _deliver(
        self,
        org: Organization,
        parsed: Parsed,
        event: Event,
        cand: _Candidate,
        sender_seat: Optional[Seat],
        result: RouteResult,
        claimed_wakes: dict[str, bool],
    ) -> None:
        """Wake one candidate, or say why not; ``claimed_wakes`` are the wake claims the delivery's trip already made."""
        seat, recipient = cand.seat, cand.recipient
        own = sender_seat is not None and sender_seat.handle == seat.handle
        if own and parsed.chat:
            self._filtered(result, parsed, "own post", seat=seat.handle)
            return
        if not seat.is_agent:
            await self._skip(
                result, SKIP_HUMAN_SEAT, detail=f"{recipient.why} {recipient.identity}", parsed=parsed, seat=seat, recipient=recipient.identity, level=logging.INFO
            )
            return
        if own:
            await self._skip(
                result,
                SKIP_ROUTING_GATE_REFUSED,
                detail=f"{parsed.sender_name or parsed.sender} is {seat.handle}'s own {parsed.source} identity",
                parsed=parsed,
                seat=seat,
                recipient=recipient.identity,
                level=logging.INFO,
            )
            return
        if not await self.valve.admit(seat.handle, org.rate_limit_per_s):
            await self._skip(
                result, SKIP_RATE_LIMITED, detail=f"over {org.rate_limit_per_s:g} per second", parsed=parsed, seat=seat, recipient=recipient.identity
            )
            return
        key = self._wake_key(seat, parsed)
        claimed = claimed_wakes.get(key) if key else True
        if claimed is None:
            claimed = await self._claim(key, event.id)
        if not claimed:
            log.info("notification_duplicate_wake", extra={"seat": seat.handle, "source": parsed.source, "message_id": parsed.message_id or parsed.delivery_id})
            return
        wake = self.wake(seat, parsed, event, recipient)
        await self.queue.publish(topics.agent_inbox(seat.handle), wake)
        result.wakes.append((seat.handle, wake))
        await self.emitter.publish(
            topics.event(wake.type), wake, log_event="external_notification_record_failed", seat=seat.handle
        )
        if parsed.conversation_identity:
            try:
                await store.afollow(seat.handle, parsed.conversation_identity, parsed.source)
            except DatabaseError:
                log.warning("notification_follow_record_failed", extra={"seat": seat.handle}, exc_info=True)
        log.info(
            "notification_routed",
            extra={
                "seat": seat.handle,
                "source": parsed.source,
                "why": recipient.why,
                "partition_key": parsed.partition_key,
                "delivery_id": parsed.delivery_id,
            },
        )

    @staticmethod
    def wake(seat: Seat, parsed: Parsed, inbound: Event, recipient: Recipient) -> Event:
        """The inbox wake: an ``external_notification`` whose payload carries the routing keys.

        Typed fields: seat, role, agent_id, event_name, delivery_id, sender
        (display), title, body (salient), url. Payload (what the inbox and the
        coalescer read): ``partition_key``, ``conversation_identity`` (each
        only when the source derives one — a wake without them is never
        coalesced), ``sender``, ``sender_id`` (the surface identity),
        ``body``, ``delivery_id`` (the provider's id — the completion
        ledger's key), ``message_id``, ``digest_body``, ``why``, ``direct``,
        ``recon``, ``notification_source``, ``title``, ``url``. The envelope
        carries the trace (a child of the edge's span) and the inbound
        event's timestamp, so a partition orders by arrival at the edge.
        """
        sender = parsed.sender_name or parsed.sender
        extras: dict[str, Any] = {
            "sender": sender,
            "sender_id": parsed.sender,
            "body": parsed.body,
            "delivery_id": parsed.delivery_id,
            "message_id": parsed.message_id,
            "digest_body": parsed.digest_body,
            "why": recipient.why,
            "direct": recipient.direct,
            "recon": False,
            "notification_source": parsed.source,
            "title": parsed.title,
            "url": parsed.url,
        }
        if parsed.partition_key:
            extras["partition_key"] = parsed.partition_key
        if parsed.conversation_identity:
            extras["conversation_identity"] = parsed.conversation_identity
        return events.new(
            ExternalNotification(
                **seat.labels(),
                event_name=parsed.event_name,
                delivery_id=parsed.delivery_id,
                sender=sender,
                title=parsed.title,
                body=parsed.body,
                url=parsed.url,
            ),
            trace_of(),
            source=parsed.source,
            extras=extras,
            event_id=str(uuid.uuid5(WAKE_ID_NAMESPACE, f"{inbound.id}:{seat.handle}")),
            timestamp=inbound.timestamp,
        )

    # -- drops ----------------------------------------------------------------

    async def _claim_delivery(
        self, key: str, event_id: str, parsed: Parsed, wake_keys: list[str]
    ) -> store.DeliveryClaim:
        """The delivery's dedupe claim and, when it is this event's, ``wake_keys``' claims and the followers: one store trip.

        A store that fails that trip is asked again for the delivery's claim
        alone, failing open as it does alone; a claim the failed trip did
        commit is this event's own, so asking again finds it claimed by us.
        The wakes are then claimed one by one as each is delivered, and the
        followers read by :meth:`_candidates` (``followers`` None: not read here).
        """
        try:
            claims = await store.aclaim_delivery(key, event_id, parsed.conversation_identity, wake_keys)
        except DatabaseError:
            log.warning("notification_claim_trip_failed", extra={"key": key}, exc_info=True)
            return store.DeliveryClaim(await self._claim(key, event_id), None, {})
        return claims

    async def _claim(self, key: str, event_id: str) -> bool:
        """Claim a dedupe key; a store that cannot answer lets the delivery through (the ledger is the second guard)."""
        try:
            return await store.aclaim(key, event_id)
        except DatabaseError:
            log.warning("notification_dedupe_store_unavailable", extra={"key": key}, exc_info=True)
            return True

    @staticmethod
    def _filtered(result: RouteResult, parsed: Parsed, reason: str, *, seat: str = "") -> None:
        result.filtered.append(reason)
        name = chat_skip_log(parsed.source) if parsed.chat else "notification_unrouted"
        log.debug(
            name,
            extra={
                "reason": reason,
                "seat": seat,
                "source": parsed.source,
                "event_name": parsed.event_name,
                "delivery_id": parsed.delivery_id,
                "conversation": parsed.conversation_identity,
            },
        )

    async def _skip(
        self,
        result: RouteResult,
        reason: str,
        *,
        detail: str = "",
        parsed: Optional[Parsed] = None,
        seat: Optional[Seat] = None,
        recipient: str = "",
        event_name: str = "",
        delivery_id: str = "",
        level: int = logging.WARNING,
    ) -> None:
        """Publish ``notification_skipped`` (handle, reason, notification_source, detail) and log it."""
        source = parsed.source if parsed is not None else result.source
        handle = seat.handle if seat is not None else ""
        # The detail quotes the delivery (a parser's error): make it recordable.
        detail = storable_text(detail, SKIP_DETAIL_LIMIT)
        event_name, delivery_id = storable_text(event_name), storable_text(delivery_id)
        extras: dict[str, Any] = {"handle": handle, "notification_source": source}
        if parsed is not None and parsed.conversation_identity:
            extras["conversation_key"] = parsed.conversation_identity
        skipped = events.new(
            NotificationSkipped(
                reason=reason,
                detail=detail,
                seat=handle,
                recipient=recipient,
                event_name=parsed.event_name if parsed is not None else event_name,
                delivery_id=parsed.delivery_id if parsed is not None else delivery_id,
            ),
            trace_of(),
            source=source,
            extras=extras,
        )
        result.skips.append(skipped)
        log.log(
            level,
            "notification_skipped",
            extra={"reason": reason, "detail": detail, "seat": handle, "source": source, "recipient": recipient},
        )
        await self.emitter.publish(
            topics.event(skipped.type), skipped, log_event="notification_skipped_publish_failed", reason=reason
        )


__all__ = ["NOTIFY_GROUP", "NotifyRouter", "RateValve", "RouteResult", "chat_skip_log"]
