"""``planner probe``: run strategies for a few real steps and compare measured with predicted."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from planner.cli.options import Calibration, Db, Json, job_options
from planner.cli.progress import ProbeLines, interval_s
from planner.job.inputs import JobSpec

# --gpus N runs N ranks per probe on this node; the offload folder and the safety margin do not apply.
# a probe runs memplan's own DeepSpeed loop (probes.step.phases_sft), whatever program the plan is for
# a probe runs on this machine: no other node, and one node of a multi-node plan (no network between nodes)
NOT_PROBED = ("nvme_path", "safety_margin", "framework", "node", "inter_node_gbps")
PROBE = "Probe"


Strategies = Annotated[
    str, typer.Option("--strategies", help="recommended, grid, or a JSON file of strategies.", rich_help_panel=PROBE)
]
Steps = Annotated[
    int,
    typer.Option(
        "--steps",
        help="All steps of a probe: the first warms up (the first two under ZeRO-3), the rest are measured.",
        rich_help_panel=PROBE,
    ),
]
Layers = Annotated[
    str,
    typer.Option("--layers", help="auto, K, or K1,K2 decoder layers (two depths extrapolate).", rich_help_panel=PROBE),
]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds before a probe is stopped.", rich_help_panel=PROBE)]
Device = Annotated[
    str, typer.Option("--device", help="cuda, or cpu (DeepSpeed's CPU accelerator).", rich_help_panel=PROBE)
]
MemoryCap = Annotated[
    str | None,
    typer.Option("--memory-cap", help="CPU: live bytes that count as out of memory.", rich_help_panel=PROBE),
]
Force = Annotated[
    bool, typer.Option("--force", help="Run again probes the database already holds.", rich_help_panel=PROBE)
]
Command = Annotated[
    list[str] | None,
    typer.Argument(
        help="After --: your own launch command (python train.py ..., torchrun ..., accelerate launch ...).",
        show_default=False,
    ),
]


@job_options(omit=NOT_PROBED)
def probe_command(
    job: JobSpec,
    strategies: Strategies = "recommended",
    steps: Steps = 4,
    layers: Layers = "auto",
    timeout: Timeout = 600.0,
    device: Device = "cuda",
    memory_cap: MemoryCap = None,
    force: Force = False,
    json_out: Json = False,
    db: Db = None,
    calibration: Calibration = "auto",
    command: Command = None,
) -> int:
    """Run each strategy for a few steps in its own process; store and compare with the prediction.

    With --gpus N each probe runs N ranks on this node (torch.distributed.run; gloo on --device cpu, up to
    4 ranks; NCCL on cuda, up to the GPUs present) and reports the worst rank. A plan for --nodes K > 1 is
    probed on one node of it (the report says so).

    On a terminal a live bar shows the progress; elsewhere (a pipe, a file, --json) lines on stderr do, with a
    heartbeat every MEMPLAN_PROGRESS_INTERVAL_S seconds (default 30) while a probe runs. MEMPLAN_PROFILE=1
    profiles one more step per probe, phase by phase (planner probes --json: result.extra.profile).

    After -- your own program runs instead of memplan's loop, once per strategy (the plan and its next best):
    a start-up hook overrides the strategy's DeepSpeed keys in the config it passes, measures each phase and
    ends it after the timed steps. Each run is stored under the program's fingerprint (its command line, the
    script's hash, library versions) and reused unless --force; the report prints the program id that
    planner recommend --program takes.

    Example: planner probe --model opt-125m --device cpu --layers 1,2 --steps 3 --gpus 2
    Example: planner probe --model ./config.json --device cpu --workload sft -- python train.py --deepspeed ds.json
    """
    if command:
        return _probe_program(
            job,
            command,
            strategies=strategies,
            steps=steps,
            timeout=timeout,
            device=device,
            json_out=json_out,
            db=db,
            calibration=calibration,
            force=force,
            memory_cap=memory_cap,
        )
    options: dict[str, Any] = {
        "strategies": strategies,
        "steps": steps,
        "layers": layers,
        "timeout_s": timeout,
        "device": device,
    }
    options.update(memory_cap=memory_cap, force=force, db=db, calibration=calibration)
    return _probe_builtin(job, options, timeout=timeout, json_out=json_out)


def _probe_builtin(job: JobSpec, options: dict[str, Any], *, timeout: float, json_out: bool) -> int:
    """``planner probe``: memplan's own loop under each strategy, with a live bar on a terminal, else lines on
    stderr (planner.cli.progress)."""
    from planner.api import probe
    from planner.report.text import console, render_probe_report

    if json_out or not console.is_terminal:  # no live display: plain lines on stderr (planner.cli.progress)
        with ProbeLines(sys.stderr, timeout, interval_s()) as lines:

            def started(label: str, index: int, total: int) -> None:
                lines.start(f"probe {index + 1}/{total}: {label}")

            report = probe(job, on_progress=started, on_note=lines.note, **options)
        if json_out:
            print(report.to_json())
        else:
            render_probe_report(report)
        return 0
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("planning", total=None)

        def show(label: str, index: int, total: int) -> None:
            progress.update(task, description=f"probing {label}", completed=index, total=total)

        def note(line: str) -> None:
            progress.console.print(line, markup=False, style="dim")

        report = probe(job, on_progress=show, on_note=note, **options)
    render_probe_report(report)
    return 0


def _probe_program(
    job: JobSpec,
    command: list[str],
    *,
    strategies: str,
    steps: int,
    timeout: float,
    device: str,
    json_out: bool,
    db: str | None,
    calibration: str,
    force: bool,
    memory_cap: str | None,
) -> int:
    """``planner probe ... -- CMD``: the user's program under each strategy (planner.probing.program), each run
    stored under the program's fingerprint and reused unless --force."""
    import json

    from planner.api import probe_program
    from planner.report.text import render_program_report

    with ProbeLines(sys.stderr, timeout, interval_s()) as lines:

        def started(label: str, index: int, total: int) -> None:
            lines.start(f"program run {index + 1}/{total}: {label}")

        report = probe_program(
            job,
            command,
            strategies=strategies,
            steps=steps,
            timeout_s=timeout,
            device=device,
            db=db,
            calibration=calibration,
            force=force,
            memory_cap=memory_cap,
            on_progress=started,
            on_note=lines.note,
        )
    document = report.to_dict()
    if json_out:
        print(json.dumps(document, indent=2, default=str))
    else:
        render_program_report(document)
    return 0
