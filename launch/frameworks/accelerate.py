"""``accelerate launch --config_file``: an accelerate config (YAML) that runs a single-model plan under DeepSpeed.

The config points at a DeepSpeed config file (``deepspeed_config: {deepspeed_config_file: ...}``) rather than
accelerate's inline keys (``zero_stage``, ``offload_optimizer_device`` ...): the inline form cannot carry the
planner's bucket sizes, and accelerate fills the rest with ``"auto"`` values sized differently. The file is the
``"auto"`` config of :mod:`launch.frameworks.hf` with the keys accelerate's own loop does not fill written concrete
(:data:`CONCRETE_KEYS`); accelerate (and a ``Trainer`` under it) fills the others from the training script.
With a config file accelerate refuses ``mixed_precision``, ``gradient_accumulation_steps``,
``gradient_clipping``, ``zero_stage`` and the offload keys beside it (``DeepSpeedPlugin._deepspeed_config_checks``),
so the YAML has none of them: the DeepSpeed config and the script carry them.

Field names follow accelerate 1.15's ``commands/config/config_args.py`` (``ClusterConfig``) and the
``deepspeed_config`` keys its questionnaire (``commands/config/cluster.py``) writes.
"""

from __future__ import annotations

from typing import Any

from launch.common import (
    Rendered,
    comment_block,
    gap_comments,
    json_text,
    single_model_only,
    yaml_text,
)
from launch.ds_config import render_ds_config
from launch.frameworks.hf import auto_ds_config, setup_notes, single_model_gaps
from store.records import Hardware, Strategy, Workload

VERSION = "1.15.0"
# The "auto" keys of launch.frameworks.hf.AUTO_KEYS that accelerate's own loop never fills, written concrete here
# (the plan's values; a Trainer under accelerate launch fills them from the same TrainingArguments and finds them
# equal). accelerate 1.15 ``Accelerator._prepare_deepspeed`` fills train_micro_batch_size_per_gpu and
# train_batch_size (the dataloader), gradient_accumulation_steps (the Accelerator), gradient_clipping (1.0) and, for
# a DummyOptim, only optimizer.params.lr and weight_decay; ``DeepSpeedPlugin.fill_match`` raises "`optimizer.params.
# betas` not found in kwargs" for any other "auto". ``DeepSpeedPlugin.set_mixed_precision`` fills fp16/bf16.enabled
# from the Accelerator's mixed_precision, "no" unless given, which the YAML cannot carry beside a DeepSpeed config
# file (``_deepspeed_config_checks``): an "auto" bf16 would train in fp32.
CONCRETE_KEYS: tuple[str, ...] = (
    "gradient_clipping",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "fp16.enabled",
    "bf16.enabled",
)


def ds_config(strategy: Strategy, workload: Workload, hardware: Hardware) -> dict[str, Any]:
    """The DeepSpeed config the accelerate YAML points at: "auto" only where accelerate's own loop fills the value
    (:data:`CONCRETE_KEYS` hold the plan's)."""
    auto = auto_ds_config(strategy, workload, hardware)
    planned = render_ds_config(strategy, workload, hardware)
    for path in CONCRETE_KEYS:
        *parents, leaf = path.split(".")
        node: Any = auto
        source: Any = planned
        for part in parents:
            node, source = node.get(part, {}), source.get(part, {})
        if leaf in node and leaf in source:
            node[leaf] = source[leaf]
    return auto


def config(strategy: Strategy, workload: Workload, hardware: Hardware, ds_config_path: str) -> dict[str, Any]:
    """The accelerate config for the plan (the keys ``accelerate config`` would write)."""
    deepspeed: dict[str, Any] = {
        "deepspeed_config_file": ds_config_path,
        "zero3_init_flag": strategy.zero_stage == 3,
    }
    if hardware.nodes > 1:
        deepspeed["deepspeed_multinode_launcher"] = "standard"
    return {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "deepspeed_config": deepspeed,
        "distributed_type": "DEEPSPEED",
        "downcast_bf16": False,
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": hardware.nodes,
        "num_processes": hardware.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }


def render(strategy: Strategy, workload: Workload, hardware: Hardware, paths: dict[str, str]) -> Rendered:
    """The accelerate YAML and the ``"auto"`` DeepSpeed config it points at."""
    single_model_only("accelerate", workload)
    gaps = single_model_gaps(strategy, "accelerate")
    notes = [
        f"in the script: per-GPU batch {strategy.micro_batch}, gradient_accumulation_steps {strategy.grad_accum}, "
        f"{workload.dtype} (Trainer: the TrainingArguments of --format hf; own loop: "
        f"Accelerator(gradient_accumulation_steps={strategy.grad_accum}) and accelerate.utils.DummyOptim for the "
        "config's optimizer)",
        *setup_notes(strategy, hardware)[1:],
    ]
    if strategy.gradient_checkpointing:
        notes.append(
            'own loop: model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": '
            "False}) before accelerator.prepare (transformers before 5.23: gradient_checkpointing_enable)"
        )
    if hardware.nodes > 1:
        notes.append("on each node: accelerate launch --config_file ... --machine_rank R --main_process_ip HEAD")
    text = comment_block(
        [
            f"accelerate {VERSION} config for this plan: {workload.kind} of {workload.model.name} on "
            f"{hardware.nodes} x {hardware.gpus} GPUs; run: accelerate launch --config_file THIS_FILE train.py",
            *notes,
        ]
    )
    text += gap_comments(gaps, "accelerate") + yaml_text(config(strategy, workload, hardware, paths["ds_config"]))
    files = {"config": text, "ds_config": json_text(ds_config(strategy, workload, hardware))}
    return Rendered("accelerate", files, tuple(gaps), tuple(notes))
