"""``planner check``: exit 0 fits, 1 does not fit, 2 bad input; the dtype comes from the config."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import CPU_MEM, GIB, CliResult, assert_one_error_line

Cli = Callable[..., CliResult]
OPT_13B_PARAMS = 1_315_758_080  # facebook/opt-1.3b, tied LM head: what transformers instantiates


def _write(folder: Path, config: Any, name: str = "ds_config.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(config))
    return path


def _zero2(**extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
    }
    config.update(extra)
    return config


def _outside_flags(strategy: dict[str, Any]) -> list[str]:
    return [
        "--grad-ckpt" if strategy["gradient_checkpointing"] else "--no-grad-ckpt",
        "--lora-rank",
        str(strategy["lora_rank"]),
        "--empty-cache",
        strategy["empty_cache"],
        "--allocator",
        strategy["allocator"],
    ]


def test_recommended_config_fits_and_reproduces_the_prediction(cli: Cli, tmp_path: Path, opt13_24g) -> None:
    doc = opt13_24g.doc
    path = _write(tmp_path, doc["ds_config"])
    flags = _outside_flags(doc["strategy"])
    result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM, *flags)
    assert result.rc == 0, result.err

    as_json = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM, *flags, "--json")
    assert as_json.rc == 0
    checked = as_json.json()
    assert checked["fits"] is True and checked["reasons"] == []
    report = checked["report"]
    assert report["strategy"] == doc["strategy"]
    assert report["predicted"] == doc["predicted"]
    assert report["ds_config"] == doc["ds_config"]


def test_too_small_gpu_does_not_fit(cli: Cli, tmp_path: Path, opt13_24g) -> None:
    path = _write(tmp_path, opt13_24g.doc["ds_config"])
    result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "4G", *CPU_MEM)
    assert result.rc == 1, result.err
    assert result.err_lines == []
    checked = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "4G", *CPU_MEM, "--json").json()
    assert checked["fits"] is False
    assert checked["reasons"] and any("GPU" in r for r in checked["reasons"])
    predicted = checked["report"]["predicted"]
    # bf16 weights alone are 2 bytes x 1.3B = 2.45 GiB; with activations and buffers it cannot be under 4 GiB.
    assert predicted["peak_reserved_bytes"] > predicted["gpu_budget_bytes"]
    quiet = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "4G", *CPU_MEM, "-q")
    assert quiet.rc == 1 and "does not fit" in quiet.out


def test_too_little_host_memory_does_not_fit(cli: Cli, tmp_path: Path) -> None:
    # Optimizer states offloaded to the host: fp32 master, m and v are 12 bytes x 1.3B = 14.7 GiB > 4 GiB.
    config = _zero2(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}})
    path = _write(tmp_path, config)
    result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", "--cpu-mem", "4G", "--json")
    assert result.rc == 1, result.err
    checked = result.json()
    assert checked["fits"] is False
    assert checked["report"]["predicted"]["host_bytes"] >= 12 * OPT_13B_PARAMS
    assert any("host" in r for r in checked["reasons"])
    roomy = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", "--cpu-mem", "256G", "-q")
    assert roomy.rc == 0, roomy.out + roomy.err


@pytest.mark.parametrize(
    ("blocks", "dtype", "bytes_per_param"),
    [
        ({"bf16": {"enabled": True}, "fp16": {"enabled": False}}, "bf16", 2),
        ({"bf16": {"enabled": False}, "fp16": {"enabled": True}}, "fp16", 2),
        ({"bf16": {"enabled": False}, "fp16": {"enabled": False}}, "fp32", 4),
        ({}, "fp32", 4),
    ],
    ids=["bf16", "fp16", "fp32", "no-precision-block"],
)
def test_dtype_is_read_from_the_config(
    cli: Cli, tmp_path: Path, blocks: dict[str, Any], dtype: str, bytes_per_param: int
) -> None:
    config = _zero2()
    del config["bf16"]
    config.update(blocks)
    path = _write(tmp_path, config)
    result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", *CPU_MEM, "--json")
    assert result.rc in (0, 1), result.err
    report = result.json()["report"]
    assert report["workload"]["dtype"] == dtype
    # ZeRO-2 keeps every weight on each GPU in the training dtype.
    assert report["predicted"]["breakdown"]["parameters"] == bytes_per_param * OPT_13B_PARAMS
    assert report["ds_config"].get("bf16", {}).get("enabled", False) == (dtype == "bf16")
    assert report["ds_config"].get("fp16", {}).get("enabled", False) == (dtype == "fp16")


def test_batch_comes_from_the_config(cli: Cli, tmp_path: Path) -> None:
    config = _zero2(train_batch_size=32, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=4)
    path = _write(tmp_path, config)
    result = cli("check", path, "--model", "opt-125m", "--gpu-mem", "24G", "--gpus", "2", *CPU_MEM, "--json")
    assert result.rc == 0, result.err
    report = result.json()["report"]
    assert report["workload"]["global_batch"] == 32
    assert (report["strategy"]["micro_batch"], report["strategy"]["grad_accum"]) == (4, 4)
    assert report["ds_config"]["train_batch_size"] == 32


def test_malformed_json(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"train_batch_size": 8,')
    assert_one_error_line(cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM), "JSON")


def test_missing_file(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    assert_one_error_line(cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM), "nope.json")


@pytest.mark.parametrize(
    ("config", "gpus"),
    [
        (_zero2(train_batch_size=12), "1"),  # 12 != 8 x 1 x 1
        (_zero2(), "2"),  # 8 != 8 x 1 x 2
        ({"train_batch_size": 9, "gradient_accumulation_steps": 2}, "1"),  # 9 does not split into 2 steps
        (_zero2(zero_optimization={"stage": 5}), "1"),
        ([1, 2, 3], "1"),
        ({"bf16": {"enabled": True}}, "1"),  # no batch at all
        (_zero2(zero_optimization={"stage": 2, "reduce_bucket_size": -5}), "1"),
        (_zero2(zero_optimization={"stage": 2, "overlap_comm": "sometimes"}), "1"),  # "yes" is true to DeepSpeed
    ],
    ids=[
        "batch-mismatch",
        "batch-mismatch-2-gpus",
        "batch-not-divisible",
        "stage-5",
        "not-an-object",
        "no-batch",
        "negative-bucket",
        "overlap-not-a-bool",
    ],  # fmt: skip
)
def test_inconsistent_config_is_bad_input(cli: Cli, tmp_path: Path, config: Any, gpus: str) -> None:
    path = _write(tmp_path, config)
    result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "24G", "--gpus", gpus, *CPU_MEM)
    assert_one_error_line(result)


def test_the_configs_own_buckets_are_predicted(cli: Cli, tmp_path: Path) -> None:
    """DeepSpeed's default 5e8-element reduce bucket, double-buffered with overlap_comm, against 1e8: the
    report shows the config's buckets and its backward holds 2 x 2 bytes x 4e8 elements more."""
    peaks = []
    for size in (5e8, 1e8):
        config = _zero2(
            train_batch_size=1, train_micro_batch_size_per_gpu=1,
            zero_optimization={"stage": 2, "reduce_bucket_size": size, "overlap_comm": True},
        )  # fmt: skip
        path = _write(tmp_path, config, f"ds_{size:.0e}.json")
        result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", "--seq-len", "64", *CPU_MEM, "--json")
        assert result.rc == 0, result.err
        report = result.json()["report"]
        assert report["strategy"]["ds_buckets"]["reduce_bucket_size"] == int(size)
        peaks.append(next(p["peak_allocated_bytes"] for p in report["predicted"]["phases"] if p["name"] == "backward"))
    assert peaks[0] - peaks[1] == 2 * 2 * 400_000_000


def _hf_zero3(**extra: Any) -> dict[str, Any]:
    """transformers' documented ZeRO-3 config: every size the Trainer knows is "auto"."""
    config: dict[str, Any] = {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": dict.fromkeys(("lr", "betas", "eps", "weight_decay"), "auto")},
        "zero_optimization": {
            "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 1e9,
            "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True,
        },
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }  # fmt: skip
    config.update(extra)
    return config


@pytest.mark.parametrize(
    ("flags", "dtype", "micro", "accum"),
    [((), "bf16", 8, 1), (("--batch", "12", "--dtype", "fp16"), "fp16", 12, 1)],
    ids=["job-defaults", "batch-and-dtype-given"],
)
def test_a_transformers_auto_config_takes_the_jobs_batch_and_dtype(
    cli: Cli, tmp_path: Path, flags: tuple[str, ...], dtype: str, micro: int, accum: int
) -> None:
    """The Trainer fills "auto" from its arguments, which the job's --batch and --dtype stand for."""
    path = _write(tmp_path, _hf_zero3())
    result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", *CPU_MEM, *flags, "--json")
    assert result.rc == 0, result.err
    report = result.json()["report"]
    assert report["workload"]["dtype"] == dtype
    assert (report["strategy"]["micro_batch"], report["strategy"]["grad_accum"]) == (micro, accum)
    assert report["strategy"]["zero_stage"] == 3


def test_auto_batch_keys_with_a_fixed_accumulation(cli: Cli, tmp_path: Path) -> None:
    path = _write(tmp_path, _hf_zero3(gradient_accumulation_steps=2))
    result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", "--batch", "12", *CPU_MEM, "--json")
    assert result.rc == 0, result.err
    strategy = result.json()["report"]["strategy"]
    assert (strategy["micro_batch"], strategy["grad_accum"]) == (6, 2)
    odd = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", "--batch", "7", *CPU_MEM)
    assert_one_error_line(odd)
    assert "--batch 7" in odd.err


def test_check_needs_a_gpu_and_a_model(cli: Cli, tmp_path: Path) -> None:
    path = _write(tmp_path, _zero2())
    assert_one_error_line(cli("check", path, "--model", "opt-1.3b", *CPU_MEM), "--gpu")
    assert_one_error_line(cli("check", path, "--model", "opt-9b", "--gpu-mem", "24G", *CPU_MEM), "opt-9b")


def test_gpu_memory_in_check_is_parsed_like_recommend(cli: Cli, tmp_path: Path) -> None:
    path = _write(tmp_path, _zero2())
    for spelling in ("24G", "24576MiB", "25769803776"):
        result = cli("check", path, "--model", "opt-125m", "--gpu-mem", spelling, *CPU_MEM, "--json")
        assert result.rc in (0, 1), result.err
        assert result.json()["report"]["hardware"]["gpu_memory_bytes"] == 24 * GIB


def test_dtype_flag_cannot_contradict_the_config(cli: Cli, tmp_path: Path) -> None:
    path = _write(tmp_path, _zero2())  # bf16 enabled
    result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", *CPU_MEM, "--dtype", "fp32", "--json")
    assert_one_error_line(result, "--dtype fp32 contradicts the config", "bf16")  # refused, never ignored
    agreeing = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", *CPU_MEM, "--dtype", "bf16", "--json")
    assert agreeing.rc == 0, agreeing.err  # a --dtype that says what the config says is accepted (and fits)
    report = agreeing.json()["report"]
    assert report["workload"]["dtype"] == "bf16"
    assert report["ds_config"]["bf16"]["enabled"] is True


def test_a_batch_that_contradicts_the_config_is_bad_input(cli: Cli, tmp_path: Path) -> None:
    path = _write(tmp_path, _zero2())
    result = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "24G", "--batch", "16", *CPU_MEM)
    assert_one_error_line(result)
    assert "--batch 16" in result.err
    agreeing = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "24G", "--batch", "8", *CPU_MEM, "--quiet")
    assert agreeing.rc in (0, 1), agreeing.err


def test_check_of_a_lora_plans_export_needs_no_lora_again(cli: Cli, db: Path, tmp_path: Path) -> None:
    """``planner export`` writes the plan's knobs outside DeepSpeed's keys beside its config
    (``ds_config.memplan.json``); ``check`` of that config reads them: the prediction is the plan's."""
    job = ("--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM)
    planned = cli("recommend", *job, "--lora-rank", "16", "--json", "--db", db)  # CPU_MEM: sft
    assert planned.rc == 0, planned.err
    plan = planned.json()
    assert plan["strategy"]["lora_rank"] == 16
    path = tmp_path / "ds_config.json"
    assert cli("export", plan["plan_id"], "-o", path, "--db", db).rc == 0

    checked = cli("check", path, *job, "--json", "--db", db)
    assert checked.rc == 0, checked.err
    report = checked.json()["report"]
    assert report["strategy"] == plan["strategy"]
    assert report["predicted"] == plan["predicted"]
    assert any("ds_config.memplan.json" in line and plan["plan_id"] in line for line in report["readings"])

    from planner import check

    from_api = check(path, "opt-1.3b", gpu_mem="24G", cpu_mem=CPU_MEM[1], db=str(db))
    assert from_api.report.predicted.model_dump() == plan["predicted"]

    # The same knobs given again agree; one that contradicts the export is bad input, naming the file.
    same = cli("check", path, *job, "--lora-rank", "16", *_outside_flags(plan["strategy"]), "--json", "--db", db)
    assert same.rc == 0, same.err
    assert same.json()["report"]["predicted"] == plan["predicted"]
    assert_one_error_line(cli("check", path, *job, "--lora-rank", "8", "--db", db), "ds_config.memplan.json")
    flipped = "--no-grad-ckpt" if plan["strategy"]["gradient_checkpointing"] else "--grad-ckpt"
    assert_one_error_line(cli("check", path, *job, flipped, "--db", db), "gradient_checkpointing")

    # The config alone (no settings file beside it) is a full fine-tune, as before.
    (tmp_path / "alone").mkdir()
    bare = cli("check", _write(tmp_path / "alone", plan["ds_config"]), *job, "--json", "--db", db)
    assert bare.rc in (0, 1), bare.err
    assert bare.json()["report"]["strategy"]["lora_rank"] == 0

    # A settings file that is not planner export's is bad input, naming it.
    sidecar = tmp_path / "ds_config.memplan.json"
    sidecar.write_text(json.dumps({"settings": {"lora_rank": "sixteen"}}))
    assert_one_error_line(cli("check", path, *job, "--db", db), "ds_config.memplan.json")
    sidecar.write_text(json.dumps({"settings": {"zero_stage": 3}}))
    assert_one_error_line(cli("check", path, *job, "--db", db), "zero_stage")
