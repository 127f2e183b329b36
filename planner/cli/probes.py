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
    from planner import probes

    records = probes(db=db, limit=limit, model=model, device=device)
    if json_out:
        import json

        documents = [
            {"probe_id": r.probe_id, "request": r.request.to_dict(), "result": r.result.to_dict()} for r in records
        ]
        print(json.dumps(documents, indent=2))
    else:
        from planner.render import render_probes

        render_probes(records)
    return 0
