"""The README's Use section runs as pasted: each command of its shell blocks, in order, exits 0.

The commands run in a fresh folder with their own database ($PLANNER_DB, as a user's shell would pass it), in
this process (``planner.cli.main``: the same code as the console script, without a Python start per line).
Every line of the Use section runs: it holds no probe or tune (those run real steps, minutes of CPU; they are in
"The two commands" and docs/probes.md, covered by tests/planner/test_probe*.py).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from planner_helpers import REPO, run_main

ACTIVATE = ". .venv/bin/activate"  # the test already runs in the venv's interpreter


def use_section_blocks(readme: str) -> list[list[str]]:
    """The command lines of each ```bash block between "## Use" and the next "## " heading, in order."""
    section = readme.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    blocks: list[list[str]] = []
    inside = False
    for line in section.splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```bash"
            if inside:
                blocks.append([])
            continue
        if inside and line.strip() and not line.lstrip().startswith("#"):
            blocks[-1].append(line.strip())
    return blocks


def test_the_use_section_has_the_commands_the_issue_named() -> None:
    lines = [line for block in use_section_blocks((REPO / "README.md").read_text()) for line in block]
    assert any(line.startswith("planner export --format openrlhf") for line in lines)
    assert any(line.startswith("planner check ds_config.json") for line in lines)
    assert len(lines) >= 15


def test_the_use_section_runs_as_pasted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLANNER_DB", str(tmp_path / "memplan.sqlite3"))
    for block in use_section_blocks((REPO / "README.md").read_text()):
        for line in block:
            if line == ACTIVATE:
                continue
            argv = shlex.split(line, comments=True)
            assert argv[0] == "planner", f"not a planner command (run it here or skip it, saying why): {line}"
            result = run_main(argv[1:])
            assert result.rc == 0, f"{line}\n -> exit {result.rc}: {result.err.strip()}"
            assert "Traceback" not in result.err, line
    assert (tmp_path / "ds_config.json").is_file()
    assert (tmp_path / "memory.html").is_file()
    assert (tmp_path / "run_openrlhf.sh").is_file() or any(tmp_path.glob("*openrlhf*"))
