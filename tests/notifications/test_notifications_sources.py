"""The sources registry: one module per vendor, and one list that drives the routes, the company file and the edge."""
from __future__ import annotations

import ast
import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from django.urls import Resolver404, resolve

from crewlet.engine import runtime
from crewlet.engine.interfaces import NOTIFY
from crewlet.company.org import SURFACES
from engine_support import engine_here
from notifications import edge as edge_module
from notifications import sources
from notifications.edge import Edge, InboundRequest
from notifications.runtime import NotifyService
from notifications.sources import REGISTRY, SourceRegistryError, registry_of, slack
from notifications.urls import urlpatterns
from notifications_support import company, fixture_bytes, holder, set_secrets, slack_headers
from seats_support import Recorder, memory_queues
from test_notifications_edge import edge_on, post

ROOT = Path(__file__).resolve().parents[2]
#: The modules that must reach a vendor only through the registry.
VENDOR_NEUTRAL = ("edge.py", "parsers.py", "service.py", "runtime.py", "urls.py", "views.py", "sockets/__init__.py")


def test_the_registry_covers_exactly_the_company_files_surface_kinds_each_under_its_parsers_name() -> None:
    assert sorted(name for name, source in REGISTRY.items() if source.company_surface) == sorted(SURFACES)
    assert [name for name, source in REGISTRY.items() if not source.company_surface] == ["generic"]
    for name, source in REGISTRY.items():
        assert source.name == source.parser.source == name


def test_a_vendor_registered_without_a_surface_kind_or_a_kind_without_a_vendor_or_a_name_twice_is_refused() -> None:
    gitlab = replace(slack.SOURCE, parser=type("GitLabParser", (slack.SlackParser,), {"source": "gitlab"})())
    with pytest.raises(SourceRegistryError, match="registered without a surface kind: \\['gitlab'\\]"):
        registry_of((*REGISTRY.values(), gitlab), SURFACES)
    with pytest.raises(SourceRegistryError, match="a surface kind without a source: \\['slack'\\]"):
        registry_of((s for n, s in REGISTRY.items() if n != "slack"), SURFACES)
    with pytest.raises(SourceRegistryError, match="'slack' is registered twice"):
        registry_of((*REGISTRY.values(), slack.SOURCE), SURFACES)


def test_the_webhook_routes_are_exactly_the_registered_sources_with_and_without_a_trailing_slash() -> None:
    named = sorted(p.name for p in urlpatterns if p.name)
    assert named == sorted(REGISTRY)
    for name, source in REGISTRY.items():
        if source.path:
            continue
        assert resolve(f"/webhooks/{name}").kwargs == {"source": name}
        assert resolve(f"/webhooks/{name}/").kwargs == {"source": name}
    # the generic source's route names its seat
    assert resolve("/webhooks/generic/ada").kwargs == {"source": "generic", "seat": "ada"}
    assert resolve("/webhooks/generic/ada/").kwargs == {"source": "generic", "seat": "ada"}
    for unrouted in ("/webhooks/gitlab", "/webhooks/generic/ada/more"):
        with pytest.raises(Resolver404):
            resolve(unrouted)


async def test_the_generic_route_without_a_seat_is_404_saying_the_seat_is_missing() -> None:
    async with edge_on():
        for spelling in ("/webhooks/generic", "/webhooks/generic/"):
            resp = await post(spelling, b'{"text": "hi"}')
            assert resp.status_code == 404
            assert resp.json() == {"error": f"{spelling} names no seat: POST to /webhooks/generic/<str:seat>"}


def test_no_vendor_neutral_module_names_a_vendor_it_would_have_to_branch_on() -> None:
    for module in VENDOR_NEUTRAL:
        tree = ast.parse((ROOT / "notifications" / module).read_text())
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        named = [
            (n.lineno, n.value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and id(n) not in docstrings and n.value in REGISTRY
        ]
        assert named == [], f"notifications/{module} names a vendor: {named}"


def test_the_edge_keeps_every_vendors_headers_and_never_a_signature_or_a_token() -> None:
    for source in REGISTRY.values():
        assert set(source.headers) <= set(edge_module.KEPT_HEADERS)
    kept = " ".join(edge_module.KEPT_HEADERS)
    assert "signature" not in kept and "authorization" not in kept and "cookie" not in kept


async def test_a_source_outside_the_registry_is_refused_with_the_registered_names() -> None:
    async with memory_queues("n1") as (_, (q,)):
        rec = Recorder().attach(q)
        resp = await Edge(q, holder(company())).receive(
            InboundRequest(source="gitlab", body=b"{}", headers={"content-type": "application/json"})
        )
        assert resp.status == 404
        assert resp.body["error"] == f"no webhook route for 'gitlab'; the sources are {', '.join(sources.NAMES)}"
        assert rec.seen == []


async def test_a_slack_url_verification_without_a_challenge_string_is_400_and_routes_nothing() -> None:
    body = b'{"type": "url_verification", "challenge": 7}'
    async with edge_on(company(verify=False)) as (_, _, rec):
        resp = await post("/webhooks/slack", body)
        assert resp.status_code == 400 and resp.json() == {"error": "url_verification without a challenge string"}
        assert rec.seen == []
        # The handshake is Slack's alone: the same body to another source is a delivery.
        other = await post("/webhooks/jira", body)
        assert other.status_code == 202


async def test_a_cancel_of_the_task_stopping_the_notify_service_reaches_that_task_after_the_stop_finishes() -> None:
    async with memory_queues("n1") as (_, (q,)):
        notify = NotifyService(q, holder(company()), prune_interval_s=3600.0)
        await notify.start()
        with engine_here(q, services={NOTIFY: notify}):
            assert runtime.service(NOTIFY).edge is notify.edge
            assert notify._prune is not None
            prune = notify._prune.task
            assert prune is not None
            stopping = asyncio.get_running_loop().create_task(notify.stop())
            # stop() cancels the prune and waits for it in one step: once the
            # prune is being cancelled, the stopper is waiting, and is cancelled itself.
            while not prune.cancelling():
                await asyncio.sleep(0)
            stopping.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stopping
            assert stopping.cancelled()
            # The stop still finished its work before the cancel propagated.
            assert runtime.service(NOTIFY).edge is None and notify.edge is None
            assert notify.router._sub is None


async def test_the_slack_handshake_body_still_verifies_first(monkeypatch) -> None:
    set_secrets(monkeypatch)
    body = fixture_bytes("slack", "url_verification.json")
    async with edge_on(company(verify=True)) as (_, _, rec):
        resp = await post("/webhooks/slack", body, headers={"x-slack-signature": "v0=0", "x-slack-request-timestamp": "1"})
        assert resp.status_code == 401
        assert rec.seen == []
