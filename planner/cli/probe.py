"""``planner probe``: run strategies for a few real steps and compare measured with predicted."""

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
    Json,
    Model,
    PpoEpochs,
    PromptLen,
    RefModel,
    RewardModel,
    SamplesPerPrompt,
    SeqLen,
    WorkloadKind,
    job_keywords,
)

PROBE = "Probe"


def probe_command(
    model: Model,
    workload: WorkloadKind = "sft",
    gpu_mem: GpuMem = None,
    gpu: Gpu = None,
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
    ppo_epochs: PpoEpochs = 1,
    samples_per_prompt: SamplesPerPrompt = None,
    strategies: Annotated[
        str,
        typer.Option("--strategies", help="recommended, grid, or a JSON file of strategies.", rich_help_panel=PROBE),
    ] = "recommended",
    steps: Annotated[
        int, typer.Option("--steps", help="Steps per probe (the first is a warm-up).", rich_help_panel=PROBE)
    ] = 3,
    layers: Annotated[
        str,
        typer.Option(
            "--layers", help="auto, K, or K1,K2 decoder layers (two depths extrapolate).", rich_help_panel=PROBE
        ),
    ] = "auto",
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds before a probe is stopped.", rich_help_panel=PROBE)
    ] = 600.0,
    device: Annotated[
        str, typer.Option("--device", help="cuda, or cpu (DeepSpeed's CPU accelerator).", rich_help_panel=PROBE)
    ] = "cuda",
    memory_cap: Annotated[
        str | None,
        typer.Option("--memory-cap", help="CPU: live bytes that count as out of memory.", rich_help_panel=PROBE),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Run again probes the database already holds.", rich_help_panel=PROBE)
    ] = False,
    json_out: Json = False,
    db: Db = None,
) -> int:
    """Run each strategy for a few steps in its own process; store and compare with the prediction.

    Example: planner probe --model opt-125m --device cpu --layers 1,2 --steps 3
    """
    from planner.api import probe

    options = job_keywords(**locals())
    if gpu_mem is None and gpu is None:
        options["gpu_mem"] = "80G" if device == "cuda" else "24G"
    if json_out:
        report = probe(
            model, strategies=strategies, steps=steps, layers=layers, timeout_s=timeout, device=device,
            memory_cap=memory_cap, force=force, db=db, **options,
        )  # fmt: skip
        print(report.to_json())
        return 0
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from planner.render import console, render_probe_report

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("planning", total=None)

        def show(label: str, index: int, total: int) -> None:
            progress.update(task, description=f"probing {label}", completed=index, total=total)

        report = probe(
            model, strategies=strategies, steps=steps, layers=layers, timeout_s=timeout, device=device,
            memory_cap=memory_cap, force=force, db=db, on_progress=show, **options,
        )  # fmt: skip
    render_probe_report(report)
    return 0
