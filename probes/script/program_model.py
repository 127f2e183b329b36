"""The program's model and engine as the script probe's hook reads them (:mod:`probes.script.wrapper`).

- :func:`apply_outside`: the settings that live outside the DeepSpeed config, applied to the program's model
  (gradient checkpointing) or checked (LoRA, ZeRO-3's ``zero.Init``, the chunked loss);
- :func:`ran_with` and :func:`contradictions`: what the engine really runs with, and where it differs from
  the plan;
- :func:`batch_size_of`: the batch size of one forward's inputs; :func:`load_config`: the program's config.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from probes.script.settings import ScriptProbeSettings

BATCH_KEYS = ("input_ids", "inputs_embeds", "pixel_values", "labels", "attention_mask")


def apply_outside(settings: ScriptProbeSettings, model: Any, applied: dict[str, Any]) -> list[str]:
    """Apply checkpointing; check LoRA and the loss. Returns one line per setting that cannot be applied;
    ``applied`` gets what was switched."""
    lines: list[str] = []
    kind = type(model).__name__
    lora = _lora_ranks(model) if model is not None else []
    if settings.lora_rank > 0 and not lora:
        lines.append(
            f"LoRA rank {settings.lora_rank}: the program builds no adapters ({kind} has no LoRA layers), "
            "and the hook cannot add them"
        )
    elif settings.lora_rank > 0 and any(r and r != settings.lora_rank for r in lora):
        lines.append(f"LoRA rank {settings.lora_rank}: the program's adapters have rank {lora}")
    elif settings.lora_rank == 0 and lora:
        lines.append("LoRA off: the program trains LoRA adapters, the plan trains every weight")
    stage = settings.zero_stage
    if stage is not None and stage != 3 and model is not None and zero_init(model):
        lines.append(
            f"ZeRO-{stage}: the program builds its model under ZeRO-3's zero.Init (its parameters are "
            "partitioned before deepspeed.initialize), which the hook cannot undo"
        )
    if settings.loss == "chunked":
        lines.append("chunked loss: the program computes its own loss on the whole logits; the hook cannot chunk")
    if settings.gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)
        keyword = "activation_checkpointing_kwargs"
        if enable is None:
            enable, keyword = getattr(model, "gradient_checkpointing_enable", None), "gradient_checkpointing_kwargs"
        if enable is None:
            lines.append(f"gradient checkpointing: {kind} has no gradient_checkpointing_enable()")
        else:
            with _quiet():
                enable(**{keyword: {"use_reentrant": False}})
            applied["gradient_checkpointing"] = "enabled"
    elif _checkpointing(model):
        disable = getattr(model, "activation_checkpointing_disable", None) or getattr(
            model, "gradient_checkpointing_disable", None
        )
        if disable is None:
            lines.append(f"gradient checkpointing off: {kind} checkpoints and has no way to turn it off")
        else:
            with _quiet():
                disable()
            applied["gradient_checkpointing"] = "disabled"
    return lines


def ran_with(engine: Any, world: int) -> dict[str, Any]:
    """What the engine really runs with, as the program sees it."""
    module = getattr(engine, "module", None)
    return {
        "engine": type(engine).__name__,
        "zero_stage": int(engine.zero_optimization_stage()),
        "micro_batch": int(engine.train_micro_batch_size_per_gpu()),
        "grad_accum": int(engine.gradient_accumulation_steps()),
        "train_batch_size": int(engine.train_batch_size()),
        "dtype": _dtype_of(engine),
        "offload_optimizer": _device_of(engine.zero_offload_optimizer()),
        "offload_param": _device_of(engine.zero_offload_param()),
        "world_size": int(getattr(engine, "dp_world_size", world)),
        "gradient_checkpointing": _checkpointing(module),
        "optimizer": type(getattr(engine, "optimizer", None)).__name__,
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }


def load_config(config: Any) -> dict[str, Any]:
    """The config the program passed, as a dict: a dict as it is, else DeepSpeed's own loader of a path."""
    if isinstance(config, dict):
        return config
    import deepspeed

    loader = getattr(deepspeed, "load_ds_config", None)
    if loader is not None:
        return dict(loader(config))
    return dict(json.loads(Path(config).read_text(encoding="utf-8")))


def contradictions(
    settings: ScriptProbeSettings, ran: dict[str, Any], batch_sizes: list[int], micro_steps: list[int]
) -> list[str]:
    """Where what the program really ran differs from the plan (one line each)."""
    lines: list[str] = []
    if settings.zero_stage is not None and ran.get("zero_stage") != settings.zero_stage:
        lines.append(f"the engine runs ZeRO-{ran.get('zero_stage')} (the plan: ZeRO-{settings.zero_stage})")
    if settings.micro_batch is not None:
        if ran.get("micro_batch") != settings.micro_batch:
            lines.append(f"the engine's micro-batch is {ran.get('micro_batch')} (the plan: {settings.micro_batch})")
        if batch_sizes and max(batch_sizes) != settings.micro_batch:
            sizes = sorted(set(batch_sizes))
            lines.append(f"the program feeds micro-batches of {sizes} (the plan: {settings.micro_batch})")
    if settings.grad_accum is not None and micro_steps:
        counts = sorted(set(micro_steps))
        if counts != [settings.grad_accum]:
            lines.append(
                f"the program steps the optimizer every {counts} micro-batches "
                f"(the plan accumulates {settings.grad_accum})"
            )
    if settings.dtype is not None and ran.get("dtype") != settings.dtype:
        lines.append(f"the engine computes in {ran.get('dtype')} (the plan: {settings.dtype})")
    if settings.world_size and ran.get("world_size") not in (None, settings.world_size):
        ranks = ran.get("world_size")
        lines.append(f"the program runs {ranks} data-parallel ranks (the plan: {settings.world_size})")
    if settings.device == "cuda":
        wanted = "expandable_segments:True" if settings.allocator == "expandable-segments" else ""
        found = ran.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if found != wanted:
            lines.append(f"PYTORCH_CUDA_ALLOC_CONF is {found!r} (the plan: {wanted!r})")
    return lines


def batch_size_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The batch size of a forward's inputs: the first dimension of ``input_ids`` (or another input key), else
    of the first tensor among the arguments (a dict argument is looked into); None when there is no tensor."""
    import torch

    def first(values: Any) -> int | None:
        for value in values:
            if isinstance(value, torch.Tensor) and value.dim() >= 1:
                return int(value.shape[0])
            if isinstance(value, dict):
                found = by_key(value) or first(value.values())
                if found is not None:
                    return found
        return None

    def by_key(mapping: dict[str, Any]) -> int | None:
        return first(mapping[key] for key in BATCH_KEYS if key in mapping)

    return by_key(kwargs) or first(args) or first(kwargs.values())


def _device_of(block: Any) -> str:
    if block is None:
        return "none"
    device = getattr(block, "device", "none")
    return str(getattr(device, "value", device))


def _dtype_of(engine: Any) -> str:
    if engine.bfloat16_enabled():
        return "bf16"
    return "fp16" if engine.fp16_enabled() else "fp32"


def _checkpointing(model: Any) -> bool | None:
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or hasattr(model, name):
            with contextlib.suppress(Exception), _quiet():
                return bool(getattr(model, name))
    return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers 5 warns that the gradient_checkpointing names are deprecated: not the program's doing."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def zero_init(model: Any) -> bool:
    """Whether the model's parameters were built partitioned, under ZeRO-3's ``zero.Init``: only
    ``zero.Init`` (``runtime/zero/partition_parameters.py``, ``_convert_to_deepspeed_param``) gives a parameter
    its ``ds_id`` before ``deepspeed.initialize``."""
    parameters = getattr(model, "parameters", None)
    return parameters is not None and any(hasattr(p, "ds_id") for p in parameters())


def model_build_seen(model_zero_init: bool | None, program_config: Any) -> dict[str, Any]:
    """What the hook saw of the program's model build, kept in ``ran_with``: ``model_zero_init``, whether the model
    it handed to ``deepspeed.initialize`` was already partitioned (None: no model was handed); and
    ``program_zero_stage``, the ZeRO stage of the program's own config (before the plan's keys were merged in),
    which is what a Trainer or Accelerate reads to decide on ``zero.Init`` (None: not said)."""
    zero = program_config.get("zero_optimization") if isinstance(program_config, dict) else None
    stage = zero.get("stage") if isinstance(zero, dict) else None
    return {"model_zero_init": model_zero_init, "program_zero_stage": stage if isinstance(stage, int) else None}


def _lora_ranks(model: Any) -> list[int]:
    """The ranks of the LoRA adapters a (PEFT) model carries; empty without adapters."""
    ranks: set[int] = set()
    configs = getattr(model, "peft_config", None)
    if isinstance(configs, dict):
        for config in configs.values():
            rank = getattr(config, "r", None)
            if isinstance(rank, int):
                ranks.add(rank)
    if not ranks and hasattr(model, "named_modules"):
        for name, _ in model.named_modules():
            if name.rsplit(".", 1)[-1] in ("lora_A", "lora_B"):
                ranks.add(0)  # adapters of a rank not said
                break
    return sorted(ranks)
