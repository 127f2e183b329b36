"""The RLHF configs (one per model) are accepted by DeepSpeed's parser and say what the strategy says;
the DeepSpeed-Chat and OpenRLHF flags follow the strategy.

The strategy spread: every trained layout (ZeRO 0-3, optimizer / parameter offload, NVMe) as actor and
as critic, the three frozen layouts (Z0, Z3, Z3 + CPU offload) for reference and reward, hybrid engine on
and off, the three dtypes, on 1 GPU and on 2 nodes x 4 GPUs. Configs are deduplicated per model role
before parsing (only the model's block, the batch shape, the dtype, the world size and, for the actor,
the hybrid engine reach them). World size without a process group works as in
``test_ds_config_validation.py``: ``deepspeed.comm.get_rank`` is patched to 0 and an ``mpu`` stand-in
reports the data-parallel world size, which is asserted so a silent fall-back to 1 fails.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tiny_models import (
    make_hardware,
    make_rlhf_strategy,
    make_rlhf_workload,
    rough_spec,
    tiny_critic_spec,
    tiny_llama_spec,
)

from launch.ds_config import EMPTY_CACHE_PLACEMENT, render_ds_config
from launch.frameworks.deepspeed_chat import deepspeed_chat_flags, deepspeed_chat_gaps
from launch.frameworks.openrlhf import flags as openrlhf_flags
from launch.frameworks.openrlhf import gaps as openrlhf_gaps
from launch.rlhf_config import (
    HYBRID_ENGINE_SETTINGS,
    model_specs,
    render_rlhf_ds_configs,
    rlhf_outside_settings,
    trained_model_strategy,
)
from store import ds_defaults
from store.errors import InputError
from store.records import DTYPES, Hardware, RLHFStrategy, Workload

deepspeed = pytest.importorskip("deepspeed")

REPO_ROOT = Path(__file__).resolve().parents[2]
NVME_PATH = "/local_nvme/memplan"
HARDWARE = {
    "1gpu": make_hardware(gpus=1, nodes=1, nvme_path=NVME_PATH),
    "2x4gpu": make_hardware(gpus=4, nodes=2, nvme_path=NVME_PATH),
}
ACTOR, CRITIC = rough_spec("rough-actor", 2048), rough_spec("rough-critic", 1024)
TRAINED: tuple[dict[str, Any], ...] = (
    {"zero_stage": 0},
    {"zero_stage": 1, "gradient_checkpointing": True},
    {"zero_stage": 2},
    {"zero_stage": 2, "offload_optimizer": "cpu", "lora_rank": 8},
    {"zero_stage": 3, "gradient_checkpointing": True},
    {"zero_stage": 3, "offload_optimizer": "cpu"},
    {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    {"zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme"},
)
FROZEN: tuple[dict[str, Any], ...] = ({"zero_stage": 0}, {"zero_stage": 3}, {"zero_stage": 3, "offload": "cpu"})
BATCH = {"generation_batch": 4, "micro_batch": 2, "grad_accum": 2}


def _workload(kind: str, dtype: str) -> Workload:
    return make_rlhf_workload(
        kind,
        ACTOR,
        CRITIC,
        dtype=dtype,
        prompt_len=256,
        gen_len=256,
        global_batch=64,
        samples_per_prompt=4 if kind == "grpo" else 1,
    )


def ppo_strategies() -> list[RLHFStrategy]:
    """Actor x critic trained layouts, reference x reward frozen layouts, hybrid engine on and off."""
    return [
        make_rlhf_strategy(actor, critic, reference, reward, hybrid_engine=hybrid, **BATCH)
        for actor, critic, reference, reward, hybrid in itertools.product(
            TRAINED, TRAINED, FROZEN, FROZEN, (True, False)
        )
    ]


def critic_free_strategies() -> list[RLHFStrategy]:
    return [
        make_rlhf_strategy(actor, reference=frozen, reward=frozen, with_critic=False, hybrid_engine=hybrid, **BATCH)
        for actor, frozen, hybrid in itertools.product(TRAINED, FROZEN, (True, False))
    ]


CASES: list[tuple[RLHFStrategy, str, str, str]] = [
    (strategy, "ppo", dtype, hw) for strategy in ppo_strategies() for dtype in DTYPES for hw in HARDWARE
] + [
    (strategy, kind, dtype, hw)
    for strategy in critic_free_strategies()
    for kind in ("remax", "grpo")
    for dtype in DTYPES
    for hw in HARDWARE
]


def _distinct_configs() -> dict[str, tuple[str, dict[str, Any], RLHFStrategy, Workload, Hardware]]:
    """Every rendered config, deduplicated per role: key -> (role, config, strategy, workload, hardware)."""
    distinct: dict[str, tuple[str, dict[str, Any], RLHFStrategy, Workload, Hardware]] = {}
    for strategy, kind, dtype, hw in CASES:
        workload, hardware = _workload(kind, dtype), HARDWARE[hw]
        for role, config in render_rlhf_ds_configs(strategy, workload, hardware).items():
            distinct.setdefault(role + json.dumps(config), (role, config, strategy, workload, hardware))
    return distinct


DISTINCT = _distinct_configs()


def _case_id(key: str) -> str:
    role, config, _, workload, hardware = DISTINCT[key]
    zero = config["zero_optimization"]
    off = "-".join(f"{k}_{zero[k]['device']}" for k in ("offload_optimizer", "offload_param") if k in zero)
    hybrid = f"-he{int(config['hybrid_engine']['enabled'])}" if "hybrid_engine" in config else ""
    return f"{role}-z{zero['stage']}{'-' + off if off else ''}{hybrid}-{workload.dtype}-w{hardware.world_size}"


def test_spread_covers_every_layout() -> None:
    roles = {role for role, *_ in DISTINCT.values()}
    assert roles == {"actor", "critic", "reference", "reward"}
    stages = {(role, c["zero_optimization"]["stage"]) for role, c, *_ in DISTINCT.values()}
    assert stages == {(r, s) for r in ("actor", "critic") for s in (0, 1, 2, 3)} | {
        (r, s) for r in ("reference", "reward") for s in (0, 3)
    }
    hybrid = {c["hybrid_engine"]["enabled"] for role, c, *_ in DISTINCT.values() if role == "actor"}
    assert hybrid == {True, False}
    # actor: 8 layouts x 2 hybrid x 3 dtypes x 2 world sizes; critic: 8 x 3 x 2; frozen: 3 x 3 x 2 each.
    counts = {role: sum(1 for r, *_ in DISTINCT.values() if r == role) for role in roles}
    assert counts == {"actor": 96, "critic": 48, "reference": 18, "reward": 18}


@pytest.mark.parametrize("key", sorted(DISTINCT), ids=_case_id)
def test_deepspeed_accepts_rlhf_config(key: str, parse) -> None:
    role, config, strategy, workload, hardware = DISTINCT[key]
    ds = parse(config, hardware.world_size)
    world = hardware.world_size

    assert ds.world_size == world
    assert ds.train_batch_size == strategy.micro_batch * strategy.grad_accum * world == config["train_batch_size"]
    assert ds.train_micro_batch_size_per_gpu == strategy.micro_batch
    assert ds.gradient_accumulation_steps == strategy.grad_accum
    assert ds.bfloat16_config.enabled == (workload.dtype == "bf16")
    assert ds.float16_config.enabled == (workload.dtype == "fp16")
    zero, spec = ds.zero_config, model_specs(workload)[role]

    if role in ("actor", "critic"):
        block = getattr(strategy, role)
        assert ds.optimizer_name == "adamw"
        assert ds.zero_optimization_stage == block.zero_stage
        for name in ("offload_optimizer", "offload_param"):
            wanted, parsed = getattr(block, name), getattr(zero, name)
            assert (parsed.device if parsed else "none") == wanted
        if block.zero_stage == 3:
            assert zero.param_persistence_threshold == ds_defaults.zero3_buckets(spec).param_persistence_threshold
        # Exactly the single-model renderer's config (plus the actor's hybrid engine block).
        single = render_ds_config(trained_model_strategy(strategy, role), _with_model(workload, spec), hardware)
        assert {k: v for k, v in config.items() if k != "hybrid_engine"} == single
    else:
        block = getattr(strategy, role)
        assert ds.optimizer_name is None and "optimizer" not in config
        assert ds.zero_optimization_stage == block.zero_stage
        assert (zero.offload_param.device if zero.offload_param else "none") == block.offload
        assert zero.offload_optimizer is None
        if block.zero_stage == 3:
            buckets = ds_defaults.zero3_buckets(spec)
            assert zero.param_persistence_threshold == buckets.param_persistence_threshold == 10 * spec.hidden_size
            assert zero.prefetch_bucket_size == buckets.prefetch_bucket_size
            assert zero.max_live_parameters == buckets.max_live_parameters
        if block.offload != "none":
            assert zero.offload_param.pin_memory == ds_defaults.PIN_MEMORY

    hybrid = ds.hybrid_engine
    if role == "actor":
        assert hybrid.enabled == strategy.hybrid_engine
        assert hybrid.max_out_tokens == workload.prompt_len + workload.gen_len
        assert hybrid.inference_tp_size == 1
        assert hybrid.release_inference_cache is True
        assert hybrid.pin_parameters is True
        assert hybrid.tp_gather_partition_size == 8
        assert config["hybrid_engine"] == {
            "enabled": strategy.hybrid_engine,
            "max_out_tokens": 512,
            **HYBRID_ENGINE_SETTINGS,
        }
    else:
        assert "hybrid_engine" not in config and hybrid.enabled is False


def _with_model(workload: Workload, spec: Any) -> Workload:
    from dataclasses import replace

    return replace(workload, model=spec)


def test_models_per_role_and_critic_free_kinds() -> None:
    strategy = make_rlhf_strategy({"zero_stage": 3}, {"zero_stage": 3}, {"zero_stage": 3}, {"zero_stage": 3})
    ppo = render_rlhf_ds_configs(strategy, _workload("ppo", "bf16"), HARDWARE["1gpu"])
    assert list(ppo) == ["actor", "critic", "reference", "reward"]
    threshold = {role: c["zero_optimization"]["stage3_param_persistence_threshold"] for role, c in ppo.items()}
    assert threshold == {"actor": 20480, "critic": 10240, "reference": 20480, "reward": 10240}
    for kind in ("remax", "grpo"):
        # A critic block in the strategy is ignored: these kinds train no critic.
        configs = render_rlhf_ds_configs(strategy, _workload(kind, "bf16"), HARDWARE["1gpu"])
        assert list(configs) == ["actor", "reference", "reward"]


@pytest.mark.parametrize(
    ("workload", "strategy", "message"),
    [
        (_workload("ppo", "bf16"), make_rlhf_strategy(with_critic=False), "ppo trains a critic"),
        (
            Workload(kind="sft", model=tiny_llama_spec(), seq_len=16, global_batch=2),
            make_rlhf_strategy(),
            "ppo, remax or grpo",
        ),
        (
            Workload(kind="ppo", model=tiny_llama_spec(), seq_len=16, global_batch=2, critic_model=tiny_critic_spec()),
            make_rlhf_strategy(),
            "--prompt-len",
        ),
        (
            _workload("ppo", "bf16"),
            make_rlhf_strategy({"zero_stage": 3, "offload_optimizer": "nvme"}),
            "nvme offload needs --nvme-path",
        ),
    ],
)
def test_bad_input(workload: Workload, strategy: RLHFStrategy, message: str) -> None:
    with pytest.raises(InputError, match=message):
        render_rlhf_ds_configs(strategy, workload, make_hardware(nvme_path=None))


def _value(flags: list[str], name: str) -> str:
    assert flags.count(name) == 1, (name, flags)
    return flags[flags.index(name) + 1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_deepspeed_chat_flags_follow_strategy(dtype: str) -> None:
    workload, hardware = _workload("ppo", dtype), HARDWARE["2x4gpu"]
    for strategy in ppo_strategies():
        flags = deepspeed_chat_flags(strategy, workload, hardware)
        actor, critic = strategy.actor, strategy.critic
        assert _value(flags, "--actor_zero_stage") == str(actor.zero_stage)
        assert _value(flags, "--critic_zero_stage") == str(critic.zero_stage)
        offload = actor.offload_optimizer != "none" or critic.offload_optimizer != "none"
        assert ("--offload" in flags) == offload
        assert ("--offload_reference_model" in flags) == (strategy.reference.offload == "cpu")
        assert ("--enable_hybrid_engine" in flags) == strategy.hybrid_engine
        assert ("--release_inference_cache" in flags) == strategy.hybrid_engine
        assert ("--actor_gradient_checkpointing" in flags) == actor.gradient_checkpointing
        assert ("--critic_gradient_checkpointing" in flags) == critic.gradient_checkpointing
        if actor.lora_rank:
            assert _value(flags, "--actor_lora_dim") == str(actor.lora_rank)
        assert ("--actor_lora_dim" in flags) == bool(actor.lora_rank)
        assert ("--critic_lora_dim" in flags) == bool(critic.lora_rank)
        assert ("--only_optimize_lora" in flags) == bool(actor.lora_rank or critic.lora_rank)
        assert _value(flags, "--per_device_generation_batch_size") == "4"
        assert _value(flags, "--per_device_training_batch_size") == "2"
        assert _value(flags, "--gradient_accumulation_steps") == "2"
        assert _value(flags, "--ppo_epochs") == "1"
        assert _value(flags, "--max_prompt_seq_len") == "256"
        assert _value(flags, "--max_answer_seq_len") == "256"
        assert "--enable_ema" not in flags
        assert "--offload_reward_model" not in flags  # DeepSpeed-Chat has no such flag
        if dtype == "fp32":
            assert "--dtype" not in flags
        else:
            assert _value(flags, "--dtype") == dtype
        assert all(f.startswith("--") or f.isdigit() or f in ("layers.", "bf16", "fp16") for f in flags), flags


def test_deepspeed_chat_ema_and_gaps() -> None:
    hardware = HARDWARE["1gpu"]
    strategy = make_rlhf_strategy({"zero_stage": 2}, {"zero_stage": 2}, ema=True)
    assert "--enable_ema" in deepspeed_chat_flags(strategy, _workload("ppo", "bf16"), hardware)
    assert deepspeed_chat_gaps(strategy, _workload("ppo", "bf16"), hardware) == []

    mismatched = make_rlhf_strategy(
        {"zero_stage": 2, "offload_optimizer": "cpu"},
        {"zero_stage": 3},
        {"zero_stage": 3, "offload": "cpu"},
        {"zero_stage": 0, "offload": "none"},
    )
    gaps = " | ".join(deepspeed_chat_gaps(mismatched, _workload("ppo", "fp32"), hardware))
    assert "offloads only one" in gaps
    assert "reference at ZeRO-0" in gaps
    assert "ZeRO-3 critic's parameters" in gaps
    assert "no reward-model offload flag" in gaps
    assert "fp32" in gaps

    refused = make_rlhf_strategy(
        {"zero_stage": 2, "offload_optimizer": "cpu"}, {"zero_stage": 2, "offload_optimizer": "cpu"}
    )
    assert any("training instability" in g for g in deepspeed_chat_gaps(refused, _workload("ppo", "bf16"), hardware))


def test_deepspeed_chat_one_answer_per_prompt() -> None:
    workload = make_rlhf_workload("ppo", ACTOR, CRITIC, prompt_len=64, gen_len=64, samples_per_prompt=2)
    gaps = deepspeed_chat_gaps(make_rlhf_strategy(), workload, HARDWARE["1gpu"])
    assert gaps == ["DeepSpeed-Chat generates one answer per prompt; samples_per_prompt > 1 has no flag"]


@pytest.mark.parametrize("kind", ["remax", "grpo"])
def test_deepspeed_chat_has_no_critic_free_trainer(kind: str) -> None:
    strategy = make_rlhf_strategy(with_critic=False)
    assert deepspeed_chat_flags(strategy, _workload(kind, "bf16"), HARDWARE["1gpu"]) == []
    assert "PPO only" in deepspeed_chat_gaps(strategy, _workload(kind, "bf16"), HARDWARE["1gpu"])[0]


# Option names checked against OpenRLHF 0.11.2's openrlhf/cli/train_ppo_ray.py.
OPENRLHF_DOTTED_OPTIONS = {
    "--ds.zero_stage",
    "--ds.adam_offload",
    "--actor.gradient_checkpointing_enable",
    "--ref.offload",
    "--reward.offload",
    "--train.micro_batch_size",
    "--train.batch_size",
    "--rollout.micro_batch_size",
    "--rollout.batch_size",
    "--train.max_epochs",
    "--data.max_len",
    "--rollout.max_new_tokens",
    "--ds.param_dtype",
    "--ds.lora.rank",
    "--train.enable_ema",
    "--algo.advantage.estimator",
    "--rollout.n_samples_per_prompt",
    "--train.colocate_all",
    "--ds.attn_implementation",
    "--ds.overlap_comm",
    *(f"--{role}.{n}" for role in ("actor", "critic", "ref", "reward") for n in ("num_nodes", "num_gpus_per_node")),
}
OPENRLHF_CLASSIC_OPTIONS = {
    "--zero_stage",
    "--adam_offload",
    "--gradient_checkpointing",
    "--ref_reward_offload",
    "--micro_train_batch_size",
    "--train_batch_size",
    "--micro_rollout_batch_size",
    "--rollout_batch_size",
    "--max_epochs",
    "--prompt_max_len",
    "--generate_max_len",
    "--bf16",
    "--lora_rank",
    "--enable_ema",
    "--advantage_estimator",
    "--n_samples_per_prompt",
}


@pytest.mark.parametrize("kind", ["ppo", "remax", "grpo"])
def test_openrlhf_flags_follow_strategy(kind: str) -> None:
    hardware = HARDWARE["2x4gpu"]
    strategies = ppo_strategies() if kind == "ppo" else critic_free_strategies()
    for strategy in strategies[::7]:
        for dtype in DTYPES:
            workload = _workload(kind, dtype)
            classic = openrlhf_flags(strategy, workload, hardware)
            dotted = openrlhf_flags(strategy, workload, hardware, style="dotted")
            assert {f for f in classic if f.startswith("--")} <= OPENRLHF_CLASSIC_OPTIONS
            assert {f for f in dotted if f.startswith("--")} <= OPENRLHF_DOTTED_OPTIONS
            actor = strategy.actor
            assert _value(classic, "--zero_stage") == _value(dotted, "--ds.zero_stage") == str(actor.zero_stage)
            trained = [actor] + ([strategy.critic] if kind == "ppo" else [])
            adam = any(b.offload_optimizer != "none" for b in trained)
            assert ("--adam_offload" in classic) == ("--ds.adam_offload" in dotted) == adam
            assert ("--gradient_checkpointing" in classic) == actor.gradient_checkpointing
            frozen_offload = strategy.reference.offload == "cpu" or strategy.reward.offload == "cpu"
            assert ("--ref_reward_offload" in classic) == frozen_offload
            assert ("--ref.offload" in dotted) == (strategy.reference.offload == "cpu")
            assert ("--reward.offload" in dotted) == (strategy.reward.offload == "cpu")
            assert _value(classic, "--micro_train_batch_size") == _value(dotted, "--train.micro_batch_size") == "2"
            assert _value(classic, "--train_batch_size") == _value(dotted, "--train.batch_size") == "32"
            assert _value(classic, "--micro_rollout_batch_size") == "4"
            assert _value(classic, "--rollout_batch_size") == _value(dotted, "--rollout.batch_size") == "64"
            assert _value(classic, "--max_epochs") == "1"
            assert _value(classic, "--prompt_max_len") == _value(classic, "--generate_max_len") == "256"
            assert _value(dotted, "--data.max_len") == "512"
            assert ("--bf16" in classic) == (dtype == "bf16")
            assert ("--ds.param_dtype" in dotted) == (dtype != "fp32")
            assert ("--lora_rank" in classic) == bool(actor.lora_rank)
            estimator = {"ppo": None, "remax": "reinforce", "grpo": "group_norm"}[kind]
            if estimator:
                assert _value(classic, "--advantage_estimator") == estimator
                assert _value(dotted, "--algo.advantage.estimator") == estimator
            else:
                assert "--advantage_estimator" not in classic
            if kind == "grpo":
                assert _value(classic, "--n_samples_per_prompt") == "4"
                assert _value(dotted, "--rollout.n_samples_per_prompt") == "4"
            else:
                assert "--n_samples_per_prompt" not in classic
            assert ("--critic.num_nodes" in dotted) == (kind == "ppo")
            assert _value(dotted, "--actor.num_gpus_per_node") == "4" and _value(dotted, "--ref.num_nodes") == "2"


def test_openrlhf_gaps() -> None:
    hardware = HARDWARE["1gpu"]
    strategy = make_rlhf_strategy(
        {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
        {"zero_stage": 2},
        {"zero_stage": 3, "offload": "cpu"},
        {"zero_stage": 0},
        hybrid_engine=False,
    )
    gaps = " | ".join(openrlhf_gaps(strategy, _workload("ppo", "fp16"), hardware))
    assert "--zero_stage is one setting" in gaps
    assert "offloads one" in gaps
    assert "actor's parameters" in gaps
    assert "reward model at ZeRO-3" in gaps
    assert "--ref_reward_offload" in gaps
    assert "fp16 cannot" in gaps
    remax = openrlhf_gaps(make_rlhf_strategy(with_critic=False), _workload("remax", "bf16"), hardware)
    assert any("no ReMax estimator" in g for g in remax)
    assert any("hybrid engine" in g for g in remax)
    with pytest.raises(InputError, match="style"):
        openrlhf_flags(strategy, _workload("ppo", "bf16"), hardware, style="ray")


def test_rlhf_outside_settings() -> None:
    strategy = make_rlhf_strategy(
        {"gradient_checkpointing": True, "lora_rank": 16},
        {"gradient_checkpointing": False, "lora_rank": 4},
        empty_cache="after-inference",
        allocator="expandable-segments",
        ema=True,
    )
    settings = rlhf_outside_settings(strategy)
    assert set(settings) == {
        "actor.gradient_checkpointing",
        "actor.lora",
        "critic.gradient_checkpointing",
        "critic.lora",
        "generation",
        "empty_cache",
        "PYTORCH_CUDA_ALLOC_CONF",
        "ema",
    }
    assert "gradient_checkpointing_enable(" in settings["actor.gradient_checkpointing"]
    assert "off" in settings["critic.gradient_checkpointing"]
    assert "r=16" in settings["actor.lora"] and "CAUSAL_LM" in settings["actor.lora"]
    assert "r=4" in settings["critic.lora"] and "CAUSAL_LM" not in settings["critic.lora"]
    assert settings["empty_cache"].startswith(EMPTY_CACHE_PLACEMENT["after-inference"])
    assert "EmptyCachePolicy('after-inference')" in settings["empty_cache"]
    assert settings["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "hybrid" in settings["generation"].lower()

    plain = rlhf_outside_settings(make_rlhf_strategy(with_critic=False, empty_cache="never", hybrid_engine=False))
    assert set(plain) == {"actor.gradient_checkpointing", "generation", "empty_cache", "PYTORCH_CUDA_ALLOC_CONF"}
    assert plain["empty_cache"] == EMPTY_CACHE_PLACEMENT["never"]
    assert plain["PYTORCH_CUDA_ALLOC_CONF"] == ""


def test_rlhf_config_module_imports_no_heavy_libraries() -> None:
    code = (
        "import sys, launch.rlhf_config, planner.runtime; "
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)
