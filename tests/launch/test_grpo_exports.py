"""GRPO as run today in each framework's export (issue 32, item 2): rule-based rewards and a KL coefficient of 0
reach OpenRLHF, veRL and TRL as their own settings, every name checked against the pinned releases' argparse and
Hydra config (``tests/data/framework_names.json``, extracted by ``scripts/extract_framework_names.py``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tiny_models import make_hardware, make_rlhf_strategy, make_rlhf_workload, rough_spec

from launch import frameworks
from launch.frameworks import openrlhf, trl, verl
from launch.rlhf_config import render_rlhf_ds_configs
from store.records import RLHFStrategy, Workload

REPO = Path(__file__).resolve().parents[2]
NAMES: dict[str, Any] = json.loads((REPO / "tests" / "data" / "framework_names.json").read_text())
ACTOR = rough_spec("rough-1b", 2048)
HW = make_hardware(gpus=4)


def _workload(kind: str = "grpo", **changes: Any) -> Workload:
    samples = 4 if kind == "grpo" else 1
    w = make_rlhf_workload(kind, ACTOR, ACTOR, prompt_len=256, gen_len=256, global_batch=16, samples_per_prompt=samples)
    return replace(w, **changes)


def _strategy(kind: str = "grpo") -> RLHFStrategy:
    k = 4 if kind == "grpo" else 1
    layout = {"zero_stage": 2, "gradient_checkpointing": True}
    return make_rlhf_strategy(
        layout, layout, with_critic=kind == "ppo", micro_batch=2, grad_accum=2 * k, generation_batch=2
    )


def _value(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


@pytest.mark.parametrize(
    ("style", "entry", "kl"),
    [("dotted", "openrlhf", "--algo.kl.init_coef"), ("classic", "openrlhf_classic", "--init_kl_coef")],
)
def test_openrlhf_runs_rule_rewards_without_reference_or_reward_groups(style: str, entry: str, kl: str) -> None:
    """KL 0 is passed as OpenRLHF's own coefficient (its default 0.01 would load a reference), and no Ray group
    is asked for the reference or a reward model the plan does not hold."""
    workload = _workload(rule_reward=True, kl_coef=0.0)
    flags = openrlhf.flags(_strategy(), workload, HW, style=style)
    assert _value(flags, kl) == "0"
    assert not [f for f in flags if f.startswith(("--ref", "--reward"))], flags
    assert {f for f in flags if f.startswith("--")} <= set(NAMES[entry]["options"])
    held = openrlhf.flags(_strategy(), _workload(kl_coef=0.05), HW, style=style)
    assert _value(held, kl) == "0.05"
    if style == "dotted":  # classic OpenRLHF without vLLM engines takes no placement flags at all
        assert _role_flag(held, "ref", style) and _role_flag(held, "reward", style)


def _role_flag(flags: list[str], role: str, style: str) -> bool:
    return (f"--{role}.num_nodes" if style == "dotted" else f"--{role}_num_nodes") in flags


def test_openrlhf_script_points_at_a_reward_function_not_a_model() -> None:
    """train_ppo_ray loads a ``.py`` given to ``--reward.remote_url`` as ``reward_func`` (openrlhf/utils/agent.py)
    and builds no RewardModelActor then; the script asks for that file, not for a reward model."""
    text = openrlhf.script(_strategy(), _workload(rule_reward=True), HW).files["script"]
    assert '--reward.remote_url "$REWARD_FUNC"' in text and "REWARD_MODEL" not in text
    assert "--reward.model_name_or_path" not in text


def test_verl_turns_off_the_reward_engine_and_the_reference() -> None:
    workload = _workload(rule_reward=True, kl_coef=0.0)
    overrides = verl.overrides(_strategy(), workload, HW)
    keys = {o.split("=", 1)[0] for o in overrides}
    assert keys <= set(NAMES["verl"]["keys"]), keys - set(NAMES["verl"]["keys"])
    assert "reward.reward_model.enable=False" in overrides
    assert not [k for k in keys if k.startswith(("reward.reward_model.rollout", "actor_rollout_ref.ref."))]
    assert {"actor_rollout_ref.actor.use_kl_loss=False", "algorithm.use_kl_in_reward=False"} <= set(overrides)
    assert not [g for g in verl.gaps(_strategy(), workload, HW) if "reward model on an inference engine" in g]
    script = verl.script(_strategy(), workload, HW).files["script"]
    assert "REWARD_MODEL" not in script and "reward.reward_model.model_path" not in script


@pytest.mark.parametrize(
    ("kind", "use", "coef"),
    [
        ("grpo", "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef"),
        ("ppo", "algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef"),
    ],
)
def test_verl_carries_the_plans_kl_coefficient(kind: str, use: str, coef: str) -> None:
    overrides = verl.overrides(_strategy(kind), _workload(kind, kl_coef=0.02), HW)
    assert f"{use}=True" in overrides and f"{coef}=0.02" in overrides
    assert coef in NAMES["verl"]["keys"]


def test_trl_beta_is_the_plans_kl_coefficient(tmp_path: Path) -> None:
    """GRPOConfig's ``beta`` carries the plan's coefficient (it was always 0.001, which loads a reference the plan
    may not hold); a rule-reward plan's notes name ``reward_funcs`` callables, not a reward model."""
    workload = _workload(rule_reward=True, kl_coef=0.0)
    kwargs = trl.config_kwargs(_strategy(), workload, HW, None)
    assert kwargs["beta"] == 0.0
    assert trl.config_kwargs(_strategy(), _workload(kl_coef=0.04), HW, None)["beta"] == 0.04
    rendered = trl.render(_strategy(), workload, HW, frameworks.file_layout("trl", str(tmp_path / "g.py")))
    assert any("reward_funcs=[your_reward" in note for note in rendered.notes)
    assert "REWARD_MODEL" not in rendered.files["kwargs"]


def test_deepspeed_configs_only_for_the_models_the_plan_holds() -> None:
    configs = render_rlhf_ds_configs(_strategy(), _workload(rule_reward=True, kl_coef=0.0), HW)
    assert set(configs) == {"actor"}
    assert set(render_rlhf_ds_configs(_strategy(), _workload(rule_reward=True), HW)) == {"actor", "reference"}
