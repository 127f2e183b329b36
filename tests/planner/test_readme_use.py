"""The README's Use section runs as pasted: each command of its shell blocks, in order, exits 0.

The commands run in a fresh folder with their own database ($PLANNER_DB, as a user's shell would pass it), in
this process (``planner.cli.main``: the same code as the console script, without a Python start per line).
Every line of the Use section runs: it holds no probe or tune (those run real steps, minutes of CPU; they are in
"The two commands" and docs/probes.md, covered by tests/planner/test_probe*.py).

The blocks before it ("Quickstart", "The two commands") are each run here, or say why they cannot be: a block
whose first line is ``# needs a CUDA GPU`` is refused on a machine without one with the one device line (its
options parse up to the device check), and its CPU twin (``--device cpu``, docs/examples/train.py) runs in
``test_the_cpu_block_runs_as_pasted`` (real program runs: slow).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest
from planner_helpers import REPO, run_main

ACTIVATE = ". .venv/bin/activate"  # the test already runs in the venv's interpreter
FRESH_FOLDER = 'cd "$(mktemp -d)"'  # the test already runs in a fresh folder
NEEDS_GPU = "# needs a CUDA GPU"


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
            if line == ACTIVATE or line.startswith(FRESH_FOLDER):
                continue
            argv = shlex.split(line, comments=True)
            assert argv[0] == "planner", f"not a planner command (run it here or skip it, saying why): {line}"
            result = run_main(argv[1:])
            assert result.rc == 0, f"{line}\n -> exit {result.rc}: {result.err.strip()}"
            assert "Traceback" not in result.err, line
    assert (tmp_path / "ds_config.json").is_file()
    assert (tmp_path / "memory.html").is_file()
    assert (tmp_path / "run_openrlhf.sh").is_file() or any(tmp_path.glob("*openrlhf*"))


def blocks_before_use(readme: str) -> list[list[str]]:
    """Each ```bash block before "## Use", every line kept (comments too), in order."""
    blocks: list[list[str]] = []
    inside = False
    for line in readme.split("\n## Use\n", 1)[0].splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```bash"
            if inside:
                blocks.append([])
            continue
        if inside and line.strip():
            blocks[-1].append(line.strip())
    return blocks


def test_the_blocks_before_use_run_here_or_say_they_need_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the GPU blocks would run real probes")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLANNER_DB", str(tmp_path / "memplan.sqlite3"))
    blocks = blocks_before_use((REPO / "README.md").read_text())
    makefile = (REPO / "Makefile").read_text()
    demo = makefile.split("\ndemo: setup\n", 1)[1].splitlines()[0].strip().removeprefix("$(BIN)/")
    gpu_blocks = [block for block in blocks if block[0].startswith(NEEDS_GPU)]
    assert len(gpu_blocks) == 2 and any("--device cpu" in line for block in blocks for line in block)
    ran: list[list[str]] = []
    for block in blocks:
        if any("--device cpu" in line for line in block):
            continue  # test_the_cpu_block_runs_as_pasted
        for line in block:
            argv = shlex.split(line, comments=True)
            if not argv or line == ACTIVATE:
                continue
            if argv[0] == "make":  # demo: its recipe is a recommend line run below; test and lint: the suite itself
                assert argv[1] in {"demo", "test", "lint"}, line
                continue
            assert argv[0] == "planner", line
            if block[0].startswith(NEEDS_GPU) and argv[1] not in {"probe", "tune"}:
                continue  # calibrate and recommend --program read what the GPU block's probes store
            result = run_main(argv[1:])
            assert "Traceback" not in result.err, line
            if block[0].startswith(NEEDS_GPU):
                assert result.rc == 2 and "torch sees no CUDA device" in result.err, f"{line}\n -> {result.err}"
                assert len(result.err.strip().splitlines()) == 1, result.err
                continue
            assert result.rc == 0, f"{line}\n -> exit {result.rc}: {result.err.strip()}"
            ran.append(argv)
    assert shlex.split(demo) in ran, (demo, ran)


@pytest.mark.slow
def test_the_cpu_block_runs_as_pasted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The no-GPU block from the checkout (its paths are the repository's): the user's program probed under the
    plan and its next best with DeepSpeed's AdamW (its op built before the runs), then calibrate."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PLANNER_DB", str(tmp_path / "memplan.sqlite3"))
    monkeypatch.setenv("MEMPLAN_PROGRESS_INTERVAL_S", "0")
    venv_bin = str(Path(sys.executable).parent)  # what the block's activate line does: its `python` is the venv's
    monkeypatch.setenv("PATH", os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))
    (block,) = [block for block in blocks_before_use((REPO / "README.md").read_text()) if ACTIVATE in block]
    lines = [line for line in block if line != ACTIVATE and not line.startswith("#")]
    assert any("-- python docs/examples/train.py" in line for line in lines)
    for line in lines:
        argv = shlex.split(line, comments=True)
        assert argv[0] == "planner", line
        result = run_main(argv[1:])
        assert result.rc == 0, f"{line}\n -> exit {result.rc}: {result.err.strip()[-3000:]}"
        assert "Traceback" not in result.err, line
        if argv[1] == "probe":
            assert result.out.count(": ok") == 2, result.out[-3000:]
