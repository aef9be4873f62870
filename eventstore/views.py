"""DRF views of the history reads: thin — the parameters and the answer are eventstore.api's."""
from __future__ import annotations

from typing import Any

from django.http import Http404
from django.utils.http import content_disposition_header
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from crewlet.http.bodies import error_response, error_responses
from crewlet.events import CATEGORIES
from eventstore import api
from eventstore import questions as qs
from eventstore import serializers as s
from crewlet.http.renderers import AcceptOnlyNegotiation, OrjsonRenderer

_ERRORS = error_responses(400, 401, 503)


def _p(name: str, description: str, schema: dict[str, Any]) -> OpenApiParameter:
    """A query parameter whose schema states exactly what ``eventstore.api`` enforces."""
    return OpenApiParameter(name, schema, OpenApiParameter.QUERY, required=False, description=description)


def _text(**extra: Any) -> dict[str, Any]:
    """Every text parameter's bounds (``api.check_text``): not empty, not absurdly long, no NUL."""
    return {"type": "string", "minLength": 1, "maxLength": api.MAX_VALUE_LENGTH, "pattern": api.TEXT_PATTERN, **extra}


_TIMESTAMP = {"type": "string", "format": "date-time"}
_TIMESTAMP_NOTE = (
    " (RFC 3339 with a time zone, years 0001 to 9999; a local time whose UTC instant falls past"
    " either end of that calendar stands for its end)"
)
_CATEGORY = {"type": "array", "items": {"type": "string", "enum": list(CATEGORIES)}}

_FILTERS = [
    OpenApiParameter(
        "category", _CATEGORY, OpenApiParameter.QUERY, required=False, style="form", explode=True,
        description="repeatable (or comma-separated): only these categories",
    ),
    _p("type", "only rows filed under this type (an inbound delivery's label, e.g. webhook:push)", _text()),
    _p("seat", "only rows about this seat", _text()),
    _p("trace_id", "only rows of this trace", _text()),
    _p("conversation_key", "only rows of this conversation", _text()),
    _p("partition_key", "only rows naming this batch partition", _text()),
    _p("node", "only rows this node published", _text()),
    _p("since", "rows at or after" + _TIMESTAMP_NOTE + "; not after until", _TIMESTAMP),
    _p("until", "rows before" + _TIMESTAMP_NOTE, _TIMESTAMP),
    _p("feed_only", "leave out types the activity feed never holds (true or false; 1 and 0 also do)",
       {"type": "boolean", "default": False}),
]
_CONVERSATION = _p(
    api.CONVERSATION,
    "the history of one thread: only turns of this conversation identity (slack:D1 for a direct message however"
    " it is threaded, slack:C9:1718.001 for a channel thread, jira:POC-7 for an issue): each turn's conversation_key",
    _text(),
)
_PAGING = [
    _p(
        "limit", f"rows per page, 1 to {qs.MAX_LIMIT} (default {qs.DEFAULT_LIMIT})",
        {"type": "integer", "minimum": 1, "maximum": qs.MAX_LIMIT, "default": qs.DEFAULT_LIMIT},
    ),
]


def _paging(tag: str) -> list[OpenApiParameter]:
    """``limit``, and a ``cursor`` of this read's own format (``qs.cursor_format``): another read's is refused."""
    cursor = _p(
        "cursor", "next_cursor of the previous page of this read (opaque; any other text is refused)",
        _text(pattern=qs.cursor_pattern(tag), format=qs.cursor_format(tag)),
    )
    return [*_PAGING, cursor]
_DURATION = {"type": "string", "pattern": qs.DURATION_PATTERN}


def _key(name: str, description: str) -> OpenApiParameter:
    """A path key (an event, trace or turn id): the same text rule as every query value."""
    return OpenApiParameter(name, _text(), OpenApiParameter.PATH, description=description)


class ReadView(APIView):
    """A history read: its query parameters are all its own (``eventstore.api`` checks each)."""

    content_negotiation_class = AcceptOnlyNegotiation


def _read_schema(operation_id: str, summary: str, parameters: list[OpenApiParameter], serializer: Any) -> Any:
    """A read over the history: its query parameters, its answer, and the refusals every read shares."""
    return extend_schema(
        operation_id=operation_id, summary=summary, parameters=parameters, responses={200: serializer, **_ERRORS},
    )


def _detail_schema(operation_id: str, summary: str, key: OpenApiParameter, serializer: Any) -> Any:
    """A detail read's schema: one path key, its answer, and the 404 :func:`_found_or_404` gives a miss."""
    return extend_schema(
        operation_id=operation_id, summary=summary, parameters=[key],
        responses={200: serializer, 404: s.MissSerializer, **_ERRORS},
    )


def _found_or_404(answer: dict[str, Any], found: bool, what: str, param: str) -> Response:
    """A detail read's answer, or a 404 naming ``what`` (the path key ``param``) that keeps the answer's ``coverage`` and ``at``.

    A miss is "not in the history this node covers, as of that instant", so
    the 404 says which history it looked at.
    """
    if found:
        return Response(answer)
    return error_response(
        status.HTTP_404_NOT_FOUND, f"no {what} in the history", param=param, coverage=answer.get("coverage"), at=answer.get("at")
    )


class EventsView(ReadView):
    @_read_schema("events_list", "A page of events, newest first", _FILTERS + _paging(qs.EVENTS_CURSOR), s.EventPageSerializer)
    def get(self, request: Request) -> Response:
        return Response(api.events_page(request.query_params))


# A read of one thing named by its path key: the answer, or the 404 _found_or_404 gives a miss.
# (No docstring of its own: the schema describes each operation with ReadView's.)
class DetailView(ReadView):
    #: The path key; what a miss says was not found; the answer's key that is empty on a miss.
    key = what = holds = ""

    @staticmethod
    def read(query: Any, key: str, /) -> dict[str, Any]:
        raise NotImplementedError

    def get(self, request: Request, **path: str) -> Response:
        answer = self.read(request.query_params, path[self.key])
        return _found_or_404(answer, bool(answer.get(self.holds)), f"such {self.what}", self.key)


@extend_schema_view(get=_detail_schema("events_get", "One event, whole", _key("event_id", "the event's id"), s.EventDetailSerializer))
class EventView(DetailView):
    key, what, holds, read = "event_id", "event", "event", staticmethod(api.event_detail)


class EventSeriesView(ReadView):
    @_read_schema("events_series", "Event counts in bars over a window", [
        _p("window", "how far back: 15m, 24h, 7d (default 24h; floored at the retained history)",
           {**_DURATION, "default": api.DEFAULT_WINDOW}),
        _p("bucket", f"bar width: 1m, 1h, 1d (default 1h); not longer than the window; a window of more than {qs.MAX_BARS} bars is answered with its latest {qs.MAX_BARS}",
           {**_DURATION, "default": api.DEFAULT_BUCKET}),
        *_FILTERS,
    ], s.SeriesSerializer)
    def get(self, request: Request) -> Response:
        return Response(api.event_series(request.query_params))


@extend_schema_view(get=_detail_schema("traces_get", "A trace as a tree of spans", _key("trace_id", "the trace's id"), s.TraceSerializer))
class TraceView(DetailView):
    key, what, holds, read = "trace_id", "trace", "spans", staticmethod(api.trace)


class TurnsView(ReadView):
    @_read_schema(
        "turns_list", "A page of turns, newest first",
        [*(p for p in _FILTERS if p.name in api.TURNS_PARAMS), _CONVERSATION, *_paging(qs.TURNS_CURSOR)], s.TurnPageSerializer,
    )
    def get(self, request: Request) -> Response:
        return Response(api.turns_page(request.query_params))


@extend_schema_view(get=_detail_schema("turns_get", "One turn, folded, with its events", _key("turn_id", "the turn's id"), s.TurnDetailSerializer))
class TurnView(DetailView):
    key, what, holds, read = "turn_id", "turn", "turn", staticmethod(api.turn_detail)


@extend_schema_view(get=_detail_schema(
    "deliveries_get", "Where a delivery is now: accepted, routed, waiting (and why), coalesced, worked, skipped or dead-lettered",
    _key("delivery_id", "the provider's delivery id (the webhook's 202 names it)"), s.DeliverySerializer,
))
class DeliveryView(DetailView):
    key, what, holds, read = "delivery_id", "delivery", "delivery", staticmethod(api.delivery)


#: The schema route's own parameters: the schema's version and DRF's format override (json, yaml).
SCHEMA_PARAMS = frozenset({"version", "format"})


def schema_versions() -> tuple[str, ...]:
    """The versions this API has: the one the schema document states."""
    return (str(spectacular_settings.VERSION),)


class JsonErrors(APIView):
    """A view answering YAML or HTML whose refusals are still the API's JSON (``{"error", "param", "reason"}``)."""

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        self.request.accepted_renderer = OrjsonRenderer()
        self.request.accepted_media_type = "application/json"
        return response


class SwaggerView(JsonErrors, SpectacularSwaggerView):
    """``/api/docs/``: Swagger UI over ``/api/schema/``, its files served by this node; the schema's credentials."""


class RedocView(JsonErrors, SpectacularRedocView):
    """``/api/redoc/``: Redoc over ``/api/schema/``, its files served by this node; the schema's credentials."""

    template_name = "api/redoc.html"  # without the web fonts drf-spectacular's page fetches from a CDN


class SchemaView(JsonErrors, SpectacularAPIView):
    """``/api/schema/``: drf-spectacular's document, taking only a version this API has.

    drf-spectacular writes ``?version=`` into the document's ``info.version`` and
    into the ``Content-Disposition`` filename as given: a CR/LF there is a 500
    and a quote lets the caller write the header's other fields. The version is
    checked against the versions the API has, and the header is built by
    Django's own quoting, so it never carries the caller's bytes.
    """

    @extend_schema(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        api.check_params(request.query_params, SCHEMA_PARAMS)
        version = request.query_params.get("version")
        known = schema_versions()
        if version is not None and version not in known:
            raise api.BadParameter("version", f"this API has version {', '.join(known)}")
        response = super().get(request, *args, **kwargs)
        suffix = self.perform_content_negotiation(request, force=True)[0].format
        name = f"{spectacular_settings.TITLE or 'schema'}.{suffix}"
        response["Content-Disposition"] = content_disposition_header(False, name)
        return response

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        """``?format=`` names a renderer; one the route has not is a 400 naming it, not DRF's bare 404."""
        try:
            return super().perform_content_negotiation(request, force)
        except Http404:
            formats = ", ".join(sorted({renderer.format for renderer in self.get_renderers()}))
            raise api.BadParameter("format", f"one of {formats}") from None

    def _get_version_parameter(self, request: Request) -> None:
        """The version ``get`` let through is this API's only one: its document is the unversioned one."""
        return None

