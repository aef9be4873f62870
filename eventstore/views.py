"""DRF views of the history reads: thin — the parameters and the answer are eventstore.api's."""
from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from eventstore import api
from eventstore import serializers as s

_ERRORS = {400: s.BadParameterSerializer, 401: s.DetailSerializer}


def _p(name: str, description: str, kind: Any = str, *, many: bool = False) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, required=False, description=description, many=many)


_FILTERS = [
    _p("category", "repeatable (or comma-separated): only these categories", many=True),
    _p("type", "only rows filed under this type (an inbound delivery's label, e.g. webhook:push)"),
    _p("seat", "only rows about this seat"),
    _p("trace_id", "only rows of this trace"),
    _p("conversation_key", "only rows of this conversation"),
    _p("partition_key", "only rows naming this batch partition"),
    _p("node", "only rows this node published"),
    _p("since", "RFC 3339; rows at or after", OpenApiTypes.DATETIME),
    _p("until", "RFC 3339; rows before", OpenApiTypes.DATETIME),
    _p("feed_only", "leave out types the activity feed never holds", OpenApiTypes.BOOL),
]
_PAGING = [
    _p("limit", "rows per page, 1 to 500 (default 100)", OpenApiTypes.INT),
    _p("cursor", "next_cursor of the previous page"),
]


def _not_found(answer: dict[str, Any], what: str) -> Response:
    return Response(
        {"detail": f"no {what} in the history", "coverage": answer.get("coverage"), "at": answer.get("at")},
        status=status.HTTP_404_NOT_FOUND,
    )


class EventsView(APIView):
    @extend_schema(
        operation_id="events_list",
        summary="A page of events, newest first",
        parameters=_FILTERS + _PAGING,
        responses={200: s.EventPageSerializer, **_ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response(api.events_page(request.query_params))


class EventView(APIView):
    @extend_schema(operation_id="events_get",
        summary="One event, whole", responses={200: s.EventDetailSerializer, 404: s.DetailSerializer, **_ERRORS})
    def get(self, request: Request, event_id: str) -> Response:
        answer = api.event_detail(request.query_params, event_id)
        if answer.get("event") is None:
            return _not_found(answer, "such event")
        return Response(answer)


class EventSeriesView(APIView):
    @extend_schema(
        operation_id="events_series",
        summary="Event counts in bars over a window",
        parameters=[
            _p("window", "how far back: 15m, 24h, 7d (default 24h; floored at the retained history)"),
            _p("bucket", "bar width: 1m, 1h, 1d (default 1h)"),
            *_FILTERS,
        ],
        responses={200: s.SeriesSerializer, **_ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response(api.event_series(request.query_params))


class TraceView(APIView):
    @extend_schema(operation_id="traces_get",
        summary="A trace as a tree of spans", responses={200: s.TraceSerializer, 404: s.DetailSerializer, **_ERRORS})
    def get(self, request: Request, trace_id: str) -> Response:
        answer = api.trace(request.query_params, trace_id)
        if not answer.get("spans"):
            return _not_found(answer, "such trace")
        return Response(answer)


class TurnsView(APIView):
    @extend_schema(
        operation_id="turns_list",
        summary="A page of turns, newest first",
        parameters=[*(p for p in _FILTERS if p.name in api.TURNS_PARAMS), *_PAGING],
        responses={200: s.TurnPageSerializer, **_ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response(api.turns_page(request.query_params))


class TurnView(APIView):
    @extend_schema(operation_id="turns_get",
        summary="One turn, folded, with its events", responses={200: s.TurnDetailSerializer, 404: s.DetailSerializer, **_ERRORS})
    def get(self, request: Request, turn_id: str) -> Response:
        answer = api.turn_detail(request.query_params, turn_id)
        if answer.get("turn") is None:
            return _not_found(answer, "such turn")
        return Response(answer)
