"""RLHF through the CLI: PPO is the default workload; four DeepSpeed configs, launch flags, phases."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import CliResult, assert_one_error_line, check_predicted_block

Cli = Callable[..., CliResult]
HOST = ("--cpu-mem", "64G")
PAIRING = ("--critic-model", "opt-350m", "--reward-model", "opt-350m")  # DeepSpeed-Chat's OPT-1.3b pairing
MODELS = ("actor", "critic", "reference", "reward")


@pytest.fixture(scope="module")
def ppo_doc(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    from planner_helpers import run_main

    db = tmp_path_factory.mktemp("ppo") / "plans.db"
    # DeepSpeed-Chat's step 3: DeepSpeed generates (test_rollout_cli.py has the vLLM/SGLang engines)
    deepspeed = ("--rollout", "hybrid-engine")
    result = run_main(
        ["recommend", "--model", "opt-1.3b", "--gpu-mem", "24G", *HOST, *PAIRING, *deepspeed, "--json", "--db", str(db)]
    )
    assert result.rc == 0, result.err
    return result.json(), db


def test_ppo_is_the_default_workload(cli: Cli, db: Path) -> None:
    doc = cli("recommend", "--model", "opt-125m", "--gpu-mem", "24G", *HOST, "--json", "--db", db).json()
    assert doc["workload"]["kind"] == "ppo"
    assert set(doc["ds_configs"]) == set(MODELS) and "ds_config" not in doc


def test_ppo_plan_has_every_phase_and_names_the_peak(ppo_doc) -> None:
    doc, _ = ppo_doc
    predicted = doc["predicted"]
    check_predicted_block(predicted, doc["hardware"])
    names = [p["name"] for p in predicted["phases"]]
    assert names == ["generation", "scoring", "actor_training", "critic_training"]
    # reserved only grows until empty_cache: several phases can show the peak; the named one is among them
    top = max(p["peak_reserved_bytes"] for p in predicted["phases"])
    assert predicted["peak_phase"] in [p["name"] for p in predicted["phases"] if p["peak_reserved_bytes"] == top]
    assert doc["fits"] == (predicted["peak_reserved_bytes"] <= predicted["gpu_budget_bytes"])
    assert doc["workload"]["critic_model"] == doc["workload"]["reward_model"] == "opt-350m"


def test_every_exported_config_is_accepted_by_deepspeed(ppo_doc, deepspeed_config) -> None:
    doc, _ = ppo_doc
    strategy = doc["strategy"]
    for name in MODELS:
        parsed = deepspeed_config(doc["ds_configs"][name])
        assert parsed.train_micro_batch_size_per_gpu >= 1
    actor = deepspeed_config(doc["ds_configs"]["actor"])
    assert actor.zero_optimization_stage == strategy["actor"]["zero_stage"]
    assert actor.train_micro_batch_size_per_gpu == strategy["micro_batch"]
    assert actor.hybrid_engine.enabled == strategy["hybrid_engine"]
    critic = deepspeed_config(doc["ds_configs"]["critic"])
    assert critic.zero_optimization_stage == strategy["critic"]["zero_stage"]


def test_launch_flags_follow_the_strategy(ppo_doc) -> None:
    doc, _ = ppo_doc
    s = doc["strategy"]
    chat = " ".join(doc["launch"]["deepspeed_chat"])
    assert f"--actor_zero_stage {s['actor']['zero_stage']}" in chat
    assert f"--critic_zero_stage {s['critic']['zero_stage']}" in chat
    assert f"--per_device_training_batch_size {s['micro_batch']}" in chat
    assert ("--enable_hybrid_engine" in chat) == s["hybrid_engine"]
    offloaded = "cpu" in (s["actor"]["offload_optimizer"], s["critic"]["offload_optimizer"])
    assert ("--offload " in chat + " ") == offloaded
    # OpenRLHF 0.11's names, the flags --format openrlhf writes (issue 31: the flat names of 0.9 are gone)
    assert f"--ds.zero_stage {s['actor']['zero_stage']}" in " ".join(doc["launch"]["openrlhf"])
    assert "openrlhf_ray" not in doc["launch"]


def test_empty_cache_effect_is_reported_against_never(ppo_doc) -> None:
    doc, _ = ppo_doc
    effect = doc["empty_cache_effect"]
    policy = doc["strategy"]["empty_cache"]
    assert effect["chosen"] == (policy != "never")
    assert effect["policy"] == (policy if policy != "never" else "after-inference")
    assert effect["peak_reserved_saved_bytes"] == effect["peak_reserved_never_bytes"] - effect["peak_reserved_bytes"]
    # empty_cache can also cost reserved memory (the blocks made again after it are split otherwise): a policy
    # that saves nothing and costs time is never the one chosen
    if effect["peak_reserved_saved_bytes"] <= 0:
        assert not effect["chosen"] and effect["step_time_added_fraction"] > 0


def test_predict_reproduces_the_recommended_ppo_strategy(cli: Cli, ppo_doc) -> None:
    doc, _ = ppo_doc
    result = cli(
        "predict", "--model", "opt-1.3b", "--gpu-mem", "24G", *HOST, *PAIRING, "--workload", "ppo",
        "--strategy", json.dumps(doc["strategy"]), "--json",
    )  # fmt: skip
    assert result.rc == 0, result.err
    assert result.json()["predicted"] == doc["predicted"]


def test_export_writes_one_config_per_model_all_or_nothing(cli: Cli, ppo_doc, tmp_path: Path) -> None:
    doc, db = ppo_doc
    target = tmp_path / "ds_config.json"
    result = cli("export", doc["plan_id"], "-o", target, "--db", db)
    assert result.rc == 0, result.err
    for name in MODELS:
        written = tmp_path / f"ds_config.{name}.json"
        assert json.loads(written.read_text()) == doc["ds_configs"][name]
    assert "--actor_zero_stage" in result.out
    # one existing file blocks the whole export, and nothing else is touched
    (tmp_path / "ds_config.critic.json").write_text("mine\n")
    (tmp_path / "ds_config.actor.json").unlink()
    assert_one_error_line(cli("export", doc["plan_id"], "-o", target, "--db", db), "--force")
    assert not (tmp_path / "ds_config.actor.json").exists()
    assert (tmp_path / "ds_config.critic.json").read_text() == "mine\n"
    assert cli("export", doc["plan_id"], "-o", target, "--force", "--db", db).rc == 0
    assert json.loads((tmp_path / "ds_config.critic.json").read_text()) == doc["ds_configs"]["critic"]


@pytest.mark.parametrize("kind", ["remax", "grpo"])
def test_critic_free_workloads(cli: Cli, db: Path, kind: str) -> None:
    doc = cli("recommend", "--model", "opt-125m", "--gpu-mem", "16G", *HOST, "--workload", kind, "--json", "--db", db)
    doc = doc.json()
    assert "critic" not in doc["strategy"] and "critic" not in doc["ds_configs"]
    assert "critic_training" not in [p["name"] for p in doc["predicted"]["phases"]]
    if kind == "grpo":
        assert doc["workload"]["samples_per_prompt"] == 4


def test_human_output_shows_phases_flags_and_empty_cache(cli: Cli, db: Path) -> None:
    result = cli("recommend", "--model", "opt-1.3b", "--gpu-mem", "24G", *HOST, *PAIRING, "--db", db)
    assert result.rc == 0, result.err
    for fragment in ("generation", "scoring", "actor_training", "critic_training", "empty_cache", "--actor_zero_stage"):
        assert fragment in result.out, fragment


def test_a_critic_too_large_for_the_gpu_is_an_honest_no(cli: Cli, db: Path) -> None:
    result = cli(
        "recommend", "--model", "opt-125m", "--critic-model", "llama-2-70b", "--gpu-mem", "16G", "--cpu-mem", "32G",
        "--lora-rank", "0", "--json", "--db", db,
    )  # fmt: skip
    assert result.rc == 1, result.err  # nothing fits: exit 1, the closest plan printed all the same
    doc = result.json()
    assert doc["fits"] is False and doc["suggestions"]
