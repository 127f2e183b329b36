"""Render the DeepSpeed configs (one per model) that run one RLHF strategy, and the settings outside them.
Each framework's launch flags are its module's under ``launch.frameworks`` (DeepSpeed-Chat's: ``deepspeed_chat``).

Pure Python, like :mod:`launch.ds_config` (``planner recommend`` and ``export`` import it): nothing here
imports torch, deepspeed or transformers.

An RLHF step holds four models on every GPU, each in its own DeepSpeed engine:

- ``actor`` and ``critic`` (PPO only) train: their configs are exactly what
  :func:`launch.ds_config.render_ds_config` renders for a single-model ``Strategy`` made of the model's
  block plus the step-wide ``micro_batch`` / ``grad_accum`` / ``empty_cache`` / ``allocator``, sized for
  that model (ZeRO-3 buckets follow its hidden size). The batch sizes count sequences:
  ``train_batch_size = micro_batch x grad_accum x world_size``. The actor's config also carries
  DeepSpeed's ``hybrid_engine`` block (``deepspeed/runtime/config.py``: ``HybridEngineConfig``), which
  ``deepspeed.initialize`` reads to build a ``DeepSpeedHybridEngine`` for generation.
- ``reference`` and ``reward`` are frozen: their configs have the shape of DeepSpeed-Chat's
  ``get_eval_ds_config`` (``dschat/utils/ds_utils.py``): batch sizes (DeepSpeed asks for them even
  without an optimizer), precision, and a ``zero_optimization`` block of stage 0 or 3 with, at stage 3,
  the ZeRO-3 knobs of ``store.ds_defaults.zero3_buckets`` (DeepSpeed-Chat sets only the persistence
  threshold; the prefetch bucket and live-parameter limits are spelled out here so the exported config
  holds the same buffer sizes the cost model counts) and ``offload_param`` to the CPU when offloaded.
  No optimizer, no gradient clipping.

EMA (``strategy.ema``): DeepSpeed-Chat (``--enable_ema``) keeps the exponential moving average of the
actor as a fifth engine, initialized with the *reference's* eval config (``get_eval_ds_config`` with
``--offload_reference_model`` and ZeRO-3 only when the actor is ZeRO-3); it never trains, the EMA update
runs after each actor step. DeepSpeed-Chat has no config of its own for it, so none is emitted here:
hold the EMA copy with the reference's config.

Models: each role's model is ``Workload.model_for(role)`` (store/records.py), the one rule the cost model,
the probes and the report share: the critic is ``critic_model`` (else the reward model, as DeepSpeed-Chat
initializes the critic from the reward model, else the actor's model); the reference is ``ref_model``
(else the actor's model); the reward model is ``reward_model`` (else the critic's, else the actor's
model). ReMax and GRPO train no critic: their configs have no ``critic`` key even when the
strategy carries a critic block.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from launch.common import check_rlhf, max_out_tokens
from launch.ds_config import EMPTY_CACHE_PLACEMENT, STEPS_PER_PRINT, outside_settings, render_ds_config
from store.ds_defaults import PIN_MEMORY, zero3_buckets
from store.errors import InputError
from store.records import (
    FrozenModelStrategy,
    Hardware,
    ModelSpec,
    RLHFStrategy,
    Strategy,
    TrainedModelStrategy,
    Workload,
)
from store.rollout import refuses_expandable_segments

__all__ = [
    "HYBRID_ENGINE_SETTINGS",
    "model_specs",
    "render_rlhf_ds_configs",
    "rlhf_outside_settings",
    "trained_model_strategy",
]

# The fixed keys of the actor's ``hybrid_engine`` block (``enabled`` and ``max_out_tokens`` come from the
# strategy and workload). DeepSpeed-Chat's defaults, except release_inference_cache: the planner frees the
# inference workspace after each generation (the fragmentation study, arXiv 2410.15651).
HYBRID_ENGINE_SETTINGS: dict[str, Any] = {
    "inference_tp_size": 1,
    "release_inference_cache": True,
    "pin_parameters": True,
    "tp_gather_partition_size": 8,
}


# --- DeepSpeed configs --------------------------------------------------------------------------------


def model_specs(workload: Workload) -> dict[str, ModelSpec]:
    """The model of each RLHF role (``Workload.model_for``: the one rule); no critic without PPO."""
    return workload.role_models()


def trained_model_strategy(strategy: RLHFStrategy, role: str) -> Strategy:
    """The single-model ``Strategy`` of ``role`` ("actor" or "critic"): its block plus the step-wide knobs."""
    block: TrainedModelStrategy | None = getattr(strategy, role)
    if block is None:
        raise InputError(f"strategy: no {role} block")
    return Strategy(
        zero_stage=block.zero_stage,
        offload_optimizer=block.offload_optimizer,
        offload_param=block.offload_param,
        gradient_checkpointing=block.gradient_checkpointing,
        lora_rank=block.lora_rank,
        micro_batch=strategy.micro_batch,
        grad_accum=strategy.grad_accum,
        empty_cache=strategy.empty_cache,
        allocator=strategy.allocator,
    )


def render_rlhf_ds_configs(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> dict[str, dict[str, Any]]:
    """Return one DeepSpeed config per model: keys ``actor``, ``critic`` (PPO only), ``reference`` (unless the KL
    coefficient is 0), ``reward`` (unless the rewards are rule-based).

    Raises:
        InputError: the workload is not RLHF, has no prompt/generation lengths, is PPO without a critic
            block, or NVMe offload is asked for without ``hardware.nvme_path``.
    """
    _check_rlhf(strategy, workload)
    specs = model_specs(workload)
    actor = render_ds_config(
        trained_model_strategy(strategy, "actor"), replace(workload, model=specs["actor"]), hardware
    )
    actor["hybrid_engine"] = {
        "enabled": strategy.hybrid_engine,
        "max_out_tokens": _max_out_tokens(workload),
        **HYBRID_ENGINE_SETTINGS,
    }
    configs: dict[str, dict[str, Any]] = {"actor": actor}
    if "critic" in specs:
        critic_strategy = trained_model_strategy(strategy, "critic")
        configs["critic"] = render_ds_config(critic_strategy, replace(workload, model=specs["critic"]), hardware)
    # a KL coefficient of 0 loads no reference, rule-based rewards no reward model (Workload.role_models): no config
    for role, block in (("reference", strategy.reference), ("reward", strategy.reward)):
        if role in specs:
            configs[role] = _frozen_config(block, specs[role], strategy, workload, hardware)
    return configs


_check_rlhf = check_rlhf
_max_out_tokens = max_out_tokens


def _frozen_config(
    block: FrozenModelStrategy, spec: ModelSpec, strategy: RLHFStrategy, workload: Workload, hardware: Hardware
) -> dict[str, Any]:
    """DeepSpeed-Chat's ``get_eval_ds_config`` shape for a frozen model (no optimizer)."""
    zero: dict[str, Any] = {"stage": block.zero_stage}
    if block.zero_stage == 3:
        buckets = zero3_buckets(spec)
        zero.update(
            {
                "stage3_param_persistence_threshold": buckets.param_persistence_threshold,
                "stage3_prefetch_bucket_size": buckets.prefetch_bucket_size,
                "stage3_max_live_parameters": buckets.max_live_parameters,
                "stage3_max_reuse_distance": buckets.max_reuse_distance,
            }
        )
        if block.offload != "none":
            zero["offload_param"] = {"device": block.offload, "pin_memory": PIN_MEMORY}
    dtype = workload.dtype
    return {
        "train_batch_size": strategy.micro_batch * strategy.grad_accum * hardware.world_size,
        "train_micro_batch_size_per_gpu": strategy.micro_batch,
        "gradient_accumulation_steps": strategy.grad_accum,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16"},
        "zero_optimization": zero,
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
    }


# --- Settings outside the configs ---------------------------------------------------------------------


def rlhf_outside_settings(strategy: RLHFStrategy) -> dict[str, str]:
    """The settings of an RLHF strategy that live outside the DeepSpeed configs, as copyable text.

    Keys: ``actor.gradient_checkpointing``, ``critic.gradient_checkpointing`` (with a critic block),
    ``actor.lora`` / ``critic.lora`` (only with a LoRA rank), ``generation``, ``empty_cache``,
    ``PYTORCH_CUDA_ALLOC_CONF`` (empty string: leave it unset) and, with ``strategy.ema``, ``ema``.
    """
    settings: dict[str, str] = {}
    roles = ("actor", "critic") if strategy.critic is not None else ("actor",)
    for role in roles:
        single = outside_settings(trained_model_strategy(strategy, role))
        what = "actor (causal LM)" if role == "actor" else "critic (backbone + value head)"
        settings[f"{role}.gradient_checkpointing"] = f"{what}: {single['gradient_checkpointing']}"
        if "lora" in single:
            text = single["lora"]
            if role == "critic":
                text = text.replace('task_type="CAUSAL_LM"', 'modules_to_save=["value head"]')
            settings[f"{role}.lora"] = f"{what}: {text}"
    rollout = strategy.rollout
    if rollout is not None:
        name = {"vllm": "vLLM", "sglang": "SGLang"}[rollout.engine]
        knob = "gpu_memory_utilization" if rollout.engine == "vllm" else "mem_fraction_static"
        share = "the planner's" if rollout.gpu_memory_utilization is None else f"{rollout.gpu_memory_utilization:.2f}"
        where = "on every training GPU" if rollout.colocated else f"on {rollout.engine_gpus} GPUs of each node"
        settings["generation"] = (
            f"generate with a {name} engine {where} (tensor parallel {rollout.tensor_parallel}, {knob} {share}"
            + (", enforce_eager" if rollout.enforce_eager else "")
            + f"), asleep at level {rollout.sleep_level} while the trainer works"
            + (
                "; offload the DeepSpeed states during the rollout (engine.offload_states())"
                if rollout.offload_training
                else ""
            )
            + "; sync the actor's weights into it after each training step (planner export --format openrlhf|trl|verl)"
        )
    elif strategy.hybrid_engine:
        settings["generation"] = (
            "generate with actor_engine.module.generate(..., use_cache=True) between actor_engine.eval() and "
            'actor_engine.train(); the actor config\'s "hybrid_engine" block makes deepspeed.initialize return '
            "a DeepSpeedHybridEngine that swaps in its inference kernels for models it has a policy for"
        )
    else:
        settings["generation"] = (
            "generate with actor_engine.module.generate(..., use_cache=True) under torch.no_grad() "
            "(hybrid engine off: the training module generates as it is)"
        )
    policy = strategy.empty_cache
    settings["empty_cache"] = EMPTY_CACHE_PLACEMENT[policy]
    if policy != "never":
        settings["empty_cache"] += (
            f"; in your own PPO loop planner.runtime.EmptyCachePolicy({policy!r}) does this: mark the phases "
            '"generation", "scoring", "actor_training", "critic_training" and call end_step() after the '
            "optimizer steps"
        )
    # beside a sleeping colocated vLLM engine none: its CuMemAllocator refuses expandable segments
    settings["PYTORCH_CUDA_ALLOC_CONF"] = (
        "expandable_segments:True"
        if strategy.allocator == "expandable-segments" and not refuses_expandable_segments(strategy.rollout)
        else ""
    )
    if strategy.ema:
        settings["ema"] = (
            "keep an EMA copy of the actor (DeepSpeed-Chat --enable_ema) in a fifth engine started with the "
            "reference's config; update it after each actor step"
        )
    return settings
