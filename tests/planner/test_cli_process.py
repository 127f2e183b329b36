"""The CLI as users run it: help, ``python -m planner``, the ``planner`` console script, and import weight."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import CPU_MEM, VENV_BIN, CliResult, assert_one_error_line, run_main

Cli = Callable[..., CliResult]
COMMANDS = ("recommend", "predict", "check", "export", "plans", "explain")
PLANNER = VENV_BIN / "planner"


def test_top_level_help(cli: Cli) -> None:
    for flag in ("--help", "-h"):
        result = cli(flag)
        assert result.rc == 0, result.err
        assert "Usage:" in result.out
        for command in COMMANDS:
            assert command in result.out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(cli: Cli, command: str) -> None:
    result = cli(command, "--help")
    assert result.rc == 0, result.err
    assert result.err_lines == []
    assert "Usage:" in result.out
    assert "Example:" in result.out
    assert f"planner {command}" in result.out


def test_recommend_help_lists_the_contract_options(cli: Cli) -> None:
    out = cli("recommend", "--help").out
    for option in ("--model", "--gpu-mem", "--workload", "--gpu", "--gpus", "--nodes", "--cpu-mem", "--batch"):
        assert option in out
    for option in ("--seq-len", "--prompt-len", "--gen-len", "--dtype", "--attn-impl", "--top", "--json", "--db"):
        assert option in out


def test_python_m_planner_and_console_script_end_to_end(run_process, tmp_path: Path) -> None:
    db = tmp_path / "plans.db"
    rec = run_process(
        [sys.executable, "-m", "planner", "recommend", "--model", "opt-125m", "--gpu-mem", "24G", *CPU_MEM]
        + ["--json", "--db", db]
    )
    assert rec.rc == 0, rec.err
    doc = rec.json()
    assert doc["workload"]["model"] == "opt-125m" and doc["hardware"]["gpu_memory_bytes"] == 24 * 2**30

    out = tmp_path / "ds_config.json"
    exported = run_process([PLANNER, "export", doc["plan_id"][:6], "-o", out, "--db", db])
    assert exported.rc == 0, exported.err
    assert json.loads(out.read_text()) == doc["ds_config"]

    again = run_process([PLANNER, "export", "-o", out, "--db", db])
    assert_one_error_line(again, "--force")

    listed = run_process([PLANNER, "plans", "--json", "--db", db])
    assert listed.rc == 0 and [d["plan_id"] for d in listed.json()] == [doc["plan_id"]]

    checked = run_process([PLANNER, "check", out, "--model", "opt-125m", "--gpu-mem", "24G", *CPU_MEM, "-q"])
    assert checked.rc == 0, checked.out + checked.err
    too_small = run_process([PLANNER, "check", out, "--model", "opt-125m", "--gpu-mem", "1G", *CPU_MEM, "-q"])
    assert too_small.rc == 1, too_small.out + too_small.err


@pytest.mark.parametrize(
    "args",
    [
        ["recommend", "--model", "opt-1.3b", "--gpu-mem", "lots", *CPU_MEM],
        ["recommend", "--gpu-mem", "24G", *CPU_MEM],  # missing --model: caught by the option parser
    ],
    ids=["bad-size", "missing-model"],
)
def test_console_script_bad_input(run_process, tmp_path: Path, args: list[str]) -> None:
    db = tmp_path / "plans.db"
    assert_one_error_line(run_process([PLANNER, *args, "--db", db]))
    assert run_main(["plans", "--json", "--db", db]).json() == []  # nothing was saved


def test_console_script_help(run_process) -> None:
    result = run_process([PLANNER, "--help"])
    assert result.rc == 0 and "recommend" in result.out


# planner.api's measuring layer, loaded by the functions that measure (about 40 ms of planner recommend's start)
MEASURING = ("planner.probing.session", "planner.probing.program", "planner.tuning.run", "planner.calibration.fit")
MEASURING += ("planner.report.plot",)


def test_recommend_imports_no_torch_deepspeed_or_transformers(run_process, tmp_path: Path) -> None:
    db = tmp_path / "plans.db"
    args = ["recommend", "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM, "--json", "--db", str(db)]
    code = (
        "import io, sys, contextlib\n"
        "import planner\n"
        "from planner import recommend, predict, check\n"
        "from planner.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main({args!r})\n"
        "heavy = sorted(m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules)\n"
        f"measuring = sorted(m for m in {MEASURING!r} if m in sys.modules)\n"
        "print(rc, heavy, measuring)\n"
    )
    result = run_process([sys.executable, "-c", code])
    assert result.rc == 0, result.err
    assert result.out.strip() == "0 [] []"  # nor the measuring layer, nor the plot's drawing (planner.api)
    assert db.is_file()


def test_explain_lists_the_coefficients(cli: Cli) -> None:
    result = cli("explain")
    assert result.rc == 0, result.err
    assert "Cost-model coefficients" in result.out
