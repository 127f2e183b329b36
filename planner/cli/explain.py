"""``planner explain``: the cost model's coefficients, or one saved plan in full."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Db


def explain_command(
    plan_id: Annotated[str | None, typer.Argument(help="A saved plan to show in full (JSON).")] = None,
    db: Db = None,
) -> int:
    """Show the cost model's coefficients (name, value, unit, reason), or a saved plan's document.

    Example: planner explain
    """
    import json

    if plan_id:
        from store.db import open_storage

        storage = open_storage(db)
        try:
            record = storage.get_plan(plan_id)
        finally:
            storage.close()
        print(json.dumps(record.document | {"plan_id": record.plan_id}, indent=2))
        return 0
    from rich.table import Table

    from planner.render import console
    from search import describe_coefficients

    table = Table(title="Cost-model coefficients (calibrated by probes)", title_justify="left")
    for column in ("name", "value", "unit", "why"):
        table.add_column(column)
    for row in describe_coefficients():
        table.add_row(row["name"], f"{row['default']:g}", row["unit"], row["reason"])
    console.print(table)
    return 0
