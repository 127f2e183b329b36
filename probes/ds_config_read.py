"""Reading a DeepSpeed config back into a Strategy (for ``planner check``). Pure Python."""

from __future__ import annotations

from typing import Any

from store.ds_buckets import buckets_from_zero_config
from store.ds_defaults import memplan_buckets
from store.errors import InputError
from store.records import Strategy


def _positive(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"ds_config: {key} must be a whole number larger than zero, not {value!r}")
    return value


def _device(block: Any, name: str) -> str:
    if block is None:
        return "none"
    if not isinstance(block, dict):
        raise InputError(f"ds_config: zero_optimization.{name} must be an object")
    device = block.get("device", "none")
    if device not in ("none", "cpu", "nvme"):
        raise InputError(f"ds_config: zero_optimization.{name}.device must be none, cpu or nvme, not {device!r}")
    return device


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu")


def strategy_from_ds_config(
    config: Any,
    world_size: int,
    *,
    hidden_size: int | None = None,
    auto_batch: int | None = None,
    **outside: Any,
) -> tuple[Strategy, int]:
    """(strategy, global batch) that a DeepSpeed config runs on ``world_size`` GPUs.

    ``outside`` carries the knobs that are not DeepSpeed keys (``gradient_checkpointing``, ``lora_rank``,
    ``empty_cache``, ``allocator``). Any two of train_batch_size, micro batch and accumulation steps
    determine the third, as in DeepSpeed. Under ZeRO the strategy keeps the config's bucket settings
    (``Strategy.ds_buckets``: DeepSpeed's defaults for keys left out, ``"auto"`` as transformers fills it from
    the model's ``hidden_size``), so that the buffers counted are the ones this config makes. A transformers
    config whose batch keys are all ``"auto"`` (the Trainer fills them from its arguments) runs ``auto_batch``
    samples per step over all GPUs, ``gradient_accumulation_steps`` (1 when ``"auto"``) micro-batches each.
    """
    if not isinstance(config, dict):
        raise InputError("ds_config: expected a JSON object")
    total = _positive(config, "train_batch_size")
    micro = _positive(config, "train_micro_batch_size_per_gpu")
    accum = _positive(config, "gradient_accumulation_steps")
    if micro is None and total is None:
        if auto_batch is None or not any(config.get(key) == "auto" for key in BATCH_KEYS):
            raise InputError("ds_config: needs train_batch_size or train_micro_batch_size_per_gpu")
        accum = accum or 1
        if auto_batch % (accum * world_size):
            raise InputError(
                f'ds_config: the batch keys are "auto": --batch {auto_batch} does not split over {world_size} GPUs'
                f" x {accum} accumulation steps"
            )
        total = auto_batch
    if micro is None:
        accum = accum or 1
        if total % (accum * world_size):
            raise InputError(f"ds_config: train_batch_size {total} does not split over {world_size} GPUs x {accum}")
        micro = total // (accum * world_size)
    if accum is None:
        if total is None:
            accum = 1
        elif total % (micro * world_size):
            raise InputError(f"ds_config: train_batch_size {total} is not a multiple of {micro} x {world_size} GPUs")
        else:
            accum = total // (micro * world_size)
    if total is not None and total != micro * accum * world_size:
        raise InputError(
            f"ds_config: train_batch_size {total} != micro batch {micro} x accumulation {accum} x {world_size} GPUs"
        )
    zero = config.get("zero_optimization", {}) or {}
    if not isinstance(zero, dict):
        raise InputError("ds_config: zero_optimization must be an object")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise InputError(f"ds_config: zero_optimization.stage must be 0-3, not {stage!r}")
    buckets = None
    if stage:
        auto = [key for key, value in zero.items() if value == "auto"]
        if auto and hidden_size is None:
            raise InputError(f'ds_config: zero_optimization.{auto[0]} is "auto", which needs the model\'s hidden size')
        buckets = buckets_from_zero_config(zero, stage, hidden_size or 0)
        if hidden_size is not None and buckets == memplan_buckets(hidden_size, stage):
            buckets = None  # memplan's own export: the same strategy as the plan it came from
    strategy = Strategy(
        zero_stage=stage,
        offload_optimizer=_device(zero.get("offload_optimizer"), "offload_optimizer"),
        offload_param=_device(zero.get("offload_param"), "offload_param"),
        micro_batch=micro,
        grad_accum=accum,
        ds_buckets=buckets,
        **{k: v for k, v in outside.items() if v is not None},
    )
    return strategy, micro * accum * world_size


def dtype_of_ds_config(config: dict[str, Any]) -> str | None:
    """The training dtype a config enables: bf16, fp16 or fp32; None where it leaves it to transformers
    (``"enabled": "auto"``, filled from the Trainer's ``--bf16`` / ``--fp16``: the job's dtype)."""
    auto = False
    for name in ("bf16", "fp16"):
        block = config.get(name) or {}
        if isinstance(block, dict) and block.get("enabled") is True:
            return name
        auto = auto or (isinstance(block, dict) and block.get("enabled") == "auto")
    return None if auto else "fp32"
