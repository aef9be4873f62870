"""How a configured value is refused: one bounded line naming the field, the value and what is allowed.

Settings and the company file refuse a value in the same words
(:class:`FieldValueError`), so an operator reads one shape whichever file was
wrong. A refusal quotes at most :data:`~crewlet.base.jsontext.QUOTE_LIMIT`
characters of a value (:func:`quote_value`), so no value, however large or
however aliased, makes a large message. :func:`is_finite_number` is what every
range check of both files stands on: NaN would pass one by failing every
comparison.
"""
from __future__ import annotations

import math
import re
import reprlib
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pydantic import BaseModel, GetCoreSchemaHandler, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, core_schema

from crewlet.base.jsontext import QUOTE_LIMIT, storable_text

#: How much of what is allowed, and of a field's name, one refusal message carries.
ALLOWED_LIMIT = 1000

#: A character that would end a one-line message, or hide in one.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class _Quoting(reprlib.Repr):
    """reprlib's repr sized for one line of a refusal: a few levels, a few items, and text clipped before it is quoted.

    The standard ``repr`` of a refused value is built whole before anything
    could clip it — a YAML alias bomb's expansion, a 5 MB string — so a
    refusal quotes through this instead, which never looks past its limits.
    """

    #: How much of a string nested in a list or a mapping is quoted (the value itself gets QUOTE_LIMIT).
    NESTED_STRING = 40
    #: Integers wider than this are named by their width: the repr of a huge one is slow, and refused past
    #: ``sys.get_int_max_str_digits()``.
    MAX_INT_BITS = 256

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxdict = 4
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = 6
        self.maxstring = self.maxother = QUOTE_LIMIT
        self.maxlong = 60

    def repr_str(self, x: str, level: int) -> str:
        limit = self.maxstring if level == self.maxlevel else self.NESTED_STRING
        if len(x) <= limit:
            return repr(x)
        return repr(x[:limit]) + "…"

    def repr_bytes(self, x: bytes, level: int) -> str:
        return repr(x) if len(x) <= self.NESTED_STRING else repr(x[: self.NESTED_STRING]) + "…"

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > self.MAX_INT_BITS:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_QUOTING = _Quoting()


def quote_value(value: Any) -> str:
    """``value`` as a refusal quotes it: its repr, bounded to QUOTE_LIMIT characters, storable and on one line."""
    return one_line(_QUOTING.repr(value), QUOTE_LIMIT)


def one_line(text: str, limit: int) -> str:
    """``text`` clipped to ``limit`` characters, with every line break and control character written as its escape."""
    clipped = storable_text(text, limit)
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), clipped)


class FieldValueError(ValueError):
    """A configured value refused: ``<field>=<value>: <what is allowed> (<where> <source>)``.

    Settings and the company file refuse a value in the same words, so an
    operator reads one shape whichever file was wrong. The message is one
    line and bounded whatever was refused (:func:`quote_value`): the admin's
    revision form shows it, and a value crafted to make it large must not
    take the node's memory.
    """

    #: How the source is introduced in the message ("from" an env var, "in" a file).
    where = "from"

    def __init__(self, field: str, value: Any, allowed: str, source: Optional[str] = None) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        self.source = source
        message = f"{one_line(field, QUOTE_LIMIT)}={self.show(value)}: {one_line(allowed, ALLOWED_LIMIT)}"
        if source:
            message += f" ({self.where} {one_line(source, QUOTE_LIMIT)})"
        super().__init__(message)

    @staticmethod
    def show(value: Any) -> str:
        return quote_value(value)


def is_finite_number(value: Any) -> bool:
    """An int or a finite float, never a bool: NaN passes every range check by failing every comparison.

    An int is finite however large (``math.isfinite`` would overflow converting one past a float's range).
    """
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


@dataclass(frozen=True)
class Located:
    """pydantic's first error, found in the data that was validated: what a refusal names.

    ``path`` runs from the validated data to the refused value: field names,
    and (when the walk goes into lists and mappings) list indexes and mapping
    keys. ``owner`` is the model whose field ``field`` is; ``field`` is None for
    a key ``owner`` does not know. ``cause`` is a refusal a validator raised
    itself, carried back by pydantic, to be raised as it is.
    """

    path: tuple[str | int, ...]
    value: Any
    owner: type[BaseModel]
    field: Optional[FieldInfo]
    kind: str
    context: Mapping[str, Any]
    cause: Optional[FieldValueError]


def _model(kind: Any) -> Optional[type[BaseModel]]:
    """The model a field's type is (``Optional`` seen through), or None."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return next((m for m in map(_model, typing.get_args(kind)) if m is not None), None)
    return None


def _items_model(kind: Any) -> Optional[type[BaseModel]]:
    """The model of the items a list or mapping field holds (``Optional`` seen through), or None."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return next((m for m in map(_items_model, args) if m is not None), None)
    return _model(args[-1]) if args and typing.get_origin(kind) in (list, tuple, dict) else None


def _child(value: Any, part: str | int) -> Any:
    """``value[part]`` for a mapping or a list, an attribute of anything else (a model), None when there is none."""
    if isinstance(value, Mapping):
        return value.get(part)
    if isinstance(value, (list, tuple)) and isinstance(part, int):
        return value[part] if -len(value) <= part < len(value) else None
    return getattr(value, str(part), None)


def locate(model: type[BaseModel], data: Any, exc: ValidationError, *, into_items: bool) -> Located:
    """Where ``exc``'s first error is in ``data`` (an unknown key's first, so a misspelt key is named before its neighbours).

    ``into_items``: follow a list index or a mapping key into the value (the
    company file names ``seats[2].handle``); otherwise stop at the field that
    holds the list (a settings list is refused whole).
    """
    errors = exc.errors(include_url=False)
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    context = error.get("ctx", {})
    cause = context.get("error")
    path: list[str | int] = []
    value: Any = data
    owner, info, items, at_model = model, None, None, True
    for part in error["loc"]:
        if at_model:
            if not isinstance(part, str):
                break
            value, info = _child(value, part), owner.model_fields.get(part)
            path.append(part)
            if info is None:
                break
            inner = _model(info.annotation)
            owner, at_model, items = (inner, True, None) if inner else (owner, False, _items_model(info.annotation))
        elif not into_items or part == "[key]":
            break
        else:
            value = _child(value, part)
            path.append(part)
            owner, at_model = (items, True) if items else (owner, False)
    return Located(
        tuple(path), value, owner, info, error["type"], context, cause if isinstance(cause, FieldValueError) else None,
    )


@dataclass(frozen=True)
class Check:
    """A rule past a value's type and range (``Annotated[str, Check(...)]``).

    ``problem`` says, in the refusal's words, what is wrong with a value, or
    None; ``choices`` lists a choice's values for :func:`known_settings`.
    """

    problem: typing.Callable[[Any], Optional[str]]
    choices: Optional[tuple[Any, ...]] = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        if problem := self.problem(value):
            raise PydanticCustomError("check", "{allowed}", {"allowed": problem})
        return value


def one_of(*choices: Any) -> Check:
    """A choice, checked after the type: a ``Literal`` takes ``True`` for ``1`` and refuses ``'3'`` as no choice."""
    words = "must be one of " + ", ".join(map(str, choices))
    return Check(lambda value: None if value in choices else words, choices)
