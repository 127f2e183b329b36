"""``planner recommend``: the fastest strategy predicted to fit. Exit 0 a plan fits, 1 nothing fits (the closest plan
is printed and saved all the same, with what would fit), 2 bad input."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.choices import AUTO, choices_metavar, choices_text
from planner.cli.options import Calibration, Db, Json, job_options
from planner.job.inputs import JobSpec
from store.choices import Quantization, RolloutEngine


@job_options()
def recommend_command(
    job: JobSpec,
    top: Annotated[int, typer.Option("--top", help="How many next-best strategies to show.")] = 3,
    lora_rank: Annotated[
        str, typer.Option("--lora-rank", help="auto (LoRA only if no full fine-tune fits), 0 (never) or a rank.")
    ] = "auto",
    quantization: Annotated[
        str,
        typer.Option(
            "--quantization",
            metavar=choices_metavar((AUTO, *Quantization)),
            help="Base weights under LoRA: auto (16-bit; QLoRA nf4 only if no 16-bit plan fits), "
            f"{choices_text(Quantization)}.",
        ),
    ] = "auto",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the Optuna sampler.")] = 0,
    json_out: Json = False,
    db: Db = None,
    calibration: Calibration = "auto",
    rollout: Annotated[
        str,
        typer.Option(
            "--rollout",
            metavar=choices_metavar((AUTO, *RolloutEngine)) + ",...",
            help="RLHF: what may generate the rollout: auto, or a comma-separated list of "
            f"{', '.join(RolloutEngine)} (hybrid-engine: DeepSpeed's own generation).",
        ),
    ] = "auto",
    program: Annotated[
        str | None,
        typer.Option(
            "--program",
            help="Your own program, as planner probe ... -- CMD stored it: its program id, or its script file. "
            "The plan keeps that program's measured spread of peak reserved free instead of the fixed 8%.",
        ),
    ] = None,
) -> int:
    """Recommend the memory strategy that fits at the least step time, and save it as a plan.

    Exit 0 when a strategy fits; 1 when none does (the closest is printed and saved, with what would fit);
    2 for bad input.

    Example: planner recommend --model opt-1.3b --gpu-mem 24G --workload sft
    Example: planner recommend --model opt-1.3b --gpu H100-80G --workload sft --program train.py
    """
    from planner.api import recommend

    plan = recommend(
        job,
        top=top,
        lora_rank=lora_rank,
        seed=seed,
        db=db,
        calibration=calibration,
        rollout=rollout,
        program=program,
        quantization=quantization,
    )
    if json_out:
        print(plan.to_json())
    else:
        from planner.report.text import render_plan

        render_plan(plan)
    return 0 if plan.fits else 1
