"""``planner probes``: the stored probes, newest first."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Db, Json


def probes_command(
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many probes to list.")] = 20,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Only probes of this model.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Only probes on cuda or cpu.")] = None,
    json_out: Json = False,
    db: Db = None,
) -> int:
    """List stored probes: id, time, model, strategy, depth, outcome, measured peak and step time.

    Example: planner probes -n 10 --device cpu
    """
    import json

    from store.db import open_storage
    from store.errors import InputError

    if limit <= 0:
        raise InputError(f"--limit must be larger than zero, not {limit}")
    storage = open_storage(db)
    try:
        records = storage.list_probes(limit=limit, model=model, device=device)
    finally:
        storage.close()
    if json_out:
        print(
            json.dumps(
                [
                    {"probe_id": r.probe_id, "request": r.request.to_dict(), "result": r.result.to_dict()}
                    for r in records
                ],
                indent=2,
            )
        )
        return 0
    from rich.table import Table

    from planner.render import console, describe

    if not records:
        console.print("no probes stored yet: run `planner probe ...` first")
        return 0
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
    return 0
