"""One size rule for every package: files of about 400 lines at most, functions of 80 (docs/development.md:
small files with one job; a function that long does several things and is split along them), and at most 12
parameters a function (settings that travel together are a record: ``search.rollout.engine_setup.EngineSetup``,
``search.model.turn.MicroStepTurn``, ``planner.probing.settings.ProbeSettings``).

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
MAX_PARAMETERS = 12
# the faces whose keywords are the user's own options, one each (docs/api.md, docs/cli.md): a record there would
# rename the contract
USER_OPTIONS = {
    "planner/probing/session.py probe": "planner.probe(model, *, device=..., steps=..., ...): the API's keywords",
    "planner/probing/program.py probe_program": "planner.probe_program(...): the API's keywords",
    "planner/tuning/run.py tune": "planner.tune(...): the API's keywords",
    "planner/cli/predict.py predict_command": "planner predict: one typer option a parameter",
}
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


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters a caller may pass (``self`` and ``cls`` not counted; ``*args`` and ``**kwargs`` one each)."""
    a = node.args
    named = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    if named and named[0].arg in ("self", "cls"):
        named = named[1:]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def test_functions_take_few_parameters() -> None:
    many = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{_name(path)} {node.name}"
                if (n := _parameters(node)) > MAX_PARAMETERS and name not in USER_OPTIONS:
                    many[f"{_name(path)}:{node.lineno} {node.name}"] = n
    assert many == {}, f"functions of over {MAX_PARAMETERS} parameters, to take a record of those that travel: {many}"


def test_the_user_option_faces_named_exist_and_take_many() -> None:
    for name in USER_OPTIONS:
        file, function = name.split(" ")
        tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
        found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
        assert found and _parameters(found[0]) > MAX_PARAMETERS, f"{name}: gone or no longer long; drop it here"


def test_the_data_tables_named_exist_and_are_long() -> None:
    for name in DATA_TABLES:
        assert len((ROOT / name).read_text(encoding="utf-8").splitlines()) > MAX_FILE_LINES, f"{name}: no longer long"
