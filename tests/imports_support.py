"""Reading the project's imports with :mod:`ast`, for the tests that hold its floors (test_layering) and forbid its cycles (test_import_cycles).

Both read every import wherever it sits: ``import x``, ``from x import y``
(a relative one resolved against the importing module's package), and
``importlib.import_module("x")`` (or ``import_string``, ``__import__``)
with a literal name.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

DYNAMIC_IMPORTERS = frozenset({"import_module", "import_string", "__import__"})


def module_name(path: Path) -> str:
    """The dotted module a file below :data:`REPO_ROOT` is (a package by its ``__init__``)."""
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str, is_package: bool) -> str:
    """The package a module's relative imports are resolved against: itself for an ``__init__``, else its parent."""
    return module if is_package else module.rpartition(".")[0]


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The dotted module a ``from ... import`` reads, a relative one resolved against ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def dynamically_imported(node: ast.AST) -> str:
    """The literal name ``node`` imports when it is a call such as ``importlib.import_module("x")``; "" otherwise."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return ""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    name = node.args[0].value
    return name if called in DYNAMIC_IMPORTERS and isinstance(name, str) else ""
