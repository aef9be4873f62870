"""Instants as exact microseconds since the epoch, their wire spelling, and series durations.

Reads select timestamps as microseconds (exact, and what cursors and bars are
made of), so turning one back into the wire's text happens per row: it is
arithmetic with a bounded per-day cache, not a datetime built per row.
"""
from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from typing import Optional

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)


def to_us(ts: datetime) -> int:
    """Microseconds since the Unix epoch (exact: no float in between)."""
    return (ts - EPOCH) // _US


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


_DAY_US = 86_400_000_000
_EPOCH_ORDINAL = EPOCH.toordinal()
#: "00".."59": a table lookup is cheaper than a format spec, per field, per row.
_TWO_DIGITS: tuple[str, ...] = tuple(f"{n:02d}" for n in range(60))
#: "YYYY-MM-DDT" by day since the epoch: a page's rows span a handful of days.
_DAY_PREFIXES: dict[int, str] = {}
_DAY_PREFIXES_MAX = 4096


def _day_prefix(days: int) -> str:
    day = date.fromordinal(_EPOCH_ORDINAL + days)
    prefix = f"{day.year:04d}-{day.month:02d}-{day.day:02d}T"
    if len(_DAY_PREFIXES) >= _DAY_PREFIXES_MAX:
        _DAY_PREFIXES.clear()  # bounded; a refill costs one date per day
    _DAY_PREFIXES[days] = prefix
    return prefix


def format_us(us: int) -> str:
    """``format_timestamp(from_us(us))`` to the byte, by arithmetic: a page formats hundreds.

    The date part is computed once per day and remembered; the time of day is
    divisions and table lookups, no datetime built.
    """
    days, of_day = divmod(us, _DAY_US)
    prefix = _DAY_PREFIXES.get(days) or _day_prefix(days)
    secs, frac = divmod(of_day, 1_000_000)
    mins, sec = divmod(secs, 60)
    hour, minute = divmod(mins, 60)
    two = _TWO_DIGITS
    return f"{prefix}{two[hour]}:{two[minute]}:{two[sec]}.{frac:06d}Z"


def instant(now: Optional[datetime] = None) -> datetime:
    """The asker's instant: the clock read once, UTC, at the store's microsecond resolution."""
    value = now if now is not None else datetime.now(timezone.utc)
    return value.astimezone(timezone.utc)


_DURATION = re.compile(r"([1-9][0-9]{0,5})([smhd])")
_UNIT_US = {"s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}


#: The same rule as the OpenAPI pattern of ``window`` and ``bucket``.
DURATION_PATTERN = "^" + _DURATION.pattern + "$"


def parse_duration(text: str) -> int:
    """``15m``, ``1h``, ``24h``, ``7d`` as microseconds; anything else is a ValueError.

    Exactly :data:`DURATION_PATTERN` (no surrounding blanks): the schema and the
    server accept the same strings.
    """
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError("must be a whole number followed by s, m, h or d (for example 15m, 1h, 7d)")
    return int(match.group(1)) * _UNIT_US[match.group(2)]
