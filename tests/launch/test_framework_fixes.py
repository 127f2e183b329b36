"""Issue 31, "every export trains as planned": each defect of the framework exports, as a pure function of the
plan (no torch; the names against ``tests/data/framework_names.json``, extracted from the pinned releases by
``scripts/extract_framework_names.py``). The runs through the frameworks' own code are in
``test_framework_runs.py``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from tiny_models import make_hardware, make_rlhf_strategy, make_rlhf_workload, rough_spec

from launch import frameworks
from launch.frameworks import accelerate, openrlhf, trl, verl
from launch.frameworks.hf import AUTO_KEYS
from store.records import Strategy, Workload
from store.rollout import RolloutStrategy

REPO = Path(__file__).resolve().parents[2]
NAMES: dict[str, Any] = json.loads((REPO / "tests" / "data" / "framework_names.json").read_text())
ACTOR, REWARD = rough_spec("rough-actor", 2048), rough_spec("rough-reward", 1024)
SLEEPING = RolloutStrategy(engine="vllm", gpu_memory_utilization=0.5, sleep_level=1)
AWAKE = RolloutStrategy(engine="vllm", gpu_memory_utilization=0.5, sleep_level=0, offload_training=False)


def _grpo(rollout: RolloutStrategy | None, gpus: int = 1, **changes: Any) -> tuple[Any, Workload, Any]:
    workload = make_rlhf_workload(
        "grpo", ACTOR, REWARD, prompt_len=256, gen_len=256, global_batch=8 * gpus, samples_per_prompt=4
    )
    strategy = make_rlhf_strategy(
        {"zero_stage": 2},
        None,
        with_critic=False,
        hybrid_engine=rollout is None,
        rollout=rollout,
        micro_batch=4,
        grad_accum=8,
        generation_batch=2,
        **changes,
    )
    return strategy, workload, make_hardware(gpus=gpus)


def _autos(config: Any, prefix: str = "") -> set[str]:
    if not isinstance(config, dict):
        return {prefix} if config == "auto" else set()
    return set().union(*(_autos(v, f"{prefix}.{k}" if prefix else k) for k, v in config.items()))


# --- 1, 2: accelerate ---------------------------------------------------------------------------------

# what accelerate 1.15's Accelerator._prepare_deepspeed fills with DummyOptim (the dataloader's batch size, the
# Accelerator's accumulation, DummyOptim's lr and weight_decay); anything else left "auto" stops prepare()
ACCELERATE_FILLS = {
    "train_micro_batch_size_per_gpu",
    "train_batch_size",
    "gradient_accumulation_steps",
    "optimizer.params.lr",
    "optimizer.params.weight_decay",
}


def test_accelerate_config_leaves_auto_only_what_accelerate_fills() -> None:
    for dtype in ("bf16", "fp16"):
        strategy = Strategy(zero_stage=2, micro_batch=2, grad_accum=2)
        workload = Workload(kind="sft", model=ACTOR, seq_len=512, global_batch=4, dtype=dtype)
        config = accelerate.ds_config(strategy, workload, make_hardware())
        assert _autos(config) <= ACCELERATE_FILLS, _autos(config) - ACCELERATE_FILLS
        assert config["bf16"]["enabled"] is (dtype == "bf16") and config["fp16"]["enabled"] is (dtype == "fp16")
        rendered = accelerate.render(strategy, workload, make_hardware(), {"ds_config": "x.json"})
        assert json.loads(rendered.files["ds_config"]) == config
        assert _autos(config) <= set(AUTO_KEYS)  # a Trainer under accelerate launch still fills the rest


# --- 3: veRL's reward engine --------------------------------------------------------------------------


def test_verl_sets_every_mandatory_key_and_a_one_gpu_reward_engine() -> None:
    strategy, workload, hardware = _grpo(SLEEPING)
    overrides = dict(o.split("=", 1) for o in verl.overrides(strategy, workload, hardware))
    assert overrides["reward.reward_model.enable"] == "True"
    for key in NAMES["verl"]["mandatory"]:  # ??? in veRL 0.9.1's config: MissingMandatoryValue when read unset
        assert overrides.get(key) == "vllm", key
    assert overrides["reward.reward_model.rollout.tensor_model_parallel_size"] == "1"  # default 2: no replica on 1 GPU
    assert overrides["reward.reward_model.rollout.max_model_len"] == "512"
    # weights of the 1024-wide reward model in bf16 plus the KV cache of one scoring batch, of a 24 GiB GPU
    kv = REWARD.num_layers * REWARD.kv_elements_per_token * 2 * 4 * 512 * 2
    share = (REWARD.backbone_params * 2 + kv) / hardware.gpu_memory_bytes
    assert float(overrides["reward.reward_model.rollout.gpu_memory_utilization"]) == round(share + 0.005, 2)


# --- 4, 5: the allocator setting ----------------------------------------------------------------------


def test_sleeping_vllm_gets_no_expandable_segments_in_any_file(tmp_path: Path) -> None:
    strategy, workload, hardware = _grpo(SLEEPING, allocator="expandable-segments")
    for fmt in ("openrlhf", "verl", "trl"):
        rendered = frameworks.render(
            fmt, strategy, workload, hardware, frameworks.file_layout(fmt, str(tmp_path / fmt))
        )
        for text in rendered.files.values():
            code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
            assert not any("expandable_segments" in line for line in code), fmt
        assert any("CuMemAllocator" in gap for gap in rendered.gaps), fmt
        assert not any("expandable_segments" in note for note in rendered.notes), fmt


def test_openrlhf_allocator_reaches_the_ray_workers() -> None:
    strategy, workload, hardware = _grpo(AWAKE, allocator="expandable-segments")
    text = openrlhf.script(strategy, workload, hardware).files["script"]
    assert "ray job submit --runtime-env-json" in text
    assert '{"env_vars":{"PYTORCH_CUDA_ALLOC_CONF":"expandable_segments:True"}}' in text
    assert "export PYTORCH_CUDA_ALLOC_CONF" not in text  # the driver's shell never reaches a running cluster
    default = openrlhf.script(replace(strategy, allocator="default"), workload, hardware).files["script"]
    assert "--runtime-env-json" not in default and "ray job submit --" in default


def test_trl_yaml_carries_the_allocator_in_its_env_block() -> None:
    strategy = Strategy(zero_stage=2, micro_batch=2, grad_accum=2, allocator="expandable-segments")
    workload = Workload(kind="sft", model=ACTOR, seq_len=512, global_batch=4)
    rendered = trl.render(strategy, workload, make_hardware(), frameworks.file_layout("trl", "x.py"))
    assert yaml.safe_load(rendered.files["yaml"])["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


# --- 6: the printed launch lines ----------------------------------------------------------------------


def test_launch_lines_are_the_exported_flags_in_0_11_names() -> None:
    options = NAMES["openrlhf"]["options"]
    for gpus in (1, 2):
        strategy, workload, hardware = _grpo(SLEEPING, gpus=gpus)
        entries = frameworks.launch_entries(strategy, workload, hardware)
        flags = entries["openrlhf"]["flags"]
        assert [f for f in flags if f.startswith("--") and f not in options] == []
        assert "openrlhf_ray" not in entries and entries["deepspeed_chat"]["flags"] == []  # PPO only
        script = openrlhf.script(strategy, workload, hardware).files["script"]
        assert " ".join(flags) in " ".join(script.replace("\\\n", " ").split())
        assert flags[flags.index("--rollout.micro_batch_size") + 1] == str(2 * 4)  # generation_batch x k
        assert flags[flags.index("--ds.attn_implementation") + 1] == workload.attn_impl  # OpenRLHF: flash_attention_2
        assert "--ds.overlap_comm" in flags


def test_openrlhf_names_the_buckets_its_own_config_leaves_to_deepspeed() -> None:
    strategy, workload, hardware = _grpo(SLEEPING)
    theirs = openrlhf.openrlhf_buckets(2, True, ACTOR.hidden_size)
    assert theirs.reduce_bucket_size == 500_000_000 and theirs.overlap_comm  # DeepSpeed's defaults, "auto" dropped
    gaps = [g for g in openrlhf.gaps(strategy, workload, hardware, "dotted") if "buckets" in g]
    assert len(gaps) == 1 and "reduce_bucket_size 500000000" in gaps[0]


# --- 7 and the deprecated names: TRL and transformers -------------------------------------------------


def test_trl_yaml_carries_lora_and_no_deprecated_names() -> None:
    strategy = Strategy(zero_stage=2, micro_batch=2, grad_accum=2, lora_rank=16, loss="chunked")
    workload = Workload(kind="dpo", model=ACTOR, seq_len=512, global_batch=4)
    rendered = trl.render(strategy, workload, make_hardware(), frameworks.file_layout("trl", "x.py"))
    document = yaml.safe_load(rendered.files["yaml"])
    fields = set(NAMES["trl"]["fields"]["DPOConfig"]) | set(NAMES["trl"]["fields"]["_BaseConfig"])
    assert {"use_peft": True, "lora_r": 16, "lora_target_modules": ["all-linear"]}.items() <= document.items()
    assert document["activation_checkpointing"] is False  # TRL's _BaseConfig defaults gradient_checkpointing=True
    assert not {"gradient_checkpointing", "gradient_checkpointing_kwargs", "use_liger_kernel"} & set(document)
    assert "model_init_kwargs" in fields and document["model_init_kwargs"]["dtype"] == "bfloat16"
    assert "get_peft_config(ModelConfig(**model_kwargs))" in rendered.files["kwargs"]
    assert "Everything of the plan" not in rendered.files["yaml"] or not rendered.gaps
    grpo = trl.launch(*_grpo(SLEEPING)[:3])["flags"]
    assert "--activation_checkpointing" in grpo and "--use_liger_kernel" not in grpo


def test_deepspeed_outside_settings_name_no_expandable_segments_beside_a_sleeping_vllm() -> None:
    from launch.rlhf_config import rlhf_outside_settings

    strategy = _grpo(SLEEPING, allocator="expandable-segments")[0]
    assert rlhf_outside_settings(strategy)["PYTORCH_CUDA_ALLOC_CONF"] == ""
    awake = _grpo(AWAKE, allocator="expandable-segments")[0]
    assert rlhf_outside_settings(awake)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
