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

from datetime import datetime, timezone as dt_timezone
from typing import Any, Mapping, Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from crewlet.company.fields import CompanyError, _known, _mapping, _string, parse_duration_s
from crewlet.company.org import DEFAULT_TIMEZONE, SCHEDULE_TIMEOUT_S, Schedule, Seat

SCHEDULE_KEYS = ("name", "seat", "every", "cron", "timezone", "task", "timeout")
#: ``schedules[].timeout``: one second to a day.
SCHEDULE_TIMEOUT_RANGE_S = (1.0, 86400.0)
#: The longest cron expression and zone name taken (both are short in every real file).
MAX_CRON_CHARS = 120
MAX_TIMEZONE_CHARS = 64
CRON_RULE = 'must be a five-field cron expression like "0 9 * * 1-5" (minute hour day-of-month month day-of-week)'
TIMEZONE_RULE = "must be an IANA time zone name like Europe/Berlin, America/New_York or UTC"
#: Where an expression is first evaluated at load, to refuse one that never fires; fixed, so a load never depends on the clock.
_PROBE_FROM = datetime(2000, 1, 1, tzinfo=dt_timezone.utc)


def parse_timezone(value: Any, name: str, source: Optional[str]) -> str:
    """An IANA zone name :mod:`zoneinfo` knows (``timezone``, ``schedules[].timezone``); anything else is refused."""
    if value is None:
        return DEFAULT_TIMEZONE
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TIMEZONE_CHARS:
        raise CompanyError(name, value, TIMEZONE_RULE, source)
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CompanyError(name, value, TIMEZONE_RULE, source) from None
    return value


def parse_cron(value: Any, name: str, source: Optional[str]) -> str:
    """A cron expression cronsim reads and that fires at least once in 50 years, its fields single-spaced."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_CRON_CHARS:
        raise CompanyError(name, value, CRON_RULE, source)
    expr = " ".join(value.split())
    try:
        next(CronSim(expr, _PROBE_FROM))
    except CronSimError as exc:
        raise CompanyError(name, value, f"{CRON_RULE}; {str(exc).lower()}", source) from None
    except StopIteration:
        raise CompanyError(name, value, f"{CRON_RULE}; this one never fires", source) from None
    return expr


def _cadence(entry: Mapping[str, Any], name: str, company_timezone: str, source: Optional[str]) -> dict[str, Any]:
    """Exactly one of ``every`` and ``cron``; a ``timezone`` only beside ``cron``."""
    has_every, has_cron = entry.get("every") is not None, entry.get("cron") is not None
    if has_every == has_cron:
        raise CompanyError(
            name, "both every and cron" if has_every else "neither every nor cron",
            'must have exactly one of every: 90s|15m|24h|7d or cron: "0 9 * * 1-5"', source,
        )
    if has_every:
        if "timezone" in entry:
            raise CompanyError(f"{name}.timezone", entry["timezone"], "is read only with cron (every is counted from the UTC epoch)", source)
        return {"every_s": parse_duration_s(entry["every"], f"{name}.every", source)}
    zone = parse_timezone(entry["timezone"], f"{name}.timezone", source) if "timezone" in entry else company_timezone
    return {"every_s": 0.0, "cron": parse_cron(entry["cron"], f"{name}.cron", source), "timezone": zone}


def parse_schedules(schedules_raw: Any, seats: list[Seat], company_timezone: str, source: Optional[str]) -> list[Schedule]:
    """``schedules``: each one's unique name, the agent seat it wakes, its cadence, its task and its ``timeout``."""
    if not isinstance(schedules_raw, list):
        raise CompanyError("schedules", schedules_raw, "must be a list of schedules", source)
    schedules = []
    names = set()
    for i, entry in enumerate(schedules_raw):
        name = f"schedules[{i}]"
        entry = _mapping(entry, name, source)
        _known(entry, f"{name}.", SCHEDULE_KEYS, source)
        sname = _string(entry.get("name"), f"{name}.name", source)
        if sname in names:
            raise CompanyError(f"{name}.name", sname, "must be unique", source)
        names.add(sname)
        seat_handle = _string(entry.get("seat"), f"{name}.seat", source)
        target = next((s for s in seats if s.handle == seat_handle), None)
        if target is None or not target.is_agent:
            agents = ", ".join(s.handle for s in seats if s.is_agent) or "none"
            raise CompanyError(f"{name}.seat", seat_handle, f"must be an agent seat of this company ({agents})", source)
        cadence = _cadence(entry, name, company_timezone, source)
        timeout_s = SCHEDULE_TIMEOUT_S
        if entry.get("timeout") is not None:
            timeout_s = parse_duration_s(entry["timeout"], f"{name}.timeout", source, SCHEDULE_TIMEOUT_RANGE_S)
        task = _string(entry.get("task"), f"{name}.task", source)
        schedules.append(Schedule(name=sname, seat=seat_handle, task=task, timeout_s=timeout_s, **cadence))
    return schedules


__all__ = ["CRON_RULE", "SCHEDULE_TIMEOUT_RANGE_S", "TIMEZONE_RULE", "parse_cron", "parse_schedules", "parse_timezone"]
