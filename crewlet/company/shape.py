"""The company file's shape, section by section, as pydantic models: types, ranges, choices, patterns, unknown keys.

A section's model says what each of its keys takes (``int`` with ``ge``/``le``,
a non-empty string, a pattern, true or false), and forbids every other key;
:func:`read_section` validates the section's mapping with it and translates
pydantic's first error into the file's one-line :class:`CompanyError`
(:func:`crewlet.company.refusal.locate` finds it, the words here are the
file's): the dotted key path (``seats[2].placement.node``), the value as
written (bounded), and what is allowed, never pydantic's own text. A value
that looks like a credential is refused without echoing it (:func:`secretless`).

These models are only the file's shape: the engine's model of a company is
the frozen dataclasses of :mod:`crewlet.company.org`, which each step builds
from a validated section. What involves more than one section (grants
against ``mcp_servers``, identities against ``surfaces``, included files)
stays in the steps of :mod:`crewlet.company.parse`.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Mapping, Optional, TypeVar

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, ValidationError, ValidationInfo
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, core_schema

from crewlet.base.jsontext import dotted as dotted_path
from crewlet.base.logfmt import REDACTED
from crewlet.company.fields import _ENV, CompanyError, _looks_secret
from crewlet.company.refusal import Check, locate

M = TypeVar("M", bound="FileModel")

NON_EMPTY = "must be a non-empty string"
ENV_NAME = "must be an environment variable name"
#: What a value of the wrong type is told, by the field's type (a number's words add its range).
_TYPE_WORDS: dict[Any, str] = {bool: "must be true or false", str: NON_EMPTY}


class FileModel(BaseModel):
    """A section of the company file (or an entry of one): strict types, no key it does not name, no NaN or infinity."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", allow_inf_nan=False)


def words(default: Any, allowed: str, **kwargs: Any) -> Any:
    """A field every refusal of which says ``allowed`` (its type, its range and its check in one phrase)."""
    return Field(default, json_schema_extra={"allowed": allowed}, **kwargs)


def absent(**constraints: Any) -> Any:
    """The default of a key that may be left out, and is then left out of what its step builds.

    pydantic never validates a default, so the key given as null is still
    refused like any other value of the wrong type.
    """
    return Field(default=None, **constraints)


def text(pattern: Optional[re.Pattern[str]] = None, allowed: str = "") -> Check:
    """A non-empty string (not only blanks), matching ``pattern`` when one is given (else refused with ``allowed``)."""
    def problem(value: str) -> Optional[str]:
        if not value.strip():
            return NON_EMPTY
        if pattern is not None and not pattern.fullmatch(value):
            return allowed or f"must match {pattern.pattern}"
        return None
    return Check(problem)


class _Secretless:
    """A string refused, without being echoed, when it looks like a credential (a vendor token, a bearer, a URL password)."""

    def __init__(self, allowed: str, shape: Optional[re.Pattern[str]] = None) -> None:
        self.allowed = allowed
        self.shape = shape

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        if isinstance(value, str) and (_looks_secret(value) or (self.shape is not None and self.shape.fullmatch(value.strip()))):
            raise refuse_secret(self.allowed)
        return value


def secretless(allowed: str, shape: Optional[re.Pattern[str]] = None) -> _Secretless:
    """``Annotated[str, secretless(words), ...]``: checked before the string's own rules, so a token is never quoted.

    ``shape``: a secret's own shape besides the vendors' token prefixes (a Slack signing secret's 32 hex digits).
    """
    return _Secretless(allowed, shape)


#: An environment variable's name, refused unquoted when what was written is the secret itself.
EnvName = Annotated[
    str, secretless("must be an environment variable name, not the secret itself"), text(_ENV, ENV_NAME),
]
#: A non-empty string.
Text = Annotated[str, text()]


_UNSET: Any = object()


def refuse(allowed: str, *, key: Optional[str] = None, shown: Any = _UNSET) -> PydanticCustomError:
    """A validator's refusal in the file's words (raise it): the field is where pydantic was (``key``: a key of its
    mapping), the value the one there unless ``shown`` says what to show instead."""
    context: dict[str, Any] = {"allowed": allowed, "key": key}
    if shown is not _UNSET:
        context["shown"] = shown
    return PydanticCustomError("check", "{allowed}", context)


def refuse_secret(allowed: str, key: Optional[str] = None) -> PydanticCustomError:
    """A validator's refusal of a credential (raise it): the value is never quoted; ``key``: the mapping's key that held it."""
    return PydanticCustomError("secret", "{allowed}", {"allowed": allowed, "key": key})


def required(missing: str, **kwargs: Any) -> Any:
    """A field that must be given: left out or null, it is refused with ``missing`` (what it is, and why it is needed)."""
    return Field(json_schema_extra={"missing": missing}, **kwargs)


def _keys(model: type[BaseModel]) -> list[str]:
    return [info.alias or key for key, info in model.model_fields.items()]


def _span(info: FieldInfo) -> str:
    low = next((m.ge for m in info.metadata if isinstance(m, annotated_types.Ge)), None)
    high = next((m.le for m in info.metadata if isinstance(m, annotated_types.Le)), None)
    if low is None:
        return ""
    return f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"


def refusal(model: type[BaseModel], data: Any, exc: ValidationError, name: str, source: Optional[str]) -> CompanyError:
    """pydantic's first error in ``data`` (the section ``name``) as the file's one-line refusal."""
    found = locate(model, data, exc, into_items=True)
    if found.cause is not None:
        cause = found.cause
        return cause if isinstance(cause, CompanyError) and cause.source else CompanyError(cause.field, cause.value, cause.allowed, source)
    dotted, value, info = dotted_path(found.path, name), found.value, found.field
    if found.kind == "secret":
        key = found.context.get("key")
        return CompanyError(dotted_path((key,), dotted) if key else dotted, REDACTED, found.context["allowed"], source)
    if found.kind == "check":
        key = found.context.get("key")
        shown = found.context.get("shown", value)
        return CompanyError(dotted_path((key,), dotted) if key else dotted, shown, found.context["allowed"], source)
    if info is None and found.path:
        return CompanyError(dotted, value, "unknown key; allowed: " + ", ".join(_keys(found.owner)), source)
    if info is None or found.kind in ("model_type", "dict_type"):
        return CompanyError(dotted, value, "must be a mapping", source)
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    whole = found.owner.model_fields.get(str(found.path[-1])) is info  # the field's own value, not one of its items
    if whole and "missing" in extra and value is None:
        return CompanyError(dotted, None, str(extra["missing"]), source)
    if whole and "allowed" in extra:
        return CompanyError(dotted, value, str(extra["allowed"]), source)
    return CompanyError(dotted, value, _type_words(found.kind, info if whole else None), source)


def _type_words(kind: str, info: Optional[FieldInfo]) -> str:
    """What a value of the wrong type, or out of range, is told: by its field's type and range, or (an item's) by the error."""
    span = _span(info) if info is not None else ""
    if kind in ("greater_than_equal", "less_than_equal"):
        return f"must be {span}"
    annotation = info.annotation if info is not None else None
    if kind == "int_type" or annotation is int:
        return f"must be a whole number {span}".rstrip()
    if kind in ("float_type", "finite_number") or annotation is float:
        return f"must be a number {span}".rstrip()
    if kind == "bool_type" or annotation is bool:
        return _TYPE_WORDS[bool]
    if kind == "string_type" or annotation is str:
        return NON_EMPTY
    return "must be valid"


def read_section(model: type[M], value: Any, name: str, source: Optional[str]) -> M:
    """``value`` (the section ``name``; None: every default) validated by ``model``; a bad value is a :class:`CompanyError`.

    Validators reach ``name`` and ``source`` through the validation context
    (:func:`where`) to word a refusal that involves more than one key.
    """
    data = {} if value is None else value
    try:
        return model.model_validate(data, context={"name": name, "source": source})
    except ValidationError as exc:
        raise refusal(model, data, exc, name, source) from None


def where(info: ValidationInfo) -> tuple[str, Optional[str]]:
    """The section's dotted name and the file's source, for a validator's own refusal."""
    context: Mapping[str, Any] = info.context or {}
    return str(context.get("name", "")), context.get("source")


__all__ = ["ENV_NAME", "absent", "EnvName", "FileModel", "NON_EMPTY", "Text", "read_section", "refuse", "refuse_secret", "refusal", "required", "secretless", "text", "where", "words"]
