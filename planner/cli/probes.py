"""``planner probes``: the stored probes, newest first; ``--snapshot`` writes one probe's memory snapshot."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Db, Json


def probes_command(
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many probes to list.")] = 20,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Only probes of this model.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Only probes on cuda or cpu.")] = None,
    snapshot: Annotated[
        str | None,
        typer.Option(
            "--snapshot",
            metavar="PROBE_ID",
            help="Write this probe's memory snapshot (CUDA: the allocator's own; CPU: built from its allocation"
            " stream) as a pickle for https://pytorch.org/memory_viz, instead of listing.",
        ),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="With --snapshot: the file to write (default snapshot-<id>.pickle)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="With --snapshot: overwrite an existing file.")] = False,
    json_out: Json = False,
    db: Db = None,
) -> int:
    """List stored probes: id, time, model, strategy, depth, outcome, measured peak and step time.

    Example: planner probes -n 10 --device cpu

    Example: planner probes --snapshot 3f2a9c -o probe.pickle
    """
    if snapshot is not None:
        from planner import write_probe_snapshot

        print(write_probe_snapshot(snapshot, output, force=force, db=db).describe())
        return 0
    if output is not None or force:
        from store.errors import InputError

        raise InputError("-o/--output and --force go with --snapshot PROBE_ID")
    from planner import probes

    records = probes(db=db, limit=limit, model=model, device=device)
    if json_out:
        import json

        documents = [
            {"probe_id": r.probe_id, "request": r.request.to_dict(), "result": r.result.to_dict()} for r in records
        ]
        print(json.dumps(documents, indent=2))
    else:
        from planner.report.text import render_probes

        render_probes(records)
    return 0
