"""RLHF plans with a vLLM or SGLang rollout engine through the CLI and the API: choose, report, reproduce, refuse."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import CliResult, assert_one_error_line, check_predicted_block

from planner.planning.predicting import _job
from planner.probing.plan import choose_strategies
from search import DEFAULT_COEFFICIENTS
from store.errors import InputError

Cli = Callable[..., CliResult]
JOB = ("--model", "opt-125m", "--gpu", "L4", "--gpus", "2", "--cpu-mem", "256G", "--workload", "grpo")


def test_a_vllm_plan_names_its_engine_and_predict_reproduces_it(cli: Cli, db: Path) -> None:
    doc = cli("recommend", *JOB, "--rollout", "vllm", "--json", "--db", db).json()
    rollout = doc["strategy"]["rollout"]
    assert rollout["engine"] == "vllm" and doc["strategy"]["hybrid_engine"] is False
    engine = doc["predicted"]["rollout"]
    assert rollout["gpu_memory_utilization"] == engine["gpu_memory_utilization"]
    low, high = engine["fitting_utilization"]
    assert low <= rollout["gpu_memory_utilization"] <= high
    check_predicted_block(doc["predicted"], doc["hardware"])
    again = cli("predict", *JOB, "--strategy", json.dumps(doc["strategy"]), "--json").json()
    assert again["predicted"] == doc["predicted"]
    # what generates is said outside the DeepSpeed config too, and no allocator replay pretends to cover it
    assert "vLLM engine" in doc["outside_settings"]["generation"]
    assert doc.get("allocator_replay") is None


def test_the_text_plan_prints_the_engine_line(cli: Cli, db: Path) -> None:
    out = cli("recommend", *JOB, "--rollout", "vllm", "--db", db).out
    assert "rollout: vLLM colocate" in out or "rollout: vLLM separate" in out
    assert "gpu_memory_utilization" in out and "KV cache" in out


@pytest.mark.parametrize("value", ["tgi", "vllm,nope", ","])
def test_an_unknown_rollout_family_is_one_line(cli: Cli, db: Path, value: str) -> None:
    assert_one_error_line(cli("recommend", *JOB, "--rollout", value, "--db", db), "--rollout")


def test_probes_refuse_an_engine_strategy_and_probe_deepspeed_plans(tmp_path: Path) -> None:
    job = _job("opt-125m", {"workload": "grpo", "gpu_mem": "24G"})
    strategy = {"actor": {}, "reference": {}, "reward": {}, "rollout": "vllm", "micro_batch": 4, "grad_accum": 8}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(strategy))
    with pytest.raises(InputError, match="cannot be probed here"):
        choose_strategies(job, str(path), DEFAULT_COEFFICIENTS)
    chosen = choose_strategies(job, "recommended", DEFAULT_COEFFICIENTS)
    assert chosen and all(s.rollout is None for s in chosen)  # type: ignore[union-attr]


def test_deepspeed_chat_says_it_has_no_engine() -> None:
    from launch.frameworks.deepspeed_chat import deepspeed_chat_gaps
    from store.records import RLHFStrategy, TrainedModelStrategy
    from store.rollout import RolloutStrategy

    job = _job("opt-125m", {"workload": "ppo", "gpu_mem": "24G"})
    strategy = RLHFStrategy(
        critic=TrainedModelStrategy(), hybrid_engine=False, micro_batch=8, grad_accum=1, rollout=RolloutStrategy()
    )
    gaps = deepspeed_chat_gaps(strategy, job.workload, job.hardware)
    assert any("no vllm rollout engine" in gap for gap in gaps)
    assert not any(
        "rollout engine" in gap for gap in deepspeed_chat_gaps(strategy.with_(rollout=None), job.workload, job.hardware)
    )
