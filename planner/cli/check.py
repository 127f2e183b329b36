"""``planner check``: does this DeepSpeed config fit? Exit 0 fits, 1 does not, 2 bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli.options import (
    AttnImpl,
    CpuMem,
    Dtype,
    Gpu,
    GpuMem,
    Gpus,
    Json,
    Model,
    Nodes,
    NvmePath,
    RefModel,
    SafetyMargin,
    SeqLen,
    WorkloadKind,
    job_keywords,
)


def check_command(
    ds_config: Annotated[Path, typer.Argument(help="The ds_config.json to check.")],
    model: Model,
    gpu_mem: GpuMem = None,
    workload: WorkloadKind = "sft",
    gpu: Gpu = None,
    gpus: Gpus = 1,
    nodes: Nodes = 1,
    cpu_mem: CpuMem = None,
    seq_len: SeqLen = None,
    dtype: Dtype = None,
    attn_impl: AttnImpl = "sdpa",
    ref_model: RefModel = None,
    nvme_path: NvmePath = None,
    safety_margin: SafetyMargin = 0.05,
    grad_ckpt: Annotated[
        bool, typer.Option("--grad-ckpt/--no-grad-ckpt", help="The model uses checkpointing.")
    ] = False,
    lora_rank: Annotated[int, typer.Option("--lora-rank", help="LoRA rank (0: full fine-tune).")] = 0,
    empty_cache: Annotated[str, typer.Option("--empty-cache", help="Where empty_cache() is called.")] = "never",
    allocator: Annotated[str, typer.Option("--allocator", help="default or expandable-segments.")] = "default",
    json_out: Json = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the verdict.")] = False,
) -> int:
    """Check whether a DeepSpeed config is predicted to fit: exit 0 fits, 1 does not fit, 2 bad input.

    Example: planner check ds_config.json --model opt-1.3b --gpu-mem 24G --seq-len 512
    """
    from planner.api import check

    options = job_keywords(**locals())
    result = check(
        ds_config,
        model,
        gradient_checkpointing=grad_ckpt,
        lora_rank=lora_rank,
        empty_cache=empty_cache,
        allocator=allocator,
        **options,
    )
    if json_out:
        print(result.model_dump_json(indent=2))
    elif quiet:
        print("fits" if result.fits else "does not fit: " + "; ".join(result.reasons))
    else:
        from planner.render import render_check

        render_check(result)
    return 0 if result.fits else 1
