"""Hugging Face ``Trainer``: ``TrainingArguments(deepspeed=...)`` and the DeepSpeed config it takes.

transformers' integration (``transformers/integrations/deepspeed.py``, ``HfTrainerDeepSpeedConfig``) fills the
config's ``"auto"`` values from ``TrainingArguments`` in ``trainer_config_process`` (and refuses a concrete
value that disagrees with them). The config written here is the planner's own with exactly those keys set
to ``"auto"`` (:data:`AUTO_KEYS`), and the ``TrainingArguments`` keywords carry the plan's values for them. The
memory-sizing keys (ZeRO stage, buckets, offload) stay concrete: the ``"auto"`` bucket sizes transformers
would pick (hidden x hidden) differ from the planner's for ZeRO-1/2.

TRL's configs (``SFTConfig``, ``DPOConfig``, ``GRPOConfig`` ...) subclass ``TrainingArguments`` and take the same
keywords and config (:mod:`launch.frameworks.trl`); so does ``accelerate launch`` with a config file
(:mod:`launch.frameworks.accelerate`).
"""

from __future__ import annotations

import copy
from typing import Any

from launch.common import (
    Rendered,
    allocator_env,
    comment_block,
    gap_comments,
    json_text,
    python_kwargs,
    single_model_only,
)
from launch.ds_config import ADAM_BETAS, ADAM_EPS, render_ds_config
from store.ds_defaults import GRADIENT_CLIPPING, LEARNING_RATE, WEIGHT_DECAY
from store.framework_packages import packages_needed
from store.quantization import qlora_loading
from store.records import Hardware, Strategy, Workload
from store.workload_kinds import traits

# The config keys HfTrainerDeepSpeedConfig.trainer_config_process fills from TrainingArguments (dotted paths).
AUTO_KEYS: tuple[str, ...] = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "fp16.enabled",
    "bf16.enabled",
)
OUTPUT_DIR = "<OUTPUT_DIR: where the Trainer writes checkpoints>"


def auto_ds_config(strategy: Strategy, workload: Workload, hardware: Hardware) -> dict[str, Any]:
    """The planner's DeepSpeed config with :data:`AUTO_KEYS` set to ``"auto"`` (present keys only)."""
    config = copy.deepcopy(render_ds_config(strategy, workload, hardware))
    for path in AUTO_KEYS:
        *parents, leaf = path.split(".")
        node: Any = config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node[leaf] = "auto"
    return config


def training_kwargs(strategy: Strategy, workload: Workload, ds_config_path: str | None) -> dict[str, Any]:
    """``TrainingArguments`` keywords that carry the plan (the values behind the config's ``"auto"``)."""
    kwargs: dict[str, Any] = {
        "output_dir": OUTPUT_DIR,
        "per_device_train_batch_size": strategy.micro_batch,
        "gradient_accumulation_steps": strategy.grad_accum,
        "max_grad_norm": GRADIENT_CLIPPING,
        "learning_rate": LEARNING_RATE,
        "adam_beta1": ADAM_BETAS[0],
        "adam_beta2": ADAM_BETAS[1],
        "adam_epsilon": ADAM_EPS,
        "weight_decay": WEIGHT_DECAY,
        "bf16": workload.dtype == "bf16",
        "fp16": workload.dtype == "fp16",
        # transformers 5.23 (training_args.py, TrainingArguments.__post_init__): gradient_checkpointing(_kwargs) are
        # deprecated aliases of activation_checkpointing(_kwargs). Always given, False too: TRL's _BaseConfig
        # (trl/trainer/base_config.py) defaults gradient_checkpointing to True, which the new name overrides.
        "activation_checkpointing": strategy.gradient_checkpointing,
    }
    if strategy.gradient_checkpointing:
        kwargs["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if strategy.empty_cache == "every-step":
        kwargs["torch_empty_cache_steps"] = 1
    if strategy.loss == "chunked":
        kwargs["use_liger_kernel"] = True
    if ds_config_path is not None:
        kwargs["deepspeed"] = ds_config_path
    return kwargs


def single_model_gaps(strategy: Strategy, framework: str) -> list[str]:
    """What a TrainingArguments-based trainer cannot say of a single-model plan."""
    gaps: list[str] = []
    if strategy.empty_cache not in ("never", "every-step"):
        gaps.append(
            f"{framework} empties the cache every N optimizer steps (torch_empty_cache_steps) only; the plan's "
            f"empty_cache {strategy.empty_cache!r} has no setting"
        )
    return gaps


def setup_notes(strategy: Strategy, hardware: Hardware, dtype: str = "bf16") -> list[str]:
    """What the user does beside the keywords: LoRA (QLoRA's quantized loading in ``dtype``), the allocator, the
    launch."""
    notes = [
        f"launch on {hardware.nodes} x {hardware.gpus} GPUs: deepspeed --num_nodes {hardware.nodes} --num_gpus "
        f"{hardware.gpus} train.py (or torchrun / accelerate launch with as many processes)",
    ]
    if strategy.lora_rank:
        notes.append(
            f"LoRA rank {strategy.lora_rank}: peft.get_peft_model(model, LoraConfig(r={strategy.lora_rank}, "
            'target_modules="all-linear", task_type="CAUSAL_LM")) before the Trainer (TRL: peft_config=)'
        )
    if strategy.quantization != "none":
        notes.append(
            qlora_loading(
                strategy.quantization, dtype, zero_stage=strategy.zero_stage, offload_param=strategy.offload_param
            )
        )
    notes += [f"export {name}={value} before launching" for name, value in allocator_env(strategy).items()]
    return notes


def render(strategy: Strategy, workload: Workload, hardware: Hardware, paths: dict[str, str]) -> Rendered:
    """The ``"auto"`` DeepSpeed config and a ``TrainingArguments`` snippet that points at it."""
    single_model_only("hf", workload)
    gaps = single_model_gaps(strategy, "transformers' Trainer")
    if traits(workload.kind).reference_forward:
        gaps.append("transformers' Trainer has no DPO loss: run these arguments through TRL (--format trl, DPOConfig)")
    notes = setup_notes(strategy, hardware, workload.dtype)
    notes += [package.note() for package in packages_needed("hf", strategy.loss)]  # store.framework_packages
    kwargs = training_kwargs(strategy, workload, paths["ds_config"])
    snippet = comment_block(
        [
            f"Hugging Face TrainingArguments for this plan: {workload.kind} of {workload.model.name} on "
            f"{hardware.nodes} x {hardware.gpus} GPUs; {paths['ds_config']} holds the DeepSpeed config, whose",
            '"auto" values transformers fills from these arguments.',
            *notes,
        ]
    )
    snippet += gap_comments(gaps, "transformers' Trainer") + "\nfrom transformers import TrainingArguments\n\n"
    snippet += python_kwargs("training_kwargs", kwargs) + "args = TrainingArguments(**training_kwargs)\n"
    files = {"ds_config": json_text(auto_ds_config(strategy, workload, hardware)), "training_args": snippet}
    return Rendered("hf", files, tuple(gaps), tuple(notes))
