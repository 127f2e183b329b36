"""Fixtures of the planner tests: a guard database, the in-process CLI, subprocess runs, DeepSpeed's validator.

Every command that touches the database gets ``--db`` pointing at a SQLite file under a temporary folder
(and ``tests/conftest.py`` points ``PLANNER_DB`` and ``XDG_DATA_HOME`` at a throwaway folder for every
test). Recommend documents that several tests only read are
computed once per session (``opt13_24g``, ``nothing_fits``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import CPU_MEM, REPO, CliResult, run_main, subprocess_env


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A fresh SQLite file for one test (created by the first command that uses it)."""
    return tmp_path / "plans.db"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run ``planner.cli.main`` in-process; returns exit code and the captured stdout and stderr."""
    from planner.cli import main

    def run(*args: Any) -> CliResult:
        capsys.readouterr()
        rc = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(rc, captured.out, captured.err)

    return run


@pytest.fixture
def run_process() -> Callable[..., CliResult]:
    """Run a real process (``python -m planner ...``, the console script, ``python -c ...``)."""

    def run(argv: list[str], timeout: float = 900) -> CliResult:
        proc = subprocess.run(
            [str(a) for a in argv],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=subprocess_env(),
            timeout=timeout,
            check=False,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run


@dataclass(frozen=True)
class Recommended:
    """A ``recommend --json`` document and the database it was saved in."""

    doc: dict[str, Any]
    db: Path
    args: tuple[str, ...]


def _recommend(folder: Path, *args: str) -> Recommended:
    db = folder / "plans.db"
    result = run_main(["recommend", *args, "--json", "--db", str(db)])
    assert result.rc in (0, 1), result.err
    doc = result.json()
    assert result.rc == (0 if doc["fits"] else 1)  # exit 1: nothing fits, the closest plan printed all the same
    return Recommended(doc, db, tuple(args))


@pytest.fixture(scope="session")
def opt13_24g(tmp_path_factory: pytest.TempPathFactory) -> Recommended:
    """THE headline job: opt-1.3b SFT on a 24G GPU with 64G of host memory."""
    return _recommend(
        tmp_path_factory.mktemp("opt13"), "--model", "opt-1.3b", "--gpu-mem", "24G", "--workload", "sft", *CPU_MEM
    )


@pytest.fixture(scope="session")
def nothing_fits(tmp_path_factory: pytest.TempPathFactory) -> Recommended:
    """A 70B model on a 16G GPU with 16G of host memory: no strategy fits, not even LoRA."""
    return _recommend(
        tmp_path_factory.mktemp("huge"),
        "--model",
        "llama-2-70b",
        "--gpu-mem",
        "16G",
        "--cpu-mem",
        "16G",
        "--workload",
        "sft",
    )


@pytest.fixture(scope="session")
def deepspeed_config() -> Callable[[Any], Any]:
    """DeepSpeed's own config parser and validator, built without a process group (world size 1).

    ``DeepSpeedConfig`` falls back to rank 0 of 1 when ``deepspeed.comm`` is not initialized, so it
    validates single-GPU configs completely (batch arithmetic, pydantic models of every section).
    """
    assert os.environ.get("DS_ACCELERATOR") == "cpu"
    from deepspeed.runtime.config import DeepSpeedConfig

    def build(config: Any) -> Any:
        return DeepSpeedConfig(config if isinstance(config, dict) else str(config))

    return build
