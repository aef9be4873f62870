"""``schedules[]`` with ``cron`` and ``timezone``: read at load, and refused in one line naming the field."""
from __future__ import annotations

from typing import Any

import pytest

from crewlet.company.fields import CompanyError
from crewlet.company.org import DEFAULT_TIMEZONE
from crewlet.company.parse import parse_company, parse_company_text

BASE: dict[str, Any] = {"org": "acme", "seats": [{"handle": "ada", "kind": "agent", "role": "engineer"}]}


def schedule(**fields: Any) -> dict[str, Any]:
    return {"name": "standup", "seat": "ada", "task": "Post the stand-up summary", **fields}


def refused(**overrides: Any) -> str:
    with pytest.raises(CompanyError) as info:
        parse_company({**BASE, **overrides})
    return str(info.value)


def test_a_cron_schedule_is_read_in_the_companys_timezone_unless_it_names_its_own_and_utc_when_neither_does() -> None:
    org = parse_company(
        {
            **BASE,
            "timezone": "Europe/Berlin",
            "schedules": [
                schedule(cron="0  9 * * 1-5"),
                schedule(name="nightly", cron="30 2 * * *", timezone="America/New_York"),
                schedule(name="hourly", every="1h"),
            ],
        }
    )
    standup, nightly, hourly = org.schedules
    assert org.timezone == "Europe/Berlin"
    assert (standup.cron, standup.timezone) == ("0 9 * * 1-5", "Europe/Berlin")  # fields single-spaced
    assert (nightly.cron, nightly.timezone) == ("30 2 * * *", "America/New_York")
    assert (hourly.cron, hourly.every_s) == ("", 3600.0)
    assert standup.cadence == "cron 0 9 * * 1-5 Europe/Berlin" and hourly.cadence == "every 3600s"
    plain = parse_company({**BASE, "schedules": [schedule(cron="0 9 * * MON-FRI")]})
    assert plain.timezone == DEFAULT_TIMEZONE == plain.schedules[0].timezone == "UTC"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"schedules": [schedule(every="24h", cron="0 9 * * *")]}, "schedules[0]='both every and cron': must have exactly one of every"),
        ({"schedules": [schedule()]}, "schedules[0]='neither every nor cron': must have exactly one of every"),
        ({"schedules": [schedule(cron="61 9 * * *")]}, "schedules[0].cron='61 9 * * *': must be a five-field cron expression like \"0 9 * * 1-5\" (minute hour day-of-month month day-of-week); bad minute"),
        ({"schedules": [schedule(cron="0 9 * *")]}, "schedules[0].cron='0 9 * *': must be a five-field cron expression"),
        ({"schedules": [schedule(cron="@daily")]}, "schedules[0].cron='@daily': must be a five-field cron expression"),
        ({"schedules": [schedule(cron="0 9 30 2 *")]}, "schedules[0].cron='0 9 30 2 *': must be a five-field cron expression"),
        ({"schedules": [schedule(cron=9)]}, "schedules[0].cron=9: must be a five-field cron expression"),
        ({"schedules": [schedule(cron="0 " * 100)]}, "schedules[0].cron="),
        ({"timezone": "Europe/Atlantis"}, "timezone='Europe/Atlantis': must be an IANA time zone name like Europe/Berlin"),
        ({"timezone": "../../etc/passwd"}, "timezone='../../etc/passwd': must be an IANA time zone name"),
        ({"timezone": "Europe"}, "timezone='Europe': must be an IANA time zone name"),
        ({"timezone": ""}, "timezone='': must be an IANA time zone name"),
        ({"schedules": [schedule(cron="0 9 * * *", timezone="Mars/Olympus")]}, "schedules[0].timezone='Mars/Olympus': must be an IANA time zone name"),
        ({"schedules": [schedule(every="24h", timezone="Europe/Berlin")]}, "schedules[0].timezone='Europe/Berlin': is read only with cron"),
        ({"schedules": [schedule(cron="0 9 * * *", at="9")]}, "schedules[0].at='9': unknown key; allowed: name, seat, every, cron, timezone, task"),
    ],
)
def test_a_bad_cadence_or_zone_is_refused_in_one_line_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    text = refused(**overrides)
    assert text.startswith(message) and "\n" not in text


def test_a_refusal_from_a_file_names_the_file() -> None:
    with pytest.raises(CompanyError) as info:
        parse_company_text(
            "org: acme\nseats: [{handle: ada}]\nschedules: [{name: s, seat: ada, cron: '0 25 * * *', task: t}]\n", source="acme.yaml"
        )
    assert str(info.value).startswith("schedules[0].cron='0 25 * * *'") and "bad hour" in str(info.value) and "acme.yaml" in str(info.value)
