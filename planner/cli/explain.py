"""``planner explain``: the cost model's coefficients, or one saved plan in full."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli.options import Db
from store.errors import InputError


def explain_command(
    plan_id: Annotated[str | None, typer.Argument(help="A saved plan to show in full (JSON).")] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Draw the plan's step from the allocator replay: allocated and reserved bytes phase by phase, "
            "with the empty_cache calls (.html or .svg; .png with matplotlib installed).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the --plot file if it exists.")] = False,
    db: Db = None,
) -> int:
    """Show the cost model's coefficients (name, value, unit, reason), or a saved plan's document.

    Example: planner explain 1e232033d1bd --plot memory.html
    """
    if plot is not None:
        from planner import memory_plot

        written, rows = memory_plot(plan_id, plot, db=db, force=force)
        print(f"wrote {written}: allocated and reserved over one step of the allocator replay")
        print(f"{'phase':<18} {'peak allocated':>15} {'peak reserved':>15}")
        for name, allocated, reserved in rows:
            print(f"{name:<18} {allocated / 2**30:>11.2f} GiB {reserved / 2**30:>11.2f} GiB")
        return 0
    if plan_id:
        import json

        from planner import plan

        record = plan(plan_id, db=db)
        print(json.dumps(record.document | {"plan_id": record.plan_id}, indent=2))
        return 0
    if db is not None:
        raise InputError(f"--db {db!r} is read only with a plan id (planner explain PLAN_ID --db ...)")
    from planner import coefficients
    from planner.report.text import render_coefficients

    render_coefficients(coefficients())
    return 0
