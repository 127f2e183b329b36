"""Bad input: exit code 2, exactly one ``planner: error:`` line on stderr, nothing on stdout, no traceback."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import CPU_MEM, CliResult, assert_one_error_line

Cli = Callable[..., CliResult]
GPU = ("--gpu-mem", "24G")
SFT = (*GPU, *CPU_MEM)  # CPU_MEM pins --workload sft
PPO = (*GPU, *CPU_MEM, "--workload", "ppo")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "opt-1.3b", "--gpu-mem", "0", *CPU_MEM], "--gpu-mem"),
        (["--model", "opt-1.3b", "--gpu-mem", "-5G", *CPU_MEM], "--gpu-mem"),
        (["--model", "opt-1.3b", "--gpu-mem", "lots", *CPU_MEM], "lots"),
        (["--model", "opt-1.3b", "--gpu-mem", "24X", *CPU_MEM], "--gpu-mem"),
        (["--model", "opt-1.3b", *GPU, "--cpu-mem", "0"], "--cpu-mem"),
        (["--model", "opt-1.3b", *GPU, "--cpu-mem", "plenty"], "--cpu-mem"),
        (["--model", "opt-1.3b", *GPU, *CPU_MEM, "--batch", "7", "--gpus", "2"], "--batch 7"),
        (["--model", "opt-1.3b", *GPU, *CPU_MEM, "--batch", "12", "--gpus", "4", "--nodes", "2"], "--batch 12"),
        (["--model", "opt-1.3b", *GPU, *CPU_MEM, "--batch", "0"], "--batch"),
        (["--model", "opt-1.3b", *GPU, *CPU_MEM, "--batch", "-8"], "--batch"),
        (["--model", "opt-1.3b", *SFT, "--seq-len", "0"], "--seq-len"),
        (["--model", "opt-1.3b", *SFT, "--seq-len", "99999"], "2048"),
        (["--model", "opt-1.3b", *GPU, *CPU_MEM, "--prompt-len", "1500", "--gen-len", "1000"], "2048"),
        (["--model", "opt-1.3b", *SFT, "--prompt-len", "128"], "--gen-len"),
        # RLHF
        (["--model", "opt-1.3b", *PPO, "--gen-len", "0"], "--gen-len"),
        (["--model", "opt-1.3b", *PPO, "--prompt-len", "-3"], "--prompt-len"),
        (["--model", "opt-1.3b", *PPO, "--seq-len", "512"], "--prompt-len"),
        (["--model", "opt-1.3b", *PPO, "--ppo-epochs", "0"], "--ppo-epochs"),
        (["--model", "opt-1.3b", *PPO, "--samples-per-prompt", "4"], "grpo"),
        (["--model", "opt-1.3b", *PPO, "--workload", "remax", "--critic-model", "opt-350m"], "critic"),
        (["--model", "opt-1.3b", *PPO, "--critic-model", "opt-13"], "opt-13b"),
        (["--model", "opt-1.3b", *PPO, "--reward-model", "gpt2", "--prompt-len", "100", "--gen-len", "1900"], "gpt2"),
        (["--model", "opt-1.3b", *PPO, "--gpus", "0"], "--gpus"),
        (["--model", "opt-1.3b", *PPO, "--nodes", "0"], "--nodes"),
        (["--model", "opt-1.3b", "--gpu", "H900", *CPU_MEM], "H900"),
        (["--model", "opt-1.3b", *PPO, "--workload", "pretrain"], "pretrain"),
        (["--model", "opt-1.3b", *PPO, "--dtype", "fp8"], "fp8"),
        (["--model", "opt-1.3b", *PPO, "--attn-impl", "xformers"], "xformers"),
        (["--model", "opt-1.3b", *PPO, "--safety-margin", "0.9"], "--safety-margin"),
        (["--model", "opt-1.3b", *PPO, "--lora-rank", "many"], "--lora-rank"),
        (["--model", "opt-1.3b", *PPO, "--top", "-1"], "--top"),
        (["--model", "opt-1.3b", *SFT, "--ref-model", "opt-125m"], "--ref-model"),
        (["--model", "opt-1.3b", *SFT, "--critic-model", "opt-125m"], "--critic-model"),
        (["--model", "opt-1.3b", *CPU_MEM], "--gpu"),  # no GPU given: neither --gpu-mem nor --gpu
        (["--model", "", *GPU, *CPU_MEM], "model"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_recommend_bad_input(cli: Cli, db: Path, args: list[str], fragment: str) -> None:
    assert_one_error_line(cli("recommend", *args, "--db", db), fragment)


def test_bad_input_saves_no_plan(cli: Cli, db: Path) -> None:
    assert_one_error_line(cli("recommend", "--model", "opt-1.3b", "--gpu-mem", "lots", *CPU_MEM, "--db", db))
    listed = cli("plans", "--json", "--db", db)
    assert listed.rc == 0 and listed.json() == []


def test_unknown_model_suggests_a_close_name(cli: Cli, db: Path) -> None:
    line = assert_one_error_line(cli("recommend", "--model", "opt-1.3", *GPU, *CPU_MEM, "--db", db), "opt-1.3")
    assert re.search(r"did you mean [^?]*\bopt-1\.3b\b", line), line


def test_malformed_local_config(cli: Cli, db: Path, tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    for given in (folder / "config.json", folder):
        assert_one_error_line(cli("recommend", "--model", given, *GPU, *CPU_MEM, "--db", db), "config.json")


def test_local_config_that_is_incomplete_or_unsupported(cli: Cli, db: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert_one_error_line(cli("recommend", "--model", empty, *GPU, *CPU_MEM, "--db", db), "model_type")
    bert = tmp_path / "bert.json"
    bert.write_text('{"model_type": "bert", "hidden_size": 768}')
    assert_one_error_line(cli("recommend", "--model", bert, *GPU, *CPU_MEM, "--db", db), "bert")
    mamba = tmp_path / "mamba.json"
    mamba.write_text('{"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100}')
    assert_one_error_line(cli("recommend", "--model", mamba, *GPU, *CPU_MEM, "--db", db), "attention heads")
    folder = tmp_path / "no_config_here"
    folder.mkdir()
    assert_one_error_line(cli("recommend", "--model", folder, *GPU, *CPU_MEM, "--db", db), "config.json")


def test_database_that_cannot_be_opened(cli: Cli, tmp_path: Path) -> None:
    not_a_db = tmp_path / "notes.db"
    not_a_db.write_text("these are not the plans you are looking for\n")
    assert_one_error_line(cli("recommend", "--model", "opt-125m", *GPU, *CPU_MEM, "--db", not_a_db))
    assert_one_error_line(cli("plans", "--db", tmp_path))  # a folder


def test_predict_nvme_offload_without_path(cli: Cli) -> None:
    result = cli("predict", "--model", "opt-1.3b", *GPU, *CPU_MEM, "--zero", "3", "--offload-optimizer", "nvme")
    assert_one_error_line(result, "--nvme-path")


def test_plans_limit_must_be_positive(cli: Cli, db: Path) -> None:
    assert_one_error_line(cli("plans", "--limit", "0", "--db", db), "--limit")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["recommend", *GPU, *CPU_MEM], "--model"),  # missing required --model
        (["recommend", "--model", "opt-1.3b", *GPU, *CPU_MEM, "--frobnicate"], "--frobnicate"),
        (["recommend", "--model", "opt-1.3b", *GPU, *CPU_MEM, "--batch", "eight"], "--batch"),
        (["frobnicate"], "frobnicate"),  # unknown command
        (["check", "--model", "opt-1.3b", *GPU, *CPU_MEM], "ds_config"),  # missing argument
    ],
    ids=["missing-model", "unknown-option", "batch-not-int", "unknown-command", "missing-argument"],
)
def test_usage_errors(cli: Cli, db: Path, args: list[str], fragment: str) -> None:
    """Errors found by the option parser (typer/click) get the same one-line treatment as InputError."""
    db_flag = [] if args[0] == "check" else ["--db", db]  # check reads no database
    assert_one_error_line(cli(*args, *db_flag), fragment)


def test_option_without_its_value(cli: Cli) -> None:
    assert_one_error_line(cli("export", "--output"), "--output")


def test_no_arguments_prints_help(cli: Cli) -> None:
    result = cli()
    assert result.rc == 0
    assert "recommend" in result.out and "Traceback" not in result.err


def test_no_arguments_prints_help_once(cli: Cli) -> None:
    result = cli()
    assert result.out.count("Usage:") == 1, result.out
