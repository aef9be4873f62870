"""Post-turn reflection: a completed turn goes to the seat's reflect subject; the node holding the seat reflects on it.

``seats[].reflection``: ``off`` publishes nothing; ``on`` hands every
completed turn over; ``limited`` only a turn that talked with a person, and
keeps only what it learned about them. The turn's after-turn hook publishes
``turn_completed`` to ``crewlet.agent.{handle}.reflect``; the node holding the
seat consumes it on a subscription of its own (never the inbox's, so a slow or
failing reflection holds no mail) and makes one model call — the company's
``providers.reflection`` chain, else the seat's — asking for JSON: what it
learned about each person (``counterparty`` rows, keyed by the identity the
wake named them by) and facts or decisions (``facts`` rows). It writes them as
memory rows, publishes ``counterparty_profile_updated`` per person and
``reflection_completed`` naming the rows, and records the call's spend as
``auxiliary_spend`` (stage ``reflection``), charged to the seat's budget. A
call that fails is a NAK: the queue retries it with its backoff, and dead-letters
it when the budget of deliveries is spent.
"""
from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Optional, Sequence
from zoneinfo import ZoneInfo

from crewlet.base.db import in_store
from crewlet.base.db_router import EVENTS_ALIAS
from crewlet.base.logfmt import short_reason
from crewlet.company.org import REFLECTION_LIMITED, REFLECTION_OFF, CompanyHolder, Seat
from crewlet.events import Event, new
from crewlet.events.tracing import trace_of
from crewlet.events.types import (
    STAGE_REFLECTION,
    AuxiliarySpend,
    CounterpartyProfileUpdated,
    ReflectionCompleted,
    TurnCompleted,
)
from crewlet.queue import topics
from crewlet.queue.contract import Delivery, EventQueue, Outcome, Subscription
from seats.memory import store
from seats.memory.block import senders
from seats.memory.rows import BY_REFLECTION, COUNTERPARTY_TABLE, RowRefused, written
from seats.provider_base import ROLE_USER, Completion, Message, ModelRequest, ProviderError
from seats.turn_types import Trigger, TurnResult, TurnTags

if TYPE_CHECKING:  # pragma: no cover
    from seats.turns import TurnRunner

log = logging.getLogger("crewlet.seats.memory")

#: The reflect message's own keys, beside ``turn_completed``'s typed fields.
K_PROMPT = "prompt"
K_RESPONSE = "response"
K_SENDERS = "senders"
#: The turn's words handed over, clipped to this many characters each.
TEXT_MAX_CHARS = 8000
#: Rows one reflection writes, at most.
ROWS_MAX = 8
FACTS_TABLE = "facts"
K_COUNTERPARTIES = "counterparties"
K_FACTS = "facts"
#: Why a reflection wrote nothing (``reflection_completed.error``).
NOT_JSON = "the reflection's answer was not the JSON object asked for"
BUDGET_SPENT = "budget_exhausted"
PURPOSE = "post-turn reflection"

SYSTEM = (
    "You reflect on one finished turn of an agent, to decide what it should remember. Answer with one JSON object "
    f'only: {{"{K_COUNTERPARTIES}": {{"<identity>": "<what you learned about that person>"}}, '
    f'"{K_FACTS}": {{"<short key>": "<a fact or decision worth keeping>"}}}}. '
    "Use the identities exactly as given. Leave out anything not worth remembering; empty objects are a fine answer."
)


def _clip(text: str) -> str:
    return text if len(text) <= TEXT_MAX_CHARS else text[: TEXT_MAX_CHARS - 1] + "…"


async def hand_to_reflection(queue: EventQueue, seat: Seat, trigger_events: Sequence[Event], result: TurnResult) -> None:
    """The after-turn hook: publish a completed turn to the seat's reflect subject (nothing when reflection is off)."""
    if seat.reflection == REFLECTION_OFF or not result.ok or not trigger_events:
        return
    trigger = Trigger(events=list(trigger_events), turn_id=result.turn_id)
    people = senders(trigger)
    if seat.reflection == REFLECTION_LIMITED and not people:
        return
    conversation = trigger_events[0].field("conversation_key")
    body = TurnCompleted(
        seat=seat.handle, role=seat.role, agent_id=seat.agent_id, turn_id=result.turn_id,
        conversation_key=conversation if isinstance(conversation, str) else "",
    )
    extras = {K_PROMPT: _clip(trigger.prompt()), K_RESPONSE: _clip(result.response), K_SENDERS: people}
    await queue.publish(topics.agent_reflect(seat.handle), new(body, trace_of(), extras=extras))


def learned(answer: str, people: Sequence[str], limited: bool) -> list[tuple[str, str, Any]]:
    """The rows an answer asks to write, ``(table, key, value)``: people it was told about first, bounded."""
    start, end = answer.find("{"), answer.rfind("}")
    try:
        parsed = json.loads(answer[start : end + 1]) if 0 <= start < end else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(NOT_JSON)
    rows: list[tuple[str, str, Any]] = []
    about = parsed.get(K_COUNTERPARTIES)
    for who, what in (about.items() if isinstance(about, dict) else []):
        if who in people and what:
            rows.append((COUNTERPARTY_TABLE, who, what))
    facts = parsed.get(K_FACTS)
    for key, what in (facts.items() if isinstance(facts, dict) and not limited else []):
        if what:
            rows.append((FACTS_TABLE, str(key), what))
    return rows[:ROWS_MAX]


class Reflector:
    """The reflect subscriptions of the seats this node holds, and the reflection each delivery runs."""

    def __init__(self, queue: EventQueue, holder: CompanyHolder, runner: "TurnRunner") -> None:
        self.queue = queue
        self.holder = holder
        self.runner = runner
        self.subscriptions: dict[str, Subscription] = {}

    async def attach(self, handle: str) -> None:
        """Consume the seat's reflect subject here, when the seat reflects (its consumer made before any publish)."""
        seat = self.holder.current().seat_by_handle(handle)
        if seat is None or seat.reflection == REFLECTION_OFF or handle in self.subscriptions:
            return
        topic, group = topics.agent_reflect(handle), topics.agent_reflect_group(handle)
        await self.queue.ensure_subscription(topic, group)

        async def handler(delivery: Delivery) -> Optional[Outcome]:
            return await self.reflect(handle, delivery)

        self.subscriptions[handle] = await self.queue.subscribe(topic, group, handler)

    async def detach(self, handle: str) -> None:
        subscription = self.subscriptions.pop(handle, None)
        if subscription is not None:
            await subscription.detach()

    async def reflect(self, handle: str, delivery: Delivery) -> Optional[Outcome]:
        org = self.holder.current()
        seat = org.seat_by_handle(handle)
        event = delivery.event
        if seat is None or seat.reflection == REFLECTION_OFF or not isinstance(event.data, TurnCompleted):
            return Outcome.ACK
        started, turn_id = time.monotonic(), event.data.turn_id
        tags: TurnTags = {
            "seat": seat.handle, "role": seat.role, "agent_id": seat.agent_id, "turn_id": turn_id,
            "conversation_key": event.data.conversation_key,
        }
        people = [p for p in event.payload.get(K_SENDERS) or [] if isinstance(p, str)]
        if self.runner.budget is not None and await self.runner.budget.refuse(seat) is not None:
            await self._emit(ReflectionCompleted(**tags, error=BUDGET_SPENT))
            return Outcome.ACK
        known = await in_store(store.about, alias=EVENTS_ALIAS)(handle, COUNTERPARTY_TABLE, people)
        text = f"Reflect on this turn of {seat.handle}.\n\nThe people in it: {', '.join(people) or 'none named'}."
        if known:
            text += "\nWhat is remembered about them: " + json.dumps({r.key: r.value for r in known}, ensure_ascii=False)
        text += f"\n\nThe message:\n{event.payload.get(K_PROMPT, '')}\n\nThe answer:\n{event.payload.get(K_RESPONSE, '')}"
        answer = await self._call(seat, turn_id, ModelRequest(system=SYSTEM, messages=[Message(role=ROLE_USER, text=text)], seat=handle))
        if answer is None:
            return Outcome.NAK  # every entry failed: the queue tries again after its backoff
        try:
            rows = learned(answer.text, people, seat.reflection == REFLECTION_LIMITED)
        except ValueError as exc:
            await self._emit(ReflectionCompleted(**tags, duration_ms=self._ms(started), error=str(exc)))
            return Outcome.ACK
        wrote: list[dict[str, Any]] = []
        for table, key, value in rows:
            try:
                write = await written(
                    self.queue, handle, table, key, value, written_by=BY_REFLECTION, turn_id=turn_id,
                    conversation_key=event.data.conversation_key,
                )
            except RowRefused as exc:
                log.info("seat_reflection_row_refused", extra={"seat": handle, "turn_id": turn_id, "error": str(exc)})
                continue
            await in_store(store.apply, alias=EVENTS_ALIAS)([write])
            wrote.append({"table": table, "key": key})
            if table == COUNTERPARTY_TABLE:
                await self._emit(CounterpartyProfileUpdated(**tags, counterparty=key))
        await self._emit(ReflectionCompleted(**tags, insights=len(wrote), duration_ms=self._ms(started), rows=wrote))
        log.info("seat_reflection_completed", extra={"seat": handle, "turn_id": turn_id, "rows": len(wrote)})
        return Outcome.ACK

    async def _call(self, seat: Seat, turn_id: str, request: ModelRequest) -> Optional[Completion]:
        """The chain in order; the spend (a success or the failures) as ``auxiliary_spend``, charged to the seat."""
        org = self.holder.current()
        failed, first = 0, datetime.now(timezone.utc)
        for config in org.reflection_chain_of(seat):
            provider = None
            try:
                provider = self.runner.provider_factory(config)
                answer = await provider.complete(request)
            except (ProviderError, ValueError, TypeError) as exc:
                failed += 1
                log.warning("seat_reflection_call_failed", extra={"seat": seat.handle, "provider": config.key, "error": short_reason(exc)})
                continue
            finally:
                if provider is not None:
                    try:
                        await provider.aclose()
                    except Exception:
                        log.debug("provider_close_failed", exc_info=True)
            if self.runner.budget is not None:
                await self.runner.budget.charge(seat, answer)
            await self._spend(seat, turn_id, config.key, answer.model, first, failed, answer)
            return answer
        await self._spend(seat, turn_id, "", "", first, failed, None)
        return None

    async def _spend(
        self, seat: Seat, turn_id: str, key: str, model: str, first: datetime, failed: int, answer: Optional[Completion]
    ) -> None:
        org = self.holder.current()
        await self._emit(
            AuxiliarySpend(
                stage=STAGE_REFLECTION, purpose=PURPOSE, seat=seat.handle, role=seat.role, agent_id=seat.agent_id,
                turn_id=turn_id, model=model, provider_key=key,
                company_day=datetime.now(ZoneInfo(org.timezone)).date().isoformat(),
                calls=failed + (1 if answer is not None else 0), failed_calls=failed,
                input_tokens=answer.input_tokens if answer is not None else 0,
                output_tokens=answer.output_tokens if answer is not None else 0,
                first_started_at=first.isoformat().replace("+00:00", "Z"),
                last_ended_at=datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            )
        )

    async def _emit(self, body: Any) -> None:
        await self.runner.emitter.emit(body, trace_of(), log_event="seat_reflection_publish_failed")

    @staticmethod
    def _ms(started: float) -> int:
        return int((time.monotonic() - started) * 1000)


__all__ = ["Reflector", "hand_to_reflection", "learned"]
