"""Company config revisions: validated like the file, diffed and activated in the admin, applied by every node's poller."""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, AsyncIterator, Optional

import pytest
import yaml
from asgiref.sync import sync_to_async
from django.test import Client

from crewlet.company import revisions
from crewlet.engine import activation
from crewlet.models import ActivationPointer, ConfigRevision
from crewlet.company.fields import CompanyError
from crewlet.company.parse import load_company, parse_company_text
from crewlet.queue import topics
from crewlet.queue.contract import EventQueue
from seats.inbox import HOLD_NO_PROVIDER
from seats.runtime import SeatRuntime
from crewlet.engine.interfaces import CONFIG_POLLER, SEAT_RUNTIME
from engine_support import engine_here
from seats_support import Recorder, eventually, memory_queues
from seats_support import in_thread


SEATS = [
    {"handle": "ada", "kind": "agent", "role": "engineer"},
    {"handle": "linus", "kind": "agent", "role": "reviewer"},
    {"handle": "grace", "kind": "human", "role": "lead"},
]


def company_yaml(*, window_s: float = 0, providers: Optional[list[dict[str, Any]]] = None, seats: Optional[list[dict[str, Any]]] = None) -> str:
    return yaml.safe_dump(
        {
            "org": "acme",
            "providers": {"llm": [{"kind": "echo"}] if providers is None else providers},
            "node": {"max_concurrent": 4},
            "notification_coalesce_window_seconds": window_s,
            "notification_coalesce_max_batch": 20,
            "seats": seats if seats is not None else SEATS,
        },
        sort_keys=False,
    )


BAD = company_yaml().replace("notification_coalesce_max_batch: 20", "notification_coalesce_max_batch: 500")


def staff_client(username: str = "grace-admin") -> Client:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser(username, password="pw")
    c = Client()
    c.force_login(user)
    return c


# -- the store ------------------------------------------------------------------------------


@pytest.mark.django_db(databases=["default", "events"])
def test_a_revision_with_a_bad_value_is_refused_with_the_same_error_as_the_file(tmp_path: Path) -> None:
    path = tmp_path / "company.yaml"
    path.write_text(BAD)
    with pytest.raises(CompanyError) as from_file:
        load_company(path)
    with pytest.raises(CompanyError) as from_revision:
        revisions.create_revision(BAD, author="ops")
    f, r = from_file.value, from_revision.value
    assert (r.field, r.value, r.allowed) == (f.field, f.value, f.allowed) == ("notification_coalesce_max_batch", 500, r.allowed)
    assert str(f).startswith(str(r))  # the file's message only adds where it came from
    assert not ConfigRevision.objects.exists()


@pytest.mark.django_db(databases=["default", "events"])
def test_activating_moves_the_single_pointer_and_a_second_activation_is_no_change() -> None:
    one = revisions.create_revision(company_yaml(), author="ops")
    two = revisions.create_revision(company_yaml(window_s=2), author="ops")
    assert activation.activate(one.pk, "ops") is True
    assert activation.activate(two.pk, "ana") is True
    assert activation.activate(two.pk, "ana") is False
    [pointer] = ActivationPointer.objects.all()
    assert (pointer.pk, pointer.revision_id, pointer.activated_by) == (1, two.pk, "ana")


# -- the admin ------------------------------------------------------------------------------


@pytest.mark.django_db(databases=["default", "events"])
def test_the_admin_add_form_shows_the_company_error_on_the_yaml_field_and_stores_nothing() -> None:
    c = staff_client()
    response = c.post("/admin/crewlet/configrevision/add/", {"yaml_text": BAD, "note": "bigger batches"})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    with pytest.raises(CompanyError) as expected:
        parse_company_text(BAD)
    assert errors["yaml_text"] == [str(expected.value)]
    assert not ConfigRevision.objects.exists()

    done = c.post("/admin/crewlet/configrevision/add/", {"yaml_text": company_yaml(), "note": "first"}, follow=True)
    assert done.status_code == 200
    [stored] = ConfigRevision.objects.all()
    assert (stored.author, stored.note) == ("grace-admin", "first")


@pytest.mark.django_db(databases=["default", "events"])
def test_the_change_page_shows_the_diff_against_the_active_revision() -> None:
    active = revisions.create_revision(company_yaml(), author="ops")
    activation.activate(active.pk, "ops")
    candidate = revisions.create_revision(company_yaml(window_s=7), author="ops")
    page = staff_client().get(f"/admin/crewlet/configrevision/{candidate.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "<pre class=\"crewlet-diff\">" in text or "<pre class='crewlet-diff'>" in text
    assert "-notification_coalesce_window_seconds: 0" in text
    assert "+notification_coalesce_window_seconds: 7" in text
    assert 'id="activate-revision"' in text


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_the_activate_button_moves_the_pointer_and_publishes_config_revision_activated_once() -> None:
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        try:
            with engine_here(q):
                one = await sync_to_async(revisions.create_revision)(company_yaml(), "ops")
                await activation.aactivate(one.pk, "ops")
                two = await sync_to_async(revisions.create_revision)(company_yaml(window_s=3), "ops")
                rec.seen.clear()

                def click_twice() -> None:
                    c = staff_client()
                    for _ in range(2):
                        r = c.post(f"/admin/crewlet/configrevision/{two.pk}/activate/", follow=True)
                        assert r.status_code == 200

                await asyncio.to_thread(in_thread, click_twice)
        finally:
            from django.db import connections

            await sync_to_async(connections.close_all)()
    nudges = [(t, e) for t, e in rec.seen if t == topics.CONFIG_REVISION_ACTIVATED]
    assert len(nudges) == 1
    event = nudges[0][1]
    assert (event.data.revision, event.data.previous_revision, event.data.activated_by) == (two.pk, one.pk, "grace-admin")
    assert [t for t, e in rec.seen if e.type == "config_revision_activated"] == [
        topics.CONFIG_REVISION_ACTIVATED,
        topics.event("config_revision_activated"),
    ]


# -- the poller -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def node(first_yaml: str, *, interval_s: float = 0.05) -> AsyncIterator[tuple[SeatRuntime, EventQueue, Recorder]]:
    """A running seat runtime serving ``first_yaml`` as the active revision, with its poller."""
    from crewlet.company.org import CompanyHolder

    first = await sync_to_async(revisions.create_revision)(first_yaml, "ops")
    await activation.aactivate(first.pk, "ops")
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        rt = SeatRuntime(q, CompanyHolder(parse_company_text(first_yaml)), run_scheduler=False)
        await rt.start()
        poller = activation.ConfigPoller(q, rt, node_id="n1", interval_s=interval_s)
        await poller.start()
        try:
            assert poller.applied == first.pk  # the revision it already serves is no change
            with engine_here(q, company=rt.holder, services={SEAT_RUNTIME: rt, CONFIG_POLLER: poller}):
                yield rt, q, rec
        finally:
            await poller.stop()
            await rt.stop()
            from django.db import connections

            await sync_to_async(connections.close_all)()


async def activate_new(yaml_text: str) -> int:
    revision = await sync_to_async(revisions.create_revision)(yaml_text, "ops")
    assert await sync_to_async(activation.activate)(revision.pk, "ops")  # no binding needed: the poll finds it
    return revision.pk


def applied(rec: Recorder, revision: int) -> list[Any]:
    return [e for t, e in rec.seen if t == topics.CONFIG_REVISION_APPLIED and e.data.revision == revision]


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_the_poller_hot_reloads_the_coalesce_window_and_publishes_config_revision_applied() -> None:
    async with node(company_yaml(window_s=0)) as (rt, q, rec):
        assert rt.loops["ada"].options.linger_s == 0
        revision = await activate_new(company_yaml(window_s=4))
        await eventually(lambda: applied(rec, revision), what="config_revision_applied")
        assert rt.loops["ada"].options.linger_s == 4 and rt.loops["linus"].options.linger_s == 4
        [event] = applied(rec, revision)
        assert (event.node, event.data.outcome, event.data.reached, event.data.error) == ("n1", "applied", "applied", "")
        recorded = [t for t, e in rec.seen if e.type == "config_revision_applied"]
        assert recorded == [topics.CONFIG_REVISION_APPLIED, topics.event("config_revision_applied")]


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_a_new_seat_in_an_applied_revision_gets_its_mailbox_and_its_loop() -> None:
    async with node(company_yaml()) as (rt, q, rec):
        revision = await activate_new(company_yaml(seats=SEATS + [{"handle": "mia", "kind": "agent", "role": "tester"}]))
        await eventually(lambda: applied(rec, revision), what="config_revision_applied")
        mailboxes = {ref.topic for ref in await q.list_subscriptions("crewlet.agent.>")}
        assert topics.agent_inbox("mia") in mailboxes
        assert "mia" in rt.loops and rt.holder.current().seat_by_handle("mia") is not None


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_a_revision_that_adds_a_provider_releases_the_no_provider_hold() -> None:
    async with node(company_yaml(providers=[])) as (rt, q, rec):
        ada = (topics.agent_inbox("ada"), topics.agent_inbox_group("ada"))
        assert HOLD_NO_PROVIDER in q.held(*ada)
        revision = await activate_new(company_yaml())
        await eventually(lambda: applied(rec, revision), what="config_revision_applied")
        assert HOLD_NO_PROVIDER not in q.held(*ada)


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_an_activation_nudge_wakes_the_poller_before_its_interval() -> None:
    async with node(company_yaml(), interval_s=60.0) as (rt, q, rec):
        revision = await sync_to_async(revisions.create_revision)(company_yaml(window_s=1), "ops")
        assert await activation.aactivate(revision.pk, "ops", queue=q)
        await eventually(lambda: applied(rec, revision.pk), timeout_s=5.0, what="applied on the nudge, not the 60 s poll")
        assert rt.loops["ada"].options.linger_s == 1


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
async def test_a_failed_apply_is_published_with_how_far_it_got() -> None:
    async with node(company_yaml()) as (rt, q, rec):

        async def broken(_org: Any) -> None:
            raise RuntimeError("mailbox refused")

        rt.apply = broken  # type: ignore[method-assign]
        revision = await activate_new(company_yaml(window_s=2))
        await eventually(lambda: applied(rec, revision), what="config_revision_applied")
        [event] = applied(rec, revision)
        assert (event.data.outcome, event.data.reached, event.data.error) == ("partial", "parsed", "mailbox refused")


@pytest.mark.django_db(transaction=True, databases=["default", "events"])
@pytest.mark.integration  # starts a child process
async def test_on_the_real_broker_an_activation_nudge_reaches_the_poller_and_the_window_changes() -> None:
    from crewlet.company.org import CompanyHolder
    from seats_support import jetstream_queues

    first = await sync_to_async(revisions.create_revision)(company_yaml(), "ops")
    await activation.aactivate(first.pk, "ops")
    async with jetstream_queues("n1") as [q]:
        rec = Recorder().attach(q)
        rt = SeatRuntime(q, CompanyHolder(parse_company_text(company_yaml())), run_scheduler=False)
        await rt.start()
        poller = activation.ConfigPoller(q, rt, node_id="n1", interval_s=60.0)
        await poller.start()
        try:
            revision = await sync_to_async(revisions.create_revision)(company_yaml(window_s=2), "ops")
            assert await activation.aactivate(revision.pk, "ops", queue=q)
            await eventually(lambda: applied(rec, revision.pk), timeout_s=10.0, what="applied on the nudge")
            assert rt.loops["ada"].options.linger_s == 2
            assert [e.node for e in applied(rec, revision.pk)] == ["n1"]
        finally:
            await poller.stop()
            await rt.stop()
            from django.db import connections

            await sync_to_async(connections.close_all)()


@pytest.mark.django_db(databases=["default", "events"])
def test_up_imports_its_company_file_and_an_activation_in_the_admin_since_wins_over_a_changed_file(tmp_path: Path) -> None:
    from crewlet.management.commands.up import Command
    from crewlet.company.org import CompanyHolder

    path = tmp_path / "company.yaml"
    path.write_text(company_yaml(window_s=1))
    cmd = Command()
    cmd.holder = CompanyHolder(load_company(path))
    cmd.import_company({"company": str(path)})
    cmd.adopt_active_revision()
    [imported] = ConfigRevision.objects.all()
    assert revisions.active_revision().pk == imported.pk
    assert cmd.holder.current().coalesce_window_s == 1

    newer = revisions.create_revision(company_yaml(window_s=9), "ops")
    activation.activate(newer.pk, "ops")
    path.write_text(company_yaml(window_s=3))  # the next start: the admin's activation since the import wins
    cmd.holder = CompanyHolder(load_company(path))
    assert cmd.import_company({"company": str(path)}) is None  # nothing to announce: the pointer did not move
    cmd.adopt_active_revision()
    assert ConfigRevision.objects.count() == 3  # the file is stored, for the admin to activate
    assert revisions.active_revision().pk == newer.pk
    assert cmd.holder.current().coalesce_window_s == 9
