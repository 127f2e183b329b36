"""`make lint` and CI: the lint runs ruff and mypy, and runs the import-flow check only where it exists.

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


def _run_lint(tmp_path: Path, with_layers_check: bool) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "Makefile", repo / "Makefile")
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("ruff", "mypy"):
        _stub(bin_dir / tool, f'echo "{tool} $*" >> "{log}"')
    _stub(bin_dir / "python", f'exec "{sys.executable}" "$@"')
    if with_layers_check:
        tools = tmp_path / "shared" / "tools"
        tools.mkdir(parents=True)
        (tools / "check_layers.py").write_text(f"open({str(log)!r}, 'a').write('check_layers\\n')\n")
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
def test_lint_skips_the_import_flow_check_where_it_is_absent(tmp_path: Path) -> None:
    result, calls = _run_lint(tmp_path, with_layers_check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls == ["ruff check .", "ruff format --check .", "mypy "]
    assert "skipping the import-flow check" in result.stdout


@needs_make
def test_lint_runs_the_import_flow_check_where_it_exists(tmp_path: Path) -> None:
    result, calls = _run_lint(tmp_path, with_layers_check=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls == ["ruff check .", "ruff format --check .", "mypy ", "check_layers"]
    assert "skipping" not in result.stdout


def test_ci_runs_the_tests_then_the_lint() -> None:
    commands = [line.split("||")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands.index("make test") < commands.index("make lint")


def test_mypy_is_a_dev_dependency_and_checks_store_search_planner() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(dep.startswith("mypy") for dep in project["project"]["optional-dependencies"]["dev"])
    mypy = project["tool"]["mypy"]
    assert mypy["files"] == ["store", "search", "planner"]
    assert "ignore_errors" not in mypy
    assert all("ignore_errors" not in override for override in mypy.get("overrides", []))
