"""``planner predict``: the prediction of one fixed strategy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from planner.cli.options import (
    AttnImpl,
    Batch,
    CpuMem,
    CriticModel,
    Dtype,
    GenLen,
    Gpu,
    GpuMem,
    Gpus,
    Json,
    Model,
    Nodes,
    NvmePath,
    PpoEpochs,
    PromptLen,
    RefModel,
    RewardModel,
    SafetyMargin,
    SamplesPerPrompt,
    SeqLen,
    WorkloadKind,
    job_keywords,
)
from store.errors import InputError

KNOBS = "Strategy"


def read_strategy(text: str | None) -> dict[str, Any]:
    """A strategy from inline JSON or from a JSON file."""
    if text is None:
        return {}
    source = text
    if not text.lstrip().startswith("{"):
        from planner.files import read_json_file

        data = read_json_file(Path(text), "--strategy")
    else:
        try:
            data = json.loads(source)
        except json.JSONDecodeError as exc:
            raise InputError(f"--strategy: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise InputError("--strategy: expected a JSON object")
    return data


def predict_command(
    model: Model,
    gpu_mem: GpuMem = None,
    workload: WorkloadKind = "sft",
    gpu: Gpu = None,
    gpus: Gpus = 1,
    nodes: Nodes = 1,
    cpu_mem: CpuMem = None,
    batch: Batch = None,
    seq_len: SeqLen = None,
    prompt_len: PromptLen = None,
    gen_len: GenLen = None,
    dtype: Dtype = None,
    attn_impl: AttnImpl = "sdpa",
    ref_model: RefModel = None,
    critic_model: CriticModel = None,
    reward_model: RewardModel = None,
    nvme_path: NvmePath = None,
    safety_margin: SafetyMargin = 0.05,
    ppo_epochs: PpoEpochs = 1,
    samples_per_prompt: SamplesPerPrompt = None,
    strategy: Annotated[
        str | None, typer.Option("--strategy", help="Strategy as JSON or a JSON file.", rich_help_panel=KNOBS)
    ] = None,
    zero: Annotated[int | None, typer.Option("--zero", help="ZeRO stage 0-3.", rich_help_panel=KNOBS)] = None,
    offload_optimizer: Annotated[
        str | None, typer.Option("--offload-optimizer", help="none, cpu or nvme.", rich_help_panel=KNOBS)
    ] = None,
    offload_param: Annotated[
        str | None, typer.Option("--offload-param", help="none, cpu or nvme (ZeRO-3).", rich_help_panel=KNOBS)
    ] = None,
    grad_ckpt: Annotated[
        bool | None,
        typer.Option("--grad-ckpt/--no-grad-ckpt", help="Gradient checkpointing.", rich_help_panel=KNOBS),
    ] = None,
    lora_rank: Annotated[
        int | None, typer.Option("--lora-rank", help="LoRA rank (0: full).", rich_help_panel=KNOBS)
    ] = None,
    micro_batch: Annotated[
        int | None, typer.Option("--micro-batch", help="Per-GPU micro-batch.", rich_help_panel=KNOBS)
    ] = None,
    empty_cache: Annotated[
        str | None,
        typer.Option("--empty-cache", help="never, after-inference, after-phase, every-step.", rich_help_panel=KNOBS),
    ] = None,
    allocator: Annotated[
        str | None, typer.Option("--allocator", help="default or expandable-segments.", rich_help_panel=KNOBS)
    ] = None,
    json_out: Json = False,
) -> int:
    """Predict peak memory, host memory and step time of one fixed strategy.

    Example: planner predict --model opt-1.3b --gpu-mem 24G --zero 2 --grad-ckpt --micro-batch 4
    """
    from planner.api import predict

    options = job_keywords(**locals())
    data = read_strategy(strategy)
    flags = {
        "zero_stage": zero,
        "offload_optimizer": offload_optimizer,
        "offload_param": offload_param,
        "gradient_checkpointing": grad_ckpt,
        "lora_rank": lora_rank,
        "micro_batch": micro_batch,
        "empty_cache": empty_cache,
        "allocator": allocator,
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    if micro_batch is not None or "grad_accum" not in data:
        data.pop("grad_accum", None)
        data["grad_accum"] = _accumulation(model, options, data)
    report = predict(model, data, **options)
    if json_out:
        print(report.to_json())
    else:
        from planner.render import render_prediction

        render_prediction(report)
    return 0


def _accumulation(model: str, options: dict[str, Any], data: dict[str, Any]) -> int:
    """Accumulation steps that keep the global batch, given the micro-batch."""
    from planner.inputs import JobSpec, resolve
    from search.batches import per_gpu_batch

    job = resolve(JobSpec(model=model, **options))
    per_gpu = per_gpu_batch(job.workload, job.hardware)
    micro = data.setdefault("micro_batch", per_gpu)
    if not isinstance(micro, int) or micro <= 0 or per_gpu % micro:
        raise InputError(f"--micro-batch {micro} does not divide the {per_gpu} samples per GPU of the global batch")
    return per_gpu // micro
