"""``planner check`` reads a DeepSpeed config as DeepSpeed does (issue 29, item 6).

Each config here is first put to DeepSpeed's own ``DeepSpeedConfig`` (the ``deepspeed_config`` fixture, world
size 1), so the test states what DeepSpeed does with it, and then to ``planner check``, which must agree: refuse
what DeepSpeed refuses (one line, exit 2) and give what it accepts DeepSpeed's meaning. Where deepspeed is not
installed, memplan's own reader (``launch.ds_config_read``) must refuse the same configs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import CPU_MEM, CliResult, assert_one_error_line, subprocess_env

from store.errors import InputError

pytest.importorskip("deepspeed")

Cli = Callable[..., CliResult]
JOB = ("--model", "opt-125m", "--gpu-mem", "80G", *CPU_MEM)


def _config(**extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8}
    config["zero_optimization"] = {"stage": 2}
    config.update(extra)
    return config


def _write(folder: Path, config: Any) -> Path:
    path = folder / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


# Configs DeepSpeed refuses, and a fragment the one error line must carry.
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "fp16-and-bf16": (_config(fp16={"enabled": True}, bf16={"enabled": True}), "fp16"),
    "fp16-true": (_config(fp16=True), "fp16"),
    "bf16-list": (_config(bf16=[]), "bf16"),
    "zero-list": (_config(zero_optimization=[]), "zero_optimization"),
    "unknown-zero-key": (_config(zero_optimization={"stage": 2, "reduce_bucket": 5e8}), "reduce_bucket"),
    "unknown-offload-key": (
        _config(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "pin": True}}),
        "pin",
    ),
    "offload-device-case": (_config(zero_optimization={"stage": 2, "offload_optimizer": {"device": "CPU"}}), "CPU"),
    "bf16-enabled-2": (_config(bf16={"enabled": 2}), "enabled"),
    "overlap-comm-sometimes": (_config(zero_optimization={"stage": 2, "overlap_comm": "sometimes"}), "overlap_comm"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_deepspeed_refuses_is_bad_input(
    cli: Cli, tmp_path: Path, deepspeed_config: Callable[[Any], Any], case: str
) -> None:
    config, fragment = REFUSED[case]
    with pytest.raises(Exception):  # noqa: B017 - DeepSpeed raises AssertionError, TypeError, ValidationError
        deepspeed_config(json.loads(json.dumps(config)))
    result = cli("check", _write(tmp_path, config), *JOB)
    assert_one_error_line(result, fragment)


def _report(cli: Cli, tmp_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    result = cli("check", _write(tmp_path, config), *JOB, "--json")
    assert result.rc in (0, 1), result.err
    report: dict[str, Any] = result.json()["report"]
    return report


@pytest.mark.parametrize("spelling", ["yes", "on", "true", "1", 1])
def test_bf16_enabled_as_deepspeed_reads_it(
    cli: Cli, tmp_path: Path, deepspeed_config: Callable[[Any], Any], spelling: Any
) -> None:
    """pydantic's bool reads "yes", "on", "true", "1" and 1 as true: DeepSpeed trains in bf16."""
    config = _config(bf16={"enabled": spelling})
    assert deepspeed_config(json.loads(json.dumps(config))).bfloat16_config.enabled is True
    report = _report(cli, tmp_path, config)
    assert report["workload"]["dtype"] == "bf16"
    assert report["predicted"] == _report(cli, tmp_path, _config(bf16={"enabled": True}))["predicted"]


def test_the_old_bfloat16_key_is_bf16(cli: Cli, tmp_path: Path, deepspeed_config: Callable[[Any], Any]) -> None:
    config = _config(bfloat16={"enabled": True})
    assert deepspeed_config(json.loads(json.dumps(config))).bfloat16_config.enabled is True
    assert _report(cli, tmp_path, config)["workload"]["dtype"] == "bf16"


def test_deprecated_cpu_offload_offloads_the_optimizer(
    cli: Cli, tmp_path: Path, deepspeed_config: Callable[[Any], Any]
) -> None:
    """ZeRO's deprecated ``cpu_offload: true`` is DeepSpeed's ``offload_optimizer: {device: cpu}``; DeepSpeed's
    deprecation warning (its logger writes to stdout) must not spoil the JSON document."""
    config = _config(zero_optimization={"stage": 2, "cpu_offload": True})
    parsed = deepspeed_config(json.loads(json.dumps(config)))
    assert parsed.zero_config.offload_optimizer.device == "cpu"
    assert _report(cli, tmp_path, config)["strategy"]["offload_optimizer"] == "cpu"


def test_overlap_comm_yes_is_true(cli: Cli, tmp_path: Path, deepspeed_config: Callable[[Any], Any]) -> None:
    config = _config(zero_optimization={"stage": 2, "overlap_comm": "yes"})
    assert deepspeed_config(json.loads(json.dumps(config))).zero_config.overlap_comm is True
    assert _report(cli, tmp_path, config)["strategy"]["ds_buckets"]["overlap_comm"] is True


def test_deepspeeds_batch_check_runs_at_the_jobs_world_size(cli: Cli, tmp_path: Path) -> None:
    """A config DeepSpeed accepts on one GPU but not on two (8 != 8 x 1 x 2)."""
    path = _write(tmp_path, _config(gradient_accumulation_steps=1))
    assert cli("check", path, *JOB, "--quiet").rc in (0, 1)
    assert_one_error_line(cli("check", path, *JOB, "--gpus", "2"), "8")


def test_an_unknown_optimizer_block_shape_is_bad_input(cli: Cli, tmp_path: Path) -> None:
    """Outside the blocks memplan reads, DeepSpeed decides too: an optimizer that is a list."""
    assert_one_error_line(cli("check", _write(tmp_path, _config(optimizer=[])), *JOB), "optimizer")


def test_a_fresh_process_prints_only_json(run_process: Callable[..., CliResult], tmp_path: Path) -> None:
    """Importing deepspeed without ``DS_ACCELERATOR`` logs the accelerator it picked to stdout; ``--json`` must
    stay a JSON document."""
    path = _write(tmp_path, _config(bf16={"enabled": "yes"}))
    env = subprocess_env()
    del env["DS_ACCELERATOR"]
    argv = [sys.executable, "-m", "planner", "check", str(path), *JOB, "--json", "--db", str(tmp_path / "x.db")]
    import subprocess

    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["report"]["workload"]["dtype"] == "bf16"
    assert proc.stderr.strip() == "", proc.stderr
    assert os.environ.get("DS_ACCELERATOR") == "cpu"  # the test's own process is left as it was


# ---- memplan's own reader, where deepspeed is not installed ----


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_own_reader_refuses_the_same(case: str) -> None:
    from launch.ds_config_read import dtype_of_ds_config, strategy_from_ds_config

    config, _ = REFUSED[case]
    with pytest.raises(InputError):
        dtype_of_ds_config(config)
        strategy_from_ds_config(config, 1, hidden_size=768)


@pytest.mark.parametrize("spelling", ["yes", "on", "true", "1", 1, "auto"])
def test_the_own_reader_reads_enabled_as_deepspeed(spelling: Any) -> None:
    from launch.ds_config_read import dtype_of_ds_config

    assert dtype_of_ds_config(_config(bf16={"enabled": spelling})) == (None if spelling == "auto" else "bf16")
    assert dtype_of_ds_config(_config(bf16={"enabled": "no"}, fp16={"enabled": "off"})) == "fp32"


def test_check_without_deepspeed_refuses_with_the_own_reader(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """``planner check`` where deepspeed cannot be imported: memplan's own reader, the same refusal."""
    from launch.ds_config_deepspeed import deepspeed_parser

    for module in [name for name in sys.modules if name == "deepspeed" or name.startswith("deepspeed.")]:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    deepspeed_parser.cache_clear()
    request.addfinalizer(deepspeed_parser.cache_clear)  # the next test imports deepspeed afresh
    assert deepspeed_parser() is None
    config, fragment = REFUSED["fp16-and-bf16"]
    assert_one_error_line(cli("check", _write(tmp_path, config), *JOB), fragment)
    report = _report(cli, tmp_path, _config(bf16={"enabled": "yes"}))
    assert report["workload"]["dtype"] == "bf16"


def test_deepspeeds_batch_check_takes_the_world_size() -> None:
    """Without a process group DeepSpeedConfig would read the batch at world size 1; the reader sets the job's."""
    from launch.ds_config_deepspeed import check_with_deepspeed

    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1}
    check_with_deepspeed(config, 2, 8, 1)
    with pytest.raises(InputError, match="16 != 8 \\* 1 \\* 1"):
        check_with_deepspeed(config, 1, 8, 1)
    auto = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2}
    check_with_deepspeed(auto, 4, 3, 2)  # transformers fills 3 per GPU and 3 x 2 x 4 = 24 per step


def test_the_own_readers_keys_are_deepspeeds() -> None:
    """The keys memplan's reader takes are the fields (and aliases) of DeepSpeed's installed models."""
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    from launch.ds_config_read import BF16_KEYS, FP16_KEYS, OFFLOAD_KEYS, ZERO_KEYS

    def keys(model: Any) -> set[str]:
        return {name for field_name, f in model.model_fields.items() for name in (field_name, f.alias) if name}

    assert set(ZERO_KEYS) == keys(DeepSpeedZeroConfig)
    assert set(FP16_KEYS) == keys(DeepSpeedFP16Config)
    assert set(BF16_KEYS) == keys(DeepSpeedBF16Config)
    assert set(OFFLOAD_KEYS["offload_optimizer"]) == keys(DeepSpeedZeroOffloadOptimizerConfig)
    assert set(OFFLOAD_KEYS["offload_param"]) == keys(DeepSpeedZeroOffloadParamConfig)
