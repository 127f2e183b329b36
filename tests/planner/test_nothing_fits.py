"""When nothing fits: exit 1, fits false, suggestions; LoRA as the fallback of ``--lora-rank auto``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from planner_helpers import CPU_MEM, CliResult, check_predicted_block, fits_by_numbers

Cli = Callable[..., CliResult]


def test_huge_model_on_a_small_gpu(nothing_fits) -> None:
    doc = nothing_fits.doc
    assert doc["fits"] is False
    # The closest strategy is still a complete, consistent prediction.
    check_predicted_block(doc["predicted"], doc["hardware"])
    assert fits_by_numbers(doc["predicted"], doc["hardware"]) is False
    # 70B bf16 weights alone are 128 GiB: they fit neither the 16 GiB GPU nor the 16 GiB of host.
    assert doc["workload"]["params"] * 2 > 2 * 16 * 2**30
    suggestions = doc["suggestions"]
    assert isinstance(suggestions, list) and suggestions
    assert all(isinstance(s, str) and s.strip() for s in suggestions)


def test_nothing_fits_is_exit_1_printed_and_saved(cli: Cli, nothing_fits, db: Path) -> None:
    listed = cli("plans", "--json", "--db", nothing_fits.db).json()
    assert nothing_fits.doc["plan_id"] in [d["plan_id"] for d in listed]
    assert all(d["fits"] is False for d in listed)
    human = cli("recommend", *nothing_fits.args, "--db", db)
    assert human.rc == 1, human.err  # exit 1: nothing fits; the closest plan and what would fit are printed
    assert not human.err.strip()
    for line in nothing_fits.doc["suggestions"]:
        assert " ".join(line.split()[:3]) in " ".join(human.out.split())


def test_lora_rank_0_on_a_huge_model(cli: Cli, db: Path) -> None:
    result = cli(
        "recommend", "--model", "llama-2-70b", "--gpu-mem", "16G", *CPU_MEM, "--lora-rank", "0",
        "--json", "--db", db,
    )  # fmt: skip
    assert result.rc == 1, result.err
    doc = result.json()
    assert doc["fits"] is False
    assert doc["strategy"]["lora_rank"] == 0
    assert doc["suggestions"]


def test_lora_is_the_fallback_when_only_lora_fits(cli: Cli, db: Path) -> None:
    # llama-2-7b on 24 GiB with 16 GiB of host: full fine-tuning needs 16 bytes/param of model states
    # (~104 GiB) on the GPU or host, so nothing fits; LoRA keeps only the frozen bf16 weights (~12.6 GiB).
    job = ("--model", "llama-2-7b", "--gpu-mem", "24G", "--cpu-mem", "16G", "--workload", "sft")
    full = cli("recommend", *job, "--lora-rank", "0", "--json", "--db", db)
    assert full.rc == 1, full.err
    assert full.json()["fits"] is False, "premise: no full fine-tune fits"

    auto = cli("recommend", *job, "--json", "--db", db)
    assert auto.rc == 0, auto.err
    doc = auto.json()
    assert doc["fits"] is True
    assert doc["strategy"]["lora_rank"] > 0
    assert any("lora" in s.lower() for s in doc["suggestions"]), doc["suggestions"]
    assert "lora" in doc["outside_settings"]
    assert str(doc["strategy"]["lora_rank"]) in doc["outside_settings"]["lora"]
    check_predicted_block(doc["predicted"], doc["hardware"])
    assert fits_by_numbers(doc["predicted"], doc["hardware"])
    if doc["strategy"]["zero_stage"] < 3 and doc["strategy"].get("quantization", "none") == "none":
        # Without ZeRO-3 the frozen base model stays whole on the GPU in bf16: 2 bytes per parameter.
        assert doc["predicted"]["breakdown"]["parameters"] >= 2 * doc["workload"]["params"]


def test_explicit_lora_rank(cli: Cli, db: Path) -> None:
    result = cli(
        "recommend", "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM, "--lora-rank", "8",
        "--json", "--db", db,
    )  # fmt: skip
    assert result.rc == 0, result.err
    doc = result.json()
    assert doc["strategy"]["lora_rank"] == 8
    assert all(alt["strategy"]["lora_rank"] == 8 for alt in doc["alternatives"])
