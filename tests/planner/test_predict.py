"""``planner predict``: one fixed strategy from JSON (inline or file) and flags; same numbers as recommend."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import (
    CPU_MEM,
    STRATEGY_KEYS,
    CliResult,
    assert_one_error_line,
    check_ds_config_batch,
    check_predicted_block,
    fits_by_numbers,
)

Cli = Callable[..., CliResult]
JOB = ("--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM)
BASE = {"zero_stage": 1, "micro_batch": 8, "grad_accum": 1}


def _predict(cli: Cli, *args: object) -> dict:
    result = cli("predict", *JOB, *args, "--json")
    assert result.rc == 0, result.err
    return result.json()


def test_inline_json_and_file_give_the_same_prediction(cli: Cli, tmp_path: Path) -> None:
    strategy = {"zero_stage": 2, "gradient_checkpointing": True, "micro_batch": 4, "grad_accum": 2}
    file = tmp_path / "strategy.json"
    file.write_text(json.dumps(strategy))
    inline = _predict(cli, "--strategy", json.dumps(strategy))
    from_file = _predict(cli, "--strategy", file)
    assert inline == from_file
    assert set(inline["strategy"]) == STRATEGY_KEYS
    for key, value in strategy.items():
        assert inline["strategy"][key] == value
    # Keys left out take the single-model defaults of docs/contracts.md's shape.
    assert inline["strategy"]["offload_optimizer"] == "none"
    assert inline["strategy"]["lora_rank"] == 0


def test_predict_document(cli: Cli) -> None:
    doc = _predict(cli, "--zero", "2", "--micro-batch", "4")
    assert {"workload", "hardware", "strategy", "fits", "predicted", "ds_config"} <= set(doc)
    assert "plan_id" not in doc and "alternatives" not in doc  # recommend only
    check_predicted_block(doc["predicted"], doc["hardware"])
    assert doc["fits"] == fits_by_numbers(doc["predicted"], doc["hardware"])
    check_ds_config_batch(doc["ds_config"], doc["strategy"], doc)


def test_flags_override_the_strategy_json(cli: Cli) -> None:
    doc = _predict(cli, "--strategy", json.dumps(BASE), "--zero", "2", "--offload-optimizer", "cpu", "--grad-ckpt")
    strategy = doc["strategy"]
    assert strategy["zero_stage"] == 2
    assert strategy["offload_optimizer"] == "cpu"
    assert strategy["gradient_checkpointing"] is True
    assert (strategy["micro_batch"], strategy["grad_accum"]) == (8, 1)
    zero = doc["ds_config"]["zero_optimization"]
    assert zero["stage"] == 2 and zero["offload_optimizer"]["device"] == "cpu"

    off = _predict(cli, "--strategy", json.dumps({**BASE, "gradient_checkpointing": True}), "--no-grad-ckpt")
    assert off["strategy"]["gradient_checkpointing"] is False


def test_micro_batch_flag_keeps_the_global_batch(cli: Cli) -> None:
    doc = _predict(cli, "--zero", "2", "--micro-batch", "2")
    assert doc["workload"]["global_batch"] == 8
    assert (doc["strategy"]["micro_batch"], doc["strategy"]["grad_accum"]) == (2, 4)
    check_ds_config_batch(doc["ds_config"], doc["strategy"], doc)


def test_micro_batch_flag_over_a_strategy_with_accumulation(cli: Cli) -> None:
    # BASE runs micro_batch 8 x grad_accum 1; the flag replaces the micro-batch and the accumulation is
    # recomputed to keep the global batch (8), not taken from the strategy.
    doc = _predict(cli, "--strategy", json.dumps(BASE), "--micro-batch", "2")
    assert (doc["strategy"]["micro_batch"], doc["strategy"]["grad_accum"]) == (2, 4)
    assert doc["workload"]["global_batch"] == 8
    assert (doc["ds_config"]["train_batch_size"], doc["ds_config"]["gradient_accumulation_steps"]) == (8, 4)
    check_ds_config_batch(doc["ds_config"], doc["strategy"], doc)


def test_strategy_that_does_not_cover_the_global_batch(cli: Cli) -> None:
    strategy = {"zero_stage": 2, "micro_batch": 4, "grad_accum": 1}  # 4 samples per step, default batch is 8
    # No --batch given: the strategy's own batch (4) becomes the job's, and the readings say so.
    doc = _predict(cli, "--strategy", json.dumps(strategy))
    assert doc["workload"]["global_batch"] == 4
    assert (doc["strategy"]["micro_batch"], doc["strategy"]["grad_accum"]) == (4, 1)
    assert "global batch: 4 (micro_batch x grad_accum x GPUs of the strategy)" in doc["readings"]
    check_ds_config_batch(doc["ds_config"], doc["strategy"], doc)
    # An explicit --batch the strategy does not cover is bad input.
    given = cli("predict", *JOB, "--batch", "8", "--strategy", json.dumps(strategy), "--json")
    assert_one_error_line(given, "= 4 samples per step, not --batch 8")


def test_predict_reproduces_the_recommendation(cli: Cli, opt13_24g) -> None:
    doc = opt13_24g.doc
    args = [a for a in opt13_24g.args]
    for strategy, predicted in [(doc["strategy"], doc["predicted"])] + [
        (alt["strategy"], alt["predicted"]) for alt in doc["alternatives"]
    ]:
        result = cli("predict", *args, "--strategy", json.dumps(strategy), "--json")
        assert result.rc == 0, result.err
        again = result.json()
        assert again["strategy"] == strategy
        assert again["predicted"] == predicted
    chosen = cli("predict", *args, "--strategy", json.dumps(doc["strategy"]), "--json").json()
    assert chosen["ds_config"] == doc["ds_config"]
    assert chosen["fits"] == doc["fits"]
    assert chosen["workload"] == doc["workload"] and chosen["hardware"] == doc["hardware"]


def test_checkpointing_shows_in_the_outside_settings(cli: Cli) -> None:
    on = _predict(cli, "--zero", "2", "--grad-ckpt")
    off = _predict(cli, "--zero", "2", "--no-grad-ckpt")
    assert "gradient_checkpointing_enable" in on["outside_settings"]["gradient_checkpointing"]
    assert on["outside_settings"]["gradient_checkpointing"] != off["outside_settings"]["gradient_checkpointing"]
    # Checkpointing keeps only layer inputs: a smaller backward, more time (recompute). (The step's peak
    # can be the ZeRO-2 optimizer step, whose breakdown holds no activations either way.)
    backward = [next(ph for ph in doc["predicted"]["phases"] if ph["name"] == "backward") for doc in (on, off)]
    assert backward[0]["peak_allocated_bytes"] < backward[1]["peak_allocated_bytes"]
    assert on["predicted"]["step_time_s"] > off["predicted"]["step_time_s"]
    expandable = _predict(cli, "--zero", "2", "--allocator", "expandable-segments")
    assert expandable["outside_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert off["outside_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == ""


def test_zero_partitioning_lowers_peak_memory_over_gpus(cli: Cli) -> None:
    # On 4 GPUs ZeRO-1 partitions the 12 bytes/param of fp32 optimizer states (docs/contracts.md: "ZeRO-1
    # consistently lowers memory"); ZeRO-2 also partitions gradients, so it never needs more than ZeRO-1.
    job = ("--model", "opt-1.3b", "--gpu-mem", "80G", *CPU_MEM, "--gpus", "4", "--batch", "32")
    peak = {}
    for stage in ("0", "1", "2"):
        result = cli("predict", *job, "--zero", stage, "--json")
        assert result.rc == 0, result.err
        peak[stage] = result.json()["predicted"]["peak_reserved_bytes"]
    assert peak["0"] > peak["1"] >= peak["2"]


def test_unknown_strategy_key(cli: Cli) -> None:
    result = cli("predict", *JOB, "--strategy", json.dumps({**BASE, "zero_stgae": 2}))
    assert_one_error_line(result, "zero_stgae")


@pytest.mark.parametrize(
    "args",
    [
        ["--zero", "2", "--offload-optimizer", "cpu", "--offload-param", "cpu"],
        ["--strategy", json.dumps({"zero_stage": 1, "offload_optimizer": "cpu", "offload_param": "cpu"})],
    ],
    ids=["flags", "json"],
)
def test_offload_param_needs_zero3(cli: Cli, args: list[str]) -> None:
    assert_one_error_line(cli("predict", *JOB, *args), "offload_param")


@pytest.mark.parametrize(
    "args",
    [
        ["--zero", "3", "--offload-optimizer", "nvme"],
        ["--zero", "5"],
        ["--zero", "2", "--offload-optimizer", "disk"],
        ["--zero", "2", "--empty-cache", "sometimes"],
        ["--zero", "2", "--allocator", "huge-pages"],
        ["--micro-batch", "3"],  # does not divide the 8 samples per GPU
        ["--micro-batch", "0"],
        ["--lora-rank", "-1"],
        ["--strategy", "{not json"],
        ["--strategy", '{"zero_stage": "2"}'],
    ],
    ids=[
        "nvme-without-path",
        "zero-5",
        "offload-disk",
        "empty-cache",
        "allocator",
        "micro-3",
        "micro-0",
        "lora-negative",
        "bad-json",
        "stage-as-text",
    ],
)
def test_bad_strategy_input(cli: Cli, args: list[str]) -> None:
    assert_one_error_line(cli("predict", *JOB, *args))


def test_strategy_file_missing_or_malformed(cli: Cli, tmp_path: Path) -> None:
    assert_one_error_line(cli("predict", *JOB, "--strategy", tmp_path / "none.json"), "none.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert_one_error_line(cli("predict", *JOB, "--strategy", broken), "broken.json")


def test_strategy_file_that_is_not_an_object(cli: Cli, tmp_path: Path) -> None:
    file = tmp_path / "list.json"
    file.write_text("[1, 2]")
    assert_one_error_line(cli("predict", *JOB, "--strategy", file))


def test_nvme_offload_with_a_path(cli: Cli) -> None:
    doc = _predict(cli, "--zero", "3", "--offload-optimizer", "nvme", "--nvme-path", "/local_nvme")
    block = doc["ds_config"]["zero_optimization"]["offload_optimizer"]
    assert block["device"] == "nvme" and block["nvme_path"] == "/local_nvme"
