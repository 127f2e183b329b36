"""The code's layering as docs/layout.md states it, checked on the code itself.

- import-linter's contracts in pyproject.toml (``lint-imports``, run by ``make lint``) hold, and they do fail
  when a lower layer imports a higher one (checked on a copy of the packages with one such import added);
- no import cycle between any two modules of the project (import-linter's layers leave cycles inside a layer
  unchecked; this walks grimp's import graph, every import statement counted, function-level ones too);
- ``store``, ``search`` and ``launch`` keep torch, deepspeed and transformers out of their module level (they
  are imported on ``planner recommend``'s path, which must start fast);
- the public names of ``planner`` are the API's functions, not sub-packages of the same name.
"""

from __future__ import annotations

import ast
import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "search", "probes", "launch", "store")
LIGHT = ("store", "search", "launch")
HEAVY = ("torch", "deepspeed", "transformers")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

needs_import_linter = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="needs import-linter (the dev extra)")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=600, check=False
    )


@needs_import_linter
def test_the_import_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@needs_import_linter
@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("store/errors.py", "import planner.api"),  # the ground floor reaching the top
        ("launch/ds_config.py", "import probes.runner"),  # launch below probes
        ("planner/job/inputs.py", "import planner.planning.saved"),  # inside planner: job below planning
        ("probes/model/lora.py", "import probes.step.child"),  # inside probes: model below step
        ("search/rollout/engine_shape.py", "import search.rlhf.job"),  # inside search: engine rules below RLHF
        ("search/streams/sizes.py", "import search.step.assemble"),  # inside search: streams below the step
        ("planner/files/file_set.py", "import probes.process.jit_lock"),  # planner's files: OS helpers in store
    ],
)
def test_the_contracts_fail_on_an_upward_import(tmp_path: Path, module: str, upward: str) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{upward}  # an upward import\n")
    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0, result.stdout[-2000:]
    assert upward.split()[1] in result.stdout


def _import_graph() -> dict[str, set[str]]:
    grimp = pytest.importorskip("grimp")
    sys.path.insert(0, str(ROOT))
    try:
        graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    finally:
        sys.path.remove(str(ROOT))
    return {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _without_package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph less a package's imports of its own sub-modules (an ``__init__`` re-exporting is not a cycle)."""
    return {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in edges.items()}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_without_package_edges(_import_graph())) == []


def _module_level_imports(tree: ast.Module) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.append((child.module, child.lineno))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            ):
                continue
            else:
                visit(child)

    visit(tree)
    return found


def test_the_light_packages_import_no_heavy_library_at_module_level() -> None:
    heavy = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for package in LIGHT
        for path in sorted((ROOT / package).rglob("*.py"))
        for module, line in _module_level_imports(ast.parse(path.read_text(encoding="utf-8")))
        if module.split(".")[0] in HEAVY
    ]
    assert heavy == []


def test_the_public_names_are_the_api_functions_after_every_sub_package_is_loaded() -> None:
    code = (
        "import importlib, pkgutil, planner\n"
        "for info in pkgutil.walk_packages(planner.__path__, 'planner.'):\n"
        "    if info.ispkg: importlib.import_module(info.name)\n"
        "import planner.api\n"
        "bad = [n for n in planner.__all__ if getattr(planner, n) is not getattr(planner.api, n)]\n"
        "print(bad)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


KIND_NAMES = frozenset({"sft", "reward", "dpo", "ppo", "remax", "grpo"})
VARIADIC = ("add_row", "create_table")  # rich's table rows, alembic's columns: lists, not argument orders


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {text for element in node.elts for text in _strings(element)}
    return set()


@functools.cache
def _project_trees() -> list[tuple[Path, ast.Module]]:
    """Every module of the packages, parsed once for the tests that walk them (none changes a tree)."""
    return [
        (path, ast.parse(path.read_text(encoding="utf-8")))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def test_what_a_workload_kind_implies_is_read_from_the_kind_table() -> None:
    """No ``kind == "dpo"`` outside ``store/workload_kinds.py``: every implication is a field of its table."""
    found = []
    for path, tree in _project_trees():
        if path.name == "workload_kinds.py":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if not {text for side in sides for text in _strings(side)} & KIND_NAMES:
                continue  # no kind named: what the sides say is not read (ast.unparse is most of the walk)
            if any("kind" in ast.unparse(side) or "workload" in ast.unparse(side) for side in sides):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_no_call_passes_eight_or_more_positional_arguments() -> None:
    """Settings travel as records or keywords: a swapped pair of positional ints would pass mypy."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}"
        for path, tree in _project_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and len([arg for arg in node.args if not isinstance(arg, ast.Starred)]) >= 8
        and not ast.unparse(node.func).endswith(VARIADIC)
    ]
    assert found == []
