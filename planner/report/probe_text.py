"""The text of measuring and of what is stored: ``planner probe`` (memplan's probes and the user's program),
``planner plans``, ``planner probes`` and ``planner explain``'s coefficients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.table import Table

from planner.report.results import ProbeReport
from planner.report.text_units import console, describe
from planner.report.text_units import gib as _gib
from planner.report.text_units import pct as _pct
from planner.report.text_units import seconds as _seconds
from planner.report.text_units import size_text as _size


def render_probe_report(report: ProbeReport) -> None:
    """``planner probe``: measured against predicted, per probe, and the per-layer extrapolations."""
    fp = report.fingerprint or {}
    device = f"{fp.get('name', report.device)}" + (f", torch {fp['torch']}" if fp.get("torch") else "")
    console.print(f"[bold]{report.workload['model']}[/bold] · {report.workload['kind']} · {report.device}: {device}")
    table = Table(title="Measured / predicted (error = predicted / measured - 1)", title_justify="left")
    for column in ("probe", "strategy", "outcome", "peak allocated", "peak reserved", "step time"):
        table.add_column(column, justify="left" if column in ("probe", "strategy", "outcome") else "right")

    def cell(measured: float | None, predicted: float, error: float | None, fmt: Callable[[float], str]) -> str:
        if measured is None:
            return f"- / {fmt(predicted)}"
        return f"{fmt(measured)} / {fmt(predicted)} ({_pct(error)})"

    for row in report.rows:
        m, p, e = row.measured or {}, row.predicted, row.errors
        outcome = (
            row.outcome + (f" in {row.failed_phase}" if row.failed_phase else "") + (" (stored)" if row.reused else "")
        )
        table.add_row(
            row.probe_id[:8],
            row.label,
            outcome if row.outcome == "ok" else f"[red]{outcome}[/red]",
            cell(m.get("peak_allocated_bytes"), p["peak_allocated_bytes"], e.get("peak_allocated"), _gib),
            cell(m.get("peak_reserved_bytes"), p["peak_reserved_bytes"], e.get("peak_reserved"), _gib),
            cell(m.get("step_time_s"), p["step_time_s"], e.get("step_time"), _seconds),
        )
    console.print(table)
    if report.device == "cpu":
        console.print(
            "[dim]CPU backend: peak allocated is the peak of live tensor bytes (dispatch-level tracker); there is "
            "no caching allocator, and the time model is for GPUs, so times are not compared.[/dim]"
        )
    if report.world_size > 1:
        worst = ", ".join(f"{r.probe_id[:8]}: rank {r.worst_rank}" for r in report.rows if r.worst_rank is not None)
        console.print(
            f"World size {report.world_size}: each probe ran {report.world_size} ranks on this node; measured "
            f"figures are the worst rank's, per phase" + (f" (worst rank {worst})" if worst else "") + ".",
            soft_wrap=True,
        )
    for note in report.notes:
        console.print(f"Note: {note}.", soft_wrap=True, markup=False)
    for row in report.rows:
        if row.outcome != "ok" and row.message:
            console.print(f"  {row.probe_id}: {row.message}", soft_wrap=True)
    for x in report.extrapolations:
        anchored = x.anchored.get("peak_allocated_bytes")
        line = (
            f"{x.label}: layers {x.depths[0]} and {x.depths[1]} extrapolated to {x.full_layers}: "
            f"peak allocated {_gib(x.extrapolated['peak_allocated_bytes'])} per-layer line, "
            f"{_gib(anchored) if anchored is not None else '-'} model-anchored "
            f"(cost model {_gib(x.predicted_full['peak_allocated_bytes'])})"
        )
        if report.device != "cpu":
            step, model_step = x.extrapolated["step_time_s"], x.predicted_full["step_time_s"]
            anchored_step = x.anchored.get("step_time_s")
            line += (
                f", step {_seconds(step)} / {_seconds(anchored_step) if anchored_step is not None else '-'} "
                f"(cost model {_seconds(model_step)})"
            )
        if x.measured_full:
            line += (
                f"; full model measured {_gib(x.measured_full['peak_allocated_bytes'])}: errors "
                f"{_pct(x.errors.get('peak_allocated_bytes'))} / {_pct(x.anchored_errors.get('peak_allocated_bytes'))}"
            )
            if report.device != "cpu":
                line += (
                    f" memory, {_pct(x.errors.get('step_time_s'))} / {_pct(x.anchored_errors.get('step_time_s'))} time"
                )
        console.print(line, soft_wrap=True)


def render_plans(records: list[Any]) -> None:
    """The saved plans (``planner.plans()``), one row each."""
    if not records:
        console.print("no plans saved yet: run `planner recommend ...` first")
        return
    table = Table()
    for column in ("plan", "created (UTC)", "model", "workload", "strategy", "fits", "peak reserved", "step"):
        table.add_column(column)
    for r in records:
        table.add_row(
            r.plan_id,
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            r.model,
            r.kind,
            describe(r.strategy),
            "yes" if r.fits else "no",
            _gib(r.predicted.get("peak_reserved_bytes", 0)),
            f"{r.predicted.get('step_time_s', 0):.3f} s",
        )
    console.print(table)


def render_probes(records: list[Any]) -> None:
    """The stored probes (``planner.probes()``), one row each."""
    if not records:
        console.print("no probes stored yet: run `planner probe ...` first")
        return
    table = Table()
    for column in ("probe", "created (UTC)", "model", "device", "strategy", "layers", "outcome", "peak alloc", "step"):
        table.add_column(column)
    for r in records:
        res = r.result
        table.add_row(
            r.probe_id,
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            r.model,
            r.device,
            describe(r.request.strategy),
            "full" if r.request.layers is None else str(r.request.layers),
            res.outcome + (f" ({res.failed_phase})" if res.failed_phase else ""),
            f"{res.peak_allocated_bytes / 2**20:.1f} MiB",
            f"{res.step_time_s:.3f} s",
        )
    console.print(table)


def render_coefficients(rows: list[dict[str, Any]]) -> None:
    """The cost model's coefficients (``planner.coefficients()``): name, value, unit, why."""
    table = Table(title="Cost-model coefficients (calibrated by probes)", title_justify="left")
    for column in ("name", "value", "unit", "why"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], f"{row['default']:g}", row["unit"], row["reason"])
    console.print(table)


def render_program_report(document: dict[str, Any]) -> None:
    """``planner probe ... -- CMD``: each strategy run in the user's program, its phases measured against
    predicted and, where memplan's own probe of the strategy is stored, the program's spread of peak reserved
    against it (the document of ``ProgramProbeReport.to_dict``)."""
    ident = document.get("program_id") or ""
    shown_id = f", program id {ident}" if ident else ""
    console.print(
        f"[bold]Your program[/bold]: {' '.join(document['command'])}  (device {document['device']}{shown_id})",
        markup=True,
    )
    for line in document.get("readings", ()):
        console.print(f"  [dim]{line}[/dim]")
    # on the CPU backend the predicted time is the GPU model's until a calibration of this CPU is in force
    cpu_time = " (the GPU time model: on the CPU it means nothing until planner calibrate)" * (
        document["device"] == "cpu"
    )
    for run in document["runs"]:
        ran = run["ran_with"]
        stored = run.get("probe_id") or ""
        where = f"  [dim](probe {stored}{', reused' if run.get('reused') else ''})[/dim]" if stored else ""
        console.print(
            f"\n[bold]{run['label']}[/bold]: {run['outcome']}"
            + (f" ({run['reason']})" if run["reason"] else "")
            + where
        )
        if ran:
            shown = ", ".join(f"{k} {ran[k]}" for k in ("zero_stage", "micro_batch", "grad_accum", "dtype") if k in ran)
            console.print(f"  the program ran with: {shown}")
        for line in (*run["not_applied"], *run["contradictions"]):
            console.print(f"  [yellow]{line}[/yellow]")
        if run["message"]:
            console.print(f"  {run['message']}")
        if run["phases"]:
            spreads = any(phase.get("reserved_spread") is not None for phase in run["phases"])
            table = Table(show_header=True, header_style="bold")
            columns = ["phase", "measured allocated", "predicted allocated", "error", "measured reserved"]
            columns += ["predicted reserved"] + (["memplan's probe reserved", "spread"] if spreads else [])
            for column in columns:
                table.add_column(column, justify="left" if column == "phase" else "right")
            for phase in run["phases"]:
                predicted = phase["predicted_allocated_bytes"]
                reserved = phase.get("predicted_reserved_bytes")
                row = [
                    phase["name"],
                    _size(phase["measured_allocated_bytes"]),
                    "-" if predicted is None else _size(predicted),
                    _pct(phase["allocated_error"]),
                    _size(phase["measured_reserved_bytes"]),
                    "-" if reserved is None else _size(reserved),
                ]
                if spreads:
                    builtin = phase.get("builtin_reserved_bytes")
                    row += ["-" if builtin is None else _size(builtin), _pct(phase.get("reserved_spread"))]
                table.add_row(*row)
            console.print(table)
            if run.get("spread") is not None:
                console.print(
                    f"  your program's spread: {100 * run['spread']:+.1f}% of peak reserved (worst phase) against "
                    f"memplan's probe {run['builtin_probe_id']} of the same strategy"
                )
        measured = run["measured_step_s"]
        step = "-" if measured is None else f"{measured:.3f} s"
        console.print(f"  step time: measured {step}, predicted {run['predicted_step_s']:.3f} s{cpu_time}")
        if run["outcome"] not in ("ok", "contradicts_plan") and run["log_tail"]:
            tail = run["log_tail"].strip().splitlines()[-5:]
            console.print("  " + "\n  ".join(tail), markup=False, style="dim")
