"""The error every refusal of the company file is, what a credential looks like, and the few checks the steps share.

The shape of each section (types, ranges, choices, patterns, unknown keys)
is its pydantic model's (:mod:`crewlet.company.shape`, :mod:`crewlet.company.sections`);
what is here is what the steps between sections still use: a mapping of
entries read before each entry's model (``_mapping``), the name of an entry
that is a mapping's key (``_string``), a credential refused unechoed
(``_refuse_inline_secret``, ``_looks_secret``, which the models' own
:func:`~crewlet.company.shape.secretless` stands on), and free-form tool
arguments walked for NaN (``_refuse_non_finite``).
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping, NoReturn, Optional

from crewlet.base.jsontext import dotted
from crewlet.base.logfmt import REDACTED, redact_text
from crewlet.company.refusal import FieldValueError

#: ``notification_rate_limit``, wakes per seat per second, when it is not 0 (off). A rate below one per
#: second widens the valve's window to 1/rate seconds, so the floor bounds that window (10,000 s); above
#: the ceiling the valve would never shut.
RATE_LIMIT_RANGE = (0.0001, 1000.0)
#: Values that are credentials by their shape, whatever they are called: chat, forge and model vendors' token prefixes.
_SECRET_VALUE = re.compile(r"^(?:xox[a-z]-|xapp-|ghp_|gho_|ghs_|ghu_|github_pat_|glpat-|sk-|sk_live_|AKIA[0-9A-Z]{12})")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CompanyError(FieldValueError):
    """A company file that cannot be served; names the field, the value and what is allowed."""

    where = "in"


def _mapping(value: Any, name: str, source: Optional[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise CompanyError(name, value, "must be a mapping", source)
    return value


def _string(value: Any, name: str, source: Optional[str], pattern: Optional[re.Pattern[str]] = None, what: str = "") -> str:
    if not isinstance(value, str) or not value.strip():
        raise CompanyError(name, value, "must be a non-empty string", source)
    if pattern is not None and not pattern.fullmatch(value):
        raise CompanyError(name, value, what or f"must match {pattern.pattern}", source)
    return value


def _refuse_inline_secret(name: str, allowed: str, source: Optional[str]) -> NoReturn:
    """Refuse a credential written into the company file, naming the field and never echoing the value."""
    raise CompanyError(name, REDACTED, allowed, source)


def _looks_secret(value: str) -> bool:
    """A credential by its shape: a vendor token prefix, or text the log redactor would blank (a bearer, a URL password)."""
    return bool(_SECRET_VALUE.match(value.strip())) or redact_text(value) != value


def _refuse_non_finite(value: Any, name: str, source: Optional[str]) -> None:
    """Refuse NaN or infinity anywhere in ``value`` (a tool call's arguments): JSON has neither, so every call would fail.

    Walked with an explicit stack: the loader bounds how many values there
    are, not how deep a walk of them would recurse.
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, at = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise CompanyError(dotted(at, name), item, "must be a finite number: JSON has no NaN or infinity", source)
        if isinstance(item, Mapping):
            stack.extend((child, (*at, str(key))) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, (*at, i)) for i, child in enumerate(item))
