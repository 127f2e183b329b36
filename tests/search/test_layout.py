"""The layout of ``search/``: modules without import cycles, no module shadowed by a name.

File and function sizes: ``tests/test_sizes.py``, for every package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import search

ROOT = Path(search.__file__).resolve().parent


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Project-internal imports of every module of search/, at any depth (lazy ones too)."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("search."):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name.startswith("search."))
        graph[_module(path)] = found
    return graph


def test_no_import_cycles_between_modules() -> None:
    graph = _imports()
    done: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, " -> ".join((*trail[trail.index(name) :], name))
        if name in done:
            return
        for target in graph.get(name, ()):
            if target in graph and target != "search":
                visit(target, (*trail, name))
        done.add(name)

    for name in graph:
        if name != "search":  # the package re-exports its sub-packages' public names
            visit(name, ())


def test_predict_is_a_function_not_a_shadowed_module() -> None:
    assert callable(search.predict)
    for name in search.__all__:
        assert not (ROOT / f"{name}.py").exists() and not (ROOT / name).is_dir(), f"search.{name} names a module"
