"""``planner recommend``: the fastest strategy predicted to fit."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import (
    AttnImpl,
    Batch,
    CpuMem,
    CriticModel,
    Db,
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


def recommend_command(
    model: Model,
    gpu_mem: GpuMem = None,
    workload: WorkloadKind = "ppo",
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
    top: Annotated[int, typer.Option("--top", help="How many next-best strategies to show.")] = 3,
    lora_rank: Annotated[
        str, typer.Option("--lora-rank", help="auto (LoRA only if no full fine-tune fits), 0 (never) or a rank.")
    ] = "auto",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the Optuna sampler.")] = 0,
    json_out: Json = False,
    db: Db = None,
) -> int:
    """Recommend the memory strategy that fits at the least step time, and save it as a plan.

    Example: planner recommend --model opt-1.3b --gpu-mem 24G --workload sft
    """
    from planner.api import recommend

    options = job_keywords(**locals())
    plan = recommend(model, top=top, lora_rank=lora_rank, seed=seed, db=db, **options)
    if json_out:
        print(plan.to_json())
    else:
        from planner.render import render_plan

        render_plan(plan)
    return 0
