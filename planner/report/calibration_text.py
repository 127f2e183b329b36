"""Text output of ``planner calibrate`` and ``planner calibrations`` (rich tables)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from planner.report.results import CalibrationReport, TuneReport
from planner.report.text import console, describe

QUANTITY_NAMES = {"time": "phase time", "peak_allocated": "peak allocated", "peak_reserved": "peak reserved"}


def _error(stats: dict[str, float] | None) -> str:
    if not stats:
        return "-"
    return f"{100 * stats['median_abs']:.1f}% (worst {100 * stats['worst']:+.0f}%)"


def _value(value: float) -> str:
    return f"{value:.4g}"


def render_calibration(report: CalibrationReport) -> None:
    """The device, the parameters that moved, and the errors before, after and held out."""
    saved = f"calibration [bold]{report.calibration_id}[/bold]" if report.calibration_id else "not saved (--dry-run)"
    console.print(
        f"[bold]{report.target}[/bold] ({report.fingerprint.get('name', report.device)}): {saved}, "
        f"fitted to {report.observations} probes"
    )
    errors = Table(title="Error (predicted / measured - 1): median |error| (worst)", title_justify="left")
    for column in ("quantity", "before (defaults)", "after (fit)", "held out (leave-one-out)"):
        errors.add_column(column, justify="left" if column == "quantity" else "right")
    for quantity, name in QUANTITY_NAMES.items():
        if quantity in report.errors.get("before", {}):
            errors.add_row(
                name, *(_error(report.errors.get(k, {}).get(quantity)) for k in ("before", "after", "held_out"))
            )
    console.print(errors)
    params = Table(title="Parameters the probes determine (the others keep their defaults)", title_justify="left")
    for column in ("parameter", "default", "fitted", "x", "sensitivity", "what"):
        params.add_column(column, justify="left" if column in ("parameter", "what") else "right")
    for p in report.parameters:
        if p["determined"]:
            ratio = p["value"] / p["default"] if p["default"] else float("nan")
            row = (p["name"], _value(p["default"]), _value(p["value"]), f"{ratio:.2f}", f"{p['sensitivity']:.2f}")
            params.add_row(*row, p["what"])
    console.print(params)
    undetermined = [p["name"] for p in report.parameters if not p["determined"]]
    if undetermined:
        console.print(f"[dim]not determined by these probes (defaults kept): {', '.join(undetermined)}[/dim]")
    for line in report.skipped:
        console.print(f"[yellow]skipped {line}[/yellow]")
    if report.host_benchmark.get("host_rates"):
        console.print(f"host rates: {report.host_benchmark['host_rates']}")
    if report.host_terms:
        terms = Table(title="Host terms of the time model: measured here, fitted, or assumed", title_justify="left")
        for column in ("term", "value", "source", "how"):
            terms.add_column(column, justify="right" if column == "value" else "left")
        for name, term in report.host_terms.items():
            terms.add_row(name, _value(term["value"]), term["source"], str(term["how"]))
        console.print(terms)


def render_calibrations(records: list[Any]) -> None:
    """The stored calibrations, one row each."""
    if not records:
        console.print("no calibrations stored yet: run `planner calibrate` after `planner probe`")
        return
    table = Table()
    for column in ("calibration", "created (UTC)", "target", "probes", "fitted", "held-out time", "held-out reserved"):
        table.add_column(column)
    for r in records:
        held = r.report.get("errors", {}).get("held_out", {})
        table.add_row(
            r.calibration_id,
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            r.target,
            str(len(r.probe_ids)),
            str(len(r.values)),
            _error(held.get("time")),
            _error(held.get("peak_reserved")),
        )
    console.print(table)


def render_tune(report: TuneReport) -> None:
    """The measured candidates, why the tune stopped, what it cost, and the confirmed plan."""

    console.print(
        f"[bold]tune[/bold] {report.study} on {report.target}: {report.probes_run} probes run "
        f"({report.device_seconds:.1f} device-seconds), {report.probes_measured} of {report.candidates} "
        "candidates measured"
    )
    table = Table(title="Measured (fastest fitting first) / predicted by the final calibration", title_justify="left")
    for column in ("probe", "strategy", "outcome", "fits", "step time", "predicted", "peak reserved", "noise"):
        table.add_column(column, justify="left" if column in ("probe", "strategy", "outcome") else "right")
    for row in report.rows:
        measured = row.get("step_time_s")
        table.add_row(
            str(row["probe_id"]),
            describe(row["strategy"]),
            str(row["outcome"]),
            "yes" if row["fits"] else "no",
            "-" if measured is None else f"{1e3 * measured:.1f} ms",
            f"{1e3 * row['predicted_step_time_s']:.1f} ms",
            f"{row['peak_reserved_bytes'] / 2**30:.2f} GiB",
            f"{100 * row['noise']:.0f}%",
        )
    console.print(table)
    console.print(f"stopped: {report.stop_reason}")
    if report.plan is not None:
        console.print(f"confirmed plan [bold]{report.plan.plan_id}[/bold]: {describe(report.plan.strategy)}")
    else:
        console.print("[yellow]no measured plan fits yet: run planner tune again (it resumes) or raise --max-probes[/]")
