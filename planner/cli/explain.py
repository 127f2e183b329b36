"""``planner explain``: the cost model's coefficients, or one saved plan in full."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Db
from store.errors import InputError


def explain_command(
    plan_id: Annotated[str | None, typer.Argument(help="A saved plan to show in full (JSON).")] = None,
    db: Db = None,
) -> int:
    """Show the cost model's coefficients (name, value, unit, reason), or a saved plan's document.

    Example: planner explain
    """
    if plan_id:
        import json

        from planner import plan

        record = plan(plan_id, db=db)
        print(json.dumps(record.document | {"plan_id": record.plan_id}, indent=2))
        return 0
    if db is not None:
        raise InputError(f"--db {db!r} is read only with a plan id (planner explain PLAN_ID --db ...)")
    from planner import coefficients
    from planner.render import render_coefficients

    render_coefficients(coefficients())
    return 0
