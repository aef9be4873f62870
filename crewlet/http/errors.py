"""The one error shape (``crewlet.http.bodies``) where the REST framework does not answer, and in the OpenAPI schema.

A request for a path no route has (``/api/nope``) never reaches a REST
framework view, so Django's ``handler404`` answers it: :func:`page_not_found`
and :func:`server_error` answer an ``/api/`` path in the one JSON shape and
leave every other path to Django's pages. :func:`declare_errors` (a
drf-spectacular post-processing hook) gives every operation of the schema the
error answers any route can give — 400, 401, 406, 415 for a body — in that
shape, so a client's validator and the server agree on every status.
"""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

from crewlet.http.bodies import PARAM_NONE, bad_request_body, error_code

#: The paths whose errors are the API's JSON rather than Django's pages.
API_PREFIX = "/api/"
#: ``param`` of a 404 for a path no route has.
PARAM_PATH = "path"
#: The schema component every error answer refers to (drf-spectacular names a serializer's by its class).
ERROR_COMPONENT = "#/components/schemas/Error"
#: What any operation can answer whatever it does: a refused parameter, no credentials, an Accept it cannot meet.
ANY_OPERATION = {
    "400": "a query parameter or body field was refused (`param` names it)",
    "401": "no operator token or staff session, or an unknown one",
    "406": "the Accept header names nothing this route can answer in",
}
#: What an operation that takes a body can answer too.
WITH_BODY = {"415": "the body is not application/json"}


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``handler404``: a path under ``/api/`` no route has is the API's JSON 404; elsewhere Django's page."""
    if _is_api(request):
        return JsonResponse(bad_request_body(error_code(404), PARAM_PATH, f"no API route at {request.path}"), status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: an ``/api/`` request that broke is the API's JSON 500 (no detail of the fault); elsewhere Django's page."""
    if _is_api(request):
        return JsonResponse(bad_request_body(error_code(500), PARAM_NONE, "the server failed to answer; see its log"), status=500)
    return defaults.server_error(request)


def _error_answer(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": ERROR_COMPONENT}}}}


def declare_errors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Every operation's error answers in the one shape: the ones it declared, plus what any route can answer."""
    for item in result.get("paths", {}).values():
        for operation in item.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            extra = {**ANY_OPERATION, **(WITH_BODY if "requestBody" in operation else {})}
            for code, description in extra.items():
                responses.setdefault(code, _error_answer(description))
    return result


__all__ = ["API_PREFIX", "PARAM_PATH", "declare_errors", "page_not_found", "server_error"]
