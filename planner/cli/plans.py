"""``planner plans``: the saved plans, newest first."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Db, Json


def plans_command(
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many plans to list.")] = 20,
    kind: Annotated[str | None, typer.Option("--workload", "-w", help="Only plans of this workload.")] = None,
    json_out: Json = False,
    db: Db = None,
) -> int:
    """List saved plans (id, time, model, workload, strategy, predicted peak and step time).

    Example: planner plans -n 5
    """
    import json

    from planner.api import plans
    from store.errors import InputError

    if limit <= 0:
        raise InputError(f"--limit must be larger than zero, not {limit}")
    records = plans(db=db, limit=limit, kind=kind)
    if json_out:
        print(json.dumps([r.document | {"plan_id": r.plan_id} for r in records], indent=2))
        return 0
    from rich.table import Table

    from planner.render import console, describe

    if not records:
        console.print("no plans saved yet: run `planner recommend ...` first")
        return 0
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
            f"{r.predicted.get('peak_reserved_bytes', 0) / 2**30:.2f} GiB",
            f"{r.predicted.get('step_time_s', 0):.3f} s",
        )
    console.print(table)
    return 0
