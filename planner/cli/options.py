"""Options shared by the commands that describe a job (recommend, predict, check, probe)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

JOB = "Job"
HARDWARE = "Hardware"

Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Catalog name (opt-1.3b, llama-3-8b, ...) or a local config.json / HF folder.",
        rich_help_panel=JOB,
    ),
]
WorkloadKind = Annotated[
    str, typer.Option("--workload", "-w", help="ppo, remax, grpo (RLHF) or sft, reward, dpo.", rich_help_panel=JOB)
]
PpoEpochs = Annotated[
    int, typer.Option("--ppo-epochs", help="RLHF: training passes per experience batch.", rich_help_panel=JOB)
]
SamplesPerPrompt = Annotated[
    int | None,
    typer.Option("--samples-per-prompt", help="grpo: completions per prompt (default 4).", rich_help_panel=JOB),
]
GpuMem = Annotated[
    str | None,
    typer.Option("--gpu-mem", help="Memory of one GPU: 24G, 24GiB, 24576MiB or bytes.", rich_help_panel=HARDWARE),
]
Gpu = Annotated[
    str | None,
    typer.Option("--gpu", help="GPU from the catalog (A100-80G, H100-80G, RTX-4090, ...).", rich_help_panel=HARDWARE),
]
Gpus = Annotated[int, typer.Option("--gpus", help="GPUs per node.", rich_help_panel=HARDWARE)]
Nodes = Annotated[int, typer.Option("--nodes", help="Number of nodes.", rich_help_panel=HARDWARE)]
CpuMem = Annotated[
    str | None,
    typer.Option("--cpu-mem", help="Host memory per node (default: this machine's).", rich_help_panel=HARDWARE),
]
NvmePath = Annotated[
    str | None,
    typer.Option("--nvme-path", help="Folder on a local NVMe drive; enables NVMe offload.", rich_help_panel=HARDWARE),
]
SafetyMargin = Annotated[
    float, typer.Option("--safety-margin", help="Fraction of GPU memory kept free.", rich_help_panel=HARDWARE)
]
Batch = Annotated[
    int | None,
    typer.Option(
        "--batch",
        "-b",
        help="Global batch: samples (pairs for reward/dpo) per optimizer step over all GPUs.",
        rich_help_panel=JOB,
    ),
]
SeqLen = Annotated[
    int | None, typer.Option("--seq-len", help="Tokens per sequence (default 512).", rich_help_panel=JOB)
]
PromptLen = Annotated[int | None, typer.Option("--prompt-len", help="Prompt tokens.", rich_help_panel=JOB)]
GenLen = Annotated[int | None, typer.Option("--gen-len", help="Generated tokens.", rich_help_panel=JOB)]
Dtype = Annotated[str | None, typer.Option("--dtype", help="bf16, fp16 or fp32 (default bf16).", rich_help_panel=JOB)]
AttnImpl = Annotated[str, typer.Option("--attn-impl", help="eager, sdpa or flash_attention_2.", rich_help_panel=JOB)]
RefModel = Annotated[str | None, typer.Option("--ref-model", help="Frozen reference model (dpo).", rich_help_panel=JOB)]
CriticModel = Annotated[str | None, typer.Option("--critic-model", help="Critic model (RLHF).", rich_help_panel=JOB)]
RewardModel = Annotated[str | None, typer.Option("--reward-model", help="Reward model (RLHF).", rich_help_panel=JOB)]
Db = Annotated[
    str | None, typer.Option("--db", help="Database URL or SQLite file (default: $PLANNER_DB or the user data folder).")
]
Json = Annotated[bool, typer.Option("--json", help="Print the JSON document instead of tables.")]


def job_keywords(**values: Any) -> dict[str, Any]:
    """The JobSpec keywords of a command's parsed options (the rest are the command's own)."""
    names = (
        "workload",
        "gpu_mem",
        "gpu",
        "gpus",
        "nodes",
        "cpu_mem",
        "batch",
        "seq_len",
        "prompt_len",
        "gen_len",
        "dtype",
        "attn_impl",
        "ref_model",
        "critic_model",
        "reward_model",
        "nvme_path",
        "safety_margin",
        "ppo_epochs",
        "samples_per_prompt",
    )
    return {name: values[name] for name in names if name in values}
