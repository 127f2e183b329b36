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
    from planner import plans

    records = plans(db=db, limit=limit, kind=kind)
    if json_out:
        import json

        print(json.dumps([r.document | {"plan_id": r.plan_id} for r in records], indent=2))
    else:
        from planner.report.text import render_plans

        render_plans(records)
    return 0
