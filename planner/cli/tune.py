"""``planner tune``: confirm the plan on the device, probing the candidates the cost model ranks first."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from planner.cli.options import Calibration, Db, Json, job_options
from planner.cli.progress import ProbeLines, interval_s
from planner.job.inputs import JobSpec

NOT_TUNED = ("nodes", "nvme_path", "node", "inter_node_gbps")  # a tune probes the plan on this node's --gpus
TUNE = "Tune"


@job_options(omit=NOT_TUNED)
def tune_command(
    job: JobSpec,
    device: Annotated[
        str, typer.Option("--device", help="cuda, or cpu (DeepSpeed's CPU accelerator).", rich_help_panel=TUNE)
    ] = "cuda",
    max_probes: Annotated[
        int, typer.Option("--max-probes", help="Probes this run may start at most.", rich_help_panel=TUNE)
    ] = 8,
    steps: Annotated[
        int, typer.Option("--steps", help="Steps of each probe (warm-up first).", rich_help_panel=TUNE)
    ] = 4,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds before a probe is stopped.", rich_help_panel=TUNE)
    ] = 600.0,
    memory_cap: Annotated[
        str | None,
        typer.Option("--memory-cap", help="CPU: live bytes that count as out of memory.", rich_help_panel=TUNE),
    ] = None,
    study: Annotated[
        str | None,
        typer.Option("--study", help="Optuna study name (default: one per job and device).", rich_help_panel=TUNE),
    ] = None,
    json_out: Json = False,
    db: Db = None,
    calibration: Calibration = "auto",
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="After --: your own launch command (python train.py ..., torchrun ..., accelerate launch ...).",
            show_default=False,
        ),
    ] = None,
) -> int:
    """Probe the candidates the cost model ranks first until a measured plan fits and nothing untested is
    predicted faster; save that plan (planner export writes its config). Run again to resume. Each probe
    prints a line on stderr as it starts, and a heartbeat every MEMPLAN_PROGRESS_INTERVAL_S seconds (default
    30) while it runs.

    After -- your own program confirms the candidates instead of memplan's loop: it runs once per candidate
    under the start-up hook of planner probe -- CMD, and each run is stored under the program's fingerprint.

    Example: planner tune --model opt-1.3b --gpu-mem 24G --workload sft --max-probes 6
    Example: planner tune --model ./config.json --device cpu --workload sft --max-probes 2 -- python train.py
    """
    from planner import tune

    with ProbeLines(sys.stderr, timeout, interval_s()) as lines:  # a line per probe, then its heartbeat
        report = tune(
            job,
            device=device,
            max_probes=max_probes,
            steps=steps,
            timeout_s=timeout,
            memory_cap=memory_cap,
            study=study,
            db=db,
            calibration=calibration,
            on_progress=lines.start,
            on_note=lines.note,
            command=list(command) if command else None,
        )
    if json_out:
        print(report.to_json())
    else:
        from planner.report.calibration_text import render_tune

        render_tune(report)
    return 0
