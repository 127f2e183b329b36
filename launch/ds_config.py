"""Render the DeepSpeed config (and the few settings outside it) that run one single-model strategy.

Pure Python on purpose: ``planner recommend`` imports this on its fast path, so nothing here imports
torch, deepspeed or transformers. Every number that sizes a GPU buffer comes from
``store.ds_defaults``, the same constants the cost model counts.

The keys follow DeepSpeed's own config models (``deepspeed/runtime/config.py``,
``runtime/zero/config.py``, ``runtime/zero/offload_config.py``); ``tests/probes`` feeds every config
this module can emit to ``deepspeed.runtime.config.DeepSpeedConfig`` and starts real engines from
them on the CPU accelerator.

Notes on what DeepSpeed does with these keys:

- ZeRO-1/2 treat ``offload_optimizer.device == "nvme"`` exactly like ``"cpu"`` (the optimizer states
  live in host memory; ``stage_1_and_2.py`` only checks ``device != none``). Real NVMe swapping of
  optimizer states exists only under ZeRO-3 (ZeRO-Infinity).
- Gradient checkpointing is not a DeepSpeed key for Hugging Face models (the ``activation_checkpointing``
  section configures Megatron-style checkpointing), and LoRA needs nothing in the config: both are
  returned by :func:`outside_settings`.
"""

from __future__ import annotations

from typing import Any

from store.ds_buckets import DS_SUB_GROUP_SIZE
from store.ds_defaults import GRADIENT_CLIPPING, LEARNING_RATE, PIN_MEMORY, WEIGHT_DECAY, buckets_of
from store.errors import InputError
from store.phases import EMPTY_CACHE_PLACEMENT
from store.quantization import qlora_loading
from store.records import EMPTY_CACHE_POLICIES, Hardware, Strategy, Workload

__all__ = ["render_ds_config", "outside_settings", "EMPTY_CACHE_PLACEMENT"]

# Adam hyper-parameters that size nothing (not in store.ds_defaults): PyTorch's AdamW defaults.
ADAM_BETAS: tuple[float, float] = (0.9, 0.999)
ADAM_EPS = 1e-8
STEPS_PER_PRINT = 10

# fp16 dynamic loss scaling: DeepSpeed's documented defaults, spelled out so the file is self-contained.
FP16_LOSS_SCALING: dict[str, Any] = {
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}


def render_ds_config(strategy: Strategy, workload: Workload, hardware: Hardware) -> dict[str, Any]:
    """Return the DeepSpeed config dict that runs ``strategy`` as the planner's cost model assumes.

    ``train_batch_size`` is ``micro_batch x grad_accum x hardware.world_size`` (data parallel over every
    GPU). Mixed precision follows ``workload.dtype`` (fp32 enables neither bf16 nor fp16). Keys come
    in a fixed order, so ``json.dumps`` of the result is stable.

    Raises:
        InputError: NVMe offload is asked for but ``hardware.nvme_path`` is not set.
    """
    world_size = hardware.world_size
    dtype = workload.dtype
    config: dict[str, Any] = {
        "train_batch_size": strategy.micro_batch * strategy.grad_accum * world_size,
        "train_micro_batch_size_per_gpu": strategy.micro_batch,
        "gradient_accumulation_steps": strategy.grad_accum,
        "gradient_clipping": GRADIENT_CLIPPING,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": True, **FP16_LOSS_SCALING} if dtype == "fp16" else {"enabled": False},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": LEARNING_RATE,
                "betas": list(ADAM_BETAS),
                "eps": ADAM_EPS,
                "weight_decay": WEIGHT_DECAY,
            },
        },
        "zero_optimization": _zero_section(strategy, workload, hardware),
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
    }
    return config


def _zero_section(strategy: Strategy, workload: Workload, hardware: Hardware) -> dict[str, Any]:
    """The ``zero_optimization`` block for the strategy's stage, buckets and offload targets."""
    stage = strategy.zero_stage
    zero: dict[str, Any] = {"stage": stage}
    if stage == 0:
        return zero
    # the buckets the cost model counts: the strategy's own (a user's config) or memplan's
    buckets = buckets_of(strategy.ds_buckets, workload.model, stage)
    if stage in (1, 2):
        zero.update(
            {
                "reduce_bucket_size": buckets.reduce_bucket_size,
                "allgather_bucket_size": buckets.allgather_bucket_size,
                "overlap_comm": buckets.overlap_comm,
                "contiguous_gradients": buckets.contiguous_gradients,
                "reduce_scatter": True,
            }
        )
    else:
        zero.update(
            {
                "reduce_bucket_size": buckets.reduce_bucket_size,
                "stage3_prefetch_bucket_size": buckets.prefetch_bucket_size,
                "stage3_param_persistence_threshold": buckets.param_persistence_threshold,
                "stage3_max_live_parameters": buckets.max_live_parameters,
                "stage3_max_reuse_distance": buckets.max_reuse_distance,
                "overlap_comm": buckets.overlap_comm,
                "contiguous_gradients": buckets.contiguous_gradients,
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
        if buckets.sub_group_size != DS_SUB_GROUP_SIZE:  # DeepSpeed's default is left out
            zero["sub_group_size"] = buckets.sub_group_size
    if strategy.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload_block(strategy.offload_optimizer, hardware, "offload_optimizer")
    if strategy.offload_param != "none":
        # Strategy validation already refuses offload_param without ZeRO-3.
        zero["offload_param"] = _offload_block(strategy.offload_param, hardware, "offload_param")
    return zero


def _offload_block(device: str, hardware: Hardware, what: str) -> dict[str, Any]:
    """One ``offload_optimizer`` / ``offload_param`` block; NVMe needs the hardware's path."""
    block: dict[str, Any] = {"device": device, "pin_memory": PIN_MEMORY}
    if device == "nvme":
        if not hardware.nvme_path:
            raise InputError(
                f"nvme offload needs --nvme-path PATH (a directory on a local NVMe drive) for {what}; "
                "give one or choose cpu offload"
            )
        block["nvme_path"] = hardware.nvme_path
    return block


def outside_settings(strategy: Strategy) -> dict[str, str]:
    """The settings that live outside the DeepSpeed config, as copyable text.

    Keys: ``gradient_checkpointing``, ``empty_cache``, ``PYTORCH_CUDA_ALLOC_CONF`` (empty string means
    leave it unset), only when ``strategy.loss == "chunked"`` ``loss``, and only when ``strategy.lora_rank > 0``
    ``lora``.
    """
    if strategy.gradient_checkpointing:
        checkpointing = (
            'model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}) '
            "before deepspeed.initialize (newer transformers name it "
            'model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}))'
        )
    else:
        checkpointing = "off: do not call model.gradient_checkpointing_enable()"
    if strategy.empty_cache not in EMPTY_CACHE_POLICIES:  # pragma: no cover - Strategy validates this
        raise InputError(f"empty_cache must be one of {', '.join(EMPTY_CACHE_POLICIES)}")
    settings: dict[str, str] = {
        "gradient_checkpointing": checkpointing,
        "empty_cache": EMPTY_CACHE_PLACEMENT[strategy.empty_cache],
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if strategy.allocator == "expandable-segments" else "",
    }
    if strategy.loss == "chunked":
        settings["loss"] = (
            "chunked: the LM head and cross-entropy over chunks of tokens, never the whole logits. transformers "
            "Trainer / TRL: TrainingArguments(use_liger_kernel=True) (pip install liger-kernel: its fused linear "
            "cross-entropy); torchtune: loss=CEWithChunkedOutputLoss; your own loop: "
            "planner.runtime.chunked_causal_lm_loss(planner.runtime.causal_lm_hidden_states(model, input_ids), "
            "model.get_output_embeddings(), labels, model.config.vocab_size)"
        )
    if strategy.lora_rank > 0:
        rank = strategy.lora_rank
        settings["lora"] = (
            f"LoRA rank {rank} on every linear layer of the decoder blocks: "
            f'peft.get_peft_model(model, LoraConfig(r={rank}, target_modules="all-linear", '
            'task_type="CAUSAL_LM")) before deepspeed.initialize; the DeepSpeed config needs nothing extra'
        )
    if strategy.quantization != "none":
        settings["quantization"] = qlora_loading(
            strategy.quantization, None, zero_stage=strategy.zero_stage, offload_param=strategy.offload_param
        )
    return settings
