"""Retention: rows older than stream.event_retention_hours are deleted by a periodic duty."""
from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from crewlet.company.loading import load_settings
from eventstore import retention
from eventstore.models import EventRow
from eventstore.retention import delete_older_than, retention_periodic
from eventstore_support import US, make_event, store


NOW = datetime(2025, 3, 10, 12, 0, 0, 250, tzinfo=timezone.utc)
HOURS = 720.0
CUTOFF = NOW - timedelta(hours=HOURS)


def _remaining() -> list[str]:
    return list(EventRow.objects.order_by("ts", "id").values_list("id", flat=True))


@pytest.mark.django_db(databases=["default", "events"])
def test_rows_older_than_the_bound_go_and_the_rest_stay(caplog: Any) -> None:
    store(
        make_event("org_started", CUTOFF - timedelta(days=3), event_id="old-3d"),
        make_event("org_started", CUTOFF - US, event_id="old-1us"),
        make_event("org_started", CUTOFF, event_id="at-cutoff"),
        make_event("org_started", CUTOFF + US, event_id="young"),
        make_event("org_started", NOW, event_id="now"),
    )
    with caplog.at_level(logging.INFO, logger="crewlet.eventstore.retention"):
        assert delete_older_than(HOURS, NOW) == 2
    assert _remaining() == ["at-cutoff", "young", "now"]
    retired = [r for r in caplog.records if r.getMessage() == "eventstore_rows_retired"]
    assert len(retired) == 1 and retired[0].rows == 2 and retired[0].hours == HOURS


@pytest.mark.django_db(databases=["default", "events"])
def test_a_large_backlog_is_deleted_in_batches_and_all_of_it_goes() -> None:
    store(*(make_event("org_started", CUTOFF - timedelta(minutes=i + 1), event_id=f"old-{i:02d}") for i in range(7)))
    store(make_event("org_started", NOW, event_id="keep"))
    assert delete_older_than(HOURS, NOW, batch=3) == 7
    assert _remaining() == ["keep"]


@pytest.mark.django_db(databases=["default", "events"])
def test_a_sweep_with_nothing_to_delete_says_nothing(caplog: Any) -> None:
    store(make_event("org_started", NOW, event_id="keep"))
    with caplog.at_level(logging.INFO, logger="crewlet.eventstore.retention"):
        assert delete_older_than(HOURS, NOW) == 0
    assert "eventstore_rows_retired" not in caplog.text


class _Stop(Exception):
    pass


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_the_duty_sweeps_at_start_and_then_every_interval_with_the_configured_bound() -> None:
    settings = load_settings({"stream": {"event_retention_hours": 2}}, env={})
    await sync_to_async(store)(
        make_event("org_started", NOW - timedelta(hours=5), event_id="old"),
        make_event("org_started", NOW - timedelta(hours=1), event_id="aging"),
    )
    instants = iter([NOW, NOW + timedelta(hours=1, microseconds=1), NOW + timedelta(hours=2)])
    slept: list[float] = []
    seen: list[list[str]] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        seen.append(await sync_to_async(_remaining)())
        if len(slept) == 2:
            raise _Stop()

    with pytest.raises(_Stop):
        await retention_periodic(settings, interval_s=900.0, now=lambda: next(instants), pause=sleep).run()
    assert slept == [900.0, 900.0]
    assert seen == [["aging"], []]  # the first sweep at start, the second an interval later
    await sync_to_async(connections.close_all)()


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_a_failed_sweep_is_logged_and_the_duty_carries_on(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    calls: list[datetime] = []

    def flaky(hours: float, now: datetime, **kwargs: Any) -> int:
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("events database unreachable")
        return 0

    monkeypatch.setattr(retention, "delete_older_than", flaky)

    async def sleep(seconds: float) -> None:
        if len(calls) == 2:
            raise asyncio.CancelledError()

    with caplog.at_level(logging.ERROR, logger="crewlet.eventstore.retention"):
        with pytest.raises(asyncio.CancelledError):
            await retention_periodic(load_settings({}, env={}), now=lambda: NOW, pause=sleep).run()
    assert len(calls) == 2
    assert "eventstore_retention_failed" in caplog.text


def test_the_store_installs_its_writer_and_retention_on_the_engine_manage_py_runs() -> None:
    from django.core.management import load_command_class

    cmd = load_command_class("crewlet", "runconsumers")
    options = vars(cmd.create_parser("manage.py", "runconsumers").parse_args(["--node", "n1"]))
    engine = cmd.engine(options)
    assert {"eventstore_writer", "eventstore_retention"} <= {service.name for service in engine.registered}
