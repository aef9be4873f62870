"""``/api/a2a/``: open a channel as an operator, and read the channel records.

Same credentials as the rest of ``/api/`` (an operator token or a staff
session; 401 otherwise). ``POST ask`` is :func:`a2a.services.ask` run on the
engine's loop (:func:`crewlet.engine.runtime.on_engine`), so it answers 503
when no engine runs in this process or the loop does not answer within
:data:`ASK_TIMEOUT_S` (the ``EngineAway`` the API's exception handler
answers). An ask carrying a ``request_id`` is idempotent: 201 for the call
that opened the channel, 200 with the same channel for a retry (so a
client that saw a 503 or no answer retries without opening a second channel),
409 when the id was used for a different ask. The reads are the records alone —
participants, state, message count, opened/closed, closed_by — never content
beyond the brief.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from a2a import services
from a2a.models import Channel
from crewlet.engine import runtime
from crewlet.http.bodies import ERROR_BAD_PARAMETER, ClosedSerializer, StrictCharField, bad_request_body, error_response, error_responses
from crewlet.events import format_timestamp
from crewlet.company.org import HANDLE_PATTERN
from crewlet.events.tracing import Trace

log = logging.getLogger("crewlet.a2a.api")

#: How long an ask waits for the engine's loop to open the channel.
ASK_TIMEOUT_S = 10.0
#: The most records one list answers, newest first.
LIST_LIMIT = 200
#: What a seat handle must look like, in a person's words.
HANDLE_SAYS = "must be a seat handle: 1-63 lowercase letters, digits, '_' or '-', starting with a letter or digit"
#: A brief must say something, with no NUL (the parser refuses one: no store can keep it).
NOT_ONLY_SPACE = r"[^\x00]*[^\s\x00][^\x00]*"
#: A request id: printable ASCII without spaces (a UUID, a ULID, a client's own counter).
REQUEST_ID_PATTERN = r"[!-~]{1,200}"
#: The body field a 400 about the seat asked names.
P_TO = "to"


class ChannelSerializer(serializers.Serializer):
    id = serializers.CharField()
    asker = serializers.CharField()
    target = serializers.CharField()
    participants = serializers.ListField(child=serializers.CharField())
    state = serializers.ChoiceField(choices=[Channel.OPEN, Channel.CLOSED])
    message_count = serializers.IntegerField()
    brief = serializers.CharField(allow_blank=True)
    opened_at = serializers.DateTimeField()
    closed_at = serializers.DateTimeField(allow_null=True)
    open_seconds = serializers.FloatField(allow_null=True, help_text="closed_at - opened_at of the record; null while open")
    closed_by = serializers.CharField(allow_blank=True, help_text="the answering seat; empty when the sweep closed it")
    turn_id = serializers.CharField(allow_blank=True)
    work_key = serializers.CharField(allow_blank=True)
    delegation_depth = serializers.IntegerField()
    on_behalf_of = serializers.CharField(
        allow_null=True,
        help_text="the channel the asker still owes an answer on: the turn this channel's answer wakes answers it",
    )


class ChannelListSerializer(serializers.Serializer):
    channels = ChannelSerializer(many=True)


class AskSerializer(ClosedSerializer):
    # ``from`` is a keyword: the wire name is set in __init__.
    to = StrictCharField(min_length=1, max_length=63, pattern=HANDLE_PATTERN, pattern_says=HANDLE_SAYS)
    brief = StrictCharField(
        min_length=1, max_length=20000, pattern=NOT_ONLY_SPACE, pattern_says="must not be only white space"
    )
    request_id = StrictCharField(
        required=False,
        min_length=1,
        max_length=200,
        pattern=REQUEST_ID_PATTERN,
        pattern_says="must be 1-200 printable ASCII characters without spaces",
        help_text="makes the ask idempotent: a retry with the same request_id (from the same seat) answers the "
        "channel the first attempt opened instead of opening another",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["from"] = StrictCharField(min_length=1, max_length=63, pattern=HANDLE_PATTERN, pattern_says=HANDLE_SAYS)


def render(row: Channel) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "asker": row.asker,
        "target": row.target,
        "participants": row.participants,
        "state": row.state,
        "message_count": row.message_count,
        "brief": row.brief,
        "opened_at": format_timestamp(row.opened_at),
        "closed_at": format_timestamp(row.closed_at) if row.closed_at else None,
        "open_seconds": row.open_seconds if row.closed_at else None,
        "closed_by": row.closed_by,
        "turn_id": row.turn_id,
        "work_key": row.work_key,
        "delegation_depth": row.delegation_depth,
        "on_behalf_of": str(row.on_behalf_of) if row.on_behalf_of else None,
    }


def _detail(message: str, code: int) -> Response:
    return error_response(code, message)


def _refused(param: str, reason: str) -> Response:
    return Response(bad_request_body(ERROR_BAD_PARAMETER, param, reason), status=status.HTTP_400_BAD_REQUEST)


class AskView(APIView):
    @extend_schema(
        operation_id="a2a_ask",
        summary="Open an A2A channel: put the brief on the target seat's inbox as an a2a_request",
        request=AskSerializer,
        responses={200: ChannelSerializer, 201: ChannelSerializer, **error_responses(400, 401, 404, 409, 503)},
    )
    def post(self, request: Request) -> Response:
        body = AskSerializer(data=request.data)  # the parser let only a JSON object through
        body.is_valid(raise_exception=True)
        asker, target, brief = body.validated_data["from"], body.validated_data["to"], body.validated_data["brief"]
        request_id = body.validated_data.get("request_id", "")
        org = runtime.company()
        for handle in (asker, target):
            if org.seat_by_handle(handle) is None:
                return _detail(f"no seat {handle!r} in the company", status.HTTP_404_NOT_FOUND)
        target_seat = org.seat_by_handle(target)
        assert target_seat is not None  # every handle was looked up above
        if not target_seat.is_agent:
            # A seat that exists, whose kind has no inbox: a conflict with its state, as a pause of it is.
            return error_response(status.HTTP_409_CONFLICT, f"seat {target!r} is a human seat: it has no inbox to ask on", param=P_TO)
        asker_seat = org.seat_by_handle(asker)
        opened_before = request_id and Channel.objects.filter(pk=services.ask_channel_id(asker, request_id)).exists()
        try:
            row = runtime.on_engine(
                lambda queue: services.ask(
                    queue,
                    asker,
                    target,
                    brief,
                    trace=Trace.root(),
                    role=getattr(asker_seat, "role", ""),
                    agent_id=getattr(asker_seat, "agent_id", ""),
                    request_id=request_id,
                ),
                ASK_TIMEOUT_S,
            )
        except runtime.EngineAway as exc:
            log.warning("a2a_ask_unreachable", extra={"asker": asker, "target": target, "error": str(exc)})
            raise runtime.EngineAway(exc.missing, f"the ask could not be published: {exc}") from exc
        except services.RequestIdReused as exc:
            return _detail(exc.reason, status.HTTP_409_CONFLICT)
        except services.A2AError as exc:
            return _refused(P_TO, exc.reason)
        except Exception:
            log.error("a2a_ask_failed", extra={"asker": asker, "target": target}, exc_info=True)
            return _detail("the ask could not be published", status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response(render(row), status=status.HTTP_200_OK if opened_before else status.HTTP_201_CREATED)


class ChannelsView(APIView):
    @extend_schema(
        operation_id="a2a_channels",
        summary="A2A channel records, newest first",
        responses={200: ChannelListSerializer, **error_responses(401)},
    )
    def get(self, request: Request) -> Response:
        rows = Channel.objects.order_by("-opened_at")[:LIST_LIMIT]
        return Response({"channels": [render(r) for r in rows]})


class ChannelView(APIView):
    @extend_schema(
        operation_id="a2a_channel",
        summary="One A2A channel record",
        responses={200: ChannelSerializer, **error_responses(401, 404)},
    )
    def get(self, request: Request, channel_id: str) -> Response:
        try:
            row = Channel.objects.filter(pk=uuid.UUID(channel_id)).first()
        except ValueError:
            row = None
        if row is None:
            return _detail(f"no A2A channel {channel_id!r}: the id is unknown", status.HTTP_404_NOT_FOUND)
        return Response(render(row))


__all__ = ["AskView", "ChannelView", "ChannelsView", "render"]
