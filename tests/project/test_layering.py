"""Imports between the apps flow one way, the core (``crewlet``) imports no app, and inside the core each floor only those below.

Every module of the core and the four apps is parsed with :mod:`ast` and
every import in it is read — at the top, inside a function, under ``if
TYPE_CHECKING``, or as ``importlib.import_module("...")`` with a literal name
— so a function-local import cannot hide an arrow the wrong way. The arrows
allowed are :data:`ALLOWED` (docs/architecture.md draws the same graph);
every app may import the core. A room of an app (:data:`ROOMS`) may import
more than the rest of it: the arrow stays in that room. Inside the core,
:data:`FLOORS` orders its packages bottom first.
"""
from __future__ import annotations

import ast
from typing import Iterable, Iterator, Mapping

import pytest

from imports_support import REPO_ROOT, dynamically_imported, imported_from, module_name, package_of

#: The bottom: infrastructure every app uses (queue, events, tracing, engine, settings, the
#: company file, operator tokens and the API's authentication).
CORE = "crewlet"
APPS = ("seats", "notifications", "eventstore", "a2a")
PACKAGES = (CORE, *APPS)

#: app -> the other apps it may import (the core is always allowed). One way: never both.
ALLOWED: Mapping[str, frozenset[str]] = {
    # Seat state, inboxes, turns, pauses, the digest its inbox builds: on the core alone.
    "seats": frozenset(),
    # The webhook edge: publishes wakes to seat inboxes by topic (crewlet.queue.topics).
    "notifications": frozenset(),
    # The store, its reads, the live projection, the fleet read and /ws/stream: on the core alone
    # (its console room, the dashboard, asks seats: ROOMS).
    "eventstore": frozenset(),
    # Channels between seats: implements seats' after-turn hook and asks through seats.
    "a2a": frozenset({"seats"}),
}

#: Rooms of an app (a package inside it, by dotted name) -> the other apps that room may import besides its
#: app's own arrows. The rest of the app keeps to ALLOWED; an app's rooms count as the app in the graph's one way.
ROOMS: Mapping[str, frozenset[str]] = {
    # The dashboard's pages and the operator's views: the dashboard shows the seats' live state and pauses
    # beside the events (seats.api, seats.actions), so only this room of the store imports seats.
    "eventstore.console": frozenset({"seats"}),
}

#: Core modules that are the project's top rather than its bottom: the ASGI application
#: mounts eventstore's /ws/stream routes (the URLconf mounts each app by name, importing none).
COMPOSITION_ROOT: Mapping[str, frozenset[str]] = {
    "crewlet.asgi": frozenset({"eventstore"}),
}

#: The core's floors, bottom first: a module of a floor imports the core only from its own floor
#: or one below it. ``crewlet.models`` (the tables, which Django finds there) stands on the bottom
#: floor; what is on none is the project's top (settings, URLs, ASGI, the apps' config, the admin,
#: the management commands), which may import every floor.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("crewlet.base", "crewlet.models"),  # helpers, the tables, redaction, log formats, operator tokens
    ("crewlet.events",),  # the envelope, the typed bodies, trace context
    ("crewlet.queue",),  # the queue contract, its two backends, the embedded broker, the emitter
    ("crewlet.company",),  # the company file, the engine settings, stored revisions
    ("crewlet.engine",),  # the loop and its services, the process's handle on it, metrics, activation
    ("crewlet.fleet",),  # leases, the roster, placement
    ("crewlet.http",),  # the web server, bodies and errors, authentication, health, /metrics
)

def imported_names(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every module ``source`` imports, wherever the statement sits."""
    package = package_of(module, is_package)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, imported_from(node, package)
        elif dynamic := dynamically_imported(node):
            yield node.lineno, dynamic


def arrows() -> Iterator[tuple[str, str, str]]:
    """(importing module, its package, imported package) for every import from one of PACKAGES into another."""
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            module = module_name(path)
            for line, name in imported_names(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
                target = name.split(".")[0]
                if target in PACKAGES and target != package:
                    yield f"{module}:{line}", package, target


def floor_of(module: str) -> int:
    """The index of the floor of :data:`FLOORS` that holds ``module``; ``len(FLOORS)`` for the core's top."""
    for index, floor in enumerate(FLOORS):
        if any(module == part or module.startswith(f"{part}.") for part in floor):
            return index
    return len(FLOORS)


def floor_offences(found: Iterable[tuple[str, str]]) -> list[str]:
    """Of ``found`` ((importing module:line, imported module) inside the core), the imports of a higher floor."""
    names = [" / ".join(floor) for floor in FLOORS] + ["the top"]
    refused = []
    for where, target in found:
        module = where.split(":")[0]
        mine, theirs = floor_of(module), floor_of(target)
        if theirs > mine:
            refused.append(f"{where} imports {target}: {names[mine]} may not import {names[theirs]}, a floor above it")
    return refused


def core_imports() -> Iterator[tuple[str, str]]:
    """(importing module:line, imported module) for every import from one module of the core into another."""
    for path in sorted((REPO_ROOT / CORE).rglob("*.py")):
        module = module_name(path)
        for line, name in imported_names(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
            if name.startswith(f"{CORE}.") and not name.startswith(f"{module}."):
                yield f"{module}:{line}", name


def room_of(module: str) -> str:
    """The room of :data:`ROOMS` that holds ``module`` (the longest heading its dotted name), or ""."""
    holding = [room for room in ROOMS if module == room or module.startswith(f"{room}.")]
    return max(holding, key=len, default="")


def reach(app: str) -> frozenset[str]:
    """Every app ``app`` or one of its rooms may import: the app's arrows in the graph of the apps."""
    rooms = [below for room, below in ROOMS.items() if room.split(".")[0] == app]
    return ALLOWED[app].union(*rooms)


def offences(found: Iterable[tuple[str, str, str]]) -> list[str]:
    """The arrows of ``found`` the rules above do not allow, each as a sentence naming its line."""
    refused = []
    for where, package, target in found:
        module = where.split(":")[0]
        room = room_of(module)
        if package == CORE:
            allowed = COMPOSITION_ROOT.get(module, frozenset())
        else:
            allowed = ALLOWED[package] | ROOMS.get(room, frozenset()) | {CORE}
        if target not in allowed:
            refused.append(f"{where} imports {target}: {room or package} may import {sorted(allowed) or 'no app'}")
    return refused


def test_no_module_imports_an_app_its_package_may_not_import_even_inside_a_function() -> None:
    assert offences(arrows()) == []


def test_every_module_of_the_core_imports_only_its_own_floor_or_one_below_even_inside_a_function() -> None:
    assert floor_offences(core_imports()) == []


def test_every_package_of_the_core_stands_on_a_floor_or_is_the_top() -> None:
    packages = {module_name(p.parent) for p in (REPO_ROOT / CORE).glob("*/__init__.py")} - {f"{CORE}.management", f"{CORE}.migrations"}
    assert packages == {part for floor in FLOORS for part in floor if part != f"{CORE}.models"}


@pytest.mark.parametrize(
    ("where", "target"),
    [
        ("crewlet.events.types:3", "crewlet.queue.topics"),
        ("crewlet.queue.client:9", "crewlet.company.org"),
        ("crewlet.company.revisions:40", "crewlet.engine.core"),
        ("crewlet.http.web:288", "crewlet.urls"),
    ],
)
def test_an_import_of_a_floor_above_is_reported_with_its_line(where: str, target: str) -> None:
    assert [r.split(": ")[0] for r in floor_offences([(where, target)])] == [f"{where} imports {target}"]


def test_the_tables_stand_on_the_bottom_floor_so_every_floor_may_import_them_and_they_only_the_bottom() -> None:
    assert floor_offences([("crewlet.base.tokens:2", "crewlet.models"), ("crewlet.fleet.leases:30", "crewlet.models")]) == []
    assert len(floor_offences([("crewlet.models:15", "crewlet.engine.core")])) == 1


def test_the_allowed_arrows_between_the_apps_run_one_way_with_no_cycle() -> None:
    for app in ALLOWED:
        for other in reach(app):
            assert app not in reach(other), f"{app} and {other} may import each other"
    seen: dict[str, str] = {}

    def visit(app: str) -> None:
        seen[app] = "visiting"
        for other in reach(app):
            assert seen.get(other) != "visiting", f"a cycle through {app} and {other}"
            if other not in seen:
                visit(other)
        seen[app] = "done"

    for app in ALLOWED:
        if app not in seen:
            visit(app)


def test_every_room_is_a_package_inside_an_app_and_widens_it() -> None:
    for room, below in ROOMS.items():
        app = room.split(".")[0]
        assert app in ALLOWED and room != app, f"{room} is not inside one of {sorted(ALLOWED)}"
        assert (REPO_ROOT / room.replace(".", "/") / "__init__.py").is_file(), f"{room} is no package"
        assert below - ALLOWED[app], f"{room} allows nothing its app does not already"


def test_every_app_of_the_settings_has_a_place_in_the_graph() -> None:
    from django.conf import settings

    ours = {app for app in settings.INSTALLED_APPS if (REPO_ROOT / app).is_dir()}
    assert ours == set(PACKAGES)


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("def f():\n    from seats import actions\n", "eventstore.x", "seats"),
        ("import seats.runtime\n", "crewlet.y", "seats.runtime"),
        ("if TYPE_CHECKING:\n    from a2a.models import Channel\n", "seats.z", "a2a.models"),
        ("importlib.import_module('notifications.edge')\n", "seats.z", "notifications.edge"),
        ("from .coalescer import dispatch\n", "seats.runtime", "seats.coalescer"),
    ],
)
def test_the_check_reads_imports_wherever_they_sit(source: str, module: str, expected: str) -> None:
    assert expected in [name for _, name in imported_names(source, module)]


@pytest.mark.parametrize(
    ("where", "target"),
    [
        ("seats.inbox:3", "eventstore"),
        ("seats.runtime:9", "notifications"),
        ("notifications.service:5", "seats"),
        ("eventstore.projection:7", "a2a"),
        ("eventstore.api:12", "seats"),
        ("eventstore.consoles:3", "seats"),  # a module beside the console room is not in it
        ("eventstore.console.dashboard:9", "a2a"),
        ("crewlet.dashboard:4", "seats"),
        ("crewlet.http.health:8", "eventstore"),
    ],
)
def test_an_arrow_the_graph_does_not_allow_is_reported_with_its_line(where: str, target: str) -> None:
    [reported] = offences([(where, where.split(".")[0], target)])  # the importing package heads its module path
    assert reported.startswith(f"{where} imports {target}: ")


def test_the_arrows_the_graph_allows_are_not_reported() -> None:
    assert offences([("a2a.hooks:19", "a2a", "seats"), ("eventstore.console.dashboard:27", "eventstore", "seats")]) == []
    assert offences([("eventstore.console:3", "eventstore", "seats")]) == []
    assert offences([("seats.api:30", "seats", "crewlet"), ("crewlet.asgi:25", "crewlet", "eventstore")]) == []
