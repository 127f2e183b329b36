"""Reading a DeepSpeed config back into a Strategy (for ``planner check``). Pure Python.

Where deepspeed is installed, ``planner check`` first puts the config through DeepSpeed's own parser
(``launch.ds_config_deepspeed``), which hands this module the config as DeepSpeed reads it. Where it is not, this
module reads the raw config and refuses what DeepSpeed refuses in the blocks it reads (``fp16``, ``bf16``,
``zero_optimization`` and its offload blocks: unknown keys, blocks that are not objects, both precisions
enabled), reading booleans as DeepSpeed's pydantic models do (``"yes"``, ``"on"``, ``1`` are true).
"""

from __future__ import annotations

from typing import Any

from store.ds_buckets import buckets_from_zero_config
from store.ds_defaults import memplan_buckets
from store.errors import InputError, refuse_unknown_keys
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
    return str(device)


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu")

# The keys DeepSpeed's pydantic models take (field names and aliases; deepspeed 0.19 runtime/precision_config.py,
# runtime/zero/config.py, runtime/zero/offload_config.py). tests/planner/test_check_deepspeed.py keeps them in step.
FP16_KEYS = (
    "enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
    "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads",
)  # fmt: skip
BF16_KEYS = (
    "enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads", "bf16_optimizer_states",
)  # fmt: skip
ZERO_KEYS = (
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "compute_grad_norm", "load_from_fp32_weights",
    "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "prefetch_bucket_size", "stage3_prefetch_bucket_size",
    "param_persistence_threshold", "stage3_param_persistence_threshold", "model_persistence_threshold",
    "stage3_model_persistence_threshold", "max_live_parameters", "stage3_max_live_parameters", "max_reuse_distance",
    "stage3_max_reuse_distance", "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
    "module_granularity_threshold", "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
    "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients",
    "parameter_alignment", "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module",
)  # fmt: skip
OFFLOAD_KEYS = {
    "offload_optimizer": (
        "device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write", "fast_init", "ratio",
        "super_offload", "cpuadam_cores_perc",
    ),
    "offload_param": ("device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"),
}  # fmt: skip
# pydantic's lax booleans (what DeepSpeed's models accept for a bool field), compared in lower case
TRUE_WORDS = ("1", "on", "t", "true", "y", "yes")
FALSE_WORDS = ("0", "f", "false", "n", "no", "off")


def ds_bool(value: Any, where: str) -> bool:
    """``value`` as DeepSpeed's pydantic models read a boolean: true/false, 0/1, or a word such as "yes"/"off"."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in TRUE_WORDS + FALSE_WORDS:
        return value.lower() in TRUE_WORDS
    raise InputError(f"ds_config: {where} must be true or false, not {value!r}")


def _block(config: dict[str, Any], name: str, known: tuple[str, ...], where: str | None = None) -> dict[str, Any]:
    """A sub-object DeepSpeed builds a pydantic model from: an object of known keys (``"auto"`` values are
    dropped, as DeepSpeed's models drop them); ``{}`` when it is left out."""
    where = where or name
    block = config.get(name, {})
    if not isinstance(block, dict):
        raise InputError(f"ds_config: {where} must be an object, not {json_type(block)}")
    refuse_unknown_keys((k for k, v in block.items() if v != "auto"), known, f"ds_config: {where}")
    return block


def json_type(value: Any) -> str:
    """How JSON names the type of ``value`` (for messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def is_enabled(block: dict[str, Any], name: str) -> bool:
    """Whether a precision block is enabled as DeepSpeed reads it (``"auto"``, which DeepSpeed drops, is not)."""
    value = block.get("enabled", False)
    return value != "auto" and ds_bool(value, f"{name}.enabled")


def precision_blocks(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``fp16`` and ``bf16`` blocks as DeepSpeed finds them (``bfloat16`` is the old name of ``bf16``, read
    where ``bf16`` is absent or null), each checked for its keys; both enabled is refused, as DeepSpeed does."""
    bf16_name = "bf16" if config.get("bf16") is not None else "bfloat16"
    blocks = {"fp16": _block(config, "fp16", FP16_KEYS), "bf16": _block(config, bf16_name, BF16_KEYS)}
    enabled = [name for name, block in blocks.items() if is_enabled(block, name)]
    if len(enabled) == 2:
        raise InputError("ds_config: fp16 and bf16 are both enabled; DeepSpeed trains in one of them")
    return blocks


def zero_block(config: dict[str, Any]) -> dict[str, Any]:
    """The ``zero_optimization`` block as DeepSpeed reads it: an object of known keys (``true``/``false`` is
    DeepSpeed's old spelling of stage 1/0), its offload blocks objects of known keys or null."""
    zero = config.get("zero_optimization", {})
    if isinstance(zero, bool):
        return {"stage": int(zero)}
    zero = _block(config, "zero_optimization", ZERO_KEYS)
    for name, known in OFFLOAD_KEYS.items():
        if zero.get(name) is not None:
            _block(zero, name, known, f"zero_optimization.{name}")
    zero = dict(zero)
    for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
        if old in zero and zero[old] != "auto":
            if new in zero:
                raise InputError(f"ds_config: zero_optimization: {old} (deprecated) and {new} cannot both be given")
            if ds_bool(zero.pop(old), f"zero_optimization.{old}"):
                zero[new] = {"device": "cpu"}
    for name in ("overlap_comm", "contiguous_gradients"):
        if zero.get(name) not in (None, "auto"):
            zero[name] = ds_bool(zero[name], f"zero_optimization.{name}")
    return zero


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
        assert total is not None  # given, or "auto" batch keys set it from auto_batch above
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
    precision_blocks(config)
    zero = zero_block(config)
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
    blocks = precision_blocks(config)
    for name in ("bf16", "fp16"):
        if is_enabled(blocks[name], name):
            return name
    return None if any(block.get("enabled") == "auto" for block in blocks.values()) else "fp32"
