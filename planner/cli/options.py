"""Options declared once: the job options (one per ``JobSpec`` field) and the flags several commands share.

A command that describes a job takes ``job: JobSpec`` as its first parameter and is wrapped by
``@job_options()``: the wrapper offers every JobSpec field as an option (its default read from JobSpec)
and hands the command the JobSpec they make, sqlite-utils style::

    @job_options(omit=("batch",))
    def check_command(job: JobSpec, ds_config: Annotated[Path, typer.Argument()], ...) -> int:
        result = check(ds_config, job, ...)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import typer

from planner.cli.choices import choices_metavar
from planner.job.inputs import (
    DEFAULT_BATCH_PER_GPU,
    DEFAULT_GEN_LEN,
    DEFAULT_GPUS,
    DEFAULT_GRPO_SAMPLES,
    DEFAULT_PROMPT_LEN,
    DEFAULT_SEQ_LEN,
    FRAMEWORKS,
    NO_BF16_GPUS,
    JobSpec,
)

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
    typer.Option(
        "--samples-per-prompt",
        help=f"grpo: completions per prompt (default {DEFAULT_GRPO_SAMPLES}).",
        rich_help_panel=JOB,
    ),
]
GpuMem = Annotated[
    str | None,
    typer.Option("--gpu-mem", help="Memory of one GPU: 24G, 24GiB, 24576MiB or bytes.", rich_help_panel=HARDWARE),
]
Gpu = Annotated[
    str | None,
    typer.Option("--gpu", help="GPU from the catalog (A100-80G, H100-80G, RTX-4090, ...).", rich_help_panel=HARDWARE),
]
Node = Annotated[
    str | None,
    typer.Option(
        "--node",
        help="A node from the catalog (dgx-h100, dgx-a100, p5.48xlarge, p4d.24xlarge, workstation-4090, ...): its "
        "GPU, GPUs per node, host memory and network, each unless given on its own.",
        rich_help_panel=HARDWARE,
    ),
]
Gpus = Annotated[
    int | None,
    typer.Option("--gpus", help=f"GPUs per node (default {DEFAULT_GPUS}, or the node's).", rich_help_panel=HARDWARE),
]
Nodes = Annotated[int, typer.Option("--nodes", help="Number of nodes.", rich_help_panel=HARDWARE)]
CpuMem = Annotated[
    str | None,
    typer.Option(
        "--cpu-mem",
        help="Host memory per node (default: the node's; for a probe, this machine's; else assumed from the GPU's "
        "typical node, never the planning machine's).",
        rich_help_panel=HARDWARE,
    ),
]
InterNodeGbps = Annotated[
    float | None,
    typer.Option(
        "--inter-node-gbps",
        help="Network between nodes, GB/s per node in one direction (default: the node's, else the GPU's typical "
        "node's: 400 for H100/H200, 200 for A100; 25 when none is known).",
        rich_help_panel=HARDWARE,
    ),
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
        help="Global batch: samples (pairs for reward/dpo, prompts for RLHF) per optimizer step over all GPUs "
        f"(default {DEFAULT_BATCH_PER_GPU} per GPU).",
        rich_help_panel=JOB,
    ),
]
SeqLen = Annotated[
    int | None,
    typer.Option("--seq-len", help=f"Tokens per sequence (default {DEFAULT_SEQ_LEN}).", rich_help_panel=JOB),
]
PromptLen = Annotated[
    int | None,
    typer.Option("--prompt-len", help=f"RLHF: prompt tokens (default {DEFAULT_PROMPT_LEN}).", rich_help_panel=JOB),
]
GenLen = Annotated[
    int | None,
    typer.Option("--gen-len", help=f"RLHF: generated tokens (default {DEFAULT_GEN_LEN}).", rich_help_panel=JOB),
]
Dtype = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help=f"bf16, fp16 or fp32 (default bf16; fp16 on {', '.join(NO_BF16_GPUS)}).",
        rich_help_panel=JOB,
    ),
]
AttnImpl = Annotated[
    str | None,
    typer.Option(
        "--attn-impl",
        help="eager, sdpa or flash_attention_2 (default sdpa; flash_attention_2 for --framework openrlhf, its own "
        "default).",
        rich_help_panel=JOB,
    ),
]
Framework = Annotated[
    str,
    typer.Option(
        "--framework",
        metavar=choices_metavar(FRAMEWORKS),
        help=f"The program that runs the plan: {', '.join(FRAMEWORKS)}. The prediction follows its code where it "
        "differs (TRL's fused log-prob head, OpenRLHF's own ZeRO buckets, ...); deepspeed is memplan's own loop.",
        rich_help_panel=JOB,
    ),
]
RefModel = Annotated[
    str | None, typer.Option("--ref-model", help="Frozen reference model (RLHF, dpo).", rich_help_panel=JOB)
]
CriticModel = Annotated[str | None, typer.Option("--critic-model", help="Critic model (ppo).", rich_help_panel=JOB)]
RewardModel = Annotated[
    str | None,
    typer.Option(
        "--reward-model",
        help="Reward model (RLHF), or none: rule-based (verifiable) rewards, no reward model loaded or run.",
        rich_help_panel=JOB,
    ),
]
KlCoef = Annotated[
    float | None,
    typer.Option(
        "--kl-coef",
        help="RLHF: KL coefficient against the reference (TRL's beta, OpenRLHF's --algo.kl.init_coef, veRL's "
        "kl_loss_coef); 0 loads no reference model. Default: the framework's (trl 0, openrlhf 0.01, verl 0), else "
        "a reference held as DeepSpeed-Chat holds it.",
        rich_help_panel=JOB,
    ),
]
Db = Annotated[
    str | None, typer.Option("--db", help="Database URL or SQLite file (default: $PLANNER_DB or the user data folder).")
]
Json = Annotated[bool, typer.Option("--json", help="Print the JSON document instead of tables.")]
Calibration = Annotated[
    str,
    typer.Option(
        "--calibration",
        help="Coefficients fitted to probes: auto (the newest calibration of the GPU), none, or a calibration id.",
    ),
]

# Every JobSpec field and its option, in the order the help lists them.
JOB_OPTIONS: dict[str, Any] = {
    "model": Model,
    "workload": WorkloadKind,
    "gpu_mem": GpuMem,
    "gpu": Gpu,
    "node": Node,
    "gpus": Gpus,
    "nodes": Nodes,
    "cpu_mem": CpuMem,
    "inter_node_gbps": InterNodeGbps,
    "batch": Batch,
    "seq_len": SeqLen,
    "prompt_len": PromptLen,
    "gen_len": GenLen,
    "dtype": Dtype,
    "attn_impl": AttnImpl,
    "ref_model": RefModel,
    "critic_model": CriticModel,
    "reward_model": RewardModel,
    "nvme_path": NvmePath,
    "safety_margin": SafetyMargin,
    "ppo_epochs": PpoEpochs,
    "samples_per_prompt": SamplesPerPrompt,
    "framework": Framework,
    "kl_coef": KlCoef,
}

Command = Callable[..., int]


def job_defaults() -> dict[str, Any]:
    """The default of every JobSpec field (``inspect.Parameter.empty`` for the required ``model``)."""
    return {
        f.name: inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(JobSpec)
    }


def job_options(
    *, omit: tuple[str, ...] = (), defaults: Mapping[str, Any] | None = None
) -> Callable[[Command], Command]:
    """Decorate a command whose first parameter is ``job: JobSpec`` with the job options.

    ``omit`` names JobSpec fields the command does not offer (they keep JobSpec's defaults); ``defaults``
    replaces JobSpec's default of a field for this command (``check``'s workload). The command's own
    parameters follow the job options in the help.
    """
    unknown = set(omit) | set(defaults or {})
    unknown -= set(JOB_OPTIONS)
    if unknown:
        raise TypeError(f"not JobSpec fields: {sorted(unknown)}")
    chosen = {**job_defaults(), **(defaults or {})}
    names = [name for name in JOB_OPTIONS if name not in omit]

    def decorate(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        first, *rest = own.parameters.values()
        if first.name != "job":
            raise TypeError(f"{command.__name__}: the first parameter must be `job: JobSpec`")
        job_params = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=JOB_OPTIONS[name], default=chosen[name])
            for name in names
        ]
        params = job_params + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in rest]

        @functools.wraps(command)
        def run(**values: Any) -> int:
            job = JobSpec(**{name: values.pop(name) for name in names})
            return command(job, **values)

        run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params} | {"return": own.return_annotation}
        return run

    return decorate
