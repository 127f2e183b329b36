"""``planner check``: does this DeepSpeed config fit? Exit 0 fits, 1 does not, 2 bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli.choices import choices_metavar, choices_text
from planner.cli.options import Calibration, Db, Json, job_options
from planner.job.inputs import CONFIG_WORKLOAD, JobSpec
from store.choices import AllocatorSetting, EmptyCachePolicyName, Quantization

# The config sets the batch; it trains one model, so the RLHF-only options do not apply.
# --batch stays: it fills a transformers config's "auto" batch keys (and must agree with a config's own batch)
NOT_IN_A_CONFIG = (
    "prompt_len",
    "gen_len",
    "critic_model",
    "reward_model",
    "ppo_epochs",
    "samples_per_prompt",
    "kl_coef",
)
# What planner export wrote beside the config (planner.planning.outside): the plan's knobs outside DeepSpeed's keys.
EXPORTED = "the plan's, from <config>.memplan.json beside a config planner export wrote"


@job_options(omit=NOT_IN_A_CONFIG, defaults={"workload": CONFIG_WORKLOAD})
def check_command(
    job: JobSpec,
    ds_config: Annotated[Path, typer.Argument(help="The ds_config.json to check.")],
    grad_ckpt: Annotated[
        bool | None,
        typer.Option("--grad-ckpt/--no-grad-ckpt", help=f"The model uses checkpointing (default: {EXPORTED}, or off)."),
    ] = None,
    lora_rank: Annotated[
        int | None, typer.Option("--lora-rank", help=f"LoRA rank, 0: full fine-tune (default: {EXPORTED}, or 0).")
    ] = None,
    empty_cache: Annotated[
        str | None,
        typer.Option(
            "--empty-cache",
            metavar=choices_metavar(EmptyCachePolicyName),
            help=f"Where empty_cache() is called (default: {EXPORTED}, or never).",
        ),
    ] = None,
    allocator: Annotated[
        str | None,
        typer.Option(
            "--allocator",
            metavar=choices_metavar(AllocatorSetting),
            help=f"{choices_text(AllocatorSetting)} (default: {EXPORTED}, or default).",
        ),
    ] = None,
    quantization: Annotated[
        str | None,
        typer.Option(
            "--quantization",
            metavar=choices_metavar(Quantization),
            help=f"QLoRA's base weights: {choices_text(Quantization)} (default: {EXPORTED}, or none).",
        ),
    ] = None,
    json_out: Json = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the verdict.")] = False,
    db: Db = None,
    calibration: Calibration = "auto",
) -> int:
    """Check whether a DeepSpeed config is predicted to fit: exit 0 fits, 1 does not fit, 2 bad input.

    The config means what it means to DeepSpeed: its own parser reads it where deepspeed is installed, and a
    config DeepSpeed refuses is bad input. A config that planner export wrote brings its plan's LoRA rank,
    checkpointing, empty_cache, allocator and quantization (ds_config.memplan.json beside it): an option that
    contradicts them is bad input.

    Example: planner check ds_config.json --model opt-1.3b --gpu-mem 24G --seq-len 512
    """
    from planner.api import check

    result = check(
        ds_config,
        job,
        gradient_checkpointing=grad_ckpt,
        lora_rank=lora_rank,
        empty_cache=empty_cache,
        allocator=allocator,
        quantization=quantization,
        calibration=calibration,
        db=db,
    )
    if json_out:
        print(result.model_dump_json(indent=2))
    elif quiet:
        print("fits" if result.fits else "does not fit: " + "; ".join(result.reasons))
    else:
        from planner.report.text import render_check

        render_check(result)
    return 0 if result.fits else 1
