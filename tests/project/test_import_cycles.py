"""No two modules of the project import each other at run time, not even through a function-local import.

A function-local import can hold a cycle apart at import time while the two
modules still lean on each other: neither can be read, tested or moved
without the other. So every module of the core and the apps is parsed with
:mod:`ast` and every import in it is read — at the top, inside a function,
or as ``importlib.import_module("...")`` with a literal name — and the
arrows between the project's modules must form no cycle, of two modules or
more. An import under ``if TYPE_CHECKING`` names a type for an annotation
and never runs, so across the project it is no arrow; inside the event
store, whose modules were untangled to the last annotation, it is one too.

An import is an arrow to the module it names: ``from eventstore import
questions`` to ``eventstore.questions``, ``from eventstore.fanout import
seed_plan`` to the package ``eventstore.fanout`` (its ``__init__``). The
package a submodule sits in, which Python runs first, is not an arrow of the
submodule's: a package that gathers its submodules' names is how the store's
packages are read (``Callers import from the package``), and it is a cycle
only when a submodule imports its own package back.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Mapping

import pytest

from imports_support import REPO_ROOT, dynamically_imported, imported_from, module_name, package_of
from test_layering import PACKAGES

STORE = "eventstore"

#: module -> (its source, whether it is a package's ``__init__``).
Sources = Mapping[str, tuple[str, bool]]
#: module -> {a module of the store it imports: the first line that does}.
Graph = dict[str, dict[str, int]]


def store_sources(root: Path = REPO_ROOT / STORE) -> dict[str, tuple[str, bool]]:
    """Every module below ``root`` (the store's, by default), by dotted name; migrations are Django's."""
    return {
        module_name(path): (path.read_text(encoding="utf-8"), path.name == "__init__.py")
        for path in sorted(root.rglob("*.py"))
        if "migrations" not in path.parts
    }


def project_sources() -> dict[str, tuple[str, bool]]:
    """Every module of the core and the apps."""
    return {module: source for package in PACKAGES for module, source in store_sources(REPO_ROOT / package).items()}


def _for_annotations(tree: ast.AST) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` (plain or ``typing.``-qualified)."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            hidden.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return hidden


def _named(source: str, module: str, is_package: bool, annotations: bool = True) -> Iterator[tuple[int, list[str]]]:
    """(line, the dotted names one import could mean, most specific first) for every import in ``source``.

    ``annotations=False`` leaves out what sits under ``if TYPE_CHECKING``.
    """
    package = package_of(module, is_package)
    tree = ast.parse(source)
    hidden = set() if annotations else _for_annotations(tree)
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, [alias.name]
        elif isinstance(node, ast.ImportFrom):
            frm = imported_from(node, package)
            for alias in node.names:
                yield node.lineno, [f"{frm}.{alias.name}", frm]  # a submodule by that name, else the module itself
        elif dynamic := dynamically_imported(node):
            yield node.lineno, [dynamic]


def _resolve(names: list[str], modules: Mapping[str, object]) -> str:
    """The store's module ``names`` import: the first name that is one, or the nearest package heading it; "" for none."""
    for name in names:
        if name in modules:
            return name
    name = names[-1]
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def import_graph(sources: Sources, annotations: bool = True) -> Graph:
    """The arrows between the modules of ``sources``, wherever their import statements sit (``annotations``: see :func:`_named`)."""
    graph: Graph = {}
    for module, (source, is_package) in sources.items():
        arrows = graph.setdefault(module, {})
        for line, names in _named(source, module, is_package, annotations):
            target = _resolve(names, sources)
            if target and target != module:
                arrows.setdefault(target, line)
    return graph


def cycles(graph: Graph) -> list[str]:
    """One cycle through every group of modules that import each other, as ``a:line -> b:line -> a``.

    The groups are the graph's strongly connected components (Tarjan's);
    each is reported once, by a shortest cycle from its first module.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, {}):
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return sorted(_shortest_cycle(graph, group) for group in groups)


def _shortest_cycle(graph: Graph, group: list[str]) -> str:
    """A shortest cycle from ``group``'s first module back to it, inside the group (a breadth-first walk)."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while start not in came_from:
        following: list[str] = []
        for module in frontier:
            for target in sorted(graph[module]):
                if target in members and target not in came_from:
                    came_from[target] = module
                    following.append(target)
        frontier = following
    path = [start]
    module = came_from[start]
    while module != start:
        path.append(module)
        module = came_from[module]
    path.append(start)
    path.reverse()  # start -> ... -> start, each arrow named by the line that draws it
    return " -> ".join(f"{a}:{graph[a][b]}" for a, b in zip(path, path[1:])) + f" -> {start}"


def test_no_two_modules_of_the_project_import_each_other_at_run_time_even_inside_a_function() -> None:
    assert cycles(import_graph(project_sources(), annotations=False)) == []


def test_no_two_modules_of_the_store_import_each_other_even_for_an_annotation() -> None:
    assert cycles(import_graph(store_sources())) == []


def test_an_import_for_annotations_only_is_no_run_time_arrow() -> None:
    modules = {"a": "from eventstore import b\n", "b": "if TYPE_CHECKING:\n    from eventstore.a import A\n"}
    assert cycles(import_graph(_sources(**modules), annotations=False)) == []
    assert cycles(import_graph(_sources(**modules))) == ["eventstore.a:1 -> eventstore.b:2 -> eventstore.a"]


def test_the_store_has_the_modules_the_check_walks() -> None:
    graph = import_graph(store_sources())
    assert {"eventstore.api", "eventstore.here", "eventstore.projection.model", "eventstore.fanout.service"} <= set(graph)
    assert "eventstore.here" in graph["eventstore.api"] and "eventstore.here" in graph["eventstore.projection.seed"]


def _sources(**modules: str) -> dict[str, tuple[str, bool]]:
    """Made-up modules of the store: keyword ``fanout__init__`` is the package ``eventstore.fanout``."""
    made = {}
    for key, source in modules.items():
        is_package = key.endswith("__init__")
        name = ".".join([STORE, *(part for part in key.removesuffix("__init__").split("__") if part)])
        made[name] = (source, is_package)
    return made


@pytest.mark.parametrize(
    ("modules", "expected"),
    [
        (  # held apart by a function-local import, still a cycle
            {"api": "from eventstore import fanout\n", "fanout": "def f():\n    from eventstore.api import node_scope\n"},
            ["eventstore.api:1 -> eventstore.fanout:2 -> eventstore.api"],
        ),
        (  # three modules round
            {
                "a": "def f():\n    from eventstore import b\n",
                "b": "from eventstore.c import x\n",
                "c": "if TYPE_CHECKING:\n    from eventstore.a import y\n",
            },
            ["eventstore.a:2 -> eventstore.b:1 -> eventstore.c:2 -> eventstore.a"],
        ),
        (  # a submodule importing its own package back
            {"fanout__init__": "from eventstore.fanout.service import reader\n", "fanout__service": "from eventstore.fanout import wire\n"},
            ["eventstore.fanout:1 -> eventstore.fanout.service:1 -> eventstore.fanout"],
        ),
        (  # by a literal name handed to import_module
            {"a": "import eventstore.b\n", "b": "importlib.import_module('eventstore.a')\n"},
            ["eventstore.a:1 -> eventstore.b:1 -> eventstore.a"],
        ),
        (  # relative imports
            {"fanout__merge": "from . import service\n", "fanout__service": "from .merge import plan_for\n"},
            ["eventstore.fanout.merge:1 -> eventstore.fanout.service:1 -> eventstore.fanout.merge"],
        ),
    ],
)
def test_a_cycle_is_found_wherever_its_imports_sit(modules: dict[str, str], expected: list[str]) -> None:
    assert cycles(import_graph(_sources(**modules))) == expected


@pytest.mark.parametrize(
    "modules",
    [
        # one way, a function-local import included
        {"api": "from eventstore import fanout, here\n", "fanout": "def f():\n    from eventstore import here\n", "here": ""},
        # a package gathering its submodules' names, each submodule importing its siblings
        {
            "fanout__init__": "from eventstore.fanout.service import reader\nfrom eventstore.fanout.wire import K_AT\n",
            "fanout__service": "from eventstore.fanout import wire\n",
            "fanout__wire": "from eventstore import questions as qs\n",
            "questions__init__": "",
        },
        # the store's root package is not what ``from eventstore import x`` imports
        {"__init__": "def install():\n    from eventstore.services import install\n", "services": "from eventstore import writer\n", "writer": ""},
    ],
)
def test_imports_that_run_one_way_are_no_cycle(modules: dict[str, str]) -> None:
    assert cycles(import_graph(_sources(**modules))) == []
