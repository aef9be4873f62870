"""JSON request bodies, and the one shape of a 400 answer across ``/api/`` and ``/operator/``.

Every JSON route of the API takes an object, so :class:`JSONObjectParser` (the
REST framework's only parser, see ``REST_FRAMEWORK`` in the settings) refuses
anything else before a view runs: a body that is not UTF-8, not JSON, not an
object, nested deeper than :data:`MAX_DEPTH`, or carrying a string nothing
downstream can store (a lone UTF-16 surrogate cannot be encoded as UTF-8, a
NUL cannot be stored by PostgreSQL). Both checks are
:mod:`crewlet.jsontext`'s: the depth is measured without recursion *before*
decoding, so a hostile body never reaches the recursive decoder.
:func:`parse_object` is the same check for code that reads a body by
hand.

A refusal is ``400 {"error": <code>, "param": <what>, "reason": <why>}`` —
:func:`bad_request_body`, the shape ``eventstore.api.BadParameter`` answers for
a query parameter and :func:`exception_handler` (the REST framework's, named in
the settings) gives a serializer's field errors too. :class:`BadParameterSerializer`
and :class:`DetailSerializer` declare the error answers in every app's OpenAPI
schema.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import RegexValidator
from rest_framework import exceptions, serializers, status
from rest_framework.parsers import BaseParser

from crewlet.jsontext import JSONTooDeep, dotted, escape, find_unstorable, load_json

#: The keys of every 400 answer.
K_ERROR = "error"
K_PARAM = "param"
K_REASON = "reason"
#: ``error`` codes: a query parameter or body field was refused / the body as a whole was.
ERROR_BAD_PARAMETER = "bad_parameter"
ERROR_BAD_BODY = "bad_body"
#: ``param`` naming the request body as a whole.
PARAM_BODY = "body"
#: The deepest a request body's arrays and objects may nest (the API's own bodies nest 2 deep).
MAX_DEPTH = 32


def bad_request_body(error: str, param: str, reason: str) -> dict[str, str]:
    """The body of every 400 answer: what was refused (``param``) and why, under one ``error`` code."""
    return {K_ERROR: error, K_PARAM: param, K_REASON: reason}


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

    ``pattern`` must match the whole value. Nothing is trimmed, so the schema's
    lengths and pattern are exactly what the server checks.
    """

    def __init__(self, *, pattern: Optional[str] = None, pattern_says: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)
        if pattern is not None:
            self.validators.append(WholeMatch(pattern, pattern_says or f"must match {pattern}"))

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """DRF's handler, with every 400 in the one shape ``{"error", "param", "reason"}``: every app's routes.

    DRF's views module is imported here, not at the top: defining its views
    reads the settings' parser, which is this module's.
    """
    from rest_framework.views import exception_handler as drf_exception_handler

    return drf_exception_handler(as_one_shape(exc), context)


class BadParameterSerializer(serializers.Serializer):
    """The one shape of every 400 (:func:`bad_request_body`), declared for the OpenAPI schema."""

    error = serializers.CharField(
        help_text="bad_parameter (a query parameter or body field), bad_body (the body as a whole), "
        "or an operator tool's refusal (unknown_tool, bad_args)"
    )
    param = serializers.CharField(help_text="what was refused: a parameter, a body field's dotted path, or body")
    reason = serializers.CharField()


class DetailSerializer(serializers.Serializer):
    """The shape of a 401, 404 or 503 answer: the REST framework's ``{"detail": ...}``."""

    detail = serializers.CharField()


def error_responses(*statuses: int, shape: type[serializers.Serializer] = DetailSerializer) -> dict[int, type[serializers.Serializer]]:
    """The OpenAPI answers of a route's refusals: a 400 is always the one bad-parameter shape, the others ``shape``."""
    return {code: BadParameterSerializer if code == 400 else shape for code in statuses}


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
    "ERROR_BAD_BODY",
    "ERROR_BAD_PARAMETER",
    "JSONObjectParser",
    "K_ERROR",
    "K_PARAM",
    "K_REASON",
    "MAX_DEPTH",
    "PARAM_BODY",
    "StrictBooleanField",
    "StrictCharField",
    "WholeMatch",
    "as_one_shape",
    "bad_request_body",
    "error_responses",
    "first_field_error",
    "parse_object",
]
