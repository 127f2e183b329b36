"""Issue 31: ``--framework`` (the program that runs the plan) on recommend, predict, check and tune.

It is carried in the workload record and the ``--json`` document (only when named: a document of the default
``deepspeed`` stays as it was), refused in one line where the program does not run the workload, re-read from
a saved plan, and an export to another framework's format says what differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import GIB, CliResult, assert_one_error_line

from planner.job.inputs import JobSpec, job_fields, resolve
from planner.planning.exporting import framework_differences

Cli = Callable[..., CliResult]
CPU_MEM = ("--cpu-mem", "64G")
# The DPO case: qwen2.5-1.5b, LoRA 16 with checkpointing, 8 pairs per micro-batch, 24 GiB
DPO = ("--model", "qwen2.5-1.5b", "--workload", "dpo", "--gpu-mem", "24G", *CPU_MEM)
DPO_STRATEGY = ("--zero", "0", "--grad-ckpt", "--lora-rank", "16", "--micro-batch", "8")


def _predict(cli: Cli, *args: object) -> dict:
    result = cli("predict", *DPO, *DPO_STRATEGY, *args, "--json")
    assert result.rc == 0, result.err
    return result.json()


def test_predict_carries_the_framework_and_follows_trl(cli: Cli) -> None:
    ours, trl = _predict(cli), _predict(cli, "--framework", "trl")
    assert "framework" not in ours["workload"]  # the default: today's document
    assert trl["workload"]["framework"] == "trl"
    assert ours["predicted"]["breakdown"]["logits"] > 16 * GIB
    assert trl["predicted"]["peak_allocated_bytes"] < ours["predicted"]["peak_allocated_bytes"] - 14 * GIB
    assert (ours["fits"], trl["fits"]) == (False, True)


def test_naming_the_default_moves_nothing(cli: Cli) -> None:
    assert _predict(cli, "--framework", "deepspeed") == _predict(cli)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--framework", "megatron"), "--framework must be one of deepspeed, hf, accelerate, trl"),
        (("--framework", "hf"), "--framework hf runs sft, reward, not dpo"),
        (("--framework", "openrlhf"), "--framework openrlhf runs ppo, remax, grpo, not dpo"),
    ],
)
def test_bad_framework_is_one_line(cli: Cli, args: tuple[str, ...], fragment: str) -> None:
    assert_one_error_line(cli("predict", *DPO, *DPO_STRATEGY, *args), fragment)


@pytest.mark.parametrize("command", ["recommend", "predict", "check", "tune"])
def test_job_commands_offer_framework(cli: Cli, command: str) -> None:
    result = cli(command, "--help")
    assert result.rc == 0 and "--framework" in result.out


def test_check_plans_for_the_framework(cli: Cli, tmp_path: Path) -> None:
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "bf16": {"enabled": True}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    args = ("check", path, "--model", "qwen2.5-1.5b", "--gpu-mem", "24G", *CPU_MEM, "--lora-rank", "16")
    args += ("--grad-ckpt", "--seq-len", "2048", "--json")
    ours, trl = cli(*args), cli(*args, "--framework", "trl")
    theirs, mine = trl.json()["report"], ours.json()["report"]
    assert theirs["workload"]["framework"] == "trl" and "framework" not in mine["workload"]
    assert theirs["predicted"]["peak_allocated_bytes"] < mine["predicted"]["peak_allocated_bytes"]


def test_openrlhf_attention_default_and_explicit_attention() -> None:
    job = JobSpec(model="opt-1.3b", workload="ppo", gpu_mem="80G", cpu_mem="64G", framework="openrlhf")
    resolved = resolve(job)
    assert resolved.workload.attn_impl == "flash_attention_2"
    assert any("OpenRLHF 0.11.2's default" in line for line in resolved.readings)
    assert resolve(JobSpec(**{**job.__dict__, "attn_impl": "sdpa"})).workload.attn_impl == "sdpa"
    assert resolve(JobSpec(**{**job.__dict__, "framework": "deepspeed"})).workload.attn_impl == "sdpa"


def test_a_saved_plan_keeps_its_framework() -> None:
    job = JobSpec(model="qwen2.5-1.5b", workload="sft", gpu_mem="24G", cpu_mem="64G", framework="trl")
    workload = resolve(job).workload
    document = workload.to_dict()
    assert document["framework"] == "trl"
    fields = job_fields(document, resolve(job).hardware.to_dict())
    assert fields["framework"] == "trl"
    default = resolve(JobSpec(model="qwen2.5-1.5b", workload="sft", gpu_mem="24G", cpu_mem="64G")).workload
    assert "framework" not in default.to_dict()


def test_export_of_another_frameworks_plan_says_what_differs(cli: Cli, db: Path, tmp_path: Path) -> None:
    planned = cli("recommend", *DPO, "--framework", "trl", "--top", "0", "--json", "--db", db)
    assert planned.rc == 0, planned.err
    exported = cli("export", "-o", tmp_path / "ds_config.json", "--db", db)
    assert exported.rc == 0, exported.err
    lines = [line for line in exported.out.splitlines() if line.startswith("  * planned for trl")]
    assert len(lines) == 3, exported.out  # the fused head, the reference's order, TRL's disable_dropout
    assert "The plan was made for trl; --format deepspeed runs otherwise" in exported.out
    same = cli("export", "--format", "trl", "-o", tmp_path / "trl_config.py", "--db", db)
    assert same.rc == 0, same.err
    assert "planned for" not in same.out


def test_framework_differences_of_a_document() -> None:
    assert framework_differences({"workload": {"kind": "dpo"}}, "trl")  # a default plan exported for TRL
    assert framework_differences({"workload": {"kind": "sft"}}, "deepspeed") == []
    assert framework_differences({"workload": {"kind": "ppo", "framework": "openrlhf"}}, "openrlhf") == []
    assert framework_differences({}, "trl") == []  # a document without its workload: nothing to say


def test_the_api_takes_framework_and_the_report_names_it(cli: Cli) -> None:
    from planner import predict

    job = {"workload": "dpo", "gpu_mem": "24G", "cpu_mem": "64G", "framework": "trl"}
    strategy = {"zero_stage": 0, "gradient_checkpointing": True, "lora_rank": 16, "micro_batch": 8}
    report = predict("qwen2.5-1.5b", strategy, **job)
    assert report.model_dump()["workload"]["framework"] == "trl"
    assert report.fits
    shown = cli("predict", *DPO, *DPO_STRATEGY, "--framework", "trl")
    assert shown.rc == 0 and "· for trl" in shown.out
