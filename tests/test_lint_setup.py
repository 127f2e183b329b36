"""`make lint` and CI: the lint runs ruff, mypy and the import layering (import-linter's ``lint-imports``), all
from the repository itself, so a clone with nothing beside it can run it.

The Makefile is run in a scratch copy of the project with stand-in tools (no real ruff or mypy run here),
and `setup` is marked up to date, so nothing is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _run_lint(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "Makefile", repo / "Makefile")
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("ruff", "mypy", "lint-imports"):
        _stub(bin_dir / tool, f'echo "{tool} $*" >> "{log}"')
    _stub(bin_dir / "python", f'exec "{sys.executable}" "$@"')
    result = subprocess.run(
        ["make", "--no-print-directory", "-o", "setup", "lint", f"VENV={tmp_path / 'venv'}"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return result, calls


@needs_make
def test_lint_runs_ruff_mypy_and_the_import_layering_from_the_clone_alone(tmp_path: Path) -> None:
    result, calls = _run_lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls == ["ruff check .", "ruff format --check .", "mypy ", "lint-imports "]
    assert "../shared" not in (ROOT / "Makefile").read_text()


def test_ci_runs_the_tests_then_the_lint() -> None:
    commands = [line.split("||")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands.index("make test") < commands.index("make lint")


def test_mypy_and_import_linter_are_dev_dependencies_and_mypy_checks_the_typed_packages() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dev = project["project"]["optional-dependencies"]["dev"]
    assert any(dep.startswith("mypy") for dep in dev)
    assert any(dep.startswith("import-linter") for dep in dev)
    mypy = project["tool"]["mypy"]
    assert mypy["files"] == ["store", "search", "launch", "planner"]
    assert "ignore_errors" not in mypy
    assert all("ignore_errors" not in override for override in mypy.get("overrides", []))
