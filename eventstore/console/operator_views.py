"""``GET /api/dead-letters`` and ``POST /operator/act``: what sits on CREWLET_DLQ, and replaying one.

Same credentials as the rest of ``/api/`` (an operator token, or a staff
session with its CSRF token; 401 otherwise). The views run in a request
thread, while the engine's queue lives on the engine's asyncio loop: they reach
it through :func:`crewlet.engine.runtime.on_engine` (:func:`crewlet.engine.runtime.call_on_loop`)
with a deadline, as ``seats.api`` does. A body is a JSON object or a 400 of the
one shape (``crewlet.http.bodies``), audited as a ``bad_args`` refusal. The action itself is
:func:`eventstore.actions.replay_dead_letter`, which publishes the one
``operator_acted`` of the call whatever became of it.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Optional

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from crewlet.engine import runtime
from crewlet.http.auth import actor_of
from crewlet.http.bodies import BadBody, ClosedSerializer, StrictCharField, bad_request_body, error_response, error_responses
from crewlet.events import format_timestamp
from crewlet.queue.contract import DEAD_LETTER_REF_RULE, DeadLetter
from eventstore import actions as ops
from eventstore.api import BadParameter

log = logging.getLogger("crewlet.eventstore.operator")


#: How long a request waits for the engine's loop to answer.
QUEUE_TIMEOUT_S = 10.0
#: The longest ``request_id`` an operator call may carry (it is audited).
MAX_REQUEST_ID = 200
#: Dead letters listed when ``?limit=`` is not given, and the most one page may ask for.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000

# JSON keys of the answers (wire contracts: the dashboard's script reads them).
K_DEAD_LETTERS = "dead_letters"
K_REF = "ref"
K_TOPIC = "topic"
K_GROUP = "group"
K_DELIVERIES = "deliveries"
K_EVENT_ID = "event_id"
K_TYPE = "type"
K_SUMMARY = "summary"
K_TRACE_ID = "trace_id"
K_TIMESTAMP = "timestamp"
K_SEAT = "seat"
K_OUTCOME = "outcome"
# The request's keys.
K_TOOL = "tool"
K_ARGS = "args"
K_REQUEST_ID = "request_id"
P_LIMIT = "limit"
#: Every key a call's body and its args take.
BODY_KEYS = (K_TOOL, K_ARGS, K_REQUEST_ID)
ARGS_KEYS = (K_REF,)

#: Where an event names no type or summary we can read (bytes from another build).
UNREADABLE = "unreadable"


# -- serializers (the schema; the answers are plain dicts) -----------------------------------


class DeadLetterSerializer(serializers.Serializer):
    ref = serializers.CharField(help_text="the entry's identity on CREWLET_DLQ (pass it to dead_letter_replay)")
    topic = serializers.CharField(help_text="the topic it was dead-lettered from, where a replay publishes it")
    group = serializers.CharField()
    deliveries = serializers.IntegerField()
    event_id = serializers.CharField(allow_blank=True)
    type = serializers.CharField()
    summary = serializers.CharField(allow_blank=True)
    trace_id = serializers.CharField(allow_blank=True)
    timestamp = serializers.CharField(allow_blank=True)
    seat = serializers.CharField(allow_blank=True)


class DeadLetterListSerializer(serializers.Serializer):
    dead_letters = DeadLetterSerializer(many=True)


#: A ref's shape: ASCII digits, white space around them ignored. One in that shape that names no entry
#: (0, past a uint64) is a 404 like a replayed one: the schema cannot state the range, the server answers it as a miss.
REF_PATTERN = r"\s*[0-9]+\s*"


class ReplayArgsSerializer(ClosedSerializer):
    ref = StrictCharField(min_length=1, pattern=REF_PATTERN, pattern_says="must be the dead letter's ref: digits")


class ActRequestSerializer(ClosedSerializer):
    tool = serializers.ChoiceField(choices=sorted(ops.TOOLS))
    args = ReplayArgsSerializer()
    request_id = StrictCharField(required=False, allow_blank=True, max_length=MAX_REQUEST_ID)


class ActResultSerializer(serializers.Serializer):
    outcome = serializers.CharField()
    topic = serializers.CharField()
    event_id = serializers.CharField(allow_blank=True)


# -- the rows -------------------------------------------------------------------------------------


def dead_letter_row(letter: DeadLetter) -> dict[str, Any]:
    """One dead letter as the API and the dashboard show it; an undecodable body is still listed."""
    row: dict[str, Any] = {
        K_REF: letter.ref,
        K_TOPIC: letter.topic,
        K_GROUP: letter.group,
        K_DELIVERIES: letter.deliveries,
        K_EVENT_ID: "",
        K_TYPE: UNREADABLE,
        K_SUMMARY: "",
        K_TRACE_ID: "",
        K_TIMESTAMP: "",
        K_SEAT: "",
    }
    try:
        event = letter.event
    except Exception:
        return row
    seat = getattr(event.data, "seat", None) if event.data is not None else None
    if not isinstance(seat, str) or not seat:
        loose = event.extra.get("seat") or (event.payload.get("seat") if isinstance(event.payload, dict) else "")
        seat = loose if isinstance(loose, str) else ""
    try:
        summary = event.summary()
    except Exception:
        summary = ""
    row.update(
        {
            K_EVENT_ID: event.id,
            K_TYPE: event.type,
            K_SUMMARY: summary,
            K_TRACE_ID: event.trace_id,
            K_TIMESTAMP: format_timestamp(event.timestamp) if event.timestamp.year > 1 else "",
            K_SEAT: seat,
        }
    )
    return row


def _limit(request: Request) -> int:
    value = request.query_params.get(P_LIMIT)
    if value is None:
        return DEFAULT_LIMIT
    if not re.fullmatch(r"[0-9]{1,6}", value.strip()) or not 1 <= int(value) <= MAX_LIMIT:
        raise BadParameter(P_LIMIT, f"must be a whole number from 1 to {MAX_LIMIT}")
    return int(value)


def _unavailable(detail: str) -> Response:
    return error_response(status.HTTP_503_SERVICE_UNAVAILABLE, detail, error=ops.REFUSAL_UNAVAILABLE)


# -- views ------------------------------------------------------------------------------------------


class DeadLettersView(APIView):
    @extend_schema(
        operation_id="dead_letters_list",
        summary="What sits on CREWLET_DLQ, oldest first",
        parameters=[
            OpenApiParameter(
                P_LIMIT, {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
                OpenApiParameter.QUERY, required=False,
                description=f"at most this many, 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})",
            )
        ],
        responses={200: DeadLetterListSerializer, **error_responses(400, 401, 503)},
    )
    def get(self, request: Request) -> Response:
        limit = _limit(request)
        try:
            letters = runtime.on_engine(lambda queue: queue.dead_letters(limit), QUEUE_TIMEOUT_S)
        except runtime.EngineAway:
            raise  # answered 503 with its reason by the API's exception handler
        except Exception as exc:  # Unavailable from the broker, or NotLive while stopping
            log.warning("dead_letters_read_failed", extra={"error": repr(exc)})
            return _unavailable("the broker could not be reached to list the dead letters; try again")
        return Response({K_DEAD_LETTERS: [dead_letter_row(letter) for letter in letters]})


class OperatorActView(APIView):
    @extend_schema(
        operation_id="operator_act",
        summary="Run an operator tool (dead_letter_replay); audited as one operator_acted",
        request=ActRequestSerializer,
        responses={
            200: ActResultSerializer, **error_responses(400, 401, 404, 409, 503)
        },
    )
    def post(self, request: Request) -> Response:
        actor = actor_of(request)
        try:
            body = request.data  # the parser lets only a depth-limited JSON object of storable strings through
        except BadBody:
            self._audit_refusal("", ops.REFUSAL_BAD_ARGS, actor, "")
            raise
        tool = body.get(K_TOOL)
        args = body.get(K_ARGS)
        request_id = body.get(K_REQUEST_ID, "")
        tool_name = tool if isinstance(tool, str) else ""
        refused = self._unknown_field(body) or self._refusal(tool_name, args, request_id)
        if refused is not None:
            refusal, param, detail = refused
            self._audit_refusal(tool_name, refusal, actor, request_id if isinstance(request_id, str) else "")
            return Response(bad_request_body(refusal, param, detail), status=status.HTTP_400_BAD_REQUEST)
        ref = args[K_REF].strip()
        missing = ops.ref_refusal(ref)
        if missing:
            self._audit_refusal(tool_name, ops.REFUSAL_GONE, actor, request_id)
            return error_response(status.HTTP_404_NOT_FOUND, missing, error=ops.REFUSAL_GONE, param=f"{K_ARGS}.{K_REF}")
        try:
            result = runtime.on_engine(
                lambda queue: ops.replay_dead_letter(queue, ref, ops.Caller(actor, request_id=request_id)),
                QUEUE_TIMEOUT_S,
            )
        except runtime.EngineAway as exc:
            log.warning("operator_act_unreachable", extra={"tool": tool_name, "actor": actor, "error": str(exc)})
            raise
        if result.ok:
            return Response({K_OUTCOME: result.outcome, K_TOPIC: result.topic, K_EVENT_ID: result.event_id})
        code = {
            ops.REFUSAL_BAD_ARGS: status.HTTP_400_BAD_REQUEST,
            ops.REFUSAL_GONE: status.HTTP_404_NOT_FOUND,
            ops.REFUSAL_NO_SUBSCRIPTION: status.HTTP_409_CONFLICT,
        }.get(result.refusal, status.HTTP_503_SERVICE_UNAVAILABLE)
        return error_response(code, result.detail, error=result.refusal, param=f"{K_ARGS}.{K_REF}")

    @staticmethod
    def _unknown_field(body: dict[str, Any]) -> Optional[tuple[str, str, str]]:
        """A key the body or its args do not take, refused as the schema's ``additionalProperties: false`` says."""
        args = body.get(K_ARGS)
        for where, keys, known in (("", body, BODY_KEYS), (f"{K_ARGS}.", args if isinstance(args, dict) else {}, ARGS_KEYS)):
            unknown = sorted(str(key) for key in keys if key not in known)
            if unknown:
                return ops.REFUSAL_BAD_ARGS, f"{where}{unknown[0]}", f"unknown field; this takes: {', '.join(known)}"
        return None

    @staticmethod
    def _refusal(tool: str, args: Any, request_id: Any) -> Optional[tuple[str, str, str]]:
        """Why the call cannot be run as asked — (refusal, the field, the reason) — or None."""
        if tool not in ops.TOOLS:
            known = ", ".join(sorted(ops.TOOLS))
            return ops.REFUSAL_UNKNOWN_TOOL, K_TOOL, f"unknown tool {tool!r}: known tools are {known}"
        ref = args.get(K_REF) if isinstance(args, dict) else None
        if not isinstance(ref, str) or not ref.strip():
            return (
                ops.REFUSAL_BAD_ARGS,
                f"{K_ARGS}.{K_REF}",
                f"{tool} needs args.{K_REF}: the dead letter's ref from /api/dead-letters",
            )
        if not re.fullmatch(REF_PATTERN, ref):
            return ops.REFUSAL_BAD_ARGS, f"{K_ARGS}.{K_REF}", f"args.{K_REF} must be digits: {DEAD_LETTER_REF_RULE}"
        if not isinstance(request_id, str) or len(request_id) > MAX_REQUEST_ID:
            return ops.REFUSAL_BAD_ARGS, K_REQUEST_ID, f"must be a string of at most {MAX_REQUEST_ID} characters"
        return None

    @staticmethod
    def _audit_refusal(tool: str, refusal: str, actor: str, request_id: str) -> None:
        """A refused call is a call too: audited once when the engine is there to publish it."""
        result = ops.ActResult(tool=tool, outcome=ops.OUTCOME_REFUSED, refusal=refusal)
        try:
            runtime.on_engine(
                lambda queue: ops.audit(queue, result, ops.Caller(actor, request_id=request_id)),
                QUEUE_TIMEOUT_S,
            )
        except Exception as exc:
            log.warning("operator_act_refusal_unaudited", extra={"tool": tool, "refusal": refusal, "error": repr(exc)})


__all__ = ["DeadLettersView", "OperatorActView", "dead_letter_row"]
