"""``planner predict``: the prediction of one fixed strategy."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.choices import choices_metavar, choices_text
from planner.cli.options import Calibration, Db, Json, job_options
from planner.job.inputs import JobSpec
from store.choices import AllocatorSetting, EmptyCachePolicyName, OffloadDevice, Quantization

KNOBS = "Strategy"


StrategyJson = Annotated[
    str | None, typer.Option("--strategy", help="Strategy as JSON or a JSON file.", rich_help_panel=KNOBS)
]
Zero = Annotated[int | None, typer.Option("--zero", help="ZeRO stage 0-3.", rich_help_panel=KNOBS)]
OffloadOptimizer = Annotated[
    str | None,
    typer.Option(
        "--offload-optimizer",
        metavar=choices_metavar(OffloadDevice),
        help=f"{choices_text(OffloadDevice)}.",
        rich_help_panel=KNOBS,
    ),
]
OffloadParam = Annotated[
    str | None,
    typer.Option(
        "--offload-param",
        metavar=choices_metavar(OffloadDevice),
        help=f"{choices_text(OffloadDevice)} (ZeRO-3).",
        rich_help_panel=KNOBS,
    ),
]
GradCkpt = Annotated[
    bool | None, typer.Option("--grad-ckpt/--no-grad-ckpt", help="Gradient checkpointing.", rich_help_panel=KNOBS)
]
LoraRank = Annotated[int | None, typer.Option("--lora-rank", help="LoRA rank (0: full).", rich_help_panel=KNOBS)]
Quantize = Annotated[
    str | None,
    typer.Option(
        "--quantization",
        metavar=choices_metavar(Quantization),
        help=f"Base weights under LoRA: {choices_text(Quantization)} (QLoRA).",
        rich_help_panel=KNOBS,
    ),
]
MicroBatch = Annotated[
    int | None,
    typer.Option(
        "--micro-batch", help="Per-GPU micro-batch (accumulation keeps the global batch).", rich_help_panel=KNOBS
    ),
]
EmptyCache = Annotated[
    str | None,
    typer.Option(
        "--empty-cache",
        metavar=choices_metavar(EmptyCachePolicyName),
        help=f"{choices_text(EmptyCachePolicyName)}.",
        rich_help_panel=KNOBS,
    ),
]
Allocator = Annotated[
    str | None,
    typer.Option(
        "--allocator",
        metavar=choices_metavar(AllocatorSetting),
        help=f"{choices_text(AllocatorSetting)}.",
        rich_help_panel=KNOBS,
    ),
]


@job_options()
def predict_command(
    job: JobSpec,
    strategy: StrategyJson = None,
    zero: Zero = None,
    offload_optimizer: OffloadOptimizer = None,
    offload_param: OffloadParam = None,
    grad_ckpt: GradCkpt = None,
    lora_rank: LoraRank = None,
    quantization: Quantize = None,
    micro_batch: MicroBatch = None,
    empty_cache: EmptyCache = None,
    allocator: Allocator = None,
    json_out: Json = False,
    db: Db = None,
    calibration: Calibration = "auto",
) -> int:
    """Predict peak memory, host memory and step time of one fixed strategy.

    Example: planner predict --model opt-1.3b --gpu-mem 24G --workload sft --zero 2 --grad-ckpt --micro-batch 4
    """
    from planner.api import predict
    from planner.files.atomic import read_strategy

    data = read_strategy(strategy)
    flags = {
        "zero_stage": zero,
        "offload_optimizer": offload_optimizer,
        "offload_param": offload_param,
        "gradient_checkpointing": grad_ckpt,
        "lora_rank": lora_rank,
        "quantization": quantization,
        "micro_batch": micro_batch,
        "empty_cache": empty_cache,
        "allocator": allocator,
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    if micro_batch is not None:
        data.pop("grad_accum", None)  # a new micro-batch keeps the global batch: predict() derives the accumulation
    report = predict(job, data, calibration=calibration, db=db)
    if json_out:
        print(report.to_json())
    else:
        from planner.report.text import render_prediction

        render_prediction(report)
    return 0
