"""JSON request bodies, and the one shape of every error answer across ``/api/`` and ``/operator/``.

Every JSON route of the API takes an object, so :class:`JSONObjectParser` (the
REST framework's only parser, see ``REST_FRAMEWORK`` in the settings) refuses
anything else before a view runs: a body that is not UTF-8, not JSON, not an
object, nested deeper than :data:`MAX_DEPTH`, or carrying a string nothing
downstream can store (a lone UTF-16 surrogate cannot be encoded as UTF-8, a
NUL cannot be stored by PostgreSQL). Both checks are
:mod:`crewlet.base.jsontext`'s: the depth is measured without recursion *before*
decoding, so a hostile body never reaches the recursive decoder.
:func:`parse_object` is the same check for code that reads a body by
hand.

Every error answer is ``{"error": <code>, "param": <what>, "reason": <why>}``
(:func:`bad_request_body`): ``error`` a stable code a program can branch on,
``param`` the query parameter, body field (dotted) or header that was refused
(``""`` when the refusal is about no one part of the request), ``reason`` a
sentence for a person. A few answers add keys beside the three (a history
read's 404 keeps its ``coverage`` and ``at``). ``eventstore.api.BadParameter``
answers a query parameter in it, :func:`error_response` is how a view answers
any other error, and :func:`exception_handler` (the REST framework's, named in
the settings) puts every exception the framework answers — a serializer's
``{"field": ["..."]}``, a 401, a 404, a 405, a 406 — into it. It is also the
one place a view's "no engine here" (:class:`~crewlet.engine.runtime.EngineAway`:
no engine, queue or service in this process, no fleet to ask, no answer in
time) becomes an answer: 503, ``error: unavailable``, its reason.
:class:`ErrorSerializer` declares it in the OpenAPI schema (``crewlet.http.errors``
adds it to every operation).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied, ValidationError as DjangoValidationError
from django.core.validators import RegexValidator
from django.http import Http404
from rest_framework import exceptions, serializers, status
from rest_framework.parsers import BaseParser
from rest_framework.response import Response

from crewlet.base.jsontext import JSONTooDeep, dotted, escape, find_unstorable, load_json
from crewlet.engine.runtime import EngineAway

#: The keys of every 400 answer.
K_ERROR = "error"
K_PARAM = "param"
K_REASON = "reason"
#: ``error`` codes: a query parameter or body field was refused / the body as a whole was.
ERROR_BAD_PARAMETER = "bad_parameter"
ERROR_BAD_BODY = "bad_body"
#: ``param`` naming the request body as a whole; naming no one part of the request.
PARAM_BODY = "body"
PARAM_NONE = ""
#: ``error`` for an answer that names no code of its own, by its status.
ERROR_CODES: dict[int, str] = {
    400: "bad_request",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    429: "throttled",
    500: "server_error",
    503: "unavailable",
}
#: ``param`` of the framework's refusals that are about one part of the request.
_PARAM_OF = {
    exceptions.MethodNotAllowed: "method",
    exceptions.NotAcceptable: "Accept",
    exceptions.UnsupportedMediaType: "Content-Type",
}
#: Text a store can keep: no NUL (PostgreSQL cannot hold one). A pattern of a body's text field excludes it too.
#: Not empty: a blank value is the field's ``allow_blank`` to allow (the schema's other ``oneOf`` branch).
STORABLE_PATTERN = r"[^\x00]+"
#: The deepest a request body's arrays and objects may nest (the API's own bodies nest 2 deep).
MAX_DEPTH = 32


def bad_request_body(error: str, param: str, reason: str) -> dict[str, str]:
    """The body of every 400 answer: what was refused (``param``) and why, under one ``error`` code."""
    return {K_ERROR: error, K_PARAM: param, K_REASON: reason}


def error_code(status_code: int) -> str:
    """The ``error`` of an answer with this status that names no code of its own."""
    return ERROR_CODES.get(status_code, "server_error" if status_code >= 500 else "bad_request")


def error_response(status_code: int, reason: str, *, error: str = "", param: str = PARAM_NONE, **extra: Any) -> Response:
    """An error answer of the one shape (``error`` defaults to the status's code); ``extra`` keys go beside the three."""
    return Response({**bad_request_body(error or error_code(status_code), param, reason), **extra}, status=status_code)


class BodyRefused(ValueError):
    """A request body that is not a storable JSON object; ``reason`` says why in a person's words."""

    def __init__(self, reason: str, param: str = PARAM_BODY) -> None:
        super().__init__(reason)
        self.reason = reason
        self.param = param


class BadBody(exceptions.APIException):
    """400 with :func:`bad_request_body`'s shape (``error: bad_body``), for a body refused as a whole or by field."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = ERROR_BAD_BODY

    def __init__(self, reason: str, param: str = PARAM_BODY, error: str = ERROR_BAD_BODY) -> None:
        super().__init__(reason)
        # APIException coerces a dict detail's values to ErrorDetail; keep plain strings.
        self.detail = bad_request_body(error, param, reason)


class Unavailable(exceptions.APIException):
    """503 (``error: unavailable``): what the request needs of the engine is not in this process; ``detail`` says why."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = ERROR_CODES[status.HTTP_503_SERVICE_UNAVAILABLE]


class StrictBooleanField(serializers.BooleanField):
    """JSON ``true`` / ``false`` only: the schema says boolean, so ``"yes"``, ``1`` or ``"false"`` is refused."""

    def to_internal_value(self, data: Any) -> bool:
        if isinstance(data, bool):
            return data
        self.fail("invalid", input=data)
        raise AssertionError("unreachable")  # fail() raises


class WholeMatch(RegexValidator):
    """A pattern the whole value must match (``RegexValidator`` searches, and its ``$`` passes a final newline).

    Its ``regex.pattern`` is what the OpenAPI schema publishes, anchored, so a
    client's validator and this one agree.
    """

    def __init__(self, pattern: str, message: str) -> None:
        super().__init__(f"^(?:{pattern})$", message=message)

    def __call__(self, value: Any) -> None:
        if not self.regex.fullmatch(str(value)):
            raise DjangoValidationError(self.message, code=self.code, params={"value": value})


class StrictCharField(serializers.CharField):
    """A JSON string only, kept as sent (the REST framework would turn ``12`` into text and trim spaces).

    ``pattern`` must match the whole value; without one, :data:`STORABLE_PATTERN`
    (the parser refuses a NUL, so the schema says so). Nothing is trimmed, so
    the schema's lengths and pattern are exactly what the server checks.
    """

    def __init__(
        self, *, pattern: Optional[str] = None, pattern_says: str = "", **kwargs: Any
    ) -> None:
        if pattern is None:
            pattern, pattern_says = STORABLE_PATTERN, "must not contain a NUL character"
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)
        self.validators.append(WholeMatch(pattern, pattern_says or f"must match {pattern}"))

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class ClosedSerializer(serializers.Serializer):
    """A request body taking its declared fields only: an unknown one is refused, never silently ignored.

    A misspelt optional field (``stop_runing``) would otherwise be a call
    half-accepted with the default in its place. ``crewlet.http.schema.AutoSchema``
    states it as ``additionalProperties: false``.
    """

    def validate(self, attrs: Any) -> Any:
        data = self.initial_data if isinstance(self.initial_data, Mapping) else {}
        unknown = sorted(str(key) for key in data if key not in self.fields)
        if unknown:
            raise serializers.ValidationError({unknown[0]: f"unknown field; this body takes: {', '.join(self.fields)}"})
        return attrs


def first_field_error(detail: Any, path: str = "") -> tuple[str, str]:
    """A serializer's error detail as (the first refused field's dotted path, its first message)."""
    while True:
        if isinstance(detail, dict) and detail:
            key, detail = next(iter(detail.items()))
            if key != "non_field_errors":
                path = f"{path}.{key}" if path else str(key)
        elif isinstance(detail, list) and detail:
            detail = detail[0]
        else:
            return path or PARAM_BODY, str(detail)


def as_one_shape(exc: Exception) -> Exception:
    """A REST framework 400 (a serializer's field errors, a parser's refusal) as a 400 of the one shape."""
    if isinstance(exc, exceptions.ValidationError):
        param, reason = first_field_error(exc.detail)
        return BadBody(reason, param, error=ERROR_BAD_PARAMETER if param != PARAM_BODY else ERROR_BAD_BODY)
    if isinstance(exc, exceptions.ParseError):
        return BadBody(str(exc.detail))
    return exc


def _framework_exception(exc: Exception) -> Exception:
    """Django's 404 and 403 as the REST framework's (which its handler turns them into anyway), no engine here as a 503."""
    if isinstance(exc, Http404):
        return exceptions.NotFound()
    if isinstance(exc, DjangoPermissionDenied):
        return exceptions.PermissionDenied()
    if isinstance(exc, EngineAway):
        return Unavailable(exc.reason)
    return exc


def exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """DRF's handler (its headers: the Bearer challenge, Retry-After), every answer in the one error shape.

    DRF's views module is imported here, not at the top: defining its views
    reads the settings' parser, which is this module's.
    """
    from rest_framework.views import exception_handler as drf_exception_handler

    exc = as_one_shape(_framework_exception(exc))
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    data = response.data
    if isinstance(data, dict) and K_ERROR in data and K_REASON in data:
        return response
    code = exc.get_codes()
    error = code if isinstance(code, str) else error_code(response.status_code)
    param = next((p for kind, p in _PARAM_OF.items() if isinstance(exc, kind)), PARAM_NONE)
    response.data = bad_request_body(error, param, str(exc.detail))
    return response


class ErrorSerializer(serializers.Serializer):
    """The one shape of every error answer (:func:`bad_request_body`), declared for the OpenAPI schema."""

    error = serializers.CharField(
        help_text="a stable code: bad_parameter (a query parameter or body field), bad_body (the body as a whole), "
        "not_authenticated, not_found, method_not_allowed, not_acceptable, unsupported_media_type, conflict, "
        "unavailable, or an operator tool's refusal (unknown_tool, bad_args, gone, no_subscription)"
    )
    param = serializers.CharField(
        allow_blank=True,
        help_text='what was refused: a query parameter, a body field\'s dotted path, body, a header, method or path; '
        '"" when the answer is about no one part of the request',
    )
    reason = serializers.CharField(help_text="why, in a sentence for a person")


def error_responses(*statuses: int) -> dict[int, type[serializers.Serializer]]:
    """The OpenAPI answers of a route's refusals: each the one error shape (``crewlet.http.errors`` adds what every route can answer)."""
    return {code: ErrorSerializer for code in statuses}


def _refuse_constant(name: str) -> Any:
    raise BodyRefused(f"{name} is not a JSON number")


def _check_strings(value: Any) -> None:
    """Refuse a key or string a store cannot keep, naming where it is."""
    found = find_unstorable(value)
    if found is None:
        return
    if found.in_key:
        raise BodyRefused(
            "a key contains a NUL character or a lone surrogate, which cannot be stored", dotted(found.parts[:-1]) or PARAM_BODY
        )
    what = "a NUL character" if found.is_nul else f"a lone surrogate ({escape(found.char)})"
    raise BodyRefused(f"contains {what}, which cannot be stored", dotted(found.parts) or PARAM_BODY)


def parse_object(raw: bytes, *, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """``raw`` as a JSON object, or :class:`BodyRefused` saying why it is not one this API can take."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyRefused(f"is not UTF-8 (byte {exc.start})") from None
    try:
        value = load_json(text, max_depth=max_depth, parse_constant=_refuse_constant)
    except JSONTooDeep:
        raise BodyRefused(f"nests deeper than {max_depth} levels of arrays and objects") from None
    except BodyRefused:
        raise
    except ValueError as exc:  # JSONDecodeError, an over-long integer
        raise BodyRefused(f"is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BodyRefused(f"must be a JSON object, not a JSON {_json_kind(value)}")
    _check_strings(value)
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


class JSONObjectParser(BaseParser):
    """The REST framework's JSON parser for this API: :func:`parse_object`, a refusal a 400 :class:`BadBody`."""

    media_type = "application/json"

    def parse(self, stream: Any, media_type: Optional[str] = None, parser_context: Optional[Mapping[str, Any]] = None) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            return parse_object(raw)
        except BodyRefused as exc:
            raise BadBody(exc.reason, exc.param) from None


__all__ = [
    "BadBody",
    "BodyRefused",
    "ClosedSerializer",
    "ERROR_CODES",
    "ERROR_BAD_BODY",
    "ERROR_BAD_PARAMETER",
    "JSONObjectParser",
    "K_ERROR",
    "K_PARAM",
    "K_REASON",
    "ErrorSerializer",
    "MAX_DEPTH",
    "PARAM_BODY",
    "PARAM_NONE",
    "STORABLE_PATTERN",
    "StrictBooleanField",
    "StrictCharField",
    "Unavailable",
    "WholeMatch",
    "as_one_shape",
    "bad_request_body",
    "error_code",
    "error_response",
    "error_responses",
    "exception_handler",
    "first_field_error",
    "parse_object",
]
