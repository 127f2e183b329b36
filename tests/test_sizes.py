"""One size rule for every package: files of about 400 lines at most, functions of 80 (docs/development.md:
small files with one job; a function that long does several things and is split along them).

Only data tables are allowed longer, each named here with what it holds: a catalog is a list of entries, not
logic to split. Checked on the source text (lines of a file; a function's lines from its first decorator to
its last line), for ``planner``, ``search``, ``probes``, ``store``, ``launch``, ``benchmarks`` and ``scripts``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "search", "probes", "store", "launch", "benchmarks", "scripts")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
# data tables: the file, and what it holds
DATA_TABLES = {
    "store/gpus.py": "the GPU catalog: each GPU's memory, rates and links, with its datasheet",
    "store/model_catalog.py": "the model catalog: each built-in model's architecture, from its config",
}


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_files_are_small() -> None:
    long = {
        _name(p): n
        for p in _sources()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES and _name(p) not in DATA_TABLES
    }
    assert long == {}, f"files over {MAX_FILE_LINES} lines, to split along their jobs: {long}"


def test_functions_are_short() -> None:
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([d.lineno for d in node.decorator_list] + [node.lineno])
                if (n := (node.end_lineno or node.lineno) - first + 1) > MAX_FUNCTION_LINES:
                    long[f"{_name(path)}:{node.lineno} {node.name}"] = n
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines, to split into named steps: {long}"


def test_the_data_tables_named_exist_and_are_long() -> None:
    for name in DATA_TABLES:
        assert len((ROOT / name).read_text(encoding="utf-8").splitlines()) > MAX_FILE_LINES, f"{name}: no longer long"
