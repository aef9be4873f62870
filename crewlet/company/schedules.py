"""The company file's ``schedules`` and ``timezone``: each schedule's seat, task and cadence, validated.

A schedule fires ``every`` a duration (slots aligned to the UTC epoch) or at
each instant of a ``cron`` expression read in a time zone: the schedule's own
``timezone``, else the company's, else UTC. The expression is read by
`cronsim <https://pypi.org/project/cronsim/>`_ (Debian cron's rules, its
daylight-saving behaviour included) and the zone by :mod:`zoneinfo`, so a bad
expression or an unknown zone is refused here, at load, in one line naming
the field, never at the first firing.
"""
from __future__ import annotations

import math
import re
from datetime import datetime, timezone as dt_timezone
from typing import Annotated, Any, Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import PlainValidator, ValidationInfo, model_validator

from crewlet.company.fields import CompanyError
from crewlet.company.org import SCHEDULE_TIMEOUT_S, Schedule, Seat
from crewlet.company.refusal import is_finite_number
from crewlet.company.shape import FileModel, Text, read_section, refuse, where

#: A schedule's ``every``, in seconds: each firing is a whole turn of a seat and a row in the
#: coordination store, so a minute is the shortest cadence (cron's own); a year the longest.
SCHEDULE_EVERY_RANGE_S = (60.0, 365 * 86400.0)
#: ``schedules[].timeout``: one second to a day.
SCHEDULE_TIMEOUT_RANGE_S = (1.0, 86400.0)
#: The longest cron expression and zone name taken (both are short in every real file).
MAX_CRON_CHARS = 120
MAX_TIMEZONE_CHARS = 64
CRON_RULE = 'must be a five-field cron expression like "0 9 * * 1-5" (minute hour day-of-month month day-of-week)'
TIMEZONE_RULE = "must be an IANA time zone name like Europe/Berlin, America/New_York or UTC"
CADENCE_RULE = 'must have exactly one of every: 90s|15m|24h|7d or cron: "0 9 * * 1-5"'
#: Where an expression is first evaluated at load, to refuse one that never fires; fixed, so a load never depends on the clock.
_PROBE_FROM = datetime(2000, 1, 1, tzinfo=dt_timezone.utc)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration_text(seconds: float) -> str:
    """A number of seconds in the largest unit that divides it (``60.0`` -> ``1m``), as the file writes one."""
    for unit, size in sorted(_UNIT_S.items(), key=lambda item: -item[1]):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _duration(bounds_s: tuple[float, float]) -> PlainValidator:
    """``90s``, ``15m``, ``24h``, ``7d`` (or a number of seconds) as float seconds within ``bounds_s``.

    Finite only: ``.inf`` or a number of digits no float holds would be a
    schedule that never fires, and a wait the scheduler cannot compute.
    """
    lo, hi = bounds_s
    allowed = f"must be a duration like 90s, 15m, 24h or 7d, between {_duration_text(lo)} and {_duration_text(hi)}"

    def seconds_of(text: Any) -> float:
        if is_finite_number(text):
            seconds = float(text) if abs(text) <= hi else math.inf  # an int too large for a float is past the range anyway
        else:
            m = _DURATION.match(text.strip()) if isinstance(text, str) else None
            seconds = float(m.group(1)) * _UNIT_S[m.group(2)] if m else math.nan
        if not math.isfinite(seconds) or not lo <= seconds <= hi:
            raise refuse(allowed)
        return seconds
    return PlainValidator(seconds_of)


def _zone(value: Any) -> str:
    """An IANA zone name :mod:`zoneinfo` knows (``timezone``, ``schedules[].timezone``); anything else is refused."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TIMEZONE_CHARS:
        raise refuse(TIMEZONE_RULE)
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise refuse(TIMEZONE_RULE) from None
    return value


def _cron(value: Any) -> str:
    """A cron expression cronsim reads and that fires at least once in 50 years, its fields single-spaced."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_CRON_CHARS:
        raise refuse(CRON_RULE)
    expr = " ".join(value.split())
    try:
        next(CronSim(expr, _PROBE_FROM))
    except CronSimError as exc:
        raise refuse(f"{CRON_RULE}; {str(exc).lower()}") from None
    except StopIteration:
        raise refuse(f"{CRON_RULE}; this one never fires") from None
    return expr


#: A time zone name, checked by :mod:`zoneinfo` (the company's ``timezone``, a schedule's own).
Zone = Annotated[str, PlainValidator(_zone)]


class ScheduleFile(FileModel):
    """An entry of ``schedules``: its name, seat, cadence (exactly one of ``every`` and ``cron``), task and timeout."""

    name: Text
    seat: Text
    every: Optional[Annotated[float, _duration(SCHEDULE_EVERY_RANGE_S)]] = None
    cron: Optional[Annotated[str, PlainValidator(_cron)]] = None
    timezone: Optional[Zone] = None
    task: Text
    timeout: Optional[Annotated[float, _duration(SCHEDULE_TIMEOUT_RANGE_S)]] = None

    @model_validator(mode="after")
    def _one_cadence(self, info: ValidationInfo) -> ScheduleFile:
        name, source = where(info)
        if (self.every is None) == (self.cron is None):
            raise CompanyError(name, "both every and cron" if self.every is not None else "neither every nor cron", CADENCE_RULE, source)
        if self.every is not None and "timezone" in self.model_fields_set:
            raise CompanyError(f"{name}.timezone", self.timezone, "is read only with cron (every is counted from the UTC epoch)", source)
        return self


def parse_schedules(schedules_raw: Any, seats: list[Seat], company_timezone: str, source: Optional[str]) -> list[Schedule]:
    """``schedules``: each one's unique name, the agent seat it wakes, its cadence, its task and its ``timeout``."""
    if not isinstance(schedules_raw, list):
        raise CompanyError("schedules", schedules_raw, "must be a list of schedules", source)
    schedules = []
    names = set()
    for i, entry in enumerate(schedules_raw):
        name = f"schedules[{i}]"
        body = read_section(ScheduleFile, entry, name, source)
        if body.name in names:
            raise CompanyError(f"{name}.name", body.name, "must be unique", source)
        names.add(body.name)
        target = next((s for s in seats if s.handle == body.seat), None)
        if target is None or not target.is_agent:
            agents = ", ".join(s.handle for s in seats if s.is_agent) or "none"
            raise CompanyError(f"{name}.seat", body.seat, f"must be an agent seat of this company ({agents})", source)
        cadence = (
            {"every_s": body.every} if body.every is not None
            else {"every_s": 0.0, "cron": body.cron, "timezone": body.timezone or company_timezone}
        )
        timeout_s = body.timeout if body.timeout is not None else SCHEDULE_TIMEOUT_S
        schedules.append(Schedule(name=body.name, seat=body.seat, task=body.task, timeout_s=timeout_s, **cadence))
    return schedules


__all__ = ["CRON_RULE", "SCHEDULE_EVERY_RANGE_S", "SCHEDULE_TIMEOUT_RANGE_S", "TIMEZONE_RULE", "ScheduleFile", "Zone", "parse_schedules"]
