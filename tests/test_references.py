"""What the code and the docs say about the code is true: names that point into the project resolve.

- every dotted reference to a project module (``search.rollout.solve``, ``store.records.Hardware``,
  ``planner.job.inputs.resolve``) quoted in ``docs/*.md`` or in a docstring of ``planner``, ``search``,
  ``probes``, ``launch`` or ``store`` names a module that exists and, past it, a name that module defines
  (a class's own attribute too);
- every module a package's docstring names as its own (``name`` in a list: ``- ``name``: ...``,
  ``(``name``, ...)``) is one of its modules;
- the package faces export what docs/layout.md says they do: every function of ``planner.api`` is named in
  docs/layout.md and re-exported by ``planner``; ``search`` exports ``search.predict``;
- ``planner`` imports ``search`` only through its faces.

Read statically (the source's syntax tree): nothing is imported but the two faces, so no torch is loaded.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "search", "probes", "launch", "store")
# a quoted name: ``x.y``, `x.y`, :mod:`x.y`, :func:`~x.y`; its first part one of the packages
QUOTED = re.compile(r"`+(?::?[a-z]+:`)?~?((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)(?:\(\))?`+")
ROLE = re.compile(r":(?:mod|func|class|data|meth|attr|obj):`~?((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)*)`")
# a package docstring names one of its modules as ``name`` in a list: "- ``name``", "(``name``", ", ``name``",
# "and ``name``", "with ``name``"
OWN_ITEM = re.compile(r"(?:^\s*- |\(|, |and |with )``([a-z_][a-z0-9_]*)/?``", re.MULTILINE)
# dotted names that are not modules: keys of the plan's JSON (its ``search`` block) and database columns
NOT_MODULES = {"search.program_spread", "search.program_spread.runs", "probes.run_id"}


def _module_path(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _defined(body: list[ast.stmt]) -> set[str]:
    """Names a module or class body binds: definitions, assignments, imports, ``__all__`` (lazy faces)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(t.id for t in ast.walk(target) if isinstance(t, ast.Name))
                if isinstance(target, ast.Name) and target.id == "__all__" and isinstance(node.value, ast.List):
                    names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try | ast.With):  # TYPE_CHECKING blocks, guarded imports
            names |= _defined([*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])])
            for handler in getattr(node, "handlers", []):
                names |= _defined(handler.body)
    return names


def resolves(reference: str) -> bool:
    """Whether ``reference`` names a project module, or a name defined in one (a class attribute too)."""
    if reference in NOT_MODULES:
        return True
    parts = reference.split(".")
    for split in range(len(parts), 0, -1):
        path = _module_path(parts[:split])
        if path is None:
            continue
        rest = parts[split:]
        if not rest:
            return True
        body = _tree(path).body
        if rest[0] not in _defined(body):
            return False
        owner = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == rest[0]), None)
        return owner is None or len(rest) == 1 or rest[1] in _defined(owner.body)
    return False


def _docstrings(path: Path) -> list[str]:
    nodes = [n for n in ast.walk(_tree(path)) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)]
    return [doc for n in nodes if (doc := ast.get_docstring(n, clean=False))]


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _references(text: str) -> set[str]:
    return {m.group(1) for m in QUOTED.finditer(text)} | {m.group(1) for m in ROLE.finditer(text)}


def test_every_quoted_reference_in_the_docs_resolves() -> None:
    broken = {
        f"{doc.relative_to(ROOT)}: {name}"
        for doc in sorted((ROOT / "docs").glob("*.md"))
        for name in _references(doc.read_text(encoding="utf-8"))
        if not resolves(name)
    }
    assert sorted(broken) == []


def test_every_quoted_reference_in_a_docstring_resolves() -> None:
    broken = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in _sources()
        for doc in _docstrings(path)
        for name in _references(doc)
        if not resolves(name)
    }
    assert sorted(broken) == []


def test_a_package_docstring_names_only_its_own_modules() -> None:
    wrong = []
    for init in sorted(p for package in PACKAGES for p in (ROOT / package).rglob("__init__.py")):
        package = ".".join(init.parent.relative_to(ROOT).parts)
        doc = ast.get_docstring(_tree(init)) or ""
        for item in OWN_ITEM.findall(doc):
            if item not in PACKAGES and not resolves(f"{package}.{item}"):
                wrong.append(f"{init.relative_to(ROOT)}: {item}")
    assert wrong == []


def test_the_faces_export_what_the_layout_lists() -> None:
    import planner
    import planner.api
    import search

    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    functions = re.search(r"holds every public Python function: (.*?)\.\s+`from planner import", layout, re.DOTALL)
    assert functions is not None, "docs/layout.md no longer lists planner.api's functions"
    listed = set(re.findall(r"`(\w+)`", functions.group(1)))
    api_functions = {name for name in planner.api.__all__ if name[0].islower()}
    assert api_functions - listed == set(), "functions of planner.api that docs/layout.md does not name"
    assert listed - set(planner.__all__) == set(), "functions docs/layout.md names that planner does not export"
    assert set(planner.api.__all__) <= set(planner.__all__)
    assert all(hasattr(planner, name) for name in planner.__all__)
    assert callable(search.predict) and all(hasattr(search, name) for name in search.__all__)


def test_the_resolver_tells_a_moved_module_from_a_present_one() -> None:
    assert resolves("search.rollout.solve") and resolves("store.records.Hardware")
    assert resolves("planner.job.inputs.resolve") and resolves("store.records.Hardware.world_size")
    assert not resolves("search.step.phases") and not resolves("search.rollout.step")  # moved in issue 45
    assert not resolves("store.records.NoSuchName") and not resolves("search.nowhere")


def test_planner_reaches_search_through_its_faces() -> None:
    """``planner`` imports ``search`` through ``search/__init__.py`` (or a sub-package's face that says
    ``__all__``: calibration, allocator, spread), never a module behind it: what it uses is the face's."""
    faces = ("search", "search.calibration", "search.allocator", "search.spread")
    behind = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.module}"
        for path in sorted((ROOT / "planner").rglob("*.py"))
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "search"
        if node.module not in faces
    ]
    assert behind == [], "planner imports search behind its face"
