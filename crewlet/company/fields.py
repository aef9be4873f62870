"""The company file's field validators, and the error every refusal of the file is.

Each validator takes the value as the YAML loader built it, the dotted name
of its field and the file it came from, and returns the value checked (a
number made a float or an int, a string proven non-empty) or raises
:class:`CompanyError` naming the field, the value and what is allowed. A
credential written into the file is refused without echoing it.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping, NoReturn, Optional

from crewlet.base.jsontext import dotted
from crewlet.base.logfmt import REDACTED, redact_text
from crewlet.company.refusal import FieldValueError, is_finite_number

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


def _known(body: Mapping[str, Any], prefix: str, allowed: tuple[str, ...], source: Optional[str]) -> None:
    for key in body:
        if key not in allowed:
            raise CompanyError(f"{prefix}{key}", body[key], f"unknown key; allowed: {', '.join(allowed)}", source)


def _number(value: Any, name: str, lo: float, hi: Optional[float], integer: bool, source: Optional[str]) -> Any:
    """A whole number or a finite number within [lo, hi] (no upper bound when ``hi`` is None).

    NaN compares false with every bound, so it is refused as not a number
    rather than let through a range check; infinity is refused the same way.
    """
    ok = isinstance(value, int) if integer else is_finite_number(value)
    bound = f"between {lo:g} and {hi:g}" if hi is not None else f">= {lo:g}"
    if isinstance(value, bool) or not ok:
        what = "a whole number" if integer else "a number"
        raise CompanyError(name, value, f"must be {what} {bound}", source)
    if value < lo or (hi is not None and value > hi):
        raise CompanyError(name, value, f"must be {bound}", source)
    return int(value) if integer else float(value)


def _rate(value: Any, name: str, source: Optional[str]) -> float:
    """``notification_rate_limit``: 0 (off), or a finite rate within :data:`RATE_LIMIT_RANGE`."""
    lo, hi = RATE_LIMIT_RANGE
    allowed = f"must be 0 (off) or a number of wakes per second between {lo:g} and {hi:g}"
    if not is_finite_number(value):
        raise CompanyError(name, value, allowed, source)
    if value != 0 and not lo <= value <= hi:
        raise CompanyError(name, value, allowed, source)
    return float(value)


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


def _env_names(value: Any, name: str, source: Optional[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise CompanyError(name, value, "must be a list of environment variable names", source)
    names = []
    for i, v in enumerate(value):
        if isinstance(v, str) and _looks_secret(v):
            _refuse_inline_secret(f"{name}[{i}]", "must be an environment variable name, not the secret itself", source)
        names.append(_string(v, f"{name}[{i}]", source, _ENV, "must be an environment variable name"))
    return tuple(names)


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
